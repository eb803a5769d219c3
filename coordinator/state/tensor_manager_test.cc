#include "coordinator/state/tensor_manager.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "coordinator/store/sqlite_state_store.h"
#include "coordinator/testing/flaky_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class TensorManagerTest : public ::testing::Test {
 protected:
  TensorManagerTest()
      : workers_(&clock_, absl::Seconds(5)), meshes_(&workers_), tensors_(&meshes_) {
    for (const char* name : {"w0", "w1", "w2", "w3"}) {
      EXPECT_TRUE(workers_.Register(WorkerSpec{name, "h", "cpu", "addr", "gloo"}).ok());
    }
    EXPECT_TRUE(meshes_.Create("M", {2, 2}, {}, {}).ok());
    EXPECT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
  }

  // S(0),R on the 2x2 mesh: ranks 0,1 hold rows [0:4), ranks 2,3 rows [4:8).
  TensorRecord Record(const std::string& name) {
    TensorRecord t;
    t.name = name;
    t.shape = {8, 4};
    t.dtype = DType::kF32;
    t.mesh = "M";
    t.spec = "S(0),R";
    t.layout = *Layout::FromPlacements(meshes_.Get("M")->mesh, t.shape,
                                       {Placement::Shard(0), Placement::Replicate()});
    t.version = 1;
    return t;
  }

  absl::Status Create(const std::string& name) {
    if (absl::Status s = tensors_.Reserve(Record(name), "create"); !s.ok()) return s;
    return tensors_.FinishCreate(name, "create", {{1}, {1}, {2}, {2}},
                                 {{0, 10}, {1, 11}, {2, 12}, {3, 13}});
  }

  FakeClock clock_;
  WorkerManager workers_;
  MeshManager meshes_;
  TensorManager tensors_;
};

