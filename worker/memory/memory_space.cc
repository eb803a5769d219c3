#include "worker/memory/memory_space.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "sharding/box_copy.h"
#include "sharding/cast.h"
#include "worker/buffers/checksum.h"

namespace shardcoord {
namespace {

constexpr std::align_val_t kAlignment{64};
// Blocks of at least HostMemoryCache::kMinBytes start at a multiple of this and are advised
// (MADV_HUGEPAGE) before their first touch, so the kernel backs their whole 2 MiB extents
// with huge pages (their size is rounded up to one where that wastes little). Measured on
// this project's 2-vCPU VM: a 48 MiB memcpy took 3.9 ms instead of 7 ms with them, and an
// O_DIRECT read (a checkpoint load, worker/buffers/checkpoint_io.cc) runs at 2.1-2.7 GB/s into huge
// pages but 1.2-1.6 GB/s into small ones (the device maps fewer, larger segments).
constexpr int64_t kHugePageBytes = int64_t{2} << 20;
// Blocks of at least this size start on a page, so that a checkpoint load can read into them
// with O_DIRECT (worker/buffers/checkpoint_io.cc).
constexpr int64_t kPageAlignedBytes = int64_t{64} << 10;
constexpr int64_t kPageBytes = 4096;
constexpr std::align_val_t kPageAlignment{kPageBytes};

// Of blocks under HostMemoryCache::kMinBytes (larger ones are huge blocks).
std::align_val_t AlignmentFor(int64_t capacity) {
  return capacity >= kPageAlignedBytes ? kPageAlignment : kAlignment;
}

// `bytes` (whole 4 KiB pages) of fresh anonymous memory at a huge page boundary, advised to
// be backed by huge pages (those of its 2 MiB extents that are whole); nullptr when the kernel
// refuses. Mapped directly rather than through malloc, which may hand out memory already touched in
// small pages (advice does not change pages that exist). Under AddressSanitizer the blocks come
// from operator new instead, so that its redzones and leak checks still cover them.
void* MapHugeBlock(int64_t bytes) {
#ifdef ABSL_HAVE_ADDRESS_SANITIZER
  void* data =
      ::operator new (static_cast<size_t>(bytes), std::align_val_t{kHugePageBytes}, std::nothrow);
  if (data != nullptr) madvise(data, static_cast<size_t>(bytes), MADV_HUGEPAGE);
  return data;
#else
  const size_t len = static_cast<size_t>(bytes + kHugePageBytes);
  void* raw = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t end = aligned + static_cast<uintptr_t>(bytes);
  if (aligned > start) munmap(raw, aligned - start);
  if (start + len > end) munmap(reinterpret_cast<void*>(end), start + len - end);
  // Advice only: without THP support the block simply keeps small pages.
  madvise(reinterpret_cast<void*>(aligned), static_cast<size_t>(bytes), MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
#endif
}

void UnmapHugeBlock(void* data, int64_t bytes) {
#ifdef ABSL_HAVE_ADDRESS_SANITIZER
  ::operator delete (data, std::align_val_t{kHugePageBytes});
#else
  munmap(data, static_cast<size_t>(bytes));
#endif
}

template <typename T>
void FillWith(void* data, int64_t n, T v) {
  T* p = static_cast<T*>(data);
  std::fill(p, p + n, v);
}

// `n` copies of T's largest value when `largest`, else of its lowest (infinities for floats).
template <typename T>
void FillExtreme(void* data, int64_t n, bool largest) {
  using Limits = std::numeric_limits<T>;
  if constexpr (Limits::has_infinity) {
    FillWith<T>(data, n, largest ? Limits::infinity() : -Limits::infinity());
  } else {
    FillWith<T>(data, n, largest ? Limits::max() : Limits::lowest());
  }
}

}  // namespace

HostMemoryCache& HostMemoryCache::Global() {
  static HostMemoryCache* cache = new HostMemoryCache();
  return *cache;
}

void* HostMemoryCache::Allocate(int64_t bytes, int64_t* capacity) {
  if (bytes >= kMinBytes) {
    // Whole huge pages where that wastes at most an eighth (a 1.1 MiB tensor must not hold
    // 2 MiB: the memory budget counts the bytes asked for); else whole small pages, huge
    // only over the block's whole 2 MiB extents. Nearly equal sizes share blocks.
    const int64_t huge = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    const int64_t want =
        huge - bytes <= bytes / 8 ? huge : (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
    {
      absl::MutexLock lock(&mu_);
      auto it = free_.lower_bound(want);
      // Take a block only if it wastes at most a quarter.
      if (it != free_.end() && it->first <= want + want / 4) {
        *capacity = it->first;
        void* data = it->second;
        cached_ -= it->first;
        free_.erase(it);
        return data;
      }
    }
    *capacity = want;
    return MapHugeBlock(want);
  }
  // Room for vectorised code to touch whole cache lines; never 0 bytes.
  const int64_t alloc = std::max<int64_t>(64, (bytes + 63) / 64 * 64);
  *capacity = alloc;
  return ::operator new(static_cast<size_t>(alloc), AlignmentFor(alloc), std::nothrow);
}

void HostMemoryCache::Free(void* data, int64_t capacity) {
  if (data == nullptr) return;
  if (capacity >= kMinBytes) {
    {
      absl::MutexLock lock(&mu_);
      if (cached_ + capacity <= limit_) {
        free_.emplace(capacity, data);
        cached_ += capacity;
        return;
      }
    }
    UnmapHugeBlock(data, capacity);
    return;
  }
  ::operator delete(data, AlignmentFor(capacity));
}

void HostMemoryCache::set_limit(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  limit_ = bytes;
}

int64_t HostMemoryCache::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_;
}

void HostMemoryCache::Clear() {
  std::multimap<int64_t, void*> blocks;
  {
    absl::MutexLock lock(&mu_);
    blocks.swap(free_);
    cached_ = 0;
  }
  for (auto& [size, data] : blocks) UnmapHugeBlock(data, size);
}

absl::Status CheckIdentityFill(int64_t count, DType dtype, ReduceOp op) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("identity fill of ", count, " elements"));
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg && op != ReduceOp::kMin &&
      op != ReduceOp::kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op ", static_cast<int>(op), " has no identity"));
  }
  if (ElementSize(dtype) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype ", static_cast<int>(dtype), " for an identity fill"));
  }
  if (!PartialAllowed(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype ", DTypeName(dtype), " has no reduction identity (it cannot be Partial)"));
  }
  return absl::OkStatus();
}

