#ifndef SHARDCOORD_COORDINATOR_RPC_REQUEST_LOG_H_
#define SHARDCOORD_COORDINATOR_RPC_REQUEST_LOG_H_

#include <cstddef>
#include <deque>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/store/state_store.h"

namespace shardcoord {

// What a mutating request answered: replayed to a retry with the same request_id.
struct RequestOutcome {
  absl::Status status;
  std::string response;  // The serialized response message (empty unless OK).
};

// The outcomes of mutating requests by client-chosen request_id (issue 12, "idempotent
// retries"), so that a retry of a request that already took effect returns the first outcome
// instead of acting twice. Outcomes are stored in the StateStore before the client hears them
// and survive a restart; the oldest are forgotten beyond `capacity`. Thread-safe, gRPC-free.
//
// Outcomes that say "try again" (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, ABORTED,
// RESOURCE_EXHAUSTED) are not kept: the request did not take effect, and its retry acts anew.
class RequestLog {
 public:
  static constexpr size_t kMaxRequestIdBytes = 128;

  RequestLog(StateStore* store, Clock* clock, size_t capacity = 10000)
      : store_(store), clock_(clock), capacity_(capacity) {}

  // Reads the stored outcomes (once, before serving).
  absl::Status Load();

  // Decides what a request does. std::nullopt: act now (a non-empty id is marked running
  // until Finish). An outcome: answer it without acting. Errors: INVALID_ARGUMENT an id too
  // long, or one used before for another method or other fields; UNAVAILABLE the first
  // request with this id is still running (retry to get its outcome).
  absl::StatusOr<std::optional<RequestOutcome>> Begin(absl::string_view request_id,
                                                      absl::string_view method,
                                                      absl::string_view fingerprint);
  // Records the outcome of a request Begin let act (durably before it returns, unless the
  // outcome says "try again": then the id is forgotten). A store failure is returned; the
  // outcome is still kept in memory, so retries until a restart replay it.
  absl::Status Finish(absl::string_view request_id, const RequestOutcome& outcome);

  size_t size() const;

 private:
  struct Entry {
    std::string method;
    std::string fingerprint;
    bool running = true;
    RequestOutcome outcome;
  };

  StateStore* const store_;  // Not owned; may be null (memory only).
  Clock* const clock_;
  const size_t capacity_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> finished_ ABSL_GUARDED_BY(mu_);  // Oldest first.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_REQUEST_LOG_H_
