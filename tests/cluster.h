#ifndef SHARDCOORD_TESTS_CLUSTER_H_
#define SHARDCOORD_TESTS_CLUSTER_H_

// A real shardcoord cluster on loopback: one coordinator and N CPU (Gloo) workers, each a
// process started from the binaries in this target's runfiles, on free ports. Start returns
// once every worker is registered and ALIVE; the destructor stops everything.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "proto/shardcoord.pb.h"
#include "tests/process.h"

namespace shardcoord {

struct ClusterOptions {
  int num_workers = 4;
  // Extra flags of the coordinator and of every worker ("--heartbeat-timeout=2s"). In a
  // worker flag, "{name}" stands for that worker's name ("--tls-cert=DIR/{name}.pem").
  std::vector<std::string> coordinator_flags;
  std::vector<std::string> worker_flags;
  // The coordinator's --relay-max-bytes. 0 (unlike the daemon's 64 KiB default) keeps the
  // small tensors of tests on the workers' data path, which they exist to check; the relay
  // has its own runs (redistribute_relay_test).
  int64_t relay_max_bytes = 0;
  // The coordinator's state: empty keeps it in memory (--state memory); otherwise a
  // directory of its own (--state-dir), e.g. under TEST_TMPDIR, never shared between tests.
  std::string state_dir;
  // Bound on startup: each "listening on" line, then all workers ALIVE.
  absl::Duration start_timeout = absl::Seconds(60);
  // Copy daemons' stdout into our stderr (the test log); stderr is inherited unless
  // `log_dir` is set, in which case each daemon writes <log_dir>/<name>.log.
  bool echo_stdout = true;
  std::string log_dir;
  CoordinatorClientOptions client_options;
};

class Cluster {
 public:
  // Workers are named w0..w{N-1}.
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(ClusterOptions options = {});

  // Stops the workers, then the coordinator (SIGTERM, SIGKILL after a grace period).
  ~Cluster();

  CoordinatorClient& client() { return *client_; }
  const std::string& coordinator_address() const { return coordinator_address_; }
  // HOST:PORT of the coordinator's HTTP server (GET /metrics); empty when it is off.
  const std::string& metrics_address() const { return metrics_address_; }
  // HOST:PORT of worker `index`'s HTTP server; empty unless worker_flags turned it on
  // ("--http-listen=127.0.0.1:0").
  const std::string& worker_metrics_address(int index) const {
    return worker_metrics_addresses_[index];
  }

  int num_workers() const { return static_cast<int>(workers_.size()); }
  static std::string WorkerName(int index);
  // Names of workers [0, n) in index order: the `workers` of a CreateMeshRequest.
  std::vector<std::string> WorkerNames() const;
  // The coordinator's view of worker `index` at startup (rank, address, incarnation).
  const v1::WorkerInfo& worker_info(int index) const { return infos_[index]; }
  // Index of the worker with global `rank`, or -1.
  int WorkerIndexOfRank(int64_t rank) const;
  // Index of the worker named `name`, or -1.
  int WorkerIndexOfName(const std::string& name) const;

  // SIGKILL worker `index` and reap it: no goodbye, as a crashed host.
  absl::Status KillWorker(int index);
  // Sends `signal` to worker `index` (SIGSTOP / SIGCONT to hold a plan in flight, or to hold
  // a worker still so that a test can kill it in the middle of an operation).
  absl::Status SignalWorker(int index, int signal);
  bool worker_running(int index) const { return workers_[index] != nullptr; }
  // The process id of worker `index` (benchmarks read its CPU time); 0 when it is stopped.
  pid_t worker_pid(int index) const { return workers_[index] ? workers_[index]->pid() : 0; }
  // The coordinator's process id (benchmarks read its CPU time); 0 when it is stopped.
  pid_t coordinator_pid() const { return coordinator_ ? coordinator_->pid() : 0; }

  // SIGKILL the coordinator and reap it; the workers keep running (and their buffers).
  absl::Status KillCoordinator();
  // Starts the coordinator again on the same address with the same flags (and state dir)
  // and waits for its "listening on" line. client() is a new client afterwards.
  absl::Status RestartCoordinator(absl::Duration timeout);

  // Polls ListWorkers until every worker in `names` has `state`, or `timeout` passes
  // (DEADLINE_EXCEEDED listing what the coordinator reports).
  absl::Status WaitForWorkers(const std::vector<std::string>& names, v1::WorkerState state,
                              absl::Duration timeout);

 private:
  Cluster() = default;

  // Starts the coordinator listening on `listen` and sets coordinator_address_ and client_.
  absl::Status StartCoordinator(const std::string& listen);

  ClusterOptions options_;
  std::string coordinator_bin_;
  int coordinator_starts_ = 0;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> workers_;
  std::vector<v1::WorkerInfo> infos_;
  std::string coordinator_address_;
  std::string metrics_address_;
  std::vector<std::string> worker_metrics_addresses_;
  std::unique_ptr<CoordinatorClient> client_;
};

// The text after `marker` in `line` up to the next whitespace: the address in
// "coordinator listening on 127.0.0.1:4711". INVALID_ARGUMENT if absent.
absl::StatusOr<std::string> AddressAfter(const std::string& line, const std::string& marker);

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_CLUSTER_H_
