#ifndef SHARDCOORD_CLIENT_COORDINATOR_CLIENT_H_
#define SHARDCOORD_CLIENT_COORDINATOR_CLIENT_H_

// The C++ client of shardcoord.v1.Coordinator: one method per RPC, each with a deadline,
// returning absl::Status with the server's code and message. Thread-compatible: a client may
// be used from several threads at once (gRPC stubs are thread-safe), but its options are fixed
// at construction.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/coordinator_addresses.h"
#include "common/tls_options.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_status.h"
#include "proto/shardcoord.grpc.pb.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// $SHARDCOORD_ADDR when set and non-empty, else "127.0.0.1:7400". Either may list several
// coordinators: "host:port,host:port".
std::string DefaultCoordinatorAddress();

// Protocol limit on the data carried by one TensorData message.
inline constexpr size_t kMaxDataMessageBytes = size_t{1} << 20;

struct CoordinatorClientOptions {
  // Deadline of metadata RPCs (lists, gets, creates, deletes, plans, a Redistribute or
  // Gather that only starts the plan).
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Deadline of RPCs that move data or wait for a plan: Upload, Download, WatchPlan, and
  // Redistribute / Gather / Copy with wait set.
  absl::Duration data_timeout = absl::Minutes(30);
  // Data bytes per Upload message; clamped to [1, kMaxDataMessageBytes].
  size_t upload_chunk_bytes = kMaxDataMessageBytes;
  // Bearer token sent as metadata `authorization: Bearer TOKEN` on every call (a coordinator
  // started with --auth-tokens requires one); empty: none is sent.
  std::string token;
  // Unary calls answered UNAVAILABLE (a coordinator restarting, or recovering a tensor) are
  // tried again with backoff until `retry_for` has passed since the first attempt (zero: no
  // retry). Mutating calls carry a request_id, chosen here when the request has none, so a
  // retry of one that took effect answers its first outcome instead of acting twice.
  absl::Duration retry_for = absl::Seconds(30);
  absl::Duration retry_backoff = absl::Milliseconds(100);  // The first pause; doubles to 2 s.
  // TLS: verify the coordinator against tls.ca_pem and present tls.cert_pem when there is
  // one (LoadClientTls reads --tls-ca, --tls-cert, --tls-key); plaintext when not enabled.
  TlsOptions tls;
};

// A fresh random request_id (32 hex digits).
std::string NewRequestId();

// $SHARDCOORD_TOKEN, or "" when it is unset.
std::string DefaultToken();

// Called after each data message with the bytes done so far and the total.
using ProgressCallback = std::function<void(int64_t done, int64_t total)>;

class CoordinatorClient {
 public:
  // Connects (lazily, on the first RPC) to `address` ("host:port"), with TLS when
  // options.tls is enabled. Several coordinators on etcd, one leading: `address` lists them
  // all ("host:port,host:port"); a call answered UNAVAILABLE goes next to the leader the
  // answer named (a standby's trailing metadata `shardcoord-leader`) or else to the next
  // address, within the retry loop (retry_for). Streams (Upload, Download, WatchPlan) follow
  // the leader and retry likewise, resuming or restarting cleanly (see each).
  explicit CoordinatorClient(const std::string& address, CoordinatorClientOptions options = {});
  // Uses an existing channel (tests use a server's in-process channel).
  CoordinatorClient(std::shared_ptr<grpc::ChannelInterface> channel, std::string address,
                    CoordinatorClientOptions options = {});

  // The address (list) given.
  const std::string& address() const { return address_; }
  // The coordinator the next call goes to.
  std::string current_address() const;
  const CoordinatorClientOptions& options() const { return options_; }

  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers();

  absl::StatusOr<v1::MeshInfo> CreateMesh(const v1::CreateMeshRequest& request);
  absl::StatusOr<v1::MeshInfo> GetMesh(const std::string& name);
  absl::StatusOr<std::vector<v1::MeshInfo>> ListMeshes();
  absl::Status DeleteMesh(const std::string& name);

