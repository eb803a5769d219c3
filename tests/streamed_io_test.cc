// Whole-tensor uploads and downloads through real daemons with a coordinator whose bands are
// 4 KiB (--io-band-bytes=4096), so every tensor here (tens to hundreds of KiB) moves in many
// bands: S(0), S(1), R, P(sum), P(avg), uneven and flat layouts, 1-d, 2-d and 3-d shapes,
// rows larger than a band, several dtypes. Downloads are checked value by value against the
// fill formula the workers computed; uploads of other values (random, fixed seed) are checked
// by downloading them back and, independently of the band path, after a redistribute.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/streamed_io_main.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

constexpr int64_t kBandBytes = kStreamedIoBandBytes;
constexpr uint64_t kSeed = 20261122;

struct Case {
  std::string name;
  std::string mesh;
  std::string spec;
  Shape shape;
  DType dtype = DType::kF32;
  bool flat = false;
};

std::string BytesOfFill(FillKind kind, uint64_t seed, const Shape& shape, DType dtype) {
  const Box whole = Box::Whole(shape);
  std::string out(static_cast<size_t>(whole.Volume() * ElementSize(dtype)), '\0');
  EXPECT_TRUE(FillBox(kind, seed, shape, whole, dtype, out.data()).ok());
  return out;
}

class StreamedIoTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    cluster_ = ClusterEnvironment::Get();
    ASSERT_NE(cluster_, nullptr) << "no cluster";
    static bool meshes_made = false;
    if (!meshes_made) {
      ASSERT_TRUE(MakeMesh(client(), "line", {4}, {"w0", "w1", "w2", "w3"}).ok());
      ASSERT_TRUE(MakeMesh(client(), "grid", {2, 2}, {"w0", "w1", "w2", "w3"}).ok());
      meshes_made = true;
    }
  }

  CoordinatorClient& client() { return cluster_->client(); }

  Cluster* cluster_ = nullptr;
};

TEST_P(StreamedIoTest, DownloadOfAFilledTensorHasEveryValue) {
  const Case& c = GetParam();
  const std::string name = absl::StrCat("filled_", c.name);
  const bool partial_sum = !c.flat && c.spec.find("P(sum)") != std::string::npos;
  absl::StatusOr<v1::TensorInfo> created =
      partial_sum ? CreatePartialArange(client(), name, c.shape, c.dtype, c.mesh, c.spec)
                  : CreateFilled(client(), name, c.shape, c.dtype, c.mesh, c.spec, c.flat);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_GT(created->bytes(), 8 * kBandBytes) << "too small to need many bands";
  EXPECT_TRUE(DownloadAndCheck(client(), name, c.dtype, c.shape, FillKind::kArange).ok())
      << DownloadAndCheck(client(), name, c.dtype, c.shape, FillKind::kArange);
  ASSERT_TRUE(client().DeleteTensor(name).ok());
}

TEST_P(StreamedIoTest, UploadThenDownloadGivesTheUploadedValues) {
  const Case& c = GetParam();
  const std::string name = absl::StrCat("uploaded_", c.name);
  const std::string data = BytesOfFill(FillKind::kRandom, kSeed, c.shape, c.dtype);
  v1::TensorHeader header;
  header.set_name(name);
  for (int64_t d : c.shape) header.add_shape(d);
  header.set_dtype(DTypeToProto(c.dtype));
  *header.mutable_spec() = SpecFromText(c.mesh, c.spec, c.flat);
  header.set_total_bytes(static_cast<int64_t>(data.size()));
  // In odd-sized messages, so that messages straddle band boundaries.
  size_t offset = 0;
  absl::StatusOr<v1::TensorInfo> up =
      client().UploadFrom(header, [&](size_t max_bytes, std::string* piece) {
        const size_t n = std::min({max_bytes, data.size() - offset, size_t{10007}});
        piece->assign(data, offset, n);
        offset += n;
        return absl::OkStatus();
      });
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(up->version() > 0, true);
  absl::StatusOr<v1::Layout> want =
      ExpectedLayout(*client().GetMesh(c.mesh), c.shape, c.spec, c.flat);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_TRUE(SameChunks(up->layout(), *want).ok()) << SameChunks(up->layout(), *want);
  absl::Status values =
      DownloadAndCheck(client(), name, c.dtype, c.shape, FillKind::kRandom, kSeed);
  EXPECT_TRUE(values.ok()) << values;

  // Uploading over it (a new version, the same layout) replaces every value.
  const std::string again = BytesOfFill(FillKind::kRandom, kSeed + 1, c.shape, c.dtype);
  v1::TensorHeader keep = header;
  keep.clear_spec();
  absl::StatusOr<v1::TensorInfo> replaced = client().Upload(keep, again);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_GT(replaced->version(), up->version());
  values = DownloadAndCheck(client(), name, c.dtype, c.shape, FillKind::kRandom, kSeed + 1);
  EXPECT_TRUE(values.ok()) << values;

  // The workers hold what was uploaded: a plan (no band involved) moves it to S(0) intact.
  if (c.spec.find('P') == std::string::npos || c.flat) {
    absl::StatusOr<v1::RedistributeResponse> moved =
        client().Redistribute(RedistributeTo(name, "line", "S(0)"));
    ASSERT_TRUE(moved.ok()) << moved.status();
    values = DownloadAndCheck(client(), name, c.dtype, c.shape, FillKind::kRandom, kSeed + 1);
    EXPECT_TRUE(values.ok()) << values;
  }
  ASSERT_TRUE(client().DeleteTensor(name).ok());
}

