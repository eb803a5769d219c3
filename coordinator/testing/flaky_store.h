#ifndef SHARDCOORD_COORDINATOR_TESTING_FLAKY_STORE_H_
#define SHARDCOORD_COORDINATOR_TESTING_FLAKY_STORE_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "coordinator/store/state_store.h"

namespace shardcoord {

// A state store in memory whose writes fail, UNAVAILABLE with `error`, while `down` (a full
// disk, etcd away).
class FlakyStore : public MemoryStateStore {
 public:
  explicit FlakyStore(std::string error = "store down") : error_(std::move(error)) {}

  absl::Status Apply(const StateBatch& batch) override {
    if (down) return absl::UnavailableError(error_);
    return MemoryStateStore::Apply(batch);
  }

  bool down = false;

 private:
  const std::string error_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TESTING_FLAKY_STORE_H_
