// Both gRPC services over an in-process channel (no sockets), with the real managers and a
// fake WorkerClient: checks the adapters' conversions, status codes and the reactors that
// finish later (redistribute with wait, watch, upload, download, rendezvous waits).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/timer.h"
#include "coordinator/cluster/kv_store.h"
#include "coordinator/rpc/coordinator_service.h"
#include "coordinator/rpc/request_log.h"
#include "coordinator/rpc/service_test_util.h"
#include "coordinator/rpc/worker_facing_service.h"
#include "coordinator/state/tensor_bands.h"
#include "coordinator/store/state_store.h"
#include "coordinator/testing/fake_worker_client.h"
#include "coordinator/testing/float_data.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/convert.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kSlice = 64;  // Streamed data messages carry at most this many bytes.

class ServiceTest : public ::testing::Test, protected ServedStack {
 protected:
  explicit ServiceTest(int64_t band_bytes = kDefaultBandBytes, int64_t per_caller = 1000)
      : ServedStack(kSlice, band_bytes, per_caller) {
    // Loopback too, for what the in-process transport does not do as a network does.
    Serve(&tcp_port_);
  }

  ~ServiceTest() override { StopServing(); }

  void RegisterFour() {
    for (int i = 0; i < 4; ++i) {
      grpc::ClientContext ctx;
      v1::RegisterWorkerResponse resp;
      ASSERT_TRUE(
          workers_stub_->RegisterWorker(&ctx, TestRegisterRequest(absl::StrCat("w", i)), &resp)
              .ok());
      EXPECT_EQ(resp.rank(), i);
      EXPECT_EQ(resp.heartbeat_interval_ms(), 250);
      incarnations_.push_back(resp.incarnation());
    }
  }

  grpc::Status CreateMesh(const std::string& name, std::vector<int64_t> shape) {
    grpc::ClientContext ctx;
    v1::CreateMeshRequest req;
    req.set_name(name);
    for (int64_t d : shape) req.add_shape(d);
    v1::MeshInfo info;
    return coordinator_->CreateMesh(&ctx, req, &info);
  }

  grpc::Status CreateTensor(const std::string& name, const std::string& mesh,
                            const std::string& placements, v1::TensorInfo* info,
                            v1::DType dtype = v1::F32) {
    grpc::ClientContext ctx;
    v1::CreateTensorRequest req;
    req.set_name(name);
    req.add_shape(8);
    req.add_shape(4);
    req.set_dtype(dtype);
    req.mutable_spec()->set_mesh(mesh);
    req.mutable_spec()->set_placements_text(placements);
    req.set_init(v1::ARANGE);
    return coordinator_->CreateTensor(&ctx, req, info);
  }

  // What a worker that ran `f` reports.
  v1::ReportChunksRequest FinalReport(const v1::PlanFragment& f) {
    v1::ReportChunksRequest r;
    r.set_plan_id(f.plan_id());
    r.set_worker(absl::StrCat("w", f.rank()));
    r.set_incarnation(incarnations_[f.rank()]);
    r.set_rank(f.rank());
    r.set_final(true);
    *r.mutable_chunks() = f.target();
    for (v1::Chunk& c : *r.mutable_chunks()->mutable_chunks()) {
      c.set_checksum(1 + c.box().offset(0) * 100 + c.box().offset(1));
    }
    // A fused group's fragment: every shape's target, every member's checksums.
    for (const v1::FragmentShape& shape : f.shapes()) *r.add_shapes() = shape.target();
    for (const v1::FragmentMember& m : f.members()) {
      v1::MemberChunks* out = r.add_members();
      out->set_index(m.index());
      out->set_shape(m.shape());
      for (const v1::Chunk& c : f.shapes(m.shape()).target().chunks()) {
        out->add_checksums(1 + c.box().offset(0) * 100 + c.box().offset(1));
      }
    }
    return r;
  }

  WorkerReport ToReport(const v1::ReportChunksRequest& r) {
    WorkerReport w;
    w.plan_id = r.plan_id();
    w.worker = r.worker();
    w.incarnation = r.incarnation();
    w.rank = r.rank();
    w.final = true;
    w.chunks = *RankChunksFromProto(r.chunks(), "chunks", &w.checksums);
    for (const v1::RankChunks& shape : r.shapes()) {
      w.shapes.push_back(*RankChunksFromProto(shape, "shapes"));
    }
    for (const v1::MemberChunks& m : r.members()) {
      WorkerReport::Member& out = w.members.emplace_back();
      out.index = m.index();
      out.shape = m.shape();
      out.checksums.assign(m.checksums().begin(), m.checksums().end());
    }
    return w;
  }

  int tcp_port_ = 0;
  std::vector<int64_t> incarnations_;
};

