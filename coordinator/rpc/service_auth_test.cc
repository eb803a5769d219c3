// Both gRPC services with bearer-token authentication over an in-process channel: every
// refusal (unary and each kind of stream) has the right code and changes nothing.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/timer.h"
#include "coordinator/cluster/kv_store.h"
#include "coordinator/rpc/auth.h"
#include "coordinator/rpc/coordinator_service.h"
#include "coordinator/rpc/service_test_util.h"
#include "coordinator/rpc/worker_facing_service.h"
#include "coordinator/state/tensor_bands.h"
#include "coordinator/testing/call_helpers.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

Authenticator MakeAuth() {
  absl::StatusOr<Authenticator> a =
      Authenticator::Parse(absl::StrCat("admin alice ", Sha256Hex("A"), "\nreader rick ",
                                        Sha256Hex("R"), "\nworker w ", Sha256Hex("W"), "\n"),
                           "tokens");
  EXPECT_TRUE(a.ok()) << a.status();
  return *std::move(a);
}

class ServiceAuthTest : public ::testing::Test, protected ServedStack {
 protected:
  ServiceAuthTest()
      : ServedStack(64, kDefaultBandBytes, /*per_caller=*/0, &auth_), auth_(MakeAuth()) {
    Serve();
  }

  ~ServiceAuthTest() override { StopServing(); }

  // A context carrying `token` ("" = no metadata).
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    return ctx;
  }

  grpc::Status Register(const std::string& token, const std::string& name) {
    v1::RegisterWorkerResponse resp;
    return workers_stub_->RegisterWorker(Ctx(token).get(), TestRegisterRequest(name), &resp);
  }

  Authenticator auth_;  // The services keep its address: it is built after them.
};

TEST_F(ServiceAuthTest, WorkerServiceNeedsTheWorkerRole) {
  EXPECT_EQ(Register("", "w0").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Register("bad", "w0").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status admin = Register("A", "w0");
  EXPECT_EQ(admin.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(admin.error_message(), HasSubstr("RegisterWorker"));
  EXPECT_THAT(admin.error_message(), HasSubstr("admin"));
  EXPECT_TRUE(workers_.List().empty());
  ASSERT_TRUE(Register("W", "w0").ok());
  EXPECT_EQ(workers_.List().size(), 1);
}

TEST_F(ServiceAuthTest, UnaryRefusalsChangeNothing) {
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Register("W", absl::StrCat("w", i)).ok());
  v1::CreateMeshRequest create;
  create.set_name("m");
  create.add_shape(4);
  v1::MeshInfo info;
  EXPECT_EQ(coordinator_->CreateMesh(Ctx("").get(), create, &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(coordinator_->CreateMesh(Ctx("R").get(), create, &info).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(coordinator_->CreateMesh(Ctx("W").get(), create, &info).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(meshes_.List().empty());
  ASSERT_TRUE(coordinator_->CreateMesh(Ctx("A").get(), create, &info).ok());

  v1::DeleteMeshRequest del;
  del.set_name("m");
  v1::DeleteMeshResponse del_resp;
  grpc::Status denied = coordinator_->DeleteMesh(Ctx("R").get(), del, &del_resp);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(denied.error_message(), HasSubstr("/shardcoord.v1.Coordinator/DeleteMesh"));
  EXPECT_THAT(denied.error_message(), HasSubstr("reader"));
  EXPECT_EQ(meshes_.List().size(), 1);

  v1::ListMeshesRequest list;
  v1::ListMeshesResponse list_resp;
  ASSERT_TRUE(coordinator_->ListMeshes(Ctx("R").get(), list, &list_resp).ok());
  EXPECT_EQ(list_resp.meshes_size(), 1);
}

TEST_F(ServiceAuthTest, StreamsAreRefusedBeforeTheyStart) {
  // Server streams.
  for (const std::string& token : {std::string(""), std::string("W")}) {
    const grpc::StatusCode want =
        token.empty() ? grpc::StatusCode::UNAUTHENTICATED : grpc::StatusCode::PERMISSION_DENIED;
    {
      auto ctx = Ctx(token);
      v1::DownloadRequest req;
      req.set_name("t");
      auto reader = coordinator_->Download(ctx.get(), req);
      v1::TensorData msg;
      EXPECT_FALSE(reader->Read(&msg));
      EXPECT_EQ(reader->Finish().error_code(), want);
    }
    {
      auto ctx = Ctx(token);
      v1::WatchPlanRequest req;
      req.set_plan_id("p");
      auto reader = coordinator_->WatchPlan(ctx.get(), req);
      v1::PlanProgress msg;
      EXPECT_FALSE(reader->Read(&msg));
      EXPECT_EQ(reader->Finish().error_code(), want);
    }
  }
  // A client stream: a reader may not upload; no tensor appears.
  auto ctx = Ctx("R");
  grpc::Status s = UploadHeaderOnly(coordinator_.get(), ctx.get(), "t");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("Upload"));
  EXPECT_TRUE(tensors_.List().empty());
}

}  // namespace
}  // namespace shardcoord
