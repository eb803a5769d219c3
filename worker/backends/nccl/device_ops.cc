#include "worker/backends/nccl/device_ops.h"

#include "absl/strings/str_cat.h"
#include "worker/backends/nccl/box_geometry_builder.h"
#include "worker/backends/nccl/cuda_status.h"
#include "worker/backends/nccl/device_buffer.h"
#include "worker/backends/nccl/kernels.h"
#include "worker/backends/nccl/reduce_ops.h"
#include "worker/backends/nccl/xxh64.h"

namespace shardcoord {
namespace nccl {

static_assert(kDevF32 == static_cast<int>(DType::kF32) &&
              kDevBF16 == static_cast<int>(DType::kBF16) &&
              kDevI64 == static_cast<int>(DType::kI64));
static_assert(kDevSum == static_cast<int>(ReduceOp::kSum) &&
              kDevMin == static_cast<int>(ReduceOp::kMin) &&
              kDevMax == static_cast<int>(ReduceOp::kMax));

absl::Status DeviceCopyBox(const Box& region, const void* src, const Box& src_box, void* dst,
                           const Box& dst_box, int64_t element_size, cudaStream_t stream) {
  absl::StatusOr<BoxCopyGeometry> g = MakeBoxCopyGeometry(region, src_box, dst_box, element_size);
  if (!g.ok()) return g.status();
  if (g->runs == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("null buffer for a copy of region ", region.ToString()));
  }
  return CudaStatus(LaunchCopyBox(*g, src, dst, stream),
                    absl::StrCat("copy of region ", region.ToString(), " on the device").c_str());
}

absl::Status DevicePackBox(const Box& region, const void* chunk, const Box& chunk_box, void* packed,
                           int64_t element_size, cudaStream_t stream) {
  return DeviceCopyBox(region, chunk, chunk_box, packed, region, element_size, stream);
}

absl::Status DeviceUnpackBox(const Box& region, const void* packed, void* chunk,
                             const Box& chunk_box, int64_t element_size, cudaStream_t stream) {
  return DeviceCopyBox(region, packed, region, chunk, chunk_box, element_size, stream);
}

absl::Status DeviceReduceIntoBox(const Box& region, const void* src, const Box& src_box, void* dst,
                                 const Box& dst_box, DType dtype, ReduceOp op,
                                 cudaStream_t stream) {
  const int64_t element_size = ElementSize(dtype);
  if (element_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype ", static_cast<int>(dtype), " for a reduction"));
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce op ", ReduceOpName(op), " is not element-wise; reduce with sum and then divide"));
  }
  absl::StatusOr<BoxCopyGeometry> g = MakeBoxCopyGeometry(region, src_box, dst_box, element_size);
  if (!g.ok()) return g.status();
  if (g->runs == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("null buffer for a reduction of region ", region.ToString()));
  }
  return CudaStatus(
      LaunchReduceBox(*g, static_cast<int>(dtype), static_cast<int>(op), src, dst, stream),
      absl::StrCat("reduction of region ", region.ToString(), " on the device").c_str());
}

absl::StatusOr<uint64_t> DeviceChunkChecksum(const void* data, int64_t bytes, cudaStream_t stream) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("checksum of ", bytes, " bytes"));
  if (bytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("null buffer for a checksum of ", bytes, " bytes"));
  }
  // Block hashes followed by the result word, from the device's memory pool: a cudaMalloc and
  // cudaFree per checksum cost ~130 us (cudaFree synchronises the device). The pool keeps a
  // little memory across synchronisations (its default threshold, 0, returns it to the driver
  // at each one, and the next checksum maps it again).
  int device = 0;
  cudaMemPool_t pool = nullptr;
  if (absl::Status s = CudaStatus(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  if (absl::Status s = CudaStatus(cudaDeviceGetDefaultMemPool(&pool, device), "the memory pool");
      !s.ok()) {
    return s;
  }
  uint64_t keep = uint64_t{1} << 20;
  if (absl::Status s =
          CudaStatus(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
                     "the pool's threshold");
      !s.ok()) {
    return s;
  }
  const int64_t blocks = ChecksumBlockCount(bytes);
  void* scratch = nullptr;
  if (absl::Status s =
          CudaStatus(cudaMallocAsync(&scratch, static_cast<size_t>((blocks + 1) * 8), stream),
                     "cudaMallocAsync of the checksum's scratch");
      !s.ok()) {
    return s;
  }
  uint64_t* words = static_cast<uint64_t*>(scratch);
  absl::Status launched = CudaStatus(
      LaunchChunkChecksum(data, bytes, words, words + blocks, stream), "checksum kernel");
  uint64_t result = 0;
  if (launched.ok()) {
    launched =
        CudaStatus(cudaMemcpyAsync(&result, words + blocks, 8, cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync of the checksum");
  }
  // Freed in stream order whatever happened, then waited for with the result.
  const absl::Status freed = CudaStatus(cudaFreeAsync(scratch, stream), "cudaFreeAsync");
  const absl::Status synced = CudaStatus(cudaStreamSynchronize(stream), "checksum on the device");
  if (!launched.ok()) return launched;
  if (!freed.ok()) return freed;
  if (!synced.ok()) return synced;
  return result;
}

}  // namespace nccl
}  // namespace shardcoord
