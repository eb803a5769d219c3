// Bearer tokens and roles through real daemons: a coordinator started with --auth-tokens (a
// file this test writes, one token per role) and four workers registered with the worker
// token. Every identity (each role, no token, a wrong token) calls every RPC of both
// coordinator services: allowed calls are not refused, refused ones get UNAUTHENTICATED or
// PERMISSION_DENIED and change nothing. Workers without the worker token cannot register, a
// bad tokens file stops the coordinator at startup, and the log names tokens, never shows one.

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/grpc_status.h"
#include "proto/shardcoord.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/daemon.h"
#include "tests/process.h"
#include "tests/tensor_check.h"
#include "tests/test_files.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const Shape kShape = {8, 4};

// Who calls: a role's token, no token, or a token the coordinator does not know.
struct Identity {
  std::string label;  // Test name suffix and tensor/mesh name suffix.
  std::string role;   // Empty: not authenticated.
  std::string name;   // NAME in the tokens file.
  std::string token;  // Empty: no metadata.
};

// Test names and failure messages show the label, never the token.
void PrintTo(const Identity& id, std::ostream* os) { *os << id.label; }

std::string RandomToken() {
  absl::BitGen gen;
  std::string bytes(24, '\0');
  for (char& c : bytes) c = static_cast<char>(absl::Uniform<int>(gen, 0, 256));
  return absl::BytesToHexString(bytes);
}

const std::vector<Identity>& Identities() {
  static const std::vector<Identity>* ids = new std::vector<Identity>{
      {"admin", "admin", "alice", RandomToken()},
      {"operator", "operator", "olga", RandomToken()},
      {"reader", "reader", "rick", RandomToken()},
      {"worker", "worker", "workers", RandomToken()},
      {"no_token", "", "", ""},
      {"wrong_token", "", "", RandomToken()},
  };
  return *ids;
}

const Identity& Id(const std::string& label) {
  for (const Identity& id : Identities()) {
    if (id.label == label) return id;
  }
  std::abort();
}

// The tokens file: one line per role, comments and a blank line.
std::string TokensFile() {
  std::string text = "# written by tests/auth_test\n\n";
  for (const Identity& id : Identities()) {
    if (!id.role.empty())
      absl::StrAppend(&text, id.role, " ", id.name, " ", Sha256Hex(id.token), "\n");
  }
  return text;
}

// The policy of the issue, written out independently of coordinator/rpc/auth.cc.
const std::map<std::string, std::set<std::string>>& Policy() {
  static const auto* policy = new std::map<std::string, std::set<std::string>>{
      {"ListWorkers", {"admin", "operator", "reader"}},
      {"CreateMesh", {"admin"}},
      {"GetMesh", {"admin", "operator", "reader"}},
      {"ListMeshes", {"admin", "operator", "reader"}},
      {"DeleteMesh", {"admin"}},
      {"CreateTensor", {"admin", "operator"}},
      {"GetTensor", {"admin", "operator", "reader"}},
      {"ListTensors", {"admin", "operator", "reader"}},
      {"DeleteTensor", {"admin"}},
      {"Redistribute", {"admin", "operator"}},
      {"Gather", {"admin", "operator"}},
      {"Copy", {"admin", "operator"}},
      {"CopyGroup", {"admin", "operator"}},
      {"RedistributeGroup", {"admin", "operator"}},
      {"GatherGroup", {"admin", "operator"}},
      {"PlanRedistribute", {"admin", "operator", "reader"}},
      {"WatchPlan", {"admin", "operator", "reader"}},
      {"GetPlanTrace", {"admin", "operator", "reader"}},
      {"ListPlans", {"admin", "operator", "reader"}},
      {"Upload", {"admin", "operator"}},
      {"Download", {"admin", "operator", "reader"}},
      {"SaveCheckpoint", {"admin"}},
      {"LoadCheckpoint", {"admin"}},
      {"InspectCheckpoint", {"admin", "operator", "reader"}},
      {"GetCheckpointProgress", {"admin", "operator", "reader"}},
      {"RegisterWorker", {"worker"}},
      {"Heartbeat", {"worker"}},
      {"KvSet", {"worker"}},
      {"KvGet", {"worker"}},
      {"Barrier", {"worker"}},
      {"ReportChunks", {"worker"}},
      {"AttachBuffer", {"worker"}},
      {"DetachBuffer", {"worker"}},
      {"AttachBuffers", {"worker"}},

      {"LeaveWorker", {"worker"}},
  };
  return *policy;
}

