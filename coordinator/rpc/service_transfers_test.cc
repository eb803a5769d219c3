// The prepared-transfer RPCs over an in-process channel, with the real managers and fake
// workers: what the handlers translate, request_id replays, a run watched and listed as a
// plan.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/timer.h"
#include "coordinator/rpc/coordinator_service.h"
#include "coordinator/rpc/request_log.h"
#include "coordinator/store/state_store.h"
#include "coordinator/testing/fake_worker_client.h"
#include "coordinator/transfers/transfer_manager.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

class ServiceTransfersTest : public ::testing::Test {
 protected:
  ServiceTransfersTest()
      : workers_(&clock_, absl::Minutes(10)),
        meshes_(&workers_),
        tensors_(&meshes_),
        plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_, {}),
        io_(&workers_, &meshes_, &tensors_, &client_),
        transfers_(&clock_, &timer_, &workers_, &tensors_, &client_, &store_, {}),
        requests_(&store_, &clock_),
        service_(&workers_, &meshes_, &tensors_, &plans_, &io_, 1 << 20, /*metrics=*/nullptr,
                 /*auth=*/nullptr, &requests_, /*watches=*/nullptr, /*running_plans=*/nullptr,
                 /*checkpoints=*/nullptr, &transfers_) {
    workers_.AddListener(&transfers_);
    for (int i = 0; i < 4; ++i) {
      const std::string name = absl::StrCat("w", i);
      EXPECT_TRUE(workers_.Register(WorkerSpec{name, "h", "cpu", name + ":1", "gloo"}).ok());
    }
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    stub_ = v1::Coordinator::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
    EXPECT_TRUE(meshes_.Create("line", {4}, {}, {}).ok());
    EXPECT_TRUE(meshes_.Create("grid", {2, 2}, {}, {}).ok());
    for (const auto& [name, mesh, placements] :
         {std::make_tuple("a", "line", "S(0)"), std::make_tuple("b", "grid", "R,S(1)"),
          std::make_tuple("c", "line", "S(1)"), std::make_tuple("d", "grid", "S(0),R")}) {
      grpc::ClientContext ctx;
      v1::CreateTensorRequest req;
      req.set_name(name);
      req.add_shape(8);
      req.add_shape(4);
      req.set_dtype(v1::F32);
      req.mutable_spec()->set_mesh(mesh);
      req.mutable_spec()->set_placements_text(placements);
      req.set_init(v1::ARANGE);
      v1::TensorInfo info;
      grpc::Status made = stub_->CreateTensor(&ctx, req, &info);
      EXPECT_TRUE(made.ok()) << name << ": " << made.error_message();
    }
  }

  ~ServiceTransfersTest() override { server_->Shutdown(); }

  v1::CreateTransferRequest Sync(const std::string& request_id = "") {
    v1::CreateTransferRequest req;
    req.set_name("sync");
    for (const auto& [src, dst] : {std::make_pair("a", "b"), std::make_pair("c", "d")}) {
      v1::CopyPair* c = req.add_copies();
      c->set_src(src);
      c->set_dst(dst);
    }
    req.set_request_id(request_id);
    return req;
  }

  grpc::Status Create(const v1::CreateTransferRequest& req, v1::TransferInfo* info) {
    grpc::ClientContext ctx;
    return stub_->CreateTransfer(&ctx, req, info);
  }

  grpc::Status Run(bool wait, v1::RunTransferResponse* resp) {
    grpc::ClientContext ctx;
    v1::RunTransferRequest req;
    req.set_name("sync");
    req.set_wait(wait);
    return stub_->RunTransfer(&ctx, req, resp);
  }

  FakeClock clock_;
  FakeTimer timer_{&clock_};  // Time moves only when a test says so.
  MemoryStateStore store_;
  FakeWorkerClient client_;
  WorkerManager workers_;
  MeshManager meshes_;
  TensorManager tensors_;
  PlanManager plans_;
  TensorIo io_;
  TransferManager transfers_;
  RequestLog requests_;
  CoordinatorService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(ServiceTransfersTest, CreateRunGetListDelete) {
  v1::TransferInfo info;
  ASSERT_TRUE(Create(Sync("create-1"), &info).ok());
  EXPECT_EQ(info.name(), "sync");
  EXPECT_EQ(info.members(), 2);
  EXPECT_TRUE(info.prepared()) << info.invalid_reason();
  EXPECT_EQ(info.participants(), 4);
  // A retry of the same request answers the first outcome without preparing again.
  const int pages = client_.calls("PrepareTransfer");
  v1::TransferInfo again;
  ASSERT_TRUE(Create(Sync("create-1"), &again).ok());
  EXPECT_EQ(again.SerializeAsString(), info.SerializeAsString());
  EXPECT_EQ(client_.calls("PrepareTransfer"), pages);
  grpc::Status exists = Create(Sync(), &again);
  EXPECT_EQ(exists.error_code(), grpc::StatusCode::ALREADY_EXISTS);

  v1::RunTransferResponse run;
  grpc::Status ran = Run(/*wait=*/true, &run);
  ASSERT_TRUE(ran.ok()) << ran.error_message();
  EXPECT_EQ(run.state(), v1::COMMITTED);
  EXPECT_EQ(run.members(), 2);
  EXPECT_FALSE(run.replanned());
  {
    grpc::ClientContext ctx;
    v1::GetTensorRequest req;
    req.set_name("d");
    v1::TensorInfo d;
    ASSERT_TRUE(stub_->GetTensor(&ctx, req, &d).ok());
    EXPECT_EQ(d.version(), run.version());
  }
  {
    grpc::ClientContext ctx;
    v1::GetTransferRequest req;
    req.set_name("sync");
    req.set_copies(true);
    v1::TransferInfo got;
    ASSERT_TRUE(stub_->GetTransfer(&ctx, req, &got).ok());
    EXPECT_EQ(got.runs(), 1);
    EXPECT_EQ(got.version(), run.version());
    ASSERT_EQ(got.copies_size(), 2);
    EXPECT_EQ(got.copies(1).dst(), "d");
  }
  {
    grpc::ClientContext ctx;
    v1::ListTransfersRequest req;
    req.set_page_token("not a name!");
    v1::ListTransfersResponse list;
    grpc::Status bad = stub_->ListTransfers(&ctx, req, &list);
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(bad.error_message(), HasSubstr("page_token"));
  }
  {
    grpc::ClientContext ctx;
    v1::ListTransfersResponse list;
    ASSERT_TRUE(stub_->ListTransfers(&ctx, v1::ListTransfersRequest(), &list).ok());
    ASSERT_EQ(list.transfers_size(), 1);
    EXPECT_EQ(list.transfers(0).copies_size(), 0);
    EXPECT_TRUE(list.next_page_token().empty());
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteTransferRequest req;
    req.set_name("sync");
    v1::DeleteTransferResponse resp;
    ASSERT_TRUE(stub_->DeleteTransfer(&ctx, req, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::GetTransferRequest req;
    req.set_name("sync");
    v1::TransferInfo got;
    EXPECT_EQ(stub_->GetTransfer(&ctx, req, &got).error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

// A run that does not wait answers once it started; its id is watched, listed and traced as
// a plan's.
TEST_F(ServiceTransfersTest, ARunIsWatchedListedAndTracedByItsId) {
  v1::TransferInfo info;
  ASSERT_TRUE(Create(Sync(), &info).ok());
  client_.HoldRuns(true);
  v1::RunTransferResponse started;
  ASSERT_TRUE(Run(/*wait=*/false, &started).ok());
  EXPECT_FALSE(started.run_id().empty());
  EXPECT_NE(started.state(), v1::COMMITTED);
  grpc::ClientContext watch_ctx;
  v1::WatchPlanRequest watch;
  watch.set_plan_id(started.run_id());
  std::unique_ptr<grpc::ClientReader<v1::PlanProgress>> stream =
      stub_->WatchPlan(&watch_ctx, watch);
  v1::PlanProgress p;
  ASSERT_TRUE(stream->Read(&p));
  EXPECT_EQ(p.plan_id(), started.run_id());
  EXPECT_EQ(p.state(), v1::PREPARED);
  client_.ReleaseRuns();
  while (stream->Read(&p)) {
  }
  EXPECT_EQ(p.state(), v1::COMMITTED);
  EXPECT_TRUE(stream->Finish().ok());
  {
    grpc::ClientContext ctx;
    v1::ListPlansResponse list;
    ASSERT_TRUE(stub_->ListPlans(&ctx, v1::ListPlansRequest(), &list).ok());
    bool listed = false;
    for (const v1::PlanSummary& s : list.plans()) {
      if (s.plan_id() != started.run_id()) continue;
      listed = true;
      EXPECT_EQ(s.op(), "transfer");
      EXPECT_EQ(s.state(), v1::COMMITTED);
    }
    EXPECT_TRUE(listed);
  }
  {
    grpc::ClientContext ctx;
    v1::GetPlanTraceRequest req;
    req.set_plan_id(started.run_id());
    v1::PlanTrace trace;
    ASSERT_TRUE(stub_->GetPlanTrace(&ctx, req, &trace).ok());
    EXPECT_EQ(trace.op(), "transfer");
    EXPECT_EQ(trace.ranks_size(), 4);
  }
}

TEST_F(ServiceTransfersTest, ErrorsKeepTheirCodes) {
  v1::RunTransferResponse run;
  EXPECT_EQ(Run(/*wait=*/true, &run).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::CreateTransferRequest bad = Sync();
  bad.mutable_copies(1)->set_dst("b");
  v1::TransferInfo info;
  grpc::Status twice = Create(bad, &info);
  EXPECT_EQ(twice.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(twice.error_message(), HasSubstr("copies[1].dst"));
  ASSERT_TRUE(Create(Sync(), &info).ok());
  client_.Fail("RunTransfer", 2, absl::InternalError("gloo: peer gone"));
  grpc::Status aborted = Run(/*wait=*/true, &run);
  EXPECT_EQ(aborted.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(aborted.error_message(), HasSubstr("peer gone"));
}

}  // namespace
}  // namespace shardcoord
