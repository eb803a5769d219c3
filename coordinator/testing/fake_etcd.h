#ifndef SHARDCOORD_COORDINATOR_TESTING_FAKE_ETCD_H_
#define SHARDCOORD_COORDINATOR_TESTING_FAKE_ETCD_H_

// An etcd v3 in memory for unit tests of the etcd state store and the leader election: one
// revision counter, keys with create/mod revisions and versions, leases that expire on a
// Clock (FakeClock: tests move time), transactions with etcd's compares and its limits
// (operations per txn, request bytes, duplicate keys). Several EtcdClient views may share one
// FakeEtcd (two coordinators, one etcd). Failures are injected per call. Thread-safe.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/store/etcd_client.h"
#include "coordinator/store/leader_election.h"

namespace shardcoord {

// A campaign for `key` by the coordinator at `address` (also its advertised address), its
// lease 3 s.
LeaderElectionOptions TestElectionOptions(const std::string& key, const std::string& address);

class FakeEtcd {
 public:
  explicit FakeEtcd(Clock* clock) : clock_(clock) {}

  // A client of this etcd (not owned by it; any number).
  std::unique_ptr<EtcdClient> NewClient();

  // etcd's --max-txn-ops and --max-request-bytes (defaults as etcd's).
  void set_limits(int max_txn_ops, int64_t max_request_bytes);
  // While down, every call answers UNAVAILABLE (not sent) and leases do not expire (etcd
  // restarted: a restarted etcd renews every lease's TTL when it comes back).
  void set_down(bool down);
  // The next Txn fails with `status` (UNKNOWN: outcome unknown), after it was applied when
  // `apply_first`.
  void FailNextTxn(absl::Status status, bool apply_first);
  // Expires the lease now, as etcd would once its TTL passed without a keepalive.
  void ExpireLease(int64_t id);

  // Direct access for tests.
  std::optional<etcdv3::KeyValue> Get(const std::string& key) const;
  std::vector<etcdv3::KeyValue> GetPrefix(const std::string& prefix) const;
  void Put(const std::string& key, const std::string& value);
  void Delete(const std::string& key);
  int64_t revision() const;
  int64_t txns() const;  // Txn calls that were applied.

 private:
  friend class FakeEtcdClient;
  struct Lease {
    int64_t ttl = 0;
    absl::Time expiry;
  };

  absl::StatusOr<etcdv3::RangeResponse> Range(const etcdv3::RangeRequest& request);
  absl::StatusOr<etcdv3::TxnResponse> Txn(const etcdv3::TxnRequest& request);
  absl::StatusOr<etcdv3::LeaseGrantResponse> LeaseGrant(int64_t ttl_seconds);
  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease_id);
  absl::Status LeaseRevoke(int64_t lease_id);

  void ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RevokeLocked(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  etcdv3::RangeResponse RangeLocked(const etcdv3::RangeRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CompareLocked(const etcdv3::Compare& c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PutLocked(const std::string& key, const std::string& value, int64_t lease)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HeaderLocked(etcdv3::ResponseHeader* h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, etcdv3::KeyValue> kv_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_lease_ ABSL_GUARDED_BY(mu_) = 7000;
  int64_t txns_ ABSL_GUARDED_BY(mu_) = 0;
  int max_txn_ops_ ABSL_GUARDED_BY(mu_) = 128;
  int64_t max_request_bytes_ ABSL_GUARDED_BY(mu_) = 1572864;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> fail_next_txn_ ABSL_GUARDED_BY(mu_);
  bool fail_after_apply_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TESTING_FAKE_ETCD_H_
