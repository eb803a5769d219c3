#ifndef SHARDCOORD_COORDINATOR_TESTING_FLOAT_DATA_H_
#define SHARDCOORD_COORDINATOR_TESTING_FLOAT_DATA_H_

#include <cstring>
#include <string>

namespace shardcoord {

// The bytes of `n` f32 values base, base + 1, ...: a tensor's data as uploads send it.
inline std::string Floats(int n, float base) {
  std::string out(n * sizeof(float), '\0');
  for (int i = 0; i < n; ++i) {
    const float v = base + i;
    std::memcpy(&out[i * sizeof(float)], &v, sizeof(float));
  }
  return out;
}

// The `i`th f32 value of `data`.
inline float FloatAt(const std::string& data, int i) {
  float v;
  std::memcpy(&v, &data[i * sizeof(float)], sizeof(float));
  return v;
}

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TESTING_FLOAT_DATA_H_