// The edges of band planning: a scalar is one band, a tensor without elements has none.
TEST_F(StreamedIoTest, ScalarAndEmptyTensorsRoundTrip) {
  struct Edge {
    std::string name;
    Shape shape;
    std::string spec;
  };
  for (const Edge& e : {Edge{"scalar", {}, "R"}, Edge{"empty_rows", {0, 5}, "S(1)"},
                        Edge{"empty_cols", {6, 0}, "S(0)"}}) {
    SCOPED_TRACE(e.name);
    const std::string data = BytesOfFill(FillKind::kRandom, kSeed, e.shape, DType::kF32);
    v1::TensorHeader header;
    header.set_name(e.name);
    for (int64_t d : e.shape) header.add_shape(d);
    header.set_dtype(DTypeToProto(DType::kF32));
    *header.mutable_spec() = SpecFromText("line", e.spec);
    absl::StatusOr<v1::TensorInfo> up = client().Upload(header, data);
    ASSERT_TRUE(up.ok()) << up.status();
    std::string got = "junk";
    absl::StatusOr<v1::TensorHeader> down = client().Download(e.name, &got);
    ASSERT_TRUE(down.ok()) << down.status();
    EXPECT_EQ(got, data);
    ASSERT_TRUE(client().DeleteTensor(e.name).ok());
  }
}

// A download reads one version: an upload that commits a new version while the download is
// under way makes the rest of it fail with ABORTED (the old buffers are dropped), and all
// data received before is the old version's; it never mixes in the new values.
TEST_F(StreamedIoTest, DownloadRacingANewVersionIsAbortedOrAllOld) {
  const Shape shape = {1024, 1024};  // 4 MiB: 1024 bands, far more than gRPC buffers.
  ASSERT_TRUE(CreateFilled(client(), "race", shape, DType::kF32, "line", "S(0)").ok());
  const std::string old_values = BytesOfFill(FillKind::kArange, 0, shape, DType::kF32);
  const std::string new_values = BytesOfFill(FillKind::kRandom, kSeed, shape, DType::kF32);
  v1::TensorHeader header;
  header.set_name("race");
  for (int64_t d : shape) header.add_shape(d);
  header.set_dtype(DTypeToProto(DType::kF32));
  std::string got;
  bool uploaded = false;
  absl::StatusOr<v1::TensorHeader> r = client().DownloadTo(
      "race", [](const v1::TensorHeader&) { return absl::OkStatus(); },
      [&](absl::string_view data) {
        got.append(data.data(), data.size());
        if (!uploaded) {
          // The download waits (the client does not read) while a new version commits.
          uploaded = true;
          absl::StatusOr<v1::TensorInfo> up = client().Upload(header, new_values);
          EXPECT_TRUE(up.ok()) << up.status();
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(uploaded);
  RecordProperty("outcome", r.ok() ? "complete" : std::string(r.status().message()));
  if (r.ok()) {
    EXPECT_TRUE(got == old_values) << "a complete download must be all of the old version";
  } else {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("changed from version"));
    ASSERT_LT(got.size(), old_values.size());
    EXPECT_TRUE(got == old_values.substr(0, got.size()))
        << "the " << got.size() << " bytes received before the abort must be the old version's";
  }
  // The new version is intact.
  EXPECT_TRUE(
      DownloadAndCheck(client(), "race", DType::kF32, shape, FillKind::kRandom, kSeed).ok());
  ASSERT_TRUE(client().DeleteTensor("race").ok());
}

const std::vector<Case>& Cases() {
  static const auto* cases = new std::vector<Case>{
      // 2-d, 1200-byte rows: 3 rows per band, 67 bands.
      {"S0", "line", "S(0)", {201, 300}},
      {"S1", "line", "S(1)", {201, 300}},
      {"R", "line", "R", {201, 300}},
      {"S0_S1", "grid", "S(0),S(1)", {201, 300}},
      {"S1_R", "grid", "S(1),R", {201, 300}},
      {"Psum", "line", "P(sum)", {201, 300}},
      {"Pavg", "line", "P(avg)", {201, 300}},
      {"Psum_S0", "grid", "P(sum),S(0)", {201, 300}},
      // Uneven: explicit sizes with an empty shard, and torch.chunk's 51,51,51,48.
      {"uneven_sizes", "line", "S(0,[10,90,0,101])", {201, 300}},
      {"uneven_chunk", "line", "S(1)", {201, 301}},
      // Flat ranges that cut rows in the middle.
      {"flat",
       "line",
       "0:10001;10001:30000;30000:30001;30001:60300",
       {201, 300},
       DType::kF32,
       true},
      // 1-d: cut by elements (1024 per band).
      {"1d_S0", "line", "S(0)", {50000}},
      {"1d_R", "grid", "R,S(0)", {50001}},
      // 3-d: one 4000-byte index per band.
      {"3d_S2", "line", "S(2)", {30, 20, 50}},
      {"3d_S0_S1", "grid", "S(0),S(1)", {30, 20, 50}},
      // Rows larger than a band: one index per band (8000 bytes).
      {"wide_rows", "line", "S(1)", {9, 2000}},
      // Other dtypes.
      {"f64", "grid", "S(1),S(0)", {97, 101}, DType::kF64},
      {"i64", "line", "S(0)", {97, 101}, DType::kI64},
      {"f16", "line", "S(1)", {97, 301}, DType::kF16},
      {"bf16", "grid", "R,S(1)", {97, 301}, DType::kBF16},
      {"i8", "line", "S(0)", {97, 401}, DType::kI8},
  };
  return *cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, StreamedIoTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace shardcoord
