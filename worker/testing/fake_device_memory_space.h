#ifndef SHARDCOORD_WORKER_TESTING_FAKE_DEVICE_MEMORY_SPACE_H_
#define SHARDCOORD_WORKER_TESTING_FAKE_DEVICE_MEMORY_SPACE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {

// A MemorySpace that stands in for a GPU where there is none (tests only): is_host() is
// false, and the code under test must treat its memory as device memory.
//
// - Its memory comes from its own registry of allocations (ordinary host memory underneath,
//   so an in-process Gloo communicator can stand in for NCCL reading device pointers).
// - Every operation CHECKS its pointers: space memory must lie inside one live allocation of
//   this space (whole extent), host memory must not. A host pointer handed to a device op,
//   a device pointer used as host memory, a block freed twice or not from here: the process
//   aborts with a message naming the operation and the pointer.
// - Operations on space memory are queued like work on a CUDA stream and run only at
//   Synchronize, CopyToHost, CopyFromHost, ChunkChecksum or Free, in call order. So a
//   caller that lets a communicator or host code read the memory before Synchronize reads
//   stale bytes, and a test that checks values catches it.
// - It counts host<->device copies, queued operations and synchronizations.
//
// The destructor CHECKS that every allocation was freed. Thread-safe.
class FakeDeviceMemorySpace final : public MemorySpace {
 public:
  explicit FakeDeviceMemorySpace(std::string name = "fake-cuda:0");
  ~FakeDeviceMemorySpace() override;

  FakeDeviceMemorySpace(const FakeDeviceMemorySpace&) = delete;
  FakeDeviceMemorySpace& operator=(const FakeDeviceMemorySpace&) = delete;

  struct Stats {
    int64_t copies_to_device = 0;
    int64_t bytes_to_device = 0;
    int64_t copies_to_host = 0;
    int64_t bytes_to_host = 0;
    int64_t ops_queued = 0;  // Fills, box copies, reductions, divisions.
    int64_t checksums = 0;
    int64_t synchronizes = 0;
    int64_t live_allocations = 0;
    int64_t live_bytes = 0;
    int64_t shared_opened = 0;  // OpenShared calls that succeeded.
    int64_t live_shared = 0;    // Openings not closed yet.
  };
  Stats stats() const;

  // Whether [p, p + bytes) lies inside one live allocation.
  bool Owns(const void* p, int64_t bytes = 0) const;
  // Allocations beyond this many live bytes fail with RESOURCE_EXHAUSTED.
  void set_capacity(int64_t bytes);
  // A handle of `allocation` (a live one of this space) that a FakeDeviceMemorySpace opens
  // with OpenShared, as cudaIpcGetMemHandle exports a CUDA allocation to another process: the
  // opener then works on this very memory, in place.
  std::string ExportHandle(const Allocation& allocation) const;

  std::string name() const override { return name_; }
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
  absl::StatusOr<uint64_t> ChunkChecksum(const void* data, int64_t bytes) override;
  absl::Status Synchronize() override;
  // Handles of ExportHandle (of any FakeDeviceMemorySpace): the range becomes memory of this
  // space until CloseShared. INVALID_ARGUMENT a malformed handle or a range past the block.
  absl::StatusOr<Allocation> OpenShared(absl::string_view handle, int64_t offset,
                                        int64_t bytes) override;
  void CloseShared(const Allocation& allocation) override;
  // "GPU-" and hex digits derived from the name, as nvidia-smi prints a UUID.
  std::string device_uuid() const override;

 private:
  bool OwnsLocked(const void* p, int64_t bytes) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Abort unless [p, p + bytes) is space memory / is not space memory.
  void CheckDevice(const void* p, int64_t bytes, const char* what) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void CheckHost(const void* p, int64_t bytes, const char* what) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Enqueue(std::function<absl::Status()> op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The box operation `what` ("CopyBox") of `region` from `src` (a buffer for `src_box`) to
  // `dst` (for `dst_box`): checks the boxes and the buffers, then queues `op` unless it moves
  // nothing.
  absl::Status EnqueueBoxOp(absl::string_view what, const Box& region, const void* src,
                            const Box& src_box, void* dst, const Box& dst_box, int64_t element_size,
                            std::function<absl::Status()> op);
  // CopyFromHost (`to_device`) and CopyToHost: the copy after the queued work, counted.
  absl::Status HostCopy(void* dst, const void* src, int64_t bytes, bool to_device);
  // Runs the queue; returns (and clears) the first error of queued work.
  absl::Status DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  mutable absl::Mutex mu_;
  std::map<uintptr_t, int64_t> blocks_ ABSL_GUARDED_BY(mu_);  // Start -> bytes asked for.
  // Opened shared ranges: start -> (bytes, openings).
  std::map<uintptr_t, std::pair<int64_t, int>> opened_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<absl::Status()>> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status queued_error_ ABSL_GUARDED_BY(mu_);
  int64_t capacity_ ABSL_GUARDED_BY(mu_) = int64_t{1} << 40;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_TESTING_FAKE_DEVICE_MEMORY_SPACE_H_
