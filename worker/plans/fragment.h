#ifndef SHARDCOORD_WORKER_PLANS_FRAGMENT_H_
#define SHARDCOORD_WORKER_PLANS_FRAGMENT_H_

// A plan fragment as the executor takes it. The sharding type (`Fragment`, sharding/
// plan_fragment.h) and its field-by-field conversion (`FragmentFromProto`, proto/convert.h)
// live elsewhere; this adds the checks that only the executing rank can make: every piece it
// reads lies in one of its source chunks, every piece it writes in one of its target chunks,
// and every step member has an incarnation.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/convert.h"
#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/layout.h"
#include "sharding/plan_fragment.h"

namespace shardcoord {

// INVALID_ARGUMENT whose message starts with the offending field ("steps[1].transfers[3]:
// box [0:4, 2:6] lies in no source chunk of rank 2"; a fused fragment's with "shapes[i].").
// Members name shapes that exist; a fragment that is not fused has one shape and one member.
absl::Status ValidateFragment(const Fragment& fragment);

// The one worker-side entry: FragmentFromProto (either wire shape), then ValidateFragment.
absl::StatusOr<Fragment> ParseFragment(const v1::PlanFragment& proto);

// Whether the source is Partial (contributions are told apart by partial_index).
inline bool SourceIsPartial(const FragmentShape& f) { return f.num_partials > 1; }

// The index of the source chunk of `chunks` that contains `box` (with `partial_index` when
// `match_partial`), or -1.
int FindContainingChunk(const RankChunks& chunks, const Box& box, bool match_partial,
                        int64_t partial_index);

// Whether target chunk `c` receives a value (zero-filled contributions do not).
inline bool NeedsValue(const FragmentShape& f, const Chunk& c) {
  return !(f.zero_fill && c.partial_index != 0);
}

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_PLANS_FRAGMENT_H_
