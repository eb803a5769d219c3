#include <cuda_runtime.h>

#include "sharding/cast_bits.h"
#include "worker/comm/nccl/box_geometry.h"
#include "worker/comm/nccl/kernels.h"
#include "worker/comm/nccl/reduce_ops.h"
#include "worker/comm/nccl/xxh64.h"

namespace shardcoord {
namespace nccl {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

int Blocks(int64_t work, int threads) {
  int64_t b = (work + threads - 1) / threads;
  if (b > kMaxBlocks) b = kMaxBlocks;  // The kernels loop with a grid stride.
  return static_cast<int>(b < 1 ? 1 : b);
}

template <typename U>
__global__ void CopyUnitsKernel(BoxCopyGeometry g, const char* __restrict__ src,
                                char* __restrict__ dst, int64_t units) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units;
       u += stride) {
    int64_t s, d;
    UnitOffsets(g, static_cast<int>(sizeof(U)), u, &s, &d);
    *reinterpret_cast<U*>(dst + d) = *reinterpret_cast<const U*>(src + s);
  }
}

template <typename U>
cudaError_t LaunchUnits(const BoxCopyGeometry& g, const void* src, void* dst, cudaStream_t stream) {
  const int64_t units = TotalBytes(g) / static_cast<int64_t>(sizeof(U));
  CopyUnitsKernel<U><<<Blocks(units, kThreads), kThreads, 0, stream>>>(
      g, static_cast<const char*>(src), static_cast<char*>(dst), units);
  return cudaGetLastError();
}

template <int kDType>
__global__ void ReduceKernel(BoxCopyGeometry g, int op, const unsigned char* __restrict__ src,
                             unsigned char* __restrict__ dst, int64_t elements) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < elements;
       e += stride) {
    int64_t s, d;
    ElementOffsets(g, e, &s, &d);
    DevCombineElement(kDType, op, dst + d, src + s);
  }
}

template <int kDType>
cudaError_t LaunchReduce(const BoxCopyGeometry& g, int op, const void* src, void* dst,
                         cudaStream_t stream) {
  const int64_t elements = ElementCount(g);
  ReduceKernel<kDType><<<Blocks(elements, kThreads), kThreads, 0, stream>>>(
      g, op, static_cast<const unsigned char*>(src), static_cast<unsigned char*>(dst), elements);
  return cudaGetLastError();
}

// Element e of the region at element offsets from ElementOffsets (g has element_size 1).
__global__ void CastKernel(BoxCopyGeometry g, int from, int to,
                           const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                           int64_t elements) {
  const int is = cast_bits::ElementBytes(from), os = cast_bits::ElementBytes(to);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < elements;
       e += stride) {
    int64_t s, d;
    ElementOffsets(g, e, &s, &d);
    cast_bits::StoreElement(
        dst + d * os, os,
        cast_bits::CastElement(cast_bits::LoadElement(src + s * is, is), from, to));
  }
}

__global__ void QuantizeKernel(BlockQuantGeometry g, int from,
                               const unsigned char* __restrict__ src,
                               unsigned char* __restrict__ dst, float* __restrict__ scales,
                               int64_t blocks) {
  __shared__ unsigned int amax;  // The bits of a non-negative f32: integer order is value order.
  const int es = cast_bits::ElementBytes(from);
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const QuantBlock qb = QuantBlockAt(g, b);
    if (threadIdx.x == 0) amax = 0;
    __syncthreads();
    uint32_t local = 0;
    for (int64_t i = threadIdx.x; i < qb.count; i += blockDim.x) {
      const int64_t e = QuantBlockElement(g, qb, i);
      local = cast_bits::AmaxWith(local,
                                  cast_bits::ToF32(cast_bits::LoadElement(src + e * es, es), from));
    }
    atomicMax(&amax, local);
    __syncthreads();
    const float s = cast_bits::BlockScale(amax);
    if (threadIdx.x == 0) scales[b] = s;
    for (int64_t i = threadIdx.x; i < qb.count; i += blockDim.x) {
      const int64_t e = QuantBlockElement(g, qb, i);
      dst[e] = cast_bits::QuantizeE4M3(
          cast_bits::ToF32(cast_bits::LoadElement(src + e * es, es), from), s);
    }
    __syncthreads();  // Every thread has read amax before the next block resets it.
  }
}

