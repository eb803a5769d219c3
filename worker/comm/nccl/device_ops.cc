#include "worker/comm/nccl/device_ops.h"

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sharding/cast.h"
#include "worker/comm/nccl/box_geometry_builder.h"
#include "worker/comm/nccl/cuda_status.h"
#include "worker/comm/nccl/device_buffer.h"
#include "worker/comm/nccl/kernels.h"
#include "worker/comm/nccl/reduce_ops.h"
#include "worker/comm/nccl/xxh64.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {
namespace nccl {

static_assert(kDevF32 == static_cast<int>(DType::kF32) &&
              kDevBF16 == static_cast<int>(DType::kBF16) &&
              kDevI64 == static_cast<int>(DType::kI64) &&
              kDevU32 == static_cast<int>(DType::kU32) && kDevU64 == static_cast<int>(DType::kU64));
static_assert(kDevSum == static_cast<int>(ReduceOp::kSum) &&
              kDevMin == static_cast<int>(ReduceOp::kMin) &&
              kDevMax == static_cast<int>(ReduceOp::kMax));

namespace {

// Launches the box operation `what` ("copy", "reduction") of `region` from `src` (a buffer for
// `src_box`) to `dst` (for `dst_box`) with `launch`, unless it moves nothing; INVALID_ARGUMENT
// for boxes that do not fit or a null buffer.
absl::Status LaunchBoxOp(const Box& region, const void* src, const Box& src_box, void* dst,
                         const Box& dst_box, int64_t element_size, absl::string_view what,
                         absl::FunctionRef<cudaError_t(const BoxCopyGeometry&)> launch) {
  absl::StatusOr<BoxCopyGeometry> g = MakeBoxCopyGeometry(region, src_box, dst_box, element_size);
  if (!g.ok()) return g.status();
  if (g->runs == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("null buffer for a ", what, " of region ", region.ToString()));
  }
  return CudaStatus(launch(*g),
                    absl::StrCat(what, " of region ", region.ToString(), " on the device"));
}

}  // namespace

absl::Status DeviceCopyBox(const Box& region, const void* src, const Box& src_box, void* dst,
                           const Box& dst_box, int64_t element_size, cudaStream_t stream) {
  return LaunchBoxOp(region, src, src_box, dst, dst_box, element_size, "copy",
                     [&](const BoxCopyGeometry& g) { return LaunchCopyBox(g, src, dst, stream); });
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
  if (absl::Status s = CheckElementwiseReduce(dtype, op); !s.ok()) return s;
  return LaunchBoxOp(region, src, src_box, dst, dst_box, ElementSize(dtype), "reduction",
                     [&](const BoxCopyGeometry& g) {
                       return LaunchReduceBox(g, static_cast<int>(dtype), static_cast<int>(op), src,
                                              dst, stream);
                     });
}

absl::Status DeviceCastBox(const Box& region, const void* src, const Box& src_box, DType src_dtype,
                           void* dst, const Box& dst_box, DType dst_dtype, cudaStream_t stream) {
  if (src_dtype == dst_dtype) {
    return DeviceCopyBox(region, src, src_box, dst, dst_box, ElementSize(src_dtype), stream);
  }
  if (absl::Status s = CheckCast(src_dtype, dst_dtype); !s.ok()) return s;
  // The geometry in elements; the kernel scales each side by its own element size.
  return LaunchBoxOp(region, src, src_box, dst, dst_box, 1, "cast", [&](const BoxCopyGeometry& g) {
    return LaunchCastBox(g, static_cast<int>(src_dtype), static_cast<int>(dst_dtype), src, dst,
                         stream);
  });
}

