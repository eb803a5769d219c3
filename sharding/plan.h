#ifndef SHARDCOORD_SHARDING_PLAN_H_
#define SHARDCOORD_SHARDING_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/placement.h"

namespace shardcoord {

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

  friend bool operator==(const LocalCopy& a, const LocalCopy& b) {
    return a.rank == b.rank && a.box == b.box && a.reduce == b.reduce &&
           a.partial_index == b.partial_index;
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
// point-to-point; the op says which collective realises the same movement. Steps of one plan
// are independent of each other (each reads only source chunks and writes only target
// chunks), except that reducing steps on the same target box must all complete before the
// value is final.
struct Step {
  StepOp op = StepOp::kPointToPoint;
  std::vector<int64_t> ranks;  // The process group, in collective rank order.
  int64_t root = -1;           // kBroadcast: the sending rank.
  ReduceOp reduce_op = ReduceOp::kSum;  // Reducing ops.
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

struct Plan {
  Layout source;
  Layout target;
  DType dtype = DType::kF32;
  std::vector<LocalCopy> local_copies;
  std::vector<Step> steps;
  // For a target that is Partial: target ranks whose partial contribution must be zero (sum
  // targets put the value on contribution 0 and zeros elsewhere).
  std::vector<int64_t> zero_fill_ranks;
  // Post-processing for ReduceOp::kAvg sources: divide the reduced value by this (else 1).
  int64_t divide_by = 1;
  std::vector<RankTraffic> traffic;
  int64_t bytes_moved = 0;        // Sum of all transfer bytes.
  int64_t lower_bound_bytes = 0;  // Bytes each destination needs and does not hold.
  double estimated_seconds = 0;

  // All transfers of all steps, in step order.
  std::vector<Transfer> AllTransfers() const;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_PLAN_H_