TEST_F(ServiceTest, RegistrationHeartbeatsAndWorkerList) {
  RegisterFour();
  {
    grpc::ClientContext ctx;
    v1::HeartbeatRequest req;
    req.set_name("w1");
    req.set_incarnation(incarnations_[1] + 100);
    v1::HeartbeatResponse resp;
    EXPECT_EQ(workers_stub_->Heartbeat(&ctx, req, &resp).error_code(), grpc::StatusCode::ABORTED);
  }
  {
    grpc::ClientContext ctx;
    v1::RegisterWorkerRequest req;
    req.set_name("nameless-address");
    v1::RegisterWorkerResponse resp;
    grpc::Status s = workers_stub_->RegisterWorker(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "address: empty");
  }
  {
    // Held buffers are validated, and ones of unknown tensors are answered as drops.
    grpc::ClientContext ctx;
    v1::RegisterWorkerRequest req;
    req.set_name("w3");
    req.set_address("w3:1");
    v1::HeldBuffer* held = req.add_held();
    held->set_tensor("deleted");
    held->set_version(4);
    v1::Chunk* chunk = held->mutable_chunks()->add_chunks();
    chunk->mutable_box()->add_offset(-1);
    chunk->mutable_box()->add_shape(2);
    v1::RegisterWorkerResponse resp;
    grpc::Status s = workers_stub_->RegisterWorker(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("held[0].chunks"));
    grpc::ClientContext ctx2;
    held->mutable_chunks()->clear_chunks();
    s = workers_stub_->RegisterWorker(&ctx2, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.rank(), 3);
    ASSERT_EQ(resp.drop_size(), 1);
    EXPECT_EQ(resp.drop(0).tensor(), "deleted");
    EXPECT_EQ(resp.drop(0).version(), 4);
  }
  grpc::ClientContext ctx;
  v1::ListWorkersResponse list;
  ASSERT_TRUE(coordinator_->ListWorkers(&ctx, v1::ListWorkersRequest(), &list).ok());
  ASSERT_EQ(list.workers_size(), 4);
  EXPECT_EQ(list.workers(2).name(), "w2");
  EXPECT_EQ(list.workers(2).rank(), 2);
  EXPECT_EQ(list.workers(2).state(), v1::ALIVE);
  EXPECT_EQ(list.workers(2).address(), "w2:1");
  EXPECT_GT(list.workers(2).last_heartbeat_unix_ms(), 0);
  EXPECT_TRUE(list.next_page_token().empty());

  // Pages in rank order, each after the last one's rank.
  v1::ListWorkersRequest page;
  page.set_page_size(3);
  v1::ListWorkersResponse first, second, bad;
  {
    grpc::ClientContext c;
    ASSERT_TRUE(coordinator_->ListWorkers(&c, page, &first).ok());
  }
  ASSERT_EQ(first.workers_size(), 3);
  EXPECT_EQ(first.next_page_token(), "2");
  page.set_page_token(first.next_page_token());
  {
    grpc::ClientContext c;
    ASSERT_TRUE(coordinator_->ListWorkers(&c, page, &second).ok());
  }
  ASSERT_EQ(second.workers_size(), 1);
  EXPECT_EQ(second.workers(0).rank(), 3);
  EXPECT_TRUE(second.next_page_token().empty());
  page.set_page_token("w3");
  grpc::ClientContext c;
  grpc::Status refused = coordinator_->ListWorkers(&c, page, &bad);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), "page_token: 'w3' is not a rank");
}

// A tensor a restarted coordinator is still recovering shows as busy recovering, with no
// lost chunks guessed from holders that have not registered again yet.
TEST(TensorInfoTest, RecoveringTensorNamesNoLostChunks) {
  TensorRecord t;
  t.name = "T";
  t.shape = {4};
  t.layout = *Layout::FromChunks({4}, {RankChunks{0, {}, {Chunk{Box{{0}, {4}}, 0, 0}}, 4}});
  t.checksums = {{1}};
  t.incarnations = {{0, 3}};
  t.recovering = true;
  t.awaiting = {0};
  LivenessFn dead = [](int64_t, int64_t) { return false; };
  v1::TensorInfo info = TensorInfoToProto(t, dead);
  EXPECT_EQ(info.lost_chunks_size(), 0);
  EXPECT_THAT(info.busy_plan(), HasSubstr("recovering"));
  t.recovering = false;
  EXPECT_EQ(TensorInfoToProto(t, dead).lost_chunks_size(), 1);
}

