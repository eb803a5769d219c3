#ifndef SHARDCOORD_COORDINATOR_IO_TENSOR_IO_H_
#define SHARDCOORD_COORDINATOR_IO_TENSOR_IO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/admission.h"
#include "coordinator/state/tensor_bands.h"
#include "coordinator/state/tensor_manager.h"
#include "proto/convert.h"
#include "proto/shardcoord.pb.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"

namespace shardcoord {

struct CreateTensorArgs {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  Spec spec;  // spec.mesh names the mesh.
  v1::InitKind init = v1::ZEROS;
  uint64_t seed = 0;
};

struct UploadArgs {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  // The layout to store a whole upload in; for an existing tensor, empty keeps its layout.
  std::optional<Spec> spec;
  // Upload of one rank's local buffer (of the current layout) instead of the whole tensor.
  std::optional<int64_t> rank;
};

struct DownloadedTensor {
  TensorRecord tensor;
  std::string data;  // Row-major, the whole tensor.
};

// The data paths that are not plans: creating a tensor (workers allocate and fill), whole
// and per-rank uploads, downloads, deletes. Like plans they are all-or-nothing: a new
// version becomes authoritative only when every worker has written it, and whatever was
// written is dropped on failure. Asynchronous: callbacks run on any thread, no lock held.
//
// Whole uploads and downloads stream in bands along dim 0 (coordinator/state/tensor_bands.h) of
// at most `band_bytes` (at least one dim-0 index): a download reads from the workers only
// each chunk's part in the band being assembled, an upload writes each band's parts into
// every rank's WriteChunk stream as the band arrives, so the coordinator holds a few bands,
// never the tensor.
inline constexpr int64_t kDefaultMaxTensorBytes = int64_t{1} << 40;  // 1 TiB.

class TensorIo {
  // What a worker's death tells an open upload or download (OnWorkerLost).
  struct LossWatch;

 public:
  using TensorCallback = std::function<void(absl::StatusOr<TensorRecord>)>;
  using DownloadCallback = std::function<void(absl::StatusOr<DownloadedTensor>)>;
  using StatusCallback = std::function<void(absl::Status)>;
  using BandCallback = std::function<void(absl::StatusOr<std::string>)>;

  // `max_tensor_bytes` bounds a created or uploaded tensor (RESOURCE_EXHAUSTED beyond).
  TensorIo(WorkerManager* workers, MeshManager* meshes, TensorManager* tensors,
           WorkerClient* client, int64_t band_bytes = kDefaultBandBytes,
           int64_t max_tensor_bytes = kDefaultMaxTensorBytes)
      : workers_(workers),
        meshes_(meshes),
        tensors_(tensors),
        client_(client),
        band_bytes_(band_bytes > 0 ? band_bytes : kDefaultBandBytes),
        max_tensor_bytes_(max_tensor_bytes) {}

  int64_t band_bytes() const { return band_bytes_; }
  // Memory admission (coordinator/plans/admission.h): a create or upload starts only when every
  // rank's new buffer fits its worker's budget now (RESOURCE_EXHAUSTED otherwise; they do not
  // wait), and holds that memory until it ends. Not owned; null: none. Set before use.
  void set_admission(AdmissionController* admission) { admission_ = admission; }

  // INVALID_ARGUMENT bad name or spec; ALREADY_EXISTS; NOT_FOUND mesh; FAILED_PRECONDITION
  // a dead worker in the mesh; UNAVAILABLE a worker failed to fill (nothing is left).
  void Create(const CreateTensorArgs& args, TensorCallback done);

