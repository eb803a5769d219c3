#ifndef SHARDCOORD_WORKER_BUFFERS_CHECKPOINT_IO_H_
#define SHARDCOORD_WORKER_BUFFERS_CHECKPOINT_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/shardcoord.pb.h"
#include "worker/buffers/buffer_store.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {

// A worker's side of checkpoints (issue 13): the only code that touches checkpoint storage.
// The coordinator plans who writes and reads what (sharding/checkpoint_plan.h) and sends each
// worker its part; no tensor byte passes through the coordinator. gRPC-free; the Worker
// service adapts it. Thread-safe (each call works on its own files; buffers are shared_ptrs).
//
// Files are written with write(2) from the buffers' memory and fsynced before the call
// returns, and read straight into the new buffer (host memory: with O_DIRECT where the plan
// aligned the run, up to kReadThreads runs at once) or through a host staging buffer of at
// most kStagingBytes (other memory spaces: a GPU). Every byte written is hashed (XXH64 of each
// entry, and of each block of rows) and every byte read is checked against the hashes the
// coordinator took from index.json.
class CheckpointIo {
 public:
  static constexpr int64_t kStagingBytes = int64_t{8} << 20;
  // Runs of one Read in flight at once (host memory).
  static constexpr size_t kReadThreads = 4;

  // `space` (null: host memory) is where new buffers go; both must outlive this. `root`
  // (from CanonicalRoot; empty: anywhere) is the directory every checkpoint path must lie
  // in: others are refused with PERMISSION_DENIED naming the field, the path and the root.
  CheckpointIo(BufferStore* buffers, MemorySpace* space = nullptr, std::string root = "");

  // The worker's --checkpoint-root as CheckpointIo takes it: an existing directory, absolute,
  // with every symbolic link resolved. INVALID_ARGUMENT naming the flag otherwise.
  static absl::StatusOr<std::string> CanonicalRoot(const std::string& root);

  absl::StatusOr<v1::WriteCheckpointResponse> Write(const v1::WriteCheckpointRequest& request);
  absl::StatusOr<v1::ReadCheckpointResponse> Read(const v1::ReadCheckpointRequest& request);
  absl::StatusOr<v1::ReadCheckpointIndexResponse> ReadIndex(
      const v1::ReadCheckpointIndexRequest& request);
  absl::Status Dir(const v1::CheckpointDirRequest& request);

 private:
  // CheckAbsolute, then under root_ once the part of `path` that exists is resolved as the
  // kernel would (links, "." and ".."): a path that leaves the root through a link is refused,
  // and so is a "." or ".." in the part that does not exist yet.
  absl::Status CheckPath(absl::string_view field, const std::string& path) const;

  BufferStore* const buffers_;
  MemorySpace* const space_;
  const std::string root_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_BUFFERS_CHECKPOINT_IO_H_
