// Redistributions through real daemons: every transition among S(0), S(1), R and P(sum) on a
// 1-d and a 2-d mesh of four workers, cross-mesh moves, uneven and flat layouts, gathers,
// every dtype. Each case checks the committed layout against the sharding core and every
// downloaded value against the fill formula.

#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::Combine;
using ::testing::ValuesIn;

// Uneven under torch.chunk on every mesh used here: 10 rows over 4 are 3,3,3,1, over 2 then
// 2 are 3,2 | 3,2; 7 columns over 4 are 2,2,2,1.
const Shape kShape = {10, 7};

struct Endpoint {
  std::string mesh;
  std::string spec;
  bool flat = false;
};

// The coordinator's --relay-max-bytes in this run (main sets it).
int64_t relay_max_bytes = 0;

bool HasPartial(const Endpoint& e) { return !e.flat && absl::StrContains(e.spec, "P"); }

std::string TestName(std::string s) {
  std::string out;
  for (char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
      out += c;
    } else if (c == ',' || c == ';' || c == ':') {
      out += '_';
    }
  }
  return out;
}

class RedistributeTest : public ClusterTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(ClusterTest::SetUp());
    ASSERT_NO_FATAL_FAILURE(EnsureMeshes());
  }

  // Meshes over the four workers w0..w3: the 1-d and 2-d meshes of the transitions and three
  // others for cross-mesh moves (a permuted line and two subsets).
  void EnsureMeshes() {
    static auto* meshes = new absl::flat_hash_map<std::string, v1::MeshInfo>();
    meshes_ = meshes;
    if (!meshes->empty()) return;
    struct Def {
      std::string name;
      Shape shape;
      std::vector<std::string> workers;
      std::vector<std::string> dims;
    };
    const std::vector<Def> defs = {
        {"line", {4}, {"w0", "w1", "w2", "w3"}, {"x"}},
        {"grid", {2, 2}, {"w0", "w1", "w2", "w3"}, {"dp", "tp"}},
        {"line_rev", {4}, {"w3", "w2", "w1", "w0"}, {}},
        {"pair", {2}, {"w1", "w2"}, {}},
        {"trio", {3}, {"w0", "w2", "w3"}, {}},
    };
    for (const Def& d : defs) {
      absl::StatusOr<v1::MeshInfo> mesh = MakeMesh(client(), d.name, d.shape, d.workers, d.dims);
      ASSERT_TRUE(mesh.ok()) << d.name << ": " << mesh.status();
      (*meshes)[d.name] = *mesh;
    }
  }

  const v1::MeshInfo& Mesh(const std::string& name) { return meshes_->at(name); }

  // Creates `name` in `from` holding arange (through per-rank uploads when `from` is
  // Partial) and checks its layout and values.
  void Create(const std::string& name, const Endpoint& from, const Shape& shape, DType dtype,
              v1::TensorInfo* info) {
    absl::StatusOr<v1::TensorInfo> created =
        HasPartial(from)
            ? CreatePartialArange(client(), name, shape, dtype, from.mesh, from.spec)
            : CreateFilled(client(), name, shape, dtype, from.mesh, from.spec, from.flat);
    ASSERT_TRUE(created.ok()) << "create " << name << " with " << from.spec << " on " << from.mesh
                              << ": " << created.status();
    absl::StatusOr<v1::Layout> want = ExpectedLayout(Mesh(from.mesh), shape, from.spec, from.flat);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(SameChunks(created->layout(), *want).ok())
        << "created layout: " << SameChunks(created->layout(), *want);
    absl::Status values = DownloadAndCheck(client(), name, dtype, shape, FillKind::kArange);
    ASSERT_TRUE(values.ok()) << "source: " << values;
    *info = *created;
  }

  // Redistributes `name` to `to` and checks the plan, the new layout and every value.
  void MoveAndCheck(const std::string& name, const v1::TensorInfo& before, const Endpoint& to,
                    const Shape& shape, DType dtype, bool partial_source) {
    absl::StatusOr<v1::RedistributeResponse> response =
        client().Redistribute(RedistributeTo(name, to.mesh, to.spec, to.flat));
    ASSERT_TRUE(response.ok()) << "redistribute " << name << " to " << to.spec << " on " << to.mesh
                               << ": " << response.status();
    EXPECT_EQ(response->progress().state(), v1::COMMITTED) << response->progress().error();
    // Which path moved it: the coordinator's relay for small plans without Partial when it is
    // on (its trace has relay_write steps), the workers' fragments otherwise.
    const bool relay = !partial_source && !HasPartial(to) &&
                       Box::Whole(shape).Volume() * ElementSize(dtype) <= relay_max_bytes;
    absl::StatusOr<v1::PlanTrace> trace = client().GetPlanTrace(response->progress().plan_id());
    ASSERT_TRUE(trace.ok()) << trace.status();
    bool relayed = false;
    for (const v1::RankTrace& r : trace->ranks()) {
      for (const v1::StepTiming& step : r.steps()) relayed |= step.op() == "relay_write";
    }
    EXPECT_EQ(relayed, relay) << "relay_max_bytes " << relay_max_bytes;
    if (!partial_source) {
      // Every needed element arrives once (the planner's contract for non-Partial sources).
      EXPECT_EQ(response->plan().bytes_moved(), response->plan().lower_bound_bytes());
    }
    absl::StatusOr<v1::TensorInfo> after = client().GetTensor(name);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->version(), before.version() + 1);
    EXPECT_EQ(after->mesh(), to.mesh);
    EXPECT_TRUE(after->busy_plan().empty()) << after->busy_plan();
    EXPECT_TRUE(after->lost_chunks().empty());
    absl::StatusOr<v1::Layout> want = ExpectedLayout(Mesh(to.mesh), shape, to.spec, to.flat);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::Status same = SameChunks(after->layout(), *want);
    EXPECT_TRUE(same.ok()) << "layout after the move: " << same;
    absl::Status values = DownloadAndCheck(client(), name, dtype, shape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << "after " << before.spec() << " -> " << to.spec << ": " << values;
  }

  void Transition(const std::string& name, const Endpoint& from, const Endpoint& to,
                  const Shape& shape = kShape, DType dtype = DType::kF32) {
    v1::TensorInfo before;
    ASSERT_NO_FATAL_FAILURE(Create(name, from, shape, dtype, &before));
    ASSERT_NO_FATAL_FAILURE(MoveAndCheck(name, before, to, shape, dtype, HasPartial(from)));
    EXPECT_TRUE(client().DeleteTensor(name).ok());
  }

  absl::flat_hash_map<std::string, v1::MeshInfo>* meshes_ = nullptr;
};

