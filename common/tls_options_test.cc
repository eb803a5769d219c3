#include "common/tls_options.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

constexpr char kCert[] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
constexpr char kKey[] = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

TlsFlags AllFlags() {
  TlsFlags f;
  f.cert = WriteFile("cert.pem", kCert);
  f.key = WriteFile("key.pem", kKey);
  f.ca = WriteFile("ca.pem", kCert);
  return f;
}

// LoadDaemonTls(f) fails with `code`, and its message holds `message`.
void ExpectDaemonRefuses(const TlsFlags& f, absl::StatusCode code, const std::string& message) {
  absl::StatusOr<TlsOptions> tls = LoadDaemonTls(f);
  EXPECT_EQ(tls.status().code(), code);
  EXPECT_THAT(tls.status().message(), HasSubstr(message));
}

TEST(TlsClientAuthTest, ParsesTheThreeModes) {
  EXPECT_EQ(*ParseTlsClientAuth("none"), TlsClientAuth::kNone);
  EXPECT_EQ(*ParseTlsClientAuth("request"), TlsClientAuth::kRequest);
  EXPECT_EQ(*ParseTlsClientAuth("require"), TlsClientAuth::kRequire);
  absl::StatusOr<TlsClientAuth> bad = ParseTlsClientAuth("always");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("--tls-client-auth: 'always'"));
  EXPECT_EQ(TlsClientAuthName(TlsClientAuth::kRequire), "require");
}

// Both loaders: no flags at all is plaintext.
TEST(LoadTlsTest, NoFlagsIsPlaintext) {
  for (auto* load : {&LoadDaemonTls, &LoadClientTls}) {
    absl::StatusOr<TlsOptions> tls = load(TlsFlags{});
    ASSERT_TRUE(tls.ok()) << tls.status();
    EXPECT_FALSE(tls->enabled());
  }
}

TEST(LoadDaemonTlsTest, ReadsAllThreeFiles) {
  TlsFlags f = AllFlags();
  f.client_auth = "require";
  absl::StatusOr<TlsOptions> tls = LoadDaemonTls(f);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->enabled());
  EXPECT_TRUE(tls->has_certificate());
  EXPECT_EQ(tls->cert_pem, kCert);
  EXPECT_EQ(tls->key_pem, kKey);
  EXPECT_EQ(tls->ca_pem, kCert);
  EXPECT_EQ(tls->client_auth, TlsClientAuth::kRequire);
}

TEST(LoadDaemonTlsTest, PartialFlagsNameWhatIsMissing) {
  TlsFlags f = AllFlags();
  f.key.clear();
  f.ca.clear();
  ExpectDaemonRefuses(f, absl::StatusCode::kInvalidArgument, "missing --tls-key, --tls-ca");
}

TEST(LoadDaemonTlsTest, ClientAuthNeedsTls) {
  TlsFlags f;
  f.client_auth = "request";
  ExpectDaemonRefuses(f, absl::StatusCode::kInvalidArgument,
                      "--tls-client-auth=request needs --tls-cert");
}

TEST(LoadDaemonTlsTest, BadModeIsRefused) {
  TlsFlags f = AllFlags();
  f.client_auth = "maybe";
  EXPECT_EQ(LoadDaemonTls(f).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadDaemonTlsTest, MissingFileNamesFlagAndPath) {
  TlsFlags f = AllFlags();
  f.ca = "/nonexistent/ca.pem";
  ExpectDaemonRefuses(f, absl::StatusCode::kNotFound, "--tls-ca: cannot read /nonexistent/ca.pem");
}

TEST(LoadDaemonTlsTest, NonPemFileNamesFlagAndPath) {
  TlsFlags f = AllFlags();
  f.key = WriteFile("not-a-key.pem", kCert);  // A certificate where the key should be.
  ExpectDaemonRefuses(f, absl::StatusCode::kInvalidArgument,
                      "--tls-key: " + f.key + " is not a PEM file holding a PRIVATE KEY");
}

TEST(LoadClientTlsTest, CaAloneIsServerVerificationOnly) {
  TlsFlags f = AllFlags();
  f.cert.clear();
  f.key.clear();
  absl::StatusOr<TlsOptions> tls = LoadClientTls(f);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->enabled());
  EXPECT_FALSE(tls->has_certificate());
}

