#ifndef SHARDCOORD_COORDINATOR_CLUSTER_WORKER_CLIENT_H_
#define SHARDCOORD_COORDINATOR_CLUSTER_WORKER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fan_in.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// Which worker a call goes to.
struct WorkerEndpoint {
  std::string name;
  int64_t rank = 0;
  std::string address;
  int64_t incarnation = 0;
};

// "worker NAME (rank R)": the one description of a worker in errors and logs (WorkerRecord's
// Describe and Describe(WorkerEndpoint) say it so).
inline std::string DescribeWorker(absl::string_view name, int64_t rank) {
  return absl::StrCat("worker ", name, " (rank ", rank, ")");
}
inline std::string Describe(const WorkerEndpoint& w) { return DescribeWorker(w.name, w.rank); }

// Each endpoint's incarnation by rank: who holds a new buffer (TensorRecord::incarnations).
inline absl::flat_hash_map<int64_t, int64_t> Incarnations(const std::vector<WorkerEndpoint>& eps) {
  absl::flat_hash_map<int64_t, int64_t> out;
  for (const WorkerEndpoint& e : eps) out[e.rank] = e.incarnation;
  return out;
}

// One WriteChunk stream to a worker, opened with its header: Write appends bytes to the local
// buffer front to back, Finish ends the stream. Callbacks run on any thread, possibly inline,
// exactly once each, writes' callbacks in order; callers hold no lock when they call.
class ChunkWriteStream {
 public:
  virtual ~ChunkWriteStream() = default;
  // Appends `data`; `done` runs once the bytes were handed to the transport (so a caller
  // that waits for it holds what it wrote only as long as flow control needs), or with the
  // stream's error.
  virtual void Write(std::string data, std::function<void(absl::Status)> done) = 0;
  // After the last write: `done` gets the worker's answer (the chunks, with checksums).
  virtual void Finish(std::function<void(absl::StatusOr<v1::WriteChunkResponse>)> done) = 0;
  // Gives up before Finish (a no-op after it): the worker keeps nothing; pending callbacks
  // still run (with an error).
  virtual void Cancel() = 0;
};

// The coordinator's calls into workers (shardcoord.v1.Worker), asynchronous so no
// coordinator thread waits on a worker. Every call completes its callback exactly once, on
// any thread, possibly inline; callers hold no lock when they call. Implementations put a
// deadline on every call. The real one is GrpcWorkerClient; tests use a fake.
class WorkerClient {
 public:
  using StatusCallback = std::function<void(absl::Status)>;
  template <typename T>
  using Callback = std::function<void(absl::StatusOr<T>)>;

  virtual ~WorkerClient() = default;

  // Starts a fragment; its outcome comes through CoordinatorWorkers.ReportChunks. By value:
  // a fused group's fragment can be large, and callers move it in.
  virtual void Execute(const WorkerEndpoint& worker, v1::PlanFragment fragment,
                       StatusCallback done) = 0;
  // By value, as Execute: a fused group's FinishPlan lists every member's old version.
  virtual void FinishPlan(const WorkerEndpoint& worker, v1::FinishPlanRequest request,
                          StatusCallback done) = 0;
  virtual void Fill(const WorkerEndpoint& worker, const v1::FillRequest& request,
                    Callback<v1::FillResponse> done) = 0;
  // Many fills in one call (a bulk create; WorkerCore::FillMany). UNIMPLEMENTED by default,
  // for clients that never create in bulk.
  virtual void FillMany(const WorkerEndpoint& worker, const v1::FillManyRequest& request,
                        Callback<v1::FillManyResponse> done) {
    done(absl::UnimplementedError("FillMany"));
  }
  virtual void DropTensor(const WorkerEndpoint& worker, const v1::DropTensorRequest& request,
                          StatusCallback done) = 0;
  // The elements of request.box, row-major, all streamed messages joined.
  virtual void ReadChunk(const WorkerEndpoint& worker, const v1::ReadChunkRequest& request,
                         Callback<std::string> done) = 0;
  // Writes a whole local buffer: `header` (tensor, version, dtype, chunks, total_bytes)
  // goes in the first message, `data` follows in messages of at most 1 MiB.
  virtual void WriteChunk(const WorkerEndpoint& worker, const v1::ChunkData& header,
                          std::string data, Callback<v1::WriteChunkResponse> done) = 0;
  // Opens a WriteChunk stream whose data comes in pieces (streamed whole uploads). The
  // default collects the pieces and makes one WriteChunk call at Finish: fine for fakes, but
  // it holds the whole local buffer; GrpcWorkerClient streams for real.
  virtual std::shared_ptr<ChunkWriteStream> OpenWriteChunk(const WorkerEndpoint& worker,
                                                           const v1::ChunkData& header);

