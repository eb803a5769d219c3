#include "bench/llama_state.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace shardcoord {
namespace {

TEST(LlamaStateTest, TheIssuesWorkload) {
  const std::vector<StateTensor> state = LlamaStateDict();
  EXPECT_EQ(state.size(), 147u);
  EXPECT_EQ(StateBytes(state), 271090688 * 2);  // About 0.54 GB of bf16.
  EXPECT_EQ(state.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(state[4].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(state[4].megatron, "R,S(1)");
  EXPECT_EQ(state.back().shape, (Shape{32000, 1024}));
}

TEST(LlamaStateTest, FsdpFlatSpecsCutTheConcatenationIntoEqualRanges) {
  const std::vector<StateTensor> state = LlamaStateDict();
  const std::vector<std::string> specs = FsdpFlatSpecs(state, 4);
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({4});
  ASSERT_TRUE(mesh.ok());
  std::vector<int64_t> per_rank(4, 0);
  for (size_t i = 0; i < state.size(); ++i) {
    absl::StatusOr<FlatSpec> spec = ParseFlatSpec(specs[i]);
    ASSERT_TRUE(spec.ok()) << specs[i];
    absl::StatusOr<Layout> layout = Layout::FromFlat(*mesh, state[i].shape, *spec);
    ASSERT_TRUE(layout.ok()) << state[i].name << ": " << layout.status();
    for (const RankChunks& rc : layout->ranks()) per_rank[rc.rank] += rc.local_elements;
    // Megatron placements are valid on a 2x2 mesh.
    absl::StatusOr<DeviceMesh> grid = DeviceMesh::Create({2, 2});
    ASSERT_TRUE(
        Layout::FromPlacements(*grid, state[i].shape, *ParsePlacements(state[i].megatron)).ok());
  }
  for (int64_t n : per_rank) EXPECT_EQ(n, 271090688 / 4);
}

}  // namespace
}  // namespace shardcoord
