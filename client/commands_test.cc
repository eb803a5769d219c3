// The online shardctl subcommands against a scripted coordinator on an in-process channel:
// what each sends, what it prints, and its exit status. ShardctlMainTest runs the whole
// command line against the same fake on a loopback port.

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/checkpoint_command.h"
#include "client/coordinator_client.h"
#include "client/mesh_command.h"
#include "client/npy.h"
#include "client/plan_command.h"
#include "client/shardctl_app.h"
#include "client/shardctl_test_util.h"
#include "client/tensor_command.h"
#include "client/version.h"
#include "client/workers_command.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status CreateMesh(grpc::ServerContext*, const v1::CreateMeshRequest* request,
                          v1::MeshInfo* response) override {
    absl::MutexLock lock(&mu_);
    create_mesh_ = *request;
    response->set_name(request->name());
    *response->mutable_shape() = request->shape();
    for (int i = 0; i < 4; ++i) {
      response->add_ranks(i);
      response->add_workers("w" + std::to_string(i));
    }
    return grpc::Status::OK;
  }

  grpc::Status CreateTensors(grpc::ServerContext*, const v1::CreateTensorsRequest* request,
                             v1::CreateTensorsResponse* response) override {
    absl::MutexLock lock(&mu_);
    create_tensors_ = *request;
    response->set_created(request->tensors_size());
    response->set_bytes(128 * request->tensors_size());
    return grpc::Status::OK;
  }

  grpc::Status DeleteTensors(grpc::ServerContext*, const v1::DeleteTensorsRequest* request,
                             v1::DeleteTensorsResponse* response) override {
    absl::MutexLock lock(&mu_);
    delete_tensors_ = *request;
    response->set_deleted(request->names_size() + (request->prefix().empty() ? 0 : 10));
    return grpc::Status::OK;
  }

  // 2,345 tensors named "t0000".."t2344", in pages of 1,000.
  grpc::Status ListTensors(grpc::ServerContext*, const v1::ListTensorsRequest* request,
                           v1::ListTensorsResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++list_calls_;
    int start = 0;
    if (!request->page_token().empty()) start = std::stoi(request->page_token().substr(1)) + 1;
    int added = 0;
    for (int i = start; i < 2345; ++i) {
      const std::string name = absl::StrFormat("t%04d", i);
      if (!absl::StartsWith(name, request->prefix())) continue;
      if (added == 1000) {
        response->set_next_page_token(response->tensors().rbegin()->name());
        break;
      }
      response->add_tensors()->set_name(name);
      ++added;
    }
    return grpc::Status::OK;
  }

  grpc::Status CreateTensor(grpc::ServerContext*, const v1::CreateTensorRequest* request,
                            v1::TensorInfo* response) override {
    absl::MutexLock lock(&mu_);
    create_tensor_ = *request;
    response->set_name(request->name());
    *response->mutable_shape() = request->shape();
    response->set_dtype(request->dtype());
    response->set_mesh(request->spec().mesh());
    response->set_spec(request->spec().placements_text());
    response->set_bytes(64 * 48 * 4);
    return grpc::Status::OK;
  }

  grpc::Status GetTensor(grpc::ServerContext* context, const v1::GetTensorRequest* request,
                         v1::TensorInfo*) override {
    absl::MutexLock lock(&mu_);
    auto it = context->client_metadata().find("authorization");
    authorization_ = it == context->client_metadata().end()
                         ? "(none)"
                         : std::string(it->second.data(), it->second.size());
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "tensor '" + request->name() + "' does not exist");
  }

  grpc::Status Redistribute(grpc::ServerContext*, const v1::RedistributeRequest* request,
                            v1::RedistributeResponse* response) override {
    absl::MutexLock lock(&mu_);
    redistribute_ = *request;
    FillResponse(request->tensor(), request->wait(), response);
    return grpc::Status::OK;
  }

  grpc::Status Gather(grpc::ServerContext*, const v1::GatherRequest* request,
                      v1::RedistributeResponse* response) override {
    absl::MutexLock lock(&mu_);
    gather_ = *request;
    FillResponse(request->tensor(), request->wait(), response);
    return grpc::Status::OK;
  }

  // A DeepSeek-V3-style FP8 checkpoint: w (f8_e4m3) with its block scales, an unscaled f8
  // entry, and a bf16 norm.
  grpc::Status InspectCheckpoint(grpc::ServerContext*, const v1::InspectCheckpointRequest* request,
                                 v1::InspectCheckpointResponse* response) override {
    response->set_dir(request->dir());
    response->set_plain(true);
    auto add = [&](const std::string& name, v1::DType dtype, std::vector<int64_t> shape) {
      v1::CheckpointTensorInfo* t = response->add_tensors();
      t->set_name(name);
      t->set_dtype(dtype);
      for (int64_t d : shape) t->add_shape(d);
      t->add_pieces();
    };
    add("layers.0.w", v1::F8_E4M3, {300, 260});
    add("layers.0.w_scale_inv", v1::F32, {3, 3});
    add("layers.0.raw", v1::F8_E5M2, {4, 4});
    add("layers.0.norm", v1::BF16, {300});
    return grpc::Status::OK;
  }

  grpc::Status Copy(grpc::ServerContext*, const v1::CopyRequest* request,
                    v1::CopyResponse* response) override {
    absl::MutexLock lock(&mu_);
    copy_ = *request;
    v1::RedistributeResponse r;
    FillResponse(request->dst(), request->wait(), &r);
    *response->mutable_progress() = r.progress();
    *response->mutable_plan() = r.plan();
    response->set_dst_version(7);
    if (!request->scale().empty()) {
      v1::BlockCopyInfo* b = response->mutable_block_copy();
      b->set_scale_version(8);
      b->set_blocks(9);
      b->set_cut_blocks(6);
      b->set_staged_bytes(1024);
      b->set_bytes_moved(4096);
      b->add_staging("rank 0: 3 blocks in 1 boxes");
    }
    return grpc::Status::OK;
  }

  grpc::Status CopyGroup(grpc::ServerContext*, const v1::CopyGroupRequest* request,
                         v1::CopyGroupResponse* response) override {
    absl::MutexLock lock(&mu_);
    copy_group_ = *request;
    if (abort_) return grpc::Status(grpc::StatusCode::ABORTED, "group g-1 aborted: copies[1]");
    response->set_group_id("g-1");
    response->set_state(v1::COMMITTED);
    response->set_bytes_moved(8192);
    response->set_lower_bound_bytes(8192);
    response->set_buckets(3);
    response->set_bucket_bytes(int64_t{64} << 20);
    int64_t version = 7;
    for (const v1::CopyPair& c : request->copies()) {
      v1::CopyGroupMember* m = response->add_members();
      m->set_src(c.src());
      m->set_dst(c.dst());
      m->set_dst_version(version++);
      m->mutable_progress()->set_plan_id(absl::StrCat("p", version));
      m->mutable_progress()->set_state(v1::COMMITTED);
      m->mutable_plan()->set_bytes_moved(4096);
      m->mutable_plan()->set_lower_bound_bytes(4096);
    }
    return grpc::Status::OK;
  }

  grpc::Status RedistributeGroup(grpc::ServerContext*, const v1::RedistributeGroupRequest* request,
                                 v1::RedistributeGroupResponse* response) override {
    absl::MutexLock lock(&mu_);
    redistribute_group_ = *request;
    response->set_group_id("g-2");
    response->set_state(v1::COMMITTED);
    response->set_bytes_moved(4096);
    response->set_lower_bound_bytes(4096);
    int64_t version = 20;
    for (const v1::RedistributeItem& r : request->redistributes()) {
      v1::RedistributeGroupMember* m = response->add_members();
      m->set_tensor(r.tensor());
      m->set_version(version++);
      m->mutable_progress()->set_plan_id(absl::StrCat("p", version));
      m->mutable_progress()->set_state(v1::COMMITTED);
    }
    return grpc::Status::OK;
  }

  grpc::Status GatherGroup(grpc::ServerContext*, const v1::GatherGroupRequest* request,
                           v1::RedistributeGroupResponse* response) override {
    absl::MutexLock lock(&mu_);
    gather_group_ = *request;
    response->set_group_id("g-3");
    response->set_state(v1::COMMITTED);
    response->set_seconds(0.25);
    response->set_bytes_moved(12288);
    response->set_lower_bound_bytes(12288);
    response->set_buckets(1);
    response->set_bucket_bytes(int64_t{1} << 20);
    int64_t version = 30;
    for (const std::string& t : request->tensors()) {
      v1::RedistributeGroupMember* m = response->add_members();
      m->set_tensor(t);
      m->set_version(version++);
      m->mutable_progress()->set_plan_id(absl::StrCat("p", version));
      m->mutable_progress()->set_state(v1::COMMITTED);
    }
    return grpc::Status::OK;
  }

  grpc::Status WatchPlan(grpc::ServerContext*, const v1::WatchPlanRequest* request,
                         grpc::ServerWriter<v1::PlanProgress>* writer) override {
    for (int64_t done : {0, 2048, 4096}) {
      v1::PlanProgress p;
      p.set_plan_id(request->plan_id());
      p.set_bytes_done(done);
      p.set_bytes_total(4096);
      p.set_state(done < 4096 ? v1::PREPARED : abort_ ? v1::ABORTED : v1::COMMITTED);
      if (done == 4096 && abort_) p.set_error("worker w3 (rank 3) died in step 0");
      writer->Write(p);
    }
    return grpc::Status::OK;
  }

  grpc::Status PlanRedistribute(grpc::ServerContext*, const v1::PlanRequest* request,
                                v1::Plan* response) override {
    response->set_tensor(request->tensor());
    response->set_bytes_moved(96);
    response->set_lower_bound_bytes(96);
    v1::Step* s = response->add_steps();
    s->set_op(v1::ALL_TO_ALL);
    s->add_ranks(0);
    s->add_ranks(1);
    s->set_bytes(96);
    response->set_explain("the coordinator's explanation\n");
    return grpc::Status::OK;
  }

  grpc::Status Upload(grpc::ServerContext*, grpc::ServerReader<v1::TensorData>* reader,
                      v1::UploadResponse* response) override {
    absl::MutexLock lock(&mu_);
    v1::TensorData m;
    bool first = true;
    upload_data_.clear();
    while (reader->Read(&m)) {
      if (first) upload_header_ = m.header();
      first = false;
      upload_data_ += m.data();
    }
    response->mutable_tensor()->set_name(upload_header_.name());
    *response->mutable_tensor()->mutable_shape() = upload_header_.shape();
    response->mutable_tensor()->set_dtype(upload_header_.dtype());
    response->mutable_tensor()->set_bytes(static_cast<int64_t>(upload_data_.size()));
    return grpc::Status::OK;
  }

  grpc::Status Download(grpc::ServerContext*, const v1::DownloadRequest* request,
                        grpc::ServerWriter<v1::TensorData>* writer) override {
    v1::TensorData first;
    first.mutable_header()->set_name(request->name());
    first.mutable_header()->add_shape(2);
    first.mutable_header()->add_shape(3);
    first.mutable_header()->set_dtype(download_dtype_);
    const std::string data = DownloadData();
    first.mutable_header()->set_total_bytes(static_cast<int64_t>(data.size()));
    writer->Write(first);
    v1::TensorData m;
    m.set_data(data);
    writer->Write(m);
    return grpc::Status::OK;
  }

  // f32 0..5, bf16 bits 0..5, or f8_e4m3 bits 0x30..0x35.
  std::string DownloadData() const {
    std::string out;
    for (int i = 0; i < 6; ++i) {
      if (download_dtype_ == v1::F8_E4M3) {
        out.push_back(static_cast<char>(0x30 + i));
      } else if (download_dtype_ == v1::BF16) {
        const uint16_t v = static_cast<uint16_t>(i);
        out.append(reinterpret_cast<const char*>(&v), 2);
      } else {
        const float v = static_cast<float>(i);
        out.append(reinterpret_cast<const char*>(&v), 4);
      }
    }
    return out;
  }

  absl::Mutex mu_;
  v1::CreateMeshRequest create_mesh_;
  v1::CreateTensorRequest create_tensor_;
  v1::CreateTensorsRequest create_tensors_;
  v1::DeleteTensorsRequest delete_tensors_;
  int list_calls_ = 0;
  v1::RedistributeRequest redistribute_;
  v1::GatherRequest gather_;
  v1::CopyRequest copy_;
  v1::CopyGroupRequest copy_group_;
  v1::GatherGroupRequest gather_group_;
  v1::RedistributeGroupRequest redistribute_group_;
  v1::TensorHeader upload_header_;
  std::string upload_data_;
  bool abort_ = false;  // Plans end ABORTED.
  v1::DType download_dtype_ = v1::F32;
  std::string authorization_;  // GetTensor's authorization metadata, "(none)" without.

 private:
  void FillResponse(const std::string& tensor, bool wait, v1::RedistributeResponse* response) {
    v1::PlanProgress* p = response->mutable_progress();
    p->set_plan_id("p1");
    p->set_tensor(tensor);
    p->set_bytes_total(4096);
    if (wait) {
      p->set_bytes_done(4096);
      p->set_state(abort_ ? v1::ABORTED : v1::COMMITTED);
      if (abort_) p->set_error("worker w3 (rank 3) died in step 0");
    } else {
      p->set_state(v1::PENDING);
    }
    response->mutable_plan()->set_bytes_moved(4096);
    response->mutable_plan()->set_lower_bound_bytes(4096);
  }
};

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<CoordinatorClient>(
        server_->InProcessChannel(grpc::ChannelArguments()), "in-process");
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = tmp != nullptr ? tmp : "/tmp";
  }
  void TearDown() override { server_->Shutdown(); }

  FakeCoordinator fake_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorClient> client_;
  std::string dir_;
  std::ostringstream out_, err_;
};

