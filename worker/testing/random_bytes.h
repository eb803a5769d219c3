#ifndef SHARDCOORD_WORKER_TESTING_RANDOM_BYTES_H_
#define SHARDCOORD_WORKER_TESTING_RANDOM_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace shardcoord {
namespace testing_util {

// `n` bytes from `rng`, one draw each.
inline std::vector<unsigned char> RandomBytes(size_t n, std::mt19937& rng) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// `n` bytes from a generator seeded with `seed`: the same bytes for the same seed.
inline std::vector<unsigned char> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  return RandomBytes(n, rng);
}

}  // namespace testing_util
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_TESTING_RANDOM_BYTES_H_