  // Creates every tensor of `args` or none (coordinator/io/tensor_io_bulk.cc): all are
  // checked before any worker is called, each worker fills its buffers in a few FillMany
  // calls (at most kFillsPerCall each), the memory of all is admitted at once, and all become
  // visible in one store batch. Errors as Create's, naming the member ("tensors[i] 'name':
  // ..."); INVALID_ARGUMENT no members, more than kMaxBulkTensors, or a name given twice.
  struct CreatedMany {
    int64_t created = 0;
    int64_t bytes = 0;
  };
  static constexpr size_t kMaxBulkTensors = 100000;
  static constexpr int kFillsPerCall = 512;
  static constexpr size_t kDropsPerCall = 4096;
  void CreateMany(std::vector<CreateTensorArgs> args,
                  std::function<void(absl::StatusOr<CreatedMany>)> done);

  // A whole upload in progress: the tensor is busy (reserved when new) and every rank of the
  // target layout has a WriteChunk stream open for the new version. Bands go in order, one
  // at a time; then Finish or Abort. Destroying it before Finish aborts.
  class UploadStream {
   public:
    ~UploadStream();
    int64_t num_bands() const { return plan_.num_bands(); }
    int64_t band_bytes(int64_t i) const { return plan_.band_bytes(i); }
    const BandPlan& plan() const { return plan_; }
    // `data`: band `i`'s bytes, row-major, exactly band_bytes(i). `done` runs once every
    // rank's part of it was handed to its worker's stream; UNAVAILABLE naming a worker that
    // failed (then Abort).
    void WriteBand(int64_t i, std::string data, StatusCallback done);
    // After the last band: ends every stream, checks the chunks and checksums the workers
    // answer, and commits the new version (or drops it everywhere and keeps the old one).
    void Finish(TensorCallback done);
    // Drops the new version and ends the upload. Idempotent; a no-op after Finish.
    void Abort();

   private:
    friend class TensorIo;
    explicit UploadStream(TensorIo* io) : io_(io) {}
    void Fail(const absl::Status& s, const TensorCallback& done) {
      io_->FailUpload(args_.name, op_, version_, replace_, mesh_name_, endpoints_, s, done);
      if (memory_) memory_->Release();
    }

    TensorIo* const io_;
    UploadArgs args_;
    std::string op_;
    int64_t version_ = 0;
    bool replace_ = false;
    std::string mesh_name_;
    std::string spec_text_;
    Layout layout_;
    int64_t old_version_ = 0;
    std::vector<WorkerEndpoint> old_holders_;
    std::vector<WorkerEndpoint> endpoints_;  // Per rank of layout_.
    BandPlan plan_{Shape{}, 1, 1};
    bool zero_partials_ = false;
    std::shared_ptr<AdmissionHold> memory_;  // Its admitted memory; null without admission.
    std::vector<std::shared_ptr<ChunkWriteStream>> streams_;  // Per rank of layout_.
    std::shared_ptr<LossWatch> loss_;                         // Set once started.
    std::vector<int64_t> written_;  // Elements streamed to each rank so far.
    int64_t next_band_ = 0;
    bool started_ = false;  // StartUpload reserved or acquired the tensor and opened streams.
    absl::Mutex mu_;
    bool ended_ ABSL_GUARDED_BY(mu_) = false;  // Finished or aborted.
  };

  // Validates a whole upload's header and opens it. INVALID_ARGUMENT shape, dtype, a missing
  // spec for a new tensor; ALREADY_EXISTS an existing tensor of another shape or dtype;
  // NOT_FOUND mesh; FAILED_PRECONDITION a dead worker; ABORTED busy. Bands follow the
  // coordinator's band size unless a rank's chunks sit in its local buffer against dim-0
  // order (no layout built from a spec does that): then the whole tensor is one band.
  absl::StatusOr<std::shared_ptr<UploadStream>> StartUpload(const UploadArgs& args);