__global__ void DequantizeKernel(BlockQuantGeometry g, const unsigned char* __restrict__ src,
                                 const float* __restrict__ scales, int to,
                                 unsigned char* __restrict__ dst, int64_t elements) {
  const int es = cast_bits::ElementBytes(to);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < elements;
       e += stride) {
    const float s = scales[ScaleIndexOf(g, e)];
    const float y = cast_bits::DequantizeE4M3(src[e], s);
    cast_bits::StoreElement(dst + e * es, es,
                            cast_bits::CastElement(cast_bits::F32Bits(y), cast_bits::kF32, to));
  }
}

// XXH64 of one checksum block by one thread, as Xxh64 computes it, with the loads issued a
// group of 8 stripes (256 bytes) ahead of the arithmetic: a GPU thread does not run ahead of a
// stalled load, and one 8-byte load per round left each thread waiting on memory for every
// stripe (about 0.1 GB/s per thread, 10 ms per MiB block, on an H200). 8-byte aligned data
// only; the rest (attached tensors at odd offsets) takes the plain loop.
__device__ uint64_t BlockXxh64(const unsigned char* p, int64_t len) {
  if (len < 32 || (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    return Xxh64(p, static_cast<uint64_t>(len), 0);
  }
  constexpr int kGroupWords = 32;  // 8 stripes of 4 words
  const unsigned long long* w = reinterpret_cast<const unsigned long long*>(p);  // NOLINT
  const int64_t stripes = len / 32;
  const int64_t groups = stripes / 8;
  XxhLanes lanes = XxhStartLanes(0);
  unsigned long long cur[kGroupWords];  // NOLINT
  if (groups > 0) {
#pragma unroll
    for (int i = 0; i < kGroupWords; ++i) cur[i] = __ldg(w + i);
  }
  for (int64_t g = 0; g < groups; ++g) {
    // The last group loads itself again rather than past the block.
    const unsigned long long* ahead = w + (g + 1 < groups ? g + 1 : g) * kGroupWords;  // NOLINT
    unsigned long long next[kGroupWords];                                              // NOLINT
#pragma unroll
    for (int i = 0; i < kGroupWords; ++i) next[i] = __ldg(ahead + i);
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      XxhStripe(&lanes, cur[4 * s], cur[4 * s + 1], cur[4 * s + 2], cur[4 * s + 3]);
    }
#pragma unroll
    for (int i = 0; i < kGroupWords; ++i) cur[i] = next[i];
  }
  for (int64_t s = groups * 8; s < stripes; ++s) {
    XxhStripe(&lanes, __ldg(w + 4 * s), __ldg(w + 4 * s + 1), __ldg(w + 4 * s + 2),
              __ldg(w + 4 * s + 3));
  }
  return XxhFinish(&lanes, p + stripes * 32, p + len, static_cast<uint64_t>(len), 0);
}

__global__ void BlockHashKernel(const HashRegion* regions, int64_t count, int64_t blocks,
                                uint64_t* hashes) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks;
       b += stride) {
    // The last region whose first block is at most b (regions of 0 bytes have no blocks).
    int64_t lo = 0, hi = count - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (regions[mid].first_block <= b) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const HashRegion& r = regions[lo];
    const int64_t block = b - r.first_block;
    hashes[b] =
        BlockXxh64(r.data + block * kDeviceChecksumBlockBytes, ChecksumBlockLength(r.bytes, block));
  }
}

// The device is little-endian, so the hash words in memory are already the bytes the
// definition hashes.
__global__ void CombineKernel(const HashRegion* regions, int64_t count, const uint64_t* hashes,
                              uint64_t* results) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const HashRegion& r = regions[i];
    results[i] =
        Xxh64(hashes + r.first_block, static_cast<uint64_t>(ChecksumBlockCount(r.bytes)) * 8, 0);
  }
}

}  // namespace

cudaError_t LaunchCopyBox(const BoxCopyGeometry& g, const void* src, void* dst,
                          cudaStream_t stream) {
  if (g.runs == 0 || g.run_bytes == 0) return cudaSuccess;
  const char* s = static_cast<const char*>(src) + g.src_start;
  char* d = static_cast<char*>(dst) + g.dst_start;
  if (g.ndims == 0) {
    return cudaMemcpyAsync(d, s, static_cast<size_t>(g.run_bytes), cudaMemcpyDeviceToDevice,
                           stream);
  }
  constexpr int64_t kMaxPitch = int64_t{1} << 30;  // Well inside cudaMemcpy2D's limit.
  if (g.ndims == 1 && g.src_stride[0] < kMaxPitch && g.dst_stride[0] < kMaxPitch) {
    return cudaMemcpy2DAsync(d, static_cast<size_t>(g.dst_stride[0]), s,
                             static_cast<size_t>(g.src_stride[0]), static_cast<size_t>(g.run_bytes),
                             static_cast<size_t>(g.count[0]), cudaMemcpyDeviceToDevice, stream);
  }
  switch (CopyUnitBytes(g, reinterpret_cast<uintptr_t>(src), reinterpret_cast<uintptr_t>(dst))) {
    case 16:
      return LaunchUnits<uint4>(g, src, dst, stream);
    case 8:
      return LaunchUnits<uint2>(g, src, dst, stream);
    case 4:
      return LaunchUnits<uint32_t>(g, src, dst, stream);
    case 2:
      return LaunchUnits<uint16_t>(g, src, dst, stream);
    default:
      return LaunchUnits<uint8_t>(g, src, dst, stream);
  }
}

