#include "coordinator/plans/plan_relay.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/box_copy.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/test_layouts.h"

namespace shardcoord {
namespace {

// Element i of the whole tensor is the f32 value i.
std::string Global(const Shape& shape) {
  const int64_t n = Box::Whole(shape).Volume();
  std::string out(static_cast<size_t>(n * 4), '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(i);
    std::memcpy(out.data() + i * 4, &v, 4);
  }
  return out;
}

std::string Local(const RankChunks& rc, const std::string& global, const Shape& shape) {
  std::string out(static_cast<size_t>(rc.local_elements * 4), '\0');
  for (const Chunk& c : rc.chunks) {
    EXPECT_TRUE(
        PackBox(c.box, global.data(), Box::Whole(shape), out.data() + c.local_offset * 4, 4).ok());
  }
  return out;
}

class PlanRelayTest : public ::testing::Test {
 protected:
  WorkerEndpoint Endpoint(int64_t rank) {
    return WorkerEndpoint{absl::StrCat("w", rank), rank, absl::StrCat("addr", rank), 1};
  }

  // Stores `layout`'s local buffers of tensor "t" v1 in the fake workers.
  void Store(const Layout& layout, const Shape& shape) {
    const std::string global = Global(shape);
    for (const RankChunks& rc : layout.ranks()) {
      v1::ChunkData header;
      header.set_tensor("t");
      header.set_version(1);
      header.set_dtype(DTypeToProto(DType::kF32));
      *header.mutable_chunks() = RankChunksToProto(rc);
      std::string data = Local(rc, global, shape);
      header.set_total_bytes(static_cast<int64_t>(data.size()));
      workers_.WriteChunk(Endpoint(rc.rank), header, std::move(data),
                          [](absl::StatusOr<v1::WriteChunkResponse> r) { ASSERT_TRUE(r.ok()); });
    }
  }

  RelayResult Run(const Layout& source, const Layout& target) {
    RelayRequest q;
    q.plan_id = "p-1";
    q.tensor = "t";
    q.source_version = 1;
    q.target_tensor = "t";
    q.target_version = 2;
    q.dtype = DType::kF32;
    q.source = source;
    q.target = target;
    for (const Layout* l : {&source, &target}) {
      for (const RankChunks& rc : l->ranks()) q.workers[rc.rank] = Endpoint(rc.rank);
    }
    RelayResult out;
    absl::Notification done;
    RunRelay(&workers_, std::move(q), [&](RelayResult r) {
      out = std::move(r);
      done.Notify();
    });
    done.WaitForNotification();
    return out;
  }

  // An [8, 2] tensor relayed from S(0) to S(1) on 4 ranks while `method` fails on `rank`,
  // UNAVAILABLE with `message`.
  RelayResult RunFailing(const std::string& method, int64_t rank, const std::string& message) {
    const Shape shape = {8, 2};
    const Layout source = Placed({4}, {}, shape, "S(0)");
    Store(source, shape);
    workers_.Fail(method, rank, absl::UnavailableError(message));
    return Run(source, Placed({4}, {}, shape, "S(1)"));
  }

  void ExpectTargetValues(const Layout& target, const Shape& shape) {
    const std::string global = Global(shape);
    for (const RankChunks& rc : target.ranks()) {
      ASSERT_TRUE(workers_.HasBuffer(rc.rank, "t", 2)) << "rank " << rc.rank;
      EXPECT_EQ(workers_.Buffer(rc.rank, "t", 2), Local(rc, global, shape)) << "rank " << rc.rank;
    }
  }