namespace {

// A kernel would fault on a null buffer; an empty tensor needs none.
absl::Status CheckQuantBuffers(const BlockQuantGeometry& g, const void* src, const void* dst,
                               const void* scales) {
  if (g.outer * g.m * g.n == 0 || (src != nullptr && dst != nullptr && scales != nullptr)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("null buffer for a block quantization on the device");
}

}  // namespace

absl::Status DeviceQuantizeBlocks(const void* src, DType src_dtype, const Shape& shape,
                                  const BlockSize& block, void* dst, float* scales,
                                  cudaStream_t stream) {
  absl::StatusOr<BlockQuantGeometry> g = MakeBlockQuantGeometry(src_dtype, shape, block, "src");
  if (!g.ok()) return g.status();
  if (absl::Status s = CheckQuantBuffers(*g, src, dst, scales); !s.ok()) return s;
  return CudaStatus(LaunchQuantizeBlocks(*g, static_cast<int>(src_dtype), src, dst, scales, stream),
                    "block quantization on the device");
}

absl::Status DeviceDequantizeBlocks(const void* src, const float* scales, const Shape& shape,
                                    const BlockSize& block, void* dst, DType dst_dtype,
                                    cudaStream_t stream) {
  absl::StatusOr<BlockQuantGeometry> g = MakeBlockQuantGeometry(dst_dtype, shape, block, "dst");
  if (!g.ok()) return g.status();
  if (absl::Status s = CheckQuantBuffers(*g, src, dst, scales); !s.ok()) return s;
  return CudaStatus(
      LaunchDequantizeBlocks(*g, src, scales, static_cast<int>(dst_dtype), dst, stream),
      "block dequantization on the device");
}

absl::StatusOr<uint64_t> DeviceChunkChecksum(const void* data, int64_t bytes, cudaStream_t stream) {
  const ChecksumRegion region{data, bytes};
  absl::StatusOr<std::vector<uint64_t>> sums = DeviceChunkChecksums({&region, 1}, stream);
  if (!sums.ok()) return sums.status();
  return sums->front();
}

absl::StatusOr<std::vector<uint64_t>> DeviceChunkChecksums(absl::Span<const ChecksumRegion> regions,
                                                           cudaStream_t stream) {
  std::vector<HashRegion> table;
  table.reserve(regions.size());
  int64_t blocks = 0;
  for (size_t i = 0; i < regions.size(); ++i) {
    const ChecksumRegion& r = regions[i];
    if (r.bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("checksum of ", r.bytes, " bytes (region ", i, ")"));
    }
    if (r.bytes > 0 && r.data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("null buffer for a checksum of ", r.bytes, " bytes (region ", i, ")"));
    }
    table.push_back(HashRegion{static_cast<const unsigned char*>(r.data), r.bytes, blocks});
    blocks += ChecksumBlockCount(r.bytes);
  }
  std::vector<uint64_t> results(regions.size());
  if (regions.empty()) return results;
  // The region table, the block hashes and the results in one scratch buffer from the
  // device's memory pool: a cudaMalloc and cudaFree per checksum cost ~130 us (cudaFree
  // synchronises the device). The pool keeps a little memory across synchronisations (its
  // default threshold, 0, returns it to the driver at each one).
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
  const size_t table_bytes = table.size() * sizeof(HashRegion);
  const size_t words = static_cast<size_t>(blocks) + regions.size();
  void* scratch = nullptr;
  if (absl::Status s = CudaStatus(cudaMallocAsync(&scratch, table_bytes + words * 8, stream),
                                  "cudaMallocAsync of the checksum's scratch");
      !s.ok()) {
    return s;
  }
  auto* device_table = static_cast<HashRegion*>(scratch);
  uint64_t* hashes = reinterpret_cast<uint64_t*>(static_cast<char*>(scratch) + table_bytes);
  uint64_t* sums = hashes + blocks;
  absl::Status done = CudaStatus(
      cudaMemcpyAsync(device_table, table.data(), table_bytes, cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync of the checksum's regions");
  if (done.ok()) {
    done = CudaStatus(LaunchChunkChecksums(device_table, static_cast<int64_t>(table.size()), blocks,
                                           hashes, sums, stream),
                      "checksum kernel");
  }
  if (done.ok()) {
    done = CudaStatus(
        cudaMemcpyAsync(results.data(), sums, results.size() * 8, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync of the checksums");
  }
  // Freed in stream order whatever happened, then waited for with the results.
  const absl::Status freed = CudaStatus(cudaFreeAsync(scratch, stream), "cudaFreeAsync");
  const absl::Status synced = CudaStatus(cudaStreamSynchronize(stream), "checksum on the device");
  if (!done.ok()) return done;
  if (!freed.ok()) return freed;
  if (!synced.ok()) return synced;
  return results;
}

}  // namespace nccl
}  // namespace shardcoord