TEST_F(CommandsTest, MeshCreateSendsShapeDimsAndWorkers) {
  MeshCreateFlags flags;
  flags.name = "m";
  flags.shape = "2x2";
  flags.dims = "dp,tp";
  ASSERT_EQ(RunMeshCreateCommand(*client_, flags, false, out_, err_), 0) << err_.str();
  EXPECT_THAT(fake_.create_mesh_.shape(), ElementsAre(2, 2));
  EXPECT_THAT(fake_.create_mesh_.dim_names(), ElementsAre("dp", "tp"));
  EXPECT_TRUE(fake_.create_mesh_.workers().empty());  // "all"
  EXPECT_THAT(out_.str(), HasSubstr("w0 (0)  w1 (1)"));
  flags.workers = "w3,w2,w1,w0";
  ASSERT_EQ(RunMeshCreateCommand(*client_, flags, true, out_, err_), 0) << err_.str();
  EXPECT_THAT(fake_.create_mesh_.workers(), ElementsAre("w3", "w2", "w1", "w0"));
  flags.workers = "w3,w2";
  EXPECT_EQ(RunMeshCreateCommand(*client_, flags, false, out_, err_), 2);
  EXPECT_THAT(err_.str(),
              HasSubstr("shardctl mesh create: --workers: 2 workers for a mesh of 4 positions"));
}

