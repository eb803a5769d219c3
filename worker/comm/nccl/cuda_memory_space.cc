#include "worker/comm/nccl/cuda_memory_space.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sharding/box_copy.h"
#include "worker/comm/nccl/cuda_status.h"
#include "worker/comm/nccl/device_ops.h"

namespace shardcoord {
namespace nccl {

absl::StatusOr<std::unique_ptr<CudaMemorySpace>> CudaMemorySpace::Create(int device) {
  if (device < 0) return absl::InvalidArgumentError(absl::StrCat("device ", device));
  const std::string what = absl::StrCat("creating the stream of cuda:", device);
  if (absl::Status s = CudaStatus(cudaSetDevice(device), what.c_str()); !s.ok()) return s;
  cudaStream_t stream = nullptr;
  if (absl::Status s =
          CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), what.c_str());
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<CudaMemorySpace>(new CudaMemorySpace(device, stream));
}

CudaMemorySpace::CudaMemorySpace(int device, cudaStream_t stream)
    : device_(device), stream_(stream) {}

CudaMemorySpace::~CudaMemorySpace() {
  if (Enter().ok()) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
}

std::string CudaMemorySpace::name() const { return absl::StrCat("cuda:", device_); }

absl::Status CudaMemorySpace::Enter() const {
  return CudaStatus(cudaSetDevice(device_), absl::StrCat("cudaSetDevice(", device_, ")").c_str());
}

absl::StatusOr<Allocation> CudaMemorySpace::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("allocation of ", bytes, " bytes"));
  }
  if (absl::Status s = Enter(); !s.ok()) return s;
  // cudaMalloc aligns to at least 256 bytes; never null, also for 0 bytes.
  const int64_t real = std::max<int64_t>(bytes, 1);
  void* p = nullptr;
  const std::string what = absl::StrCat("cudaMalloc of ", bytes, " bytes on ", name());
  if (absl::Status s = CudaStatus(cudaMalloc(&p, static_cast<size_t>(real)), what.c_str());
      !s.ok()) {
    return s;
  }
  return Allocation{static_cast<char*>(p), real};
}

void CudaMemorySpace::Free(const Allocation& allocation) {
  if (allocation.data == nullptr || !Enter().ok()) return;
  (void)cudaStreamSynchronize(stream_);  // Queued work may still use the block.
  (void)cudaFree(allocation.data);
}

absl::Status CudaMemorySpace::CopyAndWait(void* dst, const void* src, int64_t bytes,
                                          cudaMemcpyKind kind) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("copy of ", bytes, " bytes"));
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = Enter(); !s.ok()) return s;
  const std::string what = absl::StrCat("copy of ", bytes, " bytes ",
                                        kind == cudaMemcpyHostToDevice ? "to " : "from ", name());
  if (absl::Status s = CudaStatus(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, stream_), what.c_str());
      !s.ok()) {
    return s;
  }
  return CudaStatus(cudaStreamSynchronize(stream_), what.c_str());
}

absl::Status CudaMemorySpace::CopyFromHost(void* dst, const void* src, int64_t bytes) {
  return CopyAndWait(dst, src, bytes, cudaMemcpyHostToDevice);
}

absl::Status CudaMemorySpace::CopyToHost(void* dst, const void* src, int64_t bytes) {
  return CopyAndWait(dst, src, bytes, cudaMemcpyDeviceToHost);
}

absl::Status CudaMemorySpace::FillZeros(void* data, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("zero fill of ", bytes, " bytes"));
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = Enter(); !s.ok()) return s;
  return CudaStatus(cudaMemsetAsync(data, 0, static_cast<size_t>(bytes), stream_),
                    absl::StrCat("zero fill of ", bytes, " bytes on ", name()).c_str());
}

