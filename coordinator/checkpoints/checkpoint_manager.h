#ifndef SHARDCOORD_COORDINATOR_CHECKPOINTS_CHECKPOINT_MANAGER_H_
#define SHARDCOORD_COORDINATOR_CHECKPOINTS_CHECKPOINT_MANAGER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/coordinator_metrics.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "proto/convert.h"
#include "proto/shardcoord.pb.h"
#include "sharding/block_quant.h"
#include "sharding/checkpoint_index.h"
#include "sharding/safetensors.h"

namespace shardcoord {

struct SaveCheckpointArgs {
  std::string id;  // Follows the save in Progress (the request_id, or one made up).
  std::string dir;
  std::vector<std::string> tensors;
  bool all = false;
  bool overwrite = false;
};

struct LoadTargetArgs {
  std::string tensor;        // In the checkpoint.
  std::string name;          // Empty: prefix + tensor.
  std::optional<Spec> spec;  // Required unless into.
};

struct LoadCheckpointArgs {
  std::string id;
  std::string dir;
  std::vector<LoadTargetArgs> targets;
  bool all = false;          // Every tensor of the checkpoint, to `spec`.
  std::optional<Spec> spec;  // For all.
  std::string prefix;
  bool into = false;
  // Cast every tensor to this dtype as it loads (sharding/cast.h); empty: the checkpoint's.
  // With `into` the copies cast to each existing tensor's dtype, which this must then be.
  std::optional<DType> dtype;
  // Dequantize block-scaled FP8 (issue 28): every f8_e4m3 tensor N with a tensor N_scale_inv
  // (f32 of BlockScaleShape(N's shape, block)) loads as its dequantized value in `dtype`
  // (bf16 when empty; with into, the existing tensor's), read with its scales by the workers;
  // the N_scale_inv tensors are consumed, never loaded (all skips them, naming one is
  // INVALID_ARGUMENT). INVALID_ARGUMENT for an f8_e4m3 tensor without its scale or with a
  // scale of another shape or dtype; FAILED_PRECONDITION for a piece of N (or its scale rows)
  // that does not start on a block boundary (a shardcoord checkpoint cut inside blocks).
  bool dequantize = false;
  BlockSize block;
};

// A checkpoint directory as a worker read it: the index (from index.json, or made from the
// headers of plain safetensors files) and every referenced file's header, checked against the
// file's size and the index. DATA_LOSS naming the file (and entry) for a truncated file or a
// header that disagrees with the index; INVALID_ARGUMENT for a malformed index or header.
struct CheckpointFiles {
  std::string dir;
  bool plain = false;
  CheckpointIndex index;
  std::map<std::string, SafetensorsHeader> headers;
  std::map<std::string, int64_t> file_bytes;
};
absl::StatusOr<CheckpointFiles> ParseCheckpointFiles(const v1::ReadCheckpointIndexResponse& read);

// Saves and loads checkpoints (issue 13) by telling workers what to write and read: only
// workers touch storage, and no tensor byte passes through the coordinator.
//
// Save: the tensors are held busy (as a plan holds them) while the save runs. PlanSave picks
// one writer per distinct piece, balanced; one worker creates `dir.tmp-ID`, every writer
// writes and fsyncs its file there, and once all succeeded one worker writes index.json,
// fsyncs the directory and renames it to `dir` (with overwrite, swapped with the old one in
// one rename). Any failure removes dir.tmp-ID and leaves `dir` as it was.
//
// Load: a worker reads index.json and the file headers; PlanLoad picks who reads which rows
// (each once, by a rank that needs them); each reader reads its rows into hidden staging
// tensors (TensorRecord::owner), checking every block against the index's XXH64; then group
// plans (PlanManager::LoadGroup) move the staging tensors to their targets, or copy them into
// existing tensors (into). The tensors are read in batches (load_batch_bytes), each batch's
// group running while the next batch is read; the groups keep their results hidden and the
// load publishes every tensor at once when all committed (TensorManager::PublishAll). Into
// loads run as one batch (a group's commit is their copies'). A failure at any point, once
// nothing is in flight, drops the staging and target buffers and hidden tensors: nothing is
// created or changed.
//
// Asynchronous: callbacks run on any thread, with no lock held. Thread-safe.
struct CheckpointManagerOptions {
  // SavePlanOptions::min_part_bytes: replicated pieces are shared among their holders in
  // parts no smaller than this.
  int64_t min_part_bytes = int64_t{64} << 10;
  // A load (not into) reads in batches of about this many checkpoint bytes (CutLoadBatches),
  // each batch's exchange running while the next one is read; <= 0: one batch.
  int64_t load_batch_bytes = int64_t{128} << 20;
  // > 0: the first batch is only about this many bytes (CutLoadBatches), so the exchange
  // starts sooner.
  int64_t load_first_batch_bytes = int64_t{32} << 20;
  // Where saves and loads are counted; not owned, may be null.
  CoordinatorMetrics* metrics = nullptr;
};

class CheckpointManager {
 public:
  CheckpointManager(const Clock* clock, WorkerManager* workers, MeshManager* meshes,
                    TensorManager* tensors, PlanManager* plans, WorkerClient* client,
                    CheckpointManagerOptions options = {});

