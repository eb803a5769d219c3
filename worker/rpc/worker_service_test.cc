#include "worker/rpc/worker_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/transfer_table.h"
#include "worker/buffers/checksum.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/control/kv_client.h"
#include "worker/control/transfer_runner.h"
#include "worker/testing/gloo_test_worker.h"
#include "worker/testing/worker_core_test_util.h"

namespace shardcoord {
namespace {

// The adapter runs no plan here, so nothing is reported.
class NoReports : public ChunkReporter {
 public:
  absl::Status ReportChunks(const v1::ReportChunksRequest& /*request*/) override {
    return absl::OkStatus();
  }
};

// The gRPC adapter, over an in-process server on loopback.
class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Worker::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  InMemoryKvClient kv_;
  NoReports reporter_;
  worker_testing::GlooTestWorker worker_{&kv_, &reporter_, /*rank=*/0, /*incarnation=*/7};
  ThreadPool pool_{2};
  WorkerServiceImpl service_{&worker_.core, &pool_};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

TEST_F(WorkerServiceTest, StreamsOverGrpc) {
  // Write a 2.5 MiB buffer in pieces of at most 1 MiB.
  const int64_t n = 655360;  // f32 elements.
  RankChunks rc;
  rc.chunks.push_back(Chunk{Box({0, 0}, {640, 1024}), 0, 0});
  rc.local_elements = n;
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i);
  {
    grpc::ClientContext ctx;
    v1::WriteChunkResponse response;
    auto writer = stub_->WriteChunk(&ctx, &response);
    v1::ChunkData msg;
    msg.set_tensor("G");
    msg.set_version(1);
    msg.set_dtype(v1::F32);
    *msg.mutable_chunks() = RankChunksToProto(rc);
    msg.set_total_bytes(n * 4);
    ASSERT_TRUE(writer->Write(msg));
    const char* p = reinterpret_cast<const char*>(values.data());
    for (int64_t off = 0; off < n * 4; off += kMaxChunkMessageBytes) {
      v1::ChunkData data;
      data.set_data(std::string(p + off, std::min(kMaxChunkMessageBytes, n * 4 - off)));
      ASSERT_TRUE(writer->Write(data));
    }
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.chunks().chunks(0).checksum(), ChunkChecksum(values.data(), n * 4));
  }
  {
    grpc::ClientContext ctx;
    v1::ReadChunkRequest req;
    req.set_tensor("G");
    req.set_version(1);
    *req.mutable_box() = BoxToProto(Box({1, 0}, {639, 1024}));
    auto reader = stub_->ReadChunk(&ctx, req);
    v1::ChunkData msg;
    ASSERT_TRUE(reader->Read(&msg));
    EXPECT_EQ(msg.total_bytes(), 639 * 1024 * 4);
    EXPECT_TRUE(msg.data().empty());
    std::string data;
    int messages = 0;
    while (reader->Read(&msg)) {
      EXPECT_LE(static_cast<int64_t>(msg.data().size()), kMaxChunkMessageBytes);
      data += msg.data();
      ++messages;
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(messages, 3);
    ASSERT_EQ(static_cast<int64_t>(data.size()), 639 * 1024 * 4);
    EXPECT_EQ(std::memcmp(data.data(), values.data() + 1024, data.size()), 0);
  }
  {
    grpc::ClientContext ctx;
    v1::ReadChunkRequest req;
    req.set_tensor("nope");
    *req.mutable_box() = BoxToProto(Box({0}, {1}));
    auto reader = stub_->ReadChunk(&ctx, req);
    v1::ChunkData msg;
    EXPECT_FALSE(reader->Read(&msg));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::PlanFragment bad;
    v1::ExecuteResponse response;
    EXPECT_EQ(stub_->Execute(&ctx, bad, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    v1::FinishPlanRequest req;
    req.set_plan_id("unknown");
    v1::FinishPlanResponse response;
    EXPECT_TRUE(stub_->FinishPlan(&ctx, req, &response).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::DropTensorRequest req;
    req.set_tensor("G");
    req.set_version(-1);
    v1::DropTensorResponse response;
    EXPECT_TRUE(stub_->DropTensor(&ctx, req, &response).ok());
    EXPECT_EQ(worker_.buffers.Find("G", 1), nullptr);
  }
  {
    RankChunks small;
    small.chunks.push_back(Chunk{Box({0}, {3}), 0, 0});
    small.local_elements = 3;
    grpc::ClientContext ctx;
    const v1::FillRequest req =
        worker_testing::FillRequestFor("F", small, {3}, v1::ARANGE, v1::I64);
    v1::FillResponse response;
    ASSERT_TRUE(stub_->Fill(&ctx, req, &response).ok());
    const int64_t want[3] = {0, 1, 2};
    EXPECT_EQ(response.chunks().chunks(0).checksum(), ChunkChecksum(want, 24));
  }
}

// A prepared transfer over gRPC: pages on the pool, a run answered from its own thread, the
// commit through FinishPlan, and the drop. One rank: the run is a local copy.
TEST_F(WorkerServiceTest, PreparedTransferOverGrpc) {
  const DeviceMesh mesh = *DeviceMesh::Create({1});
  const Layout layout = *Layout::FromPlacements(mesh, {4, 6}, *ParsePlacements("S(0)"));
  for (const char* tensor : {"s", "d"}) {
    v1::FillRequest fill;
    fill.set_tensor(tensor);
    fill.set_version(tensor[0] == 's' ? 1 : 2);
    fill.set_dtype(v1::F32);
    *fill.mutable_chunks() = RankChunksToProto(*layout.Find(0));
    fill.add_global_shape(4);
    fill.add_global_shape(6);
    fill.set_init(tensor[0] == 's' ? v1::ARANGE : v1::ZEROS);
    ASSERT_TRUE(worker_.core.Fill(fill).ok());
  }
  TransferMemberSpec member;
  member.src = "s";
  member.dst = "d";
  member.src_version = 1;
  member.dst_version = 2;
  std::vector<v1::PrepareTransferRequest> pages(2);
  for (int p = 0; p < 2; ++p) {
    pages[p].set_transfer_id("t@1");
    pages[p].set_page(p);
  }
  pages[0].add_ranks(0);
  pages[0].add_incarnations(7);
  *pages[0].add_layouts() = TransferLayoutToProto(layout, false);
  pages[1].set_last(true);
  *pages[1].add_members() = TransferMemberToProto(member);
  auto prepare = [&](const v1::PrepareTransferRequest& page, v1::PrepareTransferResponse* out) {
    grpc::ClientContext ctx;
    return stub_->PrepareTransfer(&ctx, page, out);
  };
  auto run = [&](const std::string& transfer, const std::string& run_id, int64_t version,
                 v1::RunTransferWorkerResponse* out) {
    grpc::ClientContext ctx;
    v1::RunTransferWorkerRequest req;
    req.set_transfer_id(transfer);
    req.set_run_id(run_id);
    req.set_version(version);
    req.set_communicator_prefix("xfer/");
    return stub_->RunTransfer(&ctx, req, out);
  };
  v1::PrepareTransferResponse prepared;
  EXPECT_EQ(prepare(pages[1], &prepared).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(prepare(pages[0], &prepared).ok());
  EXPECT_EQ(prepared.members(), 0);  // Not the last page.
  grpc::Status s = prepare(pages[1], &prepared);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(prepared.members(), 1);
  EXPECT_EQ(prepared.target_bytes(), 4 * 6 * 4);

  v1::RunTransferWorkerResponse ran;
  s = run("t@1", "t@1/r1", 3, &ran);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::vector<float> arange(24);
  for (int i = 0; i < 24; ++i) arange[i] = static_cast<float>(i);
  StableHash digest;
  digest.Add(0);                                 // Member 0...
  digest.Add(ChunkChecksum(arange.data(), 96));  // ...and its one chunk.
  EXPECT_EQ(ran.digest(), digest.value());
  EXPECT_EQ(ran.timing().worker(), "w0");
  {
    grpc::ClientContext ctx;
    v1::FinishPlanRequest commit;
    commit.set_plan_id("t@1/r1");
    commit.set_commit(true);
    v1::FinishPlanResponse response;
    ASSERT_TRUE(stub_->FinishPlan(&ctx, commit, &response).ok());
  }
  EXPECT_EQ(worker_.buffers.Find("d", 2), nullptr);
  std::shared_ptr<HostBuffer> d = worker_.buffers.Find("d", 3);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(std::memcmp(d->data(), arange.data(), 96), 0);
  {
    grpc::ClientContext ctx;
    v1::DropTransferRequest drop;
    drop.add_transfer_ids("t@1");
    v1::DropTransferResponse response;
    ASSERT_TRUE(stub_->DropTransfer(&ctx, drop, &response).ok());
  }
  EXPECT_EQ(run("t@1", "t@1/r2", 4, &ran).error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace shardcoord
