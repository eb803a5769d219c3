#ifndef SHARDCOORD_SHARDING_STAGING_H_
#define SHARDCOORD_SHARDING_STAGING_H_

// The staging contract between the coordinator, which admits a plan only when its new
// buffers and its staging fit every worker's memory budget, and the worker's executor, which
// stays within what was reserved. A plan carries a bucket size (PlanFragment.bucket_bytes,
// the same for every member); a rank running a fragment holds at most
// StagingLimit(bucket_bytes) of staging memory at once, and never more than its
// StagingCaps() entry, whatever the bucket size. The executor keeps to it by cutting
// transfers into slabs of at most the bucket size and point-to-point exchanges into windows
// (AssignMessageWindows), and by running a collective as point-to-point when the
// collective's own buffers would exceed the limit.

#include <cstdint>
#include <map>
#include <vector>

#include "absl/types/span.h"
#include "sharding/plan.h"

namespace shardcoord {

// Buckets a rank may have staged at once: one being packed or unpacked while another is on
// the wire.
inline constexpr int64_t kBucketsInFlight = 2;
// A worker's bucket size unless --bucket-bytes says otherwise.
inline constexpr int64_t kDefaultBucketBytes = int64_t{64} << 20;
// The smallest bucket the coordinator chooses to make a plan fit: below this, per-message
// costs dominate.
inline constexpr int64_t kMinBucketBytes = int64_t{64} << 10;

// The staging a fragment may hold at once with buckets of `bucket_bytes`.
inline int64_t StagingLimit(int64_t bucket_bytes) { return kBucketsInFlight * bucket_bytes; }

// Per rank of `plan`: an upper bound of the staging its fragment needs with buckets of any
// size, twice the largest number of bytes it sends plus receives in one step (steps run one
// after another and free their staging; no method stages more than that). Ranks with no
// transfers are absent.
std::map<int64_t, int64_t> StagingCaps(const Plan& plan);

// The staging a rank holds at once with buckets of `bucket_bytes` when it runs fragments
// whose caps are `caps` at the same time: sum of min(StagingLimit(bucket_bytes), cap).
int64_t StagingBytes(absl::Span<const int64_t> caps, int64_t bucket_bytes);

// One message of a point-to-point exchange.
struct WindowMessage {
  int64_t src = 0;
  int64_t dst = 0;
  int64_t bytes = 0;
};

// Cuts an exchange into windows that run one after another, each a complete exchange of its
// messages, so that no rank stages more than `limit` bytes at once: returns each message's
// window (0, 1, ...). Every rank's sent plus received bytes in one window are at most `limit`
// (a larger message gets a window where both its ends have nothing else). Each rank's
// messages are in windows that never decrease along the list, so messages between two ranks
// keep their order. A function of the arguments only: every member of the exchange, given
// the whole list, computes the same windows, so no member waits in window w for a message its
// peer sends in another (deadlock-free: window w needs only windows < w to have completed).
std::vector<int> AssignMessageWindows(absl::Span<const WindowMessage> messages, int64_t limit);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_STAGING_H_
