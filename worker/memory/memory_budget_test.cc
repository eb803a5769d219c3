#include "worker/memory/memory_budget.h"

#include <cstdint>
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/layout.h"
#include "worker/buffers/buffer_store.h"
#include "worker/testing/fake_device_memory_space.h"

namespace shardcoord {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(MemoryBudgetTest, CountsUseAndPeak) {
  MemoryBudget budget("worker w0", 100);
  EXPECT_EQ(budget.budget(), 100);
  ASSERT_TRUE(budget.Reserve(60, "a").ok());
  ASSERT_TRUE(budget.Reserve(40, "b").ok());
  EXPECT_EQ(budget.used(), 100);
  EXPECT_EQ(budget.free(), 0);
  budget.Release(70);
  EXPECT_EQ(budget.used(), 30);
  EXPECT_EQ(budget.free(), 70);
  EXPECT_EQ(budget.peak(), 100);
  EXPECT_EQ(budget.ResetPeak(), 100);
  EXPECT_EQ(budget.peak(), 30);
  ASSERT_TRUE(budget.Reserve(10, "c").ok());
  EXPECT_EQ(budget.peak(), 40);
}

TEST(MemoryBudgetTest, RefusesBeyondTheBudgetNamingTheWorkerAndBytes) {
  MemoryBudget budget("worker w3", 4 * kMiB);
  ASSERT_TRUE(budget.Reserve(3 * kMiB, "first").ok());
  absl::Status s = budget.Reserve(2 * kMiB, "the target buffer");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("worker w3"), HasSubstr("the target buffer"),
                    HasSubstr("needs 2097152 bytes"), HasSubstr("1048576 bytes (1.00 MiB) free"),
                    HasSubstr("4194304-byte budget")));
  EXPECT_EQ(budget.used(), 3 * kMiB);  // Nothing changed.
  EXPECT_EQ(budget.peak(), 3 * kMiB);
  EXPECT_TRUE(budget.Reserve(kMiB, "exactly the rest").ok());
  EXPECT_EQ(budget.Reserve(0, "nothing").code(), absl::StatusCode::kOk);
  EXPECT_EQ(budget.Reserve(1, "one more").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(budget.Reserve(-1, "negative").code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemoryBudgetTest, NoLimitStillCounts) {
  MemoryBudget budget("worker w0", 0);
  ASSERT_TRUE(budget.Reserve(int64_t{1} << 50, "huge").ok());
  EXPECT_EQ(budget.used(), int64_t{1} << 50);
  EXPECT_GT(budget.free(), int64_t{1} << 60);
}

TEST(MemoryBudgetTest, WatermarksFollowTheHighestUseWhileOpen) {
  MemoryBudget budget("w", 0);
  ASSERT_TRUE(budget.Reserve(10, "x").ok());
  const int64_t a = budget.OpenWatermark();
  ASSERT_TRUE(budget.Reserve(50, "x").ok());
  budget.Release(50);
  const int64_t b = budget.OpenWatermark();
  ASSERT_TRUE(budget.Reserve(20, "x").ok());
  EXPECT_EQ(budget.CloseWatermark(b), 30);
  ASSERT_TRUE(budget.Reserve(100, "x").ok());
  EXPECT_EQ(budget.CloseWatermark(a), 130);
  EXPECT_EQ(budget.CloseWatermark(a), 0);  // Forgotten.
}

TEST(BudgetedMemorySpaceTest, CountsTheBytesAskedAndGivesThemBack) {
  MemoryBudget budget("worker w1", 8 * kMiB);
  BudgetedMemorySpace space(&HostMemorySpace::Global(), &budget);
  EXPECT_TRUE(space.is_host());
  EXPECT_EQ(space.name(), "host");
  // 1.5 MiB: the host cache rounds the block up to 2 MiB, the budget counts what was asked.
  absl::StatusOr<Allocation> a = space.Allocate(3 * kMiB / 2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GE(a->capacity, 3 * kMiB / 2);
  EXPECT_EQ(budget.used(), 3 * kMiB / 2);
  absl::StatusOr<Allocation> b = space.Allocate(7 * kMiB);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("worker w1"));
  EXPECT_EQ(budget.used(), 3 * kMiB / 2);
  absl::StatusOr<Allocation> zero = space.Allocate(0);
  ASSERT_TRUE(zero.ok());
  EXPECT_NE(zero->data, nullptr);
  space.Free(*a);
  space.Free(*zero);
  space.Free(Allocation{});  // No-op.
  EXPECT_EQ(budget.used(), 0);
  EXPECT_EQ(budget.peak(), 3 * kMiB / 2);
  EXPECT_EQ(space.Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BudgetedMemorySpaceTest, BuffersCountUnlessLent) {
  MemoryBudget budget("worker w0", 64 * kMiB);
  BudgetedMemorySpace space(&HostMemorySpace::Global(), &budget);
  RankChunks chunks;
  chunks.rank = 0;
  chunks.local_elements = 1024;
  chunks.chunks.push_back(Chunk{Box({0}, {1024}), 0, 0});
  {
    absl::StatusOr<std::shared_ptr<HostBuffer>> owned =
        HostBuffer::Create(DType::kF32, chunks, &space);
    ASSERT_TRUE(owned.ok()) << owned.status();
    EXPECT_EQ(budget.used(), 4096);
    // Memory a user process lent: wrapped, never allocated, never counted.
    class Lent : public LentMemory {
     public:
      std::string Describe() const override { return "test memory"; }
    };
    std::vector<char> user(4096);
    absl::StatusOr<std::shared_ptr<HostBuffer>> lent =
        HostBuffer::Wrap(DType::kF32, chunks, &space, user.data(), std::make_shared<Lent>());
    ASSERT_TRUE(lent.ok()) << lent.status();
    EXPECT_EQ(budget.used(), 4096);
    lent->reset();
    EXPECT_EQ(budget.used(), 4096);
  }
  EXPECT_EQ(budget.used(), 0);
  // A buffer that does not fit is refused by Create with the budget's error.
  chunks.local_elements = 32 * kMiB;
  chunks.chunks[0].box = Box({0}, {32 * kMiB});
  absl::StatusOr<std::shared_ptr<HostBuffer>> big = HostBuffer::Create(DType::kF32, chunks, &space);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(budget.used(), 0);
}

TEST(BudgetedMemorySpaceTest, ForwardsDeviceWork) {
  FakeDeviceMemorySpace device;
  MemoryBudget budget("worker w2", kMiB);
  BudgetedMemorySpace space(&device, &budget);
  EXPECT_FALSE(space.is_host());
  EXPECT_EQ(space.name(), device.name());
  absl::StatusOr<Allocation> a = space.Allocate(1000);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<char> host(1000, 7), back(1000, 0);
  ASSERT_TRUE(space.CopyFromHost(a->data, host.data(), 1000).ok());
  ASSERT_TRUE(space.CopyToHost(back.data(), a->data, 1000).ok());
  EXPECT_EQ(back, host);
  EXPECT_EQ(budget.used(), 1000);
  space.Free(*a);
  EXPECT_EQ(budget.used(), 0);
  EXPECT_EQ(space.DeviceFreeBytes().status().code(), absl::StatusCode::kUnimplemented);
}

TEST(MemoryBudgetFlagTest, ParsesBytesAndPercentages) {
  absl::StatusOr<MemoryBudgetSetting> s = ParseMemoryBudgetFlag("4GiB");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->bytes, int64_t{4} << 30);
  s = ParseMemoryBudgetFlag("50%");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->bytes, 0);
  EXPECT_DOUBLE_EQ(s->fraction, 0.5);
  s = ParseMemoryBudgetFlag("");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->bytes, 0);
  EXPECT_DOUBLE_EQ(s->fraction, 0.8);
  for (const char* bad : {"0", "0%", "150%", "-5%", "lots", "x%"}) {
    absl::StatusOr<MemoryBudgetSetting> r = ParseMemoryBudgetFlag(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    if (!r.ok()) {
      EXPECT_THAT(r.status().message(), HasSubstr("--memory-budget")) << bad;
    }
  }
}

