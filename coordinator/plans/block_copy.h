#ifndef SHARDCOORD_COORDINATOR_PLANS_BLOCK_COPY_H_
#define SHARDCOORD_COORDINATOR_PLANS_BLOCK_COPY_H_

// Copies that quantize to block-scaled FP8 or back (issue 28: `shardctl tensor copy SRC DST
// --quantize block:128x128 --scale S`, `--dequantize --scale S`). A block's scale needs all of
// its elements on one rank, and any layout may cut blocks between ranks, so a block copy runs
// in three steps over the checkpoint load's machinery (hidden tensors owned by the operation,
// PlanManager::LoadGroup, all or nothing):
//   1. stage: one group copies SRC (and, dequantizing, SRC_SCALE) into hidden tensors laid
//      out as sharding/block_staging.h's PlanBlockStaging chose: on SRC's own ranks, every
//      block whole on one rank (where a source chunk already holds a block whole it stays
//      there and nothing moves for it). When that layout is SRC's own (shards of whole
//      blocks, no replicas), SRC is not copied: it is held busy and step 2 reads it in place;
//   2. compute: Worker.BlockQuantize on every staging rank turns its chunks into new buffers,
//      registered as hidden tensors (values, and scales when quantizing);
//   3. commit: one group copies them into DST (and DST_SCALE), which get their new versions
//      together or not at all.
// Whatever the outcome, the hidden tensors and their buffers are dropped; on failure DST and
// DST_SCALE keep their versions. SRC is read at the version step 1 saw (or held).
//
// A CopyGroup with block members runs as one such operation (StartGroup): step 1 stages every
// block member's sources in one group, step 2 computes them all, and step 3 is one group of
// every member's outputs and scales plus the group's plain members (ordinary copies, casts
// allowed), so every dst and scale of the request commits together or none does.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "sharding/block_quant.h"
#include "sharding/block_staging.h"

namespace shardcoord {

struct BlockCopyArgs {
  std::string src;
  std::string dst;
  // Quantize: written (DST_SCALE); dequantize: read (SRC_SCALE). Empty in a group: a plain
  // copy member (src into dst as CopyGroup copies it).
  std::string scale;
  BlockSize block;
  bool dequantize = false;

  bool plain() const { return scale.empty(); }
};

struct BlockCopyResult {
  int64_t dst_version = 0;
  int64_t scale_version = 0;  // Quantize: DST_SCALE's new version; dequantize: 0.
  int64_t blocks = 0;         // Blocks of the tensor.
  int64_t cut_blocks = 0;     // Blocks no source chunk held whole: made whole by staging.
  int64_t staged_bytes = 0;   // Moved by step 1.
  int64_t bytes_moved = 0;    // Moved by steps 1 and 3 together.
  // Where blocks were made whole: per staging rank, "rank R: N blocks in K boxes".
  std::vector<std::string> staging;
  std::string stage_group;   // Step 1's group id.
  std::string commit_group;  // Step 3's group id.
};

// A group's outcome: per member (in the request's order) its BlockCopyResult (a plain member:
// dst_version and bytes_moved only), its commit plan and final progress; totals over all.
struct BlockGroupResult {
  std::vector<BlockCopyResult> members;
  std::vector<StartedPlan> commits;    // Step 3's plan of each member's dst.
  std::vector<PlanProgress> progress;  // Their final progress.
  std::string stage_group;             // Empty when no member needed staging.
  std::string commit_group;
  int64_t staged_bytes = 0;
  int64_t bytes_moved = 0;
  int64_t lower_bound_bytes = 0;  // The final group's (what moving the results must cost).
  double seconds = 0;             // All three steps.
};

// The refusals of a block copy that need only the three tensors' records (pure): dtypes
// (quantize: dst f8_e4m3, src a float dtype but f8_e8m0; dequantize: src f8_e4m3, dst such a
// float), equal shapes of at least two dims, the scale tensor f32 of BlockScaleShape, and
// three distinct tensors. INVALID_ARGUMENT naming the field ("dst", "scale", ...) and values.
absl::Status CheckBlockCopy(const BlockCopyArgs& args, const TensorRecord& src,
                            const TensorRecord& dst, const TensorRecord& scale);

// Runs block copies. Thread-safe; no lock is held while calling other managers, workers or
// callbacks.
class BlockCopy {
 public:
  using Done = std::function<void(absl::StatusOr<BlockCopyResult>)>;
  using GroupDone = std::function<void(absl::StatusOr<BlockGroupResult>)>;

  BlockCopy(const Clock* clock, TensorManager* tensors, PlanManager* plans, WorkerManager* workers,
            WorkerClient* client)
      : clock_(clock), tensors_(tensors), plans_(plans), workers_(workers), client_(client) {}

  // Checks the request (NOT_FOUND a tensor; CheckBlockCopy's refusals) and starts it; `done`
  // gets the outcome once, on any thread (possibly before Start returns). A refusal returns
  // its error and never calls `done`; nothing changed then.
  absl::Status Start(const BlockCopyArgs& args, Done done);
  // Many copies, some of them block copies, as one transaction (CopyGroup). Refusals as
  // Start's and CheckCopyGroup's (each tensor once in the group: src, dst or scale), plain
  // members' as CheckCopyPair's, all prefixed with "copies[i]." and checked before anything
  // runs.
  absl::Status StartGroup(const std::vector<BlockCopyArgs>& members, GroupDone done);

 private:
  struct Member;
  struct Op;
  absl::Status Begin(const std::shared_ptr<Op>& op);
  void Staged(const std::shared_ptr<Op>& op);
  void Computed(const std::shared_ptr<Op>& op);
  absl::Status RegisterComputed(Op& op, Member& m);
  void Finish(const std::shared_ptr<Op>& op, absl::Status s);
  absl::StatusOr<WorkerEndpoint> Endpoint(int64_t rank) const;
  // A hidden tensor of `layout` made ready without buffers (its first version is never read:
  // step 1 writes its next one) or, with `checksums`, over buffers the workers just made.
  absl::Status AddHidden(Op& op, const std::string& name, DType dtype, const Layout& layout,
                         int64_t version, LayoutChecksums checksums);

  const Clock* const clock_;
  TensorManager* const tensors_;
  PlanManager* const plans_;
  WorkerManager* const workers_;
  WorkerClient* const client_;

  absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_PLANS_BLOCK_COPY_H_