// ---- 1-d and 2-d transitions ----------------------------------------------------------

const std::vector<std::string> kLinePlacements = {"S(0)", "S(1)", "R", "P(sum)"};

std::vector<std::string> GridPlacements() {
  std::vector<std::string> out;
  for (const std::string& a : kLinePlacements) {
    for (const std::string& b : kLinePlacements) out.push_back(absl::StrCat(a, ",", b));
  }
  return out;
}

using Pair = std::tuple<std::string, std::string>;

std::string PairName(const ::testing::TestParamInfo<Pair>& info) {
  return absl::StrCat(TestName(std::get<0>(info.param)), "_to_", TestName(std::get<1>(info.param)));
}

class LineTransitionTest : public RedistributeTest, public ::testing::WithParamInterface<Pair> {};

TEST_P(LineTransitionTest, MovesEveryValue) {
  const auto& [from, to] = GetParam();
  Transition(absl::StrCat("line_", TestName(from), "_", TestName(to)), {"line", from},
             {"line", to});
}

INSTANTIATE_TEST_SUITE_P(All, LineTransitionTest,
                         Combine(ValuesIn(kLinePlacements), ValuesIn(kLinePlacements)), PairName);

class GridTransitionTest : public RedistributeTest, public ::testing::WithParamInterface<Pair> {};

TEST_P(GridTransitionTest, MovesEveryValue) {
  const auto& [from, to] = GetParam();
  Transition(absl::StrCat("grid_", TestName(from), "_", TestName(to)), {"grid", from},
             {"grid", to});
}

INSTANTIATE_TEST_SUITE_P(All, GridTransitionTest,
                         Combine(ValuesIn(GridPlacements()), ValuesIn(GridPlacements())), PairName);

// ---- Across meshes, uneven and flat layouts ---------------------------------------------

struct Path {
  std::string name;
  Endpoint from;
  Endpoint to;
};

class PathTest : public RedistributeTest, public ::testing::WithParamInterface<Path> {};

TEST_P(PathTest, MovesEveryValue) {
  const Path& p = GetParam();
  Transition(p.name, p.from, p.to);
}