  // Whole upload: `data` is the tensor row-major; it is split into every rank's local
  // buffer and written as a new version, replacing the old one (or creating the tensor).
  // Rank upload: `data` is the rank's whole local buffer, which replaces it in place.
  // INVALID_ARGUMENT shape, dtype or byte count mismatch, a rank that holds nothing, a
  // missing spec for a new tensor; ALREADY_EXISTS an existing tensor of another shape or
  // dtype; NOT_FOUND mesh or (rank upload) tensor; ABORTED busy, or (rank upload) a download
  // of the tensor is running; UNAVAILABLE a worker.
  void Upload(const UploadArgs& args, std::string data, TensorCallback done);

  // The exact size of the rank's local buffer a rank upload (args.rank set) replaces, checked
  // against the tensor before any data is taken: NOT_FOUND tensor; INVALID_ARGUMENT shape or
  // dtype mismatch, a rank that holds nothing; FAILED_PRECONDITION attached.
  absl::StatusOr<int64_t> RankUploadBytes(const UploadArgs& args) const;

  // A download in progress: one version of the tensor, read band by band. While it lives,
  // rank uploads (which rewrite a version in place) are refused with ABORTED. A plan or
  // whole upload may commit a new version meanwhile: then reads of the old one fail and
  // FetchBand says ABORTED, so a download never mixes versions.
  class DownloadStream : public std::enable_shared_from_this<DownloadStream> {
   public:
    ~DownloadStream();
    const TensorRecord& tensor() const { return tensor_; }
    int64_t num_bands() const { return plan_.num_bands(); }
    int64_t band_bytes(int64_t i) const { return plan_.band_bytes(i); }
    const BandPlan& plan() const { return plan_; }
    // Reads band `i`'s part of every chunk from one live replica and assembles the band
    // (partial layouts reduced), row-major. Any band, several at once; the stream stays
    // alive until `done` ran. UNAVAILABLE a worker failed; ABORTED the tensor got a new
    // version or was deleted under the download.
    void FetchBand(int64_t i, BandCallback done) const;

   private:
    friend class TensorIo;
    explicit DownloadStream(TensorIo* io) : io_(io) {}
    absl::Status ReadFailed(absl::Status s) const;

    TensorIo* const io_;
    TensorRecord tensor_;
    BandPlan plan_{Shape{}, 1, 1};
    std::vector<BandSource> sources_;
    absl::flat_hash_map<int64_t, WorkerEndpoint> endpoints_;  // By rank.
    std::shared_ptr<LossWatch> loss_;
  };

  // NOT_FOUND; FAILED_PRECONDITION a chunk with no live replica; ABORTED a rank upload of it
  // is running.
  absl::StatusOr<std::shared_ptr<DownloadStream>> OpenDownload(const std::string& name);

  // The whole tensor in memory (tests and small tensors): OpenDownload, then every band.
  void Download(const std::string& name, DownloadCallback done);

  // NOT_FOUND; ABORTED busy. Workers drop the buffers in the background.
  absl::Status Delete(const std::string& name);
  // Deletes `names` and every tensor whose name starts with `prefix` (when not empty), all or
  // none, in one store batch (TensorManager::RemoveAll's errors); returns how many.
  absl::StatusOr<int64_t> DeleteMany(const std::vector<std::string>& names,
                                     const std::string& prefix);

  // A worker incarnation is gone (the composition root's reaction to a death): every whole
  // upload writing to it fails now with UNAVAILABLE "worker N (rank R) died: ..." (its write
  // streams are cancelled, so a band waiting on that worker ends at once), and every
  // download reading from it fails its next band so, instead of when an RPC to the worker
  // fails or times out. Call with no lock held.
  void OnWorkerLost(const WorkerRecord& worker, const std::string& reason);

 private:
  // A checked create: the record to reserve (version chosen) and every rank's fill.
  struct PreparedCreate {
    TensorRecord record;
    std::vector<WorkerEndpoint> endpoints;  // Shaped as record.layout.ranks().
    v1::FillRequest fill;                   // Without chunks; unused when attached.

