#ifndef SHARDCOORD_COORDINATOR_STORE_STATE_STORE_H_
#define SHARDCOORD_COORDINATOR_STORE_STATE_STORE_H_

#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardcoord {

// One durable record of the coordinator's state: (kind, name) -> value. The managers store
// serialized shardcoord.v1 messages ("mesh" -> MeshInfo, "tensor" -> StoredTensor, "worker"
// -> WorkerInfo) and counters ("counter" -> decimal).
struct StateRecord {
  std::string kind;
  std::string name;
  std::string value;

  bool operator==(const StateRecord& o) const {
    return kind == o.kind && name == o.name && value == o.value;
  }
};

// Puts and deletes applied together, all or nothing.
struct StateBatch {
  std::vector<StateRecord> puts;
  std::vector<std::pair<std::string, std::string>> deletes;  // (kind, name)
  // False: Apply may return once the batch survives a crash of this process, before it
  // survives one of the host (SQLite: no fsync; the next synced batch makes it durable too).
  // Only for records whose loss with the host is harmless (request outcomes: the change
  // they answer for was synced before).
  bool sync = true;

  void Put(std::string kind, std::string name, std::string value) {
    puts.push_back({std::move(kind), std::move(name), std::move(value)});
  }
  void Delete(std::string kind, std::string name) {
    deletes.emplace_back(std::move(kind), std::move(name));
  }
  bool empty() const { return puts.empty() && deletes.empty(); }
};

// Where the coordinator keeps the state it must not lose (DESIGN.md "State and failure").
// A manager changes its in-memory state only after Apply returned OK, and the service
// answers a client only after the manager returned: a change is acknowledged only once it is
// durable. Thread-safe. gRPC-free.
class StateStore {
 public:
  virtual ~StateStore() = default;

  // Applies the batch atomically (deletes first, then puts; a put replaces). Returns once
  // it is durable. UNAVAILABLE / INTERNAL when the backing store failed: nothing was applied.
  virtual absl::Status Apply(const StateBatch& batch) = 0;
  // Every record, ordered by (kind, name).
  virtual absl::StatusOr<std::vector<StateRecord>> LoadAll() const = 0;
  // "memory" or "sqlite:<path>", for logs.
  virtual std::string Describe() const = 0;
  // When writes last met trouble outside the coordinator (etcd away, a write whose answer
  // did not come); InfinitePast when never. While a write waits on the store, the handlers
  // behind it wait too and heartbeats go unanswered: the health check declares no worker dead
  // until a heartbeat timeout after such trouble (Coordinator::HealthLoop).
  virtual absl::Time LastTrouble() const { return absl::InfinitePast(); }

  absl::Status Put(std::string kind, std::string name, std::string value);
  absl::Status Delete(std::string kind, std::string name);
  // The records of one kind, by name. The default filters LoadAll; stores that can read one
  // kind alone do (a restart's managers each load their own kinds: a model's 10^5 tensor
  // records are read once, not once per manager).
  virtual absl::StatusOr<std::vector<StateRecord>> Load(absl::string_view kind) const;

  // The records of `kinds`, one kind after the other (each as Load gives them).
  absl::StatusOr<std::vector<StateRecord>> LoadKinds(
      std::initializer_list<absl::string_view> kinds) const;
};

// Today's behaviour: state lives as long as the process. Also the store of unit tests.
class MemoryStateStore : public StateStore {
 public:
  absl::Status Apply(const StateBatch& batch) override;
  absl::StatusOr<std::vector<StateRecord>> LoadAll() const override;
  absl::StatusOr<std::vector<StateRecord>> Load(absl::string_view kind) const override;
  std::string Describe() const override { return "memory"; }

  // Applies committed so far (tests check write-through).
  int64_t applies() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::string> records_ ABSL_GUARDED_BY(mu_);
  int64_t applies_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STORE_STATE_STORE_H_
