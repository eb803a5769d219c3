#ifndef SHARDCOORD_COORDINATOR_CLUSTER_KV_STORE_H_
#define SHARDCOORD_COORDINATOR_CLUSTER_KV_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/timer.h"

namespace shardcoord {

// The rendezvous store workers use to bootstrap Gloo and NCCL communicators (Gloo's
// rendezvous::Store semantics: set once, wait for keys) and named barriers. Waits never
// block a thread: GetAsync and Barrier complete through a callback, from Set / the last
// arrival, or from the timer at the deadline. Callbacks run without the store's lock held,
// on the thread that completed them (possibly the caller's, inline). Thread-safe.
class KvStore {
 public:
  using GetCallback = std::function<void(absl::StatusOr<std::string>)>;
  using DoneCallback = std::function<void(absl::Status)>;

  explicit KvStore(Timer* timer) : timer_(timer) {}
  // Pending waits are dropped without their callbacks running; owners stop serving first.
  ~KvStore();

  // INVALID_ARGUMENT empty key. Overwrites; completes every waiter on the key.
  absl::Status Set(absl::string_view key, std::string value);
  // NOT_FOUND when absent.
  absl::StatusOr<std::string> Get(absl::string_view key) const;
  // Completes with the value once the key exists, or DEADLINE_EXCEEDED at `deadline`.
  void GetAsync(absl::string_view key, absl::Time deadline, GetCallback done);

  // Completes OK for everyone once `participants` distinct members have arrived at `key`,
  // or DEADLINE_EXCEEDED for a member whose deadline passes first (it leaves the barrier).
  // A barrier that has completed completes later arrivals at once. INVALID_ARGUMENT empty
  // key or member, participants < 1, or a participant count that differs from the
  // barrier's.
  void Barrier(absl::string_view key, int64_t participants, absl::string_view member,
               absl::Time deadline, DoneCallback done);

  // Removes keys and barriers whose names start with `prefix` (waiters stay); returns how
  // many were removed.
  int DeletePrefix(absl::string_view prefix);

  // Completes every pending wait with `status`, and every later one at once (shutdown).
  void CancelAll(const absl::Status& status);

  size_t num_keys() const;
  size_t num_waiters() const;

 private:
  struct GetWaiter {
    GetCallback done;
    Timer::Id timer = 0;
  };
  struct BarrierMember {
    DoneCallback done;
    Timer::Id timer = 0;
  };
  struct BarrierState {
    int64_t participants = 0;
    bool complete = false;
    std::map<std::string, BarrierMember> waiting;
  };

  void ExpireGet(const std::string& key, int64_t waiter_id, absl::Time deadline);
  void ExpireBarrierMember(const std::string& key, const std::string& member);

  Timer* const timer_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> values_ ABSL_GUARDED_BY(mu_);
  // key -> waiter id -> waiter.
  std::map<std::string, std::map<int64_t, GetWaiter>, std::less<>> get_waiters_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, BarrierState, std::less<>> barriers_ ABSL_GUARDED_BY(mu_);
  int64_t next_waiter_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // Not OK after CancelAll.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_CLUSTER_KV_STORE_H_