  using SaveCallback = std::function<void(absl::StatusOr<v1::SaveCheckpointResponse>)>;
  using LoadCallback = std::function<void(absl::StatusOr<v1::LoadCheckpointResponse>)>;
  using InspectCallback = std::function<void(absl::StatusOr<v1::InspectCheckpointResponse>)>;

  void Save(SaveCheckpointArgs args, SaveCallback done);
  void Load(LoadCheckpointArgs args, LoadCallback done);
  void Inspect(const std::string& dir, InspectCallback done);

  // A running save or load (and the last ones that ended). NOT_FOUND.
  absl::StatusOr<v1::CheckpointProgress> Progress(const std::string& id) const;

  // A worker incarnation is gone (the composition root's reaction to a death): a running save
  // or load that has it write, read or manage the directory fails with UNAVAILABLE "worker N
  // (rank R) died: ..." instead of its RPC's transport error, and starts nothing more (no
  // next batch is read); it ends once what is in flight ended. Call with no lock held.
  void OnWorkerLost(const WorkerRecord& worker, const std::string& reason);

 private:
  struct SaveState;
  struct LoadState;

  std::string NewOp(const char* kind);
  // A save's or load's state: its arguments and callback, a new op of `kind` started now,
  // which is also its id when the arguments have none.
  template <typename State, typename Args, typename Callback>
  std::shared_ptr<State> NewState(const char* kind, Args args, Callback done);
  // A live worker to read or manage a directory: the lowest live rank among `prefer`, else
  // the lowest live rank. FAILED_PRECONDITION when no worker is alive.
  absl::StatusOr<WorkerEndpoint> AnyLiveWorker(const std::vector<int64_t>& prefer = {}) const;
  absl::StatusOr<WorkerEndpoint> Endpoint(int64_t rank) const;
  // A worker's failure as the operation's error: "worker w1 (rank 1): MESSAGE".
  absl::Status WorkerError(const WorkerEndpoint& w, const absl::Status& s) const;

  // Whom OnWorkerLost tells, until EndProgress(id): sets the operation's error when it uses
  // the worker.
  using LossFn = std::function<void(const WorkerRecord& worker, const absl::Status& lost)>;
  void StartProgress(const std::string& id, const std::string& op, int64_t total, LossFn on_lost);
  void UpdateProgress(const std::string& id, const std::string& phase, int64_t add_done);
  void EndProgress(const std::string& id, const absl::Status& s);

  void SaveWritten(const std::shared_ptr<SaveState>& st);
  void SaveFailed(const std::shared_ptr<SaveState>& st, absl::Status s);
  void SaveCommitted(const std::shared_ptr<SaveState>& st);

  void LoadIndexRead(const std::shared_ptr<LoadState>& st,
                     absl::StatusOr<v1::ReadCheckpointIndexResponse> read);
  // Sends batch b's reads (nothing once the load failed).
  void ReadBatch(const std::shared_ptr<LoadState>& st, size_t b);
  // Batch b was read: starts reading b + 1, then b's exchange group.
  void BatchRead(const std::shared_ptr<LoadState>& st, size_t b);
  // Batch b ended (its reads failed, or its group ended: `exchanged`). The last batch to end
  // finishes the load: failed (after everything in flight ended) or published.
  void BatchEnded(const std::shared_ptr<LoadState>& st, size_t b, const absl::Status& s,
                  bool exchanged = false);
  void LoadFailed(const std::shared_ptr<LoadState>& st, absl::Status s);
  void LoadExchanged(const std::shared_ptr<LoadState>& st);

  const Clock* const clock_;
  WorkerManager* const workers_;
  MeshManager* const meshes_;
  TensorManager* const tensors_;
  PlanManager* const plans_;
  WorkerClient* const client_;
  const CheckpointManagerOptions options_;

  mutable absl::Mutex mu_;
  int64_t next_op_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, v1::CheckpointProgress> progress_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_ ABSL_GUARDED_BY(mu_);          // Kept for Progress, oldest first.
  std::map<std::string, LossFn> running_ ABSL_GUARDED_BY(mu_);  // By id, until they end.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_CHECKPOINTS_CHECKPOINT_MANAGER_H_
