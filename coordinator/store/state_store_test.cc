#include "coordinator/store/state_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "coordinator/store/sqlite_state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + name;
}

// The contract every StateStore keeps.
void CheckContract(StateStore& store) {
  ASSERT_TRUE(store.Put("mesh", "m1", std::string("a\0b", 3)).ok());
  ASSERT_TRUE(store.Put("tensor", "t", "x").ok());
  ASSERT_TRUE(store.Put("mesh", "m0", "0").ok());
  ASSERT_TRUE(store.Put("mesh", "m0", "replaced").ok());
  absl::StatusOr<std::vector<StateRecord>> all = store.LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre(StateRecord{"mesh", "m0", "replaced"},
                                StateRecord{"mesh", "m1", std::string("a\0b", 3)},
                                StateRecord{"tensor", "t", "x"}));
  StateBatch b;
  b.Delete("mesh", "m1");
  b.Delete("mesh", "absent");
  b.Put("tensor", "u", "y");
  // Kinds that sort next to "mesh" are not its records.
  b.Put("mes", "z", "another kind");
  b.Put("meshes", "a", "another kind");
  ASSERT_TRUE(store.Apply(b).ok());
  absl::StatusOr<std::vector<StateRecord>> meshes = store.Load("mesh");
  ASSERT_TRUE(meshes.ok());
  EXPECT_THAT(*meshes, ElementsAre(StateRecord{"mesh", "m0", "replaced"}));
  EXPECT_EQ(store.Load("tensor")->size(), 2u);
  EXPECT_TRUE(store.Apply(StateBatch{}).ok());
  // An unsynced batch is applied like any other, and synced ones after it still work.
  StateBatch unsynced;
  unsynced.Put("request", "r1", "outcome");
  unsynced.sync = false;
  ASSERT_TRUE(store.Apply(unsynced).ok());
  ASSERT_TRUE(store.Put("tensor", "v", "z").ok());
  EXPECT_THAT(*store.Load("request"), ElementsAre(StateRecord{"request", "r1", "outcome"}));
  EXPECT_EQ(store.Load("tensor")->size(), 3u);
}

TEST(MemoryStateStoreTest, Contract) {
  MemoryStateStore store;
  CheckContract(store);
  EXPECT_EQ(store.Describe(), "memory");
}

TEST(SqliteStateStoreTest, ContractAndReopen) {
  const std::string dir = TempDir("contract");
  {
    absl::StatusOr<std::unique_ptr<SqliteStateStore>> store = SqliteStateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    CheckContract(**store);
    EXPECT_THAT((*store)->Describe(), HasSubstr("state.db"));
  }
  absl::StatusOr<std::unique_ptr<SqliteStateStore>> again = SqliteStateStore::Open(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  absl::StatusOr<std::vector<StateRecord>> all = (*again)->LoadAll();
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(
      *all,
      ElementsAre(StateRecord{"mes", "z", "another kind"}, StateRecord{"mesh", "m0", "replaced"},
                  StateRecord{"meshes", "a", "another kind"},
                  StateRecord{"request", "r1", "outcome"}, StateRecord{"tensor", "t", "x"},
                  StateRecord{"tensor", "u", "y"}, StateRecord{"tensor", "v", "z"}));
}

// A batch applied without sync survives a crash of the process that applied it: a child
// applies one and exits at once, without closing the database.
TEST(SqliteStateStoreTest, UnsyncedBatchSurvivesAProcessCrash) {
  const std::string dir = TempDir("unsynced");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<std::unique_ptr<SqliteStateStore>> store = SqliteStateStore::Open(dir);
    if (!store.ok() || !(*store)->Put("tensor", "t", "synced").ok()) _exit(2);
    StateBatch b;
    b.Put("request", "r", "outcome");
    b.sync = false;
    _exit((*store)->Apply(b).ok() ? 0 : 3);  // No destructor: the database is not closed.
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  absl::StatusOr<std::unique_ptr<SqliteStateStore>> again = SqliteStateStore::Open(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(*(*again)->LoadAll(), ElementsAre(StateRecord{"request", "r", "outcome"},
                                                StateRecord{"tensor", "t", "synced"}));
}

TEST(SqliteStateStoreTest, SecondOpenOfTheSameDirectoryIsRefused) {
  const std::string dir = TempDir("locked");
  absl::StatusOr<std::unique_ptr<SqliteStateStore>> first = SqliteStateStore::Open(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<SqliteStateStore>> second = SqliteStateStore::Open(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("in use by another coordinator"));
  first->reset();
  EXPECT_TRUE(SqliteStateStore::Open(dir).ok());
}

TEST(SqliteStateStoreTest, UncreatableDirectory) {
  absl::StatusOr<std::unique_ptr<SqliteStateStore>> s =
      SqliteStateStore::Open(TempDir("no/such/parent"));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
}

}  // namespace
}  // namespace shardcoord
