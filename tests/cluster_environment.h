#ifndef SHARDCOORD_TESTS_CLUSTER_ENVIRONMENT_H_
#define SHARDCOORD_TESTS_CLUSTER_ENVIRONMENT_H_

// One cluster shared by every test of a binary: a GoogleTest global environment, so it is
// started once on the main thread (its processes die with it) before the first test and
// stopped after the last. An integration test's main() is
//
//   int main(int argc, char** argv) { return shardcoord::RunWithCluster(argc, argv, options); }
//
// or, with default options, no main() at all: depend on //tests:cluster_main. Fixtures derive
// from ClusterTest (or MeshTest for the shared test meshes).

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "client/coordinator_client.h"
#include "gtest/gtest.h"
#include "proto/shardcoord.pb.h"
#include "tests/cluster.h"
#include "tests/tensor_check.h"

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

// Runs every test of the binary against one cluster started with `options`.
inline int RunWithCluster(int argc, char** argv, ClusterOptions options = {}) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new ClusterEnvironment(std::move(options)));
  return RUN_ALL_TESTS();
}

// A test on the binary's cluster: cluster_ is set (or the test fails) before it runs.
class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = ClusterEnvironment::Get();
    ASSERT_NE(cluster_, nullptr) << "no cluster";
  }

  CoordinatorClient& client() { return cluster_->client(); }

  // The tensor's version, or -1 (a failure) when it cannot be read.
  int64_t Version(const std::string& name) {
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(name);
    EXPECT_TRUE(t.ok()) << name << ": " << t.status();
    return t.ok() ? t->version() : -1;
  }

  Cluster* cluster_ = nullptr;
};

// A ClusterTest whose meshes (MakeTestMeshes: line, grid, line_rev, pair, trio) exist.
class MeshTest : public ClusterTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(ClusterTest::SetUp());
    absl::StatusOr<std::map<std::string, v1::MeshInfo>> made = MakeTestMeshes(client());
    ASSERT_TRUE(made.ok()) << made.status();
    meshes_ = *std::move(made);
  }

  const v1::MeshInfo& Mesh(const std::string& name) { return meshes_.at(name); }

  std::map<std::string, v1::MeshInfo> meshes_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_CLUSTER_ENVIRONMENT_H_
