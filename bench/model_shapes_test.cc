#include "bench/model_shapes.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;

const ModelTensor* Find(const std::vector<ModelTensor>& tensors, const std::string& name) {
  for (const ModelTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Shape ShapeOf(const std::vector<ModelTensor>& tensors, const std::string& name) {
  const ModelTensor* t = Find(tensors, name);
  return t == nullptr ? Shape{} : t->shape;
}

// |a / b - 1| <= tolerance.
bool Within(double a, double b, double tolerance) { return std::abs(a / b - 1) <= tolerance; }

// Counts the generator gives, pinned (an independent count of the same configs, written
// apart in Python, gave the same numbers), and the published sizes they must be near.
TEST(ModelShapesTest, DeepSeekV3) {
  const std::vector<ModelTensor> t = *ModelStateDict("deepseek-v3");
  // Main model: embed, 3 dense layers of 12, 58 MoE layers of 782 (7 attention tensors, 2
  // norms, 256 experts x 3, the gate and its bias, one shared expert x 3), norm, lm_head;
  // then the MTP module (embed_tokens, enorm, hnorm, eh_proj, an MoE layer, shared_head's
  // norm and head).
  EXPECT_EQ(t.size(), 46183u);
  EXPECT_EQ(TotalElements(t), 684489845504);
  EXPECT_EQ(TotalBytes(t), 2 * TotalElements(t));  // bf16
  const ModelTensor* mtp = Find(t, "model.layers.61.embed_tokens.weight");
  ASSERT_NE(mtp, nullptr);
  const int64_t main = mtp->flat_offset;  // Everything before the MTP module.
  EXPECT_EQ(main, 671026419200);
  EXPECT_EQ(t.size() - (mtp - t.data()), 788u);
  // deepseek-ai/DeepSeek-V3 README.md: 685B on Hugging Face, 671B of the main model and 14B
  // of the MTP module; README_WEIGHTS.md: 11.5B unique MTP parameters besides its 0.9B
  // embedding and 0.9B head.
  EXPECT_TRUE(Within(main, 671e9, 0.01)) << main;
  EXPECT_TRUE(Within(TotalElements(t), 685e9, 0.01)) << TotalElements(t);
  EXPECT_TRUE(Within(TotalElements(t) - main, 11.5e9 + 2 * 0.9e9, 0.02));

  EXPECT_EQ(t.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(t.front().shape, (Shape{129280, 7168}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.self_attn.q_a_proj.weight"), (Shape{1536, 7168}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.self_attn.q_b_proj.weight"), (Shape{24576, 1536}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), (Shape{576, 7168}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.self_attn.kv_b_proj.weight"), (Shape{32768, 512}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.self_attn.o_proj.weight"), (Shape{7168, 16384}));
  EXPECT_EQ(ShapeOf(t, "model.layers.2.mlp.down_proj.weight"), (Shape{7168, 18432}));
  EXPECT_EQ(ShapeOf(t, "model.layers.3.mlp.down_proj.weight"), Shape{});  // MoE from layer 3.
  EXPECT_EQ(ShapeOf(t, "model.layers.3.mlp.experts.255.gate_proj.weight"), (Shape{2048, 7168}));
  EXPECT_EQ(ShapeOf(t, "model.layers.60.mlp.experts.0.down_proj.weight"), (Shape{7168, 2048}));
  EXPECT_EQ(ShapeOf(t, "model.layers.3.mlp.gate.weight"), (Shape{256, 7168}));
  EXPECT_EQ(ShapeOf(t, "model.layers.3.mlp.gate.e_score_correction_bias"), (Shape{256}));
  EXPECT_EQ(ShapeOf(t, "model.layers.3.mlp.shared_experts.up_proj.weight"), (Shape{2048, 7168}));
  EXPECT_EQ(ShapeOf(t, "model.layers.61.eh_proj.weight"), (Shape{7168, 14336}));
  EXPECT_EQ(ShapeOf(t, "model.layers.61.shared_head.head.weight"), (Shape{129280, 7168}));
  EXPECT_EQ(ShapeOf(t, "lm_head.weight"), (Shape{129280, 7168}));
  EXPECT_EQ(t.back().name, "model.layers.61.shared_head.head.weight");
}

TEST(ModelShapesTest, Qwen3_235B) {
  const std::vector<ModelTensor> t = *ModelStateDict("qwen3-235b-a22b");
  // embed; 94 layers of 393 (q, k, v, o, q_norm, k_norm, the gate, 128 experts x 3, two
  // norms); norm; lm_head.
  EXPECT_EQ(t.size(), 36945u);
  EXPECT_EQ(TotalElements(t), 235093634560);
  EXPECT_TRUE(Within(TotalElements(t), 235e9, 0.01));  // "235B" (Qwen3-235B-A22B).
  EXPECT_EQ(ShapeOf(t, "model.layers.0.self_attn.q_proj.weight"), (Shape{8192, 4096}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.self_attn.k_proj.weight"), (Shape{512, 4096}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.self_attn.o_proj.weight"), (Shape{4096, 8192}));
  EXPECT_EQ(ShapeOf(t, "model.layers.93.self_attn.k_norm.weight"), (Shape{128}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.mlp.gate.weight"), (Shape{128, 4096}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.mlp.experts.127.down_proj.weight"), (Shape{4096, 1536}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.mlp.shared_experts.up_proj.weight"), Shape{});
  EXPECT_EQ(ShapeOf(t, "lm_head.weight"), (Shape{151936, 4096}));
}

TEST(ModelShapesTest, Llama3_405B) {
  const std::vector<ModelTensor> t = *ModelStateDict("llama3-405b");
  EXPECT_EQ(t.size(), 1137u);  // 3 + 9 x 126
  EXPECT_EQ(TotalElements(t), 405853388800);
  EXPECT_TRUE(Within(TotalElements(t), 405e9, 0.01));  // Llama 3.1 405B.
  EXPECT_EQ(ShapeOf(t, "model.layers.125.self_attn.k_proj.weight"), (Shape{1024, 16384}));
  EXPECT_EQ(ShapeOf(t, "model.layers.0.mlp.down_proj.weight"), (Shape{16384, 53248}));
  EXPECT_EQ(ShapeOf(t, "model.embed_tokens.weight"), (Shape{128256, 16384}));
}

TEST(ModelShapesTest, UnknownModelNamesTheKnownOnes) {
  absl::StatusOr<std::vector<ModelTensor>> t = ModelStateDict("gpt-5");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), ::testing::HasSubstr("deepseek-v3"));
}

TEST(ModelShapesTest, FirstTensorsIsAModelOfItsOwn) {
  const std::vector<ModelTensor> all = *ModelStateDict("deepseek-v3");
  const std::vector<ModelTensor> cut = FirstTensors(all, 1000);
  ASSERT_EQ(cut.size(), 1000u);
  EXPECT_EQ(cut[999].name, all[999].name);
  EXPECT_EQ(TotalElements(cut), all[1000].flat_offset);
  EXPECT_EQ(FirstTensors(cut, 5000).size(), 1000u);
}

// Expected values from client/python/shardcoord/layouts.py's megatron_tp(name, shape, tp=8,
// dp=32), run on these names.
TEST(ModelShapesTest, MegatronTpMatchesPython) {
  const std::vector<std::pair<std::string, Shape>> cases = {
      {"model.embed_tokens.weight", {129280, 7168}},
      {"model.layers.0.self_attn.q_a_proj.weight", {1536, 7168}},
      {"model.layers.0.self_attn.q_a_layernorm.weight", {1536}},
      {"model.layers.0.self_attn.q_b_proj.weight", {24576, 1536}},
      {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", {576, 7168}},
      {"model.layers.0.self_attn.kv_a_layernorm.weight", {512}},
      {"model.layers.0.self_attn.kv_b_proj.weight", {32768, 512}},
      {"model.layers.0.self_attn.o_proj.weight", {7168, 16384}},
      {"model.layers.3.mlp.gate.weight", {256, 7168}},
      {"model.layers.3.mlp.gate.e_score_correction_bias", {256}},
      {"model.layers.3.mlp.experts.17.gate_proj.weight", {2048, 7168}},
      {"model.layers.3.mlp.experts.17.down_proj.weight", {7168, 2048}},
      {"model.layers.3.mlp.shared_experts.up_proj.weight", {2048, 7168}},
      {"model.layers.0.self_attn.q_norm.weight", {128}},
      {"model.layers.61.enorm.weight", {7168}},
      {"model.layers.61.shared_head.norm.weight", {7168}},
      {"lm_head.weight", {129280, 7168}},
      {"model.norm.weight", {7168}},
      {"model.layers.0.input_layernorm.weight", {7168}},
      {"model.layers.61.embed_tokens.weight", {129280, 7168}},
      {"model.layers.0.mlp.down_proj.weight", {7168, 18432}},
  };
  const std::vector<std::string> python = {
      "R,S(0)", "R,R", "R,R",    "R,S(0)", "R,R",    "R,R",    "R,S(0)",
      "R,S(1)", "R,R", "R,R",    "R,S(0)", "R,S(1)", "R,S(0)", "R,R",
      "R,R",    "R,R", "R,S(0)", "R,R",    "R,R",    "R,S(0)", "R,S(1)",
  };
  ASSERT_EQ(cases.size(), python.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(*MegatronTpPlacements(cases[i].first, cases[i].second), python[i]) << cases[i].first;
    // The layer and expert numbers do not change the outcome (MegatronTpKind's cache).
    EXPECT_EQ(*MegatronTpPlacements(cases[i].first, cases[i].second, ScaleBenchTpRules()),
              python[i]);
  }
  // Python: ValueError "matches no tensor-parallel rule"; the bench's table adds them.
  for (const char* name : {"model.layers.61.eh_proj.weight",
                           "model.layers.61.shared_head.head.weight", "model.layers.1.w9.weight"}) {
    EXPECT_EQ(MegatronTpPlacements(name, {7168, 14336}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_EQ(
      *MegatronTpPlacements("model.layers.61.eh_proj.weight", {7168, 14336}, ScaleBenchTpRules()),
      "R,R");
  EXPECT_EQ(*MegatronTpPlacements("model.layers.61.shared_head.head.weight", {129280, 7168},
                                  ScaleBenchTpRules()),
            "R,S(0)");
  // A row-parallel weight of one dim has nothing to split.
  EXPECT_EQ(MegatronTpPlacements("x.o_proj.weight", {8}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Rule tables are told apart: a table of its own gets its own outcomes.
  const std::vector<TpRule> only_rows = {{R"(\.weight$)", TpKind::kRow}};
  EXPECT_EQ(*MegatronTpPlacements("model.embed_tokens.weight", {4, 4}, only_rows), "R,S(1)");
}

std::vector<ModelTensor> Tensors(const std::vector<Shape>& shapes) {
  std::vector<ModelTensor> out;
  int64_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ModelTensor t;
    t.name = absl::StrCat("t", i, ".weight");
    t.shape = shapes[i];
    t.numel = 1;
    for (int64_t d : t.shape) t.numel *= d;
    t.flat_offset = offset;
    offset += t.numel;
    out.push_back(t);
  }
  return out;
}

// Expected texts from layouts.py's fsdp_flat(shapes, world).
TEST(ModelShapesTest, FsdpFlatMatchesPython) {
  std::vector<ModelTensor> t = Tensors({{2, 3}, {4}});
  EXPECT_EQ(FlatSpecToString(FsdpFlatSpec(t[0], TotalElements(t), 3)), "0:4;4:6;");
  EXPECT_EQ(FlatSpecToString(FsdpFlatSpec(t[1], TotalElements(t), 3)), ";0:2;2:4");
  t = Tensors({{2, 3}, {4}, {5, 5}, {7}});
  const std::vector<std::string> python = {"0:6;;;", "0:4;;;", "0:1;1:12;12:23;23:25", ";;;0:7"};
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(FlatSpecToString(FsdpFlatSpec(t[i], TotalElements(t), 4)), python[i]);
  }
  // Only the holders, sparse.
  const auto pieces = FsdpPieces(t[2], TotalElements(t), 4);
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[1].first, 1);
  EXPECT_EQ(pieces[1].second, (FlatRange{1, 12}));
  EXPECT_THAT(FsdpPieces(t[3], TotalElements(t), 4),
              ElementsAre(std::make_pair(int64_t{3}, FlatRange{0, 7})));
}

// A small DeepSeek-shaped model (MLA, a dense layer, MoE layers with shared experts, MTP).
DecoderConfig Tiny() {
  DecoderConfig c;
  c.name = "tiny";
  c.layers = 3;
  c.hidden = 64;
  c.intermediate = 96;
  c.vocab = 320;
  c.heads = 4;
  c.kv_heads = 4;
  c.q_lora_rank = 24;
  c.kv_lora_rank = 16;
  c.qk_nope_head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 8;
  c.routed_experts = 6;
  c.shared_experts = 1;
  c.first_dense_layers = 1;
  c.moe_intermediate = 32;
  c.router_bias = true;
  c.mtp_layers = 1;
  return c;
}

TEST(ModelShapesTest, WeightSyncLayouts) {
  const std::vector<ModelTensor> tensors = StateDict(Tiny());
  // 1 + 12 + 2 x (9 + 6 x 3 + 2 + 3) + 2 + (4 + 32 + 2).
  ASSERT_EQ(tensors.size(), 117u);
  WeightSyncOptions options;
  options.ranks = 16;
  options.tp = 8;
  const WeightSyncLayouts w = *BuildWeightSyncLayouts(tensors, options);
  options.dense_flat = true;
  const WeightSyncLayouts dense = *BuildWeightSyncLayouts(tensors, options);
  ASSERT_EQ(w.src.size(), tensors.size());
  ASSERT_EQ(w.dst.size(), tensors.size());
  EXPECT_EQ(w.inference_mesh.shape(), (Shape{2, 8}));
  EXPECT_EQ(w.placements.size(), 3u);  // R,S(0), R,R, R,S(1)
  const int64_t total = TotalElements(tensors);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ModelTensor& t = tensors[i];
    const Layout& src = w.layouts[w.src[i]];
    const Layout want = *Layout::FromFlat(w.trainer_mesh, t.shape, FsdpFlatSpec(t, total, 16));
    // The sparse layout is FromFlat's without the ranks that hold nothing.
    std::vector<RankChunks> held;
    for (const RankChunks& rc : want.ranks()) {
      if (!rc.chunks.empty()) held.push_back(rc);
    }
    ASSERT_EQ(src.ranks().size(), held.size()) << t.name;
    for (size_t r = 0; r < held.size(); ++r) {
      EXPECT_EQ(src.ranks()[r].rank, held[r].rank);
      EXPECT_EQ(src.ranks()[r].coord, held[r].coord);
      EXPECT_EQ(src.ranks()[r].chunks, held[r].chunks);
      EXPECT_EQ(src.ranks()[r].local_elements, held[r].local_elements);
    }
    EXPECT_EQ(dense.layouts[dense.src[i]], want) << t.name;
    EXPECT_EQ(dense.layouts[dense.src[i]].flat_spec(), want.flat_spec());
    const std::string placements = *MegatronTpPlacements(t.name, t.shape, ScaleBenchTpRules());
    EXPECT_EQ(w.placements[w.dst_placements[i]], placements);
    EXPECT_EQ(w.layouts[w.dst[i]],
              *Layout::FromPlacements(w.inference_mesh, t.shape, *ParsePlacements(placements)));
  }
  // One layout per distinct target: every expert gate_proj of a layer shares its inference
  // layout, and experts wholly inside one rank share their trainer layout.
  auto index_of = [&](const std::string& name) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].name == name) return i;
    }
    return tensors.size();
  };
  const size_t e0 = index_of("model.layers.1.mlp.experts.0.gate_proj.weight");
  const size_t e1 = index_of("model.layers.1.mlp.experts.1.gate_proj.weight");
  const size_t e1_up = index_of("model.layers.1.mlp.experts.1.up_proj.weight");
  EXPECT_EQ(w.dst[e0], w.dst[e1]);
  EXPECT_EQ(w.dst[e0], w.dst[e1_up]);
  int shared_src = 0;
  for (size_t i = 1; i < tensors.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (w.src[i] == w.src[j]) {
        ++shared_src;
        break;
      }
    }
  }
  EXPECT_GT(shared_src, 0);
  EXPECT_LT(w.layouts.size(), 2 * tensors.size());

  options.tp = 3;
  EXPECT_EQ(BuildWeightSyncLayouts(tensors, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.tp = 8;
  WeightSyncOptions strict = options;
  strict.rules = &MegatronTpRules();  // eh_proj and shared_head.head match none.
  EXPECT_EQ(BuildWeightSyncLayouts(tensors, strict).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardcoord
