#include "common/coordinator_addresses.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace shardcoord {

std::vector<std::string> SplitAddresses(absl::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view a : absl::StrSplit(list, ',')) {
    a = absl::StripAsciiWhitespace(a);
    if (!a.empty()) out.emplace_back(a);
  }
  return out;
}

CoordinatorAddresses::CoordinatorAddresses(absl::string_view list)
    : list_(list), addresses_(SplitAddresses(list)) {
  if (addresses_.empty()) addresses_.emplace_back(list);
}

std::string CoordinatorAddresses::at(size_t index) const {
  absl::MutexLock lock(&mu_);
  return addresses_[index];
}

size_t CoordinatorAddresses::size() const {
  absl::MutexLock lock(&mu_);
  return addresses_.size();
}

size_t CoordinatorAddresses::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

void CoordinatorAddresses::Unavailable(size_t used, absl::string_view leader) {
  absl::MutexLock lock(&mu_);
  if (current_ != used) return;
  if (!leader.empty()) {
    auto it = std::find(addresses_.begin(), addresses_.end(), leader);
    if (it != addresses_.end()) {
      current_ = static_cast<size_t>(it - addresses_.begin());
      return;
    }
    if (addresses_.size() < kMaxAddresses) {
      addresses_.emplace_back(leader);
      current_ = addresses_.size() - 1;
      return;
    }
  }
  current_ = (used + 1) % addresses_.size();
}

void CoordinatorAddresses::Succeeded(size_t used) {
  absl::MutexLock lock(&mu_);
  current_ = used;
}

}  // namespace shardcoord
