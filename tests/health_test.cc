// The daemons as a platform calls them (issue 25): grpc.health.v1.Health through real
// coordinator and worker processes, the way kubelet probes, grpc_health_probe, Envoy and
// cloud load balancers do, and the signals Kubernetes and an operator send.
//
// - Check and Watch, for readiness ("") and "liveness", on the main port of both daemons and
//   on their --health-listen ports; an unknown service is NOT_FOUND.
// - The same call with raw bytes through a generic stub (an empty serialized
//   HealthCheckRequest, as Python's grpcio one-liner of the issue sends), and that very
//   one-liner with Debian's python3-grpcio.
// - With metrics on and off, TLS on and off, and --auth-tokens (health needs no token).
// - Readiness of a worker started before its coordinator: NOT_SERVING, then SERVING once it
//   registers (seen on a Watch stream); while it drains with a plan running, NOT_SERVING while
//   liveness stays SERVING and the coordinator lists it as leaving; then it leaves and exits 0.
// - A coordinator draining a plan: NOT_SERVING, liveness SERVING, new plans UNAVAILABLE.
// - SIGTERM and SIGINT stop either daemon with exit status 0; a worker on SIGTERM leaves.

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "common/sha256.h"
#include "common/tls_options.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/grpc_credentials.h"
#include "proto/grpc_status.h"
#include "tests/cluster.h"
#include "tests/daemon.h"
#include "tests/etcd_process.h"
#include "tests/process.h"
#include "tests/tensor_check.h"
#include "tests/test_files.h"

namespace shardcoord {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;
using ::testing::Not;
using Serving = HealthCheckResponse::ServingStatus;

constexpr Serving kServing = HealthCheckResponse::SERVING;
constexpr Serving kNotServing = HealthCheckResponse::NOT_SERVING;
// The daemons' liveness service name (proto/grpc_health.h): the contract probes are written
// against, spelled out here.
constexpr char kLivenessService[] = "liveness";
constexpr char kAdminToken[] = "health-test-admin-token";
constexpr char kWorkerToken[] = "health-test-worker-token";
// Bound on a daemon's startup and on each condition polled; never reached when all is well.
constexpr absl::Duration kStartTimeout = absl::Seconds(60);
constexpr absl::Duration kWaitTimeout = absl::Seconds(60);
// A worker stopped with SIGSTOP holds a plan for as long as a test needs it: it must not be
// declared dead meanwhile, nor any plan or drain time out on a slow machine.
constexpr char kLongHeartbeat[] = "--heartbeat-timeout=300s";
constexpr char kLongDrain[] = "--drain-timeout=300s";

std::string ServingName(absl::StatusOr<Serving> s) {
  if (!s.ok()) return s.status().ToString();
  return HealthCheckResponse::ServingStatus_Name(*s);
}

// Runs a shell command; its exit code and output (stdout and stderr).

std::string Quote(const std::string& s) { return absl::StrCat("'", s, "'"); }

// Polls ListWorkers until `pred` holds for the worker named `name`.
absl::Status AwaitWorker(CoordinatorClient& client, const std::string& name,
                         const std::function<bool(const v1::WorkerInfo&)>& pred,
                         const std::string& what) {
  const absl::Time deadline = absl::Now() + kWaitTimeout;
  std::string last = "not listed";
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
    if (workers.ok()) {
      for (const v1::WorkerInfo& w : *workers) {
        if (w.name() != name) continue;
        if (pred(w)) return absl::OkStatus();
        last = absl::StrCat(v1::WorkerState_Name(w.state()), w.leaving() ? ", leaving" : "");
      }
    } else {
      last = workers.status().ToString();
    }
    absl::SleepFor(absl::Milliseconds(20));  // ListWorkers has no push: poll the condition.
  }
  return absl::DeadlineExceededError(absl::StrCat("worker ", name, " not ", what, " within ",
                                                  absl::FormatDuration(kWaitTimeout),
                                                  "; last: ", last));
}

// ---- Health clients ------------------------------------------------------------------------

