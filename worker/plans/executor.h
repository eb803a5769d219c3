#ifndef SHARDCOORD_WORKER_PLANS_EXECUTOR_H_
#define SHARDCOORD_WORKER_PLANS_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sharding/fused_stream.h"
#include "sharding/layout.h"
#include "sharding/plan.h"
#include "sharding/plan_fragment.h"
#include "sharding/staging.h"
#include "worker/buffers/buffer_store.h"
#include "worker/comm/communicator.h"

namespace shardcoord {

// The op all members of a step run: the step's own op when its transfers have exactly that
// collective's shape (reductions always; copies unless the backend prefers point-to-point for
// them), else kPointToPoint (grouped send/recv), which runs any step. A function of the step
// alone (its op, group and transfers, which every member's fragment holds identically) and
// of the backend, so every member picks the same call.
StepOp ChooseStepOp(const Step& step, bool force_point_to_point = false);

struct ExecutorOptions {
  // When the fragment's step_timeout_ms is 0.
  absl::Duration default_step_timeout = absl::Seconds(60);
  // Run every step as grouped point-to-point. Every member of a plan must agree.
  bool force_point_to_point = false;
  // Run all-gather, all-to-all and broadcast steps as their collectives even where the
  // backend prefers SendRecv for them (Communicator::PrefersSendRecvForCopies). Every member
  // of a plan must agree.
  bool force_copy_collectives = false;
  // Largest message of a SendRecv step: transfers go as slabs of at most this many bytes
  // (one index of their outermost split dim at least), so packing, sending, landing and
  // hashing pipeline. Small enough for that, large enough that per-message costs stay
  // negligible. Every member of a plan must agree.
  int64_t message_bytes = int64_t{4} << 20;
  // The bucket size when the fragment gives none (its bucket_bytes is 0): the worker's
  // --bucket-bytes. Messages are at most min(message_bytes, bucket) and the fragment stages
  // at most StagingLimit(bucket) at once (sharding/staging.h): point-to-point exchanges run
  // in windows, and a collective whose buffers would exceed it runs as point-to-point. A
  // fused group cuts its streams with it too (sharding/fused_stream.h).
  int64_t bucket_bytes = kDefaultBucketBytes;
};

struct StepReport {
  int index = 0;  // Plan-wide step index.
  StepOp op = StepOp::kPointToPoint;
  StepOp method = StepOp::kPointToPoint;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  absl::Time start;  // Wall clock, for plan traces.
  absl::Duration time;
};

struct ExecuteResult {
  RankChunks chunks;                // The target chunks this rank now holds...
  std::vector<uint64_t> checksums;  // ...and their ChunkChecksum, index for index.
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  std::vector<StepReport> steps;
};

// Called after each step with the bytes this rank has received so far and in total (the sum
// over ranks of bytes_total is the plan's bytes_moved).
using ProgressCallback = std::function<void(int64_t bytes_done, int64_t bytes_total)>;

struct ExecuteInput {
  // One plan's (not fused): its one shape, applied to its one member.
  const Fragment* fragment = nullptr;
  // This rank's buffer of the member's source version; may be null when the shape's source
  // has no chunks. Its chunks must equal the shape's source's.
  const HostBuffer* source = nullptr;
  // A new buffer for the shape's target chunks (HostBuffer::Create(dtype, target)).
  HostBuffer* target = nullptr;
  CommunicatorCache* communicators = nullptr;
  // Optional: checked between steps, and passed to the communicator so a cancel also
  // interrupts a step in flight where the backend can.
  CancelToken* cancel = nullptr;
  ProgressCallback progress;  // Optional.
  ExecutorOptions options;
};

// Runs one fragment on this rank, following the execution contract of sharding/plan.h:
// zero-fill contributions that take no value; when any piece reduces, set every target chunk
// that takes a value to the identity of the reduce op; local copies; then each step in
// order (pack the boxes this rank sends from the source chunks holding them, communicate,
// unpack or combine into the target chunks holding them); then divide by divide_by; then
// checksum every target chunk.
//
// Errors: FAILED_PRECONDITION when the source buffer is missing or does not match the
// fragment; ABORTED when cancelled or a peer failed; DEADLINE_EXCEEDED when a step ran out
// of time (the step timeout bounds each step, its rendezvous included); the message names
// the step and its group. A failed fragment leaves the target buffer in an unspecified state.
absl::StatusOr<ExecuteResult> ExecuteFragment(const ExecuteInput& input);

// The tag that keeps a step's operations apart from other plans' on a shared communicator:
// FNV-1a of "<plan_id>/<step index>".
uint32_t StepTag(const std::string& plan_id, int step_index);

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_PLANS_EXECUTOR_H_
