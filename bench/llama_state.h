#ifndef SHARDCOORD_BENCH_LLAMA_STATE_H_
#define SHARDCOORD_BENCH_LLAMA_STATE_H_

// The model-scale workload of issues 10 and 13: the state dict of a Llama-style decoder and
// its two layouts, FSDP flat sharding (OLMo-core's ShardingSpec) and Megatron tensor
// parallelism on a (dp, tp) mesh. Shared by //bench:checkpoint_bench and //bench:model_bench.

#include <cstdint>
#include <string>
#include <vector>

#include "sharding/box.h"
#include "sharding/dtype.h"

namespace shardcoord {

struct LlamaConfig {
  int layers = 16;
  int64_t hidden = 1024;
  int64_t intermediate = 2816;
  int64_t vocab = 32000;
  DType dtype = DType::kBF16;
};

struct StateTensor {
  std::string name;  // Hugging Face style: "model.layers.0.self_attn.q_proj.weight".
  Shape shape;       // torch.nn.Linear weights are [out, in].
  DType dtype = DType::kBF16;
  // Megatron on a (dp, tp) mesh: column-parallel (q, k, v, gate, up, embedding, lm_head)
  // "R,S(0)", row-parallel (o, down) "R,S(1)", norms "R,R".
  std::string megatron;
};

// Embedding, then per layer q, k, v, o, gate, up, down and the two norms, then the final norm
// and lm_head: 9 * layers + 3 tensors (147 and about 0.54 GB with the defaults).
std::vector<StateTensor> LlamaStateDict(const LlamaConfig& config = {});

int64_t StateBytes(const std::vector<StateTensor>& state);

// OLMo-core FSDP flat sharding over `ranks` ranks: every tensor flattened, all concatenated in
// order, the whole cut into `ranks` equal ranges (the last takes the remainder). For each
// tensor, its flat spec in shardctl syntax: one entry per rank, ';'-separated, each the range
// "a:b" of the tensor's own flat indices that rank holds, or empty.
std::vector<std::string> FsdpFlatSpecs(const std::vector<StateTensor>& state, int ranks);

}  // namespace shardcoord

#endif  // SHARDCOORD_BENCH_LLAMA_STATE_H_
