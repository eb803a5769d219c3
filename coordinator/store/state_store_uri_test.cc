#include "coordinator/store/state_store_uri.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Scheme = StateStoreUri::Scheme;

// --state=`value` (--state-dir `state_dir`) parses as `scheme`, durable or not, and prints as
// `text`; the URI in `out` where given.
void ExpectParses(const std::string& value, const std::string& state_dir, Scheme scheme,
                  bool durable, const std::string& text, StateStoreUri* out = nullptr) {
  absl::StatusOr<StateStoreUri> u = ParseStateStoreUri("state", value, state_dir);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme, scheme);
  EXPECT_EQ(u->durable(), durable);
  EXPECT_EQ(u->ToString(), text);
  if (out != nullptr) *out = *std::move(u);
}

TEST(StateStoreUriTest, Memory) {
  ExpectParses("memory", "./d", Scheme::kMemory, /*durable=*/false, "memory");
}

TEST(StateStoreUriTest, BareSqliteTakesTheStateDir) {
  StateStoreUri u;
  ASSERT_NO_FATAL_FAILURE(ExpectParses("sqlite", "/var/lib/s", Scheme::kSqlite, /*durable=*/true,
                                       "sqlite:/var/lib/s", &u));
  EXPECT_EQ(u.dir, "/var/lib/s");
}

TEST(StateStoreUriTest, SqliteWithItsDirectory) {
  absl::StatusOr<StateStoreUri> u = ParseStateStoreUri("state", "sqlite:rel/dir", "/ignored");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme, Scheme::kSqlite);
  EXPECT_EQ(u->dir, "rel/dir");
  // ToString parses back to the same URI.
  absl::StatusOr<StateStoreUri> again = ParseStateStoreUri("state", u->ToString(), "");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->dir, "rel/dir");
}

TEST(StateStoreUriTest, Etcd) {
  StateStoreUri u;
  ASSERT_NO_FATAL_FAILURE(ExpectParses("etcd://127.0.0.1:2379,h2:22379", "./d", Scheme::kEtcd,
                                       /*durable=*/true, "etcd://127.0.0.1:2379,h2:22379", &u));
  EXPECT_THAT(u.endpoints, ElementsAre("127.0.0.1:2379", "h2:22379"));
}

TEST(StateStoreUriTest, ErrorsNameTheFlagAndTheValue) {
  for (const char* bad : {"postgres://x", "sqlite:", "", "Memory", "etcd://nohost",
                          "etcd://h:99999", "etcd://h:1/path"}) {
    absl::StatusOr<StateStoreUri> u = ParseStateStoreUri("state", bad, "./d");
    ASSERT_FALSE(u.ok()) << bad;
    EXPECT_EQ(u.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(u.status().message(), HasSubstr(absl::StrCat("--state: '", bad, "'"))) << bad;
  }
  absl::StatusOr<StateStoreUri> u = ParseStateStoreUri("state", "sqlite", "");
  EXPECT_EQ(u.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(u.status().message(), HasSubstr("--state-dir is empty"));
}

TEST(StateStoreUriTest, OpensMemoryAndSqlite) {
  absl::StatusOr<std::unique_ptr<StateStore>> memory = OpenStateStore(StateStoreUri::Memory());
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ((*memory)->Describe(), "memory");
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/uri";
  absl::StatusOr<std::unique_ptr<StateStore>> sqlite = OpenStateStore(StateStoreUri::Sqlite(dir));
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  EXPECT_THAT((*sqlite)->Describe(), HasSubstr("sqlite:" + dir));
  // One coordinator per directory.
  EXPECT_EQ(OpenStateStore(StateStoreUri::Sqlite(dir)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StateStoreUriTest, EtcdNeedsTheElection) {
  absl::StatusOr<StateStoreUri> u = ParseStateStoreUri("state", "etcd://127.0.0.1:2379", "");
  ASSERT_TRUE(u.ok()) << u.status();
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenStateStore(*u);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("once this coordinator leads"));
}

}  // namespace
}  // namespace shardcoord
