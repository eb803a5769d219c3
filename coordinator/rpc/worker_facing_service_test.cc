// CoordinatorWorkers.AttachBuffers over an in-process channel with the real managers: the
// handler's conversions (buffers without chunks or versions answered the layout's), the codes
// and member names of refusals, and that nothing is attached after one.
#include "coordinator/rpc/worker_facing_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/timer.h"
#include "coordinator/cluster/kv_store.h"
#include "coordinator/rpc/service_test_util.h"
#include "coordinator/store/state_store.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/convert.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::StartsWith;

class AttachBuffersTest : public ::testing::Test {
 protected:
  AttachBuffersTest()
      : workers_(&clock_, absl::Minutes(10)),
        meshes_(&workers_),
        tensors_(&meshes_, &store_),
        kv_(&timer_),
        plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_, {}),
        registration_(&workers_, &tensors_),
        attach_(&workers_, &tensors_, &plans_),
        service_(&clock_, &workers_, &registration_, &kv_, &plans_, &attach_,
                 absl::Milliseconds(250)) {
    workers_.AddListener(&plans_);
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    stub_ = v1::CoordinatorWorkers::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
    for (int i = 0; i < 2; ++i) {
      grpc::ClientContext ctx;
      v1::RegisterWorkerResponse resp;
      EXPECT_TRUE(
          stub_->RegisterWorker(&ctx, TestRegisterRequest(absl::StrCat("w", i)), &resp).ok());
      incarnations_.push_back(resp.incarnation());
    }
    EXPECT_TRUE(meshes_.Create("N", {2}, {}, {}).ok());
    // Attached 8x4 f32 tensors S(0) over both ranks (16 elements each), and one of the
    // workers' own.
    for (const char* name : {"a", "b", "c", "own"}) {
      TensorRecord t;
      t.name = name;
      t.shape = {8, 4};
      t.mesh = "N";
      t.spec = "S(0)";
      t.layout = *Layout::FromPlacements(meshes_.Get("N")->mesh, t.shape, {Placement::Shard(0)});
      t.version = tensors_.NewVersion();
      t.attached = std::string(name) != "own";
      if (t.attached) t.unattached = {0, 1};
      EXPECT_TRUE(tensors_.Reserve(t, "c").ok());
      EXPECT_TRUE(tensors_.FinishCreate(name, "c", {{0}, {0}}, {}).ok());
    }
  }

  ~AttachBuffersTest() override {
    server_->Shutdown();
    timer_.Stop();
  }

  // Rank `rank`'s buffers of `names`, 64 bytes each, without versions or chunks.
  v1::AttachBuffersRequest Request(int rank, const std::vector<std::string>& names,
                                   bool validate_only = false) {
    v1::AttachBuffersRequest r;
    r.set_worker(absl::StrCat("w", rank));
    r.set_incarnation(incarnations_[rank]);
    r.set_rank(rank);
    r.set_pid(4242);
    r.set_validate_only(validate_only);
    for (const std::string& name : names) {
      v1::LentBuffer* b = r.add_buffers();
      b->set_tensor(name);
      b->set_dtype(v1::F32);
      b->set_bytes(64);
      b->set_memory("process");
    }
    return r;
  }

  grpc::Status Call(const v1::AttachBuffersRequest& req, v1::AttachBuffersResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->AttachBuffers(&ctx, req, resp);
  }

  std::vector<std::set<int64_t>> Unattached() {
    std::vector<std::set<int64_t>> out;
    for (const char* name : {"a", "b", "c"}) out.push_back(tensors_.Get(name)->unattached);
    return out;
  }

  RealClock clock_;
  ThreadTimer timer_;
  MemoryStateStore store_;
  WorkerManager workers_;
  MeshManager meshes_;
  TensorManager tensors_;
  KvStore kv_;
  FakeWorkerClient client_;
  PlanManager plans_;
  WorkerRegistration registration_;
  AttachManager attach_;
  WorkerFacingService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::CoordinatorWorkers::Stub> stub_;
  std::vector<int64_t> incarnations_;
};

