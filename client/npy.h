#ifndef SHARDCOORD_CLIENT_NPY_H_
#define SHARDCOORD_CLIENT_NPY_H_

// NumPy .npy files (format versions 1.0, 2.0 and 3.0), so that `shardctl tensor download`
// writes what numpy.load reads and `upload` reads what numpy.save writes. Only what a tensor
// can be: little-endian numeric dtypes, C (row-major) order.
//
// bf16 has no NumPy dtype. Its raw bits are written as '<u2' (view them with
// ml_dtypes.bfloat16, or as float32 via `(a.astype(np.uint32) << 16).view(np.float32)`),
// and '<u2' reads back as bf16 only when the caller asks for it: any other '<u2' file would
// silently become garbage floats.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/box.h"
#include "sharding/dtype.h"

namespace shardcoord {

struct NpyArray {
  DType dtype = DType::kF32;
  Shape shape;       // Empty for a 0-d array.
  std::string data;  // Row-major elements, little-endian.
};

struct NpyReadOptions {
  // Read '<u2' arrays as bf16 bit patterns (what WriteNpy stores for bf16).
  bool u2_as_bf16 = false;
};

// The .npy descr of a dtype: "<f4", "|i1", ...; bf16 gives "<u2".
std::string NpyDescr(DType dtype);

// Parses a whole .npy file held in memory. Every malformed input is INVALID_ARGUMENT with a
// message that names the problem (bad magic, unsupported version, truncated header, a header
// that is not the expected dict, an unsupported dtype, fortran_order True, a data length
// that does not match the shape).
absl::StatusOr<NpyArray> ParseNpy(absl::string_view file, const NpyReadOptions& options = {});

// The header (magic, version, length, padded dict) for an array; the data follows it.
// Version 1.0 unless the header needs more than 65535 bytes. INVALID_ARGUMENT for a bad
// shape (negative dims, element count or byte size overflowing int64).
absl::StatusOr<std::string> NpyHeader(DType dtype, const Shape& shape);

// A whole .npy file. `data` must hold exactly the shape's bytes (INVALID_ARGUMENT if not).
absl::StatusOr<std::string> SerializeNpy(DType dtype, const Shape& shape, absl::string_view data);

// File helpers: NOT_FOUND / PERMISSION_DENIED / INTERNAL for I/O errors (naming the path),
// and ParseNpy's errors prefixed with the path.
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path, const NpyReadOptions& options = {});
absl::Status WriteNpyFile(const std::string& path, DType dtype, const Shape& shape,
                          absl::string_view data);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_NPY_H_
