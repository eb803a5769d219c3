#include "coordinator/store/state_store_uri.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/store/etcd_state_store.h"
#include "coordinator/store/sqlite_state_store.h"

namespace shardcoord {
namespace {

constexpr absl::string_view kSqlitePrefix = "sqlite:";
constexpr absl::string_view kEtcdPrefix = "etcd://";
constexpr absl::string_view kForms =
    "memory, sqlite (in --state-dir), sqlite:DIR or etcd://HOST:PORT[,HOST:PORT...]";

absl::Status Bad(absl::string_view flag, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": '", value, "' ", why, " (expected ", kForms, ")"));
}

}  // namespace

std::string StateStoreUri::ToString() const {
  switch (scheme) {
    case Scheme::kMemory:
      return "memory";
    case Scheme::kSqlite:
      return absl::StrCat(kSqlitePrefix, dir);
    case Scheme::kEtcd:
      return absl::StrCat(kEtcdPrefix, absl::StrJoin(endpoints, ","));
  }
  return "";
}

absl::StatusOr<StateStoreUri> ParseStateStoreUri(absl::string_view flag, absl::string_view value,
                                                 absl::string_view sqlite_dir) {
  if (value == "memory") return StateStoreUri::Memory();
  if (value == "sqlite") {
    if (sqlite_dir.empty()) return Bad(flag, value, "needs a directory: --state-dir is empty");
    return StateStoreUri::Sqlite(std::string(sqlite_dir));
  }
  if (absl::StartsWith(value, kSqlitePrefix)) {
    absl::string_view dir = value.substr(kSqlitePrefix.size());
    if (dir.empty()) return Bad(flag, value, "names no directory");
    return StateStoreUri::Sqlite(std::string(dir));
  }
  if (absl::StartsWith(value, kEtcdPrefix)) {
    absl::StatusOr<std::vector<std::string>> endpoints = ParseEtcdUrl(flag, value);
    if (!endpoints.ok()) return endpoints.status();
    StateStoreUri uri;
    uri.scheme = StateStoreUri::Scheme::kEtcd;
    uri.endpoints = *std::move(endpoints);
    return uri;
  }
  return Bad(flag, value, "is not a state store");
}

absl::StatusOr<std::unique_ptr<StateStore>> OpenStateStore(const StateStoreUri& uri,
                                                           const EtcdStoreEnv* etcd) {
  switch (uri.scheme) {
    case StateStoreUri::Scheme::kMemory:
      return std::make_unique<MemoryStateStore>();
    case StateStoreUri::Scheme::kSqlite: {
      absl::StatusOr<std::unique_ptr<SqliteStateStore>> store = SqliteStateStore::Open(uri.dir);
      if (!store.ok()) return store.status();
      return std::unique_ptr<StateStore>(*std::move(store));
    }
    case StateStoreUri::Scheme::kEtcd: {
      if (etcd == nullptr || etcd->client == nullptr || etcd->fence == nullptr ||
          etcd->clock == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(uri.ToString(),
                         ": a state store on etcd opens only once this "
                         "coordinator leads (EtcdCoordinator)"));
      }
      EtcdStateStoreOptions options;
      options.prefix = etcd->prefix;
      absl::StatusOr<std::unique_ptr<EtcdStateStore>> store =
          EtcdStateStore::Open(etcd->client, etcd->fence, etcd->clock, std::move(options));
      if (!store.ok()) return store.status();
      return std::unique_ptr<StateStore>(*std::move(store));
    }
  }
  return absl::InternalError("unknown state store scheme");
}

}  // namespace shardcoord
