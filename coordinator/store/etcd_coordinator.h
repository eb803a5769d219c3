#ifndef SHARDCOORD_COORDINATOR_STORE_ETCD_COORDINATOR_H_
#define SHARDCOORD_COORDINATOR_STORE_ETCD_COORDINATOR_H_

// The composition root of a coordinator whose state lives in etcd (--state etcd://...), one of
// several (docs/decisions.md, "HA on etcd"). Start binds the port as a standby (every call
// UNAVAILABLE naming the leader) and joins the election; once it wins, the standby server
// stops and an ordinary Coordinator starts on the same port over an EtcdStateStore fenced by
// the election, loading and reconciling the state exactly as a coordinator restarted on its
// SQLite directory. It leads until it resigns (SIGTERM/SIGINT: the standby takes over at
// once) or loses its lease; then `on_lost` runs, which in the daemon exits the process
// (status 75) for its supervisor to start it again as a standby.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/rpc/standby_service.h"
#include "coordinator/store/etcd_client.h"
#include "coordinator/store/leader_election.h"

namespace shardcoord {

struct EtcdCoordinatorOptions {
  // Every key of this cluster lives under it (--etcd-prefix).
  std::string prefix = "/shardcoord/default";
  // The election lease's TTL (--leader-ttl): how long a dead leader holds the lead.
  absl::Duration leader_ttl = absl::Seconds(10);
  // What the leader key names for clients and workers (--advertise); empty: the bound
  // address, with the host name for a wildcard host.
  std::string advertise;
  // Called once when leadership is lost (on the election's thread). The daemon exits.
  std::function<void(const std::string& why)> on_lost;
  // Tests: an etcd of their own (FakeEtcd); null: HttpEtcdClient on `endpoints`.
  EtcdClient* etcd = nullptr;
};

class EtcdCoordinator {
 public:
  // `options.state` is an etcd:// URI (its endpoints, unless `etcd_options.etcd` is given).
  EtcdCoordinator(CoordinatorOptions options, EtcdCoordinatorOptions etcd_options);
  ~EtcdCoordinator();

  // Binds --listen (and --health-listen) as a standby and joins the election. Returns the
  // bound address; INVALID_ARGUMENT when the options' state is not on etcd.
  absl::StatusOr<std::string> Start();
  // Blocks until this coordinator leads, then starts serving as the leader and returns
  // true; false when Interrupt came first. Errors: the leader could not start (etcd
  // unreachable while loading: UNAVAILABLE; it resigned then).
  absl::StatusOr<bool> AwaitLeadership();
  // Makes AwaitLeadership return false (a signal while standing by). Thread-safe.
  void Interrupt();

  // After AwaitLeadership returned true: the coordinator serving (its http_address etc.).
  Coordinator* coordinator() { return coordinator_.get(); }
  // Until leading: the leader's address as last seen ("" none).
  std::string leader_address() const;
  const std::string& advertise() const { return advertise_; }
  std::string state_description() const;
  LeaderElection* election() { return election_.get(); }

  // Stops serving (the leader: drained by the caller first, if at all) and resigns, so that
  // another coordinator leads at once. Idempotent.
  void Shutdown();

 private:
  CoordinatorOptions options_;
  EtcdCoordinatorOptions etcd_options_;
  RealClock clock_;
  std::unique_ptr<EtcdClient> own_etcd_;
  EtcdClient* etcd_ = nullptr;
  std::unique_ptr<LeaderElection> election_;
  std::unique_ptr<StandbyServer> standby_;
  std::unique_ptr<Coordinator> coordinator_;
  std::string address_;
  std::string advertise_;

  mutable absl::Mutex mu_;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  LeaderElection* election_view_ ABSL_GUARDED_BY(mu_) = nullptr;  // election_, once made.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STORE_ETCD_COORDINATOR_H_
