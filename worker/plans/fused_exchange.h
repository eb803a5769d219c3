#ifndef SHARDCOORD_WORKER_PLANS_FUSED_EXCHANGE_H_
#define SHARDCOORD_WORKER_PLANS_FUSED_EXCHANGE_H_

// Runs a fused group's fragment on one rank (issue 10): the members' local work, and every
// transfer of every member between this rank and each peer as one ordered stream per
// (sender, receiver), cut into buckets (sharding/fused_stream.h) and pipelined, over one
// communicator of the group's exchange ranks. gRPC-free, like the executor.
//
// Schedule. The exchange ranks, sorted, are the communicator's group ranks 0..n-1. Round
// r = 1..n-1 pairs each rank g with g+r (it sends its stream to it) and g-r (it receives
// that one's stream), as the pairwise all-to-all exchange does, so in any round a rank
// sends to one peer and receives from one. A round moves its two streams window by window:
// one grouped SendRecv per window (tag ExchangeTag(plan, r, w)), in which each send packs
// just before it is posted while the earlier ones are on the wire and each receive unpacks
// as it lands. Every rank goes through rounds and windows in the same order and a rank
// skips only (round, window) pairs in which neither of its streams has messages, which its
// peers skip too, so the exchange cannot deadlock. Steps of any kind (all-gathers,
// reductions) run as the transfers they list: a group of many small collectives is one
// exchange per pair, not one collective per tensor.
//
// Memory. Staging comes from the buffers' MemorySpace: one area for a window's messages to
// send that need packing and one for a window's arrivals that do not land in place, each at
// most window_bytes, so at most kBucketsInFlight * bucket_bytes per plan. None is needed for
// a message that lies contiguously in its source chunk (sent from there), that the
// backend sends from strided rows (Communicator::SendsFromRuns: Gloo's same-host copies),
// or that lands contiguously in one target chunk without a reduction.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sharding/plan_fragment.h"
#include "worker/buffers/buffer_store.h"
#include "worker/comm/communicator.h"
#include "worker/plans/executor.h"

namespace shardcoord {

struct GroupMemberBuffers {
  // As ExecuteInput's source and target, for the member at the same index.
  const HostBuffer* source = nullptr;
  HostBuffer* target = nullptr;
};

// What a fused exchange of one fragment on one rank does that depends on neither its buffers
// nor its run: the members' transfers sorted into the streams to and from each peer, and each
// stream cut into messages and windows (defined in fused_exchange.cc).
struct GroupSchedule;

// The schedule of a fragment whose runs repeat (a prepared transfer's resident part): the
// first run cuts it, every later one with the same fragment and bucket size reuses it, so a
// warm run of 10^4-10^5 members does not sort and cut their streams again. Thread-safe.
class GroupScheduleCache {
 public:
  GroupScheduleCache();
  ~GroupScheduleCache();
  // The schedule cut for `fragment` at `bucket_bytes`, or null.
  std::shared_ptr<const GroupSchedule> Find(const Fragment* fragment, int64_t bucket_bytes);
  void Keep(std::shared_ptr<const GroupSchedule> schedule);

 private:
  absl::Mutex mu_;
  std::shared_ptr<const GroupSchedule> schedule_ ABSL_GUARDED_BY(mu_);
};

struct GroupExecuteInput {
  const Fragment* fragment = nullptr;       // A fused one.
  std::vector<GroupMemberBuffers> buffers;  // One per fragment->members, index for index.
  CommunicatorCache* communicators = nullptr;
  CancelToken* cancel = nullptr;  // Optional.
  ProgressCallback progress;      // Optional: after each round.
  ExecutorOptions options;        // default_step_timeout, bucket_bytes.
  // Optional: where the schedule of this fragment's earlier runs is kept. The fragment's
  // members and transfers must not change while it holds their schedule.
  GroupScheduleCache* schedule_cache = nullptr;
};

// One round of the exchange as this rank ran it.
struct ExchangeRound {
  int round = 0;
  int64_t send_peer = -1;  // Global ranks; -1: no stream that way this round.
  int64_t recv_peer = -1;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t buckets_sent = 0;  // Messages.
  int64_t buckets_received = 0;
  int64_t windows = 0;
  absl::Time start;
  absl::Duration time;
};

// The member's target buffer holds its shape's target chunks (it was made of them): the
// result carries only their checksums, index for index.
struct GroupMemberResult {
  std::vector<uint64_t> checksums;
};

struct GroupExecuteResult {
  std::vector<GroupMemberResult> members;  // Index for index with the fragment's.
  std::vector<ExchangeRound> rounds;       // Rounds with traffic, in order.
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t bucket_bytes = 0;   // As used (StreamLimitsFor).
  int64_t staging_bytes = 0;  // Staging allocated (<= kBucketsInFlight * bucket_bytes).
  // How this rank's messages moved: sent packed (several transfers in one), sent from
  // strided source rows (SendsFromRuns), received in place in a target chunk.
  int64_t messages_packed = 0;
  int64_t messages_from_rows = 0;
  int64_t messages_landed_in_place = 0;
};

// Errors as ExecuteFragment's, naming the member ("member 3 (plan p-9, tensor 'w')") or the
// exchange round and peers. A failed group leaves the target buffers unspecified.
absl::StatusOr<GroupExecuteResult> ExecuteGroup(const GroupExecuteInput& input);

// The tag of window `window` of round `round` of plan `plan_id`'s exchange.
uint32_t ExchangeTag(const std::string& plan_id, int round, int window);

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_PLANS_FUSED_EXCHANGE_H_