TEST_F(ServiceTest, MeshesAndTensors) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  grpc::Status bad_mesh = CreateMesh("X", {2, 0});
  EXPECT_EQ(bad_mesh.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  v1::TensorInfo info;
  ASSERT_TRUE(CreateTensor("T", "M", "S(0),R", &info).ok());
  EXPECT_EQ(info.spec(), "S(0),R");
  EXPECT_EQ(info.bytes(), 128);
  ASSERT_EQ(info.layout().ranks_size(), 4);
  EXPECT_NE(info.layout().ranks(0).chunks(0).checksum(), 0u);
  EXPECT_EQ(info.layout().ranks(0).chunks(0).checksum(),
            info.layout().ranks(1).chunks(0).checksum());
  EXPECT_EQ(CreateTensor("T", "M", "S(0),R", &info).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  grpc::Status bad_dtype = CreateTensor("U", "M", "S(0),R", &info, v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(bad_dtype.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(bad_dtype.error_message(), "dtype: unspecified");
  grpc::Status bad_spec = CreateTensor("U", "M", "S(0),S(7)", &info);
  EXPECT_EQ(bad_spec.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(bad_spec.error_message(), "spec.placements[1]: S(7) on a 2-d tensor");
  EXPECT_EQ(CreateTensor("U", "nomesh", "R", &info).error_code(), grpc::StatusCode::NOT_FOUND);

  {
    grpc::ClientContext ctx;
    v1::DeleteMeshRequest req;
    req.set_name("M");
    v1::DeleteMeshResponse resp;
    grpc::Status s = coordinator_->DeleteMesh(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(s.error_message(), "mesh 'M' is in use by tensor T");
  }
  {
    grpc::ClientContext ctx;
    v1::ListTensorsResponse list;
    ASSERT_TRUE(coordinator_->ListTensors(&ctx, v1::ListTensorsRequest(), &list).ok());
    ASSERT_EQ(list.tensors_size(), 1);
    EXPECT_EQ(list.tensors(0).name(), "T");
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteTensorRequest req;
    req.set_name("T");
    v1::DeleteTensorResponse resp;
    ASSERT_TRUE(coordinator_->DeleteTensor(&ctx, req, &resp).ok());
  }
  grpc::ClientContext ctx;
  v1::GetTensorRequest req;
  req.set_name("T");
  EXPECT_EQ(coordinator_->GetTensor(&ctx, req, &info).error_code(), grpc::StatusCode::NOT_FOUND);
}

// A model's tensors: created in one call (all or nothing), listed in pages, deleted by prefix.
TEST_F(ServiceTest, BulkTensorsAndPagedLists) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  auto member = [](const std::string& name, v1::DType dtype = v1::F32) {
    v1::CreateTensorRequest t;
    t.set_name(name);
    t.add_shape(8);
    t.add_shape(4);
    t.set_dtype(dtype);
    t.mutable_spec()->set_mesh("M");
    t.mutable_spec()->set_placements_text("S(0),R");
    t.set_init(v1::ARANGE);
    return t;
  };
  auto create = [&](const v1::CreateTensorsRequest& req, v1::CreateTensorsResponse* resp) {
    grpc::ClientContext ctx;
    return coordinator_->CreateTensors(&ctx, req, resp);
  };
  v1::CreateTensorsRequest bad;
  *bad.add_tensors() = member("m.a");
  *bad.add_tensors() = member("m.b", v1::DTYPE_UNSPECIFIED);
  v1::CreateTensorsResponse made;
  grpc::Status refused = create(bad, &made);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), "tensors[1].dtype: unspecified");

  v1::CreateTensorsRequest req;
  for (int i = 0; i < 25; ++i) *req.add_tensors() = member(absl::StrFormat("m.%02d", i));
  *req.add_tensors() = member("z");
  ASSERT_TRUE(create(req, &made).ok());
  EXPECT_EQ(made.created(), 26);
  EXPECT_EQ(made.bytes(), 26 * 128);

  auto list = [&](const v1::ListTensorsRequest& r, v1::ListTensorsResponse* out) {
    grpc::ClientContext ctx;
    return coordinator_->ListTensors(&ctx, r, out);
  };
  v1::ListTensorsRequest page;
  page.set_prefix("m.");
  page.set_page_size(10);
  std::vector<std::string> names;
  int calls = 0;
  for (;;) {
    v1::ListTensorsResponse got;
    ASSERT_TRUE(list(page, &got).ok());
    ++calls;
    for (const v1::TensorInfo& t : got.tensors()) names.push_back(t.name());
    if (got.next_page_token().empty()) break;
    page.set_page_token(got.next_page_token());
  }
  EXPECT_EQ(calls, 3);
  ASSERT_EQ(names.size(), 25u);
  EXPECT_EQ(names.front(), "m.00");
  EXPECT_EQ(names.back(), "m.24");
  v1::ListTensorsResponse ignored;
  page.set_page_size(-1);
  grpc::Status bad_size = list(page, &ignored);
  EXPECT_EQ(bad_size.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(bad_size.error_message(), "page_size: -1 is outside [0, 10000]");
  page.set_page_size(0);
  page.set_page_token("z");
  EXPECT_EQ(list(page, &ignored).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext ctx;
  v1::DeleteTensorsRequest del;
  del.set_prefix("m.");
  v1::DeleteTensorsResponse deleted;
  ASSERT_TRUE(coordinator_->DeleteTensors(&ctx, del, &deleted).ok());
  EXPECT_EQ(deleted.deleted(), 25);
  v1::ListTensorsResponse rest;
  ASSERT_TRUE(list(v1::ListTensorsRequest(), &rest).ok());
  ASSERT_EQ(rest.tensors_size(), 1);
  EXPECT_EQ(rest.tensors(0).name(), "z");
}

TEST_F(ServiceTest, RedistributeWithWaitReturnsWhenCommitted) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  v1::TensorInfo info;
  ASSERT_TRUE(CreateTensor("T", "M", "S(0),R", &info).ok());
  // Workers report as soon as they accept: the plan ends before Redistribute returns.
  client_.SetExecuteHook([this](const WorkerEndpoint&, const v1::PlanFragment& f) {
    ASSERT_TRUE(plans_.Report(ToReport(FinalReport(f))).ok());
  });
  grpc::ClientContext ctx;
  v1::RedistributeRequest req;
  req.set_tensor("T");
  req.mutable_target()->set_placements_text("R,S(1)");
  req.set_wait(true);
  v1::RedistributeResponse resp;
  grpc::Status s = coordinator_->Redistribute(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.progress().state(), v1::COMMITTED);
  EXPECT_EQ(resp.progress().bytes_done(), resp.progress().bytes_total());
  EXPECT_FALSE(resp.plan().id().empty());
  EXPECT_EQ(resp.plan().tensor(), "T");
  EXPECT_GT(resp.plan().steps_size(), 0);

  grpc::ClientContext get_ctx;
  v1::GetTensorRequest get;
  get.set_name("T");
  ASSERT_TRUE(coordinator_->GetTensor(&get_ctx, get, &info).ok());
  EXPECT_EQ(info.spec(), "R,S(1)");
  EXPECT_TRUE(info.busy_plan().empty());

  // A failing worker turns the wait into ABORTED naming it.
  client_.SetExecuteHook([this](const WorkerEndpoint&, const v1::PlanFragment& f) {
    WorkerReport r = ToReport(FinalReport(f));
    if (f.rank() == 2) r.error = "out of memory";
    plans_.Report(r).IgnoreError();
  });
  grpc::ClientContext ctx2;
  req.mutable_target()->set_placements_text("S(1),S(0)");
  s = coordinator_->Redistribute(&ctx2, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(s.error_message(), HasSubstr("worker w2 (rank 2) failed: out of memory"));
}

// A retry with the same request_id answers the first outcome and does not act again; the
// same id with other fields is refused.
TEST_F(ServiceTest, RetriesWithTheSameRequestIdActOnce) {
  RegisterFour();
  v1::CreateMeshRequest mesh;
  mesh.set_name("M");
  mesh.add_shape(2);
  mesh.add_shape(2);
  mesh.set_request_id("mesh-1");
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    v1::MeshInfo info;
    grpc::Status s = coordinator_->CreateMesh(&ctx, mesh, &info);
    ASSERT_TRUE(s.ok()) << "attempt " << i << ": " << s.error_message();
    EXPECT_EQ(info.name(), "M");
    EXPECT_EQ(info.workers_size(), 4);
  }
  {
    grpc::ClientContext ctx;
    v1::MeshInfo info;
    mesh.set_request_id("");  // Without an id, a repeat acts, and the mesh exists.
    EXPECT_EQ(coordinator_->CreateMesh(&ctx, mesh, &info).error_code(),
              grpc::StatusCode::ALREADY_EXISTS);
  }
  {
    grpc::ClientContext ctx;
    v1::MeshInfo info;
    mesh.set_request_id("mesh-1");
    mesh.set_name("N");
    grpc::Status s = coordinator_->CreateMesh(&ctx, mesh, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("request_id 'mesh-1' was already used"));
  }
  v1::TensorInfo info;
  ASSERT_TRUE(CreateTensor("T", "M", "S(0),R", &info).ok());
  client_.SetExecuteHook([this](const WorkerEndpoint&, const v1::PlanFragment& f) {
    ASSERT_TRUE(plans_.Report(ToReport(FinalReport(f))).ok());
  });
  v1::RedistributeRequest req;
  req.set_tensor("T");
  req.mutable_target()->set_placements_text("R,S(1)");
  req.set_wait(true);
  req.set_request_id("move-1");
  v1::RedistributeResponse first;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(coordinator_->Redistribute(&ctx, req, &first).ok());
  }
  ASSERT_EQ(first.progress().state(), v1::COMMITTED);
  grpc::ClientContext get_ctx;
  v1::GetTensorRequest get;
  get.set_name("T");
  ASSERT_TRUE(coordinator_->GetTensor(&get_ctx, get, &info).ok());
  const int64_t version = info.version();
  v1::RedistributeResponse again;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(coordinator_->Redistribute(&ctx, req, &again).ok());
  }
  EXPECT_EQ(again.plan().id(), first.plan().id());
  EXPECT_EQ(again.progress().state(), v1::COMMITTED);
  grpc::ClientContext get_ctx2;
  ASSERT_TRUE(coordinator_->GetTensor(&get_ctx2, get, &info).ok());
  EXPECT_EQ(info.version(), version);  // No second plan ran.

  v1::DeleteTensorRequest del;
  del.set_name("T");
  del.set_request_id("delete-1");
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    v1::DeleteTensorResponse resp;
    grpc::Status s = coordinator_->DeleteTensor(&ctx, del, &resp);
    EXPECT_TRUE(s.ok()) << "attempt " << i << ": " << s.error_message();
  }
  // A failure is replayed as it was: the tensor is gone, and a retry of a delete that found
  // nothing still says so.
  del.set_name("U");
  del.set_request_id("delete-2");
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    v1::DeleteTensorResponse resp;
    EXPECT_EQ(coordinator_->DeleteTensor(&ctx, del, &resp).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(requests_.size(), 4u);  // mesh-1, move-1, delete-1, delete-2.
}

TEST_F(ServiceTest, CopyBumpsDstOnlyAndMapsErrors) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  ASSERT_TRUE(CreateMesh("N", {4}).ok());
  v1::TensorInfo src, dst, half;
  ASSERT_TRUE(CreateTensor("src", "M", "S(0),R", &src).ok());
  ASSERT_TRUE(CreateTensor("dst", "N", "S(1)", &dst).ok());
  ASSERT_TRUE(CreateTensor("half", "N", "S(1)", &half, v1::I16).ok());
  client_.SetExecuteHook([this](const WorkerEndpoint&, const v1::PlanFragment& f) {
    ASSERT_TRUE(plans_.Report(ToReport(FinalReport(f))).ok());
  });
  grpc::ClientContext ctx;
  v1::CopyRequest req;
  req.set_src("src");
  req.set_dst("dst");
  req.set_wait(true);
  v1::CopyResponse resp;
  grpc::Status s = coordinator_->Copy(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.progress().state(), v1::COMMITTED);
  EXPECT_EQ(resp.progress().tensor(), "dst");
  EXPECT_FALSE(resp.plan().id().empty());
  EXPECT_EQ(resp.plan().tensor(), "dst");
  EXPECT_EQ(resp.plan().bytes_moved(), resp.plan().lower_bound_bytes());
  EXPECT_GT(resp.dst_version(), dst.version());

  auto get = [this](const std::string& name) {
    grpc::ClientContext get_ctx;
    v1::GetTensorRequest get;
    get.set_name(name);
    v1::TensorInfo info;
    EXPECT_TRUE(coordinator_->GetTensor(&get_ctx, get, &info).ok());
    return info;
  };
  const v1::TensorInfo dst_after = get("dst");
  EXPECT_EQ(dst_after.version(), resp.dst_version());
  EXPECT_EQ(dst_after.spec(), "S(1)");
  EXPECT_EQ(dst_after.mesh(), "N");
  EXPECT_EQ(get("src").version(), src.version());

  auto copy = [this](const std::string& from, const std::string& to) {
    grpc::ClientContext c;
    v1::CopyRequest r;
    r.set_src(from);
    r.set_dst(to);
    r.set_wait(true);
    v1::CopyResponse out;
    return coordinator_->Copy(&c, r, &out);
  };
  EXPECT_EQ(copy("", "dst").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(copy("src", "").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(copy("src", "src").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = copy("src", "half");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("dst: tensor 'half' dtype i16 cannot be cast from src 'src' dtype f32"));
  EXPECT_EQ(copy("src", "nope").error_code(), grpc::StatusCode::NOT_FOUND);

  // A failing worker turns the wait into ABORTED naming it; both keep their versions.
  client_.SetExecuteHook([this](const WorkerEndpoint&, const v1::PlanFragment& f) {
    WorkerReport r = ToReport(FinalReport(f));
    if (f.rank() == 2) r.error = "out of memory";
    plans_.Report(r).IgnoreError();
  });
  s = copy("src", "dst");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(s.error_message(), HasSubstr("worker w2 (rank 2) failed: out of memory"));
  EXPECT_EQ(get("dst").version(), dst_after.version());
  EXPECT_EQ(get("src").version(), src.version());
}

TEST_F(ServiceTest, CopyGroupCommitsEveryDstAndNamesBadMembers) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  ASSERT_TRUE(CreateMesh("N", {4}).ok());
  v1::TensorInfo a, b, x, y;
  ASSERT_TRUE(CreateTensor("a", "M", "S(0),R", &a).ok());
  ASSERT_TRUE(CreateTensor("b", "M", "R,S(1)", &b).ok());
  ASSERT_TRUE(CreateTensor("x", "N", "S(1)", &x).ok());
  ASSERT_TRUE(CreateTensor("y", "N", "S(0)", &y).ok());
  client_.SetExecuteHook([this](const WorkerEndpoint&, const v1::PlanFragment& f) {
    ASSERT_TRUE(plans_.Report(ToReport(FinalReport(f))).ok());
  });
  auto group = [this](std::vector<std::pair<std::string, std::string>> pairs,
                      v1::CopyGroupResponse* out) {
    grpc::ClientContext c;
    v1::CopyGroupRequest r;
    for (const auto& [src, dst] : pairs) {
      v1::CopyPair* p = r.add_copies();
      p->set_src(src);
      p->set_dst(dst);
    }
    r.set_wait(true);
    return coordinator_->CopyGroup(&c, r, out);
  };
  v1::CopyGroupResponse resp;
  grpc::Status s = group({{"a", "x"}, {"b", "y"}}, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.group_id().empty());
  EXPECT_EQ(resp.state(), v1::COMMITTED);
  EXPECT_EQ(resp.bytes_moved(), resp.lower_bound_bytes());
  ASSERT_EQ(resp.members_size(), 2);
  EXPECT_EQ(resp.members(0).dst(), "x");
  EXPECT_EQ(resp.members(1).progress().state(), v1::COMMITTED);
  EXPECT_EQ(resp.members(1).plan().tensor(), "y");
  EXPECT_EQ(resp.bytes_moved(),
            resp.members(0).plan().bytes_moved() + resp.members(1).plan().bytes_moved());
  EXPECT_GT(resp.buckets(), 0);
  EXPECT_EQ(resp.bucket_bytes(), int64_t{64} << 20);

  v1::CopyGroupResponse bad;
  s = group({{"a", "x"}, {"b", "nope"}}, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "copies[1].dst: unknown tensor 'nope'");
  s = group({{"a", "x"}, {"x", "y"}}, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = group({}, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // A failing worker rolls back both members.
  client_.SetExecuteHook([this](const WorkerEndpoint&, const v1::PlanFragment& f) {
    WorkerReport r = ToReport(FinalReport(f));
    if (f.rank() == 2) r.error = "out of memory";
    plans_.Report(r).IgnoreError();
  });
  s = group({{"a", "x"}, {"b", "y"}}, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(s.error_message(), HasSubstr("group g-"));
  EXPECT_THAT(s.error_message(), HasSubstr("worker w2 (rank 2) failed: out of memory"));
  auto version = [this](const std::string& name) {
    grpc::ClientContext get_ctx;
    v1::GetTensorRequest get;
    get.set_name(name);
    v1::TensorInfo info;
    EXPECT_TRUE(coordinator_->GetTensor(&get_ctx, get, &info).ok());
    return info.version();
  };
  EXPECT_EQ(version("x"), resp.members(0).dst_version());
  EXPECT_EQ(version("y"), resp.members(1).dst_version());
}

TEST_F(ServiceTest, WatchStreamsProgressAndReportsGoThroughTheWorkerService) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  v1::TensorInfo info;
  ASSERT_TRUE(CreateTensor("T", "M", "S(0),R", &info).ok());
  client_.HoldExecutes(true);
  grpc::ClientContext ctx;
  v1::RedistributeRequest req;
  req.set_tensor("T");
  req.mutable_target()->set_placements_text("R,S(1)");
  v1::RedistributeResponse resp;
  ASSERT_TRUE(coordinator_->Redistribute(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.progress().state(), v1::PENDING);
  const std::string id = resp.plan().id();

  // A second plan on the busy tensor.
  grpc::ClientContext busy_ctx;
  v1::RedistributeResponse busy;
  EXPECT_EQ(coordinator_->Redistribute(&busy_ctx, req, &busy).error_code(),
            grpc::StatusCode::ABORTED);

  grpc::ClientContext watch_ctx;
  v1::WatchPlanRequest watch;
  watch.set_plan_id(id);
  std::unique_ptr<grpc::ClientReader<v1::PlanProgress>> reader =
      coordinator_->WatchPlan(&watch_ctx, watch);
  v1::PlanProgress p;
  ASSERT_TRUE(reader->Read(&p));
  EXPECT_EQ(p.state(), v1::PENDING);

  client_.ReleaseExecutes();
  for (const v1::PlanFragment& f : client_.fragments()) {
    if (f.plan_id() != id) continue;
    grpc::ClientContext rctx;
    v1::ReportChunksResponse rresp;
    grpc::Status s = workers_stub_->ReportChunks(&rctx, FinalReport(f), &rresp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  std::vector<v1::PlanState> states;
  while (reader->Read(&p)) states.push_back(p.state());
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.back(), v1::COMMITTED);

  // Reports after the end, and for unknown plans.
  grpc::ClientContext late_ctx;
  v1::ReportChunksResponse late;
  EXPECT_EQ(workers_stub_->ReportChunks(&late_ctx, FinalReport(client_.fragments()[0]), &late)
                .error_code(),
            grpc::StatusCode::ABORTED);
  grpc::ClientContext unknown_ctx;
  watch.set_plan_id("p-404");
  std::unique_ptr<grpc::ClientReader<v1::PlanProgress>> none =
      coordinator_->WatchPlan(&unknown_ctx, watch);
  EXPECT_FALSE(none->Read(&p));
  EXPECT_EQ(none->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServiceTest, UploadAndDownloadStream) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  const std::string data = Floats(32, 0.5f);
  {
    grpc::ClientContext ctx;
    v1::UploadResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::TensorData>> writer = coordinator_->Upload(&ctx, &resp);
    v1::TensorData first;
    v1::TensorHeader* h = first.mutable_header();
    h->set_name("U");
    h->add_shape(8);
    h->add_shape(4);
    h->set_dtype(v1::F32);
    h->mutable_spec()->set_mesh("M");
    h->mutable_spec()->set_placements_text("S(1),S(0)");
    h->set_total_bytes(128);
    ASSERT_TRUE(writer->Write(first));
    for (size_t off = 0; off < data.size(); off += 48) {
      v1::TensorData msg;
      msg.set_data(data.substr(off, 48));
      ASSERT_TRUE(writer->Write(msg));
    }
    ASSERT_TRUE(writer->WritesDone());
    grpc::Status s = writer->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.tensor().spec(), "S(1),S(0)");
  }
  grpc::ClientContext ctx;
  v1::DownloadRequest req;
  req.set_name("U");
  std::unique_ptr<grpc::ClientReader<v1::TensorData>> reader = coordinator_->Download(&ctx, req);
  v1::TensorData msg;
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_TRUE(msg.has_header());
  EXPECT_THAT(msg.header().shape(), ElementsAre(8, 4));
  EXPECT_EQ(msg.header().dtype(), v1::F32);
  EXPECT_EQ(msg.header().total_bytes(), 128);
  std::string got;
  int messages = 0;
  while (reader->Read(&msg)) {
    EXPECT_FALSE(msg.has_header());
    EXPECT_LE(static_cast<int64_t>(msg.data().size()), kSlice);
    got += msg.data();
    ++messages;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(messages, 2);
  EXPECT_EQ(got, data);

  grpc::ClientContext missing_ctx;
  req.set_name("nope");
  std::unique_ptr<grpc::ClientReader<v1::TensorData>> missing =
      coordinator_->Download(&missing_ctx, req);
  EXPECT_FALSE(missing->Read(&msg));
  EXPECT_EQ(missing->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

// An upload whose header carries a request_id acts once: a retry of one that ended answers
// its first outcome (replayed) without taking the data or making a new version; the id with
// another header is refused. Downloads name the version they send.
TEST_F(ServiceTest, UploadsWithARequestIdActOnce) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  const std::string data = Floats(32, 0.5f);
  // Over loopback: a replay ends the call while the client still writes, which the
  // in-process transport does not report to a blocked writer.
  std::unique_ptr<v1::Coordinator::Stub> tcp = v1::Coordinator::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", tcp_port_), grpc::InsecureChannelCredentials()));
  auto upload = [&](const std::string& request_id, const std::string& placements,
                    v1::UploadResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    std::unique_ptr<grpc::ClientWriter<v1::TensorData>> writer = tcp->Upload(&ctx, resp);
    v1::TensorData first;
    v1::TensorHeader* h = first.mutable_header();
    h->set_name("U");
    h->add_shape(8);
    h->add_shape(4);
    h->set_dtype(v1::F32);
    h->mutable_spec()->set_mesh("M");
    h->mutable_spec()->set_placements_text(placements);
    h->set_total_bytes(128);
    h->set_request_id(request_id);
    // A replay may end the call after the header: later writes then fail.
    bool open = writer->Write(first);
    for (size_t off = 0; open && off < data.size(); off += 48) {
      v1::TensorData msg;
      msg.set_data(data.substr(off, 48));
      open = writer->Write(msg);
    }
    if (open) writer->WritesDone();
    return writer->Finish();
  };
  auto version = [&] {
    grpc::ClientContext ctx;
    v1::GetTensorRequest get;
    get.set_name("U");
    v1::TensorInfo info;
    EXPECT_TRUE(coordinator_->GetTensor(&ctx, get, &info).ok());
    return info.version();
  };

  v1::UploadResponse first;
  grpc::Status s = upload("up-1", "S(1),S(0)", &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(first.replayed());
  const int64_t v1 = version();
  EXPECT_EQ(first.tensor().version(), v1);
  v1::UploadResponse again;
  s = upload("up-1", "S(1),S(0)", &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(again.replayed());
  EXPECT_EQ(again.tensor().version(), v1);
  EXPECT_EQ(version(), v1);  // No second version.
  v1::UploadResponse other;
  s = upload("up-1", "S(0),S(1)", &other);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("request_id 'up-1' was already used"));
  // Without an id, or with a new one, an upload acts: a new version.
  v1::UploadResponse fresh;
  ASSERT_TRUE(upload("", "S(1),S(0)", &fresh).ok());
  EXPECT_GT(version(), v1);
  const int64_t v2 = version();
  ASSERT_TRUE(upload("up-2", "S(1),S(0)", &fresh).ok());
  EXPECT_GT(version(), v2);

  grpc::ClientContext ctx;
  v1::DownloadRequest req;
  req.set_name("U");
  std::unique_ptr<grpc::ClientReader<v1::TensorData>> reader = coordinator_->Download(&ctx, req);
  v1::TensorData msg;
  ASSERT_TRUE(reader->Read(&msg));
  EXPECT_EQ(msg.header().version(), version());
  while (reader->Read(&msg)) {
  }
  EXPECT_TRUE(reader->Finish().ok());
}

// One row of an [8, 4] f32 tensor per band: 48-byte upload messages each carry three bands
// (the fake completes writes inline), and the download sends one message per band.
class QuotaServiceTest : public ServiceTest {
 protected:
  QuotaServiceTest() : ServiceTest(kDefaultBandBytes, /*per_caller=*/1) {}
};

// One caller may hold one running plan and one watch stream here: the next is refused with
// RESOURCE_EXHAUSTED naming the flag, and the slot comes back when the plan ends.
TEST_F(QuotaServiceTest, RunningPlansAndWatchesAreBoundedPerCaller) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  v1::TensorInfo info;
  ASSERT_TRUE(CreateTensor("T", "M", "S(0),R", &info).ok());
  ASSERT_TRUE(CreateTensor("U", "M", "S(0),R", &info).ok());
  std::vector<v1::PlanFragment> sent;
  client_.SetExecuteHook(
      [&sent](const WorkerEndpoint&, const v1::PlanFragment& f) { sent.push_back(f); });
  auto start = [this](const std::string& tensor, v1::RedistributeResponse* resp) {
    grpc::ClientContext ctx;
    v1::RedistributeRequest req;
    req.set_tensor(tensor);
    req.mutable_target()->set_placements_text("R,S(1)");
    return coordinator_->Redistribute(&ctx, req, resp);
  };
  v1::RedistributeResponse first;
  ASSERT_TRUE(start("T", &first).ok());
  v1::RedistributeResponse second;
  grpc::Status refused = start("U", &second);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("holds 1 running plans, the limit per caller "
                                                 "(--max-plans-per-caller=1)"));
  {
    grpc::ClientContext ctx;
    v1::WatchPlanRequest req;
    req.set_plan_id(first.progress().plan_id());
    std::unique_ptr<grpc::ClientReader<v1::PlanProgress>> watch =
        coordinator_->WatchPlan(&ctx, req);
    v1::PlanProgress p;
    ASSERT_TRUE(watch->Read(&p));  // The first stream is open...
    grpc::ClientContext ctx2;
    std::unique_ptr<grpc::ClientReader<v1::PlanProgress>> again =
        coordinator_->WatchPlan(&ctx2, req);
    EXPECT_FALSE(again->Read(&p));
    grpc::Status s = again->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);  // ...a second is not.
    EXPECT_THAT(s.error_message(), HasSubstr("--max-watches-per-caller=1"));
    // The plan ends: the first stream ends, and both slots come back.
    for (const v1::PlanFragment& f : sent)
      ASSERT_TRUE(plans_.Report(ToReport(FinalReport(f))).ok());
    while (watch->Read(&p)) {
    }
    EXPECT_TRUE(watch->Finish().ok());
  }
  client_.SetExecuteHook([this](const WorkerEndpoint&, const v1::PlanFragment& f) {
    ASSERT_TRUE(plans_.Report(ToReport(FinalReport(f))).ok());
  });
  EXPECT_TRUE(start("U", &second).ok());
}

class BandedServiceTest : public ServiceTest {
 protected:
  BandedServiceTest() : ServiceTest(/*band_bytes=*/16) {}
};

TEST_F(BandedServiceTest, UploadAndDownloadInManyBands) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  const std::string data = Floats(32, -7.0f);
  {
    grpc::ClientContext ctx;
    v1::UploadResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::TensorData>> writer = coordinator_->Upload(&ctx, &resp);
    v1::TensorData first;
    v1::TensorHeader* h = first.mutable_header();
    h->set_name("U");
    h->add_shape(8);
    h->add_shape(4);
    h->set_dtype(v1::F32);
    h->mutable_spec()->set_mesh("M");
    h->mutable_spec()->set_placements_text("S(1),S(0)");
    ASSERT_TRUE(writer->Write(first));
    for (size_t off = 0; off < data.size(); off += 48) {
      v1::TensorData msg;
      msg.set_data(data.substr(off, 48));
      ASSERT_TRUE(writer->Write(msg));
    }
    ASSERT_TRUE(writer->WritesDone());
    grpc::Status s = writer->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  grpc::ClientContext ctx;
  v1::DownloadRequest req;
  req.set_name("U");
  std::unique_ptr<grpc::ClientReader<v1::TensorData>> reader = coordinator_->Download(&ctx, req);
  v1::TensorData msg;
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_TRUE(msg.has_header());
  std::string got;
  int messages = 0;
  while (reader->Read(&msg)) {
    EXPECT_EQ(msg.data().size(), 16u);
    got += msg.data();
    ++messages;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(messages, 8);
  EXPECT_EQ(got, data);

  // Short data: the bands written so far are dropped and the tensor keeps its version.
  const int64_t version = tensors_.Get("U")->version;
  grpc::ClientContext short_ctx;
  v1::UploadResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::TensorData>> writer =
      coordinator_->Upload(&short_ctx, &resp);
  v1::TensorData first;
  first.mutable_header()->set_name("U");
  first.mutable_header()->add_shape(8);
  first.mutable_header()->add_shape(4);
  first.mutable_header()->set_dtype(v1::F32);
  first.set_data(data.substr(0, 100));
  ASSERT_TRUE(writer->Write(first));
  ASSERT_TRUE(writer->WritesDone());
  grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), "data: 100 bytes for a [8, 4] f32 tensor of 128 bytes");
  EXPECT_EQ(tensors_.Get("U")->version, version);
  EXPECT_TRUE(tensors_.Get("U")->busy_plan.empty());
}

TEST_F(ServiceTest, MalformedUploadsAreInvalid) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {4}).ok());
  auto upload = [&](std::vector<v1::TensorData> messages) {
    grpc::ClientContext ctx;
    v1::UploadResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::TensorData>> writer = coordinator_->Upload(&ctx, &resp);
    for (const v1::TensorData& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  v1::TensorData data_only;
  data_only.set_data("abcd");
  grpc::Status s = upload({data_only});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "header: missing in the first message");

  v1::TensorData header;
  header.mutable_header()->set_name("U");
  header.mutable_header()->add_shape(4);
  header.mutable_header()->set_dtype(v1::F32);
  header.mutable_header()->mutable_spec()->set_mesh("M");
  header.mutable_header()->mutable_spec()->set_placements_text("S(0)");
  header.mutable_header()->set_total_bytes(15);
  s = upload({header});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("header.total_bytes = 15"));

  header.mutable_header()->set_total_bytes(16);
  v1::TensorData too_much;
  too_much.set_data(std::string(20, 'x'));
  s = upload({header, too_much});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::TensorData too_little;
  too_little.set_data(std::string(12, 'x'));
  s = upload({header, too_little});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("data: 12 bytes"));
  EXPECT_EQ(client_.calls("WriteChunk"), 0);
}

