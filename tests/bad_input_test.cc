// Bad input through real daemons: each request gets the status code its RPC documents in
// proto/shardcoord.proto and changes nothing: the tensor keeps its version, layout and
// values, and no tensor or mesh appears or disappears.

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/process.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

const Shape kShape = {10, 7};
constexpr char kTensor[] = "victim";

// What must not change.
struct Snapshot {
  v1::TensorInfo tensor;
  std::vector<std::string> tensors;
  std::vector<std::string> meshes;
};

class BadInputTest : public ClusterTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(ClusterTest::SetUp());
    static bool created = false;
    if (!created) {
      ASSERT_TRUE(MakeMesh(client(), "grid", {2, 2}, cluster_->WorkerNames(), {"dp", "tp"}).ok());
      ASSERT_TRUE(MakeMesh(client(), "line", {4}, cluster_->WorkerNames()).ok());
      absl::StatusOr<v1::TensorInfo> t =
          CreateFilled(client(), kTensor, kShape, DType::kF32, "grid", "S(0),S(1)");
      ASSERT_TRUE(t.ok()) << t.status();
      created = true;
    }
    ASSERT_NO_FATAL_FAILURE(Take(&before_));
  }

  void TearDown() override {
    // Every test must leave the cluster as it found it.
    Snapshot after;
    ASSERT_NO_FATAL_FAILURE(Take(&after));
    EXPECT_EQ(after.tensor.version(), before_.tensor.version());
    EXPECT_EQ(after.tensor.mesh(), before_.tensor.mesh());
    EXPECT_EQ(after.tensor.spec(), before_.tensor.spec());
    EXPECT_TRUE(after.tensor.busy_plan().empty()) << after.tensor.busy_plan();
    absl::Status same = SameChunks(after.tensor.layout(), before_.tensor.layout());
    EXPECT_TRUE(same.ok()) << same;
    // Checksums too: the bytes on the workers are the ones committed before.
    for (int r = 0; r < after.tensor.layout().ranks_size(); ++r) {
      for (int c = 0; c < after.tensor.layout().ranks(r).chunks_size(); ++c) {
        EXPECT_EQ(after.tensor.layout().ranks(r).chunks(c).checksum(),
                  before_.tensor.layout().ranks(r).chunks(c).checksum())
            << "rank index " << r << " chunk " << c;
      }
    }
    EXPECT_EQ(after.tensors, before_.tensors);
    EXPECT_EQ(after.meshes, before_.meshes);
    absl::Status values =
        DownloadAndCheck(client(), kTensor, DType::kF32, kShape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << values;
  }

  void Take(Snapshot* s) {
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(kTensor);
    ASSERT_TRUE(t.ok()) << t.status();
    s->tensor = *t;
    absl::StatusOr<std::vector<v1::TensorInfo>> tensors = client().ListTensors();
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    s->tensors.clear();
    for (const v1::TensorInfo& i : *tensors) s->tensors.push_back(i.name());
    std::sort(s->tensors.begin(), s->tensors.end());
    absl::StatusOr<std::vector<v1::MeshInfo>> meshes = client().ListMeshes();
    ASSERT_TRUE(meshes.ok()) << meshes.status();
    s->meshes.clear();
    for (const v1::MeshInfo& m : *meshes) s->meshes.push_back(m.name());
    std::sort(s->meshes.begin(), s->meshes.end());
  }

  v1::TensorHeader Header(const std::string& name, const Shape& shape, DType dtype) {
    v1::TensorHeader header;
    header.set_name(name);
    for (int64_t d : shape) header.add_shape(d);
    header.set_dtype(DTypeToProto(dtype));
    *header.mutable_spec() = SpecFromText("line", "S(0)");
    return header;
  }

  Snapshot before_;
};

// ---- Unknown names -------------------------------------------------------------------

