#include "proto/rpc_metrics.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/metrics.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/grpc_health.h"
#include "proto/shardcoord.grpc.pb.h"

namespace shardcoord {
namespace {

// A Worker service that answers Fill and leaves every other method unimplemented.
class FillOnly : public v1::Worker::CallbackService {
  grpc::ServerUnaryReactor* Fill(grpc::CallbackServerContext* ctx, const v1::FillRequest*,
                                 v1::FillResponse*) override {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

double ValueOf(CounterFamily* family, std::vector<std::string> labels) {
  return family->WithLabels(std::move(labels))->Value();
}

// A server with the metrics interceptor, gRPC's default health service and FillOnly, and
// a client channel with the bytes interceptor.
class RpcMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    calls_ = registry_.AddCounter("calls", "c", {"method", "code"});
    seconds_ = registry_.AddHistogram("seconds", "s", {"method"}, {0.1, 1});
    server_bytes_ = registry_.AddCounter("server_bytes", "b", {"method", "direction"});
    client_bytes_ = registry_.AddCounter("client_bytes", "b", {"method", "direction"});
    HealthStatus::EnableDefaultService();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> f;
    f.push_back(MakeRpcMetricsInterceptor(
        RpcMethods::Of({v1::Worker::service_full_name()}), calls_, seconds_, server_bytes_,
        [this](const std::string& method, const std::string& peer, const grpc::Status&) {
          absl::MutexLock lock(&mu_);
          malformed_.push_back(method + " " + peer.substr(0, peer.find(':')));
        }));
    builder.experimental().SetInterceptorCreators(std::move(f));
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    health_.Attach(server_.get());
    health_.SetReady(true);
    // Two channels: one for the Worker stub, one for generic calls, whose received messages
    // are ByteBuffers whatever the method.
    const std::string address = "127.0.0.1:" + std::to_string(port);
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> c;
    c.push_back(MakeRpcBytesClientInterceptor(RpcMethods::Of({v1::Worker::service_full_name()}),
                                              client_bytes_));
    channel_ = grpc::experimental::CreateCustomChannelWithInterceptors(
        address, grpc::InsecureChannelCredentials(), grpc::ChannelArguments(), std::move(c));
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> r;
    r.push_back(MakeRpcBytesClientInterceptor(RpcMethods::Of({}), client_bytes_));
    raw_channel_ = grpc::experimental::CreateCustomChannelWithInterceptors(
        address, grpc::InsecureChannelCredentials(), grpc::ChannelArguments(), std::move(r));
  }
  void TearDown() override {
    health_.Shutdown();
    server_->Shutdown();
  }

