#ifndef SHARDCOORD_SHARDING_FUSED_STREAM_H_
#define SHARDCOORD_SHARDING_FUSED_STREAM_H_

// The geometry of a fused group exchange (issue 10): how the transfers of many plans between
// one sender and one receiver travel as one ordered stream of messages ("buckets"). Both
// ends of a pair compute the same cut from the same ordered list of transfer boxes (their
// fragments list them in the group's member order, then plan order) and the same
// bucket_bytes, so no per-bucket metadata travels with the bytes.
//
// Cutting rule, for bucket size B (clamped to at least kMinStreamBucketBytes):
// - a transfer of fewer than pack_below = min(B, 64 KiB) bytes is packed into the open
//   bucket; when it does not fit next to what is there (message_bytes), that bucket is sent
//   first and a new one opened. The last open bucket goes at the end of the stream.
// - a larger transfer goes as messages of its own: row-major pieces of at most
//   message_bytes = min(B, 4 MiB) bytes (at least one element; SplitIntoPieces), so a piece
//   that lies contiguously in the receiver's target lands there in place, and one that lies
//   in the sender's source leaves from there.
// - messages go in windows: consecutive messages of at most window_bytes = B *
//   kBucketsInFlight / 2 bytes (at least one message), one grouped send/recv per window, so
//   a worker's staging in one exchange is at most kBucketsInFlight * B: a window's worth to
//   send and one to receive.

#include <cstdint>
#include <map>
#include <vector>

#include "absl/types/span.h"
#include "sharding/box.h"
#include "sharding/plan.h"
#include "sharding/staging.h"

namespace shardcoord {

// kBucketsInFlight and kDefaultBucketBytes are sharding/staging.h's: a fused exchange stages
// at most StagingLimit(bucket_bytes) per worker and plan, as a single plan does.
// Smaller values are raised to this (the largest element), so every message holds at least
// one element of any dtype.
inline constexpr int64_t kMinStreamBucketBytes = 8;
// Largest message: small enough that packing, sending, landing and hashing pipeline within a
// window (docs/decisions.md, "SendRecv moves transfers as slabs of at most 4 MiB").
inline constexpr int64_t kMaxStreamMessageBytes = int64_t{4} << 20;
// Transfers below this are packed together: moving them alone would cost a message each.
inline constexpr int64_t kPackBelowBytes = int64_t{64} << 10;

struct StreamLimits {
  int64_t bucket_bytes = kDefaultBucketBytes;
  int64_t message_bytes = kMaxStreamMessageBytes;
  int64_t pack_below = kPackBelowBytes;
  int64_t window_bytes = kDefaultBucketBytes * kBucketsInFlight / 2;
};
// The limits for a bucket size (<= 0: kDefaultBucketBytes).
StreamLimits StreamLimitsFor(int64_t bucket_bytes);

// One transfer of a pair's stream: `box` of elements of `element_size` bytes, in row-major
// order of the box.
struct StreamItem {
  Box box;
  int64_t element_size = 0;
};

// Part of an item in a message: `box` (the item's box, or a row-major run of it) occupies
// bytes [offset, offset + bytes) of the message.
struct StreamPiece {
  int32_t item = 0;  // Index into the items.
  Box box;
  int64_t offset = 0;
  int64_t bytes = 0;
};

// One message of a stream. A message with several pieces is a packed bucket; one with a
// single piece may be sent from and land in place.
struct StreamMessage {
  std::vector<StreamPiece> pieces;
  int64_t bytes = 0;
};

// `box` as consecutive row-major pieces of at most max(max_bytes, element_size) bytes each,
// every piece a box; their packed concatenation is `box` packed. One piece when it fits.
std::vector<Box> SplitIntoPieces(const Box& box, int64_t element_size, int64_t max_bytes);

// The messages of a stream of `items` (in stream order); empty items are skipped.
std::vector<StreamMessage> CutStream(absl::Span<const StreamItem> items,
                                     const StreamLimits& limits);

// How many pieces SplitIntoPieces cuts `box` into, without cutting it.
int64_t CountPieces(const Box& box, int64_t element_size, int64_t max_bytes);

// Counts the messages CutStream would make of the items added in order, without making them
// (the coordinator's bucket count of a whole group).
class StreamCounter {
 public:
  explicit StreamCounter(const StreamLimits& limits) : limits_(limits) {}
  void Add(const Box& box, int64_t element_size);
  int64_t messages() const { return messages_ + (open_bytes_ > 0 ? 1 : 0); }

 private:
  StreamLimits limits_;
  int64_t open_bytes_ = 0;
  int64_t messages_ = 0;
};

// The first message of each window of `messages` (empty for no messages).
std::vector<size_t> CutWindows(absl::Span<const StreamMessage> messages,
                               const StreamLimits& limits);

// What a group of plans exchanges when fused: the ranks that send or receive anything (the
// exchange communicator's group, sorted), and the messages over all ordered pairs (each
// pair's transfers in plan order across `plans`, in their order).
struct FusedExchangeStats {
  std::vector<int64_t> ranks;
  int64_t messages = 0;
  int64_t pairs = 0;  // Ordered pairs that exchange anything.
};
FusedExchangeStats FusedExchange(absl::Span<const Plan* const> plans, const StreamLimits& limits);

// Per rank of a fused group of `plans`: an upper bound of the staging its exchange needs with
// buckets of any size (the StagingCaps of sharding/staging.h for a fused fragment). A round
// stages at most its stream to one peer and its stream from another, so the largest stream
// the rank sends plus the largest it receives. Ranks that move nothing are absent.
std::map<int64_t, int64_t> FusedStagingCaps(absl::Span<const Plan* const> plans);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_FUSED_STREAM_H_
