#ifndef SHARDCOORD_BENCH_MODEL_SHAPES_H_
#define SHARDCOORD_BENCH_MODEL_SHAPES_H_

// Frontier-model state dicts and the layouts of a weight-sync step (issue 27, scale_bench):
// every tensor of a public model's Hugging Face checkpoint (real names and shapes, bf16),
// derived from the values of its config.json, and the two layouts a trainer -> inference
// weight sync moves them between:
//
// - trainer: FSDP flat over all W ranks (OLMo-core ShardingSpec, as the Python
//   `shardcoord.layouts.fsdp_flat`): every tensor flattened, all concatenated in state-dict
//   order (N elements), rank r holding [r*ceil(N/W), min((r+1)*ceil(N/W), N)) of the
//   concatenation; each tensor gets the per-rank ranges of its own elements, on a 1-d mesh of
//   the W ranks;
// - inference: tensor parallel 8 x data parallel W/8 on a (dp, tp) mesh over the same ranks,
//   Megatron style by parameter name (`shardcoord.layouts.megatron_tp`, its rule table
//   MEGATRON_TP_RULES): column-parallel "R,S(0)", row-parallel "R,S(1)", the rest "R,R".
//
// Layouts are built for scale: a flat layout lists only the ranks that hold a piece of its
// tensor (most tensors of a 671B model live on one or two of 256 ranks), and one Layout
// object serves every tensor with the same (shape, placements) or the same (shape, flat
// ranges): copies of a Layout share its representation.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace shardcoord {

// The config.json values the state dict follows (Hugging Face names in comments).
struct DecoderConfig {
  std::string name;              // "deepseek-v3", ...
  int layers = 0;                // num_hidden_layers
  int64_t hidden = 0;            // hidden_size
  int64_t intermediate = 0;      // intermediate_size (dense MLP layers)
  int64_t vocab = 0;             // vocab_size
  bool tied_embeddings = false;  // tie_word_embeddings: no lm_head.weight of its own
  // Attention without low-rank projections (Llama, Qwen): q/k/v/o_proj.
  int64_t heads = 0;     // num_attention_heads
  int64_t kv_heads = 0;  // num_key_value_heads
  int64_t head_dim = 0;  // head_dim (hidden / heads when the config has none)
  bool qk_norm = false;  // Qwen3: self_attn.q_norm / k_norm of head_dim
  // Multi-head latent attention (DeepSeek): q_lora_rank > 0 selects it.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // Mixture of experts: routed_experts > 0 makes layers >= first_dense_layers MoE layers.
  int routed_experts = 0;        // n_routed_experts / num_experts
  int shared_experts = 0;        // n_shared_experts (one shared MLP of shared * moe_intermediate)
  int first_dense_layers = 0;    // first_k_dense_replace
  int64_t moe_intermediate = 0;  // moe_intermediate_size
  bool router_bias = false;      // mlp.gate.e_score_correction_bias (DeepSeek's noaux_tc)
  // DeepSeek's multi-token prediction modules the checkpoint carries after the main model
  // (num_nextn_predict_layers): model.layers.<layers + i>.*.
  int mtp_layers = 0;
};

// The configs of the models scale_bench knows, by name: "deepseek-v3", "qwen3-235b-a22b",
// "llama3-405b". NOT_FOUND names the known ones.
absl::StatusOr<DecoderConfig> ModelConfig(absl::string_view model);
const std::vector<std::string>& ModelNames();

struct ModelTensor {
  std::string name;  // Hugging Face checkpoint name: "model.layers.3.mlp.experts.0.up_proj.weight"
  Shape shape;
  DType dtype = DType::kBF16;
  int64_t numel = 0;
  int64_t flat_offset = 0;  // First element in the concatenation of every tensor before it.
};

// Every tensor of the checkpoint in state-dict order (the modules' construction order):
// model.embed_tokens; per layer self_attn, mlp, input_layernorm, post_attention_layernorm;
// model.norm; lm_head; then the MTP modules. Flat offsets are filled in.
std::vector<ModelTensor> StateDict(const DecoderConfig& config);
// StateDict(ModelConfig(model)).
absl::StatusOr<std::vector<ModelTensor>> ModelStateDict(absl::string_view model);

