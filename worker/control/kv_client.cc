#include "worker/control/kv_client.h"

#include "absl/strings/str_cat.h"

namespace shardcoord {

absl::Status InMemoryKvClient::Set(absl::string_view key, absl::string_view value) {
  if (key.empty()) return absl::InvalidArgumentError("empty key");
  absl::MutexLock lock(&mu_);
  values_[key] = std::string(value);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryKvClient::Get(absl::string_view key, absl::Duration timeout) {
  if (key.empty()) return absl::InvalidArgumentError("empty key");
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = values_.find(key);
    if (it != values_.end()) return it->second;
    if (timeout <= absl::ZeroDuration()) {
      return absl::NotFoundError(absl::StrCat("no key '", key, "'"));
    }
    if (changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      if (values_.contains(key)) return values_.find(key)->second;
      return absl::DeadlineExceededError(
          absl::StrCat("key '", key, "' did not appear within ", absl::FormatDuration(timeout)));
    }
  }
}

int InMemoryKvClient::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(values_.size());
}

}  // namespace shardcoord