  // Small relayed plans (coordinator/plans/plan_relay.h): several boxes of one buffer in one unary
  // call, and a whole local buffer in one message. The defaults use ReadChunk per box and
  // WriteChunk, for fakes; GrpcWorkerClient makes the unary calls.
  virtual void ReadBoxes(const WorkerEndpoint& worker, const v1::ReadBoxesRequest& request,
                         Callback<v1::ReadBoxesResponse> done);
  virtual void WriteBuffer(const WorkerEndpoint& worker, v1::ChunkData message,
                           Callback<v1::WriteChunkResponse> done);

  // Checkpoints (issue 13; worker/buffers/checkpoint_io.h). Only workers touch storage. The
  // defaults answer UNIMPLEMENTED, for fakes that do not simulate files.
  virtual void WriteCheckpoint(const WorkerEndpoint& worker,
                               const v1::WriteCheckpointRequest& request,
                               Callback<v1::WriteCheckpointResponse> done);
  virtual void ReadCheckpoint(const WorkerEndpoint& worker,
                              const v1::ReadCheckpointRequest& request,
                              Callback<v1::ReadCheckpointResponse> done);
  virtual void ReadCheckpointIndex(const WorkerEndpoint& worker,
                                   const v1::ReadCheckpointIndexRequest& request,
                                   Callback<v1::ReadCheckpointIndexResponse> done);
  virtual void CheckpointDir(const WorkerEndpoint& worker, const v1::CheckpointDirRequest& request,
                             StatusCallback done);

  // Prepared transfers (issue 27; sharding/transfer_table.h). One page of the table (pages go
  // in order, each after the previous one's answer; the same page bytes go to every worker,
  // so callers serialize once and pass the request by shared pointer); the run of a resident
  // transfer, answered when the rank's part ended (its deadline is the caller's, `timeout`);
  // forgetting resident transfers. The defaults answer UNIMPLEMENTED, for fakes that never
  // prepare transfers.
  virtual void PrepareTransfer(const WorkerEndpoint& worker,
                               std::shared_ptr<const v1::PrepareTransferRequest> request,
                               Callback<v1::PrepareTransferResponse> done) {
    done(absl::UnimplementedError("PrepareTransfer"));
  }
  virtual void RunTransfer(const WorkerEndpoint& worker,
                           const v1::RunTransferWorkerRequest& request, absl::Duration timeout,
                           Callback<v1::RunTransferWorkerResponse> done) {
    done(absl::UnimplementedError("RunTransfer"));
  }
  virtual void DropTransfer(const WorkerEndpoint& worker, const v1::DropTransferRequest& request,
                            StatusCallback done) {
    done(absl::UnimplementedError("DropTransfer"));
  }

  // Block-scaled FP8 of a staged buffer (issue 28; coordinator/plans/block_copy.h). The default
  // answers UNIMPLEMENTED, for fakes that never run block copies.
  virtual void BlockQuantize(const WorkerEndpoint& worker, const v1::BlockQuantizeRequest& request,
                             Callback<v1::BlockQuantizeResponse> done) {
    done(absl::UnimplementedError("BlockQuantize"));
  }
  // A fused tensor's buffer composed from stored boxes (issue 28 item 4;
  // coordinator/plans/slice_copy.h). The default answers UNIMPLEMENTED, for fakes that never
  // run large slice copies.
  virtual void ComposeBoxes(const WorkerEndpoint& worker, const v1::ComposeBoxesRequest& request,
                            Callback<v1::ComposeBoxesResponse> done) {
    done(absl::UnimplementedError("ComposeBoxes"));
  }
};

