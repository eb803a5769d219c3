#ifndef SHARDCOORD_WORKER_CONTROL_KV_CLIENT_H_
#define SHARDCOORD_WORKER_CONTROL_KV_CLIENT_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardcoord {

// The worker's client to the rendezvous key-value store that communicators bootstrap through
// (in production the coordinator's KvStore, over its KvSet/KvGet RPCs). Keys are written once
// per rendezvous; values are bytes.
class KvClient {
 public:
  virtual ~KvClient() = default;

  // INVALID_ARGUMENT for an empty key; UNAVAILABLE when the store cannot be reached.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // Waits until `key` exists, at most `timeout`. NOT_FOUND when it does not exist and
  // `timeout` is zero; DEADLINE_EXCEEDED when the wait ran out.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;
};

// A process-local KvClient for tests (threads as ranks).
class InMemoryKvClient : public KvClient {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;

  int size() const;

 private:
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_CONTROL_KV_CLIENT_H_
