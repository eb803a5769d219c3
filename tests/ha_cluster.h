#ifndef SHARDCOORD_TESTS_HA_CLUSTER_H_
#define SHARDCOORD_TESTS_HA_CLUSTER_H_

// Several coordinators on one real etcd (tests/etcd_process.h), for //tests:ha_test and
// //bench:recovery_bench --etcd: etcd, two coordinators c0 and c1 on fixed loopback ports (a
// restarted one comes back on its own port) with --state etcd://..., and four Gloo workers
// w0..w3 given both addresses. c0 leads at the start, c1 stands by.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "tests/etcd_process.h"
#include "tests/process.h"

namespace shardcoord {

inline constexpr char kListeningLine[] = "coordinator listening on ";
inline constexpr char kStandbyLine[] = "coordinator standby on ";

struct HaClusterOptions {
  std::string name;     // The etcd prefix (/NAME) and log file names.
  std::string tmp_dir;  // etcd's data goes to TMP_DIR/NAME-etcd.
  std::string log_dir;  // Daemons' logs.
  std::vector<std::string> coordinator_flags;
  int num_workers = 4;
  absl::Duration start_timeout = absl::Seconds(60);
  absl::Duration client_retry_for = absl::Seconds(90);
};

class HaCluster {
 public:
  static absl::StatusOr<std::unique_ptr<HaCluster>> Start(HaClusterOptions options);
  // Workers first (SIGTERM), then the coordinators, then etcd.
  ~HaCluster();

  // "c0,c1": what workers and clients are given.
  std::string all() const;
  const std::string& address(int i) const { return addresses_[i]; }
  CoordinatorClient& client() { return *client_; }
  EtcdProcess& etcd() { return *etcd_; }
  Process* coordinator(int i) { return coordinators_[i].get(); }

  // Starts c<i> on its address and waits for `line` (kListeningLine: it leads;
  // kStandbyLine: it stands by).
  absl::Status StartCoordinator(int i, const std::string& line);
  absl::Status KillCoordinator(int i);
  // Every worker ALIVE in the leader's view (polled: registration has no push notification).
  absl::Status WaitForWorkersAlive(absl::Duration timeout);
  // Worker name -> rank, as the leader reports them.
  absl::StatusOr<std::map<std::string, int64_t>> Ranks();

 private:
  HaCluster() = default;

  HaClusterOptions options_;
  std::string coordinator_bin_;
  int starts_ = 0;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Process>> coordinators_;
  std::vector<std::unique_ptr<Process>> workers_;
  std::unique_ptr<CoordinatorClient> client_;
};

// Whether `p` printed a stdout line containing `needle`.
bool PrintedLine(Process* p, const std::string& needle);

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_HA_CLUSTER_H_
