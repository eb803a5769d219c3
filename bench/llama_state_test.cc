#include "bench/llama_state.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(LlamaStateTest, The16LayerModelHas147ParamsOf542MB) {
  const std::vector<LlamaParam> params = LlamaStateDict();
  ASSERT_EQ(params.size(), 147u);
  EXPECT_EQ(params.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(params.front().shape, (Shape{32000, 1024}));
  EXPECT_EQ(params.back().name, "lm_head.weight");
  EXPECT_EQ(params[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(params[7].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(params[7].shape, (Shape{1024, 2816}));
  EXPECT_EQ(params[7].megatron, "R,S(1)");
  EXPECT_EQ(params[4].megatron, "R,S(1)");  // o_proj
  EXPECT_EQ(params[9].megatron, "R,R");     // post_attention_layernorm
  std::set<std::string> names;
  int norms = 0, rows = 0, cols = 0;
  for (const LlamaParam& p : params) {
    names.insert(p.name);
    norms += p.megatron == "R,R";
    rows += p.megatron == "R,S(0)";
    cols += p.megatron == "R,S(1)";
  }
  EXPECT_EQ(names.size(), 147u);
  EXPECT_EQ(norms, 33);
  EXPECT_EQ(rows, 2 + 16 * 5);
  EXPECT_EQ(cols, 16 * 2);
  // 2 * 32000 * 1024 + 16 * (4 * 1024^2 + 3 * 2816 * 1024 + 2 * 1024) + 1024 elements, bf16.
  EXPECT_EQ(TotalElements(params), 271090688);
  EXPECT_EQ(TotalElements(params) * 2, 542181376);
}

TEST(LlamaStateTest, FlatSpecsCoverEachRankRangeOnceInOrder) {
  const std::vector<LlamaParam> params = LlamaStateDict({/*layers=*/2, 64, 176, 1000});
  const int64_t total = TotalElements(params);
  for (int ranks : {1, 3, 4, 7}) {
    const std::vector<FlatRange> ranges = FsdpRankRanges(total, ranks);
    ASSERT_EQ(ranges.size(), static_cast<size_t>(ranks));
    EXPECT_EQ(ranges.front().start, 0);
    EXPECT_EQ(ranges.back().end, total);
    for (int r = 0; r < ranks; ++r) {
      // Concatenating the rank's parts of every parameter gives back its range.
      int64_t next = ranges[r].start;
      for (const LlamaParam& p : params) {
        const FlatSpec spec = FsdpFlatSpec(p, total, ranks);
        ASSERT_EQ(spec.size(), static_cast<size_t>(ranks));
        ASSERT_LE(spec[r].size(), 1u);
        for (const FlatRange& range : spec[r]) {
          EXPECT_EQ(p.flat_offset + range.start, next) << p.name << " rank " << r;
          EXPECT_LT(range.start, range.end);
          EXPECT_LE(range.end, p.numel);
          next = p.flat_offset + range.end;
        }
      }
      EXPECT_EQ(next, ranges[r].end) << "rank " << r << " of " << ranks;
    }
  }
}

TEST(LlamaStateTest, FourRanksCutTheModelIntoEqualQuarters) {
  const std::vector<LlamaParam> params = LlamaStateDict();
  const int64_t total = TotalElements(params);
  const std::vector<FlatRange> ranges = FsdpRankRanges(total, 4);
  for (const FlatRange& r : ranges) EXPECT_EQ(r.end - r.start, total / 4);
  // The embedding (32.8M elements) is wholly rank 0's; a quarter (67.8M) ends inside layer 2.
  EXPECT_THAT(FsdpFlatSpec(params[0], total, 4)[0], ::testing::ElementsAre(FlatRange{0, 32768000}));
  EXPECT_TRUE(FsdpFlatSpec(params[0], total, 4)[1].empty());
}

}  // namespace
}  // namespace shardcoord
