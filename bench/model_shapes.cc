#include "bench/model_shapes.h"

#include <algorithm>
#include <map>
#include <regex>  // NOLINT(build/c++11): the rule table is Python regular expressions.
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace shardcoord {
namespace {

// Config values only (numbers), each from a public source:
//
// DeepSeek-V3: the defaults of huggingface/transformers
// src/transformers/models/deepseek_v3/configuration_deepseek_v3.py, which that file documents as
// DeepSeek-V3's (vocab 129280, hidden 7168, intermediate 18432, moe_intermediate 2048, 61
// layers, 128 heads, 1 shared + 256 routed experts, first_k_dense_replace 3, q_lora_rank 1536,
// kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, untied); the same numbers as
// deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json. One MTP module
// (num_nextn_predict_layers = 1): deepseek-ai/DeepSeek-V3 README_WEIGHTS.md; its tensor names
// (model.layers.61.{embed_tokens, enorm, hnorm, eh_proj [hidden, 2 * hidden],
// shared_head.norm, shared_head.head} beside a full decoder layer) as
// vllm-project/vllm vllm/model_executor/models/deepseek_mtp.py loads them. The router's
// e_score_correction_bias (topk_method noaux_tc) as in that model's MoEGate.
DecoderConfig DeepSeekV3() {
  DecoderConfig c;
  c.name = "deepseek-v3";
  c.layers = 61;
  c.hidden = 7168;
  c.intermediate = 18432;
  c.vocab = 129280;
  c.heads = 128;
  c.kv_heads = 128;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.routed_experts = 256;
  c.shared_experts = 1;
  c.first_dense_layers = 3;
  c.moe_intermediate = 2048;
  c.router_bias = true;
  c.mtp_layers = 1;
  return c;
}

// Qwen3-235B-A22B: the Megatron arguments of slime's model script (zyzshishui/slime
// scripts/models/qwen3-235B-A22B.sh, a fork of THUDM/slime): 94 layers, hidden 4096, ffn
// 12288, 64 heads, 4 query groups, kv channels 128, vocab 151936, untied embeddings, qk
// layernorm, 128 experts of moe ffn 1536, every layer MoE (first_k_dense_replace 0), no shared
// expert; the Hugging Face config.json's hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, head_dim, num_experts, moe_intermediate_size, vocab_size.
DecoderConfig Qwen3_235B() {
  DecoderConfig c;
  c.name = "qwen3-235b-a22b";
  c.layers = 94;
  c.hidden = 4096;
  c.intermediate = 12288;
  c.vocab = 151936;
  c.heads = 64;
  c.kv_heads = 4;
  c.head_dim = 128;
  c.qk_norm = true;
  c.routed_experts = 128;
  c.moe_intermediate = 1536;
  return c;
}

// Llama 3.1 405B: oumi-ai/oumi configs/recipes/llama3_1/README.md (vocab 128256, hidden
// 16384, MLP intermediate 53248, 126 layers, 128 heads, 8 KV heads, no weight tying); head_dim
// = hidden / heads = 128.
DecoderConfig Llama3_405B() {
  DecoderConfig c;
  c.name = "llama3-405b";
  c.layers = 126;
  c.hidden = 16384;
  c.intermediate = 53248;
  c.vocab = 128256;
  c.heads = 128;
  c.kv_heads = 8;
  c.head_dim = 128;
  return c;
}

class StateDictBuilder {
 public:
  void Add(std::string name, Shape shape) {
    ModelTensor t;
    t.name = std::move(name);
    t.numel = 1;
    for (int64_t d : shape) t.numel *= d;
    t.shape = std::move(shape);
    t.flat_offset = next_offset_;
    next_offset_ += t.numel;
    tensors_.push_back(std::move(t));
  }
  std::vector<ModelTensor> Take() { return std::move(tensors_); }

 private:
  std::vector<ModelTensor> tensors_;
  int64_t next_offset_ = 0;
};

// An MLP of gate/up/down projections of `inner` under `prefix` ("...mlp.", "...experts.3.").
void AddMlp(StateDictBuilder& b, const std::string& prefix, int64_t hidden, int64_t inner) {
  b.Add(prefix + "gate_proj.weight", {inner, hidden});
  b.Add(prefix + "up_proj.weight", {inner, hidden});
  b.Add(prefix + "down_proj.weight", {hidden, inner});
}

// One decoder layer: self_attn, mlp, input_layernorm, post_attention_layernorm.
void AddLayer(StateDictBuilder& b, const DecoderConfig& c, int layer) {
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  const int64_t h = c.hidden;
  if (c.q_lora_rank > 0) {  // Multi-head latent attention.
    const int64_t qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
    b.Add(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, h});
    b.Add(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank});
    b.Add(p + "self_attn.q_b_proj.weight", {c.heads * qk_head, c.q_lora_rank});
    b.Add(p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h});
    b.Add(p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank});
    b.Add(p + "self_attn.kv_b_proj.weight",
          {c.heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
    b.Add(p + "self_attn.o_proj.weight", {h, c.heads * c.v_head_dim});
  } else {
    const int64_t d = c.head_dim > 0 ? c.head_dim : h / c.heads;
    b.Add(p + "self_attn.q_proj.weight", {c.heads * d, h});
    b.Add(p + "self_attn.k_proj.weight", {c.kv_heads * d, h});
    b.Add(p + "self_attn.v_proj.weight", {c.kv_heads * d, h});
    b.Add(p + "self_attn.o_proj.weight", {h, c.heads * d});
    if (c.qk_norm) {
      b.Add(p + "self_attn.q_norm.weight", {d});
      b.Add(p + "self_attn.k_norm.weight", {d});
    }
  }
  if (c.routed_experts > 0 && layer >= c.first_dense_layers) {
    if (c.router_bias) {
      // DeepSeek's MoE module: experts, then the gate, then the shared experts.
      for (int e = 0; e < c.routed_experts; ++e) {
        AddMlp(b, absl::StrCat(p, "mlp.experts.", e, "."), h, c.moe_intermediate);
      }
      b.Add(p + "mlp.gate.weight", {c.routed_experts, h});
      b.Add(p + "mlp.gate.e_score_correction_bias", {c.routed_experts});
    } else {
      // Qwen's sparse MoE block: the gate, then the experts.
      b.Add(p + "mlp.gate.weight", {c.routed_experts, h});
      for (int e = 0; e < c.routed_experts; ++e) {
        AddMlp(b, absl::StrCat(p, "mlp.experts.", e, "."), h, c.moe_intermediate);
      }
    }
    if (c.shared_experts > 0) {
      AddMlp(b, p + "mlp.shared_experts.", h, c.moe_intermediate * c.shared_experts);
    }
  } else {
    AddMlp(b, p + "mlp.", h, c.intermediate);
  }
  b.Add(p + "input_layernorm.weight", {h});
  b.Add(p + "post_attention_layernorm.weight", {h});
}

// Python's fsdp_flat: ranges of ceil(total / ranks).
int64_t PieceOf(int64_t total, int64_t ranks) { return (total + ranks - 1) / ranks; }

// Names with every all-digit component ("61", "255") replaced by "0": a rule's outcome does
// not depend on which layer or expert a name is of (no pattern spells a number as a whole
// component), so MegatronTpKind's results are kept by this key.
std::string RuleKey(absl::string_view name) {
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  for (std::string& part : parts) {
    if (!part.empty() && std::all_of(part.begin(), part.end(), absl::ascii_isdigit)) part = "0";
  }
  return absl::StrJoin(parts, ".");
}

}  // namespace

const std::vector<std::string>& ModelNames() {
  static const auto* const names =
      new std::vector<std::string>{"deepseek-v3", "qwen3-235b-a22b", "llama3-405b"};
  return *names;
}

absl::StatusOr<DecoderConfig> ModelConfig(absl::string_view model) {
  if (model == "deepseek-v3") return DeepSeekV3();
  if (model == "qwen3-235b-a22b") return Qwen3_235B();
  if (model == "llama3-405b") return Llama3_405B();
  return absl::NotFoundError(
      absl::StrCat("unknown model '", model, "' (known: ", absl::StrJoin(ModelNames(), ", "), ")"));
}

std::vector<ModelTensor> StateDict(const DecoderConfig& c) {
  StateDictBuilder b;
  b.Add("model.embed_tokens.weight", {c.vocab, c.hidden});
  for (int l = 0; l < c.layers; ++l) AddLayer(b, c, l);
  b.Add("model.norm.weight", {c.hidden});
  if (!c.tied_embeddings) b.Add("lm_head.weight", {c.vocab, c.hidden});
  for (int m = 0; m < c.mtp_layers; ++m) {
    const int layer = c.layers + m;
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    b.Add(p + "embed_tokens.weight", {c.vocab, c.hidden});
    b.Add(p + "enorm.weight", {c.hidden});
    b.Add(p + "hnorm.weight", {c.hidden});
    b.Add(p + "eh_proj.weight", {c.hidden, 2 * c.hidden});
    AddLayer(b, c, layer);
    b.Add(p + "shared_head.norm.weight", {c.hidden});
    b.Add(p + "shared_head.head.weight", {c.vocab, c.hidden});
  }
  return b.Take();
}

absl::StatusOr<std::vector<ModelTensor>> ModelStateDict(absl::string_view model) {
  absl::StatusOr<DecoderConfig> c = ModelConfig(model);
  if (!c.ok()) return c.status();
  return StateDict(*c);
}

int64_t TotalElements(const std::vector<ModelTensor>& tensors) {
  return tensors.empty() ? 0 : tensors.back().flat_offset + tensors.back().numel;
}

int64_t TotalBytes(const std::vector<ModelTensor>& tensors) {
  int64_t bytes = 0;
  for (const ModelTensor& t : tensors) bytes += t.numel * ElementSize(t.dtype);
  return bytes;
}

std::vector<ModelTensor> FirstTensors(std::vector<ModelTensor> tensors, size_t n) {
  if (tensors.size() > n) tensors.resize(n);
  return tensors;
}

// ---- Megatron ------------------------------------------------------------------------------

const std::vector<TpRule>& MegatronTpRules() {
  // As MEGATRON_TP_RULES in client/python/shardcoord/layouts.py (kept in step by
  // model_shapes_test's names, which that function was run on).
  static const auto* const rules = new std::vector<TpRule>{
      {R"((^|[._])(\w*norm\w*|ln_\w+|ln)\.(weight|bias)$)", TpKind::kReplicate},
      {R"((^|\.)mlp\.gate\.(weight|e_score_correction_bias)$)", TpKind::kReplicate},
      {R"((^|\.)router\.\w+$)", TpKind::kReplicate},
      {R"((^|\.)(q_a_proj|kv_a_proj_with_mqa)\.(weight|bias)$)", TpKind::kReplicate},
      {R"((^|\.)(q_proj|k_proj|v_proj|qkv_proj|query_key_value|q_b_proj|kv_b_proj|wq|wk|wv|)"
       R"(wqkv|gate_proj|up_proj|gate_up_proj|w1|w3|c_fc|linear_fc1)\.(weight|bias)$)",
       TpKind::kColumn},
      {R"((^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings)\.weight$)", TpKind::kColumn},
      {R"((^|\.)(lm_head|output)\.weight$)", TpKind::kColumn},
      {R"((^|\.)(o_proj|down_proj|dense|wo|w2|c_proj|out_proj|linear_proj|linear_fc2)\.weight$)",
       TpKind::kRow},
      {R"((^|\.)(o_proj|down_proj|dense|wo|w2|c_proj|out_proj|linear_proj|linear_fc2)\.bias$)",
       TpKind::kReplicate},
  };
  return *rules;
}

const std::vector<TpRule>& ScaleBenchTpRules() {
  static const auto* const rules = [] {
    auto* r = new std::vector<TpRule>(MegatronTpRules());
    r->push_back({R"((^|\.)eh_proj\.weight$)", TpKind::kReplicate});
    r->push_back({R"((^|\.)shared_head\.head\.weight$)", TpKind::kColumn});
    return r;
  }();
  return *rules;
}

absl::StatusOr<TpKind> MegatronTpKind(absl::string_view name, const std::vector<TpRule>& rules) {
  // Compiled once per rule table; outcomes kept by RuleKey (a 46k-tensor model has a few
  // dozen keys). Single-threaded use (benches and tests).
  struct Compiled {
    std::vector<TpRule> source;  // What `rules` held when compiled.
    std::vector<std::pair<std::regex, TpKind>> rules;
    absl::flat_hash_map<std::string, int> outcome;  // RuleKey -> rule index, -1: none.
  };
  static auto* const compiled = new std::map<const std::vector<TpRule>*, Compiled>();
  Compiled& c = (*compiled)[&rules];
  const bool same = c.source.size() == rules.size() &&
                    std::equal(rules.begin(), rules.end(), c.source.begin(),
                               [](const TpRule& a, const TpRule& b) {
                                 return a.kind == b.kind && a.pattern == b.pattern;
                               });
  if (!same) {
    c.source = rules;
    c.rules.clear();
    c.outcome.clear();
    for (const TpRule& r : rules) c.rules.emplace_back(std::regex(r.pattern), r.kind);
  }
  const std::string key = RuleKey(name);
  auto it = c.outcome.find(key);
  if (it == c.outcome.end()) {
    int found = -1;
    const std::string text(name);
    for (size_t i = 0; i < c.rules.size() && found < 0; ++i) {
      if (std::regex_search(text, c.rules[i].first)) found = static_cast<int>(i);
    }
    it = c.outcome.emplace(key, found).first;
  }
  if (it->second < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("name '", name, "' matches no tensor-parallel rule (MEGATRON_TP_RULES)"));
  }
  return c.rules[it->second].second;
}

absl::StatusOr<std::string> MegatronTpPlacements(absl::string_view name, const Shape& shape,
                                                 const std::vector<TpRule>& rules) {
  absl::StatusOr<TpKind> kind = MegatronTpKind(name, rules);
  if (!kind.ok()) return kind.status();
  if (*kind == TpKind::kReplicate) return std::string("R,R");
  const int dim = *kind == TpKind::kColumn ? 0 : 1;
  if (dim >= static_cast<int>(shape.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape [", absl::StrJoin(shape, ", "), "] of '", name, "' has no dim ", dim,
                     " to split (", *kind == TpKind::kColumn ? "column" : "row", "-parallel)"));
  }
  return absl::StrCat("R,S(", dim, ")");
}

// ---- FSDP flat -----------------------------------------------------------------------------

std::vector<std::pair<int64_t, FlatRange>> FsdpPieces(const ModelTensor& tensor, int64_t total,
                                                      int64_t ranks) {
  std::vector<std::pair<int64_t, FlatRange>> out;
  const int64_t piece = PieceOf(total, ranks);
  if (piece == 0 || tensor.numel == 0) return out;
  const int64_t begin = tensor.flat_offset, end = tensor.flat_offset + tensor.numel;
  for (int64_t r = begin / piece; r < ranks && r * piece < end; ++r) {
    const int64_t start = std::max(r * piece, begin);
    const int64_t stop = std::min({(r + 1) * piece, end, total});
    if (start < stop) out.push_back({r, FlatRange{start - begin, stop - begin}});
  }
  return out;
}

FlatSpec FsdpFlatSpec(const ModelTensor& tensor, int64_t total, int64_t ranks) {
  FlatSpec spec(ranks);
  for (const auto& [rank, range] : FsdpPieces(tensor, total, ranks)) spec[rank].push_back(range);
  return spec;
}

// ---- Layouts -------------------------------------------------------------------------------

