#ifndef SHARDCOORD_COORDINATOR_WORKER_CLIENT_H_
#define SHARDCOORD_COORDINATOR_WORKER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// Which worker a call goes to.
struct WorkerEndpoint {
  std::string name;
  int64_t rank = 0;
  std::string address;
  int64_t incarnation = 0;
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

  // Starts a fragment; its outcome comes through CoordinatorWorkers.ReportChunks.
  virtual void Execute(const WorkerEndpoint& worker, const v1::PlanFragment& fragment,
                       StatusCallback done) = 0;
  virtual void FinishPlan(const WorkerEndpoint& worker, const v1::FinishPlanRequest& request,
                          StatusCallback done) = 0;
  virtual void Fill(const WorkerEndpoint& worker, const v1::FillRequest& request,
                    Callback<v1::FillResponse> done) = 0;
  virtual void DropTensor(const WorkerEndpoint& worker, const v1::DropTensorRequest& request,
                          StatusCallback done) = 0;
  // The elements of request.box, row-major, all streamed messages joined.
  virtual void ReadChunk(const WorkerEndpoint& worker, const v1::ReadChunkRequest& request,
                         Callback<std::string> done) = 0;
  // Writes a whole local buffer: `header` (tensor, version, dtype, chunks, total_bytes)
  // goes in the first message, `data` follows in messages of at most 1 MiB.
  virtual void WriteChunk(const WorkerEndpoint& worker, const v1::ChunkData& header,
                          std::string data, Callback<v1::WriteChunkResponse> done) = 0;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_WORKER_CLIENT_H_
