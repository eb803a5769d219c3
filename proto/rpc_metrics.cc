#include "proto/rpc_metrics.h"

#include <chrono>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"

namespace shardcoord {
namespace {

namespace gx = grpc::experimental;

std::string MethodLabel(const char* method) {
  std::string m = method == nullptr ? "" : method;
  if (!m.empty() && m[0] == '/') m.erase(0, 1);
  return m;
}

// Counts the bytes of the messages a call sends (PRE_SEND_MESSAGE) and receives
// (POST_RECV_MESSAGE). Every service and stub here is protobuf, so the message behind the
// interceptor's untyped pointer is a MessageLite.
class MessageBytes {
 public:
  MessageBytes(CounterFamily* family, const std::string& method)
      : sent_(family == nullptr ? nullptr : family->WithLabels({method, "sent"})),
        received_(family == nullptr ? nullptr : family->WithLabels({method, "received"})) {}

  void Count(gx::InterceptorBatchMethods* methods) const {
    if (sent_ == nullptr) return;
    if (methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      if (const void* m = methods->GetSendMessage()) {
        sent_->Increment(static_cast<double>(
            static_cast<const google::protobuf::MessageLite*>(m)->ByteSizeLong()));
      } else if (grpc::ByteBuffer* b = methods->GetSerializedSendMessage()) {
        sent_->Increment(static_cast<double>(b->Length()));
      }
    }
    if (methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::POST_RECV_MESSAGE)) {
      if (void* m = methods->GetRecvMessage()) {
        received_->Increment(
            static_cast<double>(static_cast<google::protobuf::MessageLite*>(m)->ByteSizeLong()));
      }
    }
  }

 private:
  Counter* const sent_;
  Counter* const received_;
};

class RpcMetricsInterceptor : public gx::Interceptor {
 public:
  RpcMetricsInterceptor(const char* method, CounterFamily* calls, HistogramFamily* seconds,
                        CounterFamily* message_bytes)
      : method_(MethodLabel(method)),
        calls_(calls),
        seconds_(seconds),
        bytes_(message_bytes, method_),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(gx::InterceptorBatchMethods* methods) override {
    bytes_.Count(methods);
    if (methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      calls_->WithLabels({method_, RpcCodeName(status.error_code())})->Increment();
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
      seconds_->WithLabels({method_})->Observe(elapsed.count());
    }
    methods->Proceed();
  }

 private:
  std::string method_;
  CounterFamily* const calls_;
  HistogramFamily* const seconds_;
  const MessageBytes bytes_;
  const std::chrono::steady_clock::time_point start_;
};

class RpcMetricsFactory : public gx::ServerInterceptorFactoryInterface {
 public:
  RpcMetricsFactory(CounterFamily* calls, HistogramFamily* seconds, CounterFamily* message_bytes)
      : calls_(calls), seconds_(seconds), message_bytes_(message_bytes) {}

  gx::Interceptor* CreateServerInterceptor(gx::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(info->method(), calls_, seconds_, message_bytes_);
  }

 private:
  CounterFamily* const calls_;
  HistogramFamily* const seconds_;
  CounterFamily* const message_bytes_;
};

class ClientBytesInterceptor : public gx::Interceptor {
 public:
  ClientBytesInterceptor(CounterFamily* family, const char* method)
      : bytes_(family, MethodLabel(method)) {}
  void Intercept(gx::InterceptorBatchMethods* methods) override {
    bytes_.Count(methods);
    methods->Proceed();
  }

 private:
  const MessageBytes bytes_;
};

class ClientBytesFactory : public gx::ClientInterceptorFactoryInterface {
 public:
  explicit ClientBytesFactory(CounterFamily* family) : family_(family) {}
  gx::Interceptor* CreateClientInterceptor(gx::ClientRpcInfo* info) override {
    return new ClientBytesInterceptor(family_, info->method());
  }

 private:
  CounterFamily* const family_;
};

}  // namespace

std::unique_ptr<gx::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptor(
    CounterFamily* calls, HistogramFamily* seconds, CounterFamily* message_bytes) {
  return std::make_unique<RpcMetricsFactory>(calls, seconds, message_bytes);
}

std::unique_ptr<gx::ClientInterceptorFactoryInterface> MakeRpcBytesClientInterceptor(
    CounterFamily* message_bytes) {
  return std::make_unique<ClientBytesFactory>(message_bytes);
}

std::string RpcCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace shardcoord