absl::StatusOr<WeightSyncLayouts> BuildWeightSyncLayouts(const std::vector<ModelTensor>& tensors,
                                                         const WeightSyncOptions& options) {
  if (options.ranks < 1 || options.tp < 1 || options.ranks % options.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ranks ", options.ranks, " must be a positive ",
                                                   "multiple of tp ", options.tp));
  }
  const std::vector<TpRule>& rules =
      options.rules != nullptr ? *options.rules : ScaleBenchTpRules();
  WeightSyncLayouts out;
  out.ranks = options.ranks;
  out.tp = options.tp;
  absl::StatusOr<DeviceMesh> trainer = DeviceMesh::Create({options.ranks}, {}, {"fsdp"});
  if (!trainer.ok()) return trainer.status();
  absl::StatusOr<DeviceMesh> inference =
      DeviceMesh::Create({options.ranks / options.tp, options.tp}, {}, {"dp", "tp"});
  if (!inference.ok()) return inference.status();
  out.trainer_mesh = *std::move(trainer);
  out.inference_mesh = *std::move(inference);

  const int64_t total = TotalElements(tensors);
  // Interning keys: (shape, every (rank, start, end)) for trainer layouts, (shape, placements
  // index) for inference ones.
  absl::flat_hash_map<std::pair<Shape, std::vector<int64_t>>, int32_t> flat_index;
  absl::flat_hash_map<std::pair<Shape, int32_t>, int32_t> tp_index;
  absl::flat_hash_map<std::string, int32_t> placements_index;
  out.src.reserve(tensors.size());
  out.dst.reserve(tensors.size());
  out.dst_placements.reserve(tensors.size());
  for (const ModelTensor& t : tensors) {
    const std::vector<std::pair<int64_t, FlatRange>> pieces = FsdpPieces(t, total, options.ranks);
    std::vector<int64_t> key;
    key.reserve(pieces.size() * 3);
    for (const auto& [rank, range] : pieces) {
      key.insert(key.end(), {rank, range.start, range.end});
    }
    auto [src_it, src_new] = flat_index.try_emplace(std::make_pair(t.shape, std::move(key)),
                                                    static_cast<int32_t>(out.layouts.size()));
    if (src_new) {
      absl::StatusOr<Layout> layout;
      if (options.dense_flat) {
        layout = Layout::FromFlat(out.trainer_mesh, t.shape, FsdpFlatSpec(t, total, options.ranks));
      } else {
        std::vector<RankChunks> ranks;
        ranks.reserve(pieces.size());
        for (const auto& [rank, range] : pieces) {
          RankChunks& rc = ranks.emplace_back();
          rc.rank = rank;
          rc.coord = {rank};
          for (Box& box : FlatRangeToBoxes(t.shape, range.start, range.end)) {
            const int64_t v = box.Volume();
            rc.chunks.push_back(Chunk{std::move(box), rc.local_elements, 0});
            rc.local_elements += v;
          }
        }
        layout = Layout::FromChunks(t.shape, std::move(ranks));
      }
      if (!layout.ok()) {
        return absl::Status(layout.status().code(), absl::StrCat("trainer layout of '", t.name,
                                                                 "': ", layout.status().message()));
      }
      out.layouts.push_back(*std::move(layout));
    }
    out.src.push_back(src_it->second);

    absl::StatusOr<std::string> placements = MegatronTpPlacements(t.name, t.shape, rules);
    if (!placements.ok()) return placements.status();
    auto [p_it, p_new] =
        placements_index.try_emplace(*placements, static_cast<int32_t>(out.placements.size()));
    if (p_new) out.placements.push_back(*placements);
    out.dst_placements.push_back(p_it->second);
    auto [dst_it, dst_new] = tp_index.try_emplace(std::make_pair(t.shape, p_it->second),
                                                  static_cast<int32_t>(out.layouts.size()));
    if (dst_new) {
      absl::StatusOr<std::vector<Placement>> parsed = ParsePlacements(*placements);
      if (!parsed.ok()) return parsed.status();
      absl::StatusOr<Layout> layout = Layout::FromPlacements(out.inference_mesh, t.shape, *parsed);
      if (!layout.ok()) {
        return absl::Status(layout.status().code(), absl::StrCat("inference layout of '", t.name,
                                                                 "': ", layout.status().message()));
      }
      out.layouts.push_back(*std::move(layout));
    }
    out.dst.push_back(dst_it->second);
  }
  return out;
}

}  // namespace shardcoord
