#ifndef SHARDCOORD_WORKER_COMM_NCCL_CUDA_MEMORY_SPACE_H_
#define SHARDCOORD_WORKER_COMM_NCCL_CUDA_MEMORY_SPACE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {
namespace nccl {

// A worker's chunk buffers in the memory of its one GPU (worker/memory/memory_space.h):
// cudaMalloc'd blocks (plain device pointers, as NCCL and the kernels need), and the operations as
// work on one CUDA stream per worker: box copies and reductions are the kernels of device_ops.h,
// the checksum is computed on the device, fills are cudaMemsetAsync (a reduce identity other than
// zero: one element copied in, then doubled by device-to-device copies), casts are the cast
// kernel (bitwise equal to sharding/cast.h). DivideBox (only
// P(avg) targets) has no kernel yet: it synchronizes, divides on the host and copies back.
//
// Every call first makes `device` the calling thread's current device, so any thread may use
// it. Host<->device copies are synchronous; Free synchronizes the stream before cudaFree.
// Errors are CudaStatus's (RESOURCE_EXHAUSTED when the device is out of memory, naming the
// bytes and the device). Thread-safe (CUDA streams are).
class CudaMemorySpace final : public MemorySpace {
 public:
  // Creates the stream on `device`. FAILED_PRECONDITION without a usable device.
  static absl::StatusOr<std::unique_ptr<CudaMemorySpace>> Create(int device);
  ~CudaMemorySpace() override;

  CudaMemorySpace(const CudaMemorySpace&) = delete;
  CudaMemorySpace& operator=(const CudaMemorySpace&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  std::string name() const override;  // "cuda:<device>"
  bool is_host() const override { return false; }
  absl::StatusOr<Allocation> Allocate(int64_t bytes) override;
  void Free(const Allocation& allocation) override;
  absl::Status CopyFromHost(void* dst, const void* src, int64_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override;
  absl::Status FillZeros(void* data, int64_t bytes) override;
  absl::Status FillIdentity(void* data, int64_t count, DType dtype, ReduceOp op) override;
  absl::Status CopyBox(const Box& region, const void* src, const Box& src_box, void* dst,
                       const Box& dst_box, int64_t element_size) override;
  absl::Status ReduceIntoBox(const Box& region, const void* src, const Box& src_box, void* dst,
                             const Box& dst_box, DType dtype, ReduceOp op) override;
  absl::Status DivideBox(void* data, int64_t count, DType dtype, int64_t divisor) override;
  // The cast kernel (device_ops.h's DeviceCastBox) on the stream: no staging through the host.
  absl::Status CastBox(const Box& region, const void* src, const Box& src_box, DType src_dtype,
                       void* dst, const Box& dst_box, DType dst_dtype) override;
  absl::StatusOr<uint64_t> ChunkChecksum(const void* data, int64_t bytes) override;
  absl::StatusOr<std::vector<uint64_t>> ChunkChecksums(
      absl::Span<const ChecksumRegion> regions) override;
  absl::Status Synchronize() override;
  // A cudaIpcMemHandle_t (64 bytes) opened with cudaIpcOpenMemHandle on this device (CUDA
  // counts repeated openings of one allocation in a process); the range is checked against
  // the allocation's size where the driver tells it (cuMemGetAddressRange).
  absl::StatusOr<Allocation> OpenShared(absl::string_view handle, int64_t offset,
                                        int64_t bytes) override;
  void CloseShared(const Allocation& allocation) override;
  std::string device_uuid() const override;
  // cudaMemGetInfo's free bytes on the device.
  absl::StatusOr<int64_t> DeviceFreeBytes() override;

 private:
  CudaMemorySpace(int device, cudaStream_t stream);
  // Makes device_ current on the calling thread.
  absl::Status Enter() const;
  // CopyFromHost (cudaMemcpyHostToDevice) and CopyToHost (cudaMemcpyDeviceToHost): the copy
  // on the stream, waited for.
  absl::Status CopyAndWait(void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind);

  const int device_;
  const cudaStream_t stream_;
  absl::Mutex mu_;
  // Pointers OpenShared handed out -> the base cudaIpcOpenMemHandle returned.
  std::multimap<char*, void*> opened_ ABSL_GUARDED_BY(mu_);
};

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_CUDA_MEMORY_SPACE_H_
