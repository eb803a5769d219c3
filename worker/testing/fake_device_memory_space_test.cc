#include "worker/testing/fake_device_memory_space.h"

#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/box.h"
#include "worker/buffers/checksum.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {
namespace {

TEST(FakeDeviceMemorySpaceTest, OpsRunInOrderOnlyWhenSynchronized) {
  FakeDeviceMemorySpace space("fake:0");
  EXPECT_EQ(space.name(), "fake:0");
  EXPECT_FALSE(space.is_host());
  std::vector<int32_t> host(12);
  std::iota(host.begin(), host.end(), 0);
  Allocation chunk = *space.Allocate(48);
  Allocation packed = *space.Allocate(16);
  ASSERT_TRUE(space.CopyFromHost(chunk.data, host.data(), 48).ok());
  // Column 1..2 of rows 1..2 of a 3x4 chunk.
  const Box box({0, 0}, {3, 4}), region({1, 1}, {2, 2});
  ASSERT_TRUE(space.PackBox(region, chunk.data, box, packed.data, 4).ok());
  ASSERT_TRUE(space.FillZeros(chunk.data, 48).ok());  // Queued after the pack.
  EXPECT_EQ(space.stats().ops_queued, 2);
  // Nothing ran yet: the memory still holds what was copied in.
  EXPECT_EQ(reinterpret_cast<int32_t*>(chunk.data)[5], 5);
  ASSERT_TRUE(space.Synchronize().ok());
  std::vector<int32_t> got(4);
  ASSERT_TRUE(space.CopyToHost(got.data(), packed.data, 16).ok());
  EXPECT_EQ(got, (std::vector<int32_t>{5, 6, 9, 10}));
  ASSERT_TRUE(space.CopyToHost(got.data(), chunk.data, 16).ok());
  EXPECT_EQ(got, (std::vector<int32_t>{0, 0, 0, 0}));
  const FakeDeviceMemorySpace::Stats stats = space.stats();
  EXPECT_EQ(stats.copies_to_device, 1);
  EXPECT_EQ(stats.bytes_to_device, 48);
  EXPECT_EQ(stats.copies_to_host, 2);
  EXPECT_EQ(stats.bytes_to_host, 32);
  EXPECT_EQ(stats.live_allocations, 2);
  space.Free(chunk);
  space.Free(packed);
  EXPECT_EQ(space.stats().live_bytes, 0);
}

TEST(FakeDeviceMemorySpaceTest, MatchesTheHostSpace) {
  FakeDeviceMemorySpace fake;
  MemorySpace& host = HostMemorySpace::Global();
  const Box box({0, 0}, {4, 5}), region({1, 2}, {3, 3});
  std::vector<float> init(20);
  for (int i = 0; i < 20; ++i) init[i] = static_cast<float>(i * 3 - 7);
  std::vector<float> results[2];
  uint64_t sums[2];
  int k = 0;
  for (MemorySpace* space : {static_cast<MemorySpace*>(&fake), &host}) {
    Allocation a = *space->Allocate(80), b = *space->Allocate(80);
    ASSERT_TRUE(space->CopyFromHost(a.data, init.data(), 80).ok());
    ASSERT_TRUE(space->FillIdentity(b.data, 20, DType::kF32, ReduceOp::kMax).ok());
    ASSERT_TRUE(
        space->ReduceIntoBox(region, a.data, box, b.data, box, DType::kF32, ReduceOp::kMax).ok());
    ASSERT_TRUE(space->CopyBox(Box({0, 0}, {1, 5}), a.data, box, b.data, box, 4).ok());
    ASSERT_TRUE(space->DivideBox(b.data, 20, DType::kF32, 2).ok());
    sums[k] = *space->ChunkChecksum(b.data, 80);
    results[k].resize(20);
    ASSERT_TRUE(space->CopyToHost(results[k].data(), b.data, 80).ok());
    space->Free(a);
    space->Free(b);
    ++k;
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_EQ(sums[0], ChunkChecksum(results[0].data(), 80));
  EXPECT_EQ(results[0][0], -3.5f);  // Row 0 copied, then halved.
  EXPECT_EQ(results[0][7], (7 * 3 - 7) / 2.0f);
  EXPECT_EQ(results[0][5], -std::numeric_limits<float>::infinity());  // Identity, untouched.
}

TEST(FakeDeviceMemorySpaceTest, ChecksumsOfManyRegionsAreEachRegionsChecksum) {
  FakeDeviceMemorySpace space;
  std::vector<unsigned char> host(3000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i * 7 + 1);
  Allocation a = *space.Allocate(3000);
  ASSERT_TRUE(space.CopyFromHost(a.data, host.data(), 3000).ok());
  const std::vector<ChecksumRegion> regions = {
      {a.data, 1000}, {a.data + 1000, 0}, {a.data + 1001, 1999}, {a.data, 3000}};
  absl::StatusOr<std::vector<uint64_t>> sums = space.ChunkChecksums(regions);
  ASSERT_TRUE(sums.ok()) << sums.status();
  EXPECT_EQ(*sums, (std::vector<uint64_t>{
                       ChunkChecksum(host.data(), 1000), ChunkChecksum(nullptr, 0),
                       ChunkChecksum(host.data() + 1001, 1999), ChunkChecksum(host.data(), 3000)}));
  EXPECT_TRUE(space.ChunkChecksums({}).ok());
  // An error names the region.
  const std::vector<ChecksumRegion> bad = {{host.data(), 10}, {host.data(), -1}};
  absl::StatusOr<std::vector<uint64_t>> refused = HostMemorySpace::Global().ChunkChecksums(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("region 1"), std::string::npos) << refused.status();
  space.Free(a);
}

TEST(FakeDeviceMemorySpaceTest, ArgumentErrorsAtTheCall) {
  FakeDeviceMemorySpace space;
  Allocation a = *space.Allocate(64);
  const Box box({0}, {16});
  EXPECT_EQ(space.CopyBox(Box({10}, {8}), a.data, box, a.data, box, 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(space.ReduceIntoBox(box, a.data, box, a.data, box, DType::kF32, ReduceOp::kAvg).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(space.DivideBox(a.data, 16, DType::kF32, 0).code(), absl::StatusCode::kInvalidArgument);
  // Empty regions touch nothing, whatever the pointers.
  EXPECT_TRUE(space.CopyBox(Box({3}, {0}), nullptr, box, nullptr, box, 4).ok());
  space.set_capacity(100);
  absl::StatusOr<Allocation> big = space.Allocate(37);
  ASSERT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("37 bytes"), std::string::npos) << big.status();
  space.Free(a);
}

using FakeDeviceMemorySpaceDeathTest = ::testing::Test;

TEST_F(FakeDeviceMemorySpaceDeathTest, HostPointerInADeviceOpAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FakeDeviceMemorySpace space("fake:7");
  Allocation a = *space.Allocate(64);
  std::vector<char> host(64);
  const Box box({0}, {16});
  EXPECT_DEATH(space.PackBox(Box({0}, {4}), host.data(), box, a.data, 4).IgnoreError(),
               "fake:7: CopyBox source: 64 bytes at .* are not memory of this space");
  // Past the end of an allocation is not memory of the space either.
  EXPECT_DEATH(space.FillZeros(a.data + 8, 64).IgnoreError(), "FillZeros");
  EXPECT_DEATH(space.ChunkChecksum(host.data(), 64).IgnoreError(), "ChunkChecksum");
  space.Free(a);
}

TEST_F(FakeDeviceMemorySpaceDeathTest, DevicePointerUsedAsHostMemoryAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FakeDeviceMemorySpace space;
  Allocation a = *space.Allocate(64), b = *space.Allocate(64);
  EXPECT_DEATH(space.CopyFromHost(a.data, b.data, 64).IgnoreError(),
               "CopyFromHost source: host range .* overlaps memory of this space");
  EXPECT_DEATH(space.CopyToHost(b.data + 32, a.data, 16).IgnoreError(), "CopyToHost destination");
  EXPECT_DEATH(space.Free(Allocation{a.data + 8, 56}), "not the start of a live allocation");
  space.Free(a);
  space.Free(b);
}

TEST_F(FakeDeviceMemorySpaceDeathTest, LeakedAllocationAbortsAtDestruction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        FakeDeviceMemorySpace space;
        (void)space.Allocate(8);
      },
      "destroyed with 1 live allocation");
}

}  // namespace
}  // namespace shardcoord
