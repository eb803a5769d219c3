// What an unauthenticated caller declares is not trusted (issue 25, item 5), checked on real
// daemons: an Upload declaring 1 TiB for a tensor that does not exist answers NOT_FOUND at
// once and the coordinator does not grow; SIGTERM ends the coordinator with status 0 right
// after it, and also while an upload stream is stalled in flight; worker names and drain
// timeouts a caller sends are validated.

#include <signal.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/shardcoord.grpc.pb.h"
#include "tests/daemon.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kTiB = int64_t{1} << 40;
// What SIGTERM may take, in-flight calls included: the coordinator's drain timeout (set low
// below) and its server's shutdown grace are far inside it.
constexpr absl::Duration kSigtermBound = absl::Seconds(30);

// The coordinator's resident set in bytes (VmRSS), or -1.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      int64_t kib = -1;
      in >> kib;
      return kib * 1024;
    }
    std::getline(in, key);
  }
  return -1;
}

class UntrustedInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Daemon> c = StartCoordinator("coordinator", {"--drain-timeout=5s"});
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
    for (const char* name : {"w0", "w1"}) {
      absl::StatusOr<Daemon> w = StartWorker(name, coordinator_.address, {});
      ASSERT_TRUE(w.ok()) << w.status();
      workers_.push_back(*std::move(w));
    }
    channel_ = grpc::CreateChannel(coordinator_.address, grpc::InsecureChannelCredentials());
    stub_ = v1::Coordinator::NewStub(channel_);
  }

  void TearDown() override {
    for (Daemon& w : workers_) {
      if (StillRunning(w)) EXPECT_TRUE(SignalAndExpectExitZero(w, SIGTERM).ok());
    }
    if (coordinator_.running() && StillRunning(coordinator_)) {
      EXPECT_TRUE(SignalAndExpectExitZero(coordinator_, SIGTERM).ok());
    }
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ctx;
  }

  // An Upload of one header message and nothing else; its status.
  grpc::Status UploadHeaderOnly(const v1::TensorHeader& header) {
    std::unique_ptr<grpc::ClientContext> ctx = Context();
    v1::UploadResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::TensorData>> w = stub_->Upload(ctx.get(), &resp);
    v1::TensorData m;
    *m.mutable_header() = header;
    w->Write(m);
    w->WritesDone();
    return w->Finish();
  }

  Daemon coordinator_;
  std::vector<Daemon> workers_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(UntrustedInputTest, ATebibyteUploadOfAnUnknownTensorIsNotFoundAndCostsNothing) {
  const int64_t before = ResidentBytes(coordinator_.process->pid());
  ASSERT_GT(before, 0);
  v1::TensorHeader h;
  h.set_name("nope");
  h.add_shape(kTiB / 4);
  h.set_dtype(v1::F32);
  h.set_total_bytes(kTiB);
  grpc::Status whole = UploadHeaderOnly(h);
  EXPECT_EQ(whole.error_code(), grpc::StatusCode::NOT_FOUND) << whole.error_message();
  EXPECT_THAT(whole.error_message(), HasSubstr("tensor 'nope' not found"));
  h.set_has_rank(true);
  h.set_rank(0);
  grpc::Status rank = UploadHeaderOnly(h);
  EXPECT_EQ(rank.error_code(), grpc::StatusCode::NOT_FOUND) << rank.error_message();
  // Nothing was reserved for the declared size: the process grew by far less than a GiB
  // (it used to grow by what was declared, up to hanging on 1 TiB).
  const int64_t after = ResidentBytes(coordinator_.process->pid());
  EXPECT_LT(after - before, int64_t{64} << 20) << "before " << before << " after " << after;
  EXPECT_TRUE(SignalAndExpectExitZero(coordinator_, SIGTERM, kSigtermBound).ok());
}

