#include "worker/testing/fake_device_memory_space.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <new>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "sharding/box_copy.h"
#include "worker/buffers/checksum.h"

namespace shardcoord {
namespace {

constexpr std::align_val_t kAlignment{64};

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "FakeDeviceMemorySpace CHECK failed: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace

FakeDeviceMemorySpace::FakeDeviceMemorySpace(std::string name) : name_(std::move(name)) {}

FakeDeviceMemorySpace::~FakeDeviceMemorySpace() {
  absl::MutexLock lock(&mu_);
  DrainLocked().IgnoreError();
  if (!blocks_.empty()) {
    Die(absl::StrCat(name_, ": destroyed with ", blocks_.size(), " live allocation(s)"));
  }
  if (!opened_.empty()) {
    Die(absl::StrCat(name_, ": destroyed with ", opened_.size(), " shared range(s) open"));
  }
}

FakeDeviceMemorySpace::Stats FakeDeviceMemorySpace::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void FakeDeviceMemorySpace::set_capacity(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  capacity_ = bytes;
}

bool FakeDeviceMemorySpace::Owns(const void* p, int64_t bytes) const {
  absl::MutexLock lock(&mu_);
  return OwnsLocked(p, bytes);
}

bool FakeDeviceMemorySpace::OwnsLocked(const void* p, int64_t bytes) const {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  auto inside = [&](uintptr_t start, int64_t size) {
    return bytes >= 0 && addr >= start &&
           addr - start + static_cast<uint64_t>(bytes) <= static_cast<uint64_t>(size);
  };
  auto it = blocks_.upper_bound(addr);
  if (it != blocks_.begin() && inside(std::prev(it)->first, std::prev(it)->second)) return true;
  auto sh = opened_.upper_bound(addr);
  return sh != opened_.begin() && inside(std::prev(sh)->first, std::prev(sh)->second.first);
}

void FakeDeviceMemorySpace::CheckDevice(const void* p, int64_t bytes, const char* what) const {
  if (bytes == 0) return;  // Empty extents touch nothing and may be null.
  if (!OwnsLocked(p, bytes)) {
    Die(absl::StrCat(name_, ": ", what, ": ", bytes, " bytes at ", absl::Hex(p),
                     " are not memory of this space (a host pointer in a device op?)"));
  }
}

void FakeDeviceMemorySpace::CheckHost(const void* p, int64_t bytes, const char* what) const {
  if (bytes == 0) return;
  if (p == nullptr) Die(absl::StrCat(name_, ": ", what, ": null host pointer"));
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  auto it = blocks_.upper_bound(addr + static_cast<uint64_t>(bytes) - 1);
  auto sh = opened_.upper_bound(addr + static_cast<uint64_t>(bytes) - 1);
  if ((it != blocks_.begin() &&
       addr < std::prev(it)->first + static_cast<uint64_t>(std::prev(it)->second)) ||
      (sh != opened_.begin() &&
       addr < std::prev(sh)->first + static_cast<uint64_t>(std::prev(sh)->second.first))) {
    Die(absl::StrCat(name_, ": ", what, ": host range at ", absl::Hex(p),
                     " overlaps memory of this space (a device pointer used as host "
                     "memory?)"));
  }
}

std::string FakeDeviceMemorySpace::device_uuid() const {
  return absl::StrCat("GPU-", absl::Hex(std::hash<std::string>{}(name_), absl::kZeroPad16));
}

std::string FakeDeviceMemorySpace::ExportHandle(const Allocation& allocation) const {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(allocation.data));
  if (it == blocks_.end()) {
    Die(absl::StrCat(name_, ": ExportHandle of ", absl::Hex(allocation.data),
                     ", which is not the start of a live allocation of this space"));
  }
  return absl::StrCat("fake-ipc:", it->first, ":", it->second);
}

absl::StatusOr<Allocation> FakeDeviceMemorySpace::OpenShared(absl::string_view handle,
                                                             int64_t offset, int64_t bytes) {
  std::vector<absl::string_view> parts = absl::StrSplit(handle, ':');
  uint64_t start = 0;
  int64_t size = 0;
  if (parts.size() != 3 || parts[0] != "fake-ipc" || !absl::SimpleAtoi(parts[1], &start) ||
      !absl::SimpleAtoi(parts[2], &size)) {
    return absl::InvalidArgumentError(absl::StrCat("handle: '", handle, "' is no fake IPC handle"));
  }
  if (offset < 0 || bytes < 0 || offset + bytes > size) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " + ", bytes,
                                                   " bytes is past the shared allocation's ", size,
                                                   " bytes"));
  }
  absl::MutexLock lock(&mu_);
  const uintptr_t at = static_cast<uintptr_t>(start + static_cast<uint64_t>(offset));
  auto& [length, openings] = opened_[at];
  length = std::max(length, bytes);
  ++openings;
  ++stats_.shared_opened;
  ++stats_.live_shared;
  return Allocation{reinterpret_cast<char*>(at), bytes};
}

void FakeDeviceMemorySpace::CloseShared(const Allocation& allocation) {
  if (allocation.data == nullptr) return;
  absl::MutexLock lock(&mu_);
  DrainLocked().IgnoreError();  // As the CUDA space: queued work on it finishes first.
  auto it = opened_.find(reinterpret_cast<uintptr_t>(allocation.data));
  if (it == opened_.end()) {
    Die(absl::StrCat(name_, ": CloseShared of ", absl::Hex(allocation.data),
                     ", which OpenShared did not return"));
  }
  if (--it->second.second == 0) opened_.erase(it);
  --stats_.live_shared;
}

void FakeDeviceMemorySpace::Enqueue(std::function<absl::Status()> op) {
  queue_.push_back(std::move(op));
  ++stats_.ops_queued;
}

absl::Status FakeDeviceMemorySpace::DrainLocked() {
  std::vector<std::function<absl::Status()>> queue;
  queue.swap(queue_);
  for (auto& op : queue) {
    absl::Status s = op();
    if (!s.ok() && queued_error_.ok()) queued_error_ = s;
  }
  return std::exchange(queued_error_, absl::OkStatus());
}

absl::StatusOr<Allocation> FakeDeviceMemorySpace::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("allocation of ", bytes, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  if (bytes > capacity_ - stats_.live_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of ", name_,
                                                     " memory (", stats_.live_bytes, " of ",
                                                     capacity_, " bytes in use)"));
  }
  const int64_t real = std::max<int64_t>(64, (bytes + 63) / 64 * 64);
  void* p = ::operator new(static_cast<size_t>(real), kAlignment, std::nothrow);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of ", name_, " memory"));
  }
  blocks_.emplace(reinterpret_cast<uintptr_t>(p), bytes);
  ++stats_.live_allocations;
  stats_.live_bytes += bytes;
  return Allocation{static_cast<char*>(p), bytes};
}

void FakeDeviceMemorySpace::Free(const Allocation& allocation) {
  if (allocation.data == nullptr) return;
  absl::MutexLock lock(&mu_);
  DrainLocked().IgnoreError();  // As cudaFree: queued work on the block finishes first.
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(allocation.data));
  if (it == blocks_.end()) {
    Die(absl::StrCat(name_, ": Free of ", absl::Hex(allocation.data),
                     ", which is not the start of a live allocation of this space"));
  }
  --stats_.live_allocations;
  stats_.live_bytes -= it->second;
  blocks_.erase(it);
  ::operator delete(allocation.data, kAlignment);
}

absl::Status FakeDeviceMemorySpace::HostCopy(void* dst, const void* src, int64_t bytes,
                                             bool to_device) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("copy of ", bytes, " bytes"));
  absl::MutexLock lock(&mu_);
  if (to_device) {
    CheckDevice(dst, bytes, "CopyFromHost destination");
    CheckHost(src, bytes, "CopyFromHost source");
  } else {
    CheckHost(dst, bytes, "CopyToHost destination");
    CheckDevice(src, bytes, "CopyToHost source");
  }
  absl::Status s = DrainLocked();
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  ++(to_device ? stats_.copies_to_device : stats_.copies_to_host);
  (to_device ? stats_.bytes_to_device : stats_.bytes_to_host) += bytes;
  return s;
}

absl::Status FakeDeviceMemorySpace::CopyFromHost(void* dst, const void* src, int64_t bytes) {
  return HostCopy(dst, src, bytes, /*to_device=*/true);
}

