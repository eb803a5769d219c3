#include "bench/llama_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardcoord {

std::vector<LlamaParam> LlamaStateDict(const LlamaConfig& config) {
  const int64_t h = config.hidden, f = config.intermediate, v = config.vocab;
  std::vector<LlamaParam> params;
  auto add = [&](std::string name, Shape shape, std::string megatron) {
    LlamaParam p;
    p.name = std::move(name);
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.shape = std::move(shape);
    p.megatron = std::move(megatron);
    p.flat_offset = params.empty() ? 0 : params.back().flat_offset + params.back().numel;
    params.push_back(std::move(p));
  };
  add("model.embed_tokens.weight", {v, h}, "R,S(0)");
  for (int l = 0; l < config.layers; ++l) {
    const std::string layer = absl::StrCat("model.layers.", l, ".");
    add(layer + "self_attn.q_proj.weight", {h, h}, "R,S(0)");
    add(layer + "self_attn.k_proj.weight", {h, h}, "R,S(0)");
    add(layer + "self_attn.v_proj.weight", {h, h}, "R,S(0)");
    add(layer + "self_attn.o_proj.weight", {h, h}, "R,S(1)");
    add(layer + "mlp.gate_proj.weight", {f, h}, "R,S(0)");
    add(layer + "mlp.up_proj.weight", {f, h}, "R,S(0)");
    add(layer + "mlp.down_proj.weight", {h, f}, "R,S(1)");
    add(layer + "input_layernorm.weight", {h}, "R,R");
    add(layer + "post_attention_layernorm.weight", {h}, "R,R");
  }
  add("model.norm.weight", {h}, "R,R");
  add("lm_head.weight", {v, h}, "R,S(0)");
  return params;
}

int64_t TotalElements(const std::vector<LlamaParam>& params) {
  return params.empty() ? 0 : params.back().flat_offset + params.back().numel;
}

std::vector<FlatRange> FsdpRankRanges(int64_t total, int ranks) {
  const int64_t per_rank = (total + ranks - 1) / ranks;
  std::vector<FlatRange> ranges(ranks);
  for (int r = 0; r < ranks; ++r) {
    ranges[r].start = std::min(total, r * per_rank);
    ranges[r].end = std::min(total, (r + 1) * per_rank);
  }
  return ranges;
}

FlatSpec FsdpFlatSpec(const LlamaParam& param, int64_t total, int ranks) {
  FlatSpec spec(ranks);
  const std::vector<FlatRange> ranges = FsdpRankRanges(total, ranks);
  for (int r = 0; r < ranks; ++r) {
    const int64_t start = std::max(ranges[r].start, param.flat_offset);
    const int64_t end = std::min(ranges[r].end, param.flat_offset + param.numel);
    if (start < end) spec[r].push_back({start - param.flat_offset, end - param.flat_offset});
  }
  return spec;
}

}  // namespace shardcoord
