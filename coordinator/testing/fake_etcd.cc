#include "coordinator/testing/fake_etcd.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcoord {

LeaderElectionOptions TestElectionOptions(const std::string& key, const std::string& address) {
  LeaderElectionOptions o;
  o.key = key;
  o.value = LeaderValue(address, address);
  o.ttl = absl::Seconds(3);
  return o;
}

class FakeEtcdClient : public EtcdClient {
 public:
  explicit FakeEtcdClient(FakeEtcd* etcd) : etcd_(etcd) {}
  absl::StatusOr<etcdv3::RangeResponse> Range(const etcdv3::RangeRequest& request) override {
    return etcd_->Range(request);
  }
  absl::StatusOr<etcdv3::TxnResponse> Txn(const etcdv3::TxnRequest& request) override {
    return etcd_->Txn(request);
  }
  absl::StatusOr<etcdv3::LeaseGrantResponse> LeaseGrant(int64_t ttl_seconds) override {
    return etcd_->LeaseGrant(ttl_seconds);
  }
  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease_id) override {
    return etcd_->LeaseKeepAlive(lease_id);
  }
  absl::Status LeaseRevoke(int64_t lease_id) override { return etcd_->LeaseRevoke(lease_id); }
  std::string Describe() const override { return "etcd://fake"; }

 private:
  FakeEtcd* const etcd_;
};

namespace {

absl::Status Down() { return absl::UnavailableError("fake etcd: connection refused"); }

// Keys are visited in order from `begin`: true once `key` lies past the range [begin, end)
// (end empty: the key `begin` alone; "\0": no end).
bool PastEnd(const std::string& key, const std::string& begin, const std::string& end) {
  if (end.empty()) return key != begin;
  if (end == std::string(1, '\0')) return false;
  return key >= end;
}

template <typename T>
bool Cmp(etcdv3::Compare::CompareResult r, const T& a, const T& b) {
  switch (r) {
    case etcdv3::Compare::EQUAL:
      return a == b;
    case etcdv3::Compare::NOT_EQUAL:
      return a != b;
    case etcdv3::Compare::GREATER:
      return a > b;
    case etcdv3::Compare::LESS:
      return a < b;
    default:
      return false;
  }
}

}  // namespace

std::unique_ptr<EtcdClient> FakeEtcd::NewClient() { return std::make_unique<FakeEtcdClient>(this); }

void FakeEtcd::set_limits(int max_txn_ops, int64_t max_request_bytes) {
  absl::MutexLock lock(&mu_);
  max_txn_ops_ = max_txn_ops;
  max_request_bytes_ = max_request_bytes;
}

void FakeEtcd::set_down(bool down) {
  absl::MutexLock lock(&mu_);
  if (down_ && !down) {
    for (auto& [id, lease] : leases_) lease.expiry = clock_->Now() + absl::Seconds(lease.ttl);
  }
  down_ = down;
}

void FakeEtcd::FailNextTxn(absl::Status status, bool apply_first) {
  absl::MutexLock lock(&mu_);
  fail_next_txn_ = std::move(status);
  fail_after_apply_ = apply_first;
}

void FakeEtcd::ExpireLease(int64_t id) {
  absl::MutexLock lock(&mu_);
  RevokeLocked(id);
}

std::optional<etcdv3::KeyValue> FakeEtcd::Get(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  return it->second;
}

std::vector<etcdv3::KeyValue> FakeEtcd::GetPrefix(const std::string& prefix) const {
  absl::MutexLock lock(&mu_);
  std::vector<etcdv3::KeyValue> out;
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.rfind(prefix, 0) == 0;
       ++it) {
    out.push_back(it->second);
  }
  return out;
}

void FakeEtcd::Put(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  ++revision_;
  PutLocked(key, value, 0);
}

void FakeEtcd::Delete(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (kv_.erase(key) > 0) ++revision_;
}

