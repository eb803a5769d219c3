// The composition root's state store: opened from CoordinatorOptions::state (the --state URI),
// one coordinator per directory, and a store that cannot be opened fails Start.

#include "coordinator/coordinator.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

CoordinatorOptions Options(const std::string& state_dir) {
  CoordinatorOptions o;
  o.listen = "127.0.0.1:0";
  o.state = state_dir.empty() ? StateStoreUri::Memory() : StateStoreUri::Sqlite(state_dir);
  return o;
}

TEST(CoordinatorStateTest, OneCoordinatorPerStateDir) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/one";
  auto first = std::make_unique<Coordinator>(Options(dir));
  ASSERT_TRUE(first->Start().ok());
  EXPECT_THAT(first->state_description(), HasSubstr("sqlite:" + dir + "/state.db"));
  Coordinator second(Options(dir));
  absl::StatusOr<std::string> refused = second.Start();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("in use by another coordinator"));
  first.reset();  // Shuts down and closes the store.
  Coordinator third(Options(dir));
  EXPECT_TRUE(third.Start().ok());
}

TEST(CoordinatorStateTest, MemoryByDefault) {
  Coordinator c(Options(""));
  ASSERT_TRUE(c.Start().ok());
  EXPECT_EQ(c.state_description(), "memory");
}

TEST(CoordinatorStateTest, UnopenableStateDirFailsStart) {
  Coordinator c(Options(std::string(std::getenv("TEST_TMPDIR")) + "/no/such/parent"));
  EXPECT_EQ(c.Start().status().code(), absl::StatusCode::kUnavailable);
}

TEST(CoordinatorStateTest, EtcdOpensOnlyOnceElected) {
  CoordinatorOptions o = Options("");
  o.state = *ParseStateStoreUri("state", "etcd://127.0.0.1:1", "");
  Coordinator c(o);  // Without EtcdCoordinator's election: nothing to fence the writes.
  absl::StatusOr<std::string> refused = c.Start();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
}

}  // namespace
}  // namespace shardcoord
