#ifndef SHARDCOORD_BENCH_LLAMA_STATE_H_
#define SHARDCOORD_BENCH_LLAMA_STATE_H_

// The state dict of a Llama-style decoder as a reusable workload (issue 10's model_bench;
// checkpoints need the same): every parameter's name, shape and Megatron-style target
// placements, and its OLMo-core FSDP flat sharding.
//
// FSDP flat sharding (OLMo-core ShardingSpec over a flat-parameter group): every parameter
// flattened, all concatenated in state-dict order, the whole cut into `ranks` equal ranges
// (ceil(total / ranks) elements each, the last one shorter when it does not divide). A rank's
// local shard is its range of the concatenation; its part of one parameter is the
// intersection, at most one contiguous range, relative to the parameter (FsdpFlatSpec).
//
// Megatron tensor parallelism on a (dp, tp) mesh: column-parallel weights (q, k, v, gate, up)
// and the embedding and lm_head (vocabulary-parallel) split their rows over tp, `R,S(0)`;
// row-parallel weights (o, down) split their columns, `R,S(1)`; norms are replicated, `R,R`.

#include <cstdint>
#include <string>
#include <vector>

#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/placement.h"

namespace shardcoord {

struct LlamaConfig {
  int layers = 16;
  int64_t hidden = 1024;
  int64_t intermediate = 2816;
  int64_t vocab = 32000;
  DType dtype = DType::kBF16;
};

struct LlamaParam {
  std::string name;      // Hugging Face state-dict name: "model.layers.0.self_attn.q_proj.weight".
  Shape shape;           // [out, in] for linear weights, [hidden] for norms.
  std::string megatron;  // Target placements on the (dp, tp) mesh: "R,S(0)", "R,S(1)", "R,R".
  int64_t numel = 0;
  int64_t flat_offset = 0;  // First element in the concatenation of every parameter.
};

// The state dict in Hugging Face order: embedding; per layer q, k, v, o, gate, up, down,
// input norm, post-attention norm; final norm; lm_head (3 + 9 * layers parameters: 147 for
// 16 layers). Flat offsets are filled in.
std::vector<LlamaParam> LlamaStateDict(const LlamaConfig& config = {});

// Elements of the whole concatenation.
int64_t TotalElements(const std::vector<LlamaParam>& params);

// Each rank's [start, end) range of a concatenation of `total` elements cut into `ranks`
// equal ranges.
std::vector<FlatRange> FsdpRankRanges(int64_t total, int ranks);

// `param`'s flat spec under FsdpRankRanges(total, ranks): per rank, its part of the
// parameter relative to the parameter's first element (empty when none).
FlatSpec FsdpFlatSpec(const LlamaParam& param, int64_t total, int ranks);

// The Megatron target mesh: 2 x 2, dims ("dp", "tp").
inline const Shape& MegatronMeshShape() {
  static const Shape* const shape = new Shape{2, 2};
  return *shape;
}
inline const std::vector<std::string>& MegatronMeshDims() {
  static const auto* const dims = new std::vector<std::string>{"dp", "tp"};
  return *dims;
}

}  // namespace shardcoord

#endif  // SHARDCOORD_BENCH_LLAMA_STATE_H_