TEST_F(TensorManagerTest, CreateIsInvisibleUntilFinished) {
  ASSERT_TRUE(tensors_.Reserve(Record("T"), "create-1").ok());
  EXPECT_EQ(tensors_.Get("T").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(tensors_.List().empty());
  EXPECT_EQ(tensors_.Reserve(Record("T"), "create-2").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(tensors_.Acquire("T", "p").status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(meshes_.Delete("M").code(), absl::StatusCode::kFailedPrecondition);
  tensors_.CancelCreate("T", "create-1");
  EXPECT_EQ(tensors_.Get("T").status().code(), absl::StatusCode::kNotFound);
  // The cancelled reservation and the rejected duplicate left no mesh users behind.
  EXPECT_TRUE(meshes_.Delete("M").ok());
}

// Pages come in name order, within the prefix, each starting after the last one's end;
// tensors being created are not listed.
TEST_F(TensorManagerTest, ListPageWalksThePrefixInNameOrder) {
  for (const char* name : {"a.0", "a.1", "a.2", "a.3", "a.4", "b.0"})
    ASSERT_TRUE(Create(name).ok());
  ASSERT_TRUE(tensors_.Reserve(Record("a.25"), "create").ok());  // Not ready: skipped.
  std::vector<std::string> seen;
  std::string after;
  int pages = 0;
  for (;;) {
    TensorManager::Page page = tensors_.ListPage("a.", after, 2);
    ++pages;
    for (const TensorRecord& t : page.tensors) seen.push_back(t.name);
    if (!page.more) break;
    ASSERT_FALSE(page.tensors.empty());
    after = page.tensors.back().name;
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"a.0", "a.1", "a.2", "a.3", "a.4"}));
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(tensors_.ListPage("", "", 100).tensors.size(), 6u);
  EXPECT_TRUE(tensors_.ListPage("c", "", 100).tensors.empty());
  // A token before the prefix starts at the prefix.
  EXPECT_EQ(tensors_.ListPage("b", "a.9", 100).tensors.size(), 1u);
}

// A bulk delete takes the named tensors and the prefix's, all or none.
TEST_F(TensorManagerTest, RemoveAllIsAllOrNothing) {
  for (const char* name : {"a.0", "a.1", "b.0", "c.0"}) ASSERT_TRUE(Create(name).ok());
  ASSERT_TRUE(tensors_.Acquire("a.1", "plan-9").ok());
  absl::StatusOr<std::vector<TensorRecord>> busy = tensors_.RemoveAll({"c.0"}, "a.");
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(busy.status().message().find("'a.1' is busy with plan-9"), absl::string_view::npos)
      << busy.status();
  EXPECT_TRUE(tensors_.Get("a.0").ok());
  EXPECT_TRUE(tensors_.Get("c.0").ok());
  EXPECT_EQ(tensors_.RemoveAll({"c.0", "nope"}, "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(tensors_.Get("c.0").ok());
  EXPECT_EQ(tensors_.RemoveAll({}, "z").status().code(), absl::StatusCode::kNotFound);
  tensors_.Release("a.1", "plan-9");
  absl::StatusOr<std::vector<TensorRecord>> gone = tensors_.RemoveAll({"c.0"}, "a.");
  ASSERT_TRUE(gone.ok()) << gone.status();
  ASSERT_EQ(gone->size(), 3u);
  EXPECT_EQ((*gone)[0].name, "a.0");
  EXPECT_EQ(tensors_.List().size(), 1u);  // b.0
  // Only b.0's buffers still count: 4 rows of 4 floats on each rank.
  const std::vector<TensorManager::HeldBytes> held = tensors_.BytesByHolder();
  ASSERT_EQ(held.size(), 4u);
  for (const TensorManager::HeldBytes& h : held) EXPECT_EQ(h.bytes, 64) << h.rank;
  EXPECT_EQ(meshes_.Delete("M").code(), absl::StatusCode::kFailedPrecondition);  // b.0 uses it.
}

TEST_F(TensorManagerTest, BytesByHolderSumsEveryReadyTensorPerHolder) {
  ASSERT_TRUE(Create("T").ok());
  ASSERT_TRUE(Create("U").ok());
  ASSERT_TRUE(tensors_.Reserve(Record("V"), "create").ok());  // Not ready: not counted.
  // Each S(0),R rank of an 8x4 f32 tensor holds 4x4 elements: 64 bytes, twice.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> got;
  for (const TensorManager::HeldBytes& h : tensors_.BytesByHolder()) {
    got.emplace_back(h.rank, h.incarnation, h.bytes);
  }
  EXPECT_THAT(got, ElementsAre(std::make_tuple(0, 10, 128), std::make_tuple(1, 11, 128),
                               std::make_tuple(2, 12, 128), std::make_tuple(3, 13, 128)));
}

TEST_F(TensorManagerTest, BusyTensorRejectsASecondPlan) {
  ASSERT_TRUE(Create("T").ok());
  ASSERT_TRUE(Create("U").ok());
  absl::StatusOr<TensorRecord> t = tensors_.Acquire("T", "p-1");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->busy_plan, "p-1");
  absl::Status second = tensors_.Acquire("T", "p-2").status();
  EXPECT_EQ(second.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(second.message(), "tensor 'T' is busy with p-1");
  // Another tensor is free.
  EXPECT_TRUE(tensors_.Acquire("U", "p-2").ok());
  EXPECT_EQ(tensors_.Remove("T").status().code(), absl::StatusCode::kAborted);
  // Releasing by someone else does nothing.
  tensors_.Release("T", "p-2");
  EXPECT_EQ(tensors_.Get("T")->busy_plan, "p-1");
  tensors_.Release("T", "p-1");
  EXPECT_TRUE(tensors_.Acquire("T", "p-3").ok());
  EXPECT_EQ(tensors_.Acquire("nope", "p").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TensorManagerTest, CommitMovesTheTensorToTheTargetMesh) {
  ASSERT_TRUE(Create("T").ok());
  ASSERT_TRUE(tensors_.Acquire("T", "p-1", "N").ok());
  EXPECT_EQ(meshes_.Delete("N").code(), absl::StatusCode::kFailedPrecondition);
  TensorManager::NewState next;
  next.mesh = "N";
  next.spec = "S(1)";
  next.layout = *Layout::FromPlacements(meshes_.Get("N")->mesh, {8, 4}, {Placement::Shard(1)});
  next.checksums = {{5}, {6}, {7}, {8}};
  next.version = tensors_.NewVersion();
  next.incarnations = {{0, 10}, {1, 11}, {2, 12}, {3, 13}};
  EXPECT_EQ(tensors_.Commit("T", "p-other", next).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tensors_.Commit("T", "p-1", next).ok());
  absl::StatusOr<TensorRecord> t = tensors_.Get("T");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->mesh, "N");
  EXPECT_EQ(t->spec, "S(1)");
  EXPECT_EQ(t->version, next.version);
  EXPECT_TRUE(t->busy_plan.empty());
  EXPECT_EQ(t->checksums[3][0], 8u);
  // M is free now, N is used by T.
  EXPECT_TRUE(meshes_.Delete("M").ok());
  EXPECT_EQ(meshes_.Delete("N").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tensors_.Remove("T").ok());
  EXPECT_TRUE(meshes_.Delete("N").ok());
}

TEST_F(TensorManagerTest, ReleaseDropsTheTargetMeshUse) {
  ASSERT_TRUE(Create("T").ok());
  ASSERT_TRUE(tensors_.Acquire("T", "p-1", "N").ok());
  tensors_.Release("T", "p-1", "N");
  EXPECT_TRUE(meshes_.Delete("N").ok());
  EXPECT_EQ(tensors_.Acquire("T", "p-2", "N").status().code(), absl::StatusCode::kNotFound);
  // The failed acquire did not leave T busy.
  EXPECT_TRUE(tensors_.Get("T")->busy_plan.empty());
}

TEST_F(TensorManagerTest, LostChunksSayExactlyWhich) {
  ASSERT_TRUE(Create("T").ok());
  const TensorRecord t = *tensors_.Get("T");
  std::set<int64_t> dead;
  LivenessFn live = [&](int64_t rank, int64_t inc) {
    return !dead.count(rank) && inc == 10 + rank;
  };
  EXPECT_TRUE(LostChunks(t, live).empty());
  EXPECT_EQ(*LiveLayout(t, live), t.layout);

  // Rank 2 dies: rows [4:8) still live on rank 3; the live layout drops rank 2.
  dead = {2};
  EXPECT_TRUE(LostChunks(t, live).empty());
  absl::StatusOr<Layout> partial = LiveLayout(t, live);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_THAT(partial->RankIds(), ElementsAre(0, 1, 3));

  // Ranks 2 and 3 die: rows [4:8) are lost on both.
  dead = {2, 3};
  std::vector<LostChunk> lost = LostChunks(t, live);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].box, Box({4, 0}, {4, 4}));
  EXPECT_THAT(lost[0].ranks, ElementsAre(2, 3));
  EXPECT_EQ(lost[0].ToString(), "[4:8, 0:4] on ranks 2, 3");
  absl::Status s = LiveLayout(t, live).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "tensor 'T' lost 1 chunk with no live replica: [4:8, 0:4] on ranks 2, 3");

  // A worker that came back with a new incarnation holds nothing either.
  dead = {};
  LivenessFn restarted = [&](int64_t rank, int64_t inc) { return rank != 0 && inc == 10 + rank; };
  EXPECT_TRUE(LostChunks(t, restarted).empty());
  LivenessFn both = [&](int64_t rank, int64_t inc) { return rank > 1; };
  EXPECT_EQ(LostChunks(t, both).size(), 1u);
}

