#include "coordinator/cluster/mesh_manager.h"

#include <cstdlib>
#include <memory>

#include "coordinator/store/sqlite_state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class MeshManagerTest : public ::testing::Test {
 protected:
  MeshManagerTest() : workers_(&clock_, absl::Seconds(5)), meshes_(&workers_) {
    for (const char* name : {"w0", "w1", "w2", "w3"}) {
      EXPECT_TRUE(workers_.Register(WorkerSpec{name, "h", "cpu", "addr", "gloo"}).ok());
    }
  }
  FakeClock clock_;
  WorkerManager workers_;
  MeshManager meshes_;
};

TEST_F(MeshManagerTest, AllLiveWorkersInRankOrder) {
  absl::StatusOr<MeshRecord> m = meshes_.Create("M", {2, 2}, {"dp", "tp"}, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->mesh.ranks(), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(m->workers, ElementsAre("w0", "w1", "w2", "w3"));
  EXPECT_THAT(m->mesh.dim_names(), ElementsAre("dp", "tp"));
  EXPECT_EQ(meshes_.Get("M")->mesh, m->mesh);
  EXPECT_EQ(meshes_.Create("M", {4}, {}, {}).status().code(), absl::StatusCode::kAlreadyExists);
  // A smaller mesh takes the first live workers.
  absl::StatusOr<MeshRecord> two = meshes_.Create("two", {2}, {}, {});
  ASSERT_TRUE(two.ok());
  EXPECT_THAT(two->mesh.ranks(), ElementsAre(0, 1));
  EXPECT_EQ(meshes_.List().size(), 2u);
}

TEST_F(MeshManagerTest, ExplicitWorkersInTheGivenOrder) {
  absl::StatusOr<MeshRecord> m = meshes_.Create("M", {3}, {}, {"w3", "w0", "w2"});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->mesh.ranks(), ElementsAre(3, 0, 2));
}

TEST_F(MeshManagerTest, Validation) {
  auto code = [&](const Shape& shape, std::vector<std::string> dims,
                  std::vector<std::string> workers) {
    return meshes_.Create("X", shape, dims, workers).status();
  };
  EXPECT_EQ(meshes_.Create("", {2}, {}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = code({2, 0}, {}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "shape[1] = 0 must be >= 1");
  EXPECT_EQ(code({2, 2}, {"a"}, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({2, 2}, {"a", "a"}, {}).code(), absl::StatusCode::kInvalidArgument);
  s = code({3}, {}, {"w0", "w1"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "workers: 2 given for a mesh of 3 positions");
  EXPECT_EQ(code({2}, {}, {"w0", "w0"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({2}, {}, {"w0", "nobody"}).code(), absl::StatusCode::kNotFound);
  s = code({8}, {}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "mesh [8] needs 8 workers but 4 are alive");

  // A dead worker cannot join a mesh, and is skipped by "all live workers".
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(workers_.Heartbeat("w0", workers_.Get("w0")->incarnation).ok());
  ASSERT_TRUE(workers_.Heartbeat("w2", workers_.Get("w2")->incarnation).ok());
  workers_.CheckHealth(clock_.Now());
  s = code({2}, {}, {"w0", "w1"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("worker w1 (rank 1) is dead"));
  absl::StatusOr<MeshRecord> live = meshes_.Create("live", {2}, {}, {});
  ASSERT_TRUE(live.ok());
  EXPECT_THAT(live->mesh.ranks(), ElementsAre(0, 2));
}

TEST_F(MeshManagerTest, DeleteRefusedWhileInUse) {
  ASSERT_TRUE(meshes_.Create("M", {4}, {}, {}).ok());
  ASSERT_TRUE(meshes_.AddUser("M", "T").ok());
  ASSERT_TRUE(meshes_.AddUser("M", "T").ok());  // e.g. a plan moving T onto M again
  EXPECT_EQ(meshes_.AddUser("nope", "T").code(), absl::StatusCode::kNotFound);
  absl::Status s = meshes_.Delete("M");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "mesh 'M' is in use by tensor T");
  meshes_.RemoveUser("M", "T");
  EXPECT_EQ(meshes_.Delete("M").code(), absl::StatusCode::kFailedPrecondition);
  meshes_.RemoveUser("M", "T");
  EXPECT_TRUE(meshes_.Delete("M").ok());
  EXPECT_EQ(meshes_.Delete("M").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(meshes_.Get("M").status().code(), absl::StatusCode::kNotFound);
}

// Meshes come back from the store after a restart, in memory and in SQLite; a deleted one
// stays deleted.
void CheckMeshesSurviveARestart(StateStore* store) {
  FakeClock clock;
  {
    WorkerManager workers(&clock, absl::Seconds(5), store);
    MeshManager meshes(&workers, store);
    ASSERT_TRUE(workers.Load().ok());
    ASSERT_TRUE(meshes.Load().ok());
    for (const char* name : {"w0", "w1", "w2", "w3"}) {
      ASSERT_TRUE(workers.Register(WorkerSpec{name, "h", "cpu", "addr", "gloo"}).ok());
    }
    ASSERT_TRUE(meshes.Create("M", {2, 2}, {"dp", "tp"}, {"w3", "w2", "w1", "w0"}).ok());
    ASSERT_TRUE(meshes.Create("gone", {4}, {}, {}).ok());
    ASSERT_TRUE(meshes.Delete("gone").ok());
  }
  WorkerManager workers(&clock, absl::Seconds(5), store);
  MeshManager meshes(&workers, store);
  ASSERT_TRUE(workers.Load().ok());
  ASSERT_TRUE(meshes.Load().ok());
  absl::StatusOr<MeshRecord> m = meshes.Get("M");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->mesh.shape(), ElementsAre(2, 2));
  EXPECT_THAT(m->mesh.ranks(), ElementsAre(3, 2, 1, 0));
  EXPECT_THAT(m->mesh.dim_names(), ElementsAre("dp", "tp"));
  EXPECT_THAT(m->workers, ElementsAre("w3", "w2", "w1", "w0"));
  EXPECT_EQ(meshes.Get("gone").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(meshes.List().size(), 1u);
}

TEST(MeshManagerStoreTest, MemoryStore) {
  MemoryStateStore store;
  CheckMeshesSurviveARestart(&store);
}

TEST(MeshManagerStoreTest, SqliteStore) {
  absl::StatusOr<std::unique_ptr<SqliteStateStore>> store =
      SqliteStateStore::Open(std::string(std::getenv("TEST_TMPDIR")) + "/meshes");
  ASSERT_TRUE(store.ok()) << store.status();
  CheckMeshesSurviveARestart(store->get());
}

}  // namespace
}  // namespace shardcoord
