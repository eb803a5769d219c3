#ifndef SHARDCOORD_WORKER_MEMORY_MEMORY_SPACE_H_
#define SHARDCOORD_WORKER_MEMORY_MEMORY_SPACE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/placement.h"
#include "worker/buffers/checksum.h"

namespace shardcoord {

// Recycles large host allocations: freed blocks of at least kMinBytes stay mapped (up to a
// limit) and serve the next allocation that fits, so a worker that redistributes again and
// again does not pay the kernel's page faults and zeroing for every new buffer. Blocks are
// 64-byte aligned, those of 64 KiB or more 4 KiB aligned (a page, for O_DIRECT), and those of
// kMinBytes or more mapped at a 2 MiB boundary and advised huge before first touch, their size
// rounded up to whole 2 MiB transparent huge pages where that wastes at most an eighth, else
// to whole 4 KiB pages. Thread-safe.
class HostMemoryCache {
 public:
  static constexpr int64_t kMinBytes = int64_t{1} << 20;

  static HostMemoryCache& Global();

  // nullptr when the allocation fails. `capacity` receives the block's real size.
  void* Allocate(int64_t bytes, int64_t* capacity);
  void Free(void* data, int64_t capacity);

  void set_limit(int64_t bytes);
  int64_t cached_bytes() const;
  // Frees every cached block.
  void Clear();

 private:
  mutable absl::Mutex mu_;
  std::multimap<int64_t, void*> free_ ABSL_GUARDED_BY(mu_);
  int64_t cached_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t limit_ ABSL_GUARDED_BY(mu_) = int64_t{1} << 30;
};

// A block of memory from a MemorySpace. `capacity` is what the space really reserved (at
// least the bytes asked for); hand the whole Allocation back to Free.
struct Allocation {
  char* data = nullptr;
  int64_t capacity = 0;
};

// Where a worker's chunk buffers live, and the operations the executor and the Worker
// service run on memory there: host memory for the Gloo backend, one GPU's memory for NCCL.
// Code that moves chunk bytes goes through the buffer's space and never dereferences its
// pointers itself unless is_host().
//
// Pointers passed as "space" memory must come from this space's Allocate (interior pointers
// are fine); "host" pointers are ordinary host memory. Argument conventions and errors are
// those of sharding/box_copy.h (boxes in global coordinates, a buffer "for box B" holds B
// row-major; INVALID_ARGUMENT naming the boxes) and worker/buffers/checksum.h.
//
// Ordering, as on a CUDA stream: the operations on space memory (fills, box copies,
// reductions, divisions) run in the order they are called and may return before they ran.
// CopyToHost, CopyFromHost and ChunkChecksum come after everything called before them and
// are complete when they return. Anything else that touches space memory (a communicator,
// host code) must call Synchronize() first. Free waits for work queued on the block.
// A device space's errors from queued work may surface at a later call. Thread-safe.
class MemorySpace {
 public:
  virtual ~MemorySpace() = default;

  // "host", "cuda:0".
  virtual std::string name() const = 0;
  // True when the memory is ordinary host memory that host code may read and write.
  virtual bool is_host() const = 0;

  // Uninitialised, 64-byte aligned; never null, also for 0 bytes. RESOURCE_EXHAUSTED
  // naming the bytes and the space when it cannot; INVALID_ARGUMENT for negative bytes.
  virtual absl::StatusOr<Allocation> Allocate(int64_t bytes) = 0;
  // Null data is a no-op.
  virtual void Free(const Allocation& allocation) = 0;

  // `bytes` from host memory `src` to space memory `dst`, and back.
  virtual absl::Status CopyFromHost(void* dst, const void* src, int64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) = 0;

  // `bytes` of zeros at `data`.
  virtual absl::Status FillZeros(void* data, int64_t bytes) = 0;
  // `count` elements of `dtype` at `data` set to the identity of `op` (kSum, kMin, kMax;
  // kAvg as kSum): 0, the largest value, the lowest value (infinities for floats).
  virtual absl::Status FillIdentity(void* data, int64_t count, DType dtype, ReduceOp op) = 0;

  // As CopyBox / ReduceIntoBox / DivideBox of sharding/box_copy.h, on space memory.
  virtual absl::Status CopyBox(const Box& region, const void* src, const Box& src_box, void* dst,
                               const Box& dst_box, int64_t element_size) = 0;
  virtual absl::Status ReduceIntoBox(const Box& region, const void* src, const Box& src_box,
                                     void* dst, const Box& dst_box, DType dtype, ReduceOp op) = 0;
  virtual absl::Status DivideBox(void* data, int64_t count, DType dtype, int64_t divisor) = 0;