// How a client reaches a port: plaintext, or TLS trusting `ca` (and presenting `cert`), with
// `server_name` the name the server's certificate must carry (a worker's is its name).
struct Endpoint {
  std::string label;
  std::string address;
  bool tls = false;
  std::string cert;         // Client certificate (a name in CertDir), empty for none.
  std::string server_name;  // Empty: the host dialled.
};

std::shared_ptr<grpc::Channel> Channel(const Endpoint& e) {
  if (!e.tls) return grpc::CreateChannel(e.address, grpc::InsecureChannelCredentials());
  TlsFlags flags;
  flags.ca = Cert("ca");
  if (!e.cert.empty()) {
    flags.cert = Cert(e.cert);
    flags.key = Key(e.cert);
  }
  absl::StatusOr<TlsOptions> tls = LoadClientTls(flags);
  if (!tls.ok()) {
    ADD_FAILURE() << tls.status();
    return grpc::CreateChannel(e.address, grpc::InsecureChannelCredentials());
  }
  grpc::ChannelArguments args;
  if (!e.server_name.empty()) ExpectServerName(*tls, e.server_name, &args);
  return grpc::CreateCustomChannel(e.address, MakeChannelCredentials(*tls), args);
}

// Health/Check of `service`. With `wait_for_ready`, waits (within the deadline) for the port
// to accept connections: a daemon that has just been started.
absl::StatusOr<Serving> Check(const std::shared_ptr<grpc::Channel>& channel,
                              const std::string& service, bool wait_for_ready = false) {
  std::unique_ptr<Health::Stub> stub = Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ctx.set_wait_for_ready(wait_for_ready);
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status s = stub->Check(&ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s);
  return response.status();
}

// Health/Check with raw bytes through a generic stub: the serialized request is `request`,
// the answer is parsed here. This is how grpcio's unary_unary(...)(b'') and most proxies call.
absl::StatusOr<Serving> RawCheck(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& request) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(request);
  grpc::ByteBuffer send(&slice, 1);
  grpc::ByteBuffer received;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &send, &received,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status);
  std::vector<grpc::Slice> slices;
  if (!received.Dump(&slices).ok()) return absl::InternalError("cannot read the answer");
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  HealthCheckResponse response;
  if (!response.ParseFromString(bytes)) return absl::InternalError("unparsable answer");
  return response.status();
}

// A Health/Watch stream: the statuses the server pushes, in order.
class Watch {
 public:
  Watch(const std::shared_ptr<grpc::Channel>& channel, const std::string& service)
      : stub_(Health::NewStub(channel)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(240));
    HealthCheckRequest request;
    request.set_service(service);
    reader_ = stub_->Watch(&ctx_, request);
  }
  ~Watch() {
    if (finished_) return;
    ctx_.TryCancel();
    reader_->Finish().IgnoreError();
  }

  // The next status pushed; an error with the stream's status once it ends.
  absl::StatusOr<Serving> Next() {
    if (finished_) return absl::FailedPreconditionError("stream ended");
    HealthCheckResponse response;
    if (reader_->Read(&response)) {
      seen_.push_back(HealthCheckResponse::ServingStatus_Name(response.status()));
      return response.status();
    }
    finished_ = true;
    const grpc::Status s = reader_->Finish();
    return s.ok() ? absl::OutOfRangeError("stream ended with OK") : FromGrpcStatus(s);
  }

  // Reads until `want` arrives (the server may repeat a status); an error naming what was
  // seen when the stream ends first.
  absl::Status Await(Serving want) {
    while (true) {
      absl::StatusOr<Serving> s = Next();
      if (!s.ok()) {
        return absl::Status(
            s.status().code(),
            absl::StrCat("no ", HealthCheckResponse::ServingStatus_Name(want), " after [",
                         absl::StrJoin(seen_, ", "), "]: ", s.status().ToString()));
      }
      if (*s == want) return absl::OkStatus();
    }
  }

 private:
  std::unique_ptr<Health::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader_;
  std::vector<std::string> seen_;
  bool finished_ = false;
};

