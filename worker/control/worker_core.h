#ifndef SHARDCOORD_WORKER_CONTROL_WORKER_CORE_H_
#define SHARDCOORD_WORKER_CONTROL_WORKER_CORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/plan_fragment.h"
#include "worker/buffers/buffer_store.h"
#include "worker/comm/communicator.h"
#include "worker/control/coordinator_rpc.h"
#include "worker/memory/memory_budget.h"
#include "worker/memory/memory_space.h"
#include "worker/plans/executor.h"
#include "worker/plans/fused_exchange.h"

namespace shardcoord {

class TransferRunner;

// Who this worker is right now (the agent's latest registration).
struct WorkerIdentity {
  std::string name;
  int64_t incarnation = 0;
  int64_t rank = -1;
};

// Largest data payload of one ReadChunk / WriteChunk message.
constexpr int64_t kMaxChunkMessageBytes = int64_t{1} << 20;
// Largest ReadBoxes answer or WriteBuffer request.
constexpr int64_t kMaxRelayBytes = int64_t{1} << 20;

// The Worker service's logic, without gRPC: plans in flight, buffers, fills, chunk reads and
// writes. Thread-safe.
//
// Plan lifecycle on a worker: Execute validates the fragment, allocates the target buffer and
// runs the fragment on its own thread (fragments wait on each other across workers, so they
// never share a bounded pool); when it ends, the target buffer is stored under (tensor,
// target_version) (success only) and the result is reported with ReportChunks (final=true:
// chunks with checksums, or the error). Between steps it reports bytes_done (final=false).
// FinishPlan commit drops `drop_version` (never the plan's own target version) and keeps the
// communicators for later plans of the same rendezvous epoch; FinishPlan abort cancels the
// fragment (a Gloo exchange in flight is interrupted; a blocking collective ends within the
// step timeout), drops its target buffer and releases the communicators of its rendezvous
// prefix (see CommunicatorCache). Both are idempotent; an Execute for a plan that was
// finished is ABORTED.
//
// The same runner runs the runs of prepared transfers (`transfers()`, control/
// transfer_runner.h) through StartRun: only where the outcome goes (a hook instead of
// ReportChunks) and what a commit drops (the hook's choice) differ.
class WorkerCore {
 public:
  // How a run's part ended on this rank, for whoever started it with StartRun.
  struct RunResult {
    // OK; the part's error; or ABORTED: FinishPlan(abort) or AbortAll ended the run first
    // (nothing of it is stored then).
    absl::Status status;
    absl::Time start;
    absl::Time end;
    int64_t memory_peak_bytes = 0;  // With a memory budget: the most held meanwhile.
    // OK only: the checksums of each member's target chunks, member for member (a fused
    // fragment's members hold their shape's target chunks); bytes and steps as a final
    // report's.
    std::vector<std::vector<uint64_t>> checksums;
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    std::vector<v1::StepTiming> steps;
  };
  struct RunHooks {
    // Once, on the run's thread, when its part ended (also when aborted). Nothing of the
    // run's fragment is read after it returns but by FinishPlan.
    std::function<void(RunResult)> on_end;
    // When FinishPlan(plan id) ended the run, after an abort dropped the run's new buffers;
    // never after AbortAll.
    std::function<void(bool commit)> on_finish;
    // Optional, for a fragment whose runs repeat unchanged: its fused exchange's schedule,
    // cut by the first run and reused by the next (must outlive the run).
    GroupScheduleCache* schedule_cache = nullptr;
  };

  // `log` (optional) receives one line per plan event (start, result with per-step timings,
  // finish); the daemon sends them to spdlog. `space` (null: host memory) is where the
  // worker's buffers live: every buffer it creates is there, and the source buffers of plans
  // must be too. Fill, ReadChunk and WriteChunk stage through host memory when it is not
  // host memory. It must outlive this object.
  WorkerCore(BufferStore* buffers, CommunicatorCache* communicators, ChunkReporter* reporter,
             std::function<WorkerIdentity()> identity, ExecutorOptions options = {},
             std::function<void(absl::string_view)> log = nullptr, MemorySpace* space = nullptr);
  ~WorkerCore();

