#include "proto/rpc_metrics.h"

#include <chrono>

#include "absl/status/status.h"

namespace shardcoord {
namespace {

namespace gx = grpc::experimental;

class RpcMetricsInterceptor : public gx::Interceptor {
 public:
  RpcMetricsInterceptor(const char* method, CounterFamily* calls, HistogramFamily* seconds)
      : method_(method == nullptr ? "" : method),
        calls_(calls),
        seconds_(seconds),
        start_(std::chrono::steady_clock::now()) {
    if (!method_.empty() && method_[0] == '/') method_.erase(0, 1);
  }

  void Intercept(gx::InterceptorBatchMethods* methods) override {
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
  const std::chrono::steady_clock::time_point start_;
};

class RpcMetricsFactory : public gx::ServerInterceptorFactoryInterface {
 public:
  RpcMetricsFactory(CounterFamily* calls, HistogramFamily* seconds)
      : calls_(calls), seconds_(seconds) {}

  gx::Interceptor* CreateServerInterceptor(gx::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(info->method(), calls_, seconds_);
  }

 private:
  CounterFamily* const calls_;
  HistogramFamily* const seconds_;
};

}  // namespace

std::unique_ptr<gx::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptor(
    CounterFamily* calls, HistogramFamily* seconds) {
  return std::make_unique<RpcMetricsFactory>(calls, seconds);
}

std::string RpcCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace shardcoord
