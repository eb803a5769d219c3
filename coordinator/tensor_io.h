#ifndef SHARDCOORD_COORDINATOR_TENSOR_IO_H_
#define SHARDCOORD_COORDINATOR_TENSOR_IO_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/mesh_manager.h"
#include "coordinator/tensor_manager.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_manager.h"
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
class TensorIo {
 public:
  using TensorCallback = std::function<void(absl::StatusOr<TensorRecord>)>;
  using DownloadCallback = std::function<void(absl::StatusOr<DownloadedTensor>)>;

  TensorIo(WorkerManager* workers, MeshManager* meshes, TensorManager* tensors,
           WorkerClient* client)
      : workers_(workers), meshes_(meshes), tensors_(tensors), client_(client) {}

  // INVALID_ARGUMENT bad name or spec; ALREADY_EXISTS; NOT_FOUND mesh; FAILED_PRECONDITION
  // a dead worker in the mesh; UNAVAILABLE a worker failed to fill (nothing is left).
  void Create(const CreateTensorArgs& args, TensorCallback done);

  // Whole upload: `data` is the tensor row-major; it is split into every rank's local
  // buffer and written as a new version, replacing the old one (or creating the tensor).
  // Rank upload: `data` is the rank's whole local buffer, which replaces it in place.
  // INVALID_ARGUMENT shape, dtype or byte count mismatch, a rank that holds nothing, a
  // missing spec for a new tensor; ALREADY_EXISTS an existing tensor of another shape or
  // dtype; NOT_FOUND mesh or (rank upload) tensor; ABORTED busy; UNAVAILABLE a worker.
  void Upload(const UploadArgs& args, std::string data, TensorCallback done);

  // Reads every chunk from one live replica and assembles the tensor (partial layouts are
  // reduced). NOT_FOUND; FAILED_PRECONDITION a chunk with no live replica; UNAVAILABLE a
  // worker failed.
  void Download(const std::string& name, DownloadCallback done);

  // NOT_FOUND; ABORTED busy. Workers drop the buffers in the background.
  absl::Status Delete(const std::string& name);

 private:
  // Runs `call` for every rank of `layout`, checks the chunk metadata each returns against
  // the layout, and completes with the checksums (shaped as the layout) once all answered,
  // or with the first failure. Replica checksums are compared.
  using RankCall = std::function<void(const WorkerEndpoint&, const RankChunks&,
                                      WorkerClient::Callback<v1::RankChunks>)>;
  void ForEachRank(const Layout& layout, const std::vector<WorkerEndpoint>& endpoints,
                   const RankCall& call,
                   std::function<void(absl::StatusOr<LayoutChecksums>)> done);
  // Live endpoints for every rank of `layout`; FAILED_PRECONDITION naming a dead one.
  absl::StatusOr<std::vector<WorkerEndpoint>> Endpoints(const Layout& layout) const;
  void Drop(const std::vector<WorkerEndpoint>& endpoints, const std::string& tensor,
            int64_t version);
  void UploadRank(const UploadArgs& args, std::string data, TensorCallback done);
  std::string NewOp(const char* kind);

  WorkerManager* const workers_;
  MeshManager* const meshes_;
  TensorManager* const tensors_;
  WorkerClient* const client_;
  absl::Mutex mu_;
  int64_t next_op_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TENSOR_IO_H_