  FakeWorkerClient workers_;
};

TEST_F(PlanRelayTest, MovesEveryValueBetweenUnevenShardings) {
  const Shape shape = {7, 5};
  const Layout source = Placed({4}, {}, shape, "S(0)");
  const Layout target = Placed({4}, {}, shape, "S(1)");
  Store(source, shape);
  RelayResult r = Run(source, target);
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(r.written.size(), 4u);
  for (const auto& [rank, w] : r.written) {
    EXPECT_EQ(w.chunks.chunks, target.Find(rank)->chunks);
    EXPECT_EQ(w.checksums.size(), w.chunks.chunks.size());
    EXPECT_EQ(w.bytes, target.Find(rank)->local_elements * 4);
  }
  ExpectTargetValues(target, shape);
  EXPECT_EQ(workers_.calls("ReadChunk"), 4);   // One read per distinct source chunk.
  EXPECT_EQ(workers_.calls("WriteChunk"), 8);  // 4 to store the source, 4 relayed.
}

TEST_F(PlanRelayTest, ReadsEachReplicatedChunkOnceAndWritesAnotherMesh) {
  const Shape shape = {6, 4};
  // Replicated on 4 ranks: one read of the whole tensor, not four.
  const Layout source = Placed({4}, {}, shape, "R");
  // A 2x2 mesh over other ranks: dp replicas of tp shards.
  const Layout target = Placed({2, 2}, {4, 5, 6, 7}, shape, "R,S(0)");
  Store(source, shape);
  RelayResult r = Run(source, target);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(workers_.calls("ReadChunk"), 1);
  EXPECT_EQ(r.written.size(), 4u);
  ExpectTargetValues(target, shape);
}

TEST_F(PlanRelayTest, AFailedReadWritesNothing) {
  RelayResult r = RunFailing("ReadChunk", 2, "connection refused");
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status.message().find("rank 2"), std::string::npos) << r.status;
  EXPECT_TRUE(r.attempted.empty());
  EXPECT_TRUE(r.written.empty());
  EXPECT_EQ(workers_.BufferCount("t"), 4);  // Only the source buffers.
}

TEST_F(PlanRelayTest, AFailedWriteNamesTheWorkerAndListsEveryAttempt) {
  RelayResult r = RunFailing("WriteChunk", 1, "gone");
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status.message().find("worker w1 (rank 1)"), std::string::npos) << r.status;
  EXPECT_EQ(r.attempted.size(), 4u);  // The caller drops the new version on all of them.
  EXPECT_TRUE(r.written.empty());
}

TEST(RelayEligibleTest, OnlySmallPlainCopies) {
  Plan plan;
  plan.dtype = DType::kF32;
  plan.source = Placed({4}, {}, {16, 16}, "S(0)");
  plan.target = Placed({4}, {}, {16, 16}, "S(1)");
  EXPECT_TRUE(RelayEligible(plan, false, 1024));
  EXPECT_FALSE(RelayEligible(plan, false, 1023));    // 1 KiB of f32.
  EXPECT_FALSE(RelayEligible(plan, false, 0));       // Disabled.
  EXPECT_FALSE(RelayEligible(plan, true, 1 << 20));  // Written in place.
  Plan partial = plan;
  partial.source = Placed({4}, {}, {16, 16}, "P");
  EXPECT_FALSE(RelayEligible(partial, false, 1 << 20));
  partial = plan;
  partial.target = Placed({4}, {}, {16, 16}, "P");
  EXPECT_FALSE(RelayEligible(partial, false, 1 << 20));
}

TEST(AssembleLocalBufferTest, RefusesATargetChunkTheSourcesDoNotCover) {
  const Layout target = Placed({2}, {}, {4, 2}, "S(0)");
  std::vector<BandSource> sources = {{Box({0, 0}, {2, 2}), 0, 0}};
  std::vector<std::string> data = {std::string(16, '\1')};
  absl::StatusOr<std::string> ok = AssembleLocalBuffer(*target.Find(0), sources, data, 4);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, std::string(16, '\1'));
  absl::StatusOr<std::string> bad = AssembleLocalBuffer(*target.Find(1), sources, data, 4);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(bad.status().message().find("[2:4, 0:2]"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace shardcoord
