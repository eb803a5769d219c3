#ifndef SHARDCOORD_COMMON_RATE_LIMIT_H_
#define SHARDCOORD_COMMON_RATE_LIMIT_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardcoord {

// At most `burst` events per `window` (a fixed window): what lets a daemon log what
// unauthenticated callers cause (malformed requests) without letting them flood the log.
class RateLimit {
 public:
  RateLimit(int64_t burst, absl::Duration window) : burst_(burst), window_(window) {}

  // True when the event at `now` may be logged; then `*suppressed` (if set) is how many
  // were refused since the last one allowed, for the line to say so.
  bool Allow(absl::Time now, int64_t* suppressed = nullptr);

 private:
  const int64_t burst_;
  const absl::Duration window_;
  absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_RATE_LIMIT_H_
