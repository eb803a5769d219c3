#ifndef SHARDCOORD_COORDINATOR_STORE_ETCD_STATE_STORE_H_
#define SHARDCOORD_COORDINATOR_STORE_ETCD_STATE_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/store/etcd_client.h"
#include "coordinator/store/state_store.h"

namespace shardcoord {

struct EtcdStateStoreOptions {
  // Every key lives under it: PREFIX/records/KIND/NAME (the records), PREFIX/write (the last
  // write's token), PREFIX/journal/... (a batch too big for one transaction while it is being
  // applied), PREFIX/leader (the election's).
  std::string prefix = "/shardcoord/default";
  // etcd's --max-txn-ops (default 128) and a byte budget per transaction below its
  // --max-request-bytes (default 1.5 MiB). A batch within both is one transaction; a bigger
  // one goes through the journal.
  int max_txn_ops = 128;
  int64_t max_txn_bytes = int64_t{1} << 20;
  // Records per read when loading.
  int64_t page = 500;
  // Between reads of a write's outcome when etcd did not answer it.
  absl::Duration retry = absl::Milliseconds(100);
};

// StateStore in etcd v3, written only by the leader (docs/decisions.md, "HA on etcd").
//
// Every write is one transaction whose compares are the leader's fence (the leader key still
// has this leader's create revision: a coordinator that lost leadership cannot write) and
// "PREFIX/write has the mod revision of my last write"; it puts PREFIX/write = a token of its
// own. When etcd does not answer a transaction (a timeout, a broken connection, etcd's own
// "request timed out": it may still apply it), Apply does not guess: it writes a barrier
// under the same compare, which either succeeds (then the lost transaction can never apply:
// nothing changed, UNAVAILABLE) or finds PREFIX/write holding the lost transaction's token
// (it applied: OK). So Apply's answer is always what etcd holds, as the managers' write-
// through design needs (a change is in memory iff it is stored).
//
// A batch beyond one transaction's limits is written as a journal: its operations in pieces
// under PREFIX/journal/ID/part/N, then PREFIX/journal/ID/commit (the moment it counts), then
// applied in transactions and the journal deleted, before Apply returns. A leader that dies
// in between leaves the journal, and the next one's Open finishes it before reading. A single
// record beyond the byte budget is refused (RESOURCE_EXHAUSTED).
//
// Thread-safe; writes are serialized (one at a time), as SQLite's.
class EtcdStateStore : public StateStore {
 public:
  // Call once this process leads: finishes or discards a journal a previous leader left,
  // then returns the store. Errors as Apply's.
  static absl::StatusOr<std::unique_ptr<EtcdStateStore>> Open(EtcdClient* etcd, LeaderFence* fence,
                                                              Clock* clock,
                                                              EtcdStateStoreOptions options);

  // UNAVAILABLE: etcd unreachable, or this process does not lead, or an earlier write still
  // waits for etcd's answer (then nothing was applied: such writes do not queue behind it);
  // RESOURCE_EXHAUSTED: one record exceeds max_txn_bytes; INTERNAL: etcd refused the write.
  absl::Status Apply(const StateBatch& batch) override;
  absl::StatusOr<std::vector<StateRecord>> LoadAll() const override;
  // "etcd://127.0.0.1:2379 /shardcoord/default".
  std::string Describe() const override;
  absl::Time LastTrouble() const override;

  // Transactions written so far (tests: one per small batch).
  int64_t transactions() const;

 private:
  EtcdStateStore(EtcdClient* etcd, LeaderFence* fence, Clock* clock, EtcdStateStoreOptions options);

  std::string RecordKey(const std::string& kind, const std::string& name) const;
  std::string TokenKey() const;
  std::string JournalPrefix() const;
  // One fenced transaction of `ops` plus the token put; see the class comment.
  absl::Status Commit(std::vector<etcdv3::RequestOp> ops) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The outcome of the transaction that put `token` and got no answer.
  absl::Status Resolve(const etcdv3::Compare& fence, const std::string& token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Diagnoses a transaction whose compares failed (responses: leader key, token key reads).
  absl::Status CompareFailed(const etcdv3::Compare& fence, const etcdv3::TxnResponse& r,
                             const std::string& token, bool* applied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits `ops` in as many transactions as the limits need.
  absl::Status CommitInPieces(const std::vector<etcdv3::RequestOp>& ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // As CommitInPieces, retrying until done or this process no longer leads (after a
  // journal's commit a batch must be applied whole before any other write).
  absl::Status CommitUntilDone(const std::vector<etcdv3::RequestOp>& ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyJournaled(const std::vector<etcdv3::RequestOp>& ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReplayJournals() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  EtcdClient* const etcd_;
  LeaderFence* const fence_;
  Clock* const clock_;
  const EtcdStateStoreOptions options_;

  mutable absl::Mutex mu_;
  int64_t token_mod_revision_ ABSL_GUARDED_BY(mu_) = 0;  // PREFIX/write after our last write.
  int64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t transactions_ ABSL_GUARDED_BY(mu_) = 0;
  // A write waits for etcd (an unknown outcome, a journal being finished): others fail fast.
  std::atomic<bool> waiting_{false};
  std::atomic<int64_t> trouble_unix_ns_{std::numeric_limits<int64_t>::min()};
  void NoteTrouble() { trouble_unix_ns_ = absl::ToUnixNanos(clock_->Now()); }
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STORE_ETCD_STATE_STORE_H_
