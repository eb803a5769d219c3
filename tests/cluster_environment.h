#ifndef SHARDCOORD_TESTS_CLUSTER_ENVIRONMENT_H_
#define SHARDCOORD_TESTS_CLUSTER_ENVIRONMENT_H_

// One cluster shared by every test of a binary: a GoogleTest global environment, so it is
// started once on the main thread (its processes die with it) before the first test and
// stopped after the last. Register it in main():
//
//   ::testing::AddGlobalTestEnvironment(new ClusterEnvironment(options));

#include <memory>
#include <utility>

#include "gtest/gtest.h"
#include "tests/cluster.h"

namespace shardcoord {

class ClusterEnvironment : public ::testing::Environment {
 public:
  explicit ClusterEnvironment(ClusterOptions options = {}) : options_(std::move(options)) {}

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(options_);
    ASSERT_TRUE(cluster.ok()) << "cluster did not start: " << cluster.status();
    Holder() = *std::move(cluster);
  }
  void TearDown() override { Holder().reset(); }

  // The running cluster; nullptr before SetUp or when it failed (tests are skipped then).
  static Cluster* Get() { return Holder().get(); }

 private:
  static std::unique_ptr<Cluster>& Holder() {
    static std::unique_ptr<Cluster>* cluster = new std::unique_ptr<Cluster>();
    return *cluster;
  }

  ClusterOptions options_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_CLUSTER_ENVIRONMENT_H_
