#ifndef SHARDCOORD_COORDINATOR_STATE_TENSOR_MANAGER_H_
#define SHARDCOORD_COORDINATOR_STATE_TENSOR_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/store/state_store.h"
#include "proto/convert.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"

namespace shardcoord {

// A tensor and its authoritative layout: which rank holds which chunk of version `version`,
// with the checksums workers reported.
struct TensorRecord {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  std::string mesh;  // Empty when the layout is on no named mesh (gathered to one rank).
  std::string spec;  // "S(0),R", "flat 0:4;4:8", "rank 3".
  Layout layout;
  LayoutChecksums checksums;  // Shaped as layout's chunks.
  int64_t version = 0;
  std::string busy_plan;  // Its holder: the plan or operation running on it; empty when idle.
  bool ready = false;     // False while it is being created.
  // The worker incarnation that holds each rank's buffer: a restarted worker holds nothing.
  absl::flat_hash_map<int64_t, int64_t> incarnations;
  // After a coordinator restart, until reconciled: every operation on the tensor answers
  // UNAVAILABLE. `awaiting` are the ranks whose chunks were live when the coordinator
  // stopped and whose workers have not registered again yet.
  bool recovering = false;
  std::set<int64_t> awaiting;
  // Created with init ATTACHED (and not moved into worker-owned buffers since): each rank's
  // buffer lives in a user process. `unattached` ranks have none now (not attached yet, or
  // detached when the process exited): their chunks are missing, as a dead worker's.
  bool attached = false;
  std::set<int64_t> unattached;
  // Non-empty: the work in progress of that operation (a checkpoint load), hidden from
  // everyone else: Get, Acquire and Remove see it only when given this owner, List never,
  // and it is never stored. A commit with NewState::publish makes it an ordinary tensor.
  std::string owner;

  int64_t bytes() const;
};

// A chunk with no live replica.
struct LostChunk {
  Box box;
  int64_t partial_index = 0;
  std::vector<int64_t> ranks;  // The dead holders.

  // "[0:4, 0:8] on rank 1", "[0:4] (partial 1) on ranks 1, 3".
  std::string ToString() const;
};

// True when `rank` is alive in `incarnation` (WorkerManager::IsLive).
using LivenessFn = std::function<bool(int64_t rank, int64_t incarnation)>;

// Every chunk (box, partial index) of which no holder is alive (an unattached rank of an
// attached tensor holds nothing), in layout order.
std::vector<LostChunk> LostChunks(const TensorRecord& tensor, const LivenessFn& live);

// The tensor's layout restricted to live holders: the layout itself when all are alive;
// FAILED_PRECONDITION naming the lost chunks when some chunk has no live replica.
absl::StatusOr<Layout> LiveLayout(const TensorRecord& tensor, const LivenessFn& live);

// Replicas (chunks with equal box and partial index) must have equal checksums;
// DATA_LOSS naming the chunk and both ranks (through `describe`) otherwise.
absl::Status CheckReplicaChecksums(const Layout& layout, const LayoutChecksums& checksums,
                                   const std::function<std::string(int64_t rank)>& describe);

// A buffer a registering worker holds (RegisterWorkerRequest.held).
struct HeldBuffer {
  std::string tensor;
  int64_t version = 0;
  RankChunks chunks;
  ChunkChecksums checksums;
};

// One member of a prepared transfer (coordinator/transfers/): dst gets src's values.
struct TransferCopy {
  std::string src;
  std::string dst;
};
using TransferCopies = std::shared_ptr<const std::vector<TransferCopy>>;

// One member tensor as a transfer's preparation sees it (TensorManager::SnapshotTransfer).
struct TransferSide {
  int64_t version = 0;  // Its version as readers see it.
  DType dtype = DType::kF32;
  Shape shape;
  std::string mesh;
  std::string spec;
  bool attached = false;
  // Ranks of its layout whose buffer is not live (a dead or restarted holder, or an
  // unattached rank): what LiveLayout leaves out. `unattached` are those of them without a
  // lent buffer.
  std::vector<int64_t> dropped;
  std::vector<int64_t> unattached;
};
// A run's commit (TensorManager::CommitTransferRun).
struct TransferCommit {
  std::string run_id;
  int64_t version = 0;  // Every dst's from now on.
  StateRecord record;   // The transfer's one durable record.
  // Dsts the run gave a buffer on ranks whose holder had lost it (a worker registered again
  // without it): their records are stored with the run's version and `incarnations` (rare:
  // after a worker's restart; every other dst's holders are the run's participants already).
  std::vector<std::string> repaired;
  absl::flat_hash_map<int64_t, int64_t> incarnations;  // The participants'.
};
struct TransferSnapshot {
  // The members' change count when the snapshot was taken: a run of a preparation made from
  // it starts only while nothing changed since (StartTransferRun).
  int64_t generation = 0;
  std::vector<TransferSide> src;  // By member.
  std::vector<TransferSide> dst;
};
// A bound transfer as the tensor manager keeps it.
struct TransferBindingState {
  int64_t generation = 0;
  std::string reason;   // Why the generation last moved (empty: never since bound).
  int64_t version = 0;  // Its last committed run's version (0: none).
  std::string running;  // The run holding its members, if any.
};

// Tensors by name. A tensor is busy while one plan or operation (create, upload) runs on it;
// a second is rejected with ABORTED, so concurrent plans touch different tensors. Keeps the
// MeshManager's user counts: a tensor uses its mesh, and a plan its target mesh until it
// commits or ends. Thread-safe; never calls the MeshManager under its own lock.
class TensorManager {
 public:
  // `store` (not owned; null: nothing is stored) keeps every ready tensor ("tensor"
  // records, StoredTensor) and the version counter: a change returns once it is stored.
  explicit TensorManager(MeshManager* meshes, StateStore* store = nullptr)
      : meshes_(meshes), store_(store) {}