namespace internal_worker_client {

class CollectingChunkWriteStream : public ChunkWriteStream {
 public:
  CollectingChunkWriteStream(WorkerClient* client, WorkerEndpoint worker, v1::ChunkData header)
      : client_(client), worker_(std::move(worker)), header_(std::move(header)) {}
  void Write(std::string data, std::function<void(absl::Status)> done) override {
    data_.append(data);
    done(cancelled_ ? absl::CancelledError("write stream cancelled") : absl::OkStatus());
  }
  void Finish(std::function<void(absl::StatusOr<v1::WriteChunkResponse>)> done) override {
    if (cancelled_) return done(absl::CancelledError("write stream cancelled"));
    client_->WriteChunk(worker_, header_, std::move(data_), std::move(done));
  }
  void Cancel() override { cancelled_ = true; }

 private:
  WorkerClient* const client_;
  const WorkerEndpoint worker_;
  const v1::ChunkData header_;
  std::string data_;
  bool cancelled_ = false;
};

}  // namespace internal_worker_client

inline std::shared_ptr<ChunkWriteStream> WorkerClient::OpenWriteChunk(const WorkerEndpoint& worker,
                                                                      const v1::ChunkData& header) {
  return std::make_shared<internal_worker_client::CollectingChunkWriteStream>(this, worker, header);
}

inline void WorkerClient::ReadBoxes(const WorkerEndpoint& worker,
                                    const v1::ReadBoxesRequest& request,
                                    Callback<v1::ReadBoxesResponse> done) {
  if (request.boxes_size() == 0) return done(v1::ReadBoxesResponse());
  // data(i) is box i's slot, written by its own read only.
  auto response = std::make_shared<v1::ReadBoxesResponse>();
  for (int i = 0; i < request.boxes_size(); ++i) response->add_data();
  std::shared_ptr<FanIn> fan =
      FanIn::Start(static_cast<size_t>(request.boxes_size()), [response, done](absl::Status s) {
        if (!s.ok()) return done(s);
        done(std::move(*response));
      });
  for (int i = 0; i < request.boxes_size(); ++i) {
    v1::ReadChunkRequest one;
    one.set_tensor(request.tensor());
    one.set_version(request.version());
    *one.mutable_box() = request.boxes(i);
    ReadChunk(worker, one, [response, fan, i](absl::StatusOr<std::string> r) {
      if (r.ok()) *response->mutable_data(i) = *std::move(r);
      fan->Report(r.status());
    });
  }
}

inline void WorkerClient::WriteBuffer(const WorkerEndpoint& worker, v1::ChunkData message,
                                      Callback<v1::WriteChunkResponse> done) {
  std::string data = std::move(*message.mutable_data());
  message.clear_data();
  WriteChunk(worker, message, std::move(data), std::move(done));
}

inline void WorkerClient::WriteCheckpoint(const WorkerEndpoint&, const v1::WriteCheckpointRequest&,
                                          Callback<v1::WriteCheckpointResponse> done) {
  done(absl::UnimplementedError("WriteCheckpoint"));
}
inline void WorkerClient::ReadCheckpoint(const WorkerEndpoint&, const v1::ReadCheckpointRequest&,
                                         Callback<v1::ReadCheckpointResponse> done) {
  done(absl::UnimplementedError("ReadCheckpoint"));
}
inline void WorkerClient::ReadCheckpointIndex(const WorkerEndpoint&,
                                              const v1::ReadCheckpointIndexRequest&,
                                              Callback<v1::ReadCheckpointIndexResponse> done) {
  done(absl::UnimplementedError("ReadCheckpointIndex"));
}
inline void WorkerClient::CheckpointDir(const WorkerEndpoint&, const v1::CheckpointDirRequest&,
                                        StatusCallback done) {
  done(absl::UnimplementedError("CheckpointDir"));
}

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_CLUSTER_WORKER_CLIENT_H_