absl::Status FakeDeviceMemorySpace::CopyToHost(void* dst, const void* src, int64_t bytes) {
  return HostCopy(dst, src, bytes, /*to_device=*/false);
}

absl::Status FakeDeviceMemorySpace::FillZeros(void* data, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("zero fill of ", bytes, " bytes"));
  absl::MutexLock lock(&mu_);
  CheckDevice(data, bytes, "FillZeros");
  if (bytes == 0) return absl::OkStatus();
  Enqueue([data, bytes] {
    std::memset(data, 0, static_cast<size_t>(bytes));
    return absl::OkStatus();
  });
  return absl::OkStatus();
}

absl::Status FakeDeviceMemorySpace::FillIdentity(void* data, int64_t count, DType dtype,
                                                 ReduceOp op) {
  // Argument errors at the call, as a kernel launcher checks before launching.
  if (absl::Status s = CheckIdentityFill(count, dtype, op); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  CheckDevice(data, count * ElementSize(dtype), "FillIdentity");
  if (count == 0) return absl::OkStatus();
  Enqueue([=] { return FillReduceIdentity(data, count, dtype, op); });
  return absl::OkStatus();
}

absl::Status FakeDeviceMemorySpace::EnqueueBoxOp(absl::string_view what, const Box& region,
                                                 const void* src, const Box& src_box, void* dst,
                                                 const Box& dst_box, int64_t element_size,
                                                 std::function<absl::Status()> op) {
  absl::StatusOr<BoxCopyRuns> runs = PlanBoxCopy(region, src_box, dst_box, element_size);
  if (!runs.ok()) return runs.status();
  if (runs->empty) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  CheckDevice(src, src_box.Volume() * element_size, absl::StrCat(what, " source").c_str());
  CheckDevice(dst, dst_box.Volume() * element_size, absl::StrCat(what, " destination").c_str());
  Enqueue(std::move(op));
  return absl::OkStatus();
}

absl::Status FakeDeviceMemorySpace::CopyBox(const Box& region, const void* src, const Box& src_box,
                                            void* dst, const Box& dst_box, int64_t element_size) {
  return EnqueueBoxOp("CopyBox", region, src, src_box, dst, dst_box, element_size, [=] {
    return shardcoord::CopyBox(region, src, src_box, dst, dst_box, element_size);
  });
}

absl::Status FakeDeviceMemorySpace::ReduceIntoBox(const Box& region, const void* src,
                                                  const Box& src_box, void* dst, const Box& dst_box,
                                                  DType dtype, ReduceOp op) {
  if (absl::Status s = CheckElementwiseReduce(dtype, op); !s.ok()) return s;
  return EnqueueBoxOp("ReduceIntoBox", region, src, src_box, dst, dst_box, ElementSize(dtype), [=] {
    return shardcoord::ReduceIntoBox(region, src, src_box, dst, dst_box, dtype, op);
  });
}

absl::Status FakeDeviceMemorySpace::DivideBox(void* data, int64_t count, DType dtype,
                                              int64_t divisor) {
  const int64_t element_size = ElementSize(dtype);
  if (element_size <= 0 || count < 0 || divisor <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("division of ", count, " elements of dtype ",
                                                   static_cast<int>(dtype), " by ", divisor));
  }
  absl::MutexLock lock(&mu_);
  CheckDevice(data, count * element_size, "DivideBox");
  if (count == 0) return absl::OkStatus();
  Enqueue([=] { return shardcoord::DivideBox(data, count, dtype, divisor); });
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FakeDeviceMemorySpace::ChunkChecksum(const void* data, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("checksum of ", bytes, " bytes"));
  absl::MutexLock lock(&mu_);
  CheckDevice(data, bytes, "ChunkChecksum");
  if (absl::Status s = DrainLocked(); !s.ok()) return s;
  ++stats_.checksums;
  return shardcoord::ChunkChecksum(data, bytes);
}

absl::Status FakeDeviceMemorySpace::Synchronize() {
  absl::MutexLock lock(&mu_);
  ++stats_.synchronizes;
  return DrainLocked();
}

}  // namespace shardcoord