bool Allowed(const Identity& who, const std::string& rpc) {
  return !who.role.empty() && Policy().at(rpc).count(who.role) > 0;
}

class AuthTest : public ::testing::TestWithParam<Identity> {
 protected:
  void SetUp() override {
    cluster_ = ClusterEnvironment::Get();
    ASSERT_NE(cluster_, nullptr) << "no cluster";
    CoordinatorClientOptions options;
    options.token = GetParam().token;
    client_ = std::make_unique<CoordinatorClient>(cluster_->coordinator_address(), options);
    channel_ =
        grpc::CreateChannel(cluster_->coordinator_address(), grpc::InsecureChannelCredentials());
    workers_stub_ = v1::CoordinatorWorkers::NewStub(channel_);
    static bool mesh_made = false;
    if (!mesh_made) {
      absl::StatusOr<v1::MeshInfo> mesh = MakeMesh(admin(), "base", {4}, cluster_->WorkerNames());
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      mesh_made = true;
    }
  }

  CoordinatorClient& admin() { return cluster_->client(); }
  CoordinatorClient& client() { return *client_; }
  std::string Name(const std::string& prefix) {
    return absl::StrCat(prefix, "_", GetParam().label);
  }

  // Checks the outcome of `rpc` for this identity: not refused when allowed (and OK when
  // `want_ok`), else UNAUTHENTICATED without a known token, PERMISSION_DENIED naming the RPC and
  // the role with one. Returns whether the call was allowed.
  bool Check(const std::string& rpc, const absl::Status& s, bool want_ok = true) {
    const Identity& who = GetParam();
    if (Allowed(who, rpc)) {
      EXPECT_NE(s.code(), absl::StatusCode::kUnauthenticated) << rpc << ": " << s;
      EXPECT_NE(s.code(), absl::StatusCode::kPermissionDenied) << rpc << ": " << s;
      if (want_ok) EXPECT_TRUE(s.ok()) << rpc << ": " << s;
      return true;
    }
    if (who.role.empty()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << rpc << ": " << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << rpc << ": " << s;
      EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("/", rpc)));
      EXPECT_THAT(s.message(), HasSubstr(who.role));
    }
    EXPECT_THAT(s.message(), Not(HasSubstr(who.token.empty() ? "\x01" : who.token)));
    return false;
  }

  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!GetParam().token.empty()) {
      ctx->AddMetadata("authorization", absl::StrCat("Bearer ", GetParam().token));
    }
    return ctx;
  }

  int64_t Version(const std::string& tensor) {
    absl::StatusOr<v1::TensorInfo> t = admin().GetTensor(tensor);
    EXPECT_TRUE(t.ok()) << tensor << ": " << t.status();
    return t.ok() ? t->version() : -1;
  }

  Cluster* cluster_ = nullptr;
  std::unique_ptr<CoordinatorClient> client_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CoordinatorWorkers::Stub> workers_stub_;
};

TEST_P(AuthTest, MeshRpcs) {
  Check("ListWorkers", client().ListWorkers().status());
  Check("GetMesh", client().GetMesh("base").status());
  Check("ListMeshes", client().ListMeshes().status());

  const std::string created = Name("cm");
  const bool create_allowed =
      Check("CreateMesh", MakeMesh(client(), created, {4}, cluster_->WorkerNames()).status());
  EXPECT_EQ(admin().GetMesh(created).ok(), create_allowed);

  const std::string doomed = Name("dm");
  ASSERT_TRUE(MakeMesh(admin(), doomed, {2}, {"w0", "w1"}).ok());
  const bool delete_allowed = Check("DeleteMesh", client().DeleteMesh(doomed));
  EXPECT_EQ(admin().GetMesh(doomed).status().code(),
            delete_allowed ? absl::StatusCode::kNotFound : absl::StatusCode::kOk);
}

