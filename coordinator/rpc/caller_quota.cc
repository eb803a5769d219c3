#include "coordinator/rpc/caller_quota.h"

#include "absl/strings/str_cat.h"

namespace shardcoord {

absl::Status CallerQuota::Acquire(absl::string_view caller) {
  absl::MutexLock lock(&mu_);
  int64_t& n = held_[caller];
  if (n >= limit_) {
    return absl::ResourceExhaustedError(absl::StrCat("caller '", caller, "' holds ", n, " ", what_,
                                                     ", the limit per caller (", flag_, "=", limit_,
                                                     "); wait for one to end"));
  }
  ++n;
  return absl::OkStatus();
}

void CallerQuota::Release(absl::string_view caller) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(caller);
  if (it == held_.end()) return;
  if (--it->second <= 0) held_.erase(it);
}

int64_t CallerQuota::held(absl::string_view caller) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(caller);
  return it == held_.end() ? 0 : it->second;
}

}  // namespace shardcoord
