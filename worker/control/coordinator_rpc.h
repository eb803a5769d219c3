#ifndef SHARDCOORD_WORKER_CONTROL_COORDINATOR_RPC_H_
#define SHARDCOORD_WORKER_CONTROL_COORDINATOR_RPC_H_

// What the worker asks of the coordinator (shardcoord.v1.CoordinatorWorkers), behind small
// interfaces so the agent and WorkerCore are tested without sockets and link no gRPC; the
// gRPC implementation over one channel is worker/rpc/grpc_coordinator_client.h.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// Registration and health.
class CoordinatorAgentRpc {
 public:
  virtual ~CoordinatorAgentRpc() = default;
  virtual absl::StatusOr<v1::RegisterWorkerResponse> Register(
      const v1::RegisterWorkerRequest& request) = 0;
  virtual absl::Status Heartbeat(const v1::HeartbeatRequest& request) = 0;
};

// Fragment results and progress.
class ChunkReporter {
 public:
  virtual ~ChunkReporter() = default;
  virtual absl::Status ReportChunks(const v1::ReportChunksRequest& request) = 0;
};

// Buffers user processes lent this worker for ranks of attached tensors, and their end.
class AttachRpc {
 public:
  virtual ~AttachRpc() = default;
  virtual absl::StatusOr<v1::AttachBufferResponse> AttachBuffer(
      const v1::AttachBufferRequest& request) = 0;
  virtual absl::Status DetachBuffer(const v1::DetachBufferRequest& request) = 0;
  // Many buffers of one process at once, all or nothing (a LocalRequest.attach_many).
  virtual absl::StatusOr<v1::AttachBuffersResponse> AttachBuffers(
      const v1::AttachBuffersRequest& request) = 0;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_CONTROL_COORDINATOR_RPC_H_