// Elements of the whole concatenation (the parameter count).
int64_t TotalElements(const std::vector<ModelTensor>& tensors);
int64_t TotalBytes(const std::vector<ModelTensor>& tensors);

// The first `n` tensors (all when n >= size), as a model of their own: flat offsets stay
// (they count only the tensors before), the concatenation ends with the last one kept.
std::vector<ModelTensor> FirstTensors(std::vector<ModelTensor> tensors, size_t n);

// ---- Megatron tensor parallelism by name (shardcoord.layouts.megatron_tp) ------------------

enum class TpKind { kColumn, kRow, kReplicate };

// (pattern searched in the name, kind): the first match wins. ECMAScript syntax, the same
// expressions as Python's re.
struct TpRule {
  std::string pattern;
  TpKind kind;
};
// MEGATRON_TP_RULES of client/python/shardcoord/layouts.py, in its order.
const std::vector<TpRule>& MegatronTpRules();
// MegatronTpRules() and, after them, what DeepSeek's MTP module needs (the Python table
// matches neither; pass rules= there): eh_proj replicated (vLLM's DeepSeekMultiTokenPredictor
// holds it as a plain nn.Linear) and shared_head.head column-parallel (a ParallelLMHead).
const std::vector<TpRule>& ScaleBenchTpRules();

// The kind of the first rule matching `name`; INVALID_ARGUMENT when none does (as Python's
// ValueError).
absl::StatusOr<TpKind> MegatronTpKind(absl::string_view name,
                                      const std::vector<TpRule>& rules = MegatronTpRules());
// megatron_tp(name, shape, tp, dp) on a (dp, tp) mesh: "R,S(0)", "R,S(1)" or "R,R".
// INVALID_ARGUMENT no rule matches, or the split dim is not in the shape.
absl::StatusOr<std::string> MegatronTpPlacements(
    absl::string_view name, const Shape& shape,
    const std::vector<TpRule>& rules = MegatronTpRules());

// ---- FSDP flat (shardcoord.layouts.fsdp_flat) ----------------------------------------------

// The ranks holding a piece of `tensor` under FSDP flat sharding of a concatenation of
// `total` elements over `ranks` ranks, with the range of the tensor's own elements each
// holds, by rank: only ranks that hold something.
std::vector<std::pair<int64_t, FlatRange>> FsdpPieces(const ModelTensor& tensor, int64_t total,
                                                      int64_t ranks);
// The same as a dense FlatSpec (one entry per rank, empty where it holds nothing): what
// fsdp_flat's text for the tensor says (FlatSpecToString gives "0:4;4:6;").
FlatSpec FsdpFlatSpec(const ModelTensor& tensor, int64_t total, int64_t ranks);

// ---- The layouts of a weight sync ----------------------------------------------------------

struct WeightSyncLayouts {
  int64_t ranks = 0;
  int64_t tp = 0;
  DeviceMesh trainer_mesh;    // [ranks], ranks 0..ranks-1
  DeviceMesh inference_mesh;  // [ranks / tp, tp] named (dp, tp), ranks 0..ranks-1
  // Distinct layouts, in the order of first use (each tensor's trainer, then inference one).
  std::vector<Layout> layouts;
  std::vector<int32_t> src;             // Per tensor: its trainer layout (index into layouts).
  std::vector<int32_t> dst;             // Per tensor: its inference layout.
  std::vector<std::string> placements;  // Distinct inference placements texts ("R,S(0)").
  std::vector<int32_t> dst_placements;  // Per tensor: index into placements.
};

struct WeightSyncOptions {
  int64_t ranks = 256;
  int64_t tp = 8;
  const std::vector<TpRule>* rules = nullptr;  // null: ScaleBenchTpRules()
  // Trainer layouts through Layout::FromFlat on the whole mesh (every rank listed, empty
  // where it holds nothing; the flat spec kept), as the coordinator builds a tensor created
  // with a flat spec; false: only the ranks holding a piece (Layout::FromChunks).
  bool dense_flat = false;
};

// INVALID_ARGUMENT: ranks < 1, tp not dividing ranks, a name no rule matches.
absl::StatusOr<WeightSyncLayouts> BuildWeightSyncLayouts(const std::vector<ModelTensor>& tensors,
                                                         const WeightSyncOptions& options);

}  // namespace shardcoord

#endif  // SHARDCOORD_BENCH_MODEL_SHAPES_H_