TEST_P(AuthTest, TensorRpcs) {
  const std::string t = Name("t"), dst = Name("dst");
  ASSERT_TRUE(CreateFilled(admin(), t, kShape, DType::kF32, "base", "S(0)").ok());
  ASSERT_TRUE(
      CreateFilled(admin(), dst, kShape, DType::kF32, "base", "S(1)", false, v1::ZEROS).ok());

  Check("GetTensor", client().GetTensor(t).status());
  Check("ListTensors", client().ListTensors().status());

  const std::string created = Name("ct");
  const bool create_allowed =
      Check("CreateTensor",
            CreateFilled(client(), created, kShape, DType::kF32, "base", "S(0)").status());
  EXPECT_EQ(admin().GetTensor(created).ok(), create_allowed);

  const std::string doomed = Name("dt");
  ASSERT_TRUE(CreateFilled(admin(), doomed, kShape, DType::kF32, "base", "S(0)").ok());
  const bool delete_allowed = Check("DeleteTensor", client().DeleteTensor(doomed));
  EXPECT_EQ(admin().GetTensor(doomed).status().code(),
            delete_allowed ? absl::StatusCode::kNotFound : absl::StatusCode::kOk);

  int64_t before = Version(t);
  bool allowed = Check("Redistribute", client().Redistribute(RedistributeTo(t, "", "R")).status());
  EXPECT_EQ(Version(t) > before, allowed);

  v1::GatherRequest gather;
  gather.set_tensor(t);
  gather.set_to_rank(0);
  gather.set_has_to_rank(true);
  gather.set_wait(true);
  before = Version(t);
  allowed = Check("Gather", client().Gather(gather).status());
  EXPECT_EQ(Version(t) > before, allowed);

  v1::CopyRequest copy;
  copy.set_src(t);
  copy.set_dst(dst);
  copy.set_wait(true);
  before = Version(dst);
  allowed = Check("Copy", client().Copy(copy).status());
  EXPECT_EQ(Version(dst) > before, allowed);

  v1::CopyGroupRequest copy_group;
  v1::CopyPair* pair = copy_group.add_copies();
  pair->set_src(t);
  pair->set_dst(dst);
  copy_group.set_wait(true);
  before = Version(dst);
  allowed = Check("CopyGroup", client().CopyGroup(copy_group).status());
  EXPECT_EQ(Version(dst) > before, allowed);

  v1::RedistributeGroupRequest redistribute_group;
  v1::RedistributeItem* item = redistribute_group.add_redistributes();
  item->set_tensor(t);
  *item->mutable_target() = SpecFromText("base", "S(0)");
  redistribute_group.set_wait(true);
  before = Version(t);
  allowed = Check("RedistributeGroup", client().RedistributeGroup(redistribute_group).status());
  EXPECT_EQ(Version(t) > before, allowed);

  v1::GatherGroupRequest gather_group;
  gather_group.add_tensors(t);
  gather_group.set_wait(true);
  before = Version(t);
  allowed = Check("GatherGroup", client().GatherGroup(gather_group).status());
  EXPECT_EQ(Version(t) > before, allowed);

  v1::PlanRequest plan;
  plan.set_tensor(t);
  *plan.mutable_target() = SpecFromText("base", "S(1)");
  Check("PlanRedistribute", client().PlanRedistribute(plan).status());

  // An unknown plan: NOT_FOUND when allowed to ask.
  absl::Status watch = client().WatchPlan("no-such-plan", [](const v1::PlanProgress&) {}).status();
  if (Check("WatchPlan", watch, /*want_ok=*/false)) {
    EXPECT_EQ(watch.code(), absl::StatusCode::kNotFound) << watch;
  }
  absl::Status trace = client().GetPlanTrace("no-such-plan").status();
  if (Check("GetPlanTrace", trace, /*want_ok=*/false)) {
    EXPECT_EQ(trace.code(), absl::StatusCode::kNotFound) << trace;
  }
  Check("ListPlans", client().ListPlans(10).status());

  // Whatever moved, t still holds arange.
  if (Check("Download", DownloadAndCheck(client(), t, DType::kF32, kShape, FillKind::kArange))) {
    EXPECT_TRUE(DownloadAndCheck(admin(), dst, DType::kF32, kShape,
                                 Allowed(GetParam(), "Copy") ? FillKind::kArange : FillKind::kZeros)
                    .ok());
  }

  const std::string uploaded = Name("up");
  v1::TensorHeader header;
  header.set_name(uploaded);
  for (int64_t d : kShape) header.add_shape(d);
  header.set_dtype(v1::F32);
  *header.mutable_spec() = SpecFromText("base", "S(0)");
  std::string data(8 * 4 * sizeof(float), '\0');
  for (int i = 0; i < 32; ++i) {
    const float v = i;
    std::memcpy(&data[i * sizeof(float)], &v, sizeof(v));
  }
  const bool upload_allowed = Check("Upload", client().Upload(header, data).status());
  EXPECT_EQ(admin().GetTensor(uploaded).ok(), upload_allowed);
  if (upload_allowed) {
    EXPECT_TRUE(DownloadAndCheck(admin(), uploaded, DType::kF32, kShape, FillKind::kArange).ok());
  }
}