cudaError_t LaunchReduceBox(const BoxCopyGeometry& g, int dtype, int op, const void* src, void* dst,
                            cudaStream_t stream) {
  if (g.runs == 0 || g.run_bytes == 0) return cudaSuccess;
  switch (dtype) {
    case kDevF32:
      return LaunchReduce<kDevF32>(g, op, src, dst, stream);
    case kDevF64:
      return LaunchReduce<kDevF64>(g, op, src, dst, stream);
    case kDevF16:
      return LaunchReduce<kDevF16>(g, op, src, dst, stream);
    case kDevBF16:
      return LaunchReduce<kDevBF16>(g, op, src, dst, stream);
    case kDevI8:
      return LaunchReduce<kDevI8>(g, op, src, dst, stream);
    case kDevU8:
      return LaunchReduce<kDevU8>(g, op, src, dst, stream);
    case kDevI32:
      return LaunchReduce<kDevI32>(g, op, src, dst, stream);
    case kDevI64:
      return LaunchReduce<kDevI64>(g, op, src, dst, stream);
    case kDevU32:
      return LaunchReduce<kDevU32>(g, op, src, dst, stream);
    case kDevU64:
      return LaunchReduce<kDevU64>(g, op, src, dst, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchCastBox(const BoxCopyGeometry& g, int from, int to, const void* src, void* dst,
                          cudaStream_t stream) {
  const int64_t elements = ElementCount(g);
  if (elements == 0) return cudaSuccess;
  CastKernel<<<Blocks(elements, kThreads), kThreads, 0, stream>>>(
      g, from, to, static_cast<const unsigned char*>(src), static_cast<unsigned char*>(dst),
      elements);
  return cudaGetLastError();
}

cudaError_t LaunchQuantizeBlocks(const BlockQuantGeometry& g, int from, const void* src, void* dst,
                                 float* scales, cudaStream_t stream) {
  const int64_t blocks = ScaleBlockCount(g);
  if (blocks == 0) return cudaSuccess;
  QuantizeKernel<<<static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads, 0,
                   stream>>>(g, from, static_cast<const unsigned char*>(src),
                             static_cast<unsigned char*>(dst), scales, blocks);
  return cudaGetLastError();
}

cudaError_t LaunchDequantizeBlocks(const BlockQuantGeometry& g, const void* src,
                                   const float* scales, int to, void* dst, cudaStream_t stream) {
  const int64_t elements = g.outer * g.m * g.n;
  if (elements == 0) return cudaSuccess;
  DequantizeKernel<<<Blocks(elements, kThreads), kThreads, 0, stream>>>(
      g, static_cast<const unsigned char*>(src), scales, to, static_cast<unsigned char*>(dst),
      elements);
  return cudaGetLastError();
}

cudaError_t LaunchChunkChecksums(const HashRegion* regions, int64_t count, int64_t blocks,
                                 uint64_t* block_hashes, uint64_t* results, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (blocks > 0) {
    // Each thread hashes a whole MiB: the threads of one warp would each stream a different
    // MiB (one memory transaction per thread per load) through one SM, so spread them over
    // every SM instead: 32 per block put 256 MiB on 8 SMs at 47 GB/s on an H200.
    constexpr int kHashThreads = 2;
    BlockHashKernel<<<Blocks(blocks, kHashThreads), kHashThreads, 0, stream>>>(
        regions, count, blocks, block_hashes);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  constexpr int kCombineThreads = 32;
  CombineKernel<<<Blocks(count, kCombineThreads), kCombineThreads, 0, stream>>>(
      regions, count, block_hashes, results);
  return cudaGetLastError();
}

}  // namespace nccl
}  // namespace shardcoord