TEST_F(CommandsTest, CheckpointInspectPairsFP8EntriesWithTheirScales) {
  ASSERT_EQ(RunCheckpointInspectCommand(*client_, "/ckpt", false, out_, err_), 0) << err_.str();
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("scale"));
  EXPECT_THAT(out, HasSubstr("layers.0.w_scale_inv (blocks of 100x87)"));
  EXPECT_THAT(out, HasSubstr("scale of layers.0.w"));
  EXPECT_THAT(out, HasSubstr("f8_e5m2"));
  EXPECT_THAT(out, HasSubstr("none"));
  EXPECT_THAT(out, HasSubstr("1 FP8 entry with block scales (_scale_inv"));
}

TEST_F(CommandsTest, TensorCreateSendsTheSpecAsText) {
  TensorCreateFlags flags;
  flags.name = "t";
  flags.mesh = "m";
  flags.shape = "64,48";
  flags.placements = "Shard(0), Replicate";
  flags.init = "arange";
  flags.seed = 7;
  ASSERT_EQ(RunTensorCreateCommand(*client_, flags, false, out_, err_), 0) << err_.str();
  const v1::CreateTensorRequest& r = fake_.create_tensor_;
  EXPECT_EQ(r.name(), "t");
  EXPECT_THAT(r.shape(), ElementsAre(64, 48));
  EXPECT_EQ(r.dtype(), v1::F32);
  EXPECT_EQ(r.spec().mesh(), "m");
  EXPECT_EQ(r.spec().placements_text(), "S(0),R");  // Normalised.
  EXPECT_EQ(r.spec().placements_size(), 0);         // Only one form is sent.
  EXPECT_EQ(r.init(), v1::ARANGE);
  EXPECT_EQ(r.seed(), 7u);
  EXPECT_EQ(out_.str(), "created tensor t  [64, 48] f32  S(0),R on mesh m  12.0 KiB  version 0\n");
}

TEST_F(CommandsTest, ServerErrorsAreOneLineAndExitOne) {
  EXPECT_EQ(RunTensorShowCommand(*client_, "x", false, out_, err_), 1);
  EXPECT_EQ(err_.str(), "shardctl: NOT_FOUND: tensor 'x' does not exist\n");
  EXPECT_EQ(out_.str(), "");
}