TEST_P(AuthTest, CheckpointRpcs) {
  const std::string t = Name("ck");
  ASSERT_TRUE(CreateFilled(admin(), t, kShape, DType::kF32, "base", "S(0)").ok());
  const std::string dir = absl::StrCat(TmpDir(), "/", Name("ckpt"));
  v1::SaveCheckpointRequest save;
  save.set_dir(dir);
  save.add_tensors(t);
  const bool save_allowed = Check("SaveCheckpoint", client().SaveCheckpoint(save).status());
  EXPECT_EQ(admin().InspectCheckpoint(dir).ok(), save_allowed);
  if (!save_allowed) ASSERT_TRUE(admin().SaveCheckpoint(save).ok());

  Check("InspectCheckpoint", client().InspectCheckpoint(dir).status());
  absl::Status progress = client().GetCheckpointProgress("no-such-operation").status();
  if (Check("GetCheckpointProgress", progress, /*want_ok=*/false)) {
    EXPECT_EQ(progress.code(), absl::StatusCode::kNotFound) << progress;
  }

  const std::string loaded = Name("ckl");
  v1::LoadCheckpointRequest load;
  load.set_dir(dir);
  v1::LoadTarget* target = load.add_targets();
  target->set_tensor(t);
  target->set_name(loaded);
  *target->mutable_target() = SpecFromText("base", "S(1)");
  const bool load_allowed = Check("LoadCheckpoint", client().LoadCheckpoint(load).status());
  EXPECT_EQ(admin().GetTensor(loaded).ok(), load_allowed);
  if (load_allowed) {
    EXPECT_TRUE(DownloadAndCheck(admin(), loaded, DType::kF32, kShape, FillKind::kArange).ok());
  }
}

