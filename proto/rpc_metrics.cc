#include "proto/rpc_metrics.h"

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"

namespace shardcoord {
namespace {

namespace gx = grpc::experimental;

absl::string_view WithoutSlash(absl::string_view method) { return absl::StripPrefix(method, "/"); }

// Counts the bytes of the messages a call sends (PRE_SEND_MESSAGE) and receives
// (POST_RECV_MESSAGE). A sent message is counted in its serialized form, which gRPC makes
// with the serializer of the message's own type (and would make next anyway); a received
// one only when the method is known to be protobuf, as nothing else says what the pointer
// gRPC hands over points to.
class MessageBytes {
 public:
  MessageBytes(CounterFamily* family, const std::string& label, bool protobuf)
      : sent_(family == nullptr ? nullptr : family->WithLabels({label, "sent"})),
        received_(family == nullptr || !protobuf ? nullptr
                                                 : family->WithLabels({label, "received"})) {}

  void Count(gx::InterceptorBatchMethods* methods) const {
    if (sent_ != nullptr &&
        methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      if (grpc::ByteBuffer* b = methods->GetSerializedSendMessage(); b != nullptr) {
        sent_->Increment(static_cast<double>(b->Length()));
      }
    }
    if (received_ != nullptr &&
        methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::POST_RECV_MESSAGE)) {
      if (void* m = methods->GetRecvMessage(); m != nullptr) {
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
  RpcMetricsInterceptor(const RpcMethods& methods, gx::ServerRpcInfo* info, CounterFamily* calls,
                        HistogramFamily* seconds, CounterFamily* message_bytes,
                        const MalformedCallFn* on_malformed)
      : info_(info),
        on_malformed_(on_malformed),
        method_(RpcMethodLabel(methods, info->method())),
        calls_(calls),
        seconds_(seconds),
        bytes_(message_bytes, method_,
               info->method() != nullptr && methods.IsProtobuf(info->method())),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(gx::InterceptorBatchMethods* methods) override {
    bytes_.Count(methods);
    if (methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      calls_->WithLabels({method_, RpcCodeName(status.error_code())})->Increment();
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
      seconds_->WithLabels({method_})->Observe(elapsed.count());
      if ((status.error_code() == grpc::StatusCode::INTERNAL ||
           status.error_code() == grpc::StatusCode::UNIMPLEMENTED) &&
          *on_malformed_ != nullptr) {
        (*on_malformed_)(method_, info_->server_context()->peer(), status);
      }
    }
    methods->Proceed();
  }

 private:
  gx::ServerRpcInfo* const info_;
  const MalformedCallFn* const on_malformed_;
  std::string method_;
  CounterFamily* const calls_;
  HistogramFamily* const seconds_;
  const MessageBytes bytes_;
  const std::chrono::steady_clock::time_point start_;
};

class RpcMetricsFactory : public gx::ServerInterceptorFactoryInterface {
 public:
  RpcMetricsFactory(RpcMethods methods, CounterFamily* calls, HistogramFamily* seconds,
                    CounterFamily* message_bytes, MalformedCallFn on_malformed)
      : methods_(std::move(methods)),
        on_malformed_(std::move(on_malformed)),
        calls_(calls),
        seconds_(seconds),
        message_bytes_(message_bytes) {}

  gx::Interceptor* CreateServerInterceptor(gx::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(methods_, info, calls_, seconds_, message_bytes_,
                                     &on_malformed_);
  }

 private:
  const RpcMethods methods_;
  const MalformedCallFn on_malformed_;
  CounterFamily* const calls_;
  HistogramFamily* const seconds_;
  CounterFamily* const message_bytes_;
};

class ClientBytesInterceptor : public gx::Interceptor {
 public:
  ClientBytesInterceptor(const RpcMethods& methods, CounterFamily* family, const char* method)
      : bytes_(family, RpcMethodLabel(methods, method),
               method != nullptr && methods.IsProtobuf(method)) {}
  void Intercept(gx::InterceptorBatchMethods* methods) override {
    bytes_.Count(methods);
    methods->Proceed();
  }

 private:
  const MessageBytes bytes_;
};

class ClientBytesFactory : public gx::ClientInterceptorFactoryInterface {
 public:
  ClientBytesFactory(RpcMethods methods, CounterFamily* family)
      : methods_(std::move(methods)), family_(family) {}
  gx::Interceptor* CreateClientInterceptor(gx::ClientRpcInfo* info) override {
    return new ClientBytesInterceptor(methods_, family_, info->method());
  }

 private:
  const RpcMethods methods_;
  CounterFamily* const family_;
};

}  // namespace

RpcMethods RpcMethods::Of(const std::vector<std::string>& protobuf_services) {
  RpcMethods m;
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const std::string& name : protobuf_services) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      m.protobuf_.insert(absl::StrCat(service->full_name(), "/", service->method(i)->name()));
    }
  }
  m.raw_.insert("grpc.health.v1.Health/Check");
  m.raw_.insert("grpc.health.v1.Health/Watch");
  return m;
}

bool RpcMethods::IsProtobuf(absl::string_view method) const {
  return protobuf_.contains(WithoutSlash(method));
}

bool RpcMethods::IsKnown(absl::string_view method) const {
  const absl::string_view m = WithoutSlash(method);
  return protobuf_.contains(m) || raw_.contains(m);
}

std::string RpcMethodLabel(const RpcMethods& methods, const char* method) {
  if (method == nullptr || !methods.IsKnown(method)) return "unknown";
  return std::string(WithoutSlash(method));
}

std::unique_ptr<gx::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptor(
    RpcMethods methods, CounterFamily* calls, HistogramFamily* seconds,
    CounterFamily* message_bytes, MalformedCallFn on_malformed) {
  return std::make_unique<RpcMetricsFactory>(std::move(methods), calls, seconds, message_bytes,
                                             std::move(on_malformed));
}

std::unique_ptr<gx::ClientInterceptorFactoryInterface> MakeRpcBytesClientInterceptor(
    RpcMethods methods, CounterFamily* message_bytes) {
  return std::make_unique<ClientBytesFactory>(std::move(methods), message_bytes);
}

std::string RpcCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace shardcoord
