#include "bench/llama_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardcoord {

std::vector<StateTensor> LlamaStateDict(const LlamaConfig& c) {
  std::vector<StateTensor> out;
  const std::string column = "R,S(0)", row = "R,S(1)", norm = "R,R";
  out.push_back({"model.embed_tokens.weight", {c.vocab, c.hidden}, c.dtype, column});
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    out.push_back({p + "self_attn.q_proj.weight", {c.hidden, c.hidden}, c.dtype, column});
    out.push_back({p + "self_attn.k_proj.weight", {c.hidden, c.hidden}, c.dtype, column});
    out.push_back({p + "self_attn.v_proj.weight", {c.hidden, c.hidden}, c.dtype, column});
    out.push_back({p + "self_attn.o_proj.weight", {c.hidden, c.hidden}, c.dtype, row});
    out.push_back({p + "mlp.gate_proj.weight", {c.intermediate, c.hidden}, c.dtype, column});
    out.push_back({p + "mlp.up_proj.weight", {c.intermediate, c.hidden}, c.dtype, column});
    out.push_back({p + "mlp.down_proj.weight", {c.hidden, c.intermediate}, c.dtype, row});
    out.push_back({p + "input_layernorm.weight", {c.hidden}, c.dtype, norm});
    out.push_back({p + "post_attention_layernorm.weight", {c.hidden}, c.dtype, norm});
  }
  out.push_back({"model.norm.weight", {c.hidden}, c.dtype, norm});
  out.push_back({"lm_head.weight", {c.vocab, c.hidden}, c.dtype, column});
  return out;
}

int64_t StateBytes(const std::vector<StateTensor>& state) {
  int64_t total = 0;
  for (const StateTensor& t : state) total += Box::Whole(t.shape).Volume() * ElementSize(t.dtype);
  return total;
}

std::vector<std::string> FsdpFlatSpecs(const std::vector<StateTensor>& state, int ranks) {
  int64_t total = 0;
  for (const StateTensor& t : state) total += Box::Whole(t.shape).Volume();
  const int64_t per_rank = total / ranks;
  std::vector<std::string> out;
  int64_t start = 0;  // The tensor's first element in the concatenation.
  for (const StateTensor& t : state) {
    const int64_t n = Box::Whole(t.shape).Volume();
    std::vector<std::string> parts;
    for (int r = 0; r < ranks; ++r) {
      const int64_t lo = r * per_rank, hi = r == ranks - 1 ? total : (r + 1) * per_rank;
      const int64_t a = std::max(lo, start), b = std::min(hi, start + n);
      parts.push_back(a < b ? absl::StrCat(a - start, ":", b - start) : "");
    }
    out.push_back(absl::StrJoin(parts, ";"));
    start += n;
  }
  return out;
}

}  // namespace shardcoord