int64_t FakeEtcd::revision() const {
  absl::MutexLock lock(&mu_);
  return revision_;
}

int64_t FakeEtcd::txns() const {
  absl::MutexLock lock(&mu_);
  return txns_;
}

void FakeEtcd::HeaderLocked(etcdv3::ResponseHeader* h) const {
  h->set_cluster_id(1);
  h->set_member_id(1);
  h->set_revision(revision_);
  h->set_raft_term(1);
}

void FakeEtcd::RevokeLocked(int64_t id) {
  if (leases_.erase(id) == 0) return;
  bool deleted = false;
  for (auto it = kv_.begin(); it != kv_.end();) {
    if (it->second.lease() == id) {
      it = kv_.erase(it);
      deleted = true;
    } else {
      ++it;
    }
  }
  if (deleted) ++revision_;
}

void FakeEtcd::ExpireLocked() {
  if (down_) return;
  const absl::Time now = clock_->Now();
  std::vector<int64_t> expired;
  for (const auto& [id, lease] : leases_) {
    if (lease.expiry <= now) expired.push_back(id);
  }
  for (int64_t id : expired) RevokeLocked(id);
}

etcdv3::RangeResponse FakeEtcd::RangeLocked(const etcdv3::RangeRequest& request) const {
  etcdv3::RangeResponse r;
  HeaderLocked(r.mutable_header());
  int64_t count = 0;
  for (auto it = kv_.lower_bound(request.key()); it != kv_.end(); ++it) {
    if (PastEnd(it->first, request.key(), request.range_end())) break;
    ++count;
    if (request.limit() > 0 && r.kvs_size() >= request.limit()) {
      r.set_more(true);
      continue;
    }
    *r.add_kvs() = it->second;
  }
  r.set_count(count);
  return r;
}

bool FakeEtcd::CompareLocked(const etcdv3::Compare& c) const {
  auto it = kv_.find(c.key());
  if (it == kv_.end() && c.target() == etcdv3::Compare::VALUE) return false;
  const etcdv3::KeyValue kv = it == kv_.end() ? etcdv3::KeyValue() : it->second;
  switch (c.target()) {
    case etcdv3::Compare::VERSION:
      return Cmp(c.result(), kv.version(), c.version());
    case etcdv3::Compare::CREATE:
      return Cmp(c.result(), kv.create_revision(), c.create_revision());
    case etcdv3::Compare::MOD:
      return Cmp(c.result(), kv.mod_revision(), c.mod_revision());
    case etcdv3::Compare::VALUE:
      return Cmp(c.result(), kv.value(), c.value());
    case etcdv3::Compare::LEASE:
      return Cmp(c.result(), kv.lease(), c.lease());
    default:
      return false;
  }
}

void FakeEtcd::PutLocked(const std::string& key, const std::string& value, int64_t lease) {
  etcdv3::KeyValue& kv = kv_[key];
  if (kv.create_revision() == 0) {
    kv.set_key(key);
    kv.set_create_revision(revision_);
  }
  kv.set_mod_revision(revision_);
  kv.set_version(kv.version() + 1);
  kv.set_value(value);
  kv.set_lease(lease);
}

absl::StatusOr<etcdv3::RangeResponse> FakeEtcd::Range(const etcdv3::RangeRequest& request) {
  absl::MutexLock lock(&mu_);
  if (down_) return Down();
  ExpireLocked();
  return RangeLocked(request);
}

