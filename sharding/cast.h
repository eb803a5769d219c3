#ifndef SHARDCOORD_SHARDING_CAST_H_
#define SHARDCOORD_SHARDING_CAST_H_

// Element conversions between dtypes ("casts"): the one definition that copies between
// tensors of different dtypes (Copy, CopyGroup, a checkpoint load with a dtype), the worker's
// executor, the coordinator's relay and the fills use. Pure host code.
//
// Which casts exist (CastAllowed):
// - any dtype to itself: the bytes are copied as they are (NaN payloads included);
// - float to float among f64, f32, bf16, f16, f8_e4m3 and f8_e5m2, either way;
// - f8_e8m0 to f64, f32 and bf16 (exact: every e8m0 value is a power of two they hold). Nothing
//   casts *to* e8m0: choosing a power-of-two scale (floor, ceil or nearest) is the block
//   quantizer's policy, not a cast;
// - integer widening that keeps every value: i8 -> i16 -> i32 -> i64 (to any wider signed),
//   u8 -> u16 -> u32 -> u64 (to any wider unsigned), unsigned to any strictly wider signed
//   (u8 -> i16/i32/i64, u16 -> i32/i64, u32 -> i64), and bool to every integer dtype (0 or 1;
//   any nonzero byte counts as true).
// Everything else is refused (CheckCast): float to integer, integer to float, narrowing or
// sign-changing integer casts, anything to bool.
//
// The rules of a float cast, exact for every bit pattern:
// - the source value is taken exactly and rounded once to the target: to nearest, ties to
//   even, subnormals of both source and target included (no flush to zero);
// - beyond the target's largest finite value: f64, f32, f16 and bf16 overflow to infinity
//   (IEEE); f8_e4m3 saturates to +-448 and f8_e5m2 to +-57344 (the magnitude that would round
//   past the largest finite value gives the largest finite value);
// - infinities: stay infinities, except to f8_e4m3, which has none: +-448;
// - NaN stays NaN: its sign kept, quiet (the mantissa's top bit set), with as many of the
//   payload's leading bits as the target holds; f8_e4m3's one NaN is S.1111.111, e8m0's 0xFF
//   becomes the positive quiet NaN with no payload;
// - zeros keep their sign.
// f32 -> bf16 and f32 -> f16 give exactly float16.h's FloatToBFloat16 and FloatToHalf.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "sharding/box.h"
#include "sharding/dtype.h"

namespace shardcoord {

// Whether elements of `from` may be converted to `to` (the table above).
bool CastAllowed(DType from, DType to);

// INVALID_ARGUMENT "cannot cast f32 to i8 (float to integer: ...)" naming both dtypes and why,
// unless CastAllowed.
absl::Status CheckCast(DType from, DType to);

// Whether src's values may be copied into dst (a Copy, a CopyGroup member, a prepared
// transfer's member): equal shapes, and dtypes equal or castable. INVALID_ARGUMENT
// "tensor 'DST' has shape [...] but src 'SRC' has shape [...]" or "tensor 'DST' dtype D cannot
// be cast from src 'SRC' dtype S: <CheckCast's reason>", for the caller to prefix with the
// field ("dst", "copies[3].dst").
absl::Status CheckCopyPair(absl::string_view src, const Shape& src_shape, DType src_dtype,
                           absl::string_view dst, const Shape& dst_shape, DType dst_dtype);

// The dtype a cast's elements travel in between ranks: the narrower of the two (by element
// size), so that a narrowing copy moves the target's bytes and a widening one the source's;
// `to` when they are the same size. `from` == `to`: that dtype.
DType WireDType(DType from, DType to);

// Which side of a transfer converts: none (no cast), the sender (packs `from` into the wire
// dtype `to`: narrowing, or same size) or the receiver (lands the wire dtype `from` into `to`:
// widening). A rank's local copies convert as they copy.
enum class CastSide : int { kNone = 0, kSender = 1, kReceiver = 2 };
CastSide CastSideOf(DType from, DType to);
std::string CastSideName(CastSide side);  // "none", "sender", "receiver"

// Converts `n` contiguous elements of `src_dtype` at `src` into `dst_dtype` at `dst` (the
// rules above). Unaligned memory is fine; src and dst must not overlap. INVALID_ARGUMENT
// (CheckCast's) for a cast that is not allowed, or a negative n.
absl::Status Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

// The f32 bits of every pattern of f8_e4m3 or f8_e5m2, by
// the rules above: the table Cast uses for those sources, computed once (thread-safe).
const uint32_t* F32BitsTable(DType one_byte_float);

// As sharding/box_copy.h's CopyBox, converting: the elements of `region` from `src` (a
// buffer of `src_dtype` for `src_box`) to `dst` (of `dst_dtype` for `dst_box`). A cast of a
// dtype to itself is CopyBox. Errors as CopyBox's and Cast's.
absl::Status CastBox(const Box& region, const void* src, const Box& src_box, DType src_dtype,
                     void* dst, const Box& dst_box, DType dst_dtype);

// One float value: `value` (any double) rounded to float dtype `dtype` by the rules above,
// as its bit pattern (in the low ElementSize(dtype) bytes). For fills. `dtype` must be a float
// dtype other than f8_e8m0 (0 otherwise).
uint64_t DoubleToFloatBits(double value, DType dtype);
// The value of bit pattern `bits` of float dtype `dtype` (exact; NaN for NaNs). 0 for a dtype
// that is not a float.
double FloatBitsToDouble(uint64_t bits, DType dtype);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_CAST_H_
