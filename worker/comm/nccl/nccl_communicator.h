#ifndef SHARDCOORD_WORKER_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define SHARDCOORD_WORKER_COMM_NCCL_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl/nccl_api.h"
#include "worker/comm/nccl/watchdog.h"
#include "worker/control/kv_client.h"

namespace shardcoord {
namespace nccl {

struct NcclFactoryOptions {
  int device = 0;  // The worker's GPU: every communicator, stream and event lives on it.
  WatchdogOptions watchdog;
  // How long destroying a healthy communicator waits for ncclCommFinalize before aborting.
  absl::Duration finalize_timeout = absl::Seconds(10);
};

// A Communicator over one non-blocking NCCL communicator, on device pointers.
//
// Every op lowers to NCCL calls (nccl_lowering.h), issues them on this communicator's own
// CUDA stream, records an event after them and returns when the event has completed, so the
// outputs are ready on return. A stream per communicator rather than one per worker: NCCL
// kernels of different communicators on one stream would serialize, and two plans running
// ops over different groups in different orders on different workers could then deadlock. Inputs
// must be ready when an op is called: a caller that produced them on another stream synchronizes
// that stream first. NCCL has no tags and needs every member to issue one communicator's ops in the
// same order, so ops on one communicator run one at a time (CommOptions::tag only names the step in
// errors).
//
// Errors: INVALID_ARGUMENT (checked before NCCL is touched; the communicator stays usable);
// ABORTED for an NCCL/CUDA failure or Abort(); DEADLINE_EXCEEDED after the op's timeout.
// The last two abort the NCCL communicator (NcclWatchdog) and leave broken() true; later
// ops fail with FAILED_PRECONDITION quoting the first error.
class NcclCommunicator : public Communicator {
 public:
  // Takes ownership of `comm`, `stream` and `event`, all on `options.device`.
  NcclCommunicator(std::shared_ptr<NcclApi> api, std::shared_ptr<Clock> clock, NcclComm comm,
                   GpuStream stream, GpuEvent event, int rank, int size, std::string group,
                   absl::Duration default_timeout, NcclFactoryOptions options);
  // A healthy communicator is finalized (at most options.finalize_timeout, then aborted)
  // and destroyed; an aborted one is already gone.
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool broken() const override { return broken_.load(); }
  // "group [0,3] (prefix 'plan-9')".
  const std::string& group() const { return group_; }
  int device() const { return options_.device; }

  absl::Status AllGatherV(const void* send, int64_t send_bytes, void* recv,
                          absl::Span<const int64_t> recv_bytes,
                          const CommOptions& options) override;
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_bytes, void* recv,
                         absl::Span<const int64_t> recv_bytes, const CommOptions& options) override;
  absl::Status ReduceScatterV(const void* send, void* recv, absl::Span<const int64_t> recv_elements,
                              DType dtype, ReduceOp op, const CommOptions& options) override;
  absl::Status AllReduce(const void* send, void* recv, int64_t elements, DType dtype, ReduceOp op,
                         const CommOptions& options) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root, const CommOptions& options) override;
  absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs,
                        const CommOptions& options) override;

  // Aborts the communicator from any thread (the plan was aborted): an op in flight returns
  // ABORTED within one poll, later ops FAILED_PRECONDITION.
  void Abort(absl::string_view reason);

 private:
  absl::Status Run(const char* op, const CommOptions& options, absl::StatusOr<NcclLaunch> launch);
  absl::Status Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<NcclApi> api_;
  const std::shared_ptr<Clock> clock_;
  const GpuStream stream_;
  const GpuEvent event_;
  const int rank_;
  const int size_;
  const std::string group_;
  const absl::Duration default_timeout_;
  const NcclFactoryOptions options_;
  NcclWatchdog watchdog_;

  // Held for a whole op: ops on one communicator are serialized.
  absl::Mutex mu_;
  NcclComm comm_ ABSL_GUARDED_BY(mu_);  // Null once aborted.
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  // Atomics, not under mu_: broken() (polled by CommunicatorCache) and Abort() must not wait
  // for an op that holds mu_ until its timeout.
  std::atomic<bool> broken_{false};
  std::atomic<bool> cancel_{false};
};

// "<key_prefix>/nccl_id/<ranks>/<incarnations>": where group rank 0 publishes the id.
std::string NcclIdKey(const CommunicatorSpec& spec);
// "group [0,3] (prefix 'plan-9')", in global ranks.
std::string DescribeGroup(const CommunicatorSpec& spec);

// Builds NcclCommunicators: group rank 0 calls ncclGetUniqueId and publishes the id under
// NcclIdKey(spec) (not for a group of one); the others wait for it up to spec.timeout
// (as XLA's nccl_id_store). Then ncclCommInitRankConfig with config.blocking = 0 on
// options.device, polled by the watchdog against the same deadline. Errors: the KvClient's
// status (DEADLINE_EXCEEDED when the id never came) with the key and group added,
// UNAVAILABLE when ncclGetUniqueId fails, ABORTED / DEADLINE_EXCEEDED from the init.
class NcclCommunicatorFactory : public CommunicatorFactory {
 public:
  NcclCommunicatorFactory(std::shared_ptr<KvClient> kv, std::shared_ptr<NcclApi> api,
                          std::shared_ptr<Clock> clock, NcclFactoryOptions options = {});

  absl::StatusOr<std::shared_ptr<Communicator>> Create(const CommunicatorSpec& spec) override;

 private:
  const std::shared_ptr<KvClient> kv_;
  const std::shared_ptr<NcclApi> api_;
  const std::shared_ptr<Clock> clock_;
  const NcclFactoryOptions options_;
};

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_NCCL_COMMUNICATOR_H_
