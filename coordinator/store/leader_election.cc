#include "coordinator/store/leader_election.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shardcoord {
namespace {

constexpr absl::string_view kAddressField = "address=";

// The part of the lease a leader may act on: it stops 1/6 of the TTL before etcd could
// expire the lease, measured from when the renewing keepalive was sent (etcd renewed it
// later than that), so clock rates that differ by less than that cannot make two leaders.
absl::Duration Usable(absl::Duration ttl) { return ttl * 5 / 6; }

}  // namespace

std::string LeaderValue(absl::string_view address, absl::string_view name) {
  return absl::StrCat(kAddressField, address, "\nname=", name, "\n");
}

std::string LeaderAddress(absl::string_view value) {
  for (absl::string_view line : absl::StrSplit(value, '\n')) {
    if (absl::StartsWith(line, kAddressField))
      return std::string(line.substr(kAddressField.size()));
  }
  return "";
}

LeaderElection::LeaderElection(EtcdClient* etcd, Clock* clock, LeaderElectionOptions options)
    : etcd_(etcd), clock_(clock), options_(std::move(options)) {}

LeaderElection::~LeaderElection() { Stop(); }

void LeaderElection::Log(absl::string_view line) const {
  if (options_.log) options_.log(line);
}

void LeaderElection::NoteError(absl::string_view what, const absl::Status& s) {
  std::string text = absl::StrCat(what, ": ", s.ToString());
  bool changed;
  {
    absl::MutexLock lock(&mu_);
    changed = last_error_ != text;
    last_error_ = text;
  }
  if (changed) Log(absl::StrCat("etcd: ", text));  // Once per distinct error, not per poll.
}

void LeaderElection::LoseLocked(std::string why) {
  if (state_ != State::kLeading) return;
  state_ = State::kLost;
  lost_reason_ = std::move(why);
  create_revision_ = 0;
  wake_ = true;
}

bool LeaderElection::RenewLease(absl::Time now) {
  int64_t lease;
  bool due;
  {
    absl::MutexLock lock(&mu_);
    lease = lease_id_;
    due = now >= next_keepalive_;
  }
  const int64_t ttl_s = std::max<int64_t>(1, absl::ToInt64Seconds(options_.ttl));
  if (lease == 0) {
    absl::StatusOr<etcdv3::LeaseGrantResponse> g = etcd_->LeaseGrant(ttl_s);
    if (!g.ok()) {
      NoteError("lease grant", g.status());
      return false;
    }
    absl::MutexLock lock(&mu_);
    lease_id_ = g->id();
    lease_ttl_s_ = g->ttl();
    valid_until_ = now + Usable(absl::Seconds(g->ttl()));
    next_keepalive_ = now + absl::Seconds(g->ttl()) / 3;
    last_error_.clear();
    return true;
  }
  if (!due) return true;
  absl::StatusOr<int64_t> ttl = etcd_->LeaseKeepAlive(lease);
  if (!ttl.ok()) {
    NoteError("lease keepalive", ttl.status());
    absl::MutexLock lock(&mu_);
    next_keepalive_ = now + options_.poll;
    return true;  // The lease may still be valid: go on with what it allows.
  }
  absl::MutexLock lock(&mu_);
  if (*ttl <= 0) {
    // Expired in etcd (or revoked): a leader has lost; a candidate takes a new lease.
    LoseLocked(absl::StrCat("lease ", lease, " expired in etcd"));
    lease_id_ = 0;
    valid_until_ = absl::InfinitePast();
    next_keepalive_ = absl::InfinitePast();
    return false;
  }
  lease_ttl_s_ = *ttl;
  valid_until_ = now + Usable(absl::Seconds(*ttl));
  next_keepalive_ = now + absl::Seconds(*ttl) / 3;
  last_error_.clear();
  return true;
}

void LeaderElection::Campaign() {
  const int64_t lease = lease_id();
  // Reading first: a transaction is a Raft write (a disk sync in etcd) even when its compare
  // fails, and a standby polls.
  std::optional<etcdv3::KeyValue> current;
  if (!ReadKey(&current)) return;
  etcdv3::KeyValue kv;
  if (!current.has_value()) {
    etcdv3::TxnRequest txn;
    *txn.add_compare() = CreateRevisionIs(options_.key, 0);
    *txn.add_success() = PutOp(options_.key, options_.value, lease);
    *txn.add_failure() = RangeOp(options_.key);
    absl::StatusOr<etcdv3::TxnResponse> r = etcd_->Txn(txn);
    if (!r.ok()) {
      // NOT_FOUND: our lease expired meanwhile; take a new one. Anything else (an outcome
      // we did not learn included): read the key again next round, which tells.
      if (r.status().code() == absl::StatusCode::kNotFound) {
        absl::MutexLock lock(&mu_);
        lease_id_ = 0;
      }
      return NoteError("take leader key", r.status());
    }
    if (r->succeeded()) {
      absl::MutexLock lock(&mu_);
      state_ = State::kLeading;
      create_revision_ = r->header().revision();
      leader_value_ = options_.value;
      last_error_.clear();
      return;
    }
    if (r->responses_size() > 0 && r->responses(0).response_range().kvs_size() > 0) {
      kv = r->responses(0).response_range().kvs(0);
    }
  } else {
    kv = *std::move(current);
  }
  absl::MutexLock lock(&mu_);
  if (kv.lease() != 0 && kv.lease() == lease) {
    // Ours: a take whose answer was lost (the key carries our lease, nobody else's).
    state_ = State::kLeading;
    create_revision_ = kv.create_revision();
    leader_value_ = options_.value;
    return;
  }
  leader_value_ = kv.value();
}

