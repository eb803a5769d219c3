#ifndef SHARDCOORD_WORKER_CHECKSUM_H_
#define SHARDCOORD_WORKER_CHECKSUM_H_

#include <cstdint>

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

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_CHECKSUM_H_
