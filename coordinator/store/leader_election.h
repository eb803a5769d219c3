#ifndef SHARDCOORD_COORDINATOR_STORE_LEADER_ELECTION_H_
#define SHARDCOORD_COORDINATOR_STORE_LEADER_ELECTION_H_

// Leader election among coordinators on an etcd lease (docs/decisions.md, "HA on etcd").
// Every coordinator holds a lease it keeps alive. A coordinator leads once it created the
// leader key, attached to its lease, in a transaction that requires the key to be absent; the
// key's value names it (its address, for the others to point clients at). Leadership ends
// when the lease ends: a leader that cannot renew its lease within its TTL (minus a margin)
// stops acting on its own clock before etcd lets another coordinator win, and every state
// write carries the compare "the leader key still has the create revision I gave it"
// (Fence), so a write of a coordinator that lost the key is refused by etcd itself.
//
// gRPC-free; the state machine advances in Step(), which tests call with a FakeClock and a
// FakeEtcd; Start() runs it on a thread of its own.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/store/etcd_client.h"

namespace shardcoord {

// The leader key's value: "address=HOST:PORT\nname=NAME\n".
std::string LeaderValue(absl::string_view address, absl::string_view name);
// The address in a leader key's value; "" when there is none.
std::string LeaderAddress(absl::string_view value);

struct LeaderElectionOptions {
  std::string key;    // The leader key ("/shardcoord/default/leader").
  std::string value;  // What it holds while this process leads (LeaderValue).
  // The lease's TTL (etcd may grant more). A leader stops acting once 5/6 of it passed
  // since the last keepalive etcd answered was sent; keepalives go every third of it.
  absl::Duration ttl = absl::Seconds(10);
  // How often a coordinator that does not lead reads the leader key, and how soon a failed
  // call to etcd is tried again.
  absl::Duration poll = absl::Milliseconds(200);
  // Called once, on the election's thread, when leadership is lost (never after Resign).
  std::function<void(const std::string& why)> on_lost;
  // Log lines (the daemon sends them to spdlog); may be null.
  std::function<void(absl::string_view)> log;
};

class LeaderElection : public LeaderFence {
 public:
  enum class State { kCampaigning, kLeading, kLost, kStopped };

  LeaderElection(EtcdClient* etcd, Clock* clock, LeaderElectionOptions options);
  ~LeaderElection() override;

  // One round: grant or renew the lease when due, try to take the leader key (or check that
  // it is still ours), notice a lapsed lease. Returns when the next round is due.
  absl::Time Step();
  // Runs Step on a thread until Stop, Resign or loss (then on_lost). Real time.
  void Start();
  // Ends the thread; the lease is left to expire (SIGKILL does the same). Idempotent.
  void Stop();
  // Gives up leadership (or the candidacy) at once: revokes the lease, which deletes the
  // leader key, so another coordinator can win without waiting for the TTL.
  absl::Status Resign();

  // Blocks until this process leads, lost, or stopped, or until `deadline` or Interrupt.
  State AwaitDecided(absl::Time deadline = absl::InfiniteFuture()) const;
  // Makes every AwaitDecided return now and from now on (a signal while standing by).
  void Interrupt();
  State state() const;
  std::string lost_reason() const;
  // The leader key's value when it was last read (this process's own while it leads); ""
  // when no leader was seen.
  std::string leader_value() const;
  int64_t lease_id() const;
  // The leader key's create revision while this process leads (0 otherwise).
  int64_t create_revision() const;
  // The last error from etcd, for logs ("" after a success).
  std::string last_error() const;

  // LeaderFence.
  absl::StatusOr<etcdv3::Compare> Fence() const override;
  void FenceFailed(absl::string_view why) override;

 private:
  void LoseLocked(std::string why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteError(absl::string_view what, const absl::Status& s);
  void Log(absl::string_view line) const;
  void Loop();
  // Called without the lock, after a call to etcd; false when the round must end.
  bool RenewLease(absl::Time now);
  void Campaign();
  void CheckKey();
  // Reads the leader key into *key (nullopt: absent); false after an error (noted).
  bool ReadKey(std::optional<etcdv3::KeyValue>* key);

  EtcdClient* const etcd_;
  Clock* const clock_;
  const LeaderElectionOptions options_;

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kCampaigning;
  std::string lost_reason_ ABSL_GUARDED_BY(mu_);
  int64_t lease_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lease_ttl_s_ ABSL_GUARDED_BY(mu_) = 0;
  // Until when this process may act on its lease (the last answered keepalive's send time
  // plus 5/6 of the TTL); the next keepalive.
  absl::Time valid_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time next_keepalive_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t create_revision_ ABSL_GUARDED_BY(mu_) = 0;
  std::string leader_value_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STORE_LEADER_ELECTION_H_