    v1::FillRequest FillFor(const RankChunks& rc) const;
    LayoutChecksums NoChecksums() const;  // An attached tensor's: zeros, shaped as the layout.
  };
  absl::StatusOr<PreparedCreate> PrepareCreate(const CreateTensorArgs& args) const;
  // A worker's answer to a fill or write of `want`: its checksums, or UNAVAILABLE (the call
  // failed) / INTERNAL (other chunks) naming the worker.
  static absl::Status CheckRankAnswer(const WorkerEndpoint& ep, const RankChunks& want,
                                      const absl::StatusOr<v1::RankChunks>& r,
                                      ChunkChecksums* sums);
  // CheckReplicaChecksums naming workers.
  static absl::Status CheckReplicas(const Layout& layout, const LayoutChecksums& sums,
                                    const std::vector<WorkerEndpoint>& endpoints);

  // Runs `call` for every rank of `layout`, checks the chunk metadata each returns against
  // the layout, and completes with the checksums (shaped as the layout) once all answered,
  // or with the first failure. Replica checksums are compared.
  using RankCall = std::function<void(const WorkerEndpoint&, const RankChunks&,
                                      WorkerClient::Callback<v1::RankChunks>)>;
  void ForEachRank(const Layout& layout, const std::vector<WorkerEndpoint>& endpoints,
                   const RankCall& call, std::function<void(absl::StatusOr<LayoutChecksums>)> done);
  // Live endpoints for every rank of `layout`; FAILED_PRECONDITION naming a dead one.
  absl::StatusOr<std::vector<WorkerEndpoint>> Endpoints(const Layout& layout) const;
  // Endpoints of the ranks of `layout` whose worker is known, live or not (whom to tell to
  // drop a version).
  std::vector<WorkerEndpoint> Holders(const Layout& layout) const;
  // A whole upload failed: drops its new version everywhere, gives the tensor back (or the
  // reservation of a new one up) and reports `s` naming the tensor, when `done` is set.
  void FailUpload(const std::string& name, const std::string& op, int64_t version, bool replace,
                  const std::string& mesh_name, const std::vector<WorkerEndpoint>& endpoints,
                  const absl::Status& s, const TensorCallback& done);
  void Drop(const std::vector<WorkerEndpoint>& endpoints, const std::string& tensor,
            int64_t version);
  // The tensor a rank upload writes, checked as RankUploadBytes says.
  absl::StatusOr<TensorRecord> RankUploadTarget(const UploadArgs& args) const;
  void UploadRank(const UploadArgs& args, std::string data, TensorCallback done);
  std::string NewOp(const char* kind);
  void EndRankUpload(const std::string& name);
  void EndDownload(const std::string& name);
  // Follows an upload's or download's workers until it is destroyed (OnWorkerLost).
  std::shared_ptr<LossWatch> Watch(std::vector<WorkerEndpoint> endpoints,
                                   std::vector<std::shared_ptr<ChunkWriteStream>> streams);

  WorkerManager* const workers_;
  MeshManager* const meshes_;
  TensorManager* const tensors_;
  WorkerClient* const client_;
  AdmissionController* admission_ = nullptr;
  const int64_t band_bytes_;
  const int64_t max_tensor_bytes_;
  // RESOURCE_EXHAUSTED when a tensor of `bytes` is over max_tensor_bytes_.
  absl::Status CheckTensorBytes(absl::string_view field, const Shape& shape, DType dtype,
                                int64_t bytes) const;
  absl::Mutex mu_;
  int64_t next_op_ ABSL_GUARDED_BY(mu_) = 1;
  // Downloads open per tensor, and tensors with a rank upload running: the two exclude
  // each other, since a rank upload rewrites the version a download reads.
  absl::flat_hash_map<std::string, int64_t> downloads_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> rank_uploads_ ABSL_GUARDED_BY(mu_);
  // Open uploads and downloads (expired ones are pruned as new ones come).
  std::vector<std::weak_ptr<LossWatch>> watches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_IO_TENSOR_IO_H_
