#include "proto/grpc_health.h"

#include <memory>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// The status `service` reports at `address`, or the RPC's error code as a negative number.
int Check(const std::string& address, const std::string& service) {
  auto stub = Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return -static_cast<int>(s.error_code());
  return resp.status();
}

class GrpcHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HealthStatus::EnableDefaultService();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port_);
  }
  void TearDown() override {
    health_.Shutdown();
    server_->Shutdown();
  }

  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  HealthStatus health_;
};

TEST_F(GrpcHealthTest, ReadinessFollowsSetReadyAndLivenessStaysServing) {
  health_.Attach(server_.get());
  EXPECT_EQ(Check(address_, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(address_, kLivenessService), HealthCheckResponse::SERVING);
  health_.SetReady(true);
  EXPECT_EQ(Check(address_, ""), HealthCheckResponse::SERVING);
  health_.SetReady(false);  // Draining.
  EXPECT_EQ(Check(address_, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(address_, kLivenessService), HealthCheckResponse::SERVING);
  EXPECT_EQ(Check(address_, "shardcoord.v1.Nope"), -static_cast<int>(grpc::StatusCode::NOT_FOUND));
  health_.Shutdown();
  EXPECT_EQ(Check(address_, kLivenessService), HealthCheckResponse::NOT_SERVING);
  health_.SetReady(true);  // No effect after Shutdown.
  EXPECT_EQ(Check(address_, ""), HealthCheckResponse::NOT_SERVING);
}

TEST_F(GrpcHealthTest, PlaintextHealthPortMirrorsTheStatuses) {
  health_.Attach(server_.get());
  absl::StatusOr<std::string> extra = health_.ServeOn("127.0.0.1:0");
  ASSERT_TRUE(extra.ok()) << extra.status();
  EXPECT_EQ(Check(*extra, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(*extra, kLivenessService), HealthCheckResponse::SERVING);
  health_.SetReady(true);
  EXPECT_EQ(Check(*extra, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Check(address_, ""), HealthCheckResponse::SERVING);
}

TEST_F(GrpcHealthTest, ServeOnABadAddressFails) {
  absl::StatusOr<std::string> extra = health_.ServeOn("256.1.1.1:0");
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kUnavailable) << extra.status();
}

}  // namespace
}  // namespace shardcoord
