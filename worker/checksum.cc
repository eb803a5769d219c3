#include "worker/checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <vector>

namespace shardcoord {

uint64_t ChunkChecksum(const void* data, int64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  const int64_t blocks = bytes <= 0 ? 0 : (bytes + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
  std::vector<unsigned char> hashes(static_cast<size_t>(blocks) * 8);
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t begin = i * kChecksumBlockBytes;
    const int64_t len = std::min(kChecksumBlockBytes, bytes - begin);
    const uint64_t h = XXH64(p + begin, static_cast<size_t>(len), 0);
    // Explicit little-endian, independent of the host's byte order.
    for (int b = 0; b < 8; ++b) hashes[i * 8 + b] = static_cast<unsigned char>(h >> (8 * b));
  }
  return XXH64(hashes.data(), hashes.size(), 0);
}

}  // namespace shardcoord
