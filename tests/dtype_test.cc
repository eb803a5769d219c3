// Every dtype (issue 28: each dtype safetensors has) through real daemons: uploaded with
// arbitrary bit patterns, redistributed across meshes and layouts, saved to a checkpoint and
// loaded back into another layout, and downloaded bitwise equal; created with fills; and
// through shardctl: `tensor create --dtype f8_e4m3`, `download --raw`, `upload --raw`.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/process.h"
#include "tests/tensor_check.h"
#include "tests/test_files.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

const Shape kShape = {10, 7};
constexpr int64_t kElements = 70;

// Pseudo-random bytes, different per dtype: NaN payloads, any bool byte, every integer bit.
std::string Pattern(DType dtype) {
  std::string out(static_cast<size_t>(kElements * ElementSize(dtype)), '\0');
  uint64_t z = static_cast<uint64_t>(dtype) * 0x9E3779B97F4A7C15ull;
  for (char& c : out) {
    z += 0x9E3779B97F4A7C15ull;
    uint64_t x = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    c = static_cast<char>(x);
  }
  if (dtype == DType::kBool) {
    for (char& c : out) c = static_cast<char>(c & 1);
  }
  return out;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

class DTypeTest : public MeshTest {
 protected:
  absl::StatusOr<std::string> Download(const std::string& name, DType want) {
    std::string data;
    absl::StatusOr<v1::TensorHeader> header = client().Download(name, &data);
    if (!header.ok()) return header.status();
    if (header->dtype() != DTypeToProto(want)) {
      return absl::InternalError(absl::StrCat(name, " has dtype ", header->dtype()));
    }
    return data;
  }

  CommandResult Shardctl(std::vector<std::string> args) {
    args.insert(args.end(), {"--coordinator", cluster_->coordinator_address()});
    return RunShardctl(args);
  }
};

TEST_F(DTypeTest, EveryDTypeMovesAndComesBackBitwiseEqual) {
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string name = absl::StrCat("t_", DTypeName(dtype));
    const std::string bytes = Pattern(dtype);
    v1::TensorHeader header;
    header.set_name(name);
    for (int64_t d : kShape) header.add_shape(d);
    header.set_dtype(DTypeToProto(dtype));
    *header.mutable_spec() = SpecFromText("line", "S(0)");
    ASSERT_TRUE(client().Upload(header, bytes).ok());
    for (const auto& [mesh, spec] : std::vector<std::pair<std::string, std::string>>{
             {"grid", "R,S(1)"}, {"trio", "S(1)"}, {"line_rev", "S(0,[2,4,1,3])"}, {"pair", "R"}}) {
      absl::StatusOr<v1::RedistributeResponse> r =
          client().Redistribute(RedistributeTo(name, mesh, spec));
      ASSERT_TRUE(r.ok()) << spec << " on " << mesh << ": " << r.status();
      EXPECT_EQ(r->progress().state(), v1::COMMITTED) << r->progress().error();
      absl::StatusOr<std::string> back = Download(name, dtype);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_TRUE(*back == bytes) << "after " << spec << " on " << mesh;
    }
  }
  // One checkpoint of all of them, loaded into another layout under a prefix.
  const std::string dir = TempPath("every_dtype_ckpt");
  v1::SaveCheckpointRequest save;
  save.set_dir(dir);
  for (DType dtype : AllDTypes()) save.add_tensors(absl::StrCat("t_", DTypeName(dtype)));
  absl::StatusOr<v1::SaveCheckpointResponse> saved = client().SaveCheckpoint(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  v1::LoadCheckpointRequest load;
  load.set_dir(dir);
  load.set_prefix("back_");
  for (DType dtype : AllDTypes()) {
    v1::LoadTarget* t = load.add_targets();
    t->set_tensor(absl::StrCat("t_", DTypeName(dtype)));
    *t->mutable_target() = SpecFromText("grid", "S(1),S(0)");
  }
  absl::StatusOr<v1::LoadCheckpointResponse> loaded = client().LoadCheckpoint(load);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    absl::StatusOr<std::string> back = Download(absl::StrCat("back_t_", DTypeName(dtype)), dtype);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == Pattern(dtype)) << "loaded from the checkpoint";
    EXPECT_TRUE(client().DeleteTensor(absl::StrCat("t_", DTypeName(dtype))).ok());
    EXPECT_TRUE(client().DeleteTensor(absl::StrCat("back_t_", DTypeName(dtype))).ok());
  }
}

