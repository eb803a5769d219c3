#ifndef SHARDCOORD_SHARDING_FLOAT16_H_
#define SHARDCOORD_SHARDING_FLOAT16_H_

#include <cstdint>

namespace shardcoord {

// IEEE binary16 and bfloat16 conversions. Float to 16-bit rounds to nearest even; overflow
// gives infinity; NaN stays NaN (quieted).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_FLOAT16_H_