  // As sharding/cast.h's CastBox (a copy that converts `src_dtype` to `dst_dtype`), both
  // buffers in this space; equal dtypes are CopyBox. This default, for device spaces without
  // a conversion kernel, stages the region through host memory (packs it on the device,
  // copies it out, converts on the host, copies it back and unpacks it) and waits for that;
  // the host space converts in place.
  virtual absl::Status CastBox(const Box& region, const void* src, const Box& src_box,
                               DType src_dtype, void* dst, const Box& dst_box, DType dst_dtype);

  // `region` of a chunk (a buffer for `chunk_box`) into a dense buffer for `region`, both in
  // this space. Unpacking is CopyBox(region, packed, region, chunk, chunk_box, ...).
  absl::Status PackBox(const Box& region, const void* chunk, const Box& chunk_box, void* packed,
                       int64_t element_size) {
    return CopyBox(region, chunk, chunk_box, packed, region, element_size);
  }

  // ChunkChecksum (worker/buffers/checksum.h) of `bytes` of space memory at `data`.
  virtual absl::StatusOr<uint64_t> ChunkChecksum(const void* data, int64_t bytes) = 0;
  // ChunkChecksum of each region, in order. One call per ChunkChecksum here; a device space
  // hashes them all in one launch and one wait (a chunk's blocks hash serially, ~2 ms per
  // MiB block on an H200, so chunks one after another would add up).
  virtual absl::StatusOr<std::vector<uint64_t>> ChunkChecksums(
      absl::Span<const ChecksumRegion> regions);

  // Waits until every operation called before has run; reports the first error of queued
  // work. A no-op on the host.
  virtual absl::Status Synchronize() = 0;

  // Memory another process exported for sharing on this space's device (a CUDA IPC handle of
  // its allocation, as cudaIpcGetMemHandle gives): the `bytes` at `offset` in that
  // allocation, opened in this process and usable as this space's memory (in place, no
  // copy) until CloseShared. Opening the same allocation again shares one opening.
  // UNIMPLEMENTED for a space that cannot (host memory: the worker maps the user's file
  // instead); INVALID_ARGUMENT a malformed handle, a negative or misaligned range, a range
  // past the allocation's end where the device can tell; the device's error otherwise.
  virtual absl::StatusOr<Allocation> OpenShared(absl::string_view handle, int64_t offset,
                                                int64_t bytes);
  // Releases what OpenShared returned (the memory stays its exporter's). Null data: no-op.
  virtual void CloseShared(const Allocation& allocation);
  // The device's UUID ("GPU-..." as nvidia-smi prints it), to check a shared allocation is on
  // this device; empty for host memory.
  virtual std::string device_uuid() const { return ""; }
  // Bytes free on the device now (cudaMemGetInfo), which a worker's default memory budget is
  // taken from. UNIMPLEMENTED for host memory and spaces that cannot tell.
  virtual absl::StatusOr<int64_t> DeviceFreeBytes();
};

// Host memory: allocations from HostMemoryCache::Global() (large blocks are recycled), the
// operations of sharding/box_copy.h and worker/buffers/checksum.h, run at once.
class HostMemorySpace final : public MemorySpace {
 public:
  // The process's one host space; never destroyed.
  static HostMemorySpace& Global();

  std::string name() const override { return "host"; }
  bool is_host() const override { return true; }
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
  absl::Status CastBox(const Box& region, const void* src, const Box& src_box, DType src_dtype,
                       void* dst, const Box& dst_box, DType dst_dtype) override;
  absl::StatusOr<uint64_t> ChunkChecksum(const void* data, int64_t bytes) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
};

// INVALID_ARGUMENT for an identity fill of `count` elements of `dtype` with `op` that cannot
// be done: an unknown dtype or op, or a negative count. What every space's FillIdentity
// checks before it fills (a device space before it queues the work).
absl::Status CheckIdentityFill(int64_t count, DType dtype, ReduceOp op);

// INVALID_ARGUMENT for an element-wise reduction of `dtype` with `op` that cannot be done:
// an unknown dtype, or an op other than kSum, kMin and kMax (kAvg: sum, then divide). What a
// device space's ReduceIntoBox checks before it queues the work.
absl::Status CheckElementwiseReduce(DType dtype, ReduceOp op);

// The identity of `op` (kAvg as kSum) in `count` elements of `dtype` at host memory `data`.
// Errors as CheckIdentityFill. Shared by the spaces.
absl::Status FillReduceIdentity(void* data, int64_t count, DType dtype, ReduceOp op);

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_MEMORY_MEMORY_SPACE_H_
