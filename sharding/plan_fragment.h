#ifndef SHARDCOORD_SHARDING_PLAN_FRAGMENT_H_
#define SHARDCOORD_SHARDING_PLAN_FRAGMENT_H_

// What one rank does in a plan or in a fused transaction of plans: what a worker executes.
// A fragment is a list of templates (`shapes`: what the rank does in each distinct plan) and
// the members each applies to (which tensors and versions). A single plan is one shape with
// one member. proto/convert.h converts fragments to v1::PlanFragment and back.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/plan.h"

namespace shardcoord {

// What one rank does in one plan, whatever tensors it applies to.
struct FragmentShape {
  int64_t rank = 0;           // The fragment's rank: a shape is what that rank does on its own.
  DType dtype = DType::kF32;  // The source's elements.
  // The cast of the member's plan (Plan::cast_to): the target buffer's dtype when it differs
  // from `dtype`. A property of the shape, so every path that carries shapes (a single plan, a
  // fused group, a prepared transfer's templates) carries the member's cast with it: the
  // sender packs into wire_dtype(), the receiver unpacks into target_dtype().
  std::optional<DType> cast_to;
  RankChunks source;  // chunks empty when the rank holds no source.
  RankChunks target;
  std::vector<LocalCopy> local_copies;
  // A single plan's: the steps whose process group holds the rank, in plan order. Parsed
  // from the wire (a worker's), they are in `steps`; made from a plan (MakeFragments), they
  // are borrowed from it (`plan_steps`, valid while the plan is), not copied: the coordinator
  // only converts them to the wire, once per participant of every plan. Read them with
  // num_steps() and step(i)...
  std::vector<Step> steps;
  std::vector<int> step_indices;  // Plan-wide index of step(i).
  const std::vector<Step>* plan_steps = nullptr;
  // ...a fused transaction's: the transfers the rank sends or receives, in plan order
  // (`steps` is empty; the transaction's exchange moves them).
  std::vector<Transfer> transfers;
  bool zero_fill = false;
  int64_t divide_by = 1;
  ReduceOp reduce_op = ReduceOp::kSum;
  int64_t num_partials = 1;

  DType target_dtype() const { return cast_to.value_or(dtype); }
  DType wire_dtype() const { return WireDType(dtype, target_dtype()); }

  size_t num_steps() const { return plan_steps != nullptr ? step_indices.size() : steps.size(); }
  const Step& step(size_t i) const {
    return plan_steps != nullptr ? (*plan_steps)[step_indices[i]] : steps[i];
  }
};

// Which tensors and versions a shape applies to.
struct FragmentMember {
  int32_t index = 0;  // Position in the transaction (0 for a single plan).
  std::string plan_id;
  std::string tensor;         // Read at source_version.
  std::string target_tensor;  // Written at target_version: `tensor` unless a Copy.
  int64_t source_version = 0;
  int64_t target_version = 0;
  int64_t attached_target_version = 0;  // > 0: write that attached buffer in place.
  int shape = 0;                        // Index into Fragment::shapes.
};

struct Fragment {
  std::string plan_id;  // The plan's, or the transaction's.
  int64_t rank = 0;
  // false: one plan (one shape, one member) whose steps run in order; true: a fused
  // transaction, every member's transfers in one exchange over `exchange_ranks`.
  bool fused = false;
  std::vector<FragmentShape> shapes;
  std::vector<FragmentMember> members;  // In the transaction's order.
  // Fused: every rank that sends or receives any transfer, sorted (empty when this rank
  // moves nothing).
  std::vector<int64_t> exchange_ranks;
  // The incarnation of every rank this one communicates with (and its own): the members of
  // its steps, or exchange_ranks.
  absl::flat_hash_map<int64_t, int64_t> member_incarnations;
  int64_t bucket_bytes = 0;  // The plan's bucket size; 0: the worker's default.
  int64_t step_timeout_ms = 0;
  std::string communicator_prefix;

  const FragmentShape& shape_of(size_t member) const { return shapes[members[member].shape]; }
};

// Who a member is, besides its plan.
struct FragmentMemberOptions {
  int32_t index = 0;  // Position in the transaction.
  std::string plan_id;
  std::string tensor;
  std::string target_tensor;  // A Copy's dst; empty = `tensor`.
  int64_t source_version = 0;
  int64_t target_version = 0;
  // A Copy into an attached tensor: its committed version, whose buffers are written in
  // place (set for the target layout's ranks only); 0 = new buffers.
  int64_t attached_target_version = 0;
};

// What every fragment of one plan or transaction shares.
struct FragmentOptions {
  std::string plan_id;                                 // The plan's or the transaction's.
  bool fused = false;                                  // As Fragment::fused.
  absl::flat_hash_map<int64_t, int64_t> incarnations;  // Missing ranks get 0.
  int64_t step_timeout_ms = 0;
  std::string communicator_prefix;
  int64_t bucket_bytes = 0;
};

// Every participant's fragment of `plans` (members[i] describes plans[i]), by rank. Not
// fused: exactly one plan and member; each rank gets its chunks, local copies and only the
// steps whose group contains it (borrowed from the plan, with their plan-wide index), and the
// incarnations of those steps' members. Fused: each rank gets the shape of every distinct plan it
// takes part in (members whose plans are the same object share one), with its chunks, local copies
// and only the transfers it sends or receives, in plan order; the members in the transaction's
// order; exchange_ranks with their incarnations when it is among them.
// `rank`'s shape of `plan` in a fused transaction, as MakeFragments makes it (its chunks, local
// copies and the transfers it sends or receives, in plan order, owned), into *out; false when
// the rank holds no chunk of either layout and has nothing to copy, fill or move.
bool FusedShapeFor(const Plan& plan, int64_t rank, FragmentShape* out);

std::map<int64_t, Fragment> MakeFragments(absl::Span<const Plan* const> plans,
                                          absl::Span<const FragmentMemberOptions> members,
                                          const FragmentOptions& options);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_PLAN_FRAGMENT_H_