TEST_F(BadInputTest, UnknownTensorIsNotFound) {
  EXPECT_EQ(client().GetTensor("ghost").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().DeleteTensor("ghost").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().Redistribute(RedistributeTo("ghost", "", "R")).status().code(),
            absl::StatusCode::kNotFound);
  v1::GatherRequest gather;
  gather.set_tensor("ghost");
  gather.set_wait(true);
  EXPECT_EQ(client().Gather(gather).status().code(), absl::StatusCode::kNotFound);
  v1::PlanRequest plan;
  plan.set_tensor("ghost");
  *plan.mutable_target() = SpecFromText("", "R");
  EXPECT_EQ(client().PlanRedistribute(plan).status().code(), absl::StatusCode::kNotFound);
  std::string data;
  absl::Status download = client().Download("ghost", &data).status();
  EXPECT_EQ(download.code(), absl::StatusCode::kNotFound) << download;
  EXPECT_THAT(download.message(), HasSubstr("ghost"));
  EXPECT_EQ(client().WatchPlan("no-such-plan", nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(BadInputTest, UnknownWorkerIsNotFound) {
  absl::StatusOr<v1::MeshInfo> mesh =
      MakeMesh(client(), "bad", {2, 2}, {"w0", "w1", "ghost", "w3"});
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kNotFound) << mesh.status();
  EXPECT_THAT(mesh.status().message(), HasSubstr("ghost"));
  EXPECT_EQ(client().GetMesh("bad").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BadInputTest, BadMeshShapesAreInvalid) {
  // Three workers for four positions; a worker twice; a zero dim.
  EXPECT_EQ(MakeMesh(client(), "bad", {2, 2}, {"w0", "w1", "w2"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeMesh(client(), "bad", {2}, {"w0", "w0"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeMesh(client(), "bad", {0}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeMesh(client(), "grid", {4}, cluster_->WorkerNames()).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(BadInputTest, UnknownMeshIsNotFound) {
  absl::StatusOr<v1::RedistributeResponse> r =
      client().Redistribute(RedistributeTo(kTensor, "nowhere", "R"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_EQ(CreateFilled(client(), "orphan", kShape, DType::kF32, "nowhere", "R").status().code(),
            absl::StatusCode::kNotFound);
}

// ---- Specs the tensor cannot take ----------------------------------------------------

TEST_F(BadInputTest, PlacementsTheTensorCannotTakeAreInvalid) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"line", "S(3)"},            // A 2-d tensor has no dim 3.
      {"line", "S(-3)"},           // Nor dim -3.
      {"grid", "S(0)"},            // One placement for a 2-d mesh.
      {"grid", "S(0),S(1),R"},     // Three.
      {"line", "S(0,[4,4,4,4])"},  // Sizes sum to 16, not 10.
      {"line", "S(0,[5,5])"},      // Two sizes for four positions.
      {"line", "Q(0)"},            // Not a placement.
  };
  for (const auto& [mesh, spec] : bad) {
    SCOPED_TRACE(absl::StrCat(spec, " on ", mesh));
    absl::StatusOr<v1::RedistributeResponse> r =
        client().Redistribute(RedistributeTo(kTensor, mesh, spec));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    v1::PlanRequest plan;
    plan.set_tensor(kTensor);
    *plan.mutable_target() = SpecFromText(mesh, spec);
    EXPECT_EQ(client().PlanRedistribute(plan).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(CreateFilled(client(), "orphan", kShape, DType::kF32, mesh, spec).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(BadInputTest, FlatSpecsThatDoNotCoverTheTensorAreInvalid) {
  for (const std::string& spec : {"0:10;10:20;20:30;30:60",  // 60 of 70 elements.
                                  "0:40;30:70;;",            // Overlap.
                                  "0:70;;",                  // Three ranks for four.
                                  "0:80;;;"}) {              // Past the end.
    SCOPED_TRACE(spec);
    absl::StatusOr<v1::RedistributeResponse> r =
        client().Redistribute(RedistributeTo(kTensor, "line", spec, /*flat=*/true));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
}

TEST_F(BadInputTest, BadTensorCreationsAreInvalidOrExisting) {
  EXPECT_EQ(CreateFilled(client(), "orphan", {10, -7}, DType::kF32, "line", "S(0)").status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::CreateTensorRequest no_dtype;
  no_dtype.set_name("orphan");
  no_dtype.add_shape(4);
  *no_dtype.mutable_spec() = SpecFromText("line", "S(0)");
  EXPECT_EQ(client().CreateTensor(no_dtype).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateFilled(client(), kTensor, kShape, DType::kF32, "line", "S(0)").status().code(),
            absl::StatusCode::kAlreadyExists);
}

// ---- Uploads -------------------------------------------------------------------------

TEST_F(BadInputTest, UploadWithWrongByteCountIsInvalid) {
  const std::string data(10 * 7 * 4 - 4, '\0');  // One element short.
  absl::StatusOr<v1::TensorInfo> r = client().Upload(Header("fresh", kShape, DType::kF32), data);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
}

TEST_F(BadInputTest, UploadOverATensorOfAnotherShapeIsAlreadyExists) {
  const std::string data(7 * 10 * 4, '\0');
  absl::StatusOr<v1::TensorInfo> r = client().Upload(Header(kTensor, {7, 10}, DType::kF32), data);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << r.status();
}

TEST_F(BadInputTest, ChunkUploadWithMismatchedShapeOrDtypeIsInvalid) {
  // One rank's local buffer: the header must repeat the tensor's shape and dtype.
  const v1::RankChunks& rank0 = before_.tensor.layout().ranks(0);
  const std::string chunk_f32(static_cast<size_t>(rank0.local_elements()) * 4, '\0');
  struct Case {
    std::string what;
    Shape shape;
    DType dtype;
    std::string data;
  };
  const std::vector<Case> cases = {
      {"shape", {10, 8}, DType::kF32, chunk_f32},
      {"dtype", kShape, DType::kF64,
       std::string(static_cast<size_t>(rank0.local_elements()) * 8, '\0')},
      {"byte count", kShape, DType::kF32, chunk_f32 + "xxxx"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::TensorHeader header = Header(kTensor, c.shape, c.dtype);
    *header.mutable_spec() = SpecFromText("grid", "S(0),S(1)");
    header.set_has_rank(true);
    header.set_rank(rank0.rank());
    absl::StatusOr<v1::TensorInfo> r = client().Upload(header, c.data);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
}

TEST_F(BadInputTest, ChunkUploadToAnUnknownTensorIsNotFound) {
  v1::TensorHeader header = Header("ghost", kShape, DType::kF32);
  header.set_has_rank(true);
  header.set_rank(cluster_->worker_info(0).rank());
  absl::StatusOr<v1::TensorInfo> r = client().Upload(header, std::string(3 * 7 * 4, '\0'));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
}

// ---- Malformed .npy files through shardctl -----------------------------------------------

// Runs shardctl with `args` against the cluster; returns its exit code and output.
using CliResult = CommandResult;

CliResult RunShardctl(const std::string& coordinator, std::vector<std::string> args) {
  args.insert(args.end(), {"--coordinator", coordinator});
  return shardcoord::RunShardctl(args);
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST_F(BadInputTest, MalformedNpyFilesAreRejectedBeforeAnythingIsSent) {
  absl::StatusOr<std::string> good = SerializeNpy(DType::kF32, kShape, std::string(280, '\0'));
  ASSERT_TRUE(good.ok()) << good.status();
  std::string bad_magic = *good;
  bad_magic[1] = 'X';
  std::string fortran = *good;
  const size_t f = fortran.find("'fortran_order': False");
  ASSERT_NE(f, std::string::npos);
  fortran.replace(f, 22, "'fortran_order': True ");
  std::string bad_dtype = *good;
  const size_t d = bad_dtype.find("<f4");
  ASSERT_NE(d, std::string::npos);
  bad_dtype.replace(d, 3, "<c8");  // complex64: no shardcoord dtype.
  const std::vector<std::pair<std::string, std::string>> files = {
      {"bad_magic.npy", bad_magic},
      {"truncated.npy", good->substr(0, good->size() - 8)},
      {"header_only.npy", good->substr(0, 20)},
      {"fortran.npy", fortran},
      {"complex.npy", bad_dtype},
      {"empty.npy", ""},
  };
  for (const auto& [name, bytes] : files) {
    SCOPED_TRACE(name);
    const std::string path = TempPath(name);
    WriteFile(path, bytes);
    // Into a new name and over the existing tensor: neither may appear or change.
    for (const std::string& target : {std::string("fresh"), std::string(kTensor)}) {
      CliResult r = RunShardctl(
          cluster_->coordinator_address(),
          {"tensor", "upload", target, "--mesh", "line", "--placements", "S(0)", "--from", path});
      EXPECT_NE(r.exit_code, 0) << r.output;
      EXPECT_THAT(r.output, HasSubstr("INVALID_ARGUMENT")) << r.output;
      EXPECT_THAT(r.output, HasSubstr(name)) << r.output;
    }
  }
}

TEST_F(BadInputTest, WellFormedNpyOfTheWrongShapeIsRefusedByTheCoordinator) {
  // Well-formed, but 7x10 over a 10x7 tensor: the coordinator answers, shardctl reports it.
  absl::StatusOr<std::string> npy = SerializeNpy(DType::kF32, {7, 10}, std::string(280, '\0'));
  ASSERT_TRUE(npy.ok());
  const std::string path = TempPath("transposed.npy");
  WriteFile(path, *npy);
  CliResult r = RunShardctl(
      cluster_->coordinator_address(),
      {"tensor", "upload", kTensor, "--mesh", "line", "--placements", "S(0)", "--from", path});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("ALREADY_EXISTS")) << r.output;
}

}  // namespace
}  // namespace shardcoord
