#include "coordinator/sqlite_state_store.h"

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

absl::Status BindText(sqlite3_stmt* stmt, int index, const std::string& text, bool blob = false) {
  const int rc = blob ? sqlite3_bind_blob(stmt, index, text.data(), static_cast<int>(text.size()),
                                          SQLITE_TRANSIENT)
                      : sqlite3_bind_text(stmt, index, text.data(), static_cast<int>(text.size()),
                                          SQLITE_TRANSIENT);
  if (rc != SQLITE_OK) return absl::InternalError(absl::StrCat("state store: bind: ", rc));
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
  // Exclusive locking: the first write below takes the lock and keeps it until close.
  for (const char* pragma :
       {"PRAGMA locking_mode=EXCLUSIVE", "PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
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
  sqlite3_close(db_);
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
  if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  auto run = [&]() -> absl::Status {
    if (!batch.deletes.empty()) {
      Statement del(db_, "DELETE FROM records WHERE kind = ?1 AND name = ?2");
      if (del.rc() != SQLITE_OK) return SqliteError(db_, del.rc(), "prepare delete");
      for (const auto& [kind, name] : batch.deletes) {
        sqlite3_reset(del.get());
        if (absl::Status s = BindText(del.get(), 1, kind); !s.ok()) return s;
        if (absl::Status s = BindText(del.get(), 2, name); !s.ok()) return s;
        if (int rc = sqlite3_step(del.get()); rc != SQLITE_DONE) {
          return SqliteError(db_, rc, "delete");
        }
      }
    }
    if (!batch.puts.empty()) {
      Statement put(db_, "INSERT OR REPLACE INTO records (kind, name, value) VALUES (?1, ?2, ?3)");
      if (put.rc() != SQLITE_OK) return SqliteError(db_, put.rc(), "prepare put");
      for (const StateRecord& r : batch.puts) {
        sqlite3_reset(put.get());
        if (absl::Status s = BindText(put.get(), 1, r.kind); !s.ok()) return s;
        if (absl::Status s = BindText(put.get(), 2, r.name); !s.ok()) return s;
        if (absl::Status s = BindText(put.get(), 3, r.value, /*blob=*/true); !s.ok()) return s;
        if (int rc = sqlite3_step(put.get()); rc != SQLITE_DONE) return SqliteError(db_, rc, "put");
      }
    }
    return Exec(db_, "COMMIT");
  };
  absl::Status s = run();
  if (!s.ok()) Exec(db_, "ROLLBACK").IgnoreError();
  return s;
}

absl::StatusOr<std::vector<StateRecord>> SqliteStateStore::LoadAll() const {
  absl::MutexLock lock(&mu_);
  Statement q(db_, "SELECT kind, name, value FROM records ORDER BY kind, name");
  if (q.rc() != SQLITE_OK) return SqliteError(db_, q.rc(), "prepare load");
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
  if (rc != SQLITE_DONE) return SqliteError(db_, rc, "load");
  return out;
}

}  // namespace shardcoord