  // Loads the stored tensors after a restart, each recovering until every rank whose
  // holder `was_live` (WorkerManager::WasLiveBeforeRestart) has registered again (Reconcile)
  // or EndRecovery. Call once, after MeshManager::Load and before serving. INTERNAL for a
  // record that does not parse.
  absl::Status Load(const LivenessFn& was_live);

  // Reconciles a worker that registered as `rank` in `incarnation` and holds `held`. A
  // recovering tensor takes the rank's buffer at its committed version when its chunks and
  // checksums are exactly the committed ones; the rank's other chunks of recovering tensors
  // stay lost. Outside a restart, an idle tensor takes the buffer back the same way (a worker
  // declared dead while cut off, which kept its buffers, rejoins with its data). Returns the
  // buffers the worker must drop: versions that never committed (from before the restart, or of a
  // tensor no operation runs on), tensors that do not exist, rejected buffers of recovering
  // tensors. The store's error (UNAVAILABLE) when the outcome could not be stored (nothing
  // changed).
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> Reconcile(
      int64_t rank, int64_t incarnation, const std::vector<HeldBuffer>& held);
  // Ends every recovery: ranks still awaited lose their chunks (as a dead worker's).
  void EndRecovery();
  // Names of the tensors still recovering.
  std::vector<std::string> Recovering() const;

  // A version number no buffer of any tensor has used (also before a restart).
  int64_t NewVersion();

  // Adds a tensor that is not ready yet, busy with `holder`. ALREADY_EXISTS; NOT_FOUND mesh.
  absl::Status Reserve(TensorRecord record, const std::string& holder);
  // Makes a reserved tensor ready with its chunks' checksums and holders.
  absl::Status FinishCreate(absl::string_view name, const std::string& holder,
                            LayoutChecksums checksums,
                            absl::flat_hash_map<int64_t, int64_t> incarnations);
  // Forgets a reserved tensor.
  void CancelCreate(absl::string_view name, const std::string& holder);

  // Marks a ready tensor busy with `holder` and returns it. NOT_FOUND; ABORTED busy.
  // `target_mesh`, when not empty, counts as used by the tensor until Commit or Release
  // (NOT_FOUND when it does not exist). `owner` also finds the tensors it hides.
  absl::StatusOr<TensorRecord> Acquire(absl::string_view name, const std::string& holder,
                                       const std::string& target_mesh = "",
                                       const std::string& owner = "");
  // Ends `holder` without changes. No-op when `holder` does not hold the tensor.
  void Release(absl::string_view name, const std::string& holder,
               const std::string& target_mesh = "");

