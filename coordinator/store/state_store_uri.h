#ifndef SHARDCOORD_COORDINATOR_STORE_STATE_STORE_URI_H_
#define SHARDCOORD_COORDINATOR_STORE_STATE_STORE_URI_H_

// The one place that names the state backends: a URI (--state) says which store the
// coordinator keeps its state in, and OpenStateStore opens it. A new backend adds its scheme
// here (and its StateStore beside this file).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "coordinator/store/etcd_client.h"
#include "coordinator/store/state_store.h"

namespace shardcoord {

// A parsed --state: `memory` (lost on exit), `sqlite:DIR` (DIR/state.db) or
// `etcd://HOST:PORT[,HOST:PORT...]` (several coordinators, one leads).
struct StateStoreUri {
  enum class Scheme { kMemory, kSqlite, kEtcd };

  static StateStoreUri Memory() { return StateStoreUri{}; }
  static StateStoreUri Sqlite(std::string dir) {
    StateStoreUri u;
    u.scheme = Scheme::kSqlite;
    u.dir = std::move(dir);
    return u;
  }

  Scheme scheme = Scheme::kMemory;
  std::string dir;                     // kSqlite: the directory of state.db.
  std::vector<std::string> endpoints;  // kEtcd: etcd's client endpoints (HOST:PORT).

  // Whether the state outlives the process (then a starting coordinator loads it).
  bool durable() const { return scheme != Scheme::kMemory; }
  // "memory", "sqlite:DIR", "etcd://A,B": parses back to the same URI.
  std::string ToString() const;
};

// Parses --`flag` = `value`. The bare `sqlite` (the default, kept for --state-dir) means
// `sqlite:` + `sqlite_dir`. INVALID_ARGUMENT naming --`flag` and the value otherwise (an empty
// directory, another scheme, an etcd endpoint that is not HOST:PORT).
absl::StatusOr<StateStoreUri> ParseStateStoreUri(absl::string_view flag, absl::string_view value,
                                                 absl::string_view sqlite_dir);

// What a store on etcd needs besides its endpoints: it writes only while this process leads
// (coordinator/store/etcd_coordinator.h provides these once elected). Not owned.
struct EtcdStoreEnv {
  EtcdClient* client = nullptr;
  LeaderFence* fence = nullptr;
  Clock* clock = nullptr;
  std::string prefix = "/shardcoord/default";  // --etcd-prefix.
};

// Opens the store `uri` names. kSqlite: SqliteStateStore::Open's errors (FAILED_PRECONDITION
// in use by another coordinator, UNAVAILABLE I/O). kEtcd: needs `etcd` (FAILED_PRECONDITION
// without one: such a store opens only once this coordinator leads); EtcdStateStore::Open's
// errors.
absl::StatusOr<std::unique_ptr<StateStore>> OpenStateStore(const StateStoreUri& uri,
                                                           const EtcdStoreEnv* etcd = nullptr);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STORE_STATE_STORE_URI_H_