// The issue's one-liner, with Debian's python3-grpcio: prints the hex of the answer's bytes
// ("0801" is HealthCheckResponse{status: SERVING}). For TLS: the CA, optionally a client
// certificate, and the name the server's certificate must carry.
constexpr char kPythonCheck[] = R"(import sys, grpc
target, ca, cert, key, name = (sys.argv[1:] + [''] * 5)[:5]
if ca:
    creds = grpc.ssl_channel_credentials(
        root_certificates=open(ca, 'rb').read(),
        private_key=open(key, 'rb').read() if key else None,
        certificate_chain=open(cert, 'rb').read() if cert else None)
    options = [('grpc.ssl_target_name_override', name)] if name else []
    channel = grpc.secure_channel(target, creds, options=options)
else:
    channel = grpc.insecure_channel(target)
print('answer', channel.unary_unary('/grpc.health.v1.Health/Check')(b'', timeout=3).hex())
)";

absl::StatusOr<std::string> PythonCheck(const Endpoint& e) {
  const std::string script = absl::StrCat(TmpDir(), "/health_check.py");
  WriteFile(script, kPythonCheck);
  std::string command = absl::StrCat("/usr/bin/python3 ", Quote(script), " ", Quote(e.address));
  if (e.tls) {
    absl::StrAppend(&command, " ", Quote(Cert("ca")), " ",
                    Quote(e.cert.empty() ? "" : Cert(e.cert)), " ",
                    Quote(e.cert.empty() ? "" : Key(e.cert)), " ", Quote(e.server_name));
  }
  const CommandResult r = RunCommand(command);
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("exit ", r.exit_code, ": ", r.output));
  }
  const size_t at = r.output.find("answer ");
  if (at == std::string::npos) return absl::InternalError(r.output);
  std::string hex = r.output.substr(at + 7);
  while (!hex.empty() && (hex.back() == '\n' || hex.back() == ' ')) hex.pop_back();
  return hex;
}

// Runs tools/dev_certs.sh into CertDir() (once per process).
absl::Status MakeCerts() {
  static absl::Status* made = nullptr;
  if (made != nullptr) return *made;
  const absl::Status result = MakeDevCerts({"w0", "w1"});
  made = new absl::Status(result);
  return result;
}

// ---- Every way in, in every configuration --------------------------------------------------

struct Config {
  std::string label;
  bool metrics = false;  // --http-listen on both daemons.
  bool tls = false;      // Both daemons serve TLS (dev_certs.sh).
  bool tokens = false;   // The coordinator requires bearer tokens; the worker has its token.
  bool require_client_certs = false;  // The coordinator's --tls-client-auth=require.
};

std::string ConfigName(const ::testing::TestParamInfo<Config>& info) { return info.param.label; }

class HealthEverywhereTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    const Config& c = GetParam();
    if (c.tls) ASSERT_TRUE(MakeCerts().ok()) << MakeCerts();
    std::vector<std::string> cflags = {"--health-listen=127.0.0.1:0"};
    std::vector<std::string> wflags = {"--health-listen=127.0.0.1:0"};
    if (c.metrics) {
      cflags.push_back("--http-listen=127.0.0.1:0");
      wflags.push_back("--http-listen=127.0.0.1:0");
    }
    if (c.tls) {
      cflags.insert(cflags.end(), {absl::StrCat("--tls-cert=", Cert("coordinator")),
                                   absl::StrCat("--tls-key=", Key("coordinator")),
                                   absl::StrCat("--tls-ca=", Cert("ca"))});
      wflags.insert(wflags.end(),
                    {absl::StrCat("--tls-cert=", Cert("w0")), absl::StrCat("--tls-key=", Key("w0")),
                     absl::StrCat("--tls-ca=", Cert("ca"))});
      if (c.require_client_certs) cflags.push_back("--tls-client-auth=require");
    }
    if (c.tokens) {
      const std::string tokens = absl::StrCat(TmpDir(), "/", c.label, ".tokens");
      WriteFile(tokens, absl::StrCat("admin alice ", Sha256Hex(kAdminToken), "\nworker workers ",
                                     Sha256Hex(kWorkerToken), "\n"));
      const std::string worker_token = absl::StrCat(TmpDir(), "/", c.label, ".worker-token");
      WriteFile(worker_token, absl::StrCat(kWorkerToken, "\n"));
      cflags.push_back(absl::StrCat("--auth-tokens=", tokens));
      wflags.push_back(absl::StrCat("--token-file=", worker_token));
    }
    absl::StatusOr<Daemon> coordinator =
        StartCoordinator(absl::StrCat("coordinator-", c.label), cflags);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    absl::StatusOr<Daemon> worker = StartWorker("w0", coordinator_.address, wflags);
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    ASSERT_FALSE(coordinator_.health.empty());
    ASSERT_FALSE(worker_.health.empty());

    const std::string client_cert = c.require_client_certs ? "client" : "";
    endpoints_ = {
        {"coordinator main port", coordinator_.address, c.tls, client_cert, ""},
        {"coordinator --health-listen", coordinator_.health},
        {"worker main port", worker_.address, c.tls, "", "w0"},
        {"worker --health-listen", worker_.health},
    };
  }

  // A client of the coordinator as an admin (or plaintext without tokens).
  std::unique_ptr<CoordinatorClient> Client(bool with_token = true) {
    CoordinatorClientOptions options;
    if (GetParam().tokens && with_token) options.token = kAdminToken;
    options.retry_for = absl::ZeroDuration();
    if (GetParam().tls) {
      TlsFlags flags;
      flags.ca = Cert("ca");
      flags.cert = Cert("client");
      flags.key = Key("client");
      absl::StatusOr<TlsOptions> tls = LoadClientTls(flags);
      EXPECT_TRUE(tls.ok()) << tls.status();
      if (tls.ok()) options.tls = *tls;
    }
    return std::make_unique<CoordinatorClient>(coordinator_.address, options);
  }

  Daemon coordinator_;
  Daemon worker_;
  std::vector<Endpoint> endpoints_;
};