  absl::StatusOr<v1::TensorInfo> CreateTensor(const v1::CreateTensorRequest& request);
  absl::StatusOr<v1::TensorInfo> GetTensor(const std::string& name);
  // Every tensor whose name starts with `prefix`, in name order: pages through ListTensors.
  absl::StatusOr<std::vector<v1::TensorInfo>> ListTensors(const std::string& prefix = "");
  absl::Status DeleteTensor(const std::string& name);
  // All or nothing, in one call each.
  absl::StatusOr<v1::CreateTensorsResponse> CreateTensors(const v1::CreateTensorsRequest& request);
  absl::StatusOr<int64_t> DeleteTensors(const std::vector<std::string>& names,
                                        const std::string& prefix);

  // With request.wait(), returns when the plan has ended (data deadline); otherwise when it
  // has started, with progress.plan_id to watch.
  absl::StatusOr<v1::RedistributeResponse> Redistribute(const v1::RedistributeRequest& request);
  absl::StatusOr<v1::RedistributeResponse> Gather(const v1::GatherRequest& request);
  // Writes request.src()'s values into request.dst() (a new version of dst); waits as
  // Redistribute.
  absl::StatusOr<v1::CopyResponse> Copy(const v1::CopyRequest& request);
  // Many copies as one transaction (see CopyGroup in proto/shardcoord.proto).
  absl::StatusOr<v1::CopyGroupResponse> CopyGroup(const v1::CopyGroupRequest& request);
  // Many redistributes as one transaction (see RedistributeGroup in proto/shardcoord.proto).
  absl::StatusOr<v1::RedistributeGroupResponse> RedistributeGroup(
      const v1::RedistributeGroupRequest& request);
  // Gathers of several tensors as one transaction (see GatherGroup in the proto).
  absl::StatusOr<v1::RedistributeGroupResponse> GatherGroup(const v1::GatherGroupRequest& request);
  // Dry run: the plan Redistribute would execute.
  absl::StatusOr<v1::Plan> PlanRedistribute(const v1::PlanRequest& request);
  absl::StatusOr<v1::PlanTrace> GetPlanTrace(const std::string& plan_id);
  // Recent plans, newest first (limit 0: the coordinator's default, 100).
  absl::StatusOr<v1::ListPlansResponse> ListPlans(int64_t limit = 0);

  // Prepared transfers (see CreateTransfer in proto/shardcoord.proto). Create and a waiting
  // run use the data deadline (a create plans on every worker; a run may prepare again).
  absl::StatusOr<v1::TransferInfo> CreateTransfer(const v1::CreateTransferRequest& request);
  absl::StatusOr<v1::RunTransferResponse> RunTransfer(const v1::RunTransferRequest& request);
  absl::StatusOr<v1::TransferInfo> GetTransfer(const std::string& name, bool copies = false);
  // Every transfer, in name order: pages through ListTransfers.
  absl::StatusOr<std::vector<v1::TransferInfo>> ListTransfers();
  absl::Status DeleteTransfer(const std::string& name);

  // Checkpoints (see SaveCheckpoint in proto/shardcoord.proto). Save and load return when
  // they ended (data deadline); set request.request_id first to follow one with
  // GetCheckpointProgress from another thread.
  absl::StatusOr<v1::SaveCheckpointResponse> SaveCheckpoint(
      const v1::SaveCheckpointRequest& request);
  absl::StatusOr<v1::LoadCheckpointResponse> LoadCheckpoint(
      const v1::LoadCheckpointRequest& request);
  absl::StatusOr<v1::InspectCheckpointResponse> InspectCheckpoint(const std::string& dir);
  absl::StatusOr<v1::CheckpointProgress> GetCheckpointProgress(const std::string& request_id);

  // Calls `on_progress` for every progress message until the plan ends, and returns the last
  // one. A plan that ended ABORTED is still OK here: the caller reads state and error. A watch
  // broken by UNAVAILABLE (the coordinator gone) is opened again, at the leader, within
  // retry_for of the last news; `on_progress` then sees the plan's progress from there (a
  // message may repeat). Other errors end it (NOT_FOUND: the new leader does not know the
  // plan).
  absl::StatusOr<v1::PlanProgress> WatchPlan(
      const std::string& plan_id, const std::function<void(const v1::PlanProgress&)>& on_progress);

