#ifndef SHARDCOORD_COORDINATOR_RPC_GRPC_WORKER_CLIENT_H_
#define SHARDCOORD_COORDINATOR_RPC_GRPC_WORKER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/tls_options.h"
#include "coordinator/cluster/worker_client.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/grpc_status.h"
#include "proto/shardcoord.grpc.pb.h"

namespace shardcoord {

struct GrpcWorkerClientOptions {
  // Control calls: Execute (which only starts a fragment), FinishPlan, DropTensor.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Calls that move data: Fill, ReadChunk, WriteChunk.
  absl::Duration data_timeout = absl::Minutes(10);
  // Largest data payload per streamed message.
  int64_t chunk_message_bytes = 1 << 20;
  // TLS to the workers (CA, and the coordinator's certificate as a client certificate);
  // plaintext when not enabled.
  TlsOptions tls;
  // Where the bytes of every message to and from workers are counted (labels method and
  // direction); not owned; null: not counted.
  CounterFamily* message_bytes = nullptr;
};

// WorkerClient over gRPC's callback API: no thread waits on a worker, every call has a
// deadline, one channel per worker address (reused). The destructor cancels calls in flight
// and waits for their callbacks.
class GrpcWorkerClient : public WorkerClient {
 public:
  explicit GrpcWorkerClient(GrpcWorkerClientOptions options = {});
  ~GrpcWorkerClient() override;

  // Cancels every call in flight and every later one (shutdown); callbacks still run.
  void CancelAll();

  void Execute(const WorkerEndpoint& worker, v1::PlanFragment fragment,
               StatusCallback done) override;
  void FinishPlan(const WorkerEndpoint& worker, v1::FinishPlanRequest request,
                  StatusCallback done) override;
  void Fill(const WorkerEndpoint& worker, const v1::FillRequest& request,
            Callback<v1::FillResponse> done) override;
  void FillMany(const WorkerEndpoint& worker, const v1::FillManyRequest& request,
                Callback<v1::FillManyResponse> done) override;
  void ReadBoxes(const WorkerEndpoint& worker, const v1::ReadBoxesRequest& request,
                 Callback<v1::ReadBoxesResponse> done) override;
  void WriteBuffer(const WorkerEndpoint& worker, v1::ChunkData message,
                   Callback<v1::WriteChunkResponse> done) override;
  void DropTensor(const WorkerEndpoint& worker, const v1::DropTensorRequest& request,
                  StatusCallback done) override;
  void ReadChunk(const WorkerEndpoint& worker, const v1::ReadChunkRequest& request,
                 Callback<std::string> done) override;
  void WriteChunk(const WorkerEndpoint& worker, const v1::ChunkData& header, std::string data,
                  Callback<v1::WriteChunkResponse> done) override;
  // A real stream: each Write goes out in messages of at most chunk_message_bytes, and its
  // callback runs once gRPC took the last of them (one message in flight per stream).
  std::shared_ptr<ChunkWriteStream> OpenWriteChunk(const WorkerEndpoint& worker,
                                                   const v1::ChunkData& header) override;
  // Checkpoint calls move data (or, for CheckpointDir, may remove a large old checkpoint):
  // data_timeout.
  void WriteCheckpoint(const WorkerEndpoint& worker, const v1::WriteCheckpointRequest& request,
                       Callback<v1::WriteCheckpointResponse> done) override;
  void ReadCheckpoint(const WorkerEndpoint& worker, const v1::ReadCheckpointRequest& request,
                      Callback<v1::ReadCheckpointResponse> done) override;
  void ReadCheckpointIndex(const WorkerEndpoint& worker,
                           const v1::ReadCheckpointIndexRequest& request,
                           Callback<v1::ReadCheckpointIndexResponse> done) override;
  void CheckpointDir(const WorkerEndpoint& worker, const v1::CheckpointDirRequest& request,
                     StatusCallback done) override;
  // Prepared transfers. A page is serialized once, however many workers it goes to (a
  // generic call sends the same bytes); data_timeout (the last page makes the worker plan).
  void PrepareTransfer(const WorkerEndpoint& worker,
                       std::shared_ptr<const v1::PrepareTransferRequest> request,
                       Callback<v1::PrepareTransferResponse> done) override;
  // Its deadline is `timeout`, the run's.
  void RunTransfer(const WorkerEndpoint& worker, const v1::RunTransferWorkerRequest& request,
                   absl::Duration timeout, Callback<v1::RunTransferWorkerResponse> done) override;
  void DropTransfer(const WorkerEndpoint& worker, const v1::DropTransferRequest& request,
                    StatusCallback done) override;
  void BlockQuantize(const WorkerEndpoint& worker, const v1::BlockQuantizeRequest& request,
                     Callback<v1::BlockQuantizeResponse> done) override;
  void ComposeBoxes(const WorkerEndpoint& worker, const v1::ComposeBoxesRequest& request,
                    Callback<v1::ComposeBoxesResponse> done) override;

 private:
  class ReadCall;
  class StreamCall;
  class StreamHandle;

  using PageStub = grpc::TemplatedGenericStub<grpc::ByteBuffer, v1::PrepareTransferResponse>;
  struct Channel {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Worker::Stub> stub;
    std::unique_ptr<PageStub> pages;  // PrepareTransfer with pre-serialized pages.
  };
  // One channel per (address, name): with TLS the name is the certificate it must present.
  Channel& ChannelFor(const WorkerEndpoint& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Worker::Stub* StubFor(const WorkerEndpoint& worker);
  PageStub* PageStubFor(const WorkerEndpoint& worker);
  // `page` serialized: the one in the cache when it is the page sent last (pages go to every
  // worker, one after another), else serialized now.
  std::shared_ptr<const grpc::ByteBuffer> Serialized(
      const std::shared_ptr<const v1::PrepareTransferRequest>& page);
  // In-flight bookkeeping: Begin before starting a call, End after its callback ran.
  void Begin(grpc::ClientContext* ctx);
  void End(grpc::ClientContext* ctx);

  // A unary call's method on the stub's callback API, e.g. &v1::Worker::Stub::async::Fill.
  template <typename Req, typename Resp>
  using AsyncMethod = void (v1::Worker::Stub::async::*)(grpc::ClientContext*, const Req*, Resp*,
                                                        std::function<void(grpc::Status)>);
  template <typename Req, typename Resp>
  void Unary(const WorkerEndpoint& worker, absl::Duration timeout, Req request,
             AsyncMethod<Req, Resp> method, Callback<Resp> done);
  // A call's end: `done` hears `response` or the failure `s`, then the call (with context
  // `ctx`) stops being in flight and is deleted.
  template <typename Call, typename Resp>
  void Complete(Call* call, grpc::ClientContext* ctx, const grpc::Status& s, Resp& response,
                const Callback<Resp>& done);
  // `done` as a callback for a call whose response only matters as a status.
  template <typename Resp>
  static Callback<Resp> StatusOnly(StatusCallback done);

  const GrpcWorkerClientOptions options_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, Channel> channels_ ABSL_GUARDED_BY(mu_);
  std::weak_ptr<const v1::PrepareTransferRequest> last_page_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const grpc::ByteBuffer> last_page_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<grpc::ClientContext*, bool> in_flight_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_GRPC_WORKER_CLIENT_H_
