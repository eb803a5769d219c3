#ifndef SHARDCOORD_SHARDING_PLAN_H_
#define SHARDCOORD_SHARDING_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sharding/box.h"
#include "sharding/cast.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/placement.h"

namespace shardcoord {

// How an executor applies a Plan (the contract the planner guarantees and the reference
// executor in planner_property_test.cc checks):
//
// - A target chunk "needs a value" unless the target is a Partial layout with op sum and the
//   chunk's partial_index != 0 (those chunks are zero-filled, see zero_fill_ranks).
// - Every LocalCopy and Transfer names a `box` in global coordinates. It is read from the
//   sender's source chunk that contains it (with the same partial_index when the source is
//   Partial) and its elements are written into every target chunk of the receiver that
//   needs a value and holds them (only Partial targets can hold one element twice).
// - Non-reducing copies and transfers overwrite; each needed element arrives exactly once.
// - Reducing ones (`reduce` set; only when the source is Partial): before anything is
//   applied, every target chunk that needs a value is initialised to the identity of
//   `Plan::reduce_op` (0 for sum; +inf, or an integer type's largest value, for min; -inf
//   or the lowest value for max); every reducing LocalCopy and Transfer is then combined
//   into it with `Plan::reduce_op`. Combining is commutative, so steps and copies may run
//   in any order. Each element receives each partial contribution 0..num_partials-1
//   exactly once.
// - Afterwards, if divide_by > 1 (avg sources), divide every element of every target chunk
//   that needs a value by divide_by.
// - A target equal to a Partial source is a no-op: plain local copies (reduce false) of each
//   contribution into the target chunk with the same partial_index, no communication.
// - A plan that casts (`cast_to` set: a Copy between dtypes, a checkpoint load with a dtype;
//   never with a Partial source, so never with a reducing piece) converts every element from
//   `dtype` to the target's dtype by sharding/cast.h's rules. A transfer's elements travel in
//   wire_dtype() (the narrower): the sender packs its source into it and the receiver writes
//   it into its target, each converting where its dtype differs (cast_side()); a local copy
//   converts as it copies. Transfer bytes count wire_dtype().

// One piece of element movement: the elements of `box` (global coordinates) go from rank
// `src`'s source chunks to rank `dst`'s target chunks. Never src == dst (local copies are
// listed separately). When `reduce` is set, the piece is partial contribution
// `partial_index` of a Partial source and dst combines it with the plan's reduce op instead
// of overwriting.
struct Transfer {
  int64_t src = 0;
  int64_t dst = 0;
  Box box;
  int64_t bytes = 0;
  bool reduce = false;
  int64_t partial_index = 0;

  friend bool operator==(const Transfer& a, const Transfer& b) {
    return a.src == b.src && a.dst == b.dst && a.box == b.box && a.bytes == b.bytes &&
           a.reduce == b.reduce && a.partial_index == b.partial_index;
  }
};

// A copy inside one rank: `box` from its source chunks into its target chunks (or, with
// `reduce`, combined into what is there).
struct LocalCopy {
  int64_t rank = 0;
  Box box;
  bool reduce = false;
  int64_t partial_index = 0;
  // -1, or the index of a reducing collective step (all-reduce, reduce-scatter) whose
  // collective already consumes this rank's own contribution: an executor that runs that
  // step as the collective skips this copy; one that runs it as point-to-point applies it.
  int64_t collective_step = -1;

  friend bool operator==(const LocalCopy& a, const LocalCopy& b) {
    return a.rank == b.rank && a.box == b.box && a.reduce == b.reduce &&
           a.partial_index == b.partial_index && a.collective_step == b.collective_step;
  }
};

enum class StepOp : int {
  kAllGather = 1,
  kReduceScatter = 2,
  kAllReduce = 3,
  kAllToAll = 4,
  kBroadcast = 5,
  kPointToPoint = 6,  // One grouped exchange of arbitrary transfers.
};

std::string StepOpName(StepOp op);  // "all_gather", "reduce_scatter", ..., "p2p"

// One communication step over a process group. Whatever the op, `transfers` lists exactly the
// element movement the step performs, so an executor can always run it as grouped
// point-to-point; the op says which collective realises the same movement. Collectives may
// be uneven (allgatherv-style pieces; uneven shards are never padded). For kAllGather and
// kReduceScatter, `ranks` lists members in the order of their pieces. Steps of one plan
// are independent of each other (each reads only source chunks and writes only target
// chunks), except that reducing steps on the same target box must all complete before the
// value is final.
struct Step {
  StepOp op = StepOp::kPointToPoint;
  std::vector<int64_t> ranks;           // The process group, in collective rank order.
  int64_t root = -1;                    // kBroadcast: the sending rank.
  ReduceOp reduce_op = ReduceOp::kSum;  // Reducing steps: sum, min or max (avg sums).
  std::vector<Transfer> transfers;
  int64_t bytes = 0;  // Sum of transfer bytes.
  double estimated_seconds = 0;
};

// Per-rank totals, for balancing and --explain.
struct RankTraffic {
  int64_t rank = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

// The whole movement for one tensor. The reduction rule (identity-initialise the target
// chunks that need a value, combine every reducing piece in any order, then divide for avg)
// is spelled out at the top of this file.
struct Plan {
  Layout source;
  Layout target;
  DType dtype = DType::kF32;  // The source's elements.
  // The target's dtype when it differs from `dtype` (a plan that casts); empty: no cast.
  std::optional<DType> cast_to;
  std::vector<LocalCopy> local_copies;
  std::vector<Step> steps;
  // For a target that is Partial with op sum (the value goes to contribution 0): the ranks
  // holding target chunks with partial_index != 0; the executor fills exactly those chunks
  // of these ranks with zeros. Sorted.
  std::vector<int64_t> zero_fill_ranks;
  // Post-processing for ReduceOp::kAvg sources: divide the reduced value by this (else 1).
  int64_t divide_by = 1;
  // How reducing copies and transfers combine: the source's op, with kAvg summed (then
  // divided by divide_by).
  ReduceOp reduce_op = ReduceOp::kSum;
  std::vector<RankTraffic> traffic;
  int64_t bytes_moved = 0;  // Sum of all transfer bytes.
  // Sum over destinations of the bytes they need and do not hold. For Partial sources, each
  // partial contribution counts separately (the element movement a reduction implies).
  int64_t lower_bound_bytes = 0;
  // Transfer bytes between ranks of one host and across hosts (PlanOptions' hosts; a rank of
  // unknown host is alone on its own); within + across == bytes_moved.
  int64_t bytes_within_hosts = 0;
  int64_t bytes_across_hosts = 0;
  // The part of lower_bound_bytes that must cross hosts: pieces a destination needs of which
  // no rank on its host holds a copy. The planner meets it for non-Partial sources.
  int64_t cross_host_lower_bound_bytes = 0;
  // Each rank runs the steps it is in one after another, different ranks in parallel: the
  // largest per-rank sum of step estimates (see EstimatePlan).
  double estimated_seconds = 0;

  // All transfers of all steps, in step order.
  std::vector<Transfer> AllTransfers() const;

  DType target_dtype() const { return cast_to.value_or(dtype); }
  // What transfers carry: the narrower of dtype and target_dtype() (sharding/cast.h).
  DType wire_dtype() const { return WireDType(dtype, target_dtype()); }
  CastSide cast_side() const { return CastSideOf(dtype, target_dtype()); }
};

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_PLAN_H_
