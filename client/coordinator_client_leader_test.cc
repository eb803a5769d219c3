// CoordinatorClient with several coordinators ("A,B"): it follows the leader a standby names
// in its UNAVAILABLE (trailing metadata shardcoord-leader), rotates past coordinators that do
// not answer, and keeps one request_id across them. The standby is the coordinator's own
// StandbyService; the leader a small scripted service; both on loopback ports.

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/coordinator_client.h"
#include "coordinator/standby_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

class Leader final : public v1::Coordinator::Service {
 public:
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    response->add_workers()->set_name("w0");
    return grpc::Status::OK;
  }
  grpc::Status DeleteMesh(grpc::ServerContext*, const v1::DeleteMeshRequest* request,
                          v1::DeleteMeshResponse*) override {
    absl::MutexLock lock(&mu_);
    ids_.push_back(request->request_id());
    return grpc::Status::OK;
  }
  grpc::Status Download(grpc::ServerContext*, const v1::DownloadRequest*,
                        grpc::ServerWriter<v1::TensorData>* writer) override {
    v1::TensorData m;
    m.mutable_header()->set_name("t");
    m.mutable_header()->set_total_bytes(1);
    m.set_data("x");
    writer->Write(m);
    return grpc::Status::OK;
  }
  std::vector<std::string> ids() {
    absl::MutexLock lock(&mu_);
    return ids_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> ids_ ABSL_GUARDED_BY(mu_);
};

class LeaderFollowingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&leader_);
    leader_server_ = builder.BuildAndStart();
    ASSERT_NE(leader_server_, nullptr);
    leader_address_ = "127.0.0.1:" + std::to_string(port);
    absl::StatusOr<std::unique_ptr<StandbyServer>> standby = StandbyServer::Start(
        "127.0.0.1:0", grpc::InsecureServerCredentials(), "",
        [this] {
          absl::MutexLock lock(&mu_);
          return hint_;
        },
        "etcd://test");
    ASSERT_TRUE(standby.ok()) << standby.status();
    standby_ = *std::move(standby);
    SetHint(leader_address_);
  }
  void TearDown() override {
    if (leader_server_ != nullptr) leader_server_->Shutdown();
  }
  void SetHint(const std::string& h) {
    absl::MutexLock lock(&mu_);
    hint_ = h;
  }
  static CoordinatorClientOptions Quick() {
    CoordinatorClientOptions o;
    o.retry_for = absl::Seconds(30);
    o.retry_backoff = absl::Milliseconds(10);
    return o;
  }

  Leader leader_;
  std::unique_ptr<grpc::Server> leader_server_;
  std::string leader_address_;
  std::unique_ptr<StandbyServer> standby_;
  absl::Mutex mu_;
  std::string hint_ ABSL_GUARDED_BY(mu_);
};

TEST_F(LeaderFollowingTest, FollowsTheStandbysHintWithOneRequestId) {
  CoordinatorClient client(standby_->address() + "," + leader_address_, Quick());
  EXPECT_EQ(client.current_address(), standby_->address());
  ASSERT_TRUE(client.DeleteMesh("m").ok());
  EXPECT_EQ(client.current_address(), leader_address_);
  ASSERT_EQ(leader_.ids().size(), 1u);
  EXPECT_FALSE(leader_.ids()[0].empty());
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_EQ(client.current_address(), leader_address_);
}

TEST_F(LeaderFollowingTest, ALeaderOutsideTheListIsFollowedToo) {
  CoordinatorClient client(standby_->address(), Quick());
  ASSERT_TRUE(client.ListWorkers().ok());
  EXPECT_EQ(client.current_address(), leader_address_);
}

TEST_F(LeaderFollowingTest, ACoordinatorThatDoesNotAnswerIsPassedBy) {
  // A port nobody serves: connection refused, no hint; the next address is tried.
  grpc::ServerBuilder b;
  int dead_port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &dead_port);
  std::unique_ptr<grpc::Server> gone = b.BuildAndStart();
  gone->Shutdown();
  const std::string dead = "127.0.0.1:" + std::to_string(dead_port);
  CoordinatorClient client(dead + "," + leader_address_, Quick());
  ASSERT_TRUE(client.ListWorkers().ok());
  EXPECT_EQ(client.current_address(), leader_address_);
}

TEST_F(LeaderFollowingTest, AStreamRefusedByAStandbyMovesTheNextCallToTheLeader) {
  CoordinatorClient client(standby_->address() + "," + leader_address_, Quick());
  std::string data;
  absl::StatusOr<v1::TensorHeader> h = client.Download("t", &data);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kUnavailable) << h.status();
  EXPECT_EQ(client.current_address(), leader_address_);
  h = client.Download("t", &data);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(data, "x");
}

TEST_F(LeaderFollowingTest, WithoutALeaderTheRetryLoopEndsUnavailable) {
  SetHint("");
  CoordinatorClientOptions o = Quick();
  o.retry_for = absl::Milliseconds(200);
  CoordinatorClient client(standby_->address(), o);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
  EXPECT_EQ(workers.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(workers.status().message().find("no leader serves"), std::string::npos)
      << workers.status();
}

}  // namespace
}  // namespace shardcoord