TEST_F(CommandsTest, RedistributeWaitsWithoutATerminal) {
  RedistributeFlags flags;
  flags.name = "t";
  flags.mesh = "m2";
  flags.placements = "R,S(1)";
  ASSERT_EQ(RunRedistributeCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  EXPECT_TRUE(fake_.redistribute_.wait());
  EXPECT_EQ(fake_.redistribute_.target().mesh(), "m2");
  EXPECT_EQ(fake_.redistribute_.target().placements_text(), "R,S(1)");
  EXPECT_THAT(out_.str(), StartsWith("redistributed 't': plan p1 COMMITTED\n"));
  EXPECT_EQ(err_.str(), "");  // No progress bar.
}

TEST_F(CommandsTest, RedistributeWatchesWithAProgressBar) {
  RedistributeFlags flags;
  flags.name = "t";
  flags.flat = "0:10;10:20";
  ASSERT_EQ(RunRedistributeCommand(*client_, flags, true, true, out_, err_), 0) << err_.str();
  EXPECT_FALSE(fake_.redistribute_.wait());
  EXPECT_EQ(fake_.redistribute_.target().flat_text(), "0:10;10:20");
  EXPECT_THAT(err_.str(), HasSubstr("\rredistribute t ["));
  EXPECT_THAT(err_.str(), HasSubstr("100%  4.0 KiB / 4.0 KiB\n"));
  EXPECT_THAT(out_.str(), HasSubstr("\"state\": \"COMMITTED\""));
}

TEST_F(CommandsTest, AbortedPlanIsAnError) {
  fake_.abort_ = true;
  RedistributeFlags flags;
  flags.name = "t";
  flags.placements = "S(1)";
  for (bool progress : {false, true}) {
    err_.str("");
    EXPECT_EQ(RunRedistributeCommand(*client_, flags, false, progress, out_, err_), 1);
    EXPECT_THAT(err_.str(), HasSubstr("shardctl: ABORTED: worker w3 (rank 3) died in step 0\n"));
  }
  EXPECT_EQ(out_.str(), "");
}

TEST_F(CommandsTest, CopyWithSlicesSendsTheBoxesAndWaits) {
  CopyFlags flags;
  flags.src = "k";
  flags.dst = "qkv";
  flags.dst_offset = "4096,0";
  // With --progress too: a slice copy has no plan to follow, so the call waits.
  ASSERT_EQ(RunCopyCommand(*client_, flags, false, true, out_, err_), 0) << err_.str();
  EXPECT_TRUE(fake_.copy_.wait());
  EXPECT_THAT(fake_.copy_.dst_offset(), ElementsAre(4096, 0));
  EXPECT_TRUE(fake_.copy_.src_offset().empty());
  EXPECT_THAT(out_.str(), HasSubstr("qkv is now version 7"));
  flags = CopyFlags{};
  flags.src = "qkv";
  flags.dst = "k";
  flags.src_offset = "4096,0";
  flags.src_shape = "1024,4096";
  ASSERT_EQ(RunCopyCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  EXPECT_THAT(fake_.copy_.src_offset(), ElementsAre(4096, 0));
  EXPECT_THAT(fake_.copy_.src_shape(), ElementsAre(1024, 4096));
  EXPECT_TRUE(fake_.copy_.dst_offset().empty());
  flags.src_shape = "1024,x";
  EXPECT_EQ(RunCopyCommand(*client_, flags, false, false, out_, err_), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--src-shape: '1024,x' is not a comma-separated list"));

  absl::StatusOr<v1::CopyGroupRequest> group = ParseCopiesJson(
      R"({"copies": [{"src": "q", "dst": "qkv", "dst_offset": [0, 0]},
                     {"src": "qkv", "dst": "k", "src_offset": [64, 0], "src_shape": [16, 32]}]})");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_THAT(group->copies(0).dst_offset(), ElementsAre(0, 0));
  EXPECT_THAT(group->copies(1).src_offset(), ElementsAre(64, 0));
  EXPECT_THAT(group->copies(1).src_shape(), ElementsAre(16, 32));
}

TEST_F(CommandsTest, CopyPrintsThePlanAndDstsNewVersion) {
  CopyFlags flags;
  flags.src = "a";
  flags.dst = "b";
  ASSERT_EQ(RunCopyCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  EXPECT_TRUE(fake_.copy_.wait());
  EXPECT_EQ(fake_.copy_.src(), "a");
  EXPECT_EQ(fake_.copy_.dst(), "b");
  EXPECT_EQ(out_.str(),
            "copied 'a' into 'b': plan p1 COMMITTED\n"
            "  4.0 KiB moved (lower bound 4.0 KiB), 0 steps\n"
            "  b is now version 7\n");
  out_.str("");
  // --json, following the plan with a progress bar.
  ASSERT_EQ(RunCopyCommand(*client_, flags, true, true, out_, err_), 0) << err_.str();
  EXPECT_FALSE(fake_.copy_.wait());
  EXPECT_THAT(err_.str(), HasSubstr("\rcopy a -> b ["));
  EXPECT_THAT(out_.str(), StartsWith("{\"src\": \"a\", \"dst\": \"b\", \"dst_version\": 7, "
                                     "\"plan_id\": \"p1\", "));
  EXPECT_THAT(out_.str(), HasSubstr("\"state\": \"COMMITTED\""));
  out_.str("");
  err_.str("");
  fake_.abort_ = true;
  EXPECT_EQ(RunCopyCommand(*client_, flags, false, false, out_, err_), 1);
  EXPECT_THAT(err_.str(), HasSubstr("shardctl: ABORTED: worker w3 (rank 3) died in step 0\n"));
  EXPECT_EQ(out_.str(), "");
}

TEST_F(CommandsTest, BlockCopySendsQuantizeAndPrintsWhereBlocksWereMadeWhole) {
  CopyFlags flags;
  flags.src = "w";
  flags.dst = "q";
  flags.quantize = "block:128x128";
  flags.scale = "s";
  ASSERT_EQ(RunCopyCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  EXPECT_TRUE(fake_.copy_.wait());
  EXPECT_EQ(fake_.copy_.quantize(), "block:128x128");
  EXPECT_FALSE(fake_.copy_.dequantize());
  EXPECT_EQ(fake_.copy_.scale(), "s");
  EXPECT_EQ(out_.str(),
            "quantized w -> q (version 7), scales s (version 8)\n"
            "  blocks: 9, cut across source ranks: 6, staged: 1024 bytes, moved in all: 4096 "
            "bytes\n"
            "  made whole on rank 0: 3 blocks in 1 boxes\n");
  out_.str("");
  flags.quantize.clear();
  flags.dequantize = true;
  ASSERT_EQ(RunCopyCommand(*client_, flags, true, false, out_, err_), 0) << err_.str();
  EXPECT_TRUE(fake_.copy_.dequantize());
  EXPECT_THAT(out_.str(), HasSubstr("\"dst_version\": 7, \"scale_version\": 8, \"blocks\": 9, "
                                    "\"cut_blocks\": 6, \"staged_bytes\": 1024, "
                                    "\"bytes_moved\": 4096}"));
}

TEST_F(CommandsTest, CopyFromFileRunsOneGroup) {
  const std::string path = dir_ + "/copies.json";
  {
    std::ofstream f(path);
    f << R"({"copies": [{"src": "a", "dst": "a_infer"}, {"src": "b", "dst": "b_infer"}]})";
  }
  CopyFlags flags;
  flags.from_file = path;
  ASSERT_EQ(RunCopyCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  EXPECT_TRUE(fake_.copy_group_.wait());
  ASSERT_EQ(fake_.copy_group_.copies_size(), 2);
  EXPECT_EQ(fake_.copy_group_.copies(1).src(), "b");
  EXPECT_EQ(fake_.copy_group_.copies(1).dst(), "b_infer");
  EXPECT_EQ(out_.str(),
            "copied 2 tensors as group g-1: COMMITTED\n"
            "  8.0 KiB moved (lower bound 8.0 KiB) in 3 buckets of at most 64.0 MiB\n"
            "  a -> a_infer: version 7 (plan p8)\n"
            "  b -> b_infer: version 8 (plan p9)\n");
  out_.str("");
  ASSERT_EQ(RunCopyCommand(*client_, flags, true, false, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(),
            "{\"group_id\": \"g-1\", \"state\": \"COMMITTED\", \"seconds\": 0.0, \"tensors\": 2, "
            "\"bytes_moved\": 8192, \"lower_bound_bytes\": 8192, \"buckets\": 3, "
            "\"bucket_bytes\": 67108864, \"members\": [{\"src\": \"a\", "
            "\"dst\": \"a_infer\", \"dst_version\": 7, \"plan_id\": \"p8\", \"state\": "
            "\"COMMITTED\", \"bytes_moved\": 4096, \"lower_bound_bytes\": 4096}, {\"src\": \"b\", "
            "\"dst\": \"b_infer\", \"dst_version\": 8, \"plan_id\": \"p9\", \"state\": "
            "\"COMMITTED\", \"bytes_moved\": 4096, \"lower_bound_bytes\": 4096}]}\n");
  out_.str("");
  fake_.abort_ = true;
  EXPECT_EQ(RunCopyCommand(*client_, flags, false, false, out_, err_), 1);
  EXPECT_THAT(err_.str(), HasSubstr("ABORTED: group g-1 aborted: copies[1]"));
  EXPECT_EQ(out_.str(), "");
}

TEST_F(CommandsTest, CopyFlagsAndCopiesFilesAreChecked) {
  CopyFlags flags;
  flags.src = "a";
  EXPECT_EQ(RunCopyCommand(*client_, flags, false, false, out_, err_), 2);
  EXPECT_THAT(err_.str(), HasSubstr("SRC and DST are required (or --from-file)"));
  flags.dst = "b";
  flags.from_file = dir_ + "/none.json";
  EXPECT_EQ(RunCopyCommand(*client_, flags, false, false, out_, err_), 2);
  EXPECT_THAT(err_.str(), HasSubstr("not both"));
  flags = CopyFlags{};
  flags.from_file = dir_ + "/none.json";
  EXPECT_EQ(RunCopyCommand(*client_, flags, false, false, out_, err_), 2);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read"));

  EXPECT_TRUE(ParseCopiesJson(R"({"copies": [{"src": "a", "dst": "b"}]})").ok());
  EXPECT_EQ(ParseCopiesJson("{}").status().message(), "\"copies\": empty");
  EXPECT_EQ(ParseCopiesJson("[1]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCopiesJson(R"({"copies": [{"src": "a", "dest": "b"}]})").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_.copy_group_.copies_size(), 0);
}

TEST_F(CommandsTest, TensorCreateFromFileIsOneCall) {
  const std::string path = dir_ + "/tensors.json";
  {
    std::ofstream f(path);
    f << R"json({"tensors": [
      {"name": "a", "shape": [64, 48], "dtype": "bf16", "mesh": "m", "placements": "S(0),R",
       "init": "arange"},
      {"name": "b", "shape": [8], "mesh": "m", "flat": "0:4;4:8", "init": "attached", "seed": 3}]})json";
  }
  ASSERT_EQ(RunTensorCreateManyCommand(*client_, path, true, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), "{\"created\": 2, \"bytes\": 256}\n");
  ASSERT_EQ(fake_.create_tensors_.tensors_size(), 2);
  const v1::CreateTensorRequest& a = fake_.create_tensors_.tensors(0);
  EXPECT_EQ(a.dtype(), v1::BF16);
  EXPECT_EQ(a.spec().placements_text(), "S(0),R");
  EXPECT_EQ(a.init(), v1::ARANGE);
  EXPECT_EQ(a.shape_size(), 2);
  const v1::CreateTensorRequest& b = fake_.create_tensors_.tensors(1);
  EXPECT_EQ(b.dtype(), v1::F32);
  EXPECT_EQ(b.spec().flat_text(), "0:4;4:8");
  EXPECT_EQ((std::make_pair(b.init(), b.seed())), (std::make_pair(v1::ATTACHED, uint64_t{3})));
  EXPECT_FALSE(fake_.create_tensors_.request_id().empty());

  EXPECT_EQ(ParseTensorsJson(R"({"tensors": []})").status().message(), "\"tensors\": empty");
  EXPECT_EQ(ParseTensorsJson(R"json({"tensors": [{"name": "a", "shape": [4], "mesh": "m",
      "placements": "R"}, {"name": "b", "shape": [4], "mesh": "m", "placements": "S(x)"}]})json")
                .status()
                .message()
                .substr(0, 27),
            "tensors[1] 'b': placements:");
  EXPECT_EQ(ParseTensorsJson(R"({"tensors": [{"name": "a", "shape": [4.5]}]})").status().message(),
            "tensors[0].shape: every dim must be a whole number >= 0");
  EXPECT_THAT(
      std::string(
          ParseTensorsJson(R"({"tensors": [{"name": "a", "shap": [4]}]})").status().message()),
      HasSubstr("tensors[0].shap: unknown key"));
}

TEST_F(CommandsTest, TensorDeleteManyAndListEveryPage) {
  ASSERT_EQ(RunTensorDeleteManyCommand(*client_, {"a", "b"}, "layers.", false, out_, err_), 0)
      << err_.str();
  EXPECT_EQ(out_.str(), "deleted 12 tensors\n");
  EXPECT_EQ(fake_.delete_tensors_.names_size(), 2);
  EXPECT_EQ(fake_.delete_tensors_.prefix(), "layers.");
  EXPECT_EQ(RunTensorDeleteManyCommand(*client_, {}, "", false, out_, err_), 2);

  absl::StatusOr<std::vector<v1::TensorInfo>> all = client_->ListTensors();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 2345u);
  EXPECT_EQ(all->back().name(), "t2344");
  EXPECT_EQ(fake_.list_calls_, 3);
  absl::StatusOr<std::vector<v1::TensorInfo>> some = client_->ListTensors("t12");
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(some->size(), 100u);  // t1200..t1299
}

