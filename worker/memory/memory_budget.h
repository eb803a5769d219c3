#ifndef SHARDCOORD_WORKER_MEMORY_MEMORY_BUDGET_H_
#define SHARDCOORD_WORKER_MEMORY_MEMORY_BUDGET_H_

// A worker's memory budget (worker --memory-budget): the bytes it may hold at once in the
// memory its buffers live in (host memory for Gloo, its GPU's for NCCL), counted where every
// worker-owned allocation is made, its MemorySpace. What counts: committed chunk buffers,
// buffers of plans in flight, staging of the executor (packing, collectives), of Fill,
// ReadChunk and WriteChunk, and copies of lent plain memory. What does not: memory user
// processes lent (HostBuffer::Wrap never allocates), and host memory a GPU worker uses for
// staging (it is not the GPU's). Exceeding the budget is an allocation that fails with
// RESOURCE_EXHAUSTED naming the worker, the bytes asked and the bytes free, never an
// allocation the kernel may later refuse by killing the process.

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {

// The accounting: bytes reserved against a budget, the peak, and watermarks (the peak over
// a span, e.g. one plan fragment). Thread-safe.
class MemoryBudget {
 public:
  // `owner` names the worker in errors ("worker w0"). `budget_bytes` <= 0: no limit (use is
  // still counted).
  MemoryBudget(std::string owner, int64_t budget_bytes);

  // Counts `bytes` (>= 0) more as used, or RESOURCE_EXHAUSTED "<owner>: memory budget
  // exceeded: <what> needs N bytes (1.00 MiB), F bytes free of the B-byte budget (U used)"
  // and nothing changes.
  absl::Status Reserve(int64_t bytes, absl::string_view what);
  // Gives back what a Reserve took.
  void Release(int64_t bytes);

  const std::string& owner() const { return owner_; }
  int64_t budget() const { return budget_; }  // <= 0: no limit.
  int64_t used() const;
  // budget - used (0 when over it; int64 max without a limit).
  int64_t free() const;
  // The highest `used` since the start or the last ResetPeak.
  int64_t peak() const;
  // Returns the peak and restarts it from the current use.
  int64_t ResetPeak();

  // A watermark follows the highest use from now on: OpenWatermark returns its id,
  // CloseWatermark the highest use since it was opened (and forgets it).
  int64_t OpenWatermark();
  int64_t CloseWatermark(int64_t id);

 private:
  const std::string owner_;
  const int64_t budget_;
  mutable absl::Mutex mu_;
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_watermark_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<int64_t, int64_t> watermarks_ ABSL_GUARDED_BY(mu_);
};

// A MemorySpace that counts every allocation of `inner` against `budget`: Allocate reserves
// the bytes asked (RESOURCE_EXHAUSTED as MemoryBudget::Reserve when they do not fit, before
// `inner` is asked), Free gives them back. Everything else is `inner`'s, unchanged: memory
// opened with OpenShared is another process's and does not count. A worker hands this one
// space to everything that allocates or wraps its buffers (WorkerCore, AttachRegistry), so
// buffers of both compare as being in the same space. Thread-safe; `inner` and `budget`
// must outlive it.
class BudgetedMemorySpace final : public MemorySpace {
 public:
  BudgetedMemorySpace(MemorySpace* inner, MemoryBudget* budget);
  ~BudgetedMemorySpace() override;

  MemorySpace& inner() const { return *inner_; }
  MemoryBudget& budget() const { return *budget_; }

  std::string name() const override { return inner_->name(); }
  bool is_host() const override { return inner_->is_host(); }
  absl::StatusOr<Allocation> Allocate(int64_t bytes) override;
  void Free(const Allocation& allocation) override;
  absl::Status CopyFromHost(void* dst, const void* src, int64_t bytes) override {
    return inner_->CopyFromHost(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    return inner_->CopyToHost(dst, src, bytes);
  }
  absl::Status FillZeros(void* data, int64_t bytes) override {
    return inner_->FillZeros(data, bytes);
  }
  absl::Status FillIdentity(void* data, int64_t count, DType dtype, ReduceOp op) override {
    return inner_->FillIdentity(data, count, dtype, op);
  }
  absl::Status CopyBox(const Box& region, const void* src, const Box& src_box, void* dst,
                       const Box& dst_box, int64_t element_size) override {
    return inner_->CopyBox(region, src, src_box, dst, dst_box, element_size);
  }
  absl::Status ReduceIntoBox(const Box& region, const void* src, const Box& src_box, void* dst,
                             const Box& dst_box, DType dtype, ReduceOp op) override {
    return inner_->ReduceIntoBox(region, src, src_box, dst, dst_box, dtype, op);
  }
  absl::Status DivideBox(void* data, int64_t count, DType dtype, int64_t divisor) override {
    return inner_->DivideBox(data, count, dtype, divisor);
  }
  // The inner space's conversion (its host staging, on a device without a kernel, is not
  // counted: it is the conversion's working memory, freed before the call returns).
  absl::Status CastBox(const Box& region, const void* src, const Box& src_box, DType src_dtype,
                       void* dst, const Box& dst_box, DType dst_dtype) override {
    return inner_->CastBox(region, src, src_box, src_dtype, dst, dst_box, dst_dtype);
  }
  absl::StatusOr<uint64_t> ChunkChecksum(const void* data, int64_t bytes) override {
    return inner_->ChunkChecksum(data, bytes);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  absl::StatusOr<Allocation> OpenShared(absl::string_view handle, int64_t offset,
                                        int64_t bytes) override {
    return inner_->OpenShared(handle, offset, bytes);
  }
  void CloseShared(const Allocation& allocation) override { inner_->CloseShared(allocation); }
  std::string device_uuid() const override { return inner_->device_uuid(); }
  absl::StatusOr<int64_t> DeviceFreeBytes() override { return inner_->DeviceFreeBytes(); }

 private:
  MemorySpace* const inner_;
  MemoryBudget* const budget_;
  // What an allocation is called in a refusal, built once: a fused group allocates a buffer
  // per member, and naming each one cost two string allocations.
  const std::string allocation_name_;
  absl::Mutex mu_;
  // Live allocations -> the bytes they were counted as (what was asked, not the capacity a
  // cache rounded it up to, so the worker's count matches the coordinator's).
  absl::flat_hash_map<const void*, int64_t> counted_ ABSL_GUARDED_BY(mu_);
};

// The memory a host worker may use: the machine's physical memory, or the memory limit of
// the cgroup the process runs in (a container's) when that is lower.
int64_t HostMemoryLimit();

// --memory-budget: an absolute byte count, or a fraction of the base (HostMemoryLimit() for
// host memory, the device's free memory for a device space).
struct MemoryBudgetSetting {
  int64_t bytes = 0;      // > 0: this many bytes.
  double fraction = 0.8;  // Otherwise: this fraction of the base (the default: 80%).
};

// The flag's value: a byte size (common/byte_size.h) or a percentage ("50%"); empty: the
// default. INVALID_ARGUMENT "--memory-budget: ..." otherwise, and for 0 or 0%.
absl::StatusOr<MemoryBudgetSetting> ParseMemoryBudgetFlag(absl::string_view text);

// The budget in bytes for `space`; the space's error when a fraction is asked of a device
// that cannot tell its free memory.
absl::StatusOr<int64_t> ResolveMemoryBudget(const MemoryBudgetSetting& setting, MemorySpace& space);

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_MEMORY_MEMORY_BUDGET_H_
