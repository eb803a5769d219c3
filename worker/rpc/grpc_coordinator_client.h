#ifndef SHARDCOORD_WORKER_RPC_GRPC_COORDINATOR_CLIENT_H_
#define SHARDCOORD_WORKER_RPC_GRPC_COORDINATOR_CLIENT_H_

// The worker's interfaces to the coordinator (worker/control/coordinator_rpc.h,
// worker/control/kv_client.h) over one gRPC channel to shardcoord.v1.CoordinatorWorkers.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/coordinator_addresses.h"
#include "common/tls_options.h"
#include "proto/shardcoord.grpc.pb.h"
#include "proto/shardcoord.pb.h"
#include "worker/control/coordinator_rpc.h"
#include "worker/control/kv_client.h"

namespace grpc {
class Channel;
class ClientContext;
class Status;
}  // namespace grpc

namespace shardcoord {

// Every call has a deadline (`rpc_timeout`; KvGet: its wait plus `rpc_timeout`) and, when
// `token` is not empty, the metadata `authorization: Bearer TOKEN` (a coordinator started
// with --auth-tokens requires a token of the worker role). Several coordinators on etcd
// (Connect("A,B")): a call answered UNAVAILABLE moves the next one to the leader the answer
// named (a standby's trailing metadata `shardcoord-leader`), or to the next address; the
// agent's retries and heartbeats then reach the leader.
class GrpcCoordinatorClient : public CoordinatorAgentRpc,
                              public ChunkReporter,
                              public AttachRpc,
                              public KvClient {
 public:
  GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                        absl::Duration rpc_timeout = absl::Seconds(10), std::string token = "");
  // Channels to "host:port[,host:port...]": TLS when `tls` is enabled (verifying the
  // coordinator against its CA and presenting the worker's certificate), plaintext otherwise.
  static std::unique_ptr<GrpcCoordinatorClient> Connect(
      const std::string& address, absl::Duration rpc_timeout = absl::Seconds(10),
      std::string token = "", const TlsOptions& tls = {});

  absl::StatusOr<v1::RegisterWorkerResponse> Register(
      const v1::RegisterWorkerRequest& request) override;
  absl::Status Heartbeat(const v1::HeartbeatRequest& request) override;
  absl::Status ReportChunks(const v1::ReportChunksRequest& request) override;
  absl::StatusOr<v1::AttachBufferResponse> AttachBuffer(
      const v1::AttachBufferRequest& request) override;
  absl::Status DetachBuffer(const v1::DetachBufferRequest& request) override;
  absl::StatusOr<v1::AttachBuffersResponse> AttachBuffers(
      const v1::AttachBuffersRequest& request) override;
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  // LeaveWorker; the deadline is the drain timeout plus `rpc_timeout`.
  absl::StatusOr<v1::LeaveWorkerResponse> Leave(const v1::LeaveWorkerRequest& request);

 private:
  using Stub = v1::CoordinatorWorkers::Stub;
  GrpcCoordinatorClient(const std::string& addresses, absl::Duration rpc_timeout, std::string token,
                        const TlsOptions& tls);

  // A context with the deadline `timeout` from now and the token's metadata.
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;
  // The stub of the coordinator to call now, and its index.
  std::shared_ptr<Stub> Current(size_t* index);
  // After a call to `index`: UNAVAILABLE moves on (to the named leader or the next address).
  void Note(size_t index, const grpc::ClientContext& ctx, const grpc::Status& status);
  // One unary call of `method` with the deadline `timeout` from now: Prepare, the current
  // coordinator's stub, then Note of the answer.
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response, absl::Duration timeout);

  const absl::Duration rpc_timeout_;
  const std::string token_;
  const TlsOptions tls_;
  CoordinatorAddresses addresses_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Stub>> stubs_ ABSL_GUARDED_BY(mu_);  // By address index.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_RPC_GRPC_COORDINATOR_CLIENT_H_
