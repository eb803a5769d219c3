// A coordinator restart with prepared transfers, over a real SQLite store: the transfers load
// bound to their members at their last run's version, before any worker reconciles, so the
// dsts' buffers of that version are recognised; the first run prepares again.

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/store/sqlite_state_store.h"
#include "coordinator/transfers/transfer_manager.h"
#include "coordinator/transfers/transfer_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"

namespace shardcoord {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

std::unique_ptr<SqliteStateStore> OpenStore(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<SqliteStateStore>> store = SqliteStateStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// What a worker reports holding of `tensor` at `version`: its chunks of the layout, with
// `checksum` for every chunk.
HeldBuffer Held(const TensorRecord& t, int64_t rank, int64_t version, uint64_t checksum) {
  HeldBuffer h;
  h.tensor = t.name;
  h.version = version;
  for (const RankChunks& rc : t.layout.ranks()) {
    if (rc.rank != rank) continue;
    h.chunks = rc;
    h.checksums.assign(rc.chunks.size(), checksum);
  }
  return h;
}

class TransferRestartTest : public ::testing::Test {
 protected:
  TransferRestartTest() : dir_(absl::StrCat(std::getenv("TEST_TMPDIR"), "/restart")) {}

  // With inline fakes the run has ended (or failed to start) when this returns.
  RunResult Run(TransferManager* transfers, const std::string& name) {
    RunResult r;
    StartRun(transfers, name, &r);
    return r;
  }

  const std::string dir_;
  FakeClock clock_;
  FakeTimer timer_{&clock_};
  Registry registry_;
  CoordinatorMetrics metrics_{&registry_};
  FakeWorkerClient client_;  // The workers outlive the coordinator.
};

TEST_F(TransferRestartTest, BindingsComeBackBeforeWorkersReconcileAndTheFirstRunReplans) {
  std::unique_ptr<SqliteStateStore> store = OpenStore(dir_);
  ASSERT_NE(store, nullptr);
  int64_t v = 0;
  std::vector<TensorRecord> before;
  {
    TransferBoot boot(&clock_, &timer_, &client_, store.get(), &metrics_,
                      TransferTest::DefaultOptions());
    TransferTest::RegisterWorkers(&boot.workers);
    ASSERT_TRUE(boot.meshes.Create("M", {2, 2}, {}, {"w0", "w1", "w2", "w3"}).ok());
    ASSERT_TRUE(boot.meshes.Create("D", {2}, {}, {"w4", "w5"}).ok());
    for (const auto& [name, mesh, placements] :
         {std::make_tuple("a.0", "M", "S(0),R"), std::make_tuple("b.0", "D", "R"),
          std::make_tuple("a.1", "M", "S(0),R"), std::make_tuple("b.1", "D", "R")}) {
      TensorRecord t;
      t.name = name;
      t.shape = {8, 4};
      t.mesh = mesh;
      t.spec = placements;
      t.layout = *Layout::FromPlacements(boot.meshes.Get(mesh)->mesh, t.shape,
                                         *ParsePlacements(placements));
      t.version = boot.tensors.NewVersion();
      ASSERT_TRUE(boot.tensors.Reserve(t, "create").ok());
      absl::flat_hash_map<int64_t, int64_t> inc;
      LayoutChecksums sums;
      for (const RankChunks& rc : t.layout.ranks()) {
        inc[rc.rank] = boot.workers.GetByRank(rc.rank)->incarnation;
        sums.emplace_back(rc.chunks.size(), 500);
      }
      ASSERT_TRUE(boot.tensors.FinishCreate(name, "create", sums, inc).ok());
    }
    // Two transfers: "sync" is run again after the restart, "other" loses a replica.
    for (const auto& [name, src, dst] :
         {std::make_tuple("sync", "a.0", "b.0"), std::make_tuple("other", "a.1", "b.1")}) {
      std::optional<absl::StatusOr<v1::TransferInfo>> made;
      boot.transfers->Create(name, {{src, dst}},
                             [&made](absl::StatusOr<v1::TransferInfo> i) { made = std::move(i); });
      ASSERT_TRUE(made.has_value() && made->ok());
      RunResult run = Run(boot.transfers.get(), name);
      ASSERT_TRUE(run.Committed()) << run.Error();
      v = std::max(v, run.response.version());
    }
    for (const char* name : {"a.0", "b.0", "a.1", "b.1"}) before.push_back(*boot.tensors.Get(name));
  }
  store.reset();  // The coordinator stops.

  store = OpenStore(dir_);
  ASSERT_NE(store, nullptr);
  TransferBoot boot(&clock_, &timer_, &client_, store.get(), &metrics_,
                    TransferTest::DefaultOptions());
  ASSERT_TRUE(boot.workers.Load().ok());
  ASSERT_TRUE(boot.meshes.Load().ok());
  ASSERT_TRUE(boot.tensors
                  .Load([&boot](int64_t rank, int64_t incarnation) {
                    return boot.workers.WasLiveBeforeRestart(rank, incarnation);
                  })
                  .ok());
  ASSERT_TRUE(boot.transfers->Load().ok());
  absl::StatusOr<v1::TransferInfo> info = boot.transfers->Get("sync", true);
  ASSERT_TRUE(info.ok()) << info.status();
  const int64_t sync_version = before[1].version;  // b.0's: the run's.
  EXPECT_EQ(info->runs(), 1);
  EXPECT_EQ(info->version(), sync_version);
  EXPECT_EQ(info->copies_size(), 1);
  EXPECT_FALSE(info->prepared());
  EXPECT_THAT(info->invalid_reason(), HasSubstr("not prepared since the coordinator started"));

  // Every worker registers again and reports what it holds: sources at their versions, dsts
  // at their run's version (checksums the coordinator never had) and at an older one.
  TransferTest::RegisterWorkers(&boot.workers);
  for (int64_t rank = 0; rank < 6; ++rank) {
    std::vector<HeldBuffer> held;
    for (const TensorRecord& t : before) {
      if (t.layout.Find(rank) == nullptr) continue;
      if (t.name[0] == 'a') {
        held.push_back(Held(t, rank, t.version, 500));
        continue;
      }
      // Rank 5's copy of b.1 disagrees with rank 4's: refused, rank 4's stands.
      held.push_back(Held(t, rank, t.version, t.name == "b.1" && rank == 5 ? 78 : 77));
      held.push_back(Held(t, rank, 1, 500));  // An old version: dropped.
    }
    const int64_t incarnation = boot.workers.GetByRank(rank)->incarnation;
    absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> drop =
        boot.tensors.Reconcile(rank, incarnation, held);
    ASSERT_TRUE(drop.ok()) << drop.status();
    for (const TensorRecord& t : before) {
      if (t.name[0] != 'b' || t.layout.Find(rank) == nullptr) continue;
      EXPECT_THAT(*drop, Contains(Pair(t.name, 1))) << rank;
      if (t.name == "b.1" && rank == 5) {
        EXPECT_THAT(*drop, Contains(Pair("b.1", t.version))) << "a disagreeing replica";
      } else {
        EXPECT_THAT(*drop, Not(Contains(Pair(t.name, t.version)))) << t.name << " on " << rank;
      }
    }
  }
  absl::StatusOr<TensorRecord> b0 = boot.tensors.Get("b.0");
  ASSERT_TRUE(b0.ok()) << b0.status();
  EXPECT_EQ(b0->version, sync_version);
  ASSERT_EQ(b0->checksums.size(), 2u);
  EXPECT_EQ(b0->checksums[0][0], 77u);  // Taken from the workers.
  EXPECT_EQ(b0->checksums[1][0], 77u);
  absl::StatusOr<TensorRecord> b1 = boot.tensors.Get("b.1");
  ASSERT_TRUE(b1.ok()) << b1.status();
  EXPECT_EQ(b1->incarnations.at(4), boot.workers.GetByRank(4)->incarnation);
  EXPECT_NE(b1->incarnations.at(5), boot.workers.GetByRank(5)->incarnation);

  // The first run after the restart prepares again and commits.
  RunResult run = Run(boot.transfers.get(), "sync");
  ASSERT_TRUE(run.Committed()) << run.Error();
  EXPECT_TRUE(run.response.replanned());
  EXPECT_GT(run.response.version(), v);
  EXPECT_EQ(boot.tensors.Get("b.0")->version, run.response.version());
  // b.1 lost rank 5's replica: the run gives it a new one (the dst is repaired, stored).
  RunResult other = Run(boot.transfers.get(), "other");
  ASSERT_TRUE(other.Committed()) << other.Error();
  b1 = boot.tensors.Get("b.1");
  EXPECT_EQ(b1->version, other.response.version());
  EXPECT_EQ(b1->incarnations.at(5), boot.workers.GetByRank(5)->incarnation);
  TensorManager reloaded(&boot.meshes, store.get());
  ASSERT_TRUE(reloaded.Load([](int64_t, int64_t) { return false; }).ok());
  EXPECT_EQ(reloaded.Get("b.1")->version, other.response.version());
}

}  // namespace
}  // namespace shardcoord
