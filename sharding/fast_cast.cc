#include "sharding/fast_cast.h"

#include "sharding/cast_bits.h"

namespace shardcoord {
namespace fast_cast {
namespace {

struct F8Table {
  uint32_t f32[256];

  explicit F8Table(int code) {
    for (uint32_t i = 0; i < 256; ++i) {
      f32[i] = static_cast<uint32_t>(cast_bits::CastElement(i, code, cast_bits::kF32));
    }
  }
};

}  // namespace

const uint32_t* F8ToF32Table(int code) {
  static const F8Table* e4m3 = new F8Table(cast_bits::kF8E4M3);  // Thread-safe statics.
  static const F8Table* e5m2 = new F8Table(cast_bits::kF8E5M2);
  return code == cast_bits::kF8E5M2 ? e5m2->f32 : e4m3->f32;
}

}  // namespace fast_cast
}  // namespace shardcoord
