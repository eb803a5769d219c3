#ifndef SHARDCOORD_WORKER_BUFFER_STORE_H_
#define SHARDCOORD_WORKER_BUFFER_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "worker/memory_space.h"

namespace shardcoord {

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

  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  DType dtype() const { return dtype_; }
  int64_t element_size() const { return element_size_; }
  const RankChunks& chunks() const { return chunks_; }
  int64_t bytes() const { return bytes_; }
  char* data() { return data_; }
  const char* data() const { return data_; }

  // Chunk `i`'s first byte and byte count.
  char* chunk_data(size_t i) { return data_ + chunks_.chunks[i].local_offset * element_size_; }
  const char* chunk_data(size_t i) const {
    return data_ + chunks_.chunks[i].local_offset * element_size_;
  }
  int64_t chunk_bytes(size_t i) const { return chunks_.chunks[i].box.Volume() * element_size_; }

  // Where the bytes live.
  MemorySpace& space() const { return *space_; }

  // ChunkChecksum of every chunk, in chunk order, computed by the space (after the work
  // already queued there).
  absl::StatusOr<std::vector<uint64_t>> Checksums() const;

 private:
  HostBuffer(DType dtype, RankChunks chunks, int64_t bytes, MemorySpace* space,
             Allocation allocation);

  const DType dtype_;
  const int64_t element_size_;
  const RankChunks chunks_;
  const int64_t bytes_;
  MemorySpace* const space_;
  const Allocation allocation_;
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
  std::vector<Entry> List() const;
  int64_t TotalBytes() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::map<int64_t, std::shared_ptr<HostBuffer>>, std::less<>> buffers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_BUFFER_STORE_H_