TEST_F(CommandsTest, RedistributeManyFromFileRunsOneGroup) {
  const std::string path = dir_ + "/moves.json";
  {
    std::ofstream f(path);
    f << R"json({"redistributes": [{"tensor": "a", "target": {"mesh": "m", "placements_text": "S(1)"}},
             {"tensor": "b", "target": {"flat_text": "0:4;4:8"}}]})json";
  }
  ASSERT_EQ(RunRedistributeManyCommand(*client_, path, false, out_, err_), 0) << err_.str();
  EXPECT_TRUE(fake_.redistribute_group_.wait());
  ASSERT_EQ(fake_.redistribute_group_.redistributes_size(), 2);
  EXPECT_EQ(fake_.redistribute_group_.redistributes(0).target().mesh(), "m");
  EXPECT_EQ(fake_.redistribute_group_.redistributes(0).target().placements_text(), "S(1)");
  EXPECT_EQ(fake_.redistribute_group_.redistributes(1).target().flat_text(), "0:4;4:8");
  EXPECT_EQ(out_.str(),
            "redistributed 2 tensors as group g-2: COMMITTED\n"
            "  4.0 KiB moved (lower bound 4.0 KiB)\n"
            "  a: version 20 (plan p21)\n"
            "  b: version 21 (plan p22)\n");
  out_.str("");
  ASSERT_EQ(RunRedistributeManyCommand(*client_, path, true, out_, err_), 0) << err_.str();
  EXPECT_THAT(out_.str(), StartsWith("{\"group_id\": \"g-2\", \"state\": \"COMMITTED\", "));
  EXPECT_THAT(out_.str(), HasSubstr("{\"tensor\": \"b\", \"version\": 21, \"plan_id\": \"p22\""));
  EXPECT_EQ(RunRedistributeManyCommand(*client_, dir_ + "/none.json", false, out_, err_), 2);
  EXPECT_EQ(ParseRedistributesJson("{}").status().message(), "\"redistributes\": empty");
  EXPECT_EQ(ParseRedistributesJson(R"({"redistributes": [{"name": "a"}]})").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The issue's moves.json: {"moves": [{"tensor", "mesh", "placements" | "flat"}]}.
TEST(ParseRedistributesJsonTest, MovesFile) {
  absl::StatusOr<v1::RedistributeGroupRequest> r = ParseRedistributesJson(
      R"j({"moves": [{"tensor": "a", "mesh": "m4", "placements": "S(0)"},
                    {"tensor": "b", "flat": "0:4;4:8;;"}]})j");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->redistributes_size(), 2);
  EXPECT_EQ(r->redistributes(0).tensor(), "a");
  EXPECT_EQ(r->redistributes(0).target().mesh(), "m4");
  EXPECT_EQ(r->redistributes(0).target().placements_text(), "S(0)");
  EXPECT_EQ(r->redistributes(1).target().mesh(), "");
  EXPECT_EQ(r->redistributes(1).target().flat_text(), "0:4;4:8;;");
  EXPECT_TRUE(r->wait());
  EXPECT_EQ(ParseRedistributesJson(R"j({"moves": []})j").status().message(), "\"moves\": empty");
  EXPECT_EQ(ParseRedistributesJson(R"j({"moves": [{"tensor": "a"}]})j").status().message(),
            "moves[0]: give exactly one of \"placements\" and \"flat\"");
  EXPECT_EQ(
      ParseRedistributesJson(R"j({"moves": [{"tensor": "a", "spec": "R"}]})j").status().message(),
      "moves[0]: unknown key \"spec\" (tensor, mesh, placements or flat)");
  EXPECT_EQ(ParseRedistributesJson(R"j({"moves": [{"mesh": "m", "placements": "R"}]})j")
                .status()
                .message(),
            "moves[0].tensor: missing");
}

