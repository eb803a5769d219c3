#ifndef SHARDCOORD_COORDINATOR_STORE_SQLITE_STATE_STORE_H_
#define SHARDCOORD_COORDINATOR_STORE_SQLITE_STATE_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/store/state_store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace shardcoord {

// StateStore in one SQLite database, DIR/state.db, in WAL mode with synchronous=FULL and a
// 64 MiB page cache: Apply is one transaction and returns after its commit reached the disk (a
// batch with sync false: after it reached the OS, synchronous=NORMAL). Schema (version 1):
//   records(kind TEXT, name TEXT, value BLOB, PRIMARY KEY (kind, name)) WITHOUT ROWID
//   meta(key TEXT PRIMARY KEY, value TEXT)  -- "schema_version" = "1"
// The database is opened with locking_mode=EXCLUSIVE and locked at Open, so a second
// coordinator on the same directory fails to start instead of interleaving writes (the lock
// dies with the process, also on SIGKILL).
class SqliteStateStore : public StateStore {
 public:
  static constexpr const char* kFileName = "state.db";

  // Creates `dir` (one level) when missing. FAILED_PRECONDITION: the directory is used by
  // another running coordinator, or the database has an unknown schema version;
  // UNAVAILABLE / INTERNAL: it cannot be created or opened.
  static absl::StatusOr<std::unique_ptr<SqliteStateStore>> Open(const std::string& dir);
  ~SqliteStateStore() override;

  absl::Status Apply(const StateBatch& batch) override;
  absl::StatusOr<std::vector<StateRecord>> LoadAll() const override;
  absl::StatusOr<std::vector<StateRecord>> Load(absl::string_view kind) const override;
  std::string Describe() const override { return "sqlite:" + path_; }

 private:
  SqliteStateStore(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}

  absl::Status ApplyLocked(const StateBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The batch's deletes and puts, inside ApplyLocked's transaction.
  absl::Status WriteLocked(const StateBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets PRAGMA synchronous to FULL or NORMAL when it is not that already.
  absl::Status SetSyncLocked(bool full) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `*stmt`, prepared on first use and kept until close: a batch of 1000 records (a group's
  // commit) and every small one reuse the same compiled statement.
  absl::Status PreparedLocked(sqlite3_stmt** stmt, const char* sql)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  mutable absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  bool full_sync_ ABSL_GUARDED_BY(mu_) = true;  // PRAGMA synchronous is FULL (else NORMAL).
  sqlite3_stmt* put_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* delete_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* begin_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* commit_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STORE_SQLITE_STATE_STORE_H_