TEST_F(DTypeTest, EveryDTypeIsCreatedWithFills) {
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string name = absl::StrCat("f_", DTypeName(dtype));
    ASSERT_TRUE(CreateFilled(client(), name, kShape, dtype, "grid", "S(0),S(1)").ok());
    EXPECT_TRUE(DownloadAndCheck(client(), name, dtype, kShape, FillKind::kArange).ok());
    EXPECT_TRUE(client().DeleteTensor(name).ok());
  }
}

TEST_F(DTypeTest, PartialIsRefusedForDTypesWithoutAReduction) {
  v1::CreateTensorRequest create;
  create.set_name("p_e4m3");
  for (int64_t d : kShape) create.add_shape(d);
  create.set_dtype(v1::F8_E4M3);
  *create.mutable_spec() = SpecFromText("line", "S(0)");
  ASSERT_TRUE(client().CreateTensor(create).ok());
  absl::StatusOr<v1::RedistributeResponse> r =
      client().Redistribute(RedistributeTo("p_e4m3", "line", "P(sum)"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("f8_e4m3 cannot be Partial"));
  EXPECT_TRUE(client().DeleteTensor("p_e4m3").ok());

  // Nor created or uploaded Partial.
  create.set_name("p_bool");
  create.set_dtype(v1::BOOL);
  *create.mutable_spec() = SpecFromText("grid", "P(sum),S(0)");
  absl::StatusOr<v1::TensorInfo> made = client().CreateTensor(create);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument) << made.status();
  EXPECT_THAT(std::string(made.status().message()),
              HasSubstr("spec: dtype bool cannot be Partial"));
  v1::TensorHeader header;
  header.set_name("p_u16");
  for (int64_t d : kShape) header.add_shape(d);
  header.set_dtype(v1::U16);
  *header.mutable_spec() = SpecFromText("line", "P(max)");
  made = client().Upload(header, std::string(kElements * 2, '\0'));
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument) << made.status();
  EXPECT_THAT(std::string(made.status().message()), HasSubstr("dtype u16 cannot be Partial"));
  EXPECT_EQ(client().GetTensor("p_bool").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().GetTensor("p_u16").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DTypeTest, ShardctlCreatesFloat8AndMovesRawFiles) {
  CommandResult created =
      Shardctl({"tensor", "create", "c_e4m3", "--mesh", "line", "--shape", "10,7", "--dtype",
                "f8_e4m3", "--placements", "S(0)", "--init", "arange"});
  ASSERT_EQ(created.exit_code, 0) << created.output;
  absl::StatusOr<v1::TensorInfo> info = client().GetTensor("c_e4m3");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->dtype(), v1::F8_E4M3);
  EXPECT_TRUE(DownloadAndCheck(client(), "c_e4m3", DType::kF8E4M3, kShape, FillKind::kArange).ok());

  // download --raw: the elements, nothing else.
  const std::string raw = TempPath("c_e4m3.bin");
  CommandResult down = Shardctl({"tensor", "download", "c_e4m3", "--out", raw, "--raw"});
  ASSERT_EQ(down.exit_code, 0) << down.output;
  absl::StatusOr<std::string> want = Download("c_e4m3", DType::kF8E4M3);
  ASSERT_TRUE(want.ok());
  EXPECT_TRUE(ReadFile(raw) == *want);

  // upload --raw: any bytes as any dtype, in any layout.
  for (DType dtype : {DType::kF8E5M2, DType::kU64, DType::kBool, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string path = TempPath(absl::StrCat("up_", DTypeName(dtype), ".bin"));
    WriteFile(path, Pattern(dtype));
    const std::string name = absl::StrCat("up_", DTypeName(dtype));
    CommandResult up =
        Shardctl({"tensor", "upload", name, "--from", path, "--raw", "--dtype", DTypeName(dtype),
                  "--shape", "10,7", "--mesh", "grid", "--placements", "S(1),R"});
    ASSERT_EQ(up.exit_code, 0) << up.output;
    absl::StatusOr<std::string> back = Download(name, dtype);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == Pattern(dtype));
    EXPECT_TRUE(client().DeleteTensor(name).ok());
  }
  CommandResult bad = Shardctl({"tensor", "upload", "nope", "--from", raw, "--raw", "--shape",
                                "10,7", "--mesh", "grid", "--placements", "R,R"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("--dtype: required with --raw"));
  EXPECT_TRUE(client().DeleteTensor("c_e4m3").ok());
}

}  // namespace
}  // namespace shardcoord