TEST(MemoryBudgetFlagTest, ResolvesAgainstTheSpace) {
  const int64_t limit = HostMemoryLimit();
  ASSERT_GT(limit, 0);
  MemoryBudgetSetting half;
  half.fraction = 0.5;
  absl::StatusOr<int64_t> host = ResolveMemoryBudget(half, HostMemorySpace::Global());
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(*host, limit / 2);
  MemoryBudgetSetting bytes;
  bytes.bytes = 12345;
  EXPECT_EQ(*ResolveMemoryBudget(bytes, HostMemorySpace::Global()), 12345);
  // A device that cannot tell its free memory needs the budget in bytes.
  FakeDeviceMemorySpace device;
  EXPECT_EQ(ResolveMemoryBudget(half, device).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(*ResolveMemoryBudget(bytes, device), 12345);
  // A device that can: 80% of what is free.
  class SmallDevice final : public MemorySpace {
   public:
    std::string name() const override { return "small:0"; }
    bool is_host() const override { return false; }
    absl::StatusOr<Allocation> Allocate(int64_t) override { return Allocation{}; }
    void Free(const Allocation&) override {}
    absl::Status CopyFromHost(void*, const void*, int64_t) override { return absl::OkStatus(); }
    absl::Status CopyToHost(void*, const void*, int64_t) override { return absl::OkStatus(); }
    absl::Status FillZeros(void*, int64_t) override { return absl::OkStatus(); }
    absl::Status FillIdentity(void*, int64_t, DType, ReduceOp) override { return absl::OkStatus(); }
    absl::Status CopyBox(const Box&, const void*, const Box&, void*, const Box&, int64_t) override {
      return absl::OkStatus();
    }
    absl::Status ReduceIntoBox(const Box&, const void*, const Box&, void*, const Box&, DType,
                               ReduceOp) override {
      return absl::OkStatus();
    }
    absl::Status DivideBox(void*, int64_t, DType, int64_t) override { return absl::OkStatus(); }
    absl::StatusOr<uint64_t> ChunkChecksum(const void*, int64_t) override { return 0; }
    absl::Status Synchronize() override { return absl::OkStatus(); }
    absl::StatusOr<int64_t> DeviceFreeBytes() override { return 1000; }
  } small;
  EXPECT_EQ(*ResolveMemoryBudget(MemoryBudgetSetting{}, small), 800);
}

}  // namespace
}  // namespace shardcoord