absl::Status CudaMemorySpace::FillIdentity(void* data, int64_t count, DType dtype, ReduceOp op) {
  if (absl::Status s = CheckIdentityFill(count, dtype, op); !s.ok()) return s;
  const int64_t esize = ElementSize(dtype);
  if (op == ReduceOp::kSum || op == ReduceOp::kAvg) return FillZeros(data, count * esize);
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = Enter(); !s.ok()) return s;
  const std::string what =
      absl::StrCat("identity fill of ", count, " ", DTypeName(dtype), " elements on ", name());
  // One element from the host (pageable: staged before the call returns), then doubling.
  unsigned char one[8];
  if (absl::Status s = FillReduceIdentity(one, 1, dtype, op); !s.ok()) return s;
  char* p = static_cast<char*>(data);
  if (absl::Status s = CudaStatus(
          cudaMemcpyAsync(p, one, static_cast<size_t>(esize), cudaMemcpyHostToDevice, stream_),
          what.c_str());
      !s.ok()) {
    return s;
  }
  for (int64_t filled = 1; filled < count; filled *= 2) {
    const int64_t n = std::min(filled, count - filled);
    if (absl::Status s =
            CudaStatus(cudaMemcpyAsync(p + filled * esize, p, static_cast<size_t>(n * esize),
                                       cudaMemcpyDeviceToDevice, stream_),
                       what.c_str());
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CudaMemorySpace::CopyBox(const Box& region, const void* src, const Box& src_box,
                                      void* dst, const Box& dst_box, int64_t element_size) {
  if (absl::Status s = Enter(); !s.ok()) return s;
  return DeviceCopyBox(region, src, src_box, dst, dst_box, element_size, stream_);
}

absl::Status CudaMemorySpace::CastBox(const Box& region, const void* src, const Box& src_box,
                                      DType src_dtype, void* dst, const Box& dst_box,
                                      DType dst_dtype) {
  if (absl::Status s = Enter(); !s.ok()) return s;
  return DeviceCastBox(region, src, src_box, src_dtype, dst, dst_box, dst_dtype, stream_);
}

absl::Status CudaMemorySpace::ReduceIntoBox(const Box& region, const void* src, const Box& src_box,
                                            void* dst, const Box& dst_box, DType dtype,
                                            ReduceOp op) {
  if (absl::Status s = Enter(); !s.ok()) return s;
  return DeviceReduceIntoBox(region, src, src_box, dst, dst_box, dtype, op, stream_);
}

absl::Status CudaMemorySpace::DivideBox(void* data, int64_t count, DType dtype, int64_t divisor) {
  const int64_t esize = ElementSize(dtype);
  if (esize <= 0 || count < 0 || divisor <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("division of ", count, " elements of dtype ",
                                                   static_cast<int>(dtype), " by ", divisor));
  }
  if (count == 0) return absl::OkStatus();
  // No division kernel yet: a round trip through the host (P(avg) targets only).
  std::vector<char> host(static_cast<size_t>(count * esize));
  if (absl::Status s = CopyToHost(host.data(), data, count * esize); !s.ok()) return s;
  if (absl::Status s = shardcoord::DivideBox(host.data(), count, dtype, divisor); !s.ok()) {
    return s;
  }
  return CopyFromHost(data, host.data(), count * esize);
}

absl::StatusOr<uint64_t> CudaMemorySpace::ChunkChecksum(const void* data, int64_t bytes) {
  if (absl::Status s = Enter(); !s.ok()) return s;
  return DeviceChunkChecksum(data, bytes, stream_);
}

absl::StatusOr<std::vector<uint64_t>> CudaMemorySpace::ChunkChecksums(
    absl::Span<const ChecksumRegion> regions) {
  if (absl::Status s = Enter(); !s.ok()) return s;
  return DeviceChunkChecksums(regions, stream_);
}

absl::Status CudaMemorySpace::Synchronize() {
  if (absl::Status s = Enter(); !s.ok()) return s;
  return CudaStatus(cudaStreamSynchronize(stream_),
                    absl::StrCat("work queued on ", name()).c_str());
}

namespace {

// cuMemGetAddressRange through the runtime (the worker does not link the driver library):
// the allocation's size, or 0 when the driver does not say.
size_t AllocationSize(void* base) {
  using GetRange = int (*)(unsigned long long*, size_t*, unsigned long long);  // NOLINT
  static GetRange get_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<GetRange>(nullptr);
    }
    return reinterpret_cast<GetRange>(fn);
  }();
  if (get_range == nullptr) return 0;
  unsigned long long start = 0;  // NOLINT
  size_t size = 0;
  if (get_range(&start, &size, reinterpret_cast<unsigned long long>(base)) != 0)
    return 0;  // NOLINT
  return size;
}

}  // namespace

absl::StatusOr<Allocation> CudaMemorySpace::OpenShared(absl::string_view handle, int64_t offset,
                                                       int64_t bytes) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) {
    return absl::InvalidArgumentError(
        absl::StrCat("handle: ", handle.size(), " bytes, a cudaIpcMemHandle_t has ", sizeof(h)));
  }
  if (offset < 0 || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, ", bytes ", bytes));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  if (absl::Status s = Enter(); !s.ok()) return s;
  void* base = nullptr;
  const std::string what = absl::StrCat("cudaIpcOpenMemHandle on ", name());
  if (absl::Status s =
          CudaStatus(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess), what);
      !s.ok()) {
    return s;
  }
  const size_t size = AllocationSize(base);
  if (size != 0 && static_cast<uint64_t>(offset) + static_cast<uint64_t>(bytes) > size) {
    (void)cudaIpcCloseMemHandle(base);
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " + ", bytes,
                                                   " bytes is past the shared allocation's ", size,
                                                   " bytes"));
  }
  char* data = static_cast<char*>(base) + offset;
  absl::MutexLock lock(&mu_);
  opened_.emplace(data, base);
  return Allocation{data, bytes};
}

void CudaMemorySpace::CloseShared(const Allocation& allocation) {
  if (allocation.data == nullptr) return;
  void* base = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = opened_.find(allocation.data);
    if (it == opened_.end()) return;
    base = it->second;
    opened_.erase(it);
  }
  if (!Enter().ok()) return;
  (void)cudaStreamSynchronize(stream_);  // Queued work may still use it.
  (void)cudaIpcCloseMemHandle(base);
}

std::string CudaMemorySpace::device_uuid() const {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) return "";
  const unsigned char* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::string hex;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) hex += '-';
    absl::StrAppend(&hex, absl::Hex(u[i], absl::kZeroPad2));
  }
  return absl::StrCat("GPU-", hex);
}

absl::StatusOr<int64_t> CudaMemorySpace::DeviceFreeBytes() {
  if (absl::Status s = Enter(); !s.ok()) return s;
  size_t free_bytes = 0, total_bytes = 0;
  if (absl::Status s = CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes),
                                  absl::StrCat("cudaMemGetInfo on device ", device_));
      !s.ok()) {
    return s;
  }
  return static_cast<int64_t>(free_bytes);
}

}  // namespace nccl
}  // namespace shardcoord