TEST_P(AuthTest, WorkerFacingRpcs) {
  const std::string key = absl::StrCat("auth_test/", GetParam().label);
  v1::KvSetRequest set;
  set.set_key(key);
  set.set_value("v");
  v1::KvSetResponse set_resp;
  const bool set_allowed =
      Check("KvSet", FromGrpcStatus(workers_stub_->KvSet(Ctx().get(), set, &set_resp)));

  // Read back with the worker token: the key exists only if the set was allowed.
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", Id("worker").token));
    v1::KvGetRequest get;
    get.set_key(key);
    v1::KvGetResponse resp;
    const grpc::Status s = workers_stub_->KvGet(&ctx, get, &resp);
    EXPECT_EQ(s.ok(), set_allowed) << s.error_message();
  }

  v1::KvGetRequest get;
  get.set_key(key);
  v1::KvGetResponse get_resp;
  absl::Status s = FromGrpcStatus(workers_stub_->KvGet(Ctx().get(), get, &get_resp));
  if (Check("KvGet", s, /*want_ok=*/false)) EXPECT_TRUE(s.ok()) << s;

  v1::HeartbeatRequest hb;
  hb.set_name("nobody");
  v1::HeartbeatResponse hb_resp;
  s = FromGrpcStatus(workers_stub_->Heartbeat(Ctx().get(), hb, &hb_resp));
  if (Check("Heartbeat", s, /*want_ok=*/false)) EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);

  v1::BarrierRequest barrier;
  barrier.set_key(key);
  barrier.set_participants(1);
  barrier.set_member("m");
  barrier.set_timeout_ms(10000);
  v1::BarrierResponse barrier_resp;
  Check("Barrier", FromGrpcStatus(workers_stub_->Barrier(Ctx().get(), barrier, &barrier_resp)));

  v1::ReportChunksRequest report;
  report.set_plan_id("no-such-plan");
  report.set_worker("w0");
  v1::ReportChunksResponse report_resp;
  s = FromGrpcStatus(workers_stub_->ReportChunks(Ctx().get(), report, &report_resp));
  if (Check("ReportChunks", s, /*want_ok=*/false)) {
    EXPECT_NE(s.code(), absl::StatusCode::kOk);  // Unknown plan.
  }

  v1::AttachBufferRequest attach;
  attach.set_worker("nobody");
  attach.set_tensor("t");
  attach.set_dtype(v1::F32);
  v1::AttachBufferResponse attach_resp;
  s = FromGrpcStatus(workers_stub_->AttachBuffer(Ctx().get(), attach, &attach_resp));
  if (Check("AttachBuffer", s, /*want_ok=*/false)) EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);

  v1::DetachBufferRequest detach;
  detach.set_worker("nobody");
  detach.set_tensor("t");
  v1::DetachBufferResponse detach_resp;
  s = FromGrpcStatus(workers_stub_->DetachBuffer(Ctx().get(), detach, &detach_resp));
  if (Check("DetachBuffer", s, /*want_ok=*/false)) EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);

  v1::AttachBuffersRequest attach_many;
  attach_many.set_worker("nobody");
  v1::LentBuffer* lent = attach_many.add_buffers();
  lent->set_tensor("t");
  lent->set_dtype(v1::F32);
  v1::AttachBuffersResponse attach_many_resp;
  s = FromGrpcStatus(workers_stub_->AttachBuffers(Ctx().get(), attach_many, &attach_many_resp));
  if (Check("AttachBuffers", s, /*want_ok=*/false)) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  }

  // An unknown worker cannot leave (NOT_FOUND) once the token lets the call through.
  v1::LeaveWorkerRequest leave;
  leave.set_name("nobody");
  leave.set_drain_timeout_ms(1000);
  v1::LeaveWorkerResponse leave_resp;
  s = FromGrpcStatus(workers_stub_->LeaveWorker(Ctx().get(), leave, &leave_resp));
  if (Check("LeaveWorker", s, /*want_ok=*/false)) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  }

  // Registration changes the worker table, so only refusals are tried here (the cluster's
  // workers registered with the worker token).
  if (GetParam().role != "worker") {
    const std::string intruder = Name("intruder");
    v1::RegisterWorkerRequest reg;
    reg.set_name(intruder);
    reg.set_host("h");
    reg.set_device("cpu");
    reg.set_address("127.0.0.1:1");
    reg.set_backend("gloo");
    v1::RegisterWorkerResponse reg_resp;
    Check("RegisterWorker",
          FromGrpcStatus(workers_stub_->RegisterWorker(Ctx().get(), reg, &reg_resp)));
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = admin().ListWorkers();
    ASSERT_TRUE(workers.ok());
    for (const v1::WorkerInfo& w : *workers) EXPECT_NE(w.name(), intruder);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIdentity, AuthTest, ::testing::ValuesIn(Identities()),
                         [](const ::testing::TestParamInfo<Identity>& info) {
                           return info.param.label;
                         });

TEST(AuthClusterTest, WorkersRegisteredWithTheWorkerToken) {
  Cluster* cluster = ClusterEnvironment::Get();
  ASSERT_NE(cluster, nullptr);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = cluster->client().ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  int alive = 0;
  for (const v1::WorkerInfo& w : *workers) {
    if (w.state() == v1::ALIVE && absl::StartsWith(w.name(), "w")) ++alive;
  }
  EXPECT_EQ(alive, 4);
}

