#include "coordinator/store/sqlite_state_store.h"

#include <errno.h>
#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace {

absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
  const std::string msg =
      absl::StrCat("state store: ", what, ": ", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) return absl::FailedPreconditionError(msg);
  if (rc == SQLITE_IOERR || rc == SQLITE_FULL || rc == SQLITE_CANTOPEN) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return absl::OkStatus();
  std::string msg = err ? err : sqlite3_errstr(rc);
  sqlite3_free(err);
  absl::Status s = SqliteError(nullptr, rc, sql);
  return absl::Status(s.code(), absl::StrCat("state store: ", sql, ": ", msg));
}

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  int rc() const { return rc_; }
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

// The batch outlives the statement's step (Apply holds it), so SQLite need not copy it.
absl::Status BindText(sqlite3_stmt* stmt, int index, const std::string& text, bool blob = false) {
  const int rc = blob ? sqlite3_bind_blob(stmt, index, text.data(), static_cast<int>(text.size()),
                                          SQLITE_STATIC)
                      : sqlite3_bind_text(stmt, index, text.data(), static_cast<int>(text.size()),
                                          SQLITE_STATIC);
  if (rc != SQLITE_OK) return absl::InternalError(absl::StrCat("state store: bind: ", rc));
  return absl::OkStatus();
}

// Steps a cached statement once, expecting SQLITE_DONE; it is reset and unbound after, so
// no bound pointer outlives the call.
absl::Status StepDone(sqlite3* db, sqlite3_stmt* stmt, absl::string_view what) {
  const int rc = sqlite3_step(stmt);
  sqlite3_reset(stmt);
  sqlite3_clear_bindings(stmt);
  if (rc != SQLITE_DONE) return SqliteError(db, rc, what);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteStateStore>> SqliteStateStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("state dir: empty");
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("state store: cannot create directory ", dir, ": ", strerror(errno)));
  }
  const std::string path = absl::StrCat(dir, "/", kFileName);
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqliteError(db, rc, absl::StrCat("open ", path));
    sqlite3_close(db);
    return s;
  }
  auto fail = [db](absl::Status s) {
    sqlite3_close(db);
    return s;
  };
  // Exclusive locking: the first write below takes the lock and keeps it until close. A page
  // cache of 64 MiB (SQLite's default is 2 MiB): with a model's 10^5 tensor records (~400 MB)
  // every commit and every load went through the OS page cache a page at a time.
  for (const char* pragma : {"PRAGMA locking_mode=EXCLUSIVE", "PRAGMA journal_mode=WAL",
                             "PRAGMA synchronous=FULL", "PRAGMA cache_size=-65536"}) {
    if (absl::Status s = Exec(db, pragma); !s.ok()) {
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        return fail(absl::FailedPreconditionError(
            absl::StrCat(path, " is in use by another coordinator (", s.message(), ")")));
      }
      return fail(s);
    }
  }
  absl::Status s = Exec(db,
                        "BEGIN IMMEDIATE;"
                        "CREATE TABLE IF NOT EXISTS records (kind TEXT NOT NULL, name TEXT NOT "
                        "NULL, value BLOB NOT NULL, PRIMARY KEY (kind, name)) WITHOUT ROWID;"
                        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);"
                        "INSERT OR IGNORE INTO meta VALUES ('schema_version', '1');"
                        "COMMIT;");
  if (!s.ok()) {
    if (s.code() == absl::StatusCode::kFailedPrecondition) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat(path, " is in use by another coordinator (", s.message(), ")")));
    }
    return fail(s);
  }
  {
    Statement q(db, "SELECT value FROM meta WHERE key = 'schema_version'");
    if (q.rc() != SQLITE_OK) return fail(SqliteError(db, q.rc(), "read schema version"));
    std::string version;
    if (sqlite3_step(q.get()) == SQLITE_ROW) {
      version = reinterpret_cast<const char*>(sqlite3_column_text(q.get(), 0));
    }
    if (version != "1") {
      return fail(absl::FailedPreconditionError(
          absl::StrCat(path, ": unknown schema version '", version, "' (this build knows 1)")));
    }
  }
  return std::unique_ptr<SqliteStateStore>(new SqliteStateStore(path, db));
}

SqliteStateStore::~SqliteStateStore() {
  absl::MutexLock lock(&mu_);
  for (sqlite3_stmt* stmt : {put_, delete_, begin_, commit_}) sqlite3_finalize(stmt);
  sqlite3_close(db_);
}

