#include "coordinator/rpc/standby_service.h"

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/coordinator_addresses.h"
#include "coordinator/testing/call_helpers.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/shardcoord.grpc.pb.h"

namespace shardcoord {
namespace {

using grpc::health::v1::HealthCheckResponse;

class StandbyServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<StandbyServer>> server = StandbyServer::Start(
        "127.0.0.1:0", grpc::InsecureServerCredentials(), "127.0.0.1:0",
        [this] {
          absl::MutexLock lock(&mu_);
          return leader_;
        },
        "etcd://e:1 /p");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  }
  void SetLeader(const std::string& l) {
    absl::MutexLock lock(&mu_);
    leader_ = l;
  }
  HealthCheckResponse::ServingStatus Health(const std::string& address, const std::string& name) {
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(name);
    HealthCheckResponse resp;
    EXPECT_TRUE(stub->Check(&ctx, req, &resp).ok());
    return resp.status();
  }

  absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<StandbyServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(StandbyServiceTest, EveryCallIsUnavailableNamingTheLeader) {
  SetLeader("10.1.2.3:7400");
  auto coordinator = v1::Coordinator::NewStub(channel_);
  {
    grpc::ClientContext ctx;
    v1::ListWorkersResponse resp;
    grpc::Status s = coordinator->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_NE(s.error_message().find("the leader is 10.1.2.3:7400"), std::string::npos)
        << s.error_message();
    EXPECT_NE(s.error_message().find("ListWorkers"), std::string::npos) << s.error_message();
    EXPECT_EQ(LeaderTrailer(ctx), "10.1.2.3:7400");
  }
  {
    // A client stream ends before its data is read.
    grpc::ClientContext ctx;
    EXPECT_EQ(UploadHeaderOnly(coordinator.get(), &ctx, "t").error_code(),
              grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(LeaderTrailer(ctx), "10.1.2.3:7400");
  }
  {
    grpc::ClientContext ctx;
    v1::DownloadRequest req;
    req.set_name("t");
    auto reader = coordinator->Download(&ctx, req);
    v1::TensorData data;
    EXPECT_FALSE(reader->Read(&data));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  auto workers = v1::CoordinatorWorkers::NewStub(channel_);
  grpc::ClientContext ctx;
  v1::RegisterWorkerRequest req;
  req.set_name("w0");
  v1::RegisterWorkerResponse resp;
  EXPECT_EQ(workers->RegisterWorker(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(LeaderTrailer(ctx), "10.1.2.3:7400");
}

TEST_F(StandbyServiceTest, NoLeaderYetSaysSoWithoutAHint) {
  auto coordinator = v1::Coordinator::NewStub(channel_);
  grpc::ClientContext ctx;
  v1::ListTensorsResponse resp;
  grpc::Status s = coordinator->ListTensors(&ctx, v1::ListTensorsRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("no leader serves yet"), std::string::npos) << s.error_message();
  EXPECT_EQ(LeaderTrailer(ctx), "");
}

TEST_F(StandbyServiceTest, NotReadyButAliveAndShutdownFreesThePorts) {
  EXPECT_EQ(Health(server_->address(), ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(server_->address(), "liveness"), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(server_->health_address(), ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(server_->health_address(), "liveness"), HealthCheckResponse::SERVING);
  // The leader's server binds the same port while the standby still serves (gRPC sets
  // SO_REUSEPORT), then the standby stops: its health port too is free afterwards.
  const std::string address = server_->address();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> next = builder.BuildAndStart();
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(address.substr(address.rfind(':') + 1), std::to_string(port));
  const std::string health = server_->health_address();
  server_->Shutdown();
  grpc::ServerBuilder health_builder;
  int health_port = 0;
  health_builder.AddListeningPort(health, grpc::InsecureServerCredentials(), &health_port);
  std::unique_ptr<grpc::Server> health_next = health_builder.BuildAndStart();
  ASSERT_NE(health_next, nullptr);
  EXPECT_NE(health_port, 0);
  health_next->Shutdown();
  next->Shutdown();
}

}  // namespace
}  // namespace shardcoord
