#include "common/rate_limit.h"

namespace shardcoord {

bool RateLimit::Allow(absl::Time now, int64_t* suppressed) {
  absl::MutexLock lock(&mu_);
  if (now - window_start_ >= window_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++suppressed_;
    return false;
  }
  ++in_window_;
  if (suppressed != nullptr) *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

}  // namespace shardcoord