absl::Status SqliteStateStore::PreparedLocked(sqlite3_stmt** stmt, const char* sql) {
  if (*stmt != nullptr) return absl::OkStatus();
  const int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, stmt, nullptr);
  if (rc == SQLITE_OK) return absl::OkStatus();
  sqlite3_finalize(*stmt);
  *stmt = nullptr;
  return SqliteError(db_, rc, absl::StrCat("prepare ", sql));
}

absl::Status SqliteStateStore::Apply(const StateBatch& batch) {
  if (batch.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (absl::Status s = SetSyncLocked(batch.sync); !s.ok()) return s;
  return ApplyLocked(batch);
}

absl::Status SqliteStateStore::SetSyncLocked(bool full) {
  if (full_sync_ == full) return absl::OkStatus();
  // WAL with synchronous=NORMAL commits to the WAL without fsync: the commit survives a crash
  // of this process (the OS holds it) and the next FULL commit's fsync covers it too.
  absl::Status s = Exec(db_, full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL");
  if (s.ok()) full_sync_ = full;
  return s;
}

absl::Status SqliteStateStore::ApplyLocked(const StateBatch& batch) {
  // Every statement is compiled once per store, not per batch (a group commits 1000 records).
  if (absl::Status s = PreparedLocked(&begin_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  if (absl::Status s = PreparedLocked(&commit_, "COMMIT"); !s.ok()) return s;
  if (absl::Status s = StepDone(db_, begin_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status s = WriteLocked(batch);
  // Synced here (synchronous=FULL) unless the batch asked otherwise: returns once durable.
  if (s.ok()) s = StepDone(db_, commit_, "COMMIT");
  if (!s.ok()) Exec(db_, "ROLLBACK").IgnoreError();
  return s;
}

absl::Status SqliteStateStore::WriteLocked(const StateBatch& batch) {
  if (!batch.deletes.empty()) {
    if (absl::Status s =
            PreparedLocked(&delete_, "DELETE FROM records WHERE kind = ?1 AND name = ?2");
        !s.ok()) {
      return s;
    }
    for (const auto& [kind, name] : batch.deletes) {
      if (absl::Status s = BindText(delete_, 1, kind); !s.ok()) return s;
      if (absl::Status s = BindText(delete_, 2, name); !s.ok()) return s;
      if (absl::Status s = StepDone(db_, delete_, "delete"); !s.ok()) return s;
    }
  }
  if (!batch.puts.empty()) {
    if (absl::Status s = PreparedLocked(
            &put_, "INSERT OR REPLACE INTO records (kind, name, value) VALUES (?1, ?2, ?3)");
        !s.ok()) {
      return s;
    }
    for (const StateRecord& r : batch.puts) {
      if (absl::Status s = BindText(put_, 1, r.kind); !s.ok()) return s;
      if (absl::Status s = BindText(put_, 2, r.name); !s.ok()) return s;
      if (absl::Status s = BindText(put_, 3, r.value, /*blob=*/true); !s.ok()) return s;
      if (absl::Status s = StepDone(db_, put_, "put"); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

namespace {

// The rows of `q` (kind, name, value) as records.
absl::StatusOr<std::vector<StateRecord>> ReadRecords(sqlite3* db, const Statement& q) {
  std::vector<StateRecord> out;
  int rc;
  while ((rc = sqlite3_step(q.get())) == SQLITE_ROW) {
    StateRecord r;
    r.kind = reinterpret_cast<const char*>(sqlite3_column_text(q.get(), 0));
    r.name = reinterpret_cast<const char*>(sqlite3_column_text(q.get(), 1));
    const void* blob = sqlite3_column_blob(q.get(), 2);
    r.value.assign(static_cast<const char*>(blob), sqlite3_column_bytes(q.get(), 2));
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return SqliteError(db, rc, "load");
  return out;
}

}  // namespace

absl::StatusOr<std::vector<StateRecord>> SqliteStateStore::Load(absl::string_view kind) const {
  absl::MutexLock lock(&mu_);
  // The primary key's range: only this kind's rows are read.
  Statement q(db_, "SELECT kind, name, value FROM records WHERE kind = ?1 ORDER BY name");
  if (q.rc() != SQLITE_OK) return SqliteError(db_, q.rc(), "prepare load");
  const std::string text(kind);
  if (absl::Status s = BindText(q.get(), 1, text); !s.ok()) return s;
  return ReadRecords(db_, q);
}

absl::StatusOr<std::vector<StateRecord>> SqliteStateStore::LoadAll() const {
  absl::MutexLock lock(&mu_);
  Statement q(db_, "SELECT kind, name, value FROM records ORDER BY kind, name");
  if (q.rc() != SQLITE_OK) return SqliteError(db_, q.rc(), "prepare load");
  return ReadRecords(db_, q);
}

}  // namespace shardcoord