TEST_P(HealthEverywhereTest, CheckAndWatchAnswerOnEveryPortAndBothDaemonsStayUp) {
  for (const Endpoint& e : endpoints_) {
    SCOPED_TRACE(e.label);
    std::shared_ptr<grpc::Channel> channel = Channel(e);
    // Registered and not draining: ready; alive.
    EXPECT_EQ(ServingName(Check(channel, "")), "SERVING");
    EXPECT_EQ(ServingName(Check(channel, kLivenessService)), "SERVING");
    EXPECT_EQ(Check(channel, "shardcoord.v1.NoSuchService").status().code(),
              absl::StatusCode::kNotFound);
    // The first message of a Watch is the current status.
    Watch ready(channel, "");
    EXPECT_EQ(ServingName(ready.Next()), "SERVING");
    Watch live(channel, kLivenessService);
    EXPECT_EQ(ServingName(live.Next()), "SERVING");
  }
  EXPECT_TRUE(StillRunning(coordinator_)) << "the coordinator died of a health call";
  EXPECT_TRUE(StillRunning(worker_)) << "the worker died of a health call";
  // With --auth-tokens every shardcoord call needs a token, which none of the health calls
  // above had (kubelet, Envoy and load balancers send none).
  if (GetParam().tokens) {
    EXPECT_EQ(Client(/*with_token=*/false)->ListWorkers().status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  EXPECT_TRUE(Client()->ListWorkers().ok());
}

TEST_P(HealthEverywhereTest, RawBytesThroughAGenericStub) {
  HealthCheckRequest liveness;
  liveness.set_service(kLivenessService);
  for (const Endpoint& e : endpoints_) {
    SCOPED_TRACE(e.label);
    std::shared_ptr<grpc::Channel> channel = Channel(e);
    // Zero bytes: HealthCheckRequest{} (service ""), as grpcio's unary_unary(...)(b'') sends.
    EXPECT_EQ(ServingName(RawCheck(channel, "")), "SERVING");
    EXPECT_EQ(ServingName(RawCheck(channel, liveness.SerializeAsString())), "SERVING");
    // Not a HealthCheckRequest at all (field 1 declares 100 bytes, none follow).
    EXPECT_EQ(RawCheck(channel, std::string("\x0a\x64", 2)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(StillRunning(coordinator_)) << "the coordinator died of a health call";
  EXPECT_TRUE(StillRunning(worker_)) << "the worker died of a health call";
  // And still does its work.
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = Client()->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].state(), v1::ALIVE);
}

TEST_P(HealthEverywhereTest, PythonGrpcioOneLiner) {
  for (const Endpoint& e : endpoints_) {
    SCOPED_TRACE(e.label);
    absl::StatusOr<std::string> answer = PythonCheck(e);
    ASSERT_TRUE(answer.ok()) << answer.status()
                             << " (Debian's python3-grpcio: bash tools/setup.sh installs it)";
    EXPECT_EQ(*answer, "0801") << "HealthCheckResponse{status: SERVING} is 08 01";
  }
  EXPECT_TRUE(StillRunning(coordinator_)) << "the coordinator died of a health call";
  EXPECT_TRUE(StillRunning(worker_)) << "the worker died of a health call";
}

INSTANTIATE_TEST_SUITE_P(
    Configs, HealthEverywhereTest,
    ::testing::Values(Config{"plaintext_metrics_on", /*metrics=*/true},
                      Config{"plaintext_metrics_off", /*metrics=*/false},
                      Config{"tls_metrics_on", /*metrics=*/true, /*tls=*/true},
                      Config{"tokens_metrics_on", /*metrics=*/true, /*tls=*/false,
                             /*tokens=*/true},
                      Config{"tls_tokens_client_certs_metrics_off", /*metrics=*/false,
                             /*tls=*/true, /*tokens=*/true, /*require_client_certs=*/true}),
    ConfigName);

// ---- Readiness transitions -----------------------------------------------------------------

// A worker started before its coordinator is alive but not ready on both its ports; it turns
// ready when it registers. SIGTERM with a plan running turns it NOT_SERVING while liveness
// stays SERVING and the coordinator lists it as leaving; the plan ends, it leaves, exits 0.
TEST(ReadinessTest, WorkerBeforeItsCoordinatorThenDrainingWithAPlanRunning) {
  absl::StatusOr<int> coordinator_port = PickFreePort();
  absl::StatusOr<int> main_port = PickFreePort();
  absl::StatusOr<int> health_port = PickFreePort();
  ASSERT_TRUE(coordinator_port.ok() && main_port.ok() && health_port.ok());
  const std::string coordinator_address = absl::StrCat("127.0.0.1:", *coordinator_port);
  absl::StatusOr<Daemon> w0 = StartWorker("w0", coordinator_address,
                                          {absl::StrCat("--listen=127.0.0.1:", *main_port),
                                           absl::StrCat("--health-listen=127.0.0.1:", *health_port),
                                           "--register-timeout=300s", kLongDrain},
                                          /*wait=*/false);
  ASSERT_TRUE(w0.ok()) << w0.status();
  const std::vector<Endpoint> ports = {
      {"worker main port", absl::StrCat("127.0.0.1:", *main_port)},
      {"worker --health-listen", absl::StrCat("127.0.0.1:", *health_port)},
  };
  std::vector<std::unique_ptr<Watch>> ready;
  for (const Endpoint& e : ports) {
    SCOPED_TRACE(e.label);
    std::shared_ptr<grpc::Channel> channel = Channel(e);
    // Serving as soon as the port accepts connections, unregistered: alive, not ready.
    EXPECT_EQ(ServingName(Check(channel, "", /*wait_for_ready=*/true)), "NOT_SERVING");
    EXPECT_EQ(ServingName(Check(channel, kLivenessService)), "SERVING");
    ready.push_back(std::make_unique<Watch>(channel, ""));
    EXPECT_EQ(ServingName(ready.back()->Next()), "NOT_SERVING");
  }
  EXPECT_TRUE(w0->process->Lines().empty()) << "registered without a coordinator";

  absl::StatusOr<Daemon> coordinator =
      StartCoordinator("coordinator-readiness", {absl::StrCat("--listen=", coordinator_address),
                                                 "--health-listen=127.0.0.1:0", kLongHeartbeat});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(ports[i].label);
    absl::Status now_ready = ready[i]->Await(kServing);
    EXPECT_TRUE(now_ready.ok()) << now_ready;
  }
  ASSERT_TRUE(w0->process->WaitForLine("worker w0 listening on ", kStartTimeout).ok());
  absl::StatusOr<Daemon> w1 = StartWorker("w1", coordinator_address, {});
  ASSERT_TRUE(w1.ok()) << w1.status();

  CoordinatorClient client(coordinator_address);
  ASSERT_TRUE(MakeMesh(client, "pair", {2}, {"w0", "w1"}).ok());
  const Shape shape = {64, 32};
  ASSERT_TRUE(CreateFilled(client, "t", shape, DType::kF32, "pair", "S(0)").ok());
  Watch live(Channel(ports[1]), kLivenessService);
  ASSERT_EQ(ServingName(live.Next()), "SERVING");

  // The plan cannot end while w1 is stopped: w0's drain waits for it.
  ASSERT_TRUE(w1->process->Signal(SIGSTOP).ok());
  absl::StatusOr<v1::RedistributeResponse> started =
      client.Redistribute(RedistributeTo("t", "", "S(1)", false, /*wait=*/false));
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(w0->process->Signal(SIGTERM).ok());
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(ports[i].label);
    absl::Status not_ready = ready[i]->Await(kNotServing);
    EXPECT_TRUE(not_ready.ok()) << not_ready;
  }
  ASSERT_TRUE(AwaitWorker(
                  client, "w0", [](const v1::WorkerInfo& w) { return w.leaving(); }, "leaving")
                  .ok());
  // Still draining (the plan holds it): alive on both ports, and listed as LEAVING.
  for (const Endpoint& e : ports) {
    SCOPED_TRACE(e.label);
    EXPECT_EQ(ServingName(Check(Channel(e), kLivenessService)), "SERVING");
    EXPECT_EQ(ServingName(Check(Channel(e), "")), "NOT_SERVING");
  }
  absl::StatusOr<std::string> shardctl = RunfilePath("client/shardctl");
  ASSERT_TRUE(shardctl.ok()) << shardctl.status();
  const CommandResult listed = RunCommand(
      absl::StrCat(Quote(*shardctl), " --coordinator ", coordinator_address, " workers"));
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("LEAVING")) << listed.output;
  // A worker leaving does not make its coordinator unready.
  EXPECT_EQ(ServingName(Check(Channel({"", coordinator->address}), "")), "SERVING");
  EXPECT_TRUE(StillRunning(*w0));

  ASSERT_TRUE(w1->process->Signal(SIGCONT).ok());
  absl::StatusOr<v1::PlanProgress> end = client.WatchPlan(started->progress().plan_id(), nullptr);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::COMMITTED) << end->error();
  absl::StatusOr<int> status = w0->process->Wait(kWaitTimeout);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << Process::DescribeWaitStatus(*status);
  EXPECT_THAT(ReadFile(w0->log), HasSubstr("left the cluster"));
  EXPECT_TRUE(
      AwaitWorker(
          client, "w0", [](const v1::WorkerInfo& w) { return w.state() == v1::DEAD; }, "DEAD")
          .ok());
}