// 10x7 = 70 elements; flat specs give each rank [start, end) ranges of the flattened tensor.
INSTANTIATE_TEST_SUITE_P(
    Paths, PathTest,
    ValuesIn(std::vector<Path>{
        // Cross-mesh: permuted ranks, subsets, a mesh of three, 2-d to 1-d and back.
        {"grid_S0R_to_line_rev_S1", {"grid", "S(0),R"}, {"line_rev", "S(1)"}},
        {"line_S0_to_pair_R", {"line", "S(0)"}, {"pair", "R"}},
        {"pair_S1_to_grid_RS0", {"pair", "S(1)"}, {"grid", "R,S(0)"}},
        {"grid_PsumS1_to_line_S0", {"grid", "P(sum),S(1)"}, {"line", "S(0)"}},
        {"line_Psum_to_trio_S0", {"line", "P(sum)"}, {"trio", "S(0)"}},
        {"trio_S1_to_line_rev_Psum", {"trio", "S(1)"}, {"line_rev", "P(sum)"}},
        {"line_rev_S0_to_line_S0", {"line_rev", "S(0)"}, {"line", "S(0)"}},
        // Uneven shards (explicit sizes, empty pieces included).
        {"grid_S0S1_to_line_uneven", {"grid", "S(0),S(1)"}, {"line", "S(0,[4,0,5,1])"}},
        {"line_uneven_to_grid_uneven",
         {"line", "S(1,[1,3,0,3])"},
         {"grid", "S(0,[7,3]),S(1,[2,5])"}},
        {"grid_uneven_to_line_S1", {"grid", "S(0,[2,8]),R"}, {"line", "S(1)"}},
        // Flat (OLMo-core ShardingSpec) layouts, one rank empty, ranges out of order.
        {"grid_S0S1_to_line_flat",
         {"grid", "S(0),S(1)"},
         {"line", "60:70,0:13;13:40;40:60;", true}},
        {"line_flat_to_line_flat",
         {"line", "0:35;35:70;;", true},
         {"line_rev", "5:70;0:5;;", true}},
        {"line_flat_to_grid_RS1", {"line", "0:1;1:69;69:70;", true}, {"grid", "R,S(1)"}},
        {"line_Psum_to_pair_flat", {"line", "P(sum)"}, {"pair", "0:33;33:70", true}},
    }),
    [](const ::testing::TestParamInfo<Path>& info) { return info.param.name; });

// ---- Every dtype ---------------------------------------------------------------------

class DTypeTest : public RedistributeTest, public ::testing::WithParamInterface<DType> {};

TEST_P(DTypeTest, MovesEveryValue) {
  const DType dtype = GetParam();
  // i8 and u8 arange wrap; f16 and bf16 round: the check converts the formula the same way.
  Transition(absl::StrCat("dtype_", DTypeName(dtype)), {"grid", "S(0),S(1)"}, {"line", "S(1)"},
             {33, 17}, dtype);
}

INSTANTIATE_TEST_SUITE_P(
    All, DTypeTest,
    ValuesIn(std::vector<DType>{DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI8,
                                DType::kU8, DType::kI32, DType::kI64}),
    [](const ::testing::TestParamInfo<DType>& info) { return DTypeName(info.param); });

// ---- Bigger than one stream message --------------------------------------------------

TEST_F(RedistributeTest, MovesATensorOfManyStreamMessages) {
  // 1024x1024 f32 is 4 MiB: uploads, downloads and worker reads cross 1 MiB messages.
  Transition("big", {"grid", "S(0),R"}, {"line", "S(1)"}, {1024, 1024});
}

// ---- Gather ------------------------------------------------------------------------------