  struct NewState {
    std::string mesh;  // Must be the target mesh given to Acquire (or the current mesh).
    std::string spec;
    Layout layout;
    LayoutChecksums checksums;
    int64_t version = 0;
    absl::flat_hash_map<int64_t, int64_t> incarnations;
    // The tensor stays attached (a Copy into an attached tensor wrote its buffers in place;
    // ranks detached meanwhile stay unattached); false: it is in worker-owned buffers now.
    bool attached = false;
    // A hidden tensor (TensorRecord::owner) becomes an ordinary, stored one.
    bool publish = false;
    // The tensor's dtype from now on (a plan that casts: a checkpoint load with a dtype);
    // empty: unchanged.
    std::optional<DType> dtype;
  };
  // Replaces the layout and ends `holder`. FAILED_PRECONDITION when `holder` does not hold it.
  absl::Status Commit(absl::string_view name, const std::string& holder, NewState state);

  // Commits several tensors at once, each held by its own holder: all or none (FAILED_PRECONDITION
  // naming the first that is not held, and then nothing changed). Readers see either every
  // new state or none.
  struct CommitItem {
    std::string name;
    std::string holder;
    NewState state;
  };
  absl::Status CommitAll(std::vector<CommitItem> items);

  // Makes tensors hidden by `owner` (ready and idle) ordinary, stored ones: all or none, stored
  // in one batch. FAILED_PRECONDITION naming the first that is not a ready, idle tensor hidden
  // by `owner` (and then nothing changed); the store's error.
  absl::Status PublishAll(const std::vector<std::string>& names, const std::string& owner);

  // Counts a buffer a user process lent `rank`'s worker (incarnation `incarnation`) as the
  // rank's chunks of attached tensor `name` at `version`, and returns the tensor. NOT_FOUND;
  // FAILED_PRECONDITION not attached, or the rank is attached already (by a live holder);
  // ABORTED busy, or `version` is not the committed one; INVALID_ARGUMENT `dtype` or
  // `chunks` other than the rank's (naming both); UNAVAILABLE recovering or the store.
  absl::StatusOr<TensorRecord> Attach(absl::string_view name, int64_t rank, int64_t incarnation,
                                      int64_t version, DType dtype, const RankChunks& chunks);
  // One buffer of AttachMany.
  struct AttachItem {
    std::string name;
    int64_t version = 0;  // The committed version the user saw; 0: whatever is committed.
    DType dtype = DType::kF32;
    std::optional<RankChunks> chunks;  // Absent: the rank's chunks, whatever they are.
    int64_t bytes = 0;                 // Must be the rank's local_elements x element size.
  };
  // What AttachMany answers for one buffer.
  struct Attached {
    int64_t version = 0;
    RankChunks chunks;      // The rank's chunks of the tensor's layout.
    bool readable = false;  // No chunk is lost now (false with validate_only).
  };
  // Attach for every item (`rank`'s buffers lent to holder `incarnation`), all or nothing in
  // one lock scope and one store batch; each item is also checked against `bytes`. With
  // `validate_only` nothing changes. `live` maps each live rank to its incarnation (a
  // snapshot of the workers, for `readable`). Answers in item order. The first refusal has
  // Attach's code and a message starting with "buffers[i] 'NAME': "; INVALID_ARGUMENT no
  // items or more than kMaxAttachmentsPerRequest, an empty name, a name twice, or bytes
  // other than the rank's. Nothing changed on error.
  absl::StatusOr<std::vector<Attached>> AttachMany(
      int64_t rank, int64_t incarnation, const std::vector<AttachItem>& items, bool validate_only,
      const absl::flat_hash_map<int64_t, int64_t>& live);
  // The buffer lent for `rank` by holder `incarnation` is gone: the rank becomes unattached.
  // Returns true when it changed something (false: not attached by that incarnation, or
  // no such tensor: nothing to do). The store's error when it could not be stored.
  absl::StatusOr<bool> Detach(absl::string_view name, int64_t rank, int64_t incarnation);