TEST_F(ServiceTest, PlanDryRunExplains) {
  RegisterFour();
  ASSERT_TRUE(CreateMesh("M", {2, 2}).ok());
  v1::TensorInfo info;
  ASSERT_TRUE(CreateTensor("T", "M", "S(0),R", &info).ok());
  grpc::ClientContext ctx;
  v1::PlanRequest req;
  req.set_tensor("T");
  req.mutable_target()->set_placements_text("R,S(1)");
  v1::Plan plan;
  ASSERT_TRUE(coordinator_->PlanRedistribute(&ctx, req, &plan).ok());
  EXPECT_FALSE(plan.explain().empty());
  EXPECT_TRUE(plan.id().empty());
  EXPECT_EQ(client_.calls("Execute"), 0);
}

TEST_F(ServiceTest, RendezvousStoreAndBarrier) {
  {
    grpc::ClientContext ctx;
    v1::KvSetRequest req;
    req.set_key("gloo/0");
    req.set_value("addr");
    v1::KvSetResponse resp;
    ASSERT_TRUE(workers_stub_->KvSet(&ctx, req, &resp).ok());
  }
  auto get = [&](const std::string& key, int64_t timeout_ms, std::string* value) {
    grpc::ClientContext ctx;
    v1::KvGetRequest req;
    req.set_key(key);
    req.set_timeout_ms(timeout_ms);
    v1::KvGetResponse resp;
    grpc::Status s = workers_stub_->KvGet(&ctx, req, &resp);
    *value = resp.value();
    return s;
  };
  std::string value;
  ASSERT_TRUE(get("gloo/0", 0, &value).ok());
  EXPECT_EQ(value, "addr");
  ASSERT_TRUE(get("gloo/0", 1000, &value).ok());
  EXPECT_EQ(value, "addr");
  EXPECT_EQ(get("missing", 0, &value).error_code(), grpc::StatusCode::NOT_FOUND);
  // The wait ends at its deadline (ThreadTimer, real time).
  EXPECT_EQ(get("missing", 20, &value).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(get("", 0, &value).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext ctx;
  v1::BarrierRequest barrier;
  barrier.set_key("b");
  barrier.set_participants(1);
  barrier.set_member("m");
  barrier.set_timeout_ms(1000);
  v1::BarrierResponse resp;
  EXPECT_TRUE(workers_stub_->Barrier(&ctx, barrier, &resp).ok());
}

}  // namespace
}  // namespace shardcoord