void LeaderElection::CheckKey() {
  const int64_t mine = create_revision();
  std::optional<etcdv3::KeyValue> key;
  if (!ReadKey(&key)) return;
  absl::MutexLock lock(&mu_);
  if (!key.has_value() || key->create_revision() != mine) {
    LoseLocked(!key.has_value() ? "the leader key was deleted"
                                : "the leader key was taken over by another coordinator");
  }
}

bool LeaderElection::ReadKey(std::optional<etcdv3::KeyValue>* key) {
  etcdv3::RangeRequest read;
  read.set_key(options_.key);
  absl::StatusOr<etcdv3::RangeResponse> r = etcd_->Range(read);
  if (!r.ok()) {
    NoteError("read leader key", r.status());
    return false;
  }
  if (r->kvs_size() > 0) *key = r->kvs(0);
  return true;
}

absl::Time LeaderElection::Step() {
  const absl::Time now = clock_->Now();
  State state;
  bool keepalive_due;
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kLeading && now >= valid_until_) {
      LoseLocked(absl::StrCat("no answer from etcd to lease keepalives for ",
                              absl::FormatDuration(Usable(absl::Seconds(lease_ttl_s_))),
                              (last_error_.empty() ? "" : absl::StrCat(" (", last_error_, ")"))));
    }
    state = state_;
    keepalive_due = now >= next_keepalive_;
  }
  if (state == State::kLost || state == State::kStopped) return absl::InfiniteFuture();
  if (RenewLease(now)) {
    if (state == State::kCampaigning) {
      Campaign();
    } else if (keepalive_due) {
      CheckKey();  // As often as keepalives: a deleted key is noticed within a third of a TTL.
    }
  }
  absl::MutexLock lock(&mu_);
  if (state_ == State::kLost || state_ == State::kStopped) return absl::InfiniteFuture();
  if (state_ == State::kLeading) return std::min(next_keepalive_, valid_until_);
  return now + options_.poll;
}

void LeaderElection::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_ && state_ != State::kLost && state_ != State::kStopped) {
    mu_.Unlock();
    const absl::Time next = Step();
    mu_.Lock();
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
    mu_.AwaitWithDeadline(absl::Condition(&woken), next);
    wake_ = false;
  }
  if (state_ != State::kLost || !options_.on_lost) return;
  const std::string why = lost_reason_;
  mu_.Unlock();
  options_.on_lost(why);
  mu_.Lock();
}

void LeaderElection::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void LeaderElection::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status LeaderElection::Resign() {
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    lease = lease_id_;
    state_ = State::kStopped;
    create_revision_ = 0;
    lease_id_ = 0;
    wake_ = true;
  }
  Stop();
  if (lease == 0) return absl::OkStatus();
  absl::Status s = etcd_->LeaseRevoke(lease);
  if (s.code() == absl::StatusCode::kNotFound) return absl::OkStatus();  // Expired already.
  return s;
}

LeaderElection::State LeaderElection::AwaitDecided(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto decided = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ != State::kCampaigning || stop_ || interrupted_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&decided), deadline);
  return state_;
}

void LeaderElection::Interrupt() {
  absl::MutexLock lock(&mu_);
  interrupted_ = true;
}

LeaderElection::State LeaderElection::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

std::string LeaderElection::lost_reason() const {
  absl::MutexLock lock(&mu_);
  return lost_reason_;
}

std::string LeaderElection::leader_value() const {
  absl::MutexLock lock(&mu_);
  return leader_value_;
}

int64_t LeaderElection::lease_id() const {
  absl::MutexLock lock(&mu_);
  return lease_id_;
}

int64_t LeaderElection::create_revision() const {
  absl::MutexLock lock(&mu_);
  return create_revision_;
}

std::string LeaderElection::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

absl::StatusOr<etcdv3::Compare> LeaderElection::Fence() const {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kLeading) {
    return absl::UnavailableError(
        state_ == State::kLost ? absl::StrCat("this coordinator lost leadership: ", lost_reason_)
                               : "this coordinator is not the leader");
  }
  if (clock_->Now() >= valid_until_) {
    return absl::UnavailableError(
        "this coordinator's etcd lease may have lapsed (no keepalive answered in time)");
  }
  return CreateRevisionIs(options_.key, create_revision_);
}

void LeaderElection::FenceFailed(absl::string_view why) {
  absl::MutexLock lock(&mu_);
  LoseLocked(std::string(why));
}

}  // namespace shardcoord