  absl::Status Execute(const v1::PlanFragment& fragment);
  // Runs `fragment` (validated: ValidateFragment) under its plan_id as Execute does, but its
  // buffers are prepared on the run's thread (a failure there ends the run like any other)
  // and `hooks.on_end` gets the outcome instead of ReportChunks. The fragment is read, not
  // copied: the caller keeps it unchanged until on_end returned and, when the run was not
  // refused here, FinishPlan or AbortAll ended it. Refused as Execute: UNAVAILABLE draining,
  // ABORTED finished, ALREADY_EXISTS running (hooks not called).
  absl::Status StartRun(std::shared_ptr<const Fragment> fragment, RunHooks hooks);
  // UNAVAILABLE while draining or shutting down: new work is refused.
  absl::Status CheckAccepting() const;
  absl::Status FinishPlan(const v1::FinishPlanRequest& request);
  // Forgets every plan this worker has not seen finished: running fragments are cancelled
  // and never store their target; targets already stored are kept (their plan may have
  // committed just before a coordinator crash), for the coordinator to keep or drop when the
  // worker registers again and reports them. The agent calls it before registering again:
  // the coordinator has ended (or, restarted, forgotten) every plan of the old incarnation,
  // so no FinishPlan may come. Resident prepared transfers are forgotten too (the
  // coordinator prepares them again). Returns how many plans.
  int AbortAll();
  absl::StatusOr<v1::FillResponse> Fill(const v1::FillRequest& request);
  // Fill for each of request.fills in order; the first error names its fill and ends the call
  // (the buffers filled before it stay: the coordinator drops what it does not commit).
  absl::StatusOr<v1::FillManyResponse> FillMany(const v1::FillManyRequest& request);
  absl::Status DropTensor(const v1::DropTensorRequest& request);
  // Block-scaled FP8 of one staged buffer (Worker.BlockQuantize, issue 28): every chunk of
  // (tensor, version) quantized into new buffers out (f8_e4m3) and scales (f32, scale_chunks),
  // or dequantized with the scales into out (out_dtype). Long: call it off the reactor.
  // Errors as the RPC's; a failure stores nothing.
  absl::StatusOr<v1::BlockQuantizeResponse> BlockQuantize(const v1::BlockQuantizeRequest& request);
  // A new buffer (out_tensor, out_version) composed from stored buffers' boxes
  // (Worker.ComposeBoxes, issue 28 item 4): each input's chunks placed at its offset, later
  // inputs over earlier ones, every element of out_chunks covered. Long: call it off the
  // reactor. Errors as the RPC's; a failure stores nothing.
  absl::StatusOr<v1::ComposeBoxesResponse> ComposeBoxes(const v1::ComposeBoxesRequest& request);

  // Streams one box of one buffer, row-major, in pieces.
  class ChunkReader {
   public:
    int64_t total_bytes() const { return total_bytes_; }
    bool done() const { return next_ >= box_.Volume(); }
    // Appends the next at most `max_bytes` bytes (at least one element) to `out`; from a
    // device space, that range is packed there and copied to the host in one copy.
    absl::Status Next(int64_t max_bytes, std::string* out);

   private:
    friend class WorkerCore;
    std::shared_ptr<HostBuffer> buffer_;
    int chunk_ = 0;
    Box box_;
    int64_t next_ = 0;  // Next element of box_, row-major.
    int64_t total_bytes_ = 0;
  };
  // NOT_FOUND buffer; INVALID_ARGUMENT box (must lie inside one chunk).
  absl::StatusOr<ChunkReader> OpenRead(const v1::ReadChunkRequest& request);

  // Receives a whole local buffer: the header message, then the bytes in order.
  class ChunkWriter {
   public:
    // A device space gets the bytes in copies of at least this many (but the last).
    static constexpr int64_t kStagingBytes = int64_t{8} << 20;

    // INVALID_ARGUMENT past the announced total.
    absl::Status Append(absl::string_view data);
    // INVALID_ARGUMENT when fewer bytes than announced arrived; stores the buffer (replacing
    // any at the same version) and returns its chunks with checksums.
    absl::StatusOr<v1::WriteChunkResponse> Finish();

