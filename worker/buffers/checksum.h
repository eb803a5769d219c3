#ifndef SHARDCOORD_WORKER_BUFFERS_CHECKSUM_H_
#define SHARDCOORD_WORKER_BUFFERS_CHECKSUM_H_

#include <cstdint>
#include <vector>

namespace shardcoord {

// Block size of the chunk checksum: 1 MiB.
constexpr int64_t kChecksumBlockBytes = int64_t{1} << 20;

// Checksum of a chunk's bytes, defined block-wise so a GPU can compute the blocks in
// parallel and every backend (CPU, NCCL/CUDA) gets the same value:
//
//   n      = bytes
//   B      = kChecksumBlockBytes (1 << 20)
//   k      = ceil(n / B)                       (0 when n == 0)
//   h[i]   = XXH64(data + i*B, min(B, n - i*B), seed = 0)      for i in [0, k)
//   H      = the k values h[0..k-1], each stored as 8 bytes little-endian, concatenated
//   result = XXH64(H, 8*k, seed = 0)
//
// So zero bytes give XXH64 of the empty input (0xEF46DB3751D8E999), and a chunk of at most
// one block gives XXH64 of the 8 little-endian bytes of XXH64(data). The value depends only
// on the bytes, not on the dtype or the chunk's box. `data` may be null when `bytes` is 0.
uint64_t ChunkChecksum(const void* data, int64_t bytes);

// A chunk to checksum: `bytes` at `data` (in whatever memory a MemorySpace says).
struct ChecksumRegion {
  const void* data = nullptr;
  int64_t bytes = 0;
};

// ChunkChecksum of a chunk given h[0..k-1], its blocks' XXH64s (for code that already hashed
// the blocks, e.g. to check them against stored hashes: the bytes are hashed once).
uint64_t ChunkChecksumOfBlocks(const std::vector<uint64_t>& block_hashes);

// ChunkChecksum of a chunk that is being written, built as its bytes become final: a block
// is hashed as soon as all its bytes are, while the rest of the chunk is still arriving
// (and while the block is likely still in cache), so little is left to hash at the end.
//
// Every write to the chunk after construction must be reported, as Final or as Dirty.
// Finish re-hashes every block that was hashed early but then written again (reported bytes
// beyond its size, or a Dirty range touching it), so overlapping or untracked writes cost
// time, never correctness. Not thread-safe.
class ChunkChecksumBuilder {
 public:
  ChunkChecksumBuilder(const void* data, int64_t bytes);

  // Bytes [begin, end) now hold their final values: hashes every block they complete.
  void Final(int64_t begin, int64_t end);
  // Bytes [begin, end) were written in a way that is not final (a reduction, a division):
  // their blocks are hashed in Finish.
  void Dirty(int64_t begin, int64_t end);
  // ChunkChecksum(data, bytes) of the chunk as it is now.
  uint64_t Finish();

  // Blocks hashed by Final whose hash Finish kept (for tests and benchmarks).
  int64_t early_blocks() const { return early_; }

 private:
  struct Block {
    int64_t final_bytes = 0;
    bool hashed = false;
    bool dirty = false;
    uint64_t hash = 0;
  };
  int64_t BlockLength(int64_t i) const;

  const unsigned char* data_;
  int64_t bytes_;
  std::vector<Block> blocks_;
  int64_t early_ = 0;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_BUFFERS_CHECKSUM_H_