  // Streams `data` after `header` (header.total_bytes is set to data.size() when 0) in
  // messages of at most upload_chunk_bytes. `progress` (may be empty) runs after each one.
  //
  // All or nothing: the coordinator commits an upload as one new version only once all of
  // its data arrived. An upload that fails UNAVAILABLE (the coordinator gone, a worker
  // failed) or CANCELLED by the server (a standby handing its port to the new leader), as a
  // unary change would, is sent again from its first byte, at the leader, within retry_for of the
  // furthest it got (`progress` starts again at 0). Every attempt carries one
  // header.request_id (chosen here when empty), so a retry of an upload that committed but
  // whose answer was lost answers that first outcome (UploadResponse.replayed) instead of
  // making a second version; only a coordinator that dies between committing the upload and
  // recording its outcome (one store write apart) leaves a retry to upload it again.
  absl::StatusOr<v1::TensorInfo> Upload(const v1::TensorHeader& header, absl::string_view data,
                                        const ProgressCallback& progress = nullptr);

  // As Upload, with the data coming in pieces, so the caller need not hold the tensor:
  // `read(max, &piece)` replaces `piece` with the next at most `max` bytes (empty at the
  // end); its error ends the call (the server drops what it received) and is returned.
  // header.total_bytes must be set.
  using ReadFn = std::function<absl::Status(size_t max_bytes, std::string* piece)>;
  // Each attempt calls `open` for a ReadFn that reads the data from its first byte (a file
  // rewound or opened again), so an upload is restarted as Upload's; an error from `open`
  // ends the call and is returned.
  using OpenFn = std::function<absl::StatusOr<ReadFn>()>;
  absl::StatusOr<v1::TensorInfo> UploadFrom(const v1::TensorHeader& header, const OpenFn& open,
                                            const ProgressCallback& progress = nullptr);
  // A source read once: retried only while none of it was read (a refusing standby, a
  // coordinator not answering); after that its UNAVAILABLE is returned.
  absl::StatusOr<v1::TensorInfo> UploadFrom(const v1::TensorHeader& header, const ReadFn& read,
                                            const ProgressCallback& progress = nullptr);

  // Replaces `*data` with the tensor's bytes (row-major) and returns its header. DATA_LOSS if
  // the stream does not carry exactly header.total_bytes.
  //
  // A download broken by UNAVAILABLE (the coordinator gone, a worker failed) is opened again,
  // at the leader, within retry_for of the last byte received, and resumed: the bytes already
  // delivered are skipped, so the caller never gets one twice, and only a stream of the same
  // tensor version (header.version) is resumed; another version ends the call ABORTED, as a
  // download that meets a newer version does.
  absl::StatusOr<v1::TensorHeader> Download(const std::string& name, std::string* data,
                                            const ProgressCallback& progress = nullptr);

  // As Download, handing the header to `on_header` (once, also when resumed) and then each
  // message's data to `on_data` as it arrives (the client holds one message at a time). An
  // error from either cancels the call and is returned.
  using HeaderFn = std::function<absl::Status(const v1::TensorHeader& header)>;
  using DataFn = std::function<absl::Status(absl::string_view data)>;
  absl::StatusOr<v1::TensorHeader> DownloadTo(const std::string& name, const HeaderFn& on_header,
                                              const DataFn& on_data,
                                              const ProgressCallback& progress = nullptr);

 private:
  using Stub = v1::Coordinator::Stub;

  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                              Response*),
                                 const Request& request, absl::Duration timeout);
  // Unary with a request_id: the request's own, or a new one shared by every retry.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Mutate(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                               Response*),
                                  Request request, absl::Duration timeout);

  // Upload's attempts; `restartable`: `open` gives a reader from the first byte each time
  // (false: the same reader, called again only while it has read nothing).
  absl::StatusOr<v1::TensorInfo> UploadAttempts(const v1::TensorHeader& header, const OpenFn& open,
                                                bool restartable, const ProgressCallback& progress);

  // Sets the deadline `timeout` from now, and the token's metadata if there is one.
  void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) const;
  // The stub of the coordinator to call now, and its index in addresses_.
  std::shared_ptr<Stub> Current(size_t* index);
  // A call to addresses_[index] ended with `status`: after UNAVAILABLE the next call goes to
  // the leader it named, or the next address. True when that is another coordinator because
  // a leader was named (worth trying at once).
  bool Note(size_t index, const grpc::ClientContext& context, const grpc::Status& status);

  std::string address_;
  CoordinatorClientOptions options_;
  std::unique_ptr<CoordinatorAddresses> addresses_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Stub>> stubs_ ABSL_GUARDED_BY(mu_);  // By address index.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_COORDINATOR_CLIENT_H_
