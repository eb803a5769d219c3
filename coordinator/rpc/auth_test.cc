#include "coordinator/rpc/auth.h"

#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

std::string Line(absl::string_view role, absl::string_view name, absl::string_view token) {
  return absl::StrCat(role, " ", name, " ", Sha256Hex(token), "\n");
}

Authenticator FourRoles() {
  absl::StatusOr<Authenticator> a = Authenticator::Parse(
      absl::StrCat("# tokens\n\n", Line("admin", "alice", "tok-admin"),
                   Line("operator", "olga", "tok-operator"), "  # indented comment\n",
                   Line("reader", "rick", "tok-reader"), Line("worker", "workers", "tok-worker")),
      "tokens.txt");
  EXPECT_TRUE(a.ok()) << a.status();
  return *std::move(a);
}

TEST(BearerTokenTest, Parses) {
  EXPECT_EQ(*BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(*BearerToken("bearer  abc "), "abc");
  EXPECT_EQ(BearerToken("").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(BearerToken("Basic abc").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(BearerToken("Bearer ").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(BearerToken("Bearer    ").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(AuthenticatorTest, ParsesCommentsAndBlankLines) {
  Authenticator a = FourRoles();
  EXPECT_EQ(a.size(), 4);
  // Uppercase hex and a trailing comment are accepted.
  absl::StatusOr<Authenticator> b = Authenticator::Parse(
      absl::StrCat("reader r ", absl::AsciiStrToUpper(Sha256Hex("t")), "  # ci\n"), "f");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->Authorize("/shardcoord.v1.Coordinator/ListTensors", "t").ok());
}

TEST(AuthenticatorTest, BadLinesNameFileAndLine) {
  const std::string good = Line("admin", "a", "x");
  struct Case {
    std::string contents;
    std::string message;
  } cases[] = {
      {good + "admin b\n", "f.txt:2: expected 'ROLE NAME SHA256HEX', got 2 fields"},
      {good + "\nroot b " + Sha256Hex("y") + "\n", "f.txt:3: unknown role 'root'"},
      {"reader r abc\n", "f.txt:1: the third field must be"},
      {"reader r " + std::string(64, 'g') + "\n", "f.txt:1: the third field must be"},
      {good + "reader a " + Sha256Hex("y") + "\n", "f.txt:2: name 'a' given twice"},
      {good + "reader b " + Sha256Hex("x") + "\n", "f.txt:2: this token hash is given twice"},
      {"reader r " + Sha256Hex("y") + " extra\n", "f.txt:1: expected"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Authenticator> a = Authenticator::Parse(c.contents, "f.txt");
    ASSERT_FALSE(a.ok()) << c.contents;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(a.status().message(), HasSubstr(c.message));
  }
}

TEST(AuthenticatorTest, LoadMissingFile) {
  EXPECT_EQ(Authenticator::Load("/nonexistent/tokens").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(AuthenticatorTest, UnknownOrMissingTokenIsUnauthenticated) {
  Authenticator a = FourRoles();
  for (absl::string_view token : {"", "nope", "tok-admin ", "tok-admi"}) {
    absl::StatusOr<Caller> c = a.Authorize("/shardcoord.v1.Coordinator/ListTensors", token);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnauthenticated) << token;
  }
}

TEST(AuthenticatorTest, RolesPerRpc) {
  Authenticator a = FourRoles();
  auto code = [&](absl::string_view rpc, absl::string_view token) {
    return a.Authorize(absl::StrCat("/shardcoord.v1.", rpc), token).status().code();
  };
  const auto kOk = absl::StatusCode::kOk;
  const auto kDenied = absl::StatusCode::kPermissionDenied;
  // Admin: every client RPC, no worker RPC.
  EXPECT_EQ(code("Coordinator/DeleteMesh", "tok-admin"), kOk);
  EXPECT_EQ(code("Coordinator/CreateMesh", "tok-admin"), kOk);
  EXPECT_EQ(code("Coordinator/DeleteTensor", "tok-admin"), kOk);
  EXPECT_EQ(code("Coordinator/Upload", "tok-admin"), kOk);
  EXPECT_EQ(code("CoordinatorWorkers/RegisterWorker", "tok-admin"), kDenied);
  // Operator: data movement, not meshes or deletes.
  EXPECT_EQ(code("Coordinator/CreateTensor", "tok-operator"), kOk);
  EXPECT_EQ(code("Coordinator/Redistribute", "tok-operator"), kOk);
  EXPECT_EQ(code("Coordinator/Copy", "tok-operator"), kOk);
  EXPECT_EQ(code("Coordinator/Gather", "tok-operator"), kOk);
  EXPECT_EQ(code("Coordinator/Upload", "tok-operator"), kOk);
  EXPECT_EQ(code("Coordinator/Download", "tok-operator"), kOk);
  EXPECT_EQ(code("Coordinator/CreateMesh", "tok-operator"), kDenied);
  EXPECT_EQ(code("Coordinator/DeleteMesh", "tok-operator"), kDenied);
  EXPECT_EQ(code("Coordinator/DeleteTensor", "tok-operator"), kDenied);
  // Prepared transfers: admins create, run and delete them; every client role reads them.
  EXPECT_EQ(code("Coordinator/RunTransfer", "tok-admin"), kOk);
  EXPECT_EQ(code("Coordinator/CreateTransfer", "tok-operator"), kDenied);
  EXPECT_EQ(code("Coordinator/RunTransfer", "tok-operator"), kDenied);
  EXPECT_EQ(code("Coordinator/DeleteTransfer", "tok-operator"), kDenied);
  EXPECT_EQ(code("Coordinator/ListTransfers", "tok-reader"), kOk);
  EXPECT_EQ(code("Coordinator/GetTransfer", "tok-reader"), kOk);
  // Reader: read-only.
  EXPECT_EQ(code("Coordinator/ListWorkers", "tok-reader"), kOk);
  EXPECT_EQ(code("Coordinator/GetTensor", "tok-reader"), kOk);
  EXPECT_EQ(code("Coordinator/PlanRedistribute", "tok-reader"), kOk);
  EXPECT_EQ(code("Coordinator/WatchPlan", "tok-reader"), kOk);
  EXPECT_EQ(code("Coordinator/Download", "tok-reader"), kOk);
  EXPECT_EQ(code("Coordinator/CreateTensor", "tok-reader"), kDenied);
  EXPECT_EQ(code("Coordinator/Upload", "tok-reader"), kDenied);
  EXPECT_EQ(code("Coordinator/Redistribute", "tok-reader"), kDenied);
  // Worker: the worker-facing service only.
  EXPECT_EQ(code("CoordinatorWorkers/RegisterWorker", "tok-worker"), kOk);
  EXPECT_EQ(code("CoordinatorWorkers/ReportChunks", "tok-worker"), kOk);
  EXPECT_EQ(code("Coordinator/ListTensors", "tok-worker"), kDenied);
  // An unknown method is denied to everyone.
  EXPECT_EQ(code("Coordinator/Nope", "tok-admin"), kDenied);
}

TEST(AuthenticatorTest, DeniedNamesRpcAndRoleAndCallerNamesTokenName) {
  Authenticator a = FourRoles();
  absl::StatusOr<Caller> denied =
      a.Authorize("/shardcoord.v1.Coordinator/DeleteMesh", "tok-reader");
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.status().message(), HasSubstr("reader"));
  EXPECT_THAT(denied.status().message(), HasSubstr("/shardcoord.v1.Coordinator/DeleteMesh"));
  EXPECT_THAT(denied.status().message(), ::testing::Not(HasSubstr("tok-reader")));
  absl::StatusOr<Caller> ok = a.Authorize("/shardcoord.v1.Coordinator/GetMesh", "tok-reader");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->name, "rick");
  EXPECT_EQ(ok->role, Role::kReader);
}

// Every RPC of the services the coordinator serves is in the table, and nothing else is.
TEST(RpcRoleTableTest, ClassifiesEveryRpcOfTheServedServices) {
  std::set<std::string> served;
  for (const char* service : {"Coordinator", "CoordinatorWorkers"}) {
    const google::protobuf::ServiceDescriptor* s =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            absl::StrCat("shardcoord.v1.", service));
    ASSERT_NE(s, nullptr) << service;
    for (int i = 0; i < s->method_count(); ++i) {
      served.insert(absl::StrCat("/", s->full_name(), "/", s->method(i)->name()));
    }
  }
  std::set<std::string> table;
  for (const RpcRule& r : RpcRoleTable()) {
    EXPECT_TRUE(table.insert(r.method).second) << "listed twice: " << r.method;
    EXPECT_FALSE(r.roles.empty()) << r.method;
  }
  for (const std::string& m : served) EXPECT_TRUE(table.count(m)) << "not classified: " << m;
  for (const std::string& m : table) EXPECT_TRUE(served.count(m)) << "no such RPC: " << m;
}

}  // namespace
}  // namespace shardcoord
