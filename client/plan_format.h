#ifndef SHARDCOORD_CLIENT_PLAN_FORMAT_H_
#define SHARDCOORD_CLIENT_PLAN_FORMAT_H_

// The logic of `shardctl plan`, free of any command-line library and of the network: turn the
// offline flags into the two layouts and planner options, and render a plan (computed here or
// returned by a coordinator) as JSON or text.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/layout_format.h"
#include "proto/shardcoord.pb.h"
#include "sharding/layout.h"
#include "sharding/plan.h"
#include "sharding/planner.h"

namespace shardcoord {

// Offline `shardctl plan`: the source as `shardctl layout` takes it, and the target's
// differences from it. Each unset target flag defaults to the source's: --to-ranks to the
// source's ranks when the target mesh has as many positions (else 0..n-1), --to-dims to the
// source's names when the target mesh has as many dims, the spec to the source's spec.
struct PlanFlags {
  LayoutFlags source;
  std::optional<std::string> to_mesh;
  std::optional<std::string> to_ranks;
  std::optional<std::string> to_dims;
  std::optional<std::string> to_placements;
  std::optional<std::string> to_flat;
  std::string hosts;  // "h0,h0,h1,h1": the host of global rank 0, 1, ...; empty: unknown.
  std::string cost;   // CostModel overrides: "intra_gbps=100,inter_alpha_us=8"; empty: defaults.
};

struct PlanInput {
  Layout source;
  Layout target;
  DType dtype = DType::kF32;
  PlanOptions options;
};

// Every error is INVALID_ARGUMENT starting with the flag it is about ("--to-placements: ...").
absl::StatusOr<PlanInput> BuildPlanInput(const PlanFlags& flags);

// {"steps": [{"op", "ranks", "bytes", "transfers", "estimated_seconds"[, "root"]
//   [, "reduce_op"]}], "transfers": [{"step", "src", "dst", "offset", "shape", "bytes"
//   [, "reduce", "partial_index"]}], "local_copies": [{"rank", "offset", "shape"}],
//  "traffic": [{"rank", "bytes_sent", "bytes_received"}], "bytes_moved",
//  "lower_bound_bytes", "estimated_seconds"[, "divide_by", "zero_fill_ranks"]
//  [, "id", "tensor"]}
// `transfers` is every piece of element movement, whatever collective realises it (never
// src == dst); `bytes_moved` is their sum. Keys in brackets appear only when they apply.
std::string PlanJson(const v1::Plan& plan);
std::string PlanJson(const Plan& plan);

// A summary: bytes moved vs lower bound, estimate, and a table of steps. `explain` adds the
// per-rank bytes sent and received.
std::string PlanText(const v1::Plan& plan, bool explain);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_PLAN_FORMAT_H_
