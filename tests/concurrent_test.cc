// Eight tensors redistributed at once: eight threads issue their Redistribute RPCs together
// (lined up on a barrier), on shared workers and meshes. Every plan must commit and every
// value must survive; then all eight move again, back across meshes.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

constexpr int kTensors = 8;

struct Move {
  std::string mesh;
  std::string spec;
  bool flat = false;
};

class ConcurrentTest : public ClusterTest {
 protected:
  // Issues every tensor's move from its own thread at the same moment and returns each
  // Redistribute result.
  std::vector<absl::StatusOr<v1::RedistributeResponse>> MoveAll(const std::vector<Move>& moves) {
    std::vector<absl::StatusOr<v1::RedistributeResponse>> results(moves.size(),
                                                                  absl::UnknownError("not run"));
    absl::Barrier* start = new absl::Barrier(static_cast<int>(moves.size()));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < moves.size(); ++i) {
      threads.emplace_back([&, i] {
        const v1::RedistributeRequest request =
            RedistributeTo(Name(i), moves[i].mesh, moves[i].spec, moves[i].flat);
        if (start->Block()) delete start;  // The last thread out deletes it.
        results[i] = client().Redistribute(request);
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  static std::string Name(size_t i) { return absl::StrCat("concurrent_", i); }
  // Distinct shapes; tensor 7 is 120x69 (8280 elements), which its flat and uneven specs
  // below cover exactly.
  static Shape ShapeOf(size_t i) {
    const int64_t k = static_cast<int64_t>(i);
    return {64 + 8 * k, 48 + 3 * k};
  }
};

TEST_F(ConcurrentTest, EightRedistributesAtOnce) {
  ASSERT_TRUE(MakeMesh(client(), "line", {4}, cluster_->WorkerNames()).ok());
  ASSERT_TRUE(MakeMesh(client(), "grid", {2, 2}, cluster_->WorkerNames(), {"dp", "tp"}).ok());
  ASSERT_TRUE(MakeMesh(client(), "pair", {2}, {"w3", "w0"}).ok());

  // Sources: a mix of meshes and specs, half on each 4-worker mesh; values from the random
  // fill (seed 0) so tensors differ from each other and from arange.
  const std::vector<Move> sources = {
      {"grid", "S(0),R"},    {"grid", "R,S(1)"},
      {"grid", "S(0),S(1)"}, {"grid", "R,R"},
      {"line", "S(0)"},      {"line", "S(1)"},
      {"line", "R"},         {"line", "0:100;100:8000;8000:8280;", true},
  };
  for (size_t i = 0; i < kTensors; ++i) {
    absl::StatusOr<v1::TensorInfo> t =
        CreateFilled(client(), Name(i), ShapeOf(i), DType::kF32, sources[i].mesh, sources[i].spec,
                     sources[i].flat, v1::RANDOM);
    ASSERT_TRUE(t.ok()) << Name(i) << ": " << t.status();
  }

  const std::vector<Move> first = {
      {"line", "S(1)"},   {"line", "S(0)"}, {"pair", "R"},      {"grid", "S(1),S(0)"},
      {"grid", "R,S(0)"}, {"pair", "S(0)"}, {"grid", "S(0),R"}, {"line", "S(0,[7,0,94,19])"},
  };
  std::vector<absl::StatusOr<v1::RedistributeResponse>> results = MoveAll(first);
  for (size_t i = 0; i < kTensors; ++i) {
    ASSERT_TRUE(results[i].ok()) << Name(i) << ": " << results[i].status();
    EXPECT_EQ(results[i]->progress().state(), v1::COMMITTED)
        << Name(i) << ": " << results[i]->progress().error();
  }
  for (size_t i = 0; i < kTensors; ++i) {
    absl::Status values =
        DownloadAndCheck(client(), Name(i), DType::kF32, ShapeOf(i), FillKind::kRandom);
    EXPECT_TRUE(values.ok()) << values;
  }

  // And back, crossing meshes again, all at once.
  results = MoveAll(sources);
  for (size_t i = 0; i < kTensors; ++i) {
    ASSERT_TRUE(results[i].ok()) << Name(i) << ": " << results[i].status();
    EXPECT_EQ(results[i]->progress().state(), v1::COMMITTED)
        << Name(i) << ": " << results[i]->progress().error();
    absl::StatusOr<v1::TensorInfo> info = client().GetTensor(Name(i));
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->mesh(), sources[i].mesh);
    EXPECT_TRUE(info->busy_plan().empty());
  }
  for (size_t i = 0; i < kTensors; ++i) {
    absl::Status values =
        DownloadAndCheck(client(), Name(i), DType::kF32, ShapeOf(i), FillKind::kRandom);
    EXPECT_TRUE(values.ok()) << values;
  }
}

}  // namespace
}  // namespace shardcoord