// A coordinator on SIGTERM with a plan running: readiness NOT_SERVING on both ports while
// liveness stays SERVING, new plans UNAVAILABLE; the plan ends, it exits 0.
TEST(ReadinessTest, CoordinatorDrainingAPlanIsAliveButNotReady) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator(
      "coordinator-drain", {"--health-listen=127.0.0.1:0", kLongHeartbeat, kLongDrain});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> w0 = StartWorker("w0", coordinator->address, {});
  ASSERT_TRUE(w0.ok()) << w0.status();
  absl::StatusOr<Daemon> w1 = StartWorker("w1", coordinator->address, {});
  ASSERT_TRUE(w1.ok()) << w1.status();
  CoordinatorClientOptions once;
  once.retry_for = absl::ZeroDuration();
  CoordinatorClient client(coordinator->address, once);
  ASSERT_TRUE(MakeMesh(client, "pair", {2}, {"w0", "w1"}).ok());
  ASSERT_TRUE(CreateFilled(client, "t", {64, 32}, DType::kF32, "pair", "S(0)").ok());
  ASSERT_TRUE(CreateFilled(client, "u", {64, 32}, DType::kF32, "pair", "S(0)").ok());

  const std::vector<Endpoint> ports = {{"coordinator main port", coordinator->address},
                                       {"coordinator --health-listen", coordinator->health}};
  std::vector<std::unique_ptr<Watch>> ready;
  for (const Endpoint& e : ports) {
    ready.push_back(std::make_unique<Watch>(Channel(e), ""));
    EXPECT_EQ(ServingName(ready.back()->Next()), "SERVING") << e.label;
  }
  ASSERT_TRUE(w1->process->Signal(SIGSTOP).ok());
  absl::StatusOr<v1::RedistributeResponse> started =
      client.Redistribute(RedistributeTo("t", "", "S(1)", false, /*wait=*/false));
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(coordinator->process->Signal(SIGTERM).ok());
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(ports[i].label);
    absl::Status not_ready = ready[i]->Await(kNotServing);
    EXPECT_TRUE(not_ready.ok()) << not_ready;
    EXPECT_EQ(ServingName(Check(Channel(ports[i]), kLivenessService)), "SERVING");
  }
  absl::Status refused = client.Redistribute(RedistributeTo("u", "", "S(1)")).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(StillRunning(*coordinator));

  ASSERT_TRUE(w1->process->Signal(SIGCONT).ok());
  absl::StatusOr<int> status = coordinator->process->Wait(kWaitTimeout);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << Process::DescribeWaitStatus(*status);
}

