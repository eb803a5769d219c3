#include "coordinator/rpc/service_test_util.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace shardcoord {

v1::RegisterWorkerRequest TestRegisterRequest(const std::string& name) {
  v1::RegisterWorkerRequest req;
  req.set_name(name);
  req.set_host("h");
  req.set_device("cpu");
  req.set_address(absl::StrCat(name, ":1"));
  req.set_backend("gloo");
  return req;
}

ServiceStack::ServiceStack(int64_t max_message_bytes, int64_t band_bytes, int64_t per_caller,
                           const Authenticator* auth)
    : workers_(&clock_, absl::Minutes(10)),
      meshes_(&workers_),
      tensors_(&meshes_),
      kv_(&timer_),
      plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_, {}),
      io_(&workers_, &meshes_, &tensors_, &client_, band_bytes),
      requests_(&request_store_, &clock_),
      watches_("watch streams", "--max-watches-per-caller", per_caller),
      running_plans_("running plans", "--max-plans-per-caller", per_caller),
      service_(&workers_, &meshes_, &tensors_, &plans_, &io_, max_message_bytes,
               /*metrics=*/nullptr, auth, per_caller > 0 ? &requests_ : nullptr,
               per_caller > 0 ? &watches_ : nullptr, per_caller > 0 ? &running_plans_ : nullptr),
      registration_(&workers_, &tensors_),
      attach_(&workers_, &tensors_, &plans_),
      worker_service_(&clock_, &workers_, &registration_, &kv_, &plans_, &attach_,
                      absl::Milliseconds(250), auth) {
  workers_.AddListener(&plans_);
}

void ServedStack::Serve(int* tcp_port) {
  grpc::ServerBuilder builder;
  builder.RegisterService(&service_);
  builder.RegisterService(&worker_service_);
  if (tcp_port != nullptr) {
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), tcp_port);
  }
  server_ = builder.BuildAndStart();
  std::shared_ptr<grpc::Channel> channel = server_->InProcessChannel(grpc::ChannelArguments());
  coordinator_ = v1::Coordinator::NewStub(channel);
  workers_stub_ = v1::CoordinatorWorkers::NewStub(channel);
}

void ServedStack::StopServing() {
  server_->Shutdown();
  timer_.Stop();
}

}  // namespace shardcoord