  // Replaces the checksums of one rank's chunks (a chunk upload), keeping the version.
  absl::Status UpdateRank(absl::string_view name, const std::string& holder, int64_t rank,
                          ChunkChecksums checksums, int64_t incarnation);

  // One rank's committed local buffer of a ready tensor in a worker's own memory (attached
  // tensors' buffers are the user processes'), and the incarnation that holds it: what
  // memory admission counts as committed (coordinator/plans/admission.h).
  struct HeldBytes {
    int64_t rank = 0;
    int64_t incarnation = 0;
    int64_t bytes = 0;
  };
  // One entry per (rank, incarnation), its bytes summed over tensors; by rank, incarnation.
  std::vector<HeldBytes> BytesByHolder() const;

  // Ready tensors only: NOT_FOUND while being created. Get, Acquire and Remove answer
  // UNAVAILABLE for a tensor still recovering after a restart. Hidden tensors are found only
  // with their `owner`.
  absl::StatusOr<TensorRecord> Get(absl::string_view name, const std::string& owner = "") const;
  // Ready tensors that are not hidden.
  std::vector<TensorRecord> List() const;
  // Up to `limit` of List's tensors whose name starts with `prefix` and sorts after `after`,
  // in name order; `more` tells whether any follow. Costs the page, not the table.
  struct Page {
    std::vector<TensorRecord> tensors;
    bool more = false;
  };
  Page ListPage(absl::string_view prefix, absl::string_view after, size_t limit) const;
  // ---- Prepared transfers (issue 27; coordinator/transfers/, tensor_manager_transfers.cc) --
  // A transfer binds its members here, so that a run costs O(1) whatever the member count:
  // one flag holds every member busy while it runs (Acquire, Remove, Attach answer ABORTED
  // naming the transfer), every dst reads its version through the binding (the run's once
  // it committed, newer than the dst's own record; its checksums are then unknown, 0, as an
  // attached tensor's), and a change to a member by anything else (a commit, an upload, a
  // delete, attach or detach, a worker's reconcile) moves the binding's generation with a
  // reason: the transfer prepares again before its next run. Members need not exist.

  // ALREADY_EXISTS when `transfer` is bound. `version`: its last committed run's (0: none;
  // a restart binds the stored one before workers reconcile).
  absl::Status BindTransfer(const std::string& transfer, TransferCopies copies, int64_t version);
  // Forgets the binding: each dst that read its version through it takes that version into
  // its own record, stored together with `batch` (the transfer's own deletes) in one apply.
  // NOT_FOUND; ABORTED while a run holds it; the store's error (then nothing changed).
  absl::Status UnbindTransfer(const std::string& transfer, StateBatch batch);
  // Every member as it is now, and the generation, in one look. `live`: by rank, the
  // incarnation alive now (-1 or absent: none). NOT_FOUND "copies[i].src: unknown tensor 'x'"
  // (or .dst); UNAVAILABLE recovering; ABORTED a member busy with another operation (named).
  absl::StatusOr<TransferSnapshot> SnapshotTransfer(const std::string& transfer,
                                                    const std::vector<int64_t>& live) const;
  absl::StatusOr<TransferBindingState> TransferState(const std::string& transfer) const;
  // Holds every member for run `run_id` when nothing changed since `generation`; else sets
  // *stale to why (and holds nothing). NOT_FOUND not bound; ABORTED a run holds it already,
  // a member is busy (named, with its holder), or a transfer sharing a member runs.
  absl::Status StartTransferRun(const std::string& transfer, const std::string& run_id,
                                int64_t generation, std::string* stale);
  // The run committed: commit.record (the transfer's one durable record, with the repaired
  // dsts' records in the same apply) is stored, then every dst reads commit.version and the
  // members are free. Transfers whose members its dsts are move their generation.
  // FAILED_PRECONDITION when the run does not hold the transfer; the store's error (then
  // nothing changed, the run still holds it).
  absl::Status CommitTransferRun(const std::string& transfer, const TransferCommit& commit);
  // The run ended without committing: the members are free. No-op unless it holds them.
  void EndTransferRun(const std::string& transfer, const std::string& run_id);

