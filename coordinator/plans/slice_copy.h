#ifndef SHARDCOORD_COORDINATOR_PLANS_SLICE_COPY_H_
#define SHARDCOORD_COORDINATOR_PLANS_SLICE_COPY_H_

// Copies into and out of slices of fused tensors (issue 28 item 4): CopyGroup (and Copy)
// members with `dst_offset` (q, k, v into a fused qkv; experts into a stacked [E, 2I, H]) or
// `src_offset`/`src_shape` (the reverse). Boxes and the rank rule: sharding/box_slices.h.
//
// Two ways to run, both all or nothing over every dst; every tensor of the group is acquired
// (busy) first and every refusal below comes before anything changes.
//
// Small (every rank buffer of the group's tensors at most kMaxRelayMaxBytes, or no
// PlanManager): through the coordinator, as plan_relay.h moves small plans. For every rank of
// every dst, the coordinator reads the pieces of the members' srcs that land in that rank's
// chunks (ReadBoxes from one live replica each) and, where the members do not cover a chunk,
// the rank's own old chunk of dst (its values outside the boxes); it lays out the rank's new
// local buffer (casting to dst's dtype where a member's src differs) and writes it at dst's new
// version (WriteBuffer, which answers the chunks' checksums). bytes_moved: the bytes relayed.
//
// Large (anything bigger): on the workers, in the block copy's shape (hidden tensors owned by
// the operation, PlanManager::LoadGroup). (1) A member reading a box of src (or sharing its
// src with an earlier member) has the box read out on src's ranks into a hidden tensor laid
// out as RestrictLayout(src's live layout, box) (Worker.ComposeBoxes; local copies). (2) One
// LoadGroup copies every member's src (or extract) into a hidden staging tensor laid out as
// RestrictLayout(dst's layout, dst box) in dst's dtype (casts there; the srcs are released
// first, the group acquires them). (3) Worker.ComposeBoxes on every dst rank builds the new
// version from [old buffer where the members leave part of it, staged members at their
// offsets]. Costs: the network carries step 2's pieces; steps 1 and 3 are host copies, step 3
// of whole dst rank buffers. bytes_moved: step 2's bytes between ranks, from the layouts.
//
// Then, only when every new buffer of every dst exists, all dsts are committed together
// (TensorManager::CommitAll: one new version each, with the checksums their workers
// computed), and their old versions are dropped. Any failure (a worker error, a dead worker,
// the group aborting) drops the new buffers and hidden tensors and releases every tensor:
// every tensor keeps its version and values.
//
// Why not a single plan: a plan writes one target tensor per member from one source tensor,
// while a fused dst's new version is made of several sources and its own old values.
//
// Thread-safe. No lock is held while calling workers or callbacks.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "sharding/box.h"

namespace shardcoord {

// One member of a CopyGroup that may name boxes (CopyPair's fields; empty: the whole tensor).
struct SliceCopyMember {
  std::string src;
  std::string dst;
  std::optional<Shape> dst_offset;
  std::optional<Shape> src_offset;
  std::optional<Shape> src_shape;

  bool sliced() const {
    return dst_offset.has_value() || src_offset.has_value() || src_shape.has_value();
  }
};

// Whether any member names a box: then the group runs as a slice copy.
bool AnySliced(const std::vector<SliceCopyMember>& members);

class SliceCopier {
 public:
  // Without `plans`, only the relay runs (and large slices are refused as before).
  SliceCopier(WorkerManager* workers, TensorManager* tensors, WorkerClient* client,
              PlanManager* plans = nullptr)
      : workers_(workers), tensors_(tensors), client_(client), plans_(plans) {}

  // Starts the group (see above). StartedGroup::members[i] has the member's dst and the
  // version it gets (`plan` is null: no plan runs on the workers); `done` runs once, when the
  // group committed or was rolled back (GroupProgress::error naming the member or worker).
  // Refused before anything changes: INVALID_ARGUMENT naming the member and field
  // ("copies[2].dst_offset: ...", `field` is "copies") for an empty group or name, a tensor
  // both src and dst, bad or overlapping boxes (sharding/box_slices.h), a cast that is not
  // allowed; NOT_FOUND a tensor; ABORTED a tensor busy; FAILED_PRECONDITION a src chunk with
  // no live replica or a dst rank whose holder is not live; UNIMPLEMENTED a Partial or
  // attached tensor, or (only without a PlanManager) a rank buffer over kMaxRelayMaxBytes.
  // StartedGroup::bytes_moved: see above.
  absl::StatusOr<StartedGroup> Start(const std::vector<SliceCopyMember>& members,
                                     const std::string& field, PlanManager::GroupDoneCallback done);

  // Refuses new slice copies with UNAVAILABLE `reason` and lets running ones end (a draining
  // coordinator, as PlanManager::Close).
  void Close(const std::string& reason);
  // Blocks until none runs or `deadline` passes; true when none runs. For the daemon's main
  // thread, never a reactor.
  bool AwaitIdle(absl::Time deadline);
  int64_t RunningCount() const;

 private:
  WorkerManager* const workers_;
  TensorManager* const tensors_;
  WorkerClient* const client_;
  PlanManager* const plans_;

  mutable absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  std::string closed_ ABSL_GUARDED_BY(mu_);  // Non-empty: why new ones are refused.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_PLANS_SLICE_COPY_H_
