// TLS through real daemons: certificates from tools/dev_certs.sh (run into TEST_TMPDIR), a
// coordinator with --tls-client-auth=require and bearer tokens, and two workers that present
// certificates naming them. A tensor is created, redistributed and downloaded over TLS; a
// plaintext client, a client without a certificate and a client trusting another CA cannot
// connect; workers without a certificate, with one from another CA or with one for another
// name are refused and never listed; bad TLS flags and plaintext off loopback stop startup.

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/tls_options.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/grpc_credentials.h"
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

const Shape kShape = {8, 4};
constexpr char kAdminToken[] = "tls-test-admin-token";
constexpr char kWorkerToken[] = "tls-test-worker-token";

// Client options trusting `ca` (a file name in CertDir, "" for plaintext) and presenting the
// certificate `cert` ("" for none).
absl::StatusOr<CoordinatorClientOptions> ClientTls(const std::string& ca, const std::string& cert) {
  TlsFlags flags;
  if (!ca.empty()) flags.ca = Cert(ca);
  if (!cert.empty()) {
    flags.cert = Cert(cert);
    flags.key = Key(cert);
  }
  absl::StatusOr<TlsOptions> tls = LoadClientTls(flags);
  if (!tls.ok()) return tls.status();
  CoordinatorClientOptions options;
  options.token = kAdminToken;
  options.tls = *std::move(tls);
  return options;
}

TEST(TlsClusterTest, CreateRedistributeDownloadOverTls) {
  Cluster* cluster = ClusterEnvironment::Get();
  ASSERT_NE(cluster, nullptr);
  CoordinatorClient& client = cluster->client();
  ASSERT_TRUE(MakeMesh(client, "m", {2}, cluster->WorkerNames()).ok());
  absl::StatusOr<v1::TensorInfo> t = CreateFilled(client, "t", kShape, DType::kF32, "m", "S(0)");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(DownloadAndCheck(client, "t", DType::kF32, kShape, FillKind::kArange).ok());
  absl::StatusOr<v1::RedistributeResponse> r = client.Redistribute(RedistributeTo("t", "", "S(1)"));
  ASSERT_TRUE(r.ok()) << r.status();
  absl::Status values = DownloadAndCheck(client, "t", DType::kF32, kShape, FillKind::kArange);
  EXPECT_TRUE(values.ok()) << values;
}

