#ifndef SHARDCOORD_WORKER_BUFFERS_BUFFER_STORE_H_
#define SHARDCOORD_WORKER_BUFFERS_BUFFER_STORE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "worker/memory/memory_space.h"

namespace shardcoord {

// Memory a user process lent the worker for one rank's local buffer of an attached tensor
// (worker/buffers/attach_registry.h): a mapping of its shared memory, its plain memory reached with
// process_vm_readv/writev, or an opened CUDA IPC handle. Destroying it releases the worker's
// access (unmaps, closes); the memory itself stays the process's. Once detached (the process
// detached it, exited or died) no plan may store it as a new version.
class LentMemory {
 public:
  virtual ~LentMemory() = default;
  // "shared memory of process 1234" (logs and errors).
  virtual std::string Describe() const = 0;

  void MarkDetached() { detached_.store(true, std::memory_order_release); }
  bool detached() const { return detached_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> detached_{false};
};

// One rank's local buffer of one tensor version: `chunks` says where each chunk's elements
// live (row-major, from element `local_offset`). The bytes live in a MemorySpace (host memory
// unless the worker keeps its buffers on a GPU; the name is historical): when
// !space().is_host(), data() and chunk_data() are the space's pointers, for the space's
// operations and the communicator only. The memory is 64-byte aligned and not initialised.
// The metadata is fixed at creation; the bytes are written by whoever created the buffer
// (executor, Fill, WriteChunk) before it is published.
class HostBuffer {
 public:
  // Validates that every chunk lies inside the `chunks.local_elements` buffer.
  // INVALID_ARGUMENT naming the chunk; RESOURCE_EXHAUSTED when the allocation fails.
  // `space` (null: HostMemorySpace::Global()) must outlive the buffer.
  static absl::StatusOr<std::shared_ptr<HostBuffer>> Create(DType dtype, RankChunks chunks,
                                                            MemorySpace* space = nullptr);

  // One buffer of CreateMany; its chunk description is shared, not copied (a resident
  // fragment's shape, aliased).
  struct Spec {
    DType dtype;
    std::shared_ptr<const RankChunks> chunks;
  };
  // Creates every buffer of `specs` in one allocation of `space` (each 64-byte aligned in it),
  // freed when the last of them goes: a run's targets cost one allocation and no chunk copies,
  // not one of each per member (a warm transfer run of 10^4 members creates 10^4 targets).
  // Errors as Create's, naming the spec's index.
  static absl::StatusOr<std::vector<std::shared_ptr<HostBuffer>>> CreateMany(
      absl::Span<const Spec> specs, MemorySpace* space = nullptr);
  // A buffer over lent memory (not an allocation of `space`): `data` is where it starts as
  // `space`'s memory, valid while `lent` lives (the buffer holds it). INVALID_ARGUMENT as
  // Create. Never counts as the worker's own memory.
  static absl::StatusOr<std::shared_ptr<HostBuffer>> Wrap(DType dtype, RankChunks chunks,
                                                          MemorySpace* space, char* data,
                                                          std::shared_ptr<LentMemory> lent);

  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  DType dtype() const { return dtype_; }
  int64_t element_size() const { return element_size_; }
  const RankChunks& chunks() const { return *chunks_; }
  int64_t bytes() const { return bytes_; }
  char* data() { return data_; }
  const char* data() const { return data_; }

  // Chunk `i`'s first byte and byte count.
  char* chunk_data(size_t i) { return data_ + chunks_->chunks[i].local_offset * element_size_; }
  const char* chunk_data(size_t i) const {
    return data_ + chunks_->chunks[i].local_offset * element_size_;
  }
  int64_t chunk_bytes(size_t i) const { return chunks_->chunks[i].box.Volume() * element_size_; }

  // Where the bytes live.
  MemorySpace& space() const { return *space_; }
  // Lent by a user process (Wrap), or null: the worker's own allocation.
  LentMemory* lent() const { return lent_.get(); }
  bool attached() const { return lent_ != nullptr; }

  // ChunkChecksum of every chunk, in chunk order, computed by the space (after the work
  // already queued there).
  absl::StatusOr<std::vector<uint64_t>> Checksums() const;
  // Every chunk's bytes, for a space's ChunkChecksums over several buffers at once.
  std::vector<ChecksumRegion> ChecksumRegions() const;

 private:
  // `shared`: the allocation of CreateMany the buffer is part of (then `allocation` is not
  // the buffer's to free), or null.
  HostBuffer(DType dtype, std::shared_ptr<const RankChunks> chunks, int64_t bytes,
             MemorySpace* space, Allocation allocation, std::shared_ptr<LentMemory> lent,
             std::shared_ptr<const void> shared);
  // The local buffer's bytes, after checking every chunk lies inside it.
  static absl::StatusOr<int64_t> CheckChunks(DType dtype, const RankChunks& chunks);

  const DType dtype_;
  const int64_t element_size_;
  const std::shared_ptr<const RankChunks> chunks_;
  const int64_t bytes_;
  MemorySpace* const space_;
  const Allocation allocation_;  // Empty for lent memory and for a part of CreateMany's.
  const std::shared_ptr<LentMemory> lent_;
  const std::shared_ptr<const void> shared_;  // CreateMany's allocation, or null.
  char* const data_;
};

// Chunk buffers by (tensor, version). Thread-safe. Handles are shared_ptrs, so a fragment that
// is still reading or writing a buffer keeps it alive after Drop removed it from the map.
class BufferStore {
 public:
  // ALREADY_EXISTS when (tensor, version) is taken.
  absl::Status Insert(absl::string_view tensor, int64_t version,
                      std::shared_ptr<HostBuffer> buffer);
  // Inserts or replaces.
  void Put(absl::string_view tensor, int64_t version, std::shared_ptr<HostBuffer> buffer);
  // Put, but ABORTED for lent memory that was detached: checked under the store's lock, so
  // a DropLent after MarkDetached never leaves a buffer behind.
  absl::Status Store(absl::string_view tensor, int64_t version, std::shared_ptr<HostBuffer> buffer);
  // Drops every version whose buffer is over `lent`; returns how many.
  int DropLent(const LentMemory* lent);
  // NOT_FOUND naming the tensor and version.
  absl::StatusOr<std::shared_ptr<HostBuffer>> Get(absl::string_view tensor, int64_t version) const;
  // nullptr when absent.
  std::shared_ptr<HostBuffer> Find(absl::string_view tensor, int64_t version) const;
  // True if it was there.
  bool Drop(absl::string_view tensor, int64_t version);
  // Drops every version; returns how many.
  int DropTensor(absl::string_view tensor);

  struct Entry {
    std::string tensor;
    int64_t version = 0;
    int64_t bytes = 0;
  };
  std::vector<Entry> List() const;  // By tensor, then version.
  // Bytes of the worker's own buffers; LentBytes: of the lent ones (their processes' memory,
  // each counted once though a Copy in place holds it under two versions until it ends).
  int64_t TotalBytes() const;
  int64_t LentBytes() const;

 private:
  mutable absl::Mutex mu_;
  // Hashed by name: a fused group looks up, stores and drops a buffer per member on every
  // worker, among thousands of tensors (a tree walk was a cache miss per level).
  absl::flat_hash_map<std::string, std::map<int64_t, std::shared_ptr<HostBuffer>>> buffers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_BUFFERS_BUFFER_STORE_H_
