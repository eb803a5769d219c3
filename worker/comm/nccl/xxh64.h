#ifndef SHARDCOORD_WORKER_COMM_NCCL_XXH64_H_
#define SHARDCOORD_WORKER_COMM_NCCL_XXH64_H_

// XXH64, written from the public algorithm description (xxhash's doc/xxhash_spec.md), as
// functions that nvcc compiles for the device and gcc for the host: the checksum kernel and
// the host unit test (which compares against libxxhash) run the same code. Plain C++ only:
// this header is included by .cu files.

#include <cstdint>
#include <cstring>

#include "worker/comm/nccl/hd.h"

namespace shardcoord {
namespace nccl {

constexpr uint64_t kXxhPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kXxhPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kXxhPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kXxhPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kXxhPrime5 = 0x27D4EB2F165667C5ULL;

SC_HD inline uint64_t XxhRotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Input words are little-endian whatever the machine; an aligned native load is only a
// shortcut where the machine is little-endian too (every GPU, x86, arm64 Linux).
SC_HD inline uint64_t XxhRead64(const unsigned char* p) {
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
#elif defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint64_t w;
  memcpy(&w, p, 8);
  return w;
#endif
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

SC_HD inline uint32_t XxhRead32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

SC_HD inline uint64_t XxhRound(uint64_t acc, uint64_t lane) {
  acc += lane * kXxhPrime2;
  acc = XxhRotl(acc, 31);
  return acc * kXxhPrime1;
}

SC_HD inline uint64_t XxhMerge(uint64_t acc, uint64_t lane_acc) {
  acc ^= XxhRound(0, lane_acc);
  return acc * kXxhPrime1 + kXxhPrime4;
}

// XXH64's four accumulators over 32-byte stripes (inputs of at least 32 bytes).
struct XxhLanes {
  uint64_t v1, v2, v3, v4;
};

SC_HD inline XxhLanes XxhStartLanes(uint64_t seed) {
  return XxhLanes{seed + kXxhPrime1 + kXxhPrime2, seed + kXxhPrime2, seed, seed - kXxhPrime1};
}

// One stripe: its four little-endian words.
SC_HD inline void XxhStripe(XxhLanes* l, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  l->v1 = XxhRound(l->v1, a);
  l->v2 = XxhRound(l->v2, b);
  l->v3 = XxhRound(l->v3, c);
  l->v4 = XxhRound(l->v4, d);
}

// The rest of XXH64 once every whole stripe went through `lanes` (null when len < 32): the
// lanes' merge, the tail [p, end) and the avalanche.
SC_HD inline uint64_t XxhFinish(const XxhLanes* lanes, const unsigned char* p,
                                const unsigned char* end, uint64_t len, uint64_t seed) {
  uint64_t acc;
  if (lanes != nullptr) {
    acc = XxhRotl(lanes->v1, 1) + XxhRotl(lanes->v2, 7) + XxhRotl(lanes->v3, 12) +
          XxhRotl(lanes->v4, 18);
    acc = XxhMerge(acc, lanes->v1);
    acc = XxhMerge(acc, lanes->v2);
    acc = XxhMerge(acc, lanes->v3);
    acc = XxhMerge(acc, lanes->v4);
  } else {
    acc = seed + kXxhPrime5;
  }
  acc += len;
  // The tail: 8-byte words, then at most one 4-byte word, then single bytes.
  while (end - p >= 8) {
    acc ^= XxhRound(0, XxhRead64(p));
    acc = XxhRotl(acc, 27) * kXxhPrime1 + kXxhPrime4;
    p += 8;
  }
  if (end - p >= 4) {
    acc ^= static_cast<uint64_t>(XxhRead32(p)) * kXxhPrime1;
    acc = XxhRotl(acc, 23) * kXxhPrime2 + kXxhPrime3;
    p += 4;
  }
  while (p < end) {
    acc ^= static_cast<uint64_t>(*p) * kXxhPrime5;
    acc = XxhRotl(acc, 11) * kXxhPrime1;
    ++p;
  }
  // Avalanche.
  acc ^= acc >> 33;
  acc *= kXxhPrime2;
  acc ^= acc >> 29;
  acc *= kXxhPrime3;
  acc ^= acc >> 32;
  return acc;
}

// XXH64 of `len` bytes at `data`.
SC_HD inline uint64_t Xxh64(const void* data, uint64_t len, uint64_t seed) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + len;
  if (len < 32) return XxhFinish(nullptr, p, end, len, seed);
  XxhLanes lanes = XxhStartLanes(seed);
  const unsigned char* const last_stripe = end - 32;
  do {
    XxhStripe(&lanes, XxhRead64(p), XxhRead64(p + 8), XxhRead64(p + 16), XxhRead64(p + 24));
    p += 32;
  } while (p <= last_stripe);
  return XxhFinish(&lanes, p, end, len, seed);
}

// The chunk checksum of worker/buffers/checksum.h, split the way the device computes it: one XXH64
// per kChecksumBlockBytes block (block i hashes [i*B, min((i+1)*B, n))), then XXH64 of the
// block hashes as little-endian 8-byte words. Kept equal to worker/buffers/checksum.h's constant.
constexpr int64_t kDeviceChecksumBlockBytes = int64_t{1} << 20;

SC_HD inline int64_t ChecksumBlockCount(int64_t bytes) {
  return bytes <= 0 ? 0 : (bytes + kDeviceChecksumBlockBytes - 1) / kDeviceChecksumBlockBytes;
}

// Bytes of block `block` of a chunk of `bytes`: B, or what is left for the last block.
SC_HD inline int64_t ChecksumBlockLength(int64_t bytes, int64_t block) {
  const int64_t left = bytes - block * kDeviceChecksumBlockBytes;
  return left < kDeviceChecksumBlockBytes ? left : kDeviceChecksumBlockBytes;
}

// h[block] with the portable loop (the device kernel loads ahead: kernels.cu).
SC_HD inline uint64_t ChecksumBlockHash(const void* data, int64_t bytes, int64_t block) {
  return Xxh64(static_cast<const unsigned char*>(data) + block * kDeviceChecksumBlockBytes,
               static_cast<uint64_t>(ChecksumBlockLength(bytes, block)), 0);
}

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_XXH64_H_
