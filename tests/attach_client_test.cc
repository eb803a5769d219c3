// The C++ local attach client against real daemons: this process lends shared and plain
// memory for every rank of two attached tensors, the coordinator copies into them, and the
// values land in this process's memory; a detach makes the rank's chunks missing again.
// (The template for benchmarks whose buffers live in user processes.)

#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/local_attach_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

const Shape kShape = {16, 12};

v1::CreateTensorRequest Attached(const std::string& name, const std::string& mesh,
                                 const std::string& spec, bool flat = false) {
  v1::CreateTensorRequest r;
  r.set_name(name);
  for (int64_t d : kShape) r.add_shape(d);
  r.set_dtype(v1::F32);
  *r.mutable_spec() = SpecFromText(mesh, spec, flat);
  r.set_init(v1::ATTACHED);
  return r;
}

TEST(AttachClientTest, LentMemoryIsWrittenInPlaceAndDetachedOnRequest) {
  Cluster* cluster = ClusterEnvironment::Get();
  ASSERT_NE(cluster, nullptr);
  CoordinatorClient& c = cluster->client();
  ASSERT_TRUE(MakeMesh(c, "m", {4}, cluster->WorkerNames()).ok());
  ASSERT_TRUE(CreateFilled(c, "src", kShape, DType::kF32, "m", "S(0)").ok());
  ASSERT_TRUE(c.CreateTensor(Attached("shared", "m", "S(1)")).ok());
  ASSERT_TRUE(c.CreateTensor(Attached("plain", "m", "0:50;50:100;100:150;150:192", true)).ok());

  std::vector<std::unique_ptr<LocalAttachClient>> local;
  std::vector<std::unique_ptr<SharedMemory>> shared;
  std::vector<std::vector<char>> plain;
  for (int i = 0; i < cluster->num_workers(); ++i) {
    const v1::WorkerInfo& w = cluster->worker_info(i);
    ASSERT_FALSE(w.local_socket().empty()) << w.name();
    absl::StatusOr<std::unique_ptr<LocalAttachClient>> conn =
        LocalAttachClient::Connect(w.local_socket());
    ASSERT_TRUE(conn.ok()) << conn.status();
    local.push_back(*std::move(conn));
    for (const std::string name : {"shared", "plain"}) {
      absl::StatusOr<v1::TensorInfo> t = c.GetTensor(name);
      ASSERT_TRUE(t.ok()) << t.status();
      const int64_t bytes = *LocalBytes(*t, w.rank());
      absl::StatusOr<v1::LocalAttachResponse> lent;
      if (name == "shared") {
        shared.push_back(*SharedMemory::Create(bytes));
        lent = local.back()->AttachShared(*t, w.rank(), *shared.back());
      } else {
        plain.emplace_back(static_cast<size_t>(bytes));
        lent = local.back()->AttachPlain(*t, w.rank(), plain.back().data(), bytes);
      }
      ASSERT_TRUE(lent.ok()) << name << " rank " << w.rank() << ": " << lent.status();
      EXPECT_EQ(lent->memory(), name == "shared" ? "shared" : "process");
      EXPECT_EQ(lent->readable(), i == cluster->num_workers() - 1);
    }
  }
  for (const std::string name : {"shared", "plain"}) {
    v1::CopyRequest copy;
    copy.set_src("src");
    copy.set_dst(name);
    copy.set_wait(true);
    absl::StatusOr<v1::CopyResponse> done = c.Copy(copy);
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->progress().state(), v1::COMMITTED) << done->progress().error();
  }
  // Every value, in this process's memory.
  for (int i = 0; i < cluster->num_workers(); ++i) {
    const int64_t rank = cluster->worker_info(i).rank();
    for (const std::string name : {"shared", "plain"}) {
      absl::StatusOr<v1::TensorInfo> t = c.GetTensor(name);
      ASSERT_TRUE(t.ok());
      const v1::RankChunks* rc = nullptr;
      for (const v1::RankChunks& r : t->layout().ranks()) {
        if (r.rank() == rank) rc = &r;
      }
      ASSERT_NE(rc, nullptr);
      absl::StatusOr<std::string> want = PartialArangeBuffer(*rc, DType::kF32, kShape, 1);
      ASSERT_TRUE(want.ok()) << want.status();
      const char* got = name == "shared" ? shared[i]->data() : plain[i].data();
      EXPECT_EQ(std::string(got, want->size()), *want) << name << " rank " << rank;
    }
  }
  // A detach is answered once the coordinator knows: the rank's chunks are missing.
  const int64_t rank0 = cluster->worker_info(0).rank();
  ASSERT_TRUE(local[0]->Detach("shared", rank0).ok());
  absl::StatusOr<v1::TensorInfo> after = c.GetTensor("shared");
  ASSERT_TRUE(after.ok());
  EXPECT_THAT(after->unattached_ranks(), UnorderedElementsAre(rank0));
  EXPECT_EQ(local[0]->Detach("shared", rank0).code(), absl::StatusCode::kNotFound);
  v1::CopyRequest copy;
  copy.set_src("src");
  copy.set_dst("shared");
  copy.set_wait(true);
  absl::StatusOr<v1::CopyResponse> refused = c.Copy(copy);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("has no buffer attached"));
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Socket paths are short (107 bytes at most): a directory of this test's own under /tmp.
  char dir[] = "/tmp/sc-attach-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  shardcoord::ClusterOptions options;
  options.worker_flags = {absl::StrCat("--local-socket=", dir, "/{name}.sock")};
  ::testing::AddGlobalTestEnvironment(new shardcoord::ClusterEnvironment(options));
  const int rc = RUN_ALL_TESTS();
  rmdir(dir);
  return rc;
}
