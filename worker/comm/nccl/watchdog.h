#ifndef SHARDCOORD_WORKER_COMM_NCCL_WATCHDOG_H_
#define SHARDCOORD_WORKER_COMM_NCCL_WATCHDOG_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/comm/nccl/nccl_api.h"

namespace shardcoord {
namespace nccl {

struct WatchdogOptions {
  // Polls before the first sleep, so short ops finish without a sleep's latency.
  int spin_polls = 200;
  absl::Duration poll_interval = absl::Microseconds(50);
};

// Names an operation in errors: "NCCL AllReduce (tag 7) on group [0,3] (prefix 'plan-9')".
struct OpLabel {
  std::string op;  // "AllReduce", "init", "finalize".
  bool has_tag = false;
  uint32_t tag = 0;        // The step tag (CommOptions::tag).
  std::string group;       // "group [0,3] (prefix 'plan-9')".
  absl::Duration timeout;  // For the DEADLINE_EXCEEDED message.
};
std::string DescribeOp(const OpLabel& label);

// Waits on a non-blocking NCCL communicator without ever blocking inside NCCL: it polls
// ncclCommGetAsyncError (and a CUDA event), sleeping between polls on `clock`, and aborts
// the communicator with ncclCommAbort on an error, a timeout or a cancel request. After an
// abort the communicator handle is freed and must not be used again.
//
// Status codes: ABORTED for an NCCL or CUDA error or a cancel request (a peer failed or the
// plan was aborted), DEADLINE_EXCEEDED when `deadline` passed; both name the op, its tag and
// its group and end with "; communicator aborted".
class NcclWatchdog {
 public:
  NcclWatchdog(NcclApi* api, Clock* clock, WatchdogOptions options = {})
      : api_(api), clock_(clock), options_(options) {}

  // Until the calls issued on `comm` are enqueued (the async state leaves ncclInProgress),
  // then, if `event` is non-null, until `event` has completed.
  absl::Status Await(NcclComm comm, GpuEvent event, absl::Time deadline, const OpLabel& label,
                     const std::atomic<bool>* cancel = nullptr);

  // An NCCL call on `comm` returned `result` (neither success nor in-progress): aborts and
  // returns ABORTED naming `call`.
  absl::Status AbortAfterCall(NcclComm comm, NcclResult result, const char* call,
                              const OpLabel& label);

  // Aborts `comm` and returns `code` with "<op>: <detail>; communicator aborted".
  absl::Status Abort(NcclComm comm, absl::StatusCode code, const OpLabel& label,
                     const std::string& detail);

 private:
  std::string ResultDetail(NcclComm comm, NcclResult result);

  NcclApi* api_;
  Clock* clock_;
  WatchdogOptions options_;
};

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_WATCHDOG_H_