TEST_F(TensorManagerTest, UpdateRankReplacesOneRanksChecksums) {
  ASSERT_TRUE(Create("T").ok());
  ASSERT_TRUE(tensors_.Acquire("T", "up").ok());
  EXPECT_EQ(tensors_.UpdateRank("T", "up", 1, {1, 2}, 21).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tensors_.UpdateRank("T", "up", 9, {1}, 21).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(tensors_.UpdateRank("T", "up", 1, {99}, 21).ok());
  tensors_.Release("T", "up");
  const TensorRecord t = *tensors_.Get("T");
  EXPECT_EQ(t.checksums[1][0], 99u);
  EXPECT_EQ(t.incarnations.at(1), 21);
  EXPECT_EQ(t.version, 1);
}

// A coordinator restart over the same store: tensors come back recovering (UNAVAILABLE),
// then take each rank's buffer as its worker registers again and reports it intact.
void CheckRestartAndReconcile(StateStore* store) {
  FakeClock clock;
  const Shape shape = {8, 4};
  LayoutChecksums sums = {{1}, {1}, {2}, {2}};
  int64_t committed = 0;
  {
    WorkerManager workers(&clock, absl::Seconds(5), store);
    MeshManager meshes(&workers, store);
    TensorManager tensors(&meshes, store);
    ASSERT_TRUE(workers.Load().ok());
    ASSERT_TRUE(meshes.Load().ok());
    ASSERT_TRUE(tensors.Load([](int64_t, int64_t) { return false; }).ok());
    absl::flat_hash_map<int64_t, int64_t> holders;
    for (const char* name : {"w0", "w1", "w2", "w3"}) {
      absl::StatusOr<WorkerRecord> w = workers.Register(WorkerSpec{name, "h", "cpu", "a", "gloo"});
      ASSERT_TRUE(w.ok());
      holders[w->rank] = w->incarnation;
    }
    ASSERT_TRUE(meshes.Create("M", {2, 2}, {}, {}).ok());
    for (const char* name : {"T", "U"}) {
      TensorRecord t;
      t.name = name;
      t.shape = shape;
      t.mesh = "M";
      t.spec = "S(0),R";
      t.layout = *Layout::FromPlacements(meshes.Get("M")->mesh, shape,
                                         {Placement::Shard(0), Placement::Replicate()});
      t.version = tensors.NewVersion();
      ASSERT_TRUE(tensors.Reserve(t, "create").ok());
      ASSERT_TRUE(tensors.FinishCreate(name, "create", sums, holders).ok());
    }
    ASSERT_TRUE(tensors.Remove("U").ok());
    // A plan in flight when the coordinator stops never commits: its version is not stored.
    ASSERT_TRUE(tensors.Acquire("T", "p-1").ok());
    committed = tensors.Get("T")->version;
    EXPECT_GT(tensors.NewVersion(), committed);
    // Rank 3 dies before the restart: its chunks are not awaited.
    ASSERT_TRUE(workers.MarkDead("w3", holders[3], "gone").ok());
  }
  WorkerManager workers(&clock, absl::Seconds(5), store);
  MeshManager meshes(&workers, store);
  TensorManager tensors(&meshes, store);
  ASSERT_TRUE(workers.Load().ok());
  ASSERT_TRUE(meshes.Load().ok());
  ASSERT_TRUE(
      tensors
          .Load([&workers](int64_t r, int64_t inc) { return workers.WasLiveBeforeRestart(r, inc); })
          .ok());
  EXPECT_EQ(meshes.Delete("M").code(), absl::StatusCode::kFailedPrecondition);  // T uses it.
  absl::Status unavailable = tensors.Get("T").status();
  EXPECT_EQ(unavailable.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(unavailable.message(), HasSubstr("ranks 0, 1, 2"));
  EXPECT_EQ(tensors.Acquire("T", "p").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(tensors.Remove("T").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(tensors.Get("U").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tensors.Recovering(), ElementsAre("T"));
  const int64_t fresh = tensors.NewVersion();
  EXPECT_GT(fresh, committed + 1);  // Never a version handed out before the restart.

  const Layout layout = *Layout::FromPlacements(meshes.Get("M")->mesh, shape,
                                                {Placement::Shard(0), Placement::Replicate()});
  auto held = [&](int64_t rank, int64_t version, uint64_t sum) {
    return HeldBuffer{"T", version, layout.ranks()[rank], {sum}};
  };
  using Drops = std::vector<std::pair<std::string, int64_t>>;
  // Rank 0: intact, plus the aborted plan's buffer and the deleted tensor's.
  absl::StatusOr<WorkerRecord> w0 = workers.Register(WorkerSpec{"w0", "h", "cpu", "a", "gloo"});
  ASSERT_EQ(w0->rank, 0);
  HeldBuffer deleted = held(0, 1, 1);
  deleted.tensor = "U";
  absl::StatusOr<Drops> drops = tensors.Reconcile(
      0, w0->incarnation, {held(0, committed, 1), held(0, committed + 1, 7), deleted});
  ASSERT_TRUE(drops.ok()) << drops.status();
  EXPECT_THAT(*drops, ElementsAre(std::make_pair(std::string("T"), committed + 1),
                                  std::make_pair(std::string("U"), int64_t{1})));
  EXPECT_EQ(tensors.Get("T").status().code(), absl::StatusCode::kUnavailable);
  // Rank 1: a wrong checksum is dropped and lost.
  absl::StatusOr<WorkerRecord> w1 = workers.Register(WorkerSpec{"w1", "h", "cpu", "a", "gloo"});
  drops = tensors.Reconcile(1, w1->incarnation, {held(1, committed, 99)});
  EXPECT_THAT(*drops, ElementsAre(std::make_pair(std::string("T"), committed)));
  // Rank 2 holds nothing any more: its chunks are lost; recovery of T ends.
  absl::StatusOr<WorkerRecord> w2 = workers.Register(WorkerSpec{"w2", "h", "cpu", "a", "gloo"});
  drops = tensors.Reconcile(2, w2->incarnation, {});
  EXPECT_TRUE(drops->empty());
  absl::StatusOr<TensorRecord> t = tensors.Get("T");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->version, committed);
  EXPECT_TRUE(tensors.Recovering().empty());
  LivenessFn live = [&workers](int64_t r, int64_t inc) { return workers.IsLive(r, inc); };
  std::vector<LostChunk> lost = LostChunks(*t, live);
  ASSERT_EQ(lost.size(), 1u);  // Rows 4:8 were on ranks 2 (emptied) and 3 (dead).
  EXPECT_EQ(lost[0].box, (Box{{4, 0}, {4, 4}}));
  EXPECT_TRUE(live(0, t->incarnations.at(0)));
  EXPECT_FALSE(live(1, t->incarnations.at(1)));
  // A buffer of a version from before the restart that never committed is dropped also
  // once the tensor is no longer recovering; a version handed out since is kept while an
  // operation runs on the tensor (it may be that operation's), dropped once none does.
  ASSERT_TRUE(tensors.Acquire("T", "p-new").ok());
  drops = tensors.Reconcile(0, w0->incarnation, {held(0, committed + 1, 7), held(0, fresh, 7)});
  EXPECT_THAT(*drops, ElementsAre(std::make_pair(std::string("T"), committed + 1)));
  tensors.Release("T", "p-new");
  drops = tensors.Reconcile(0, w0->incarnation, {held(0, fresh, 7), held(0, committed, 1)});
  EXPECT_THAT(*drops, ElementsAre(std::make_pair(std::string("T"), fresh)));
}

TEST(TensorManagerStoreTest, RestartWithMemoryStore) {
  MemoryStateStore store;
  CheckRestartAndReconcile(&store);
}

TEST(TensorManagerStoreTest, RestartWithSqliteStore) {
  absl::StatusOr<std::unique_ptr<SqliteStateStore>> store =
      SqliteStateStore::Open(std::string(std::getenv("TEST_TMPDIR")) + "/tensors");
  ASSERT_TRUE(store.ok()) << store.status();
  CheckRestartAndReconcile(store->get());
}

TEST(TensorManagerStoreTest, EndRecoveryLosesTheRanksStillAwaited) {
  MemoryStateStore store;
  FakeClock clock;
  WorkerManager workers(&clock, absl::Seconds(5), &store);
  MeshManager meshes(&workers, &store);
  ASSERT_TRUE(workers.Register(WorkerSpec{"w0", "h", "cpu", "a", "gloo"}).ok());
  ASSERT_TRUE(meshes.Create("M", {1}, {}, {}).ok());
  {
    TensorManager tensors(&meshes, &store);
    TensorRecord t;
    t.name = "T";
    t.shape = {4};
    t.mesh = "M";
    t.spec = "S(0)";
    t.layout = *Layout::FromPlacements(meshes.Get("M")->mesh, t.shape, {Placement::Shard(0)});
    t.version = tensors.NewVersion();
    ASSERT_TRUE(tensors.Reserve(t, "c").ok());
    ASSERT_TRUE(tensors.FinishCreate("T", "c", {{5}}, {{0, 1}}).ok());
    tensors.Release("T", "c");
    ASSERT_TRUE(tensors.Remove("T").ok());  // Leaves the mesh user count balanced.
    ASSERT_TRUE(tensors.Reserve(t, "c").ok());
    ASSERT_TRUE(tensors.FinishCreate("T", "c", {{5}}, {{0, 1}}).ok());
  }
  MeshManager meshes2(&workers, &store);
  ASSERT_TRUE(meshes2.Load().ok());
  TensorManager tensors(&meshes2, &store);
  ASSERT_TRUE(tensors.Load([](int64_t, int64_t) { return true; }).ok());
  EXPECT_EQ(tensors.Get("T").status().code(), absl::StatusCode::kUnavailable);
  tensors.EndRecovery();
  ASSERT_TRUE(tensors.Get("T").ok());
  EXPECT_TRUE(tensors.Recovering().empty());
}

// A restart builds each distinct layout once (interned, shared by every tensor of it); each
// tensor keeps its own checksums.
TEST(TensorManagerStoreTest, LoadSharesLayoutsAndKeepsEachTensorsChecksums) {
  MemoryStateStore store;
  FakeClock clock;
  WorkerManager workers(&clock, absl::Seconds(5), &store);
  MeshManager meshes(&workers, &store);
  for (const char* name : {"w0", "w1", "w2", "w3"}) {
    ASSERT_TRUE(workers.Register(WorkerSpec{name, "h", "cpu", "a", "gloo"}).ok());
  }
  ASSERT_TRUE(meshes.Create("M", {2, 2}, {}, {}).ok());
  absl::flat_hash_map<int64_t, int64_t> holders;
  for (int64_t r = 0; r < 4; ++r) holders[r] = workers.GetByRank(r)->incarnation;
  const std::vector<std::tuple<std::string, std::string, LayoutChecksums>> made = {
      {"A", "S(0),R", {{1}, {1}, {2}, {2}}},
      {"B", "S(0),R", {{3}, {3}, {4}, {4}}},
      {"C", "R,S(0)", {{5}, {6}, {5}, {6}}},
  };
  std::map<std::string, Layout> layouts;
  {
    TensorManager tensors(&meshes, &store);
    for (const auto& [name, spec, sums] : made) {
      TensorRecord t;
      t.name = name;
      t.shape = {8, 4};
      t.mesh = "M";
      t.spec = spec;
      t.layout = *Layout::FromPlacements(meshes.Get("M")->mesh, t.shape, *ParsePlacements(spec));
      layouts[name] = t.layout;
      t.version = tensors.NewVersion();
      ASSERT_TRUE(tensors.Reserve(t, "c").ok());
      ASSERT_TRUE(tensors.FinishCreate(name, "c", sums, holders).ok());
    }
  }
  MeshManager meshes2(&workers, &store);
  ASSERT_TRUE(meshes2.Load().ok());
  TensorManager tensors(&meshes2, &store);
  ASSERT_TRUE(tensors.Load([](int64_t, int64_t) { return false; }).ok());
  for (const auto& [name, spec, sums] : made) {
    absl::StatusOr<TensorRecord> t = tensors.Get(name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->layout, layouts[name]) << name;
    EXPECT_EQ(t->checksums, sums) << name;
  }
  EXPECT_EQ(tensors.Get("A")->layout, tensors.Get("B")->layout);
  EXPECT_FALSE(tensors.Get("A")->layout == tensors.Get("C")->layout);
}

// A group's commit (CopyGroup, RedistributeGroup) is one durable batch: after a restart every
// member's tensor is at its new version, and when the store refuses, none moves.
TEST(TensorManagerStoreTest, CommitAllStoresEveryTensorInOneBatch) {
  FlakyStore store("disk full");
  FakeClock clock;
  WorkerManager workers(&clock, absl::Seconds(5), &store);
  MeshManager meshes(&workers, &store);
  ASSERT_TRUE(workers.Register(WorkerSpec{"w0", "h", "cpu", "a", "gloo"}).ok());
  ASSERT_TRUE(meshes.Create("M", {1}, {}, {}).ok());
  const Layout layout = *Layout::FromPlacements(meshes.Get("M")->mesh, {4}, {Placement::Shard(0)});
  int64_t old_version = 0;
  auto commit_both = [&](TensorManager& tensors, int64_t version) {
    std::vector<TensorManager::CommitItem> items;
    for (const char* name : {"T", "U"}) {
      TensorManager::NewState next;
      next.mesh = "M";
      next.spec = "S(0)";
      next.layout = layout;
      next.checksums = {{static_cast<uint64_t>(version)}};
      next.version = version;
      next.incarnations = {{0, 1}};
      items.push_back(TensorManager::CommitItem{name, std::string("p-") + name, std::move(next)});
    }
    return tensors.CommitAll(std::move(items));
  };
  int64_t new_version = 0;
  {
    TensorManager tensors(&meshes, &store);
    for (const char* name : {"T", "U"}) {
      TensorRecord t;
      t.name = name;
      t.shape = {4};
      t.mesh = "M";
      t.spec = "S(0)";
      t.layout = layout;
      t.version = tensors.NewVersion();
      old_version = t.version;
      ASSERT_TRUE(tensors.Reserve(t, "c").ok());
      ASSERT_TRUE(tensors.FinishCreate(name, "c", {{5}}, {{0, 1}}).ok());
      tensors.Release(name, "c");
      ASSERT_TRUE(tensors.Acquire(name, std::string("p-") + name).ok());
    }
    store.down = true;
    absl::Status refused = commit_both(tensors, tensors.NewVersion());
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    EXPECT_EQ(tensors.Get("T")->busy_plan, "p-T");  // Still held: its plan aborts and releases.
    store.down = false;
    const int64_t applies = store.applies();
    new_version = tensors.NewVersion();
    ASSERT_TRUE(commit_both(tensors, new_version).ok());
    EXPECT_EQ(store.applies(), applies + 1);
    EXPECT_EQ(tensors.Get("U")->version, new_version);
  }
  MeshManager meshes2(&workers, &store);
  ASSERT_TRUE(meshes2.Load().ok());
  TensorManager tensors(&meshes2, &store);
  ASSERT_TRUE(tensors.Load([](int64_t, int64_t) { return true; }).ok());
  tensors.EndRecovery();
  for (const char* name : {"T", "U"}) {
    absl::StatusOr<TensorRecord> t = tensors.Get(name);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    EXPECT_EQ(t->version, new_version) << name;
    EXPECT_NE(t->version, old_version);
    EXPECT_TRUE(t->busy_plan.empty());
  }
}

// AttachMany (a process lending a whole state dict through its worker): every member checked
// before anything changes, the first refusal naming it, nothing changed after any error
// (the store's too), one store batch for all, and the layouts answered to the worker.
TEST(TensorManagerAttachManyTest, AllOrNothingInOneStoreBatch) {
  FlakyStore store("disk full");
  FakeClock clock;
  WorkerManager workers(&clock, absl::Seconds(5), &store);
  MeshManager meshes(&workers, &store);
  ASSERT_TRUE(workers.Register(WorkerSpec{"w0", "h", "cpu", "a", "gloo"}).ok());
  ASSERT_TRUE(workers.Register(WorkerSpec{"w1", "h", "cpu", "b", "gloo"}).ok());
  ASSERT_TRUE(meshes.Create("N", {2}, {}, {}).ok());
  TensorManager tensors(&meshes, &store);
  // Attached 8x4 f32 tensors, S(0) over two ranks (rows 0:4 and 4:8, 16 elements each),
  // and one the workers own.
  for (const char* name : {"A", "B", "C", "own"}) {
    TensorRecord t;
    t.name = name;
    t.shape = {8, 4};
    t.mesh = "N";
    t.spec = "S(0)";
    t.layout = *Layout::FromPlacements(meshes.Get("N")->mesh, t.shape, {Placement::Shard(0)});
    t.version = tensors.NewVersion();
    t.attached = std::string(name) != "own";
    if (t.attached) t.unattached = {0, 1};
    ASSERT_TRUE(tensors.Reserve(t, "c").ok());
    ASSERT_TRUE(tensors.FinishCreate(name, "c", {{0}, {0}}, {}).ok());
  }
  const int64_t inc0 = workers.GetByRank(0)->incarnation;
  const int64_t inc1 = workers.GetByRank(1)->incarnation;
  const absl::flat_hash_map<int64_t, int64_t> live = {{0, inc0}, {1, inc1}};
  const RankChunks rank0 = *tensors.Get("B")->layout.Find(0);
  auto item = [](const std::string& name, int64_t bytes = 64) {
    TensorManager::AttachItem i;
    i.name = name;
    i.bytes = bytes;
    return i;
  };
  // A without a version or chunks (whatever is committed), B with both, C by name.
  TensorManager::AttachItem b = item("B");
  b.version = tensors.Get("B")->version;
  b.chunks = rank0;
  const std::vector<TensorManager::AttachItem> good = {item("A"), b, item("C")};
  auto unchanged = [&](const std::string& why) {
    SCOPED_TRACE(why);
    for (const char* name : {"A", "B", "C"}) {
      EXPECT_THAT(tensors.Get(name)->unattached, ElementsAre(0, 1)) << name;
    }
  };
  auto refused = [&](std::vector<TensorManager::AttachItem> items, absl::StatusCode code,
                     const std::string& starts) {
    SCOPED_TRACE(starts);
    const int64_t applies = store.applies();
    std::vector<std::set<int64_t>> before;
    for (const char* name : {"A", "B", "C"}) before.push_back(tensors.Get(name)->unattached);
    absl::StatusOr<std::vector<TensorManager::Attached>> got =
        tensors.AttachMany(0, inc0, items, /*validate_only=*/false, live);
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_THAT(std::string(got.status().message()), ::testing::StartsWith(starts));
    EXPECT_EQ(store.applies(), applies);
    std::vector<std::set<int64_t>> after;
    for (const char* name : {"A", "B", "C"}) after.push_back(tensors.Get(name)->unattached);
    EXPECT_EQ(after, before);
  };
  std::vector<TensorManager::AttachItem> bad = good;
  bad[2].bytes = 60;
  refused(bad, absl::StatusCode::kInvalidArgument, "buffers[2] 'C': bytes: the buffer has 60");
  bad = good;
  bad[1].dtype = DType::kF16;
  refused(bad, absl::StatusCode::kInvalidArgument, "buffers[1] 'B': dtype: the buffer holds f16");
  bad = good;
  bad[1].chunks->local_elements = 15;
  refused(bad, absl::StatusCode::kInvalidArgument, "buffers[1] 'B': chunks: rank 0");
  bad = good;
  bad[1].version += 100;
  refused(bad, absl::StatusCode::kAborted, "buffers[1] 'B': version");
  bad = good;
  bad.push_back(item("A"));
  refused(bad, absl::StatusCode::kInvalidArgument, "buffers[3] 'A': tensor: also buffers[0]");
  refused({item("A"), item("nope")}, absl::StatusCode::kNotFound, "buffers[1] 'nope': unknown");
  refused({item("own")}, absl::StatusCode::kFailedPrecondition, "buffers[0] 'own': tensor 'own'");
  refused({item("A"), item("")}, absl::StatusCode::kInvalidArgument, "buffers[1]: tensor: empty");
  refused({}, absl::StatusCode::kInvalidArgument, "buffers: none given");
  store.down = true;
  refused(good, absl::StatusCode::kUnavailable, "disk full");
  store.down = false;

  // Validation answers every member's version and the rank's chunks, changing nothing.
  int64_t applies = store.applies();
  absl::StatusOr<std::vector<TensorManager::Attached>> checked =
      tensors.AttachMany(0, inc0, good, /*validate_only=*/true, live);
  ASSERT_TRUE(checked.ok()) << checked.status();
  ASSERT_EQ(checked->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*checked)[i].version, tensors.Get(good[i].name)->version);
    EXPECT_EQ((*checked)[i].chunks.chunks, rank0.chunks);
    EXPECT_EQ((*checked)[i].chunks.local_elements, 16);
    EXPECT_FALSE((*checked)[i].readable);
  }
  EXPECT_EQ(store.applies(), applies);
  unchanged("validate_only");

  // Attached: all three in one batch; readable once rank 1 is attached too (and alive).
  absl::StatusOr<std::vector<TensorManager::Attached>> done =
      tensors.AttachMany(0, inc0, good, /*validate_only=*/false, live);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(store.applies(), applies + 1);
  for (const TensorManager::Attached& a : *done) EXPECT_FALSE(a.readable);
  for (const char* name : {"A", "B", "C"}) {
    EXPECT_THAT(tensors.Get(name)->unattached, ElementsAre(1)) << name;
    EXPECT_EQ(tensors.Get(name)->incarnations.at(0), inc0);
  }
  refused({item("A")}, absl::StatusCode::kFailedPrecondition, "buffers[0] 'A': rank 0 of");
  done = tensors.AttachMany(1, inc1, {item("A"), item("B")}, false, {{0, inc0}});  // 1 not live
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE((*done)[0].readable);
  ASSERT_TRUE(tensors.Detach("A", 1, inc1).ok());
  ASSERT_TRUE(tensors.Detach("B", 1, inc1).ok());
  applies = store.applies();
  done = tensors.AttachMany(1, inc1, {item("A"), item("B")}, false, live);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE((*done)[0].readable);
  EXPECT_TRUE((*done)[1].readable);
  EXPECT_EQ(store.applies(), applies + 1);
  // What the batch stored is what a restarted coordinator loads.
  absl::StatusOr<std::vector<StateRecord>> records = store.Load("tensor");
  ASSERT_TRUE(records.ok()) << records.status();
  for (const StateRecord& r : *records) {
    v1::StoredTensor stored;
    ASSERT_TRUE(stored.ParseFromString(r.value));
    EXPECT_EQ(stored.info().unattached_ranks_size(), r.name == "C" ? 1 : 0) << r.name;
  }
}

// A worker declared dead (its host cut off) that kept its buffers registers again: an idle
// tensor takes its committed chunks back when they match, checksums included.
TEST(TensorManagerReconcileTest, ARejoiningWorkerBringsItsCommittedChunksBack) {
  FakeClock clock;
  WorkerManager workers(&clock, absl::Seconds(5));
  MeshManager meshes(&workers);
  TensorManager tensors(&meshes);
  absl::flat_hash_map<int64_t, int64_t> holders;
  for (const char* name : {"w0", "w1"}) {
    absl::StatusOr<WorkerRecord> w = workers.Register(WorkerSpec{name, "h", "cpu", "a", "gloo"});
    ASSERT_TRUE(w.ok());
    holders[w->rank] = w->incarnation;
  }
  ASSERT_TRUE(meshes.Create("M", {2}, {}, {}).ok());
  TensorRecord t;
  t.name = "T";
  t.shape = {8, 4};
  t.mesh = "M";
  t.spec = "S(0)";
  t.layout = *Layout::FromPlacements(meshes.Get("M")->mesh, t.shape, {Placement::Shard(0)});
  t.version = tensors.NewVersion();
  ASSERT_TRUE(tensors.Reserve(t, "create").ok());
  ASSERT_TRUE(tensors.FinishCreate("T", "create", {{1}, {2}}, holders).ok());
  LivenessFn live = [&workers](int64_t r, int64_t inc) { return workers.IsLive(r, inc); };
  ASSERT_TRUE(workers.MarkDead("w1", holders[1], "no heartbeat").ok());
  ASSERT_EQ(LostChunks(*tensors.Get("T"), live).size(), 1u);

  absl::StatusOr<WorkerRecord> back = workers.Register(WorkerSpec{"w1", "h", "cpu", "a", "gloo"});
  ASSERT_TRUE(back.ok());
  const HeldBuffer wrong{"T", t.version, t.layout.ranks()[1], {99}};
  const HeldBuffer right{"T", t.version, t.layout.ranks()[1], {2}};
  // While a plan runs on the tensor nothing is taken back; a wrong checksum never is.
  ASSERT_TRUE(tensors.Acquire("T", "p-1").ok());
  ASSERT_TRUE(tensors.Reconcile(1, back->incarnation, {right}).ok());
  tensors.Release("T", "p-1");
  ASSERT_TRUE(tensors.Reconcile(1, back->incarnation, {wrong}).ok());
  EXPECT_EQ(LostChunks(*tensors.Get("T"), live).size(), 1u);
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> drops =
      tensors.Reconcile(1, back->incarnation, {right});
  ASSERT_TRUE(drops.ok()) << drops.status();
  EXPECT_TRUE(drops->empty());
  EXPECT_TRUE(LostChunks(*tensors.Get("T"), live).empty());
  EXPECT_EQ(tensors.Get("T")->incarnations.at(1), back->incarnation);
}

}  // namespace
}  // namespace shardcoord