absl::Status CheckElementwiseReduce(DType dtype, ReduceOp op) {
  if (ElementSize(dtype) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype ", static_cast<int>(dtype), " for a reduction"));
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce op ", ReduceOpName(op), " is not element-wise; reduce with sum and then divide"));
  }
  return absl::OkStatus();
}

absl::Status FillReduceIdentity(void* data, int64_t count, DType dtype, ReduceOp op) {
  if (absl::Status s = CheckIdentityFill(count, dtype, op); !s.ok()) return s;
  const int64_t esize = ElementSize(dtype);
  if (count == 0) return absl::OkStatus();
  if (op == ReduceOp::kSum || op == ReduceOp::kAvg) {
    std::memset(data, 0, static_cast<size_t>(count * esize));
    return absl::OkStatus();
  }
  const bool min = op == ReduceOp::kMin;  // Identity of min is the largest value.
  switch (dtype) {
    case DType::kF32:
      FillExtreme<float>(data, count, min);
      break;
    case DType::kF64:
      FillExtreme<double>(data, count, min);
      break;
    case DType::kF16:
      FillWith<uint16_t>(data, count, min ? 0x7C00 : 0xFC00);
      break;
    case DType::kBF16:
      FillWith<uint16_t>(data, count, min ? 0x7F80 : 0xFF80);
      break;
    case DType::kI8:
      FillExtreme<int8_t>(data, count, min);
      break;
    case DType::kU8:
      FillExtreme<uint8_t>(data, count, min);
      break;
    case DType::kI32:
      FillExtreme<int32_t>(data, count, min);
      break;
    case DType::kI64:
      FillExtreme<int64_t>(data, count, min);
      break;
    case DType::kU32:
      FillExtreme<uint32_t>(data, count, min);
      break;
    case DType::kU64:
      FillExtreme<uint64_t>(data, count, min);
      break;
    default:  // Refused by CheckIdentityFill.
      break;
  }
  return absl::OkStatus();
}

HostMemorySpace& HostMemorySpace::Global() {
  static HostMemorySpace* space = new HostMemorySpace();
  return *space;
}

absl::StatusOr<Allocation> HostMemorySpace::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("allocation of ", bytes, " bytes"));
  }
  Allocation a;
  a.data = static_cast<char*>(HostMemoryCache::Global().Allocate(bytes, &a.capacity));
  if (a.data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
  }
  return a;
}

void HostMemorySpace::Free(const Allocation& allocation) {
  HostMemoryCache::Global().Free(allocation.data, allocation.capacity);
}

