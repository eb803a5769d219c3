#include "worker/memory/process_memory_space.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/buffers/checksum.h"
#include "worker/comm/gloo/same_host.h"

namespace shardcoord {

std::string ProcessMemorySpace::name() const { return absl::StrCat("process ", pid_); }

absl::Status ProcessMemorySpace::Unsupported(const char* op) const {
  return absl::FailedPreconditionError(absl::StrCat(op, " does not run on memory of ", name(),
                                                    ": copy it into the worker's memory first"));
}

absl::StatusOr<Allocation> ProcessMemorySpace::Allocate(int64_t) {
  return absl::FailedPreconditionError(
      absl::StrCat("the worker cannot allocate memory in ", name()));
}

absl::Status ProcessMemorySpace::CopyFromHost(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  return WritePeerMemory(pid_, reinterpret_cast<uint64_t>(dst),
                         MemoryRuns{{static_cast<const char*>(src), bytes}});
}

absl::Status ProcessMemorySpace::CopyToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  return ReadPeerMemory(pid_, reinterpret_cast<uint64_t>(src), dst, bytes);
}

absl::Status ProcessMemorySpace::FillZeros(void*, int64_t) { return Unsupported("FillZeros"); }

absl::Status ProcessMemorySpace::FillIdentity(void*, int64_t, DType, ReduceOp) {
  return Unsupported("FillIdentity");
}

absl::Status ProcessMemorySpace::CopyBox(const Box&, const void*, const Box&, void*, const Box&,
                                         int64_t) {
  return Unsupported("CopyBox");
}

absl::Status ProcessMemorySpace::ReduceIntoBox(const Box&, const void*, const Box&, void*,
                                               const Box&, DType, ReduceOp) {
  return Unsupported("ReduceIntoBox");
}

absl::Status ProcessMemorySpace::DivideBox(void*, int64_t, DType, int64_t) {
  return Unsupported("DivideBox");
}

absl::StatusOr<uint64_t> ProcessMemorySpace::ChunkChecksum(const void* data, int64_t bytes) {
  std::vector<char> copy(static_cast<size_t>(std::max<int64_t>(bytes, 0)));
  if (absl::Status s = CopyToHost(copy.data(), data, bytes); !s.ok()) return s;
  return shardcoord::ChunkChecksum(copy.data(), bytes);
}

}  // namespace shardcoord
