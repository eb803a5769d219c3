#ifndef SHARDCOORD_WORKER_AGENT_H_
#define SHARDCOORD_WORKER_AGENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/shardcoord.pb.h"
#include "worker/coordinator_rpc.h"
#include "worker/worker_core.h"

namespace shardcoord {

struct AgentOptions {
  v1::RegisterWorkerRequest registration;  // name, host, device, address, backend.
  // Between registration attempts while the coordinator is unreachable.
  absl::Duration retry_interval = absl::Seconds(1);
  // When the coordinator returns no heartbeat interval.
  absl::Duration default_heartbeat_interval = absl::Seconds(1);
  // Log lines (the daemon sends them to spdlog).
  std::function<void(absl::string_view)> log;
};

// Keeps the worker registered with the coordinator: registers, then heartbeats on its own
// thread at the interval the coordinator returned; when a heartbeat is refused as stale
// (ABORTED) or unknown (NOT_FOUND, e.g. after a coordinator restart) it registers again and
// so gets a new incarnation. Other heartbeat failures (coordinator unreachable) are retried
// at the next beat. Thread-safe.
class Agent {
 public:
  Agent(CoordinatorAgentRpc* rpc, AgentOptions options);
  ~Agent();

  // Registers, retrying UNAVAILABLE and DEADLINE_EXCEEDED until `timeout`, then starts the
  // heartbeat thread. Other errors (INVALID_ARGUMENT) return at once.
  absl::Status Start(absl::Duration timeout);
  // Stops the heartbeat thread (promptly, also mid-wait). Idempotent.
  void Stop();

  WorkerIdentity identity() const;
  int64_t registrations() const;

 private:
  absl::Status RegisterOnce();
  void Loop();
  void Log(absl::string_view line) const;
  // Waits `d` or until Stop; true when stopping.
  bool WaitOrStop(absl::Duration d);

  CoordinatorAgentRpc* const rpc_;
  const AgentOptions options_;

  mutable absl::Mutex mu_;
  WorkerIdentity identity_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_);
  int64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_AGENT_H_