absl::Status HostMemorySpace::CopyFromHost(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("copy of ", bytes, " bytes"));
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status HostMemorySpace::CopyToHost(void* dst, const void* src, int64_t bytes) {
  return CopyFromHost(dst, src, bytes);
}

absl::Status HostMemorySpace::FillZeros(void* data, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("zero fill of ", bytes, " bytes"));
  if (bytes > 0) std::memset(data, 0, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status HostMemorySpace::FillIdentity(void* data, int64_t count, DType dtype, ReduceOp op) {
  return FillReduceIdentity(data, count, dtype, op);
}

absl::Status HostMemorySpace::CastBox(const Box& region, const void* src, const Box& src_box,
                                      DType src_dtype, void* dst, const Box& dst_box,
                                      DType dst_dtype) {
  return shardcoord::CastBox(region, src, src_box, src_dtype, dst, dst_box, dst_dtype);
}

absl::Status MemorySpace::CastBox(const Box& region, const void* src, const Box& src_box,
                                  DType src_dtype, void* dst, const Box& dst_box, DType dst_dtype) {
  if (src_dtype == dst_dtype) {
    return CopyBox(region, src, src_box, dst, dst_box, ElementSize(src_dtype));
  }
  if (absl::Status s = CheckCast(src_dtype, dst_dtype); !s.ok()) return s;
  const int64_t n = region.Volume();
  if (region.Empty()) return absl::OkStatus();
  const int64_t in_bytes = n * ElementSize(src_dtype), out_bytes = n * ElementSize(dst_dtype);
  absl::StatusOr<Allocation> in = Allocate(in_bytes);
  if (!in.ok()) return in.status();
  absl::StatusOr<Allocation> out = Allocate(out_bytes);
  if (!out.ok()) {
    Free(*in);
    return out.status();
  }
  std::vector<char> host_in(static_cast<size_t>(in_bytes)),
      host_out(static_cast<size_t>(out_bytes));
  absl::Status s = PackBox(region, src, src_box, in->data, ElementSize(src_dtype));
  if (s.ok()) s = CopyToHost(host_in.data(), in->data, in_bytes);
  if (s.ok()) s = Cast(host_in.data(), src_dtype, host_out.data(), dst_dtype, n);
  if (s.ok()) s = CopyFromHost(out->data, host_out.data(), out_bytes);
  if (s.ok()) s = CopyBox(region, out->data, region, dst, dst_box, ElementSize(dst_dtype));
  if (s.ok()) s = Synchronize();  // The staging goes now: the unpack must have read it.
  Free(*in);
  Free(*out);
  return s;
}

absl::Status HostMemorySpace::CopyBox(const Box& region, const void* src, const Box& src_box,
                                      void* dst, const Box& dst_box, int64_t element_size) {
  return shardcoord::CopyBox(region, src, src_box, dst, dst_box, element_size);
}

absl::Status HostMemorySpace::ReduceIntoBox(const Box& region, const void* src, const Box& src_box,
                                            void* dst, const Box& dst_box, DType dtype,
                                            ReduceOp op) {
  return shardcoord::ReduceIntoBox(region, src, src_box, dst, dst_box, dtype, op);
}

absl::Status HostMemorySpace::DivideBox(void* data, int64_t count, DType dtype, int64_t divisor) {
  return shardcoord::DivideBox(data, count, dtype, divisor);
}

absl::StatusOr<uint64_t> HostMemorySpace::ChunkChecksum(const void* data, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("checksum of ", bytes, " bytes"));
  return shardcoord::ChunkChecksum(data, bytes);
}

absl::StatusOr<std::vector<uint64_t>> MemorySpace::ChunkChecksums(
    absl::Span<const ChecksumRegion> regions) {
  std::vector<uint64_t> out;
  out.reserve(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    absl::StatusOr<uint64_t> sum = ChunkChecksum(regions[i].data, regions[i].bytes);
    if (!sum.ok()) {
      return absl::Status(sum.status().code(), absl::StrCat("checksum of region ", i, " in ",
                                                            name(), ": ", sum.status().message()));
    }
    out.push_back(*sum);
  }
  return out;
}

absl::StatusOr<Allocation> MemorySpace::OpenShared(absl::string_view, int64_t, int64_t) {
  return absl::UnimplementedError(
      absl::StrCat("memory space ", name(), " cannot open memory shared by another process"));
}

void MemorySpace::CloseShared(const Allocation&) {}

absl::StatusOr<int64_t> MemorySpace::DeviceFreeBytes() {
  return absl::UnimplementedError(
      absl::StrCat("memory space ", name(), " cannot tell its device's free memory"));
}

}  // namespace shardcoord