// A worker with no token, an unknown token or a client role's token is refused registration
// and exits; the coordinator never lists it.
TEST(AuthClusterTest, WorkerWithoutTheWorkerTokenCannotRegister) {
  Cluster* cluster = ClusterEnvironment::Get();
  ASSERT_NE(cluster, nullptr);
  struct Case {
    std::string label;
    std::string token;  // Empty: no --token-file.
    std::string code;
  };
  const std::vector<Case> cases = {
      {"none", "", "UNAUTHENTICATED"},
      {"wrong", RandomToken(), "UNAUTHENTICATED"},
      {"reader", Id("reader").token, "PERMISSION_DENIED"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string name = absl::StrCat("rogue_", c.label);
    std::vector<std::string> flags = {"--register-timeout=60s"};
    if (!c.token.empty()) {
      const std::string file = absl::StrCat(TmpDir(), "/", name, ".token");
      WriteFile(file, c.token + "\n");
      flags.push_back(absl::StrCat("--token-file=", file));
    }
    // Refusals are not retried: the worker exits at once (the bound is only a safety net).
    absl::StatusOr<Exited> worker = RunWorkerToExit(name, cluster->coordinator_address(), flags);
    ASSERT_TRUE(worker.ok()) << worker.status();
    EXPECT_TRUE(WIFEXITED(worker->wait_status) && WEXITSTATUS(worker->wait_status) != 0)
        << Process::DescribeWaitStatus(worker->wait_status);
    EXPECT_THAT(worker->log, HasSubstr(c.code));
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = cluster->client().ListWorkers();
    ASSERT_TRUE(workers.ok());
    for (const v1::WorkerInfo& w : *workers) EXPECT_NE(w.name(), name);
  }
}

// The coordinator's log names the token of a refused call, and shows no token.
TEST(AuthClusterTest, LogNamesTokensAndShowsNone) {
  Cluster* cluster = ClusterEnvironment::Get();
  ASSERT_NE(cluster, nullptr);
  CoordinatorClientOptions options;
  options.token = Id("reader").token;
  CoordinatorClient reader(cluster->coordinator_address(), options);
  ASSERT_EQ(reader.DeleteMesh("base").code(), absl::StatusCode::kPermissionDenied);
  options.token = Id("wrong_token").token;
  CoordinatorClient wrong(cluster->coordinator_address(), options);
  ASSERT_EQ(wrong.ListMeshes().status().code(), absl::StatusCode::kUnauthenticated);
  // Both refusals were logged before their replies were sent.
  const std::string log = ReadFile(absl::StrCat(TmpDir(), "/coordinator.log"));
  EXPECT_THAT(log, HasSubstr("token 'rick' has role reader"));
  EXPECT_THAT(log, HasSubstr("/shardcoord.v1.Coordinator/DeleteMesh"));
  EXPECT_THAT(log, HasSubstr("unknown token"));
  for (const Identity& id : Identities()) {
    if (!id.token.empty()) EXPECT_THAT(log, Not(HasSubstr(id.token))) << id.label;
  }
}

// A bad line stops the coordinator at startup, naming the file and line.
TEST(AuthClusterTest, BadTokensFileFailsStartup) {
  absl::StatusOr<std::string> coordinator_bin = RunfilePath("coordinator/coordinator");
  ASSERT_TRUE(coordinator_bin.ok()) << coordinator_bin.status();
  const std::string file = absl::StrCat(TmpDir(), "/bad_tokens");
  WriteFile(file,
            absl::StrCat("# ok\nadmin a ", Sha256Hex("x"), "\nsuperuser b ", Sha256Hex("y"), "\n"));
  absl::StatusOr<Exited> coordinator =
      RunToExit("bad_coordinator", {*coordinator_bin, "--listen=127.0.0.1:0", "--http-listen=off",
                                    absl::StrCat("--auth-tokens=", file)});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  EXPECT_TRUE(WIFEXITED(coordinator->wait_status) && WEXITSTATUS(coordinator->wait_status) == 2)
      << Process::DescribeWaitStatus(coordinator->wait_status);
  EXPECT_THAT(coordinator->log, HasSubstr(absl::StrCat(file, ":3: unknown role 'superuser'")));
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  const std::string dir = shardcoord::TmpDir();
  const std::string tokens = absl::StrCat(dir, "/tokens");
  const std::string worker_token = absl::StrCat(dir, "/worker.token");
  shardcoord::WriteFile(tokens, shardcoord::TokensFile());
  shardcoord::WriteFile(worker_token, shardcoord::Id("worker").token + "\n");
  shardcoord::ClusterOptions options;
  options.coordinator_flags = {absl::StrCat("--auth-tokens=", tokens)};
  options.worker_flags = {absl::StrCat("--token-file=", worker_token)};
  options.client_options.token = shardcoord::Id("admin").token;
  options.log_dir = dir;
  return shardcoord::RunWithCluster(argc, argv, std::move(options));
}
