#ifndef SHARDCOORD_CLIENT_NPY_H_
#define SHARDCOORD_CLIENT_NPY_H_

// NumPy .npy files (format versions 1.0, 2.0 and 3.0), so that `shardctl tensor download`
// writes what numpy.load reads and `upload` reads what numpy.save writes. Only what a tensor
// can be: little-endian numeric dtypes, C (row-major) order.
//
// bf16 and the float8s (f8_e4m3, f8_e5m2, f8_e8m0) have no NumPy dtype. Their raw bits are
// written as '<u2' and '|u1' (view them with ml_dtypes.bfloat16, float8_e4m3fn,
// float8_e5m2, float8_e8m0fnu), and such files read back as those dtypes only when the
// caller asks for it (NpyReadOptions): otherwise they are u16 and u8 arrays, as NumPy says.
// bool is '|b1', i16/u16/u32/u64 '<i2' '<u2' '<u4' '<u8'.

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
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
  // Read arrays of the unsigned integer of this dtype's size as its bit patterns: bf16 for
  // '<u2', a float8 for '|u1'. Empty, or a dtype NumPy has: the file's own dtype.
  std::optional<DType> bits_of;
};

// Whether NumPy has the dtype (false: bf16 and the float8s, stored as their bits).
bool NpyHasDType(DType dtype);

// The .npy descr of a dtype: "<f4", "|i1", ...; bf16 gives "<u2".
std::string NpyDescr(DType dtype);

// Parses a whole .npy file held in memory. Every malformed input is INVALID_ARGUMENT with a
// message that names the problem (bad magic, unsupported version, truncated header, a header
// that is not the expected dict, an unsupported dtype, fortran_order True, a data length
// that does not match the shape).
absl::StatusOr<NpyArray> ParseNpy(absl::string_view file, const NpyReadOptions& options = {});

// What an .npy header says: the array's dtype and shape, and where its data starts.
struct NpyFileHeader {
  DType dtype = DType::kF32;
  Shape shape;
  std::string descr;        // As written in the file ("<f4").
  int64_t data_offset = 0;  // Bytes before the data.
  int64_t data_bytes = 0;   // What the shape and dtype need.
};

// Parses the header at the start of `file`; only the header needs to be there. ParseNpy's
// errors but the data length.
absl::StatusOr<NpyFileHeader> ParseNpyHeader(absl::string_view file,
                                             const NpyReadOptions& options = {});

// INVALID_ARGUMENT (as ParseNpy) unless `data_size` is what the header needs.
absl::Status CheckNpyDataSize(const NpyFileHeader& header, uint64_t data_size);

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

// Reads an .npy file's data in pieces (uploads of arrays larger than memory). Open checks
// the header and that the file holds exactly the data it announces, with ReadNpyFile's
// errors, before any data is read.
class NpyFileReader {
 public:
  static absl::StatusOr<std::unique_ptr<NpyFileReader>> Open(const std::string& path,
                                                             const NpyReadOptions& options = {});

  // A raw file (`shardctl tensor upload --raw`): C-order little-endian elements of `dtype`
  // and nothing else; INVALID_ARGUMENT unless its size is the shape's bytes.
  static absl::StatusOr<std::unique_ptr<NpyFileReader>> OpenRaw(const std::string& path,
                                                                DType dtype, const Shape& shape);

  const NpyFileHeader& header() const { return header_; }
  // The next at most `max_bytes` bytes of data into `*out` (replaced); empty at the end.
  // INTERNAL on an I/O error.
  absl::Status Read(size_t max_bytes, std::string* out);
  // Back to the first data byte (an upload restarted after a failover sends it all again).
  // INTERNAL on an I/O error.
  absl::Status Rewind();

 private:
  NpyFileReader() = default;

  std::string path_;
  std::ifstream in_;
  NpyFileHeader header_;
  int64_t done_ = 0;
};

// Writes an .npy file from data that arrives in pieces (downloads of tensors larger than
// memory) into `path`.partial, which Commit renames to `path` once all the data is there;
// destroyed without Commit, it removes the partial file and leaves `path` as it was.
class NpyFileWriter {
 public:
  // INVALID_ARGUMENT bad shape; NOT_FOUND / PERMISSION_DENIED / INTERNAL creating the file.
  // `raw`: the elements only, no .npy header (`shardctl tensor download --raw`).
  static absl::StatusOr<std::unique_ptr<NpyFileWriter>> Create(const std::string& path, DType dtype,
                                                               const Shape& shape,
                                                               bool raw = false);
  ~NpyFileWriter();

  // INVALID_ARGUMENT past the array's bytes; INTERNAL on an I/O error.
  absl::Status Append(absl::string_view data);
  // INVALID_ARGUMENT when fewer bytes than the array's arrived.
  absl::Status Commit();

 private:
  NpyFileWriter() = default;

  std::string path_;
  std::string temp_path_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t data_bytes_ = 0;
  int64_t written_ = 0;
  std::ofstream out_;
  bool created_ = false;
  bool committed_ = false;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_NPY_H_
