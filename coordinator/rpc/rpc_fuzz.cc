// Fuzzes the coordinator's gRPC edge in process: both services with the real managers and a
// fake WorkerClient, gRPC's default health service, and the metrics interceptors on server
// and channel, as the daemon has them. An input is a method (its first byte picks one of
// every method of Coordinator, CoordinatorWorkers and grpc.health.v1.Health, or a name
// nobody serves) and up to three request messages of raw bytes (each after a length byte),
// sent on one stream whatever the method's kind, so parsing, the interceptors and every
// handler see malformed, truncated, repeated and missing requests. Nothing may crash, and a
// health check must still answer SERVING after every input.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/metrics.h"
#include "common/timer.h"
#include "coordinator/cluster/kv_store.h"
#include "coordinator/rpc/caller_quota.h"
#include "coordinator/rpc/coordinator_service.h"
#include "coordinator/rpc/request_log.h"
#include "coordinator/rpc/service_test_util.h"
#include "coordinator/rpc/worker_facing_service.h"
#include "coordinator/state/tensor_bands.h"
#include "coordinator/store/state_store.h"
#include "coordinator/testing/fake_worker_client.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_health.h"
#include "proto/rpc_metrics.h"
#include "proto/shardcoord.grpc.pb.h"

namespace shardcoord {
namespace {

void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "rpc_fuzz: %s\n", what.c_str());
    std::abort();
  }
}

// Writes the messages, half-closes, reads until the server ends the call (or its deadline).
class Call : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  Call(grpc::GenericStub* stub, const std::string& method, std::vector<std::string> messages)
      : messages_(std::move(messages)) {
    // Streams that never end by themselves (Watch, WatchPlan) end at the deadline.
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
    stub->PrepareBidiStreamingCall(&ctx_, method, grpc::StubOptions(), this);
    StartRead(&in_);
    WriteNext();
    StartCall();
  }

  grpc::Status Await() {
    done_.WaitForNotification();
    return status_;
  }

 private:
  void WriteNext() {
    if (next_ == messages_.size()) return StartWritesDone();
    grpc::Slice slice(messages_[next_++]);
    out_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&out_);
  }
  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override {
    status_ = s;
    done_.Notify();
  }

  grpc::ClientContext ctx_;
  std::vector<std::string> messages_;
  size_t next_ = 0;
  grpc::ByteBuffer out_, in_;
  grpc::Status status_;
  absl::Notification done_;
};

class Harness : private ServiceStack {
 public:
  Harness() : ServiceStack(1 << 16, kDefaultBandBytes, /*per_caller=*/1000) {
    const std::vector<std::string> services = {v1::Coordinator::service_full_name(),
                                               v1::CoordinatorWorkers::service_full_name()};
    CounterFamily* calls = registry_.AddCounter("calls", "c", {"method", "code"});
    HistogramFamily* seconds = registry_.AddHistogram("seconds", "s", {"method"}, {0.1});
    CounterFamily* bytes = registry_.AddCounter("bytes", "b", {"method", "direction"});
    HealthStatus::EnableDefaultService();
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    builder.RegisterService(&worker_service_);
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> server;
    server.push_back(MakeRpcMetricsInterceptor(
        RpcMethods::Of(services), calls, seconds, bytes,
        [](const std::string&, const std::string&, const grpc::Status&) {}));
    builder.experimental().SetInterceptorCreators(std::move(server));
    server_ = builder.BuildAndStart();
    Check(server_ != nullptr, "server did not start");
    health_.Attach(server_.get());
    health_.SetReady(true);
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> client;
    // A generic stub's received messages are ByteBuffers: no method is protobuf to it.
    client.push_back(MakeRpcBytesClientInterceptor(RpcMethods::Of({}), bytes));
    stub_ = std::make_unique<grpc::GenericStub>(
        server_->experimental().InProcessChannelWithInterceptors(grpc::ChannelArguments(),
                                                                 std::move(client)));
    const google::protobuf::DescriptorPool* pool =
        google::protobuf::DescriptorPool::generated_pool();
    for (const std::string& name : services) {
      const google::protobuf::ServiceDescriptor* s = pool->FindServiceByName(name);
      Check(s != nullptr, "no descriptor for " + name);
      for (int i = 0; i < s->method_count(); ++i) {
        methods_.push_back(absl::StrCat("/", name, "/", s->method(i)->name()));
      }
    }
    methods_.push_back("/grpc.health.v1.Health/Check");
    methods_.push_back("/grpc.health.v1.Health/Watch");
    methods_.push_back("/shardcoord.v1.Coordinator/NoSuchMethod");
    methods_.push_back("/no.such.Service/Method");
  }

  void Run(const uint8_t* data, size_t size) {
    if (size == 0) return;
    const std::string& method = methods_[data[0] % methods_.size()];
    std::vector<std::string> messages;
    size_t pos = 1;
    while (pos < size && messages.size() < 3) {
      // The length byte first: min's arguments are not sequenced, and `size - pos` must count
      // what follows it.
      const size_t length = data[pos++];
      const size_t n = std::min<size_t>(length, size - pos);
      messages.emplace_back(reinterpret_cast<const char*>(data + pos), n);
      pos += n;
    }
    Call call(stub_.get(), method, std::move(messages));
    call.Await();
    // The server answers health after whatever the input did.
    std::string empty;
    Call health(stub_.get(), "/grpc.health.v1.Health/Check", {empty});
    Check(health.Await().ok(), "health check failed after " + method);
  }

 private:
  Registry registry_;
  HealthStatus health_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::GenericStub> stub_;
  std::vector<std::string> methods_;
};

}  // namespace
}  // namespace shardcoord

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Never destroyed: calls the fuzzer left waiting (plans, rendezvous) may still hold it.
  static shardcoord::Harness* const harness = new shardcoord::Harness();
  harness->Run(data, size);
  return 0;
}