// Every client below fails the handshake (or sends plaintext to a TLS port): UNAVAILABLE.
TEST(TlsClusterTest, ClientsWithoutTheRightTlsCannotConnect) {
  Cluster* cluster = ClusterEnvironment::Get();
  ASSERT_NE(cluster, nullptr);
  struct Case {
    std::string label, ca, cert;
  };
  const std::vector<Case> cases = {
      {"plaintext", "", ""},
      {"no client certificate", "ca", ""},
      {"certificate from another CA", "ca", "other"},
      {"trusts another CA", "other-ca", "client"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    absl::StatusOr<CoordinatorClientOptions> options = ClientTls(c.ca, c.cert);
    ASSERT_TRUE(options.ok()) << options.status();
    options->retry_for = absl::ZeroDuration();  // A refused handshake stays refused.
    CoordinatorClient client(cluster->coordinator_address(), *options);
    EXPECT_EQ(client.ListWorkers().status().code(), absl::StatusCode::kUnavailable);
  }
  // The client certificate with the right CA works.
  absl::StatusOr<CoordinatorClientOptions> options = ClientTls("ca", "client");
  ASSERT_TRUE(options.ok()) << options.status();
  CoordinatorClient client(cluster->coordinator_address(), *options);
  EXPECT_TRUE(client.ListWorkers().ok());
}

// A worker with no certificate, one from another CA, or one for another name cannot
// register; the coordinator never lists it.
TEST(TlsClusterTest, WorkersWithoutTheirCertificateAreRefused) {
  Cluster* cluster = ClusterEnvironment::Get();
  ASSERT_NE(cluster, nullptr);
  const std::string token_file = absl::StrCat(TmpDir(), "/worker.token");
  struct Case {
    std::string label;
    std::string cert;  // Empty: plaintext.
    std::string code;  // In the worker's log.
  };
  const std::vector<Case> cases = {
      // Handshake failures are retried until --register-timeout, then the worker exits.
      {"none", "", "UNAVAILABLE"},
      {"other_ca", "other", "UNAVAILABLE"},
      // A valid certificate for w1: refused at once, naming both names.
      {"w1s_cert", "w1", "PERMISSION_DENIED"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    // dev_certs.sh made "rogue" the first name: other.pem (from the other CA) names it.
    const std::string name = c.label == "other_ca" ? "rogue" : absl::StrCat("rogue_", c.label);
    std::vector<std::string> flags = {"--register-timeout=3s",
                                      absl::StrCat("--token-file=", token_file)};
    if (!c.cert.empty()) {
      flags.push_back(absl::StrCat("--tls-cert=", Cert(c.cert)));
      flags.push_back(absl::StrCat("--tls-key=", Key(c.cert)));
      flags.push_back(absl::StrCat("--tls-ca=", Cert("ca")));
    }
    absl::StatusOr<Exited> worker = RunWorkerToExit(name, cluster->coordinator_address(), flags);
    ASSERT_TRUE(worker.ok()) << worker.status();
    EXPECT_TRUE(WIFEXITED(worker->wait_status) && WEXITSTATUS(worker->wait_status) != 0)
        << Process::DescribeWaitStatus(worker->wait_status);
    const std::string& log = worker->log;
    EXPECT_THAT(log, HasSubstr(c.code));
    if (c.code == "PERMISSION_DENIED") {
      EXPECT_THAT(log, HasSubstr(absl::StrCat("worker name '", name,
                                              "' does not match its TLS certificate (names: w1)")));
    }
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = cluster->client().ListWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    for (const v1::WorkerInfo& w : *workers) EXPECT_NE(w.name(), name);
  }
}

// A worker serves the coordinator alone: a call with a client's certificate (signed by the
// cluster CA, so the handshake succeeds) is refused before any handler runs; the same call
// with the coordinator's certificate is served.
TEST(TlsClusterTest, OnlyTheCoordinatorMayCallAWorker) {
  Cluster* cluster = ClusterEnvironment::Get();
  ASSERT_NE(cluster, nullptr);
  const v1::WorkerInfo& worker = cluster->worker_info(0);
  auto drop = [&](const std::string& cert) {
    TlsFlags flags;
    flags.ca = Cert("ca");
    flags.cert = Cert(cert);
    flags.key = Key(cert);
    absl::StatusOr<TlsOptions> tls = LoadClientTls(flags);
    EXPECT_TRUE(tls.ok()) << tls.status();
    grpc::ChannelArguments args;
    ExpectServerName(*tls, worker.name(), &args);
    std::unique_ptr<v1::Worker::Stub> stub = v1::Worker::NewStub(
        grpc::CreateCustomChannel(worker.address(), MakeChannelCredentials(*tls), args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::DropTensorRequest req;
    req.set_tensor("no_such_tensor");
    req.set_version(1);
    v1::DropTensorResponse resp;
    return stub->DropTensor(&ctx, req, &resp);
  };
  const grpc::Status refused = drop("client");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("only the coordinator may call a worker: the caller's TLS certificate "
                        "(names: client) names none of the worker's --coordinator hosts"));
  const grpc::Status served = drop("coordinator");
  EXPECT_TRUE(served.ok()) << served.error_message();
}

// Startup stops with status 2 and a message naming the flag: a missing TLS file, part of the
// TLS flags, plaintext on a non-loopback address without --insecure.
TEST(TlsStartupTest, BadFlagsStopTheCoordinator) {
  absl::StatusOr<std::string> coordinator_bin = RunfilePath("coordinator/coordinator");
  ASSERT_TRUE(coordinator_bin.ok()) << coordinator_bin.status();
  struct Case {
    std::string label;
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"missing_file",
       {"--listen=127.0.0.1:0", "--tls-cert=/nonexistent.pem",
        absl::StrCat("--tls-key=", Key("coordinator")), absl::StrCat("--tls-ca=", Cert("ca"))},
       "--tls-cert: cannot read /nonexistent.pem"},
      {"partial",
       {"--listen=127.0.0.1:0", absl::StrCat("--tls-cert=", Cert("coordinator"))},
       "missing --tls-key, --tls-ca"},
      {"bad_mode", {"--listen=127.0.0.1:0", "--tls-client-auth=always"}, "--tls-client-auth"},
      {"plaintext_off_loopback", {"--listen=0.0.0.0:0"}, "--insecure"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    std::vector<std::string> argv = {*coordinator_bin};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    absl::StatusOr<Exited> coordinator = RunToExit(c.label, argv);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    EXPECT_TRUE(WIFEXITED(coordinator->wait_status) && WEXITSTATUS(coordinator->wait_status) == 2)
        << Process::DescribeWaitStatus(coordinator->wait_status);
    EXPECT_THAT(coordinator->log, HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  using shardcoord::Cert;
  using shardcoord::Key;
  ::testing::InitGoogleTest(&argc, argv);
  if (absl::Status s = shardcoord::MakeDevCerts({"rogue", "w0", "w1"}); !s.ok()) {
    std::cerr << "cannot make certificates: " << s << "\n";
    return 1;
  }
  const std::string dir = shardcoord::TmpDir();
  const std::string tokens = absl::StrCat(dir, "/tokens");
  shardcoord::WriteFile(
      tokens,
      absl::StrCat("admin alice ", shardcoord::Sha256Hex(shardcoord::kAdminToken),
                   "\nworker workers ", shardcoord::Sha256Hex(shardcoord::kWorkerToken), "\n"));
  const std::string worker_token = absl::StrCat(dir, "/worker.token");
  shardcoord::WriteFile(worker_token, absl::StrCat(shardcoord::kWorkerToken, "\n"));
  shardcoord::ClusterOptions options;
  options.num_workers = 2;
  options.coordinator_flags = {absl::StrCat("--tls-cert=", Cert("coordinator")),
                               absl::StrCat("--tls-key=", Key("coordinator")),
                               absl::StrCat("--tls-ca=", Cert("ca")), "--tls-client-auth=require",
                               absl::StrCat("--auth-tokens=", tokens)};
  options.worker_flags = {absl::StrCat("--tls-cert=", Cert("{name}")),
                          absl::StrCat("--tls-key=", Key("{name}")),
                          absl::StrCat("--tls-ca=", Cert("ca")), "--tls-client-auth=require",
                          absl::StrCat("--token-file=", worker_token)};
  absl::StatusOr<shardcoord::CoordinatorClientOptions> client =
      shardcoord::ClientTls("ca", "client");
  if (!client.ok()) {
    std::cerr << client.status() << "\n";
    return 1;
  }
  options.client_options = *std::move(client);
  options.log_dir = dir;
  ::testing::AddGlobalTestEnvironment(new shardcoord::ClusterEnvironment(options));
  return RUN_ALL_TESTS();
}