absl::StatusOr<etcdv3::TxnResponse> FakeEtcd::Txn(const etcdv3::TxnRequest& request) {
  absl::MutexLock lock(&mu_);
  if (down_) return Down();
  ExpireLocked();
  std::optional<absl::Status> fail = std::move(fail_next_txn_);
  fail_next_txn_.reset();
  if (fail.has_value() && !fail_after_apply_) return *fail;
  // etcd's checks, in its order: operation count, size, duplicate keys per branch.
  if (request.success_size() > max_txn_ops_ || request.failure_size() > max_txn_ops_) {
    return absl::InvalidArgumentError("etcdserver: too many operations in txn request");
  }
  if (static_cast<int64_t>(request.ByteSizeLong()) > max_request_bytes_) {
    return absl::InvalidArgumentError("etcdserver: request is too large");
  }
  for (const auto* ops : {&request.success(), &request.failure()}) {
    std::set<std::string> written;
    for (const etcdv3::RequestOp& op : *ops) {
      std::string key;
      if (op.has_request_put()) key = op.request_put().key();
      if (op.has_request_delete_range()) key = op.request_delete_range().key();
      if (key.empty()) continue;
      if (!written.insert(key).second) {
        return absl::InvalidArgumentError("etcdserver: duplicate key given in txn request");
      }
    }
  }
  bool ok = true;
  for (const etcdv3::Compare& c : request.compare()) ok = ok && CompareLocked(c);
  const auto& ops = ok ? request.success() : request.failure();
  for (const etcdv3::RequestOp& op : ops) {
    if (op.has_request_put() && op.request_put().lease() != 0 &&
        leases_.count(op.request_put().lease()) == 0) {
      return absl::NotFoundError("etcdserver: requested lease not found");
    }
  }
  bool writes = false;
  for (const etcdv3::RequestOp& op : ops) writes = writes || !op.has_request_range();
  if (writes) ++revision_;
  etcdv3::TxnResponse response;
  response.set_succeeded(ok);
  for (const etcdv3::RequestOp& op : ops) {
    etcdv3::ResponseOp* out = response.add_responses();
    if (op.has_request_range()) {
      *out->mutable_response_range() = RangeLocked(op.request_range());
    } else if (op.has_request_put()) {
      const etcdv3::PutRequest& put = op.request_put();
      PutLocked(put.key(), put.value(), put.lease());
      HeaderLocked(out->mutable_response_put()->mutable_header());
    } else if (op.has_request_delete_range()) {
      const etcdv3::DeleteRangeRequest& del = op.request_delete_range();
      int64_t deleted = 0;
      for (auto it = kv_.lower_bound(del.key());
           it != kv_.end() && !PastEnd(it->first, del.key(), del.range_end());) {
        it = kv_.erase(it);
        ++deleted;
      }
      out->mutable_response_delete_range()->set_deleted(deleted);
    }
  }
  HeaderLocked(response.mutable_header());
  ++txns_;
  if (fail.has_value()) return *fail;
  return response;
}

absl::StatusOr<etcdv3::LeaseGrantResponse> FakeEtcd::LeaseGrant(int64_t ttl_seconds) {
  absl::MutexLock lock(&mu_);
  if (down_) return Down();
  ExpireLocked();
  const int64_t id = ++next_lease_;
  leases_[id] = Lease{ttl_seconds, clock_->Now() + absl::Seconds(ttl_seconds)};
  etcdv3::LeaseGrantResponse r;
  HeaderLocked(r.mutable_header());
  r.set_id(id);
  r.set_ttl(ttl_seconds);
  return r;
}

absl::StatusOr<int64_t> FakeEtcd::LeaseKeepAlive(int64_t lease_id) {
  absl::MutexLock lock(&mu_);
  if (down_) return Down();
  ExpireLocked();
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return 0;
  it->second.expiry = clock_->Now() + absl::Seconds(it->second.ttl);
  return it->second.ttl;
}

absl::Status FakeEtcd::LeaseRevoke(int64_t lease_id) {
  absl::MutexLock lock(&mu_);
  if (down_) return Down();
  ExpireLocked();
  if (leases_.count(lease_id) == 0) {
    return absl::NotFoundError("etcdserver: requested lease not found");
  }
  RevokeLocked(lease_id);
  return absl::OkStatus();
}

}  // namespace shardcoord