  // Removes a ready, idle tensor and returns it. NOT_FOUND; ABORTED busy.
  absl::StatusOr<TensorRecord> Remove(absl::string_view name, const std::string& owner = "");
  // Removes the named tensors and every visible one whose name starts with `prefix` (when
  // not empty), all or none, in one store batch, and returns them in name order. NOT_FOUND a
  // named one (or nothing matched); ABORTED the first busy one; UNAVAILABLE recovering or the
  // store's error. Nothing changed on error.
  absl::StatusOr<std::vector<TensorRecord>> RemoveAll(const std::vector<std::string>& names,
                                                      absl::string_view prefix);

 private:
  // Stores `t` (no-op without a store).
  absl::Status Persist(const TensorRecord& t) const;
  // Every change of a record in tensors_ goes through these, so held_ and the transfers
  // bound to it follow it. PutLocked inserts or replaces the record under its name; `why`
  // says what changed it ("was committed by p-3"), for the transfers it invalidates.
  void PutLocked(TensorRecord record, absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(std::map<std::string, TensorRecord, std::less<>>::iterator it,
                   absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountLocked(const TensorRecord& t, int64_t sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // held_ recomputed from every record (debug builds check the tally against it).
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> RecountLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static absl::Status RecoveringError(const TensorRecord& t);
  // OK when `t` (null: none named `name`) is a ready tensor that `owner` sees and not being
  // recovered; else NOT_FOUND, or RecoveringError.
  static absl::Status CheckVisible(const TensorRecord* t, absl::string_view name,
                                   const std::string& owner);
  // Attach's checks of one buffer for `rank` against `cur` (`version` absent: any; `bytes`
  // absent: not checked); the index of `rank` among its layout's ranks.
  absl::StatusOr<size_t> CheckAttachLocked(const TensorRecord& cur, int64_t rank,
                                           int64_t incarnation, std::optional<int64_t> version,
                                           DType dtype, const RankChunks* chunks,
                                           std::optional<int64_t> bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `cur` with `rank` attached by `incarnation` (its chunks at `index`).
  static TensorRecord WithAttached(const TensorRecord& cur, int64_t rank, int64_t incarnation,
                                   size_t index);

  // A prepared transfer's hold on its members (tensor_manager_transfers.cc).
  struct Binding {
    std::string name;
    TransferCopies copies;
    int64_t version = 0;
    int64_t generation = 1;
    std::string reason;
    std::string running;
    // Members busy with another holder now: a run may start only while it is empty.
    absl::flat_hash_set<std::string> held;
    // Other bindings sharing a tensor (their runs exclude each other), and those whose
    // members this one's dsts are (its commits move their generation).
    absl::flat_hash_set<std::string> overlaps;
    absl::flat_hash_set<std::string> writes_into;
  };
  // The bindings a tensor name is a member of.
  struct Membership {
    std::vector<Binding*> src_of;
    std::vector<Binding*> dst_of;
  };
  // A dst's record read through its bindings: the newest committed run's version when newer
  // than its own, with its checksums unknown.
  void FoldLocked(TensorRecord& t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the generation of every transfer `name` is a member of: "tensor 'x' <why>".
  void TouchLocked(absl::string_view name, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `name` became busy (or idle) with a holder of its own: its transfers count it held.
  void HeldLocked(absl::string_view name, bool busy) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What holds `t`: its holder, or a running transfer's run ("transfer 'T' (run t-1)"); ""
  // when idle.
  std::string BusyWithLocked(const TensorRecord& t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MeshManager* const meshes_;
  StateStore* const store_;
  mutable absl::Mutex mu_;
  std::map<std::string, TensorRecord, std::less<>> tensors_ ABSL_GUARDED_BY(mu_);
  // What BytesByHolder answers, kept as records change (PutLocked, EraseLocked): bytes of
  // ready, not attached tensors per (rank, incarnation). Admission asks before every plan.
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> held_ ABSL_GUARDED_BY(mu_);
  int64_t last_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Versions up to this one are stored as used (handed out in blocks).
  int64_t reserved_versions_ ABSL_GUARDED_BY(mu_) = 0;
  // Versions up to this one were handed out before the restart (Load).
  int64_t version_floor_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::unique_ptr<Binding>> bindings_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Membership> members_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STATE_TENSOR_MANAGER_H_
