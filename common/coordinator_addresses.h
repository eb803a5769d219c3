#ifndef SHARDCOORD_COMMON_COORDINATOR_ADDRESSES_H_
#define SHARDCOORD_COMMON_COORDINATOR_ADDRESSES_H_

// Several coordinators on etcd, one leading: clients and workers are given all their
// addresses ("A,B") and follow the leader. A coordinator that does not lead answers
// UNAVAILABLE and names the leader in the trailing metadata kLeaderMetadataKey; the caller
// then calls the named one, or, without a name (a coordinator that does not answer), the
// next in the list. gRPC-free.

#include <cstddef>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace shardcoord {

// Trailing metadata of a standby coordinator's UNAVAILABLE: the leader's HOST:PORT.
inline constexpr char kLeaderMetadataKey[] = "shardcoord-leader";

// "A, B,,C" -> {"A", "B", "C"}.
std::vector<std::string> SplitAddresses(absl::string_view list);

// Which coordinator to call now. Thread-safe.
class CoordinatorAddresses {
 public:
  // At most this many addresses (the given ones and leaders named in answers).
  static constexpr size_t kMaxAddresses = 32;

  // `list`: "HOST:PORT[,HOST:PORT...]"; an empty list holds one empty address.
  explicit CoordinatorAddresses(absl::string_view list);

  // The address at `index` (stable: addresses are only ever added).
  std::string at(size_t index) const;
  size_t size() const;
  // Index of the coordinator to call.
  size_t current() const;
  // The call to `used` was answered UNAVAILABLE, naming `leader` ("" when it named none):
  // the next call goes to the leader (added when not in the list); when the leader named is
  // `used` itself (the leader busy: a tensor recovering, etcd away), it stays; without a name
  // (a coordinator that did not answer, or one just elected), the next address. Does nothing
  // when another call already moved on from `used`.
  void Unavailable(size_t used, absl::string_view leader);
  // The call to `used` succeeded: keep calling it.
  void Succeeded(size_t used);
  // "A,B" as given, for messages.
  const std::string& list() const { return list_; }

 private:
  const std::string list_;
  mutable absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_COORDINATOR_ADDRESSES_H_