namespace shardcoord {
namespace {

// A checkpoint load's staging tensor (TensorRecord::owner): seen only by its owner, never
// listed or stored, and an ordinary stored tensor once a commit publishes it.
TEST(TensorManagerHiddenTest, OnlyTheOwnerSeesItUntilACommitPublishesIt) {
  MemoryStateStore store;
  FakeClock clock;
  WorkerManager workers(&clock, absl::Seconds(5), &store);
  MeshManager meshes(&workers, &store);
  ASSERT_TRUE(workers.Register(WorkerSpec{"w0", "h", "cpu", "a", "gloo"}).ok());
  ASSERT_TRUE(meshes.Create("M", {1}, {}, {}).ok());
  const Layout layout = *Layout::FromPlacements(meshes.Get("M")->mesh, {4}, {Placement::Shard(0)});
  TensorManager tensors(&meshes, &store);
  TensorRecord t;
  t.name = "w";
  t.shape = {4};
  t.layout = layout;
  t.version = tensors.NewVersion();
  t.owner = "load-1";
  ASSERT_TRUE(tensors.Reserve(t, "load-1").ok());
  ASSERT_TRUE(tensors.FinishCreate("w", "load-1", {{5}}, {{0, 1}}).ok());
  EXPECT_EQ(tensors.Get("w").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(tensors.Get("w", "load-1").ok());
  EXPECT_TRUE(tensors.List().empty());
  EXPECT_EQ(tensors.Acquire("w", "p-1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tensors.Remove("w").status().code(), absl::StatusCode::kNotFound);
  // The name is taken all the same.
  TensorRecord other = t;
  other.owner.clear();
  EXPECT_EQ(tensors.Reserve(other, "create").code(), absl::StatusCode::kAlreadyExists);
  absl::StatusOr<std::vector<StateRecord>> stored = store.Load("tensor");
  ASSERT_TRUE(stored.ok());
  EXPECT_TRUE(stored->empty());

  ASSERT_TRUE(tensors.Acquire("w", "p-1", "M", "load-1").ok());
  TensorManager::NewState next;
  next.mesh = "M";
  next.spec = "S(0)";
  next.layout = layout;
  next.checksums = {{6}};
  next.version = tensors.NewVersion();
  next.incarnations = {{0, 1}};
  next.publish = true;
  ASSERT_TRUE(tensors.Commit("w", "p-1", next).ok());
  EXPECT_TRUE(tensors.Get("w").ok());
  EXPECT_EQ(tensors.List().size(), 1u);
  stored = store.Load("tensor");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), 1u);
}

}  // namespace
}  // namespace shardcoord

namespace shardcoord {
namespace {

// A load that overlaps reading and exchange keeps each group's results hidden, then publishes
// them all at once: all or none, and only the owner's ready, idle tensors.
TEST(TensorManagerHiddenTest, PublishAllIsAllOrNothing) {
  MemoryStateStore store;
  FakeClock clock;
  WorkerManager workers(&clock, absl::Seconds(5), &store);
  MeshManager meshes(&workers, &store);
  ASSERT_TRUE(workers.Register(WorkerSpec{"w0", "h", "cpu", "a", "gloo"}).ok());
  ASSERT_TRUE(meshes.Create("M", {1}, {}, {}).ok());
  const Layout layout = *Layout::FromPlacements(meshes.Get("M")->mesh, {4}, {Placement::Shard(0)});
  TensorManager tensors(&meshes, &store);
  for (const char* name : {"a", "b"}) {
    TensorRecord t;
    t.name = name;
    t.shape = {4};
    t.layout = layout;
    t.version = tensors.NewVersion();
    t.owner = "load-1";
    ASSERT_TRUE(tensors.Reserve(t, "load-1").ok());
    ASSERT_TRUE(tensors.FinishCreate(name, "load-1", {{5}}, {{0, 1}}).ok());
  }
  // Another owner, a missing name, a busy tensor: refused, and nothing published.
  EXPECT_EQ(tensors.PublishAll({"a", "b"}, "load-2").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tensors.PublishAll({"a", "c"}, "load-1").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tensors.Acquire("b", "p-1", "", "load-1").ok());
  absl::Status busy = tensors.PublishAll({"a", "b"}, "load-1");
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(busy.message()), ::testing::HasSubstr("'b'"));
  EXPECT_TRUE(tensors.List().empty());
  absl::StatusOr<std::vector<StateRecord>> stored = store.Load("tensor");
  ASSERT_TRUE(stored.ok());
  EXPECT_TRUE(stored->empty());
  tensors.Release("b", "p-1");

  ASSERT_TRUE(tensors.PublishAll({"a", "b"}, "load-1").ok());
  EXPECT_TRUE(tensors.Get("a").ok());
  EXPECT_TRUE(tensors.Get("b").ok());
  EXPECT_EQ(tensors.List().size(), 2u);
  stored = store.Load("tensor");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), 2u);
}

}  // namespace
}  // namespace shardcoord