// ---- Signals -------------------------------------------------------------------------------

class SignalTest : public ::testing::TestWithParam<int> {};

// Both daemons exit 0 on SIGTERM and on SIGINT. A worker on SIGTERM leaves first (the
// coordinator lists it DEAD at once, "left the cluster"); on SIGINT it stops at once and
// tells nobody.
TEST_P(SignalTest, BothDaemonsExitZero) {
  const int sig = GetParam();
  absl::StatusOr<Daemon> coordinator =
      StartCoordinator(absl::StrCat("coordinator-signal-", sig), {kLongHeartbeat});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> w0 = StartWorker("w0", coordinator->address, {});
  ASSERT_TRUE(w0.ok()) << w0.status();
  CoordinatorClient client(coordinator->address);

  absl::Status stopped = SignalAndExpectExitZero(*w0, sig);
  EXPECT_TRUE(stopped.ok()) << stopped;
  const std::string log = ReadFile(w0->log);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  if (sig == SIGTERM) {
    EXPECT_THAT(log, HasSubstr("left the cluster"));
    EXPECT_EQ((*workers)[0].state(), v1::DEAD) << "a worker that left is dead at once";
  } else {
    EXPECT_THAT(log, Not(HasSubstr("left the cluster")));
    // It never said goodbye: alive until its heartbeats are missed (300 s here).
    EXPECT_EQ((*workers)[0].state(), v1::ALIVE);
    EXPECT_FALSE((*workers)[0].leaving());
  }

  stopped = SignalAndExpectExitZero(*coordinator, sig);
  EXPECT_TRUE(stopped.ok()) << stopped;
  EXPECT_THAT(ReadFile(coordinator->log), HasSubstr("stopped"));
}

INSTANTIATE_TEST_SUITE_P(Signals, SignalTest, ::testing::Values(SIGTERM, SIGINT),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGTERM ? "SIGTERM" : "SIGINT");
                         });

}  // namespace
}  // namespace shardcoord