TEST_F(CommandsTest, GatherToOneRank) {
  GatherFlags flags;
  flags.name = "t";
  flags.to_rank = 2;
  ASSERT_EQ(RunGatherCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  EXPECT_TRUE(fake_.gather_.has_to_rank());
  EXPECT_EQ(fake_.gather_.to_rank(), 2);
  EXPECT_THAT(out_.str(), StartsWith("gathered 't'"));
  flags.to_rank.reset();
  flags.mesh = "m";
  ASSERT_EQ(RunGatherCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  EXPECT_FALSE(fake_.gather_.has_to_rank());
  EXPECT_EQ(fake_.gather_.mesh(), "m");
}

TEST_F(CommandsTest, GatherOfSeveralTensorsIsOneGroup) {
  GatherFlags flags;
  flags.name = "a";
  flags.more = {"b", "c"};
  flags.to_rank = 1;
  ASSERT_EQ(RunGatherCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  ASSERT_EQ(fake_.gather_group_.tensors_size(), 3);
  EXPECT_EQ(fake_.gather_group_.tensors(2), "c");
  EXPECT_TRUE(fake_.gather_group_.has_to_rank());
  EXPECT_EQ(fake_.gather_group_.to_rank(), 1);
  EXPECT_TRUE(fake_.gather_group_.wait());
  EXPECT_EQ(out_.str(),
            "gathered 3 tensors as group g-3: COMMITTED in 0.250 s\n"
            "  12.0 KiB moved (lower bound 12.0 KiB) in 1 bucket of at most 1.00 MiB\n"
            "  a: version 30 (plan p31)\n"
            "  b: version 31 (plan p32)\n"
            "  c: version 32 (plan p33)\n");
  out_.str("");
  ASSERT_EQ(RunGatherCommand(*client_, flags, true, false, out_, err_), 0) << err_.str();
  EXPECT_THAT(out_.str(), StartsWith("{\"group_id\": \"g-3\", \"state\": \"COMMITTED\", "
                                     "\"seconds\": 0.25, \"tensors\": 3, \"bytes_moved\": "
                                     "12288, \"lower_bound_bytes\": 12288, \"buckets\": 1, "
                                     "\"bucket_bytes\": 1048576, \"members\": [{\"tensor\": "
                                     "\"a\""));
}

TEST_F(CommandsTest, DownloadWritesAnNpyFile) {
  DownloadFlags flags;
  flags.name = "t";
  flags.out_path = dir_ + "/commands_test_t.npy";
  ASSERT_EQ(RunDownloadCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  absl::StatusOr<NpyArray> a = ReadNpyFile(flags.out_path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (Shape{2, 3}));
  EXPECT_EQ(a->data, fake_.DownloadData());
  EXPECT_EQ(out_.str(), "downloaded 't' [2, 3] f32 (24 B) to " + flags.out_path + "\n");
  EXPECT_EQ(err_.str(), "");

  // bf16 goes out as '<u2' with a note.
  fake_.download_dtype_ = v1::BF16;
  ASSERT_EQ(RunDownloadCommand(*client_, flags, true, false, out_, err_), 0) << err_.str();
  EXPECT_THAT(err_.str(), HasSubstr("holds the raw bits as '<u2'"));
  EXPECT_EQ(ReadNpyFile(flags.out_path)->dtype, DType::kU16);
  NpyReadOptions options;
  options.u2_as_bf16 = true;
  a = ReadNpyFile(flags.out_path, options);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->data, fake_.DownloadData());

  // --raw: the elements only, any dtype.
  fake_.download_dtype_ = v1::F8_E4M3;
  flags.raw = true;
  flags.out_path = dir_ + "/commands_test_t.bin";
  err_.str("");
  ASSERT_EQ(RunDownloadCommand(*client_, flags, true, false, out_, err_), 0) << err_.str();
  EXPECT_EQ(err_.str(), "");
  std::ifstream raw(flags.out_path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(raw)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes, fake_.DownloadData());

  flags.raw = false;
  flags.out_path = dir_ + "/no/such/dir/t.npy";
  err_.str("");
  EXPECT_EQ(RunDownloadCommand(*client_, flags, false, false, out_, err_), 1);
  EXPECT_THAT(err_.str(), StartsWith("shardctl: NOT_FOUND: cannot create"));
}

TEST_F(CommandsTest, UploadStreamsTheFile) {
  const std::string path = dir_ + "/commands_test_up.npy";
  std::vector<int32_t> values(1000);
  for (int i = 0; i < 1000; ++i) values[i] = i * 3 - 7;
  const std::string data(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  ASSERT_TRUE(WriteNpyFile(path, DType::kI32, {10, 100}, data).ok());
  UploadFlags flags;
  flags.name = "u";
  flags.mesh = "m";
  flags.placements = "S(1)";
  flags.from_path = path;
  ASSERT_EQ(RunUploadCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  EXPECT_EQ(fake_.upload_header_.name(), "u");
  EXPECT_THAT(fake_.upload_header_.shape(), ElementsAre(10, 100));
  EXPECT_EQ(fake_.upload_header_.dtype(), v1::I32);
  EXPECT_EQ(fake_.upload_header_.spec().mesh(), "m");
  EXPECT_EQ(fake_.upload_header_.spec().placements_text(), "S(1)");
  EXPECT_EQ(fake_.upload_header_.total_bytes(), 4000);
  EXPECT_EQ(fake_.upload_data_, data);
  EXPECT_THAT(out_.str(), StartsWith("uploaded " + path + " as tensor u  [10, 100] i32"));

  flags.dtype = "f32";
  EXPECT_EQ(RunUploadCommand(*client_, flags, false, false, out_, err_), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--dtype: " + path + " holds i32, not f32"));

  // --raw: the same bytes as any dtype of that size, with --dtype and --shape.
  const std::string raw_path = dir_ + "/commands_test_up.bin";
  {
    std::ofstream f(raw_path, std::ios::binary);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  flags.from_path = raw_path;
  flags.raw = true;
  flags.dtype = "f8_e4m3";
  flags.shape = "40,100";
  err_.str("");
  ASSERT_EQ(RunUploadCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  EXPECT_EQ(fake_.upload_header_.dtype(), v1::F8_E4M3);
  EXPECT_THAT(fake_.upload_header_.shape(), ElementsAre(40, 100));
  EXPECT_EQ(fake_.upload_data_, data);
  flags.shape = "10,100";  // 1000 bytes, but the file holds 4000.
  EXPECT_EQ(RunUploadCommand(*client_, flags, false, false, out_, err_), 1);
  EXPECT_THAT(err_.str(), HasSubstr("holds 4000 bytes but a [10, 100] f8_e4m3 array is 1000"));
  flags.dtype = "";
  err_.str("");
  EXPECT_EQ(RunUploadCommand(*client_, flags, false, false, out_, err_), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--dtype: required with --raw"));
}

TEST_F(CommandsTest, OnlinePlan) {
  OnlinePlanFlags flags;
  flags.tensor = "t";
  flags.mesh = "m2";
  flags.placements = "S(1)";
  ASSERT_EQ(RunOnlinePlanCommand(*client_, flags, true, false, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), "the coordinator's explanation\n");
  out_.str("");
  ASSERT_EQ(RunOnlinePlanCommand(*client_, flags, false, true, out_, err_), 0) << err_.str();
  EXPECT_THAT(out_.str(), StartsWith("{\"tensor\": \"t\", \"steps\": [{\"op\": \"all_to_all\""));
  out_.str("");
  ASSERT_EQ(RunOnlinePlanCommand(*client_, flags, false, false, out_, err_), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("all_to_all"));
}

TEST_F(CommandsTest, OfflinePlanNeedsNoServer) {
  PlanFlags flags;
  flags.source.mesh = "4";
  flags.source.shape = "8";
  flags.source.placements = "S(0)";
  flags.to_placements = "R";
  ASSERT_EQ(RunOfflinePlanCommand(flags, false, true, out_, err_), 0) << err_.str();
  // Every rank needs the 6 elements it does not hold.
  EXPECT_THAT(out_.str(), HasSubstr("\"bytes_moved\": 96, \"lower_bound_bytes\": 96"));
  flags.to_placements = "S(2)";
  EXPECT_EQ(RunOfflinePlanCommand(flags, false, true, out_, err_), 2);
  EXPECT_THAT(err_.str(), StartsWith("shardctl plan: --to-placements: "));
}

// The whole command line (ShardctlMain) against the fake on a loopback port: the global flags
// work before, between and after the subcommand names.
class ShardctlMainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = ServeOnLoopback(&fake_, &address_);
    ASSERT_NE(server_, nullptr);  // Also when it got no port.
  }
  void TearDown() override { server_->Shutdown(); }

  // Runs shardctl with `args` and `stdin`, capturing what it prints on std::cout and
  // std::cerr.
  int Run(std::vector<std::string> args, const std::string& stdin = "") {
    return RunShardctlMain(std::move(args), stdin, &out_, &err_);
  }

  FakeCoordinator fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::ostringstream out_, err_;
};

TEST_F(ShardctlMainTest, CoordinatorBeforeOrAfterTheSubcommand) {
  const std::string not_found = "shardctl: NOT_FOUND: tensor 'x' does not exist\n";
  EXPECT_EQ(Run({"--coordinator", address_, "tensor", "show", "x"}), 1);
  EXPECT_EQ(err_.str(), not_found);
  EXPECT_EQ(Run({"tensor", "--coordinator", address_, "show", "x"}), 1);
  EXPECT_EQ(err_.str(), not_found);
  EXPECT_EQ(Run({"tensor", "show", "x", "--coordinator", address_}), 1);
  EXPECT_EQ(err_.str(), not_found);
  EXPECT_EQ(Run({"tensor", "show", "--coordinator=" + address_, "x"}), 1);
  EXPECT_EQ(err_.str(), not_found);
}

TEST_F(ShardctlMainTest, JsonBeforeOrAfterTheSubcommand) {
  const std::vector<std::vector<std::string>> forms = {
      {"--json", "--coordinator", address_, "mesh", "create", "m", "--shape", "2x2"},
      {"mesh", "--json", "create", "m", "--shape", "2x2", "--coordinator", address_},
      {"--coordinator", address_, "mesh", "create", "m", "--shape", "2x2", "--json"},
  };
  for (const std::vector<std::string>& args : forms) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    fake_.create_mesh_.Clear();
    ASSERT_EQ(Run(args), 0) << err_.str();
    EXPECT_THAT(fake_.create_mesh_.shape(), ElementsAre(2, 2));
    EXPECT_THAT(out_.str(), StartsWith("{"));
    EXPECT_EQ(err_.str(), "");
  }
  ASSERT_EQ(Run({"mesh", "create", "m", "--shape", "2x2", "--coordinator", address_}), 0);
  EXPECT_THAT(out_.str(), Not(StartsWith("{")));
}

TEST_F(ShardctlMainTest, GlobalFlagTwiceWithDifferentValuesIsAFlagError) {
  EXPECT_EQ(Run({"--coordinator", address_, "tensor", "show", "x", "--coordinator", "127.0.0.1:1"}),
            2);
  EXPECT_THAT(err_.str(), StartsWith("shardctl: --coordinator: given twice with different values"));
  EXPECT_EQ(out_.str(), "");
  // The same value twice is one flag.
  EXPECT_EQ(Run({"--coordinator", address_, "tensor", "show", "x", "--coordinator", address_}), 1);
  EXPECT_EQ(err_.str(), "shardctl: NOT_FOUND: tensor 'x' does not exist\n");
}

TEST_F(ShardctlMainTest, TokenFromTheFlagElseTheEnvironment) {
  unsetenv("SHARDCOORD_TOKEN");
  EXPECT_EQ(Run({"tensor", "show", "x", "--coordinator", address_}), 1);
  EXPECT_EQ(fake_.authorization_, "(none)");
  EXPECT_EQ(Run({"--token", "t1", "tensor", "show", "x", "--coordinator", address_}), 1);
  EXPECT_EQ(fake_.authorization_, "Bearer t1");
  EXPECT_EQ(Run({"tensor", "show", "x", "--coordinator", address_, "--token=t2"}), 1);
  EXPECT_EQ(fake_.authorization_, "Bearer t2");
  setenv("SHARDCOORD_TOKEN", "t3", 1);
  EXPECT_EQ(Run({"tensor", "show", "x", "--coordinator", address_}), 1);
  EXPECT_EQ(fake_.authorization_, "Bearer t3");
  EXPECT_EQ(Run({"tensor", "show", "x", "--coordinator", address_, "--token", "t4"}), 1);
  EXPECT_EQ(fake_.authorization_, "Bearer t4");
  unsetenv("SHARDCOORD_TOKEN");
  EXPECT_EQ(Run({"--token", "a", "tensor", "show", "x", "--token", "b"}), 2);
  EXPECT_THAT(err_.str(), StartsWith("shardctl: --token: given twice with different values"));
}

TEST_F(ShardctlMainTest, UnusableTlsFileIsAFlagErrorNamingFlagAndPath) {
  EXPECT_EQ(
      Run({"--tls-ca", "/nonexistent/ca.pem", "tensor", "show", "x", "--coordinator", address_}),
      2);
  EXPECT_EQ(err_.str(),
            "shardctl: --tls-ca: cannot read /nonexistent/ca.pem: No such file or "
            "directory\n");
  EXPECT_EQ(Run({"tensor", "show", "x", "--tls-cert", "c.pem", "--coordinator", address_}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("needs --tls-cert and --tls-key together"));
  EXPECT_EQ(out_.str(), "");
}

TEST_F(ShardctlMainTest, TokenHashReadsStdin) {
  // sha256("abc"); the newline echo appends is not part of the token.
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n";
  EXPECT_EQ(Run({"token", "hash"}, "abc\n"), 0) << err_.str();
  EXPECT_EQ(out_.str(), abc);
  EXPECT_EQ(Run({"token", "hash"}, "abc"), 0);
  EXPECT_EQ(out_.str(), abc);
  EXPECT_EQ(Run({"token", "hash"}, "\n"), 2);
  EXPECT_EQ(err_.str(), "shardctl token hash: no token on stdin\n");
}

TEST_F(ShardctlMainTest, Version) {
  const std::string want = absl::StrCat("shardctl ", kShardctlVersion, "\n");
  EXPECT_EQ(Run({"--version"}), 0);
  EXPECT_EQ(out_.str(), want);
  EXPECT_EQ(Run({"tensor", "list", "--version"}), 0);
  EXPECT_EQ(out_.str(), want);
}

}  // namespace
}  // namespace shardcoord