   private:
    friend class WorkerCore;
    BufferStore* buffers_ = nullptr;
    std::string tensor_;
    int64_t version_ = 0;
    std::shared_ptr<HostBuffer> buffer_;
    int64_t written_ = 0;
    // Device spaces: received bytes not yet copied to the buffer, which holds `flushed_`.
    std::string pending_;
    int64_t flushed_ = 0;
    absl::Status Flush();
  };
  // INVALID_ARGUMENT header; RESOURCE_EXHAUSTED allocation. Data in the header message is
  // appended too.
  absl::StatusOr<std::unique_ptr<ChunkWriter>> OpenWrite(const v1::ChunkData& header);

  // The unary calls of small relayed plans (coordinator/plans/plan_relay.h), done in place: every
  // box of `request` read whole (NOT_FOUND / INVALID_ARGUMENT as OpenRead), and a whole local
  // buffer written from one message (as OpenWrite, Append, Finish). INVALID_ARGUMENT beyond
  // kMaxRelayBytes in either, so they stay short enough for a reactor thread.
  absl::StatusOr<v1::ReadBoxesResponse> ReadBoxes(const v1::ReadBoxesRequest& request);
  absl::StatusOr<v1::WriteChunkResponse> WriteBuffer(const v1::ChunkData& message);

  // Cancels every running fragment and waits up to `grace` for them to end; false if some
  // still run (their threads reference this object: the process should exit).
  bool Shutdown(absl::Duration grace);
  // Waits until no fragment runs (tests).
  void WaitIdle();
  // A draining worker: Execute answers UNAVAILABLE `reason` from now on; running fragments go
  // on. Waits up to `timeout` for them to end; true when none runs.
  bool StopAcceptingAndAwaitIdle(const std::string& reason, absl::Duration timeout);
  int running() const;

  // The worker's memory accounting (worker/memory/memory_budget.h), when its space is budgeted:
  // final reports then carry the most it held while the fragment ran. Set before use.
  void set_memory_budget(MemoryBudget* budget) { budget_ = budget; }

  // Prepared transfers (PrepareTransfer, RunTransfer, DropTransfer), run by this core.
  TransferRunner* transfers() { return transfers_.get(); }

 private:
  struct RunPart;
  struct PlanRun;
  absl::Status CheckAcceptingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckPlanIdLocked(const std::string& plan_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finds the source buffer of `member`'s tensor and version with `shape`'s chunks and, when
  // the member writes an attached buffer in place, its target.
  absl::Status PrepareBuffers(const FragmentShape& shape, const FragmentMember& member,
                              RunPart* part);
  // PrepareBuffers for every member (into the sized parts), then every other target in one
  // allocation (HostBuffer::CreateMany); errors of a fused fragment name the member.
  absl::Status PrepareParts(PlanRun* run);
  // Registers the run and starts its thread.
  absl::Status Launch(std::shared_ptr<PlanRun> run);
  // The one run path: (buffers,) strategy, write-back, store, then the outcome to the hook
  // or the coordinator.
  void Run(std::shared_ptr<PlanRun> run);
  // A plan's outcome as its final report (`plan_chunks`: a single plan's target chunks).
  void ReportEnd(const PlanRun& run, const RunResult& result, const RankChunks& plan_chunks);
  void Report(const PlanRun& run, v1::ReportChunksRequest request);

  BufferStore* const buffers_;
  CommunicatorCache* const communicators_;
  ChunkReporter* const reporter_;
  const std::function<WorkerIdentity()> identity_;
  const ExecutorOptions options_;
  const std::function<void(absl::string_view)> log_;
  MemorySpace* const space_;
  MemoryBudget* budget_ = nullptr;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<PlanRun>> plans_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> ended_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string refusing_ ABSL_GUARDED_BY(mu_);  // Why Execute is refused (draining).

  // Destroyed first, once the destructor saw every run end (their hooks point into it).
  std::unique_ptr<TransferRunner> transfers_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_CONTROL_WORKER_CORE_H_