TEST(LoadClientTlsTest, ClientCertificate) {
  absl::StatusOr<TlsOptions> tls = LoadClientTls(AllFlags());
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->has_certificate());
}

TEST(LoadClientTlsTest, CertWithoutKeyOrCaIsRefused) {
  TlsFlags f = AllFlags();
  f.key.clear();
  EXPECT_THAT(LoadClientTls(f).status().message(), HasSubstr("missing --tls-key"));
  f = AllFlags();
  f.ca.clear();
  EXPECT_THAT(LoadClientTls(f).status().message(), HasSubstr("need --tls-ca"));
}

TEST(LoopbackTest, RecognisesLoopbackHosts) {
  EXPECT_TRUE(IsLoopbackListenAddress("127.0.0.1:7400"));
  EXPECT_TRUE(IsLoopbackListenAddress("127.1.2.3:0"));
  EXPECT_TRUE(IsLoopbackListenAddress("localhost:7400"));
  EXPECT_TRUE(IsLoopbackListenAddress("[::1]:7400"));
  EXPECT_FALSE(IsLoopbackListenAddress("0.0.0.0:7400"));
  EXPECT_FALSE(IsLoopbackListenAddress("[::]:7400"));
  EXPECT_FALSE(IsLoopbackListenAddress("10.0.0.5:7400"));
  EXPECT_FALSE(IsLoopbackListenAddress("myhost:7400"));
  EXPECT_FALSE(IsLoopbackListenAddress("127.0.0.1.evil.com:7400"));
}

TEST(LoopbackTest, PlaintextOffLoopbackNeedsInsecure) {
  EXPECT_TRUE(CheckPlaintextListen("listen", "127.0.0.1:0", false, false).ok());
  EXPECT_TRUE(CheckPlaintextListen("listen", "0.0.0.0:7400", true, false).ok());
  EXPECT_TRUE(CheckPlaintextListen("listen", "0.0.0.0:7400", false, true).ok());
  absl::Status s = CheckPlaintextListen("listen", "0.0.0.0:7400", false, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--listen=0.0.0.0:7400 is not a loopback address"));
  EXPECT_THAT(s.message(), HasSubstr("--insecure"));
}

TEST(CheckCallerIsCoordinatorTest, TheCallerMustBeACoordinatorTheWorkerDials) {
  EXPECT_EQ(CoordinatorHosts("c0:7400, c1.example:7400,[::1]:7400,c0:7401"),
            (std::vector<std::string>{"c0", "c1.example", "::1"}));
  EXPECT_EQ(CoordinatorHosts("127.0.0.1:7400"), std::vector<std::string>{"127.0.0.1"});
  EXPECT_EQ(CoordinatorHosts("dns:///c0.example:7400,dns:c1:7400,ipv4:10.0.0.1:7400,"
                             "ipv6:[::1]:7400,dns://8.8.8.8/c2:7400,unix:/run/c.sock"),
            (std::vector<std::string>{"c0.example", "c1", "10.0.0.1", "::1", "c2"}));
  const std::vector<std::string> hosts = {"c0", "127.0.0.1"};
  EXPECT_TRUE(CheckCallerIsCoordinator(hosts, {"coordinator", "localhost", "127.0.0.1"}).ok());
  EXPECT_TRUE(CheckCallerIsCoordinator(hosts, {"c0"}).ok());
  absl::Status s = CheckCallerIsCoordinator(hosts, {"client"});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "only the coordinator may call a worker: the caller's TLS certificate (names: "
            "client) names none of the worker's --coordinator hosts (c0, 127.0.0.1)");
  EXPECT_THAT(CheckCallerIsCoordinator(hosts, {}).message(), HasSubstr("(names: none)"));
}

TEST(CheckPeerNameTest, NameMustBeOneOfTheCertificateNames) {
  EXPECT_TRUE(CheckPeerName("w1", {"w1", "w1"}).ok());
  absl::Status s = CheckPeerName("w1", {"w2"});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("'w1'"));
  EXPECT_THAT(s.message(), HasSubstr("names: w2"));
  EXPECT_THAT(CheckPeerName("w1", {}).message(), HasSubstr("names: none"));
}

}  // namespace
}  // namespace shardcoord