TEST_F(UntrustedInputTest, SigtermEndsTheCoordinatorWhileAnUploadStreamStalls) {
  CoordinatorClient client(coordinator_.address);
  v1::CreateMeshRequest mesh;
  mesh.set_name("m");
  mesh.add_shape(2);
  mesh.add_dim_names("x");
  ASSERT_TRUE(client.CreateMesh(mesh).ok());
  // A whole upload of a new 1 MiB tensor: header and a first piece, then the client stalls
  // (the workers' streams for it are open).
  std::unique_ptr<grpc::ClientContext> ctx = Context();
  v1::UploadResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::TensorData>> w = stub_->Upload(ctx.get(), &resp);
  v1::TensorData m;
  v1::TensorHeader* h = m.mutable_header();
  h->set_name("t");
  h->add_shape(512);
  h->add_shape(512);
  h->set_dtype(v1::F32);
  h->mutable_spec()->set_mesh("m");
  h->mutable_spec()->set_placements_text("S(0)");
  m.set_data(std::string(4096, 'x'));
  ASSERT_TRUE(w->Write(m));
  // The upload holds the tensor's name once its header is taken: wait until it shows.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  bool reserved = false;
  while (!reserved && absl::Now() < deadline) {
    v1::CreateTensorRequest create;
    create.set_name("t");
    create.add_shape(4);
    create.set_dtype(v1::F32);
    create.mutable_spec()->set_mesh("m");
    create.mutable_spec()->set_placements_text("R");
    absl::StatusOr<v1::TensorInfo> r = client.CreateTensor(create);
    reserved = !r.ok() && r.status().code() != absl::StatusCode::kUnavailable;
    if (!reserved) absl::SleepFor(absl::Milliseconds(20));  // Poll the condition.
  }
  ASSERT_TRUE(reserved);
  EXPECT_TRUE(SignalAndExpectExitZero(coordinator_, SIGTERM, kSigtermBound).ok());
  EXPECT_FALSE(w->Finish().ok());  // The stalled call ended (cancelled), not committed.
}

TEST_F(UntrustedInputTest, WorkerNamesAndDrainTimeoutsAreValidated) {
  auto workers = v1::CoordinatorWorkers::NewStub(channel_);
  for (const std::string& name :
       {std::string("/"), std::string("S(0)"), std::string("0:1,2:3;;"), std::string(300, 'a')}) {
    std::unique_ptr<grpc::ClientContext> ctx = Context();
    v1::RegisterWorkerRequest req;
    req.set_name(name);
    req.set_address("127.0.0.1:1");
    v1::RegisterWorkerResponse resp;
    grpc::Status s = workers->RegisterWorker(ctx.get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
    EXPECT_THAT(s.error_message(), HasSubstr("name: ")) << name;
  }
  {
    std::unique_ptr<grpc::ClientContext> ctx = Context();
    v1::LeaveWorkerRequest req;  // Empty name.
    v1::LeaveWorkerResponse resp;
    grpc::Status s = workers->LeaveWorker(ctx.get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "name: empty");
  }
  {
    std::unique_ptr<grpc::ClientContext> ctx = Context();
    v1::LeaveWorkerRequest req;
    req.set_name("w0");
    req.set_drain_timeout_ms(int64_t{1} << 53);
    v1::LeaveWorkerResponse resp;
    grpc::Status s = workers->LeaveWorker(ctx.get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("drain_timeout_ms = 9007199254740992 must be in"));
  }
  // The registered workers are untouched.
  CoordinatorClient client(coordinator_.address);
  absl::StatusOr<std::vector<v1::WorkerInfo>> list = client.ListWorkers();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  for (const v1::WorkerInfo& w : *list) {
    EXPECT_EQ(w.state(), v1::ALIVE) << w.name();
    EXPECT_FALSE(w.leaving()) << w.name();
  }
  // A worker refuses a bad --name itself, before it calls anyone.
  absl::StatusOr<std::string> bin = RunfilePath("worker/worker");
  ASSERT_TRUE(bin.ok()) << bin.status();
  ProcessOptions po;
  po.name = "bad-worker";
  po.stderr_path = absl::StrCat(TmpDir(), "/bad-worker.log");
  absl::StatusOr<std::unique_ptr<Process>> bad =
      Process::Start({*bin, absl::StrCat("--coordinator=", coordinator_.address), "--name=a/b",
                      "--backend=gloo", "--local-socket=off", "--listen=127.0.0.1:0"},
                     po);
  ASSERT_TRUE(bad.ok()) << bad.status();
  absl::StatusOr<int> status = (*bad)->Wait(kDaemonExitTimeout);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(Process::DescribeWaitStatus(*status), "exited with 2");
  std::ifstream log(po.stderr_path);
  std::string line;
  std::getline(log, line);
  EXPECT_THAT(line, HasSubstr("--name: 'a/b' has '/' at 1"));
}

}  // namespace
}  // namespace shardcoord