  // A unary call of `method` with `request` as raw bytes, through the generic channel.
  grpc::Status RawCall(const std::string& method, const std::string& request,
                       std::string* response) {
    grpc::GenericStub stub(raw_channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(request);
    grpc::ByteBuffer req(&slice, 1), resp;
    absl::Notification done;
    grpc::Status status;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    if (status.ok()) {
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(resp.Dump(&slices).ok());
      response->clear();
      for (const grpc::Slice& s : slices) {
        response->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    return status;
  }

  std::vector<std::string> Malformed() {
    absl::MutexLock lock(&mu_);
    return malformed_;
  }

  absl::Mutex mu_;
  std::vector<std::string> malformed_ ABSL_GUARDED_BY(mu_);  // "method ipv4" per call.
  Registry registry_;
  CounterFamily* calls_ = nullptr;
  HistogramFamily* seconds_ = nullptr;
  CounterFamily* server_bytes_ = nullptr;
  CounterFamily* client_bytes_ = nullptr;
  FillOnly service_;
  HealthStatus health_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<grpc::Channel> raw_channel_;
};

// The default health service exchanges raw ByteBuffers: a Check of zero bytes (the
// serialized HealthCheckRequest{}) used to crash the server, which read it as a protobuf.
TEST_F(RpcMetricsTest, RawHealthCheckIsAnsweredAndCounted) {
  std::string response;
  ASSERT_TRUE(RawCall("/grpc.health.v1.Health/Check", "", &response).ok());
  grpc::health::v1::HealthCheckResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(response));
  EXPECT_EQ(parsed.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(ValueOf(calls_, {"grpc.health.v1.Health/Check", "OK"}), 1);
  // What was sent is counted from its serialized form; what a raw method received is not.
  EXPECT_EQ(ValueOf(server_bytes_, {"grpc.health.v1.Health/Check", "sent"}),
            static_cast<double>(response.size()));
  EXPECT_EQ(ValueOf(server_bytes_, {"grpc.health.v1.Health/Check", "received"}), 0);
  // The generic channel knows no method: its received message is not read, its sent one
  // (zero bytes here) is counted.
  EXPECT_EQ(ValueOf(client_bytes_, {"unknown", "received"}), 0);
}

TEST_F(RpcMetricsTest, ProtobufMessagesAreCountedBothWays) {
  v1::FillRequest req;
  req.set_tensor("t");
  req.set_version(7);
  auto stub = v1::Worker::NewStub(channel_);
  grpc::ClientContext ctx;
  v1::FillResponse resp;
  ASSERT_TRUE(stub->Fill(&ctx, req, &resp).ok());
  const double size = static_cast<double>(req.ByteSizeLong());
  EXPECT_EQ(ValueOf(calls_, {"shardcoord.v1.Worker/Fill", "OK"}), 1);
  EXPECT_EQ(ValueOf(server_bytes_, {"shardcoord.v1.Worker/Fill", "received"}), size);
  EXPECT_EQ(ValueOf(client_bytes_, {"shardcoord.v1.Worker/Fill", "sent"}), size);
}

// A generic call of a protobuf method that answers: the generic channel receives a ByteBuffer
// and must not read it as protobuf.
TEST_F(RpcMetricsTest, GenericCallOfAProtobufMethodIsCountedSafely) {
  v1::FillRequest req;
  req.set_tensor("t");
  std::string response;
  ASSERT_TRUE(RawCall("/shardcoord.v1.Worker/Fill", req.SerializeAsString(), &response).ok());
  EXPECT_EQ(ValueOf(server_bytes_, {"shardcoord.v1.Worker/Fill", "received"}),
            static_cast<double>(req.ByteSizeLong()));
  EXPECT_EQ(ValueOf(calls_, {"shardcoord.v1.Worker/Fill", "OK"}), 1);
}

// Random bytes to a protobuf method fail to parse before any handler or interceptor sees a
// message (gRPC 1.51's callback handlers answer UNIMPLEMENTED then); an unimplemented method
// of a known service answers UNIMPLEMENTED too.
TEST_F(RpcMetricsTest, MalformedAndUnimplementedCallsLeaveTheServerUp) {
  std::string response;
  EXPECT_EQ(RawCall("/shardcoord.v1.Worker/Fill", std::string("\xff\xff\xff\xff\x0f", 5), &response)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(RawCall("/shardcoord.v1.Worker/Execute", "", &response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  ASSERT_TRUE(RawCall("/grpc.health.v1.Health/Check", "", &response).ok());
  EXPECT_EQ(Malformed(), (std::vector<std::string>{"shardcoord.v1.Worker/Fill ipv4",
                                                   "shardcoord.v1.Worker/Execute ipv4"}));
}

// Method names nobody registered share one label: callers cannot grow the metrics.
TEST_F(RpcMetricsTest, UnknownMethodsShareOneLabel) {
  std::string response;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(RawCall("/made.up" + std::to_string(i) + "/Method", "x", &response).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  EXPECT_EQ(ValueOf(calls_, {"unknown", "UNIMPLEMENTED"}), 3);
  EXPECT_EQ(registry_.Render().find("made.up"), std::string::npos);
}

TEST(RpcMethodsTest, KnowsTheNamedProtobufServicesAndTheHealthService) {
  const RpcMethods m = RpcMethods::Of({v1::Worker::service_full_name(), "no.such.Service"});
  EXPECT_TRUE(m.IsProtobuf("/shardcoord.v1.Worker/Execute"));
  EXPECT_TRUE(m.IsProtobuf("shardcoord.v1.Worker/Execute"));
  EXPECT_FALSE(m.IsProtobuf("/shardcoord.v1.Worker/Nope"));
  EXPECT_FALSE(m.IsProtobuf("/shardcoord.v1.Coordinator/ListWorkers"));
  EXPECT_FALSE(m.IsProtobuf("/grpc.health.v1.Health/Check"));
  EXPECT_TRUE(m.IsKnown("/grpc.health.v1.Health/Watch"));
  EXPECT_FALSE(m.IsKnown("/no.such.Service/X"));
  EXPECT_EQ(RpcMethodLabel(m, "/shardcoord.v1.Worker/Fill"), "shardcoord.v1.Worker/Fill");
  EXPECT_EQ(RpcMethodLabel(m, "/x/y"), "unknown");
  EXPECT_EQ(RpcMethodLabel(m, nullptr), "unknown");
}

}  // namespace
}  // namespace shardcoord
