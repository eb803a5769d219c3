#ifndef SHARDCOORD_WORKER_CONTROL_AGENT_H_
#define SHARDCOORD_WORKER_CONTROL_AGENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/shardcoord.pb.h"
#include "worker/control/coordinator_rpc.h"
#include "worker/control/worker_core.h"

namespace shardcoord {

// What a worker reports about its memory (worker/memory/memory_budget.h) with every registration
// and heartbeat.
struct MemoryReport {
  int64_t budget_bytes = 0;
  int64_t used_bytes = 0;
  int64_t peak_bytes = 0;
};

struct AgentOptions {
  v1::RegisterWorkerRequest registration;  // name, host, device, address, backend.
  // Between registration attempts while the coordinator is unreachable: the first retry
  // waits initial_retry_interval, each next one twice as long, at most retry_interval.
  absl::Duration initial_retry_interval = absl::Milliseconds(50);
  absl::Duration retry_interval = absl::Seconds(1);
  // What the worker holds, reported with every registration (RegisterWorkerRequest.held) so
  // a restarted coordinator can reconcile; null: nothing.
  std::function<std::vector<v1::HeldBuffer>()> held;
  // Called before each registration after the first (the old incarnation's plans are over:
  // the worker aborts them so that `held` is final).
  std::function<void()> before_registering_again;
  // Called with each buffer the coordinator answers to drop (RegisterWorkerResponse.drop).
  std::function<void(const std::string& tensor, int64_t version)> drop;
  // When the coordinator returns no heartbeat interval.
  absl::Duration default_heartbeat_interval = absl::Seconds(1);
  // Log lines (the daemon sends them to spdlog).
  std::function<void(absl::string_view)> log;
  // Called with false when a heartbeat is refused and the agent registers again, and with
  // true once registered again (readiness for the health service); may be null.
  std::function<void(bool registered)> on_registration;
  // The worker's memory now, sent with every registration and heartbeat; null: none.
  std::function<MemoryReport()> memory;
};

// Keeps the worker registered with the coordinator: registers, then heartbeats on its own
// thread at the interval the coordinator returned; when a heartbeat is refused as stale
// (ABORTED) or unknown (NOT_FOUND, e.g. after a coordinator restart) it registers again
// under the same name (so the same rank), reporting the buffers it holds, and gets a new
// incarnation. Other heartbeat failures (coordinator unreachable) are retried at the next
// beat; the worker keeps its buffers meanwhile. Registrations are retried with exponential
// backoff. Thread-safe.
class Agent {
 public:
  Agent(CoordinatorAgentRpc* rpc, AgentOptions options);
  ~Agent();

  // Registers, retrying UNAVAILABLE, DEADLINE_EXCEEDED and CANCELLED until `timeout`, then starts
  // the heartbeat thread. Other errors (INVALID_ARGUMENT) return at once.
  absl::Status Start(absl::Duration timeout);
  // Stops the heartbeat thread (promptly, also mid-wait). Idempotent.
  void Stop();
  // The worker is leaving the cluster: heartbeats go on, but once one is refused (the
  // coordinator declared the worker gone) the agent stops instead of registering again.
  void Leave();

  WorkerIdentity identity() const;
  int64_t registrations() const;

 private:
  absl::Status RegisterOnce();
  void Loop();
  void Log(absl::string_view line) const;
  // Waits `d` or until Stop; true when stopping.
  bool WaitOrStop(absl::Duration d);
  // The wait before retry number `attempt` (0-based).
  absl::Duration Backoff(int attempt) const;

  CoordinatorAgentRpc* const rpc_;
  const AgentOptions options_;

  mutable absl::Mutex mu_;
  WorkerIdentity identity_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_);
  int64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_CONTROL_AGENT_H_
