#ifndef SHARDCOORD_COORDINATOR_RPC_CALLER_QUOTA_H_
#define SHARDCOORD_COORDINATOR_RPC_CALLER_QUOTA_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace shardcoord {

// How many of one kind of thing (watch streams, running plans) each caller holds open, against
// a bound per caller (issue 15, limits), so that one client cannot exhaust the coordinator's
// threads and memory for the others. A caller is its token's name, or its host without
// authentication. Thread-safe, gRPC-free.
class CallerQuota {
 public:
  // `what` names the thing in errors ("watch streams"), `flag` the flag that sets `limit`.
  CallerQuota(std::string what, std::string flag, int64_t limit)
      : what_(std::move(what)), flag_(std::move(flag)), limit_(limit) {}

  // Takes one for `caller`; RESOURCE_EXHAUSTED naming the caller, the count and the flag
  // when it already holds `limit`.
  absl::Status Acquire(absl::string_view caller);
  // Gives one back (each successful Acquire once).
  void Release(absl::string_view caller);
  int64_t held(absl::string_view caller) const;

 private:
  const std::string what_;
  const std::string flag_;
  const int64_t limit_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_CALLER_QUOTA_H_
