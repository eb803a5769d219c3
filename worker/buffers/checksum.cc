#include "worker/buffers/checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <vector>

namespace shardcoord {

namespace {

int64_t BlockCount(int64_t bytes) {
  return bytes <= 0 ? 0 : (bytes + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
}

// The k block hashes, each as 8 little-endian bytes (independent of the host's byte order),
// hashed together.
uint64_t Combine(const std::vector<uint64_t>& block_hashes) {
  std::vector<unsigned char> bytes(block_hashes.size() * 8);
  for (size_t i = 0; i < block_hashes.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      bytes[i * 8 + b] = static_cast<unsigned char>(block_hashes[i] >> (8 * b));
    }
  }
  return XXH64(bytes.data(), bytes.size(), 0);
}

}  // namespace

uint64_t ChunkChecksum(const void* data, int64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::vector<uint64_t> hashes(static_cast<size_t>(BlockCount(bytes)));
  for (size_t i = 0; i < hashes.size(); ++i) {
    const int64_t begin = static_cast<int64_t>(i) * kChecksumBlockBytes;
    const int64_t len = std::min(kChecksumBlockBytes, bytes - begin);
    hashes[i] = XXH64(p + begin, static_cast<size_t>(len), 0);
  }
  return Combine(hashes);
}

uint64_t ChunkChecksumOfBlocks(const std::vector<uint64_t>& block_hashes) {
  return Combine(block_hashes);
}

ChunkChecksumBuilder::ChunkChecksumBuilder(const void* data, int64_t bytes)
    : data_(static_cast<const unsigned char*>(data)),
      bytes_(std::max<int64_t>(bytes, 0)),
      blocks_(static_cast<size_t>(BlockCount(bytes))) {}

int64_t ChunkChecksumBuilder::BlockLength(int64_t i) const {
  return std::min(kChecksumBlockBytes, bytes_ - i * kChecksumBlockBytes);
}

void ChunkChecksumBuilder::Final(int64_t begin, int64_t end) {
  begin = std::max<int64_t>(begin, 0);
  end = std::min(end, bytes_);
  while (begin < end) {
    const int64_t i = begin / kChecksumBlockBytes;
    const int64_t block_end = std::min((i + 1) * kChecksumBlockBytes, end);
    Block& b = blocks_[i];
    b.final_bytes += block_end - begin;
    if (!b.hashed && !b.dirty && b.final_bytes == BlockLength(i)) {
      b.hash = XXH64(data_ + i * kChecksumBlockBytes, static_cast<size_t>(BlockLength(i)), 0);
      b.hashed = true;
    }
    begin = block_end;
  }
}

void ChunkChecksumBuilder::Dirty(int64_t begin, int64_t end) {
  begin = std::max<int64_t>(begin, 0);
  end = std::min(end, bytes_);
  if (begin >= end) return;
  for (int64_t i = begin / kChecksumBlockBytes; i <= (end - 1) / kChecksumBlockBytes; ++i) {
    blocks_[i].dirty = true;
  }
}

uint64_t ChunkChecksumBuilder::Finish() {
  std::vector<uint64_t> hashes(blocks_.size());
  early_ = 0;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    const int64_t len = BlockLength(static_cast<int64_t>(i));
    if (b.hashed && !b.dirty && b.final_bytes == len) {
      hashes[i] = b.hash;
      ++early_;
    } else {
      hashes[i] = XXH64(data_ + i * kChecksumBlockBytes, static_cast<size_t>(len), 0);
    }
  }
  return Combine(hashes);
}

}  // namespace shardcoord
