#include "coordinator/state_store.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "coordinator/sqlite_state_store.h"
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
  ASSERT_TRUE(store.Apply(b).ok());
  absl::StatusOr<std::vector<StateRecord>> meshes = store.Load("mesh");
  ASSERT_TRUE(meshes.ok());
  EXPECT_THAT(*meshes, ElementsAre(StateRecord{"mesh", "m0", "replaced"}));
  EXPECT_EQ(store.Load("tensor")->size(), 2u);
  EXPECT_TRUE(store.Apply(StateBatch{}).ok());
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
  EXPECT_THAT(*all, ElementsAre(StateRecord{"mesh", "m0", "replaced"},
                                StateRecord{"tensor", "t", "x"}, StateRecord{"tensor", "u", "y"}));
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
