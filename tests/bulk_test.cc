// A model's worth of tensors through real daemons (issue 27): 20,000 tensors of mixed shapes
// and layouts on 8 workers created in one CreateTensors call, all or nothing; listed in
// pages; values of a sample checked; deleted by prefix in one call. The coordinator keeps its
// state in SQLite, so "all or nothing" includes the durable commit.

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

constexpr int kTensors = 20000;

struct Kind {
  Shape shape;
  DType dtype;
  std::string mesh;
  std::string placements;  // Or a flat spec when `flat`.
  bool flat = false;
};

// What a model holds: vectors, matrices sharded along either dim, replicated norms, a flat
// (FSDP) shard, in f32 and bf16, on the 1-d mesh of all 8 workers and the (2, 4) one.
const std::vector<Kind>& Kinds() {
  static const std::vector<Kind>* kinds = new std::vector<Kind>{
      {{64}, DType::kF32, "all", "S(0)"},
      {{16, 8}, DType::kBF16, "tp", "R,S(0)"},
      {{8, 12}, DType::kF32, "tp", "S(1),S(0)"},
      {{6}, DType::kF32, "all", "R"},
      {{4, 4}, DType::kBF16, "all", "0:3;3:5;5:16;;;;;", true},
      {{10, 3}, DType::kF32, "tp", "S(0),R"},
  };
  return *kinds;
}

std::string Name(int i) { return absl::StrFormat("m.%05d", i); }
const Kind& KindOf(int i) { return Kinds()[i % Kinds().size()]; }

v1::CreateTensorRequest Member(int i) {
  const Kind& k = KindOf(i);
  v1::CreateTensorRequest t;
  t.set_name(Name(i));
  for (int64_t d : k.shape) t.add_shape(d);
  t.set_dtype(DTypeToProto(k.dtype));
  *t.mutable_spec() = SpecFromText(k.mesh, k.placements, k.flat);
  t.set_init(v1::ARANGE);
  return t;
}

class BulkTest : public ClusterTest {
 protected:
  void SetUp() override {
    ClusterTest::SetUp();
    static bool meshes = false;
    if (meshes) return;
    std::vector<std::string> workers;
    for (int i = 0; i < 8; ++i) workers.push_back(absl::StrCat("w", i));
    ASSERT_TRUE(MakeMesh(client(), "all", {8}, workers).ok());
    ASSERT_TRUE(MakeMesh(client(), "tp", {2, 4}, workers).ok());
    meshes = true;
  }

  std::vector<std::string> Listed(const std::string& prefix) {
    absl::StatusOr<std::vector<v1::TensorInfo>> all = client().ListTensors(prefix);
    EXPECT_TRUE(all.ok()) << all.status();
    std::vector<std::string> names;
    if (all.ok()) {
      for (const v1::TensorInfo& t : *all) names.push_back(t.name());
    }
    return names;
  }
};

TEST_F(BulkTest, TwentyThousandTensorsAreCreatedListedAndDeletedAllOrNothing) {
  v1::CreateTensorsRequest request;
  for (int i = 0; i < kTensors; ++i) *request.add_tensors() = Member(i);

  // One member the mesh cannot take, at the very end: nothing is created, the error names it.
  v1::CreateTensorsRequest bad = request;
  bad.mutable_tensors(kTensors - 1)->mutable_spec()->set_placements_text("S(3)");
  absl::StatusOr<v1::CreateTensorsResponse> refused = client().CreateTensors(bad);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr(absl::StrCat("tensors[", kTensors - 1, "]")));
  EXPECT_TRUE(Listed("m.").empty());

  absl::StatusOr<v1::CreateTensorsResponse> made = client().CreateTensors(request);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->created(), kTensors);

  // Every one, in name order, through pages of 1,000.
  std::vector<std::string> names = Listed("m.");
  ASSERT_EQ(names.size(), static_cast<size_t>(kTensors));
  for (int i = 0; i < kTensors; i += 997) EXPECT_EQ(names[i], Name(i));
  EXPECT_EQ(names.back(), Name(kTensors - 1));
  EXPECT_EQ(Listed("m.0199").size(), 10u);  // m.01990 .. m.01999

  // A sampled 1% (fixed seed, every kind among them) holds exactly arange.
  std::mt19937 rng(27);
  std::uniform_int_distribution<int> pick(0, kTensors - 1);
  for (int n = 0; n < kTensors / 100; ++n) {
    const int i = n < static_cast<int>(Kinds().size()) ? n : pick(rng);
    const Kind& k = KindOf(i);
    EXPECT_TRUE(DownloadAndCheck(client(), Name(i), k.dtype, k.shape, FillKind::kArange).ok())
        << Name(i);
  }

  // A second call with one name that exists now: nothing of it is created.
  v1::CreateTensorsRequest again;
  for (int i = 0; i < 100; ++i) {
    v1::CreateTensorRequest* t = again.add_tensors();
    *t = Member(i);
    t->set_name(absl::StrCat("n.", i));
  }
  *again.add_tensors() = Member(5);
  absl::StatusOr<v1::CreateTensorsResponse> exists = client().CreateTensors(again);
  ASSERT_EQ(exists.status().code(), absl::StatusCode::kAlreadyExists) << exists.status();
  EXPECT_THAT(exists.status().message(), HasSubstr("tensors[100] 'm.00005'"));
  EXPECT_TRUE(Listed("n.").empty());

  // An unknown name keeps the whole delete from happening; then all go in one call.
  absl::StatusOr<int64_t> none = client().DeleteTensors({"m.00001", "nope"}, "");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_EQ(Listed("m.").size(), static_cast<size_t>(kTensors));
  absl::StatusOr<int64_t> deleted = client().DeleteTensors({}, "m.");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, kTensors);
  EXPECT_TRUE(Listed("").empty());
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  shardcoord::ClusterOptions options;
  options.num_workers = 8;
  options.state_dir = std::string(std::getenv("TEST_TMPDIR")) + "/state";
  return shardcoord::RunWithCluster(argc, argv, std::move(options));
}
