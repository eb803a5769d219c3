#ifndef SHARDCOORD_WORKER_MEMORY_PROCESS_MEMORY_SPACE_H_
#define SHARDCOORD_WORKER_MEMORY_PROCESS_MEMORY_SPACE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {

// Plain memory of another process on this host (a user process that attached a buffer it
// did not allocate in shared memory), reached only by copies: CopyToHost is one
// process_vm_readv, CopyFromHost one process_vm_writev (worker/comm/gloo/same_host.h),
// ChunkChecksum reads and hashes. Its "space pointers" are addresses in that process and
// are never dereferenced here. Nothing else runs on it (no allocation, no box copies): the
// worker copies such a buffer into its own memory before a plan reads it, and writes a
// plan's result back in one copy. Errors name the process: ABORTED when it is gone,
// PERMISSION_DENIED when the worker may not access it, DATA_LOSS for an unmapped range;
// FAILED_PRECONDITION for the operations it does not run. Thread-safe.
class ProcessMemorySpace final : public MemorySpace {
 public:
  explicit ProcessMemorySpace(int64_t pid) : pid_(pid) {}

  int64_t pid() const { return pid_; }

  std::string name() const override;  // "process 1234"
  bool is_host() const override { return false; }
  absl::StatusOr<Allocation> Allocate(int64_t bytes) override;
  void Free(const Allocation&) override {}
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
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  absl::Status Unsupported(const char* op) const;

  const int64_t pid_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_MEMORY_PROCESS_MEMORY_SPACE_H_
