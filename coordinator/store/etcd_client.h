#ifndef SHARDCOORD_COORDINATOR_STORE_ETCD_CLIENT_H_
#define SHARDCOORD_COORDINATOR_STORE_ETCD_CLIENT_H_

// What the coordinator asks of etcd v3 (its KV and Lease services), behind a small interface
// so that the etcd state store and the leader election are unit-tested against an etcd in
// memory (FakeEtcd) and link neither gRPC nor HTTP. The real client is HttpEtcdClient (etcd's
// JSON gateway). The messages are etcd's own (coordinator/store/etcd_api.proto).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/store/etcd_api.pb.h"

namespace shardcoord {

// Errors of every call: UNAVAILABLE when no endpoint answered or etcd has no leader (retry);
// NOT_FOUND for an unknown lease; INVALID_ARGUMENT when etcd refused the request (too many
// operations in a txn, a request too large: its own message); otherwise etcd's gRPC code.
class EtcdClient {
 public:
  virtual ~EtcdClient() = default;

  virtual absl::StatusOr<etcdv3::RangeResponse> Range(const etcdv3::RangeRequest& request) = 0;
  virtual absl::StatusOr<etcdv3::TxnResponse> Txn(const etcdv3::TxnRequest& request) = 0;
  virtual absl::StatusOr<etcdv3::LeaseGrantResponse> LeaseGrant(int64_t ttl_seconds) = 0;
  // Refreshes the lease; returns its TTL in seconds afterwards, 0 when it no longer exists
  // (expired or revoked).
  virtual absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease_id) = 0;
  // Revokes the lease and deletes the keys attached to it.
  virtual absl::Status LeaseRevoke(int64_t lease_id) = 0;
  // "etcd://127.0.0.1:2379,127.0.0.1:22379", for logs.
  virtual std::string Describe() const = 0;
};

// The range_end that selects every key starting with `prefix` (etcd's "prefix end": the
// prefix with its last byte below 0xff incremented and the rest cut).
std::string PrefixRangeEnd(absl::string_view prefix);

// "etcd://HOST:PORT[,HOST:PORT...]" -> the endpoints. INVALID_ARGUMENT naming `flag` and the
// value when it is not of that form.
absl::StatusOr<std::vector<std::string>> ParseEtcdUrl(absl::string_view flag,
                                                      absl::string_view url);

// What a store that writes only while this process leads needs of the leader election: the
// compare every write carries (the leader key still has the create revision it had when this
// process won), and a way to say that such a write found it changed.
class LeaderFence {
 public:
  virtual ~LeaderFence() = default;
  // UNAVAILABLE when this process does not lead (any more), or its lease may have lapsed.
  virtual absl::StatusOr<etcdv3::Compare> Fence() const = 0;
  // A write guarded by Fence() was refused by etcd: another process leads, or the lease
  // expired. The process stops acting as the leader at once.
  virtual void FenceFailed(absl::string_view why) = 0;
};

// Builders for transactions.
etcdv3::RequestOp PutOp(std::string key, std::string value, int64_t lease = 0);
etcdv3::RequestOp DeleteOp(std::string key);
// Deletes every key in [key, range_end).
etcdv3::RequestOp DeleteRangeOp(std::string key, std::string range_end);
etcdv3::RequestOp RangeOp(std::string key);
// "create_revision(key) == revision" (0: the key does not exist).
etcdv3::Compare CreateRevisionIs(std::string key, int64_t revision);
// "mod_revision(key) == revision" (0: the key does not exist).
etcdv3::Compare ModRevisionIs(std::string key, int64_t revision);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STORE_ETCD_CLIENT_H_
