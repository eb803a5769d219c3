#ifndef SHARDCOORD_WORKER_PLANS_FRAGMENT_H_
#define SHARDCOORD_WORKER_PLANS_FRAGMENT_H_

// A plan fragment as the executor takes it. The C++ struct mirroring
// shardcoord.v1.PlanFragment and its field-by-field conversion live in proto/convert.h
// (`Fragment`, `FragmentFromProto`); this adds the checks that only the executing rank can
// make: every piece it reads lies in one of its source chunks, every piece it writes in one
// of its target chunks, and every step member has an incarnation.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/convert.h"
#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/layout.h"

namespace shardcoord {

// INVALID_ARGUMENT whose message starts with the offending field ("steps[1].transfers[3]:
// box [0:4, 2:6] lies in no source chunk of rank 2").
absl::Status ValidateFragment(const Fragment& fragment);

// FragmentFromProto, then ValidateFragment.
absl::StatusOr<Fragment> ParseFragment(const v1::PlanFragment& proto);

// A fused group's fragment: GroupFragmentFromProto, then ValidateFragment of every shape
// (its errors prefixed with "shapes[i].").
absl::StatusOr<GroupFragment> ParseGroupFragment(const v1::PlanFragment& proto);

// Whether the source is Partial (contributions are told apart by partial_index).
inline bool SourceIsPartial(const Fragment& f) { return f.num_partials > 1; }

// The index of the source chunk of `chunks` that contains `box` (with `partial_index` when
// `match_partial`), or -1.
int FindContainingChunk(const RankChunks& chunks, const Box& box, bool match_partial,
                        int64_t partial_index);

// Whether target chunk `c` receives a value (zero-filled contributions do not).
inline bool NeedsValue(const Fragment& f, const Chunk& c) {
  return !(f.zero_fill && c.partial_index != 0);
}

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_PLANS_FRAGMENT_H_
