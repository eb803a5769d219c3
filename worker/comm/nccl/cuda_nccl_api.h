#ifndef SHARDCOORD_WORKER_COMM_NCCL_CUDA_NCCL_API_H_
#define SHARDCOORD_WORKER_COMM_NCCL_CUDA_NCCL_API_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/comm/nccl/nccl_api.h"

namespace shardcoord {
namespace nccl {

// NcclApi on the real libraries: each method is the one NCCL or CUDA runtime call it names.
// Communicators are created with config.blocking = 0. Built only where CUDA is available.
class CudaNcclApi : public NcclApi {
 public:
  NcclResult GetUniqueId(std::string* id) override;
  NcclResult CommInitRank(NcclComm* comm, int nranks, const std::string& id, int rank) override;
  NcclResult CommGetAsyncError(NcclComm comm, NcclResult* async_error) override;
  NcclResult CommFinalize(NcclComm comm) override;
  NcclResult CommDestroy(NcclComm comm) override;
  NcclResult CommAbort(NcclComm comm) override;
  NcclResult GroupStart() override;
  NcclResult GroupEnd() override;
  NcclResult Issue(const NcclCall& call, NcclComm comm, GpuStream stream) override;
  std::string ErrorString(NcclResult result) override;
  std::string LastError(NcclComm comm) override;
  absl::Status SetDevice(int device) override;
  absl::Status StreamCreate(GpuStream* stream) override;
  absl::Status StreamDestroy(GpuStream stream) override;
  absl::Status EventCreate(GpuEvent* event) override;
  absl::Status EventDestroy(GpuEvent event) override;
  absl::Status EventRecord(GpuEvent event, GpuStream stream) override;
  absl::StatusOr<bool> EventQuery(GpuEvent event) override;
};

// "ncclGetVersion: 2.28.9" style; for logs and benchmarks.
std::string NcclVersionString();

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_CUDA_NCCL_API_H_