TEST_F(AttachBuffersTest, ValidationAnswersTheLayoutsThenOneCallAttachesThemAll) {
  const int64_t applies = store_.applies();
  v1::AttachBuffersResponse checked;
  grpc::Status s = Call(Request(1, {"a", "b", "c"}, /*validate_only=*/true), &checked);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(checked.buffers_size(), 3);
  for (const v1::AttachedBuffer& b : checked.buffers()) {
    EXPECT_EQ(b.chunks().rank(), 1);
    EXPECT_EQ(b.chunks().local_elements(), 16);
    ASSERT_EQ(b.chunks().chunks_size(), 1);
    EXPECT_EQ(b.chunks().chunks(0).box().offset(0), 4);  // Rows 4:8.
    EXPECT_FALSE(b.readable());
  }
  EXPECT_EQ(checked.buffers(1).version(), tensors_.Get("b")->version);
  EXPECT_EQ(store_.applies(), applies);
  EXPECT_THAT(Unattached()[0], ElementsAre(0, 1));

  // The worker sends what it was answered; rank 0 then makes a and b readable.
  v1::AttachBuffersRequest commit = Request(1, {"a", "b", "c"});
  for (int i = 0; i < 3; ++i) {
    commit.mutable_buffers(i)->set_version(checked.buffers(i).version());
    *commit.mutable_buffers(i)->mutable_chunks() = checked.buffers(i).chunks();
  }
  v1::AttachBuffersResponse done;
  s = Call(commit, &done);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(store_.applies(), applies + 1);  // One durable batch for the three.
  EXPECT_THAT(Unattached(), ElementsAre(ElementsAre(0), ElementsAre(0), ElementsAre(0)));
  s = Call(Request(0, {"b", "a"}), &done);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(done.buffers_size(), 2);
  EXPECT_TRUE(done.buffers(0).readable());
  EXPECT_TRUE(done.buffers(1).readable());
  EXPECT_EQ(done.buffers(0).chunks().chunks(0).box().offset(0), 0);  // Rows 0:4.
  EXPECT_TRUE(tensors_.Get("a")->unattached.empty());
}

TEST_F(AttachBuffersTest, ARefusalNamesTheMemberAndAttachesNothing) {
  auto refused = [&](const v1::AttachBuffersRequest& req, grpc::StatusCode code,
                     const std::string& starts) {
    SCOPED_TRACE(starts);
    const int64_t applies = store_.applies();
    v1::AttachBuffersResponse resp;
    grpc::Status s = Call(req, &resp);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_THAT(s.error_message(), StartsWith(starts));
    EXPECT_EQ(resp.buffers_size(), 0);
    EXPECT_EQ(store_.applies(), applies);
    EXPECT_THAT(Unattached(), ElementsAre(ElementsAre(0, 1), ElementsAre(0, 1), ElementsAre(0, 1)));
  };
  v1::AttachBuffersRequest r = Request(0, {"a", "b", "c"});
  r.mutable_buffers(2)->set_bytes(68);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "buffers[2] 'c': bytes: the buffer has 68");
  r = Request(0, {"a", "b", "c"});
  r.mutable_buffers(1)->set_dtype(v1::I64);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "buffers[1] 'b': dtype: the buffer holds i64");
  r = Request(0, {"a", "b"});
  r.mutable_buffers(1)->mutable_chunks()->set_local_elements(-1);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "buffers[1].chunks");
  r = Request(0, {"a", "b"});
  r.mutable_buffers(1)->set_version(tensors_.Get("b")->version + 9);
  refused(r, grpc::StatusCode::ABORTED, "buffers[1] 'b': version");
  refused(Request(0, {"a", "a"}), grpc::StatusCode::INVALID_ARGUMENT,
          "buffers[1] 'a': tensor: also buffers[0]");
  refused(Request(0, {"a", "own"}), grpc::StatusCode::FAILED_PRECONDITION,
          "buffers[1] 'own': tensor 'own' is not attached");
  refused(Request(0, {"a", "gone"}), grpc::StatusCode::NOT_FOUND, "buffers[1] 'gone'");
  refused(Request(0, {}), grpc::StatusCode::INVALID_ARGUMENT, "buffers: none given");
  r = Request(0, {"a"});
  r.set_rank(1);  // w0 holds rank 0.
  refused(r, grpc::StatusCode::FAILED_PRECONDITION, "rank: worker w0 (rank 0) holds rank 0");
  r = Request(0, {"a"});
  r.set_incarnation(incarnations_[0] + 7);
  refused(r, grpc::StatusCode::ABORTED, "");
  r = Request(0, {"a"});
  r.set_worker("no such worker!");
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "");
}

}  // namespace
}  // namespace shardcoord