TEST_F(RedistributeTest, GathersToOneRank) {
  v1::TensorInfo before;
  ASSERT_NO_FATAL_FAILURE(
      Create("gather_one", {"grid", "S(0),S(1)"}, kShape, DType::kF32, &before));
  const int64_t rank = cluster_->worker_info(2).rank();
  v1::GatherRequest request;
  request.set_tensor("gather_one");
  request.set_has_to_rank(true);
  request.set_to_rank(rank);
  request.set_wait(true);
  absl::StatusOr<v1::RedistributeResponse> response = client().Gather(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->progress().state(), v1::COMMITTED) << response->progress().error();
  EXPECT_EQ(response->plan().bytes_moved(), response->plan().lower_bound_bytes());
  absl::StatusOr<v1::TensorInfo> after = client().GetTensor("gather_one");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->version(), before.version() + 1);
  // Only the destination holds anything, and it holds the whole tensor.
  v1::Layout want;
  for (int64_t d : kShape) want.add_global_shape(d);
  v1::RankChunks* holder = want.add_ranks();
  holder->set_rank(rank);
  v1::Chunk* whole = holder->add_chunks();
  for (int64_t d : kShape) {
    whole->mutable_box()->add_offset(0);
    whole->mutable_box()->add_shape(d);
  }
  absl::Status same = SameChunks(after->layout(), want);
  EXPECT_TRUE(same.ok()) << same;
  absl::Status values =
      DownloadAndCheck(client(), "gather_one", DType::kF32, kShape, FillKind::kArange);
  EXPECT_TRUE(values.ok()) << values;
  EXPECT_TRUE(client().DeleteTensor("gather_one").ok());
}

TEST_F(RedistributeTest, GathersAPartialTensorToEveryRankOfAnotherMesh) {
  v1::TensorInfo before;
  ASSERT_NO_FATAL_FAILURE(
      Create("gather_all", {"grid", "P(sum),S(0)"}, kShape, DType::kF32, &before));
  v1::GatherRequest request;
  request.set_tensor("gather_all");
  request.set_mesh("trio");
  request.set_wait(true);
  absl::StatusOr<v1::RedistributeResponse> response = client().Gather(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->progress().state(), v1::COMMITTED) << response->progress().error();
  absl::StatusOr<v1::TensorInfo> after = client().GetTensor("gather_all");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->version(), before.version() + 1);
  absl::StatusOr<v1::Layout> want = ExpectedLayout(Mesh("trio"), kShape, "R");
  ASSERT_TRUE(want.ok()) << want.status();
  absl::Status same = SameChunks(after->layout(), *want);
  EXPECT_TRUE(same.ok()) << same;
  absl::Status values =
      DownloadAndCheck(client(), "gather_all", DType::kF32, kShape, FillKind::kArange);
  EXPECT_TRUE(values.ok()) << values;
  EXPECT_TRUE(client().DeleteTensor("gather_all").ok());
}

TEST_F(RedistributeTest, ChainsMovesOnOneTensor) {
  // One tensor through a sequence of layouts: versions count up and values survive each.
  v1::TensorInfo info;
  ASSERT_NO_FATAL_FAILURE(Create("chain", {"grid", "S(0),R"}, kShape, DType::kF32, &info));
  const std::vector<Endpoint> steps = {
      {"grid", "R,S(1)"},           {"line", "S(1)"},        {"line", "S(0,[1,3,2,4])"},
      {"line", "0:7;7:70;;", true}, {"grid", "P(sum),S(1)"}, {"grid", "S(1),S(0)"},
  };
  for (const Endpoint& to : steps) {
    SCOPED_TRACE(absl::StrCat("to ", to.spec, " on ", to.mesh));
    const bool partial = absl::StrContains(info.spec(), "P");
    ASSERT_NO_FATAL_FAILURE(MoveAndCheck("chain", info, to, kShape, DType::kF32, partial));
    absl::StatusOr<v1::TensorInfo> now = client().GetTensor("chain");
    ASSERT_TRUE(now.ok()) << now.status();
    info = *now;
  }
  EXPECT_TRUE(client().DeleteTensor("chain").ok());
}

}  // namespace
}  // namespace shardcoord

// Extra arguments after gtest's are worker flags: the same cases run once with the default
// (same-host copies between these workers) and once with `--same-host-copy=false` (every
// byte over Gloo's TCP transport); see tests/BUILD.bazel.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  shardcoord::ClusterOptions options;
  for (int i = 1; i < argc; ++i) {
    // --relay-max-bytes=N is the coordinator's (redistribute_relay_test); the rest, workers'.
    int64_t relay = 0;
    if (absl::SimpleAtoi(absl::StripPrefix(argv[i], "--relay-max-bytes="), &relay)) {
      options.relay_max_bytes = shardcoord::relay_max_bytes = relay;
      continue;
    }
    options.worker_flags.push_back(argv[i]);
  }
  ::testing::AddGlobalTestEnvironment(new shardcoord::ClusterEnvironment(options));
  return RUN_ALL_TESTS();
}
