#ifndef SHARDCOORD_SHARDING_SAFETENSORS_H_
#define SHARDCOORD_SHARDING_SAFETENSORS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/box.h"
#include "sharding/dtype.h"

namespace shardcoord {

// The safetensors format (huggingface/safetensors): an 8-byte little-endian header length N,
// N bytes of JSON, then the data. The JSON maps each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets into the data, which the entries tile exactly, in
// any key order) plus an optional "__metadata__" object of strings. Writers pad the JSON with
// spaces to a multiple of 8 bytes, so the data starts 8-byte aligned.

// Longest JSON header accepted (the reference implementation's limit).
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;
inline constexpr int kMaxSafetensorsDims = 16;

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;      // As in the file: "F32", "BF16", "BOOL", ...
  std::optional<DType> dtype;  // Every whole-byte safetensors dtype has one (dtype.h).
  int64_t element_size = 0;    // Bytes per element (known for every safetensors dtype).
  Shape shape;
  int64_t begin = 0;  // data_offsets, relative to the start of the data.
  int64_t end = 0;

  int64_t bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  int64_t json_bytes = 0;                 // N.
  std::vector<SafetensorsEntry> entries;  // In data order (by begin).
  std::vector<std::pair<std::string, std::string>> metadata;
  int64_t data_bytes = 0;  // The end of the last entry.

  // Where the data starts in the file: 8 + N.
  int64_t data_start() const { return 8 + json_bytes; }
  // The file's size: data_start() + data_bytes.
  int64_t file_bytes() const { return data_start() + data_bytes; }
  // The entry named `name`, or null.
  const SafetensorsEntry* Find(absl::string_view name) const;
};

// The safetensors name of a dtype ("F32", "BF16", "I64", ...).
std::string SafetensorsDTypeName(DType dtype);
// shardcoord's dtype for a safetensors name (INVALID_ARGUMENT for names it has no type for).
absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view name);

// N from the file's first 8 bytes. INVALID_ARGUMENT when fewer than 8 bytes are given or N is
// 0 or more than kMaxSafetensorsHeaderBytes.
absl::StatusOr<int64_t> ParseSafetensorsPrefix(absl::string_view first8);

// Parses and validates the JSON header: an object; every entry a known safetensors dtype, a
// shape of at most kMaxSafetensorsDims non-negative dims, offsets whose length is the
// shape's bytes, the entries tiling [0, data_bytes) with no gap or overlap; "__metadata__"
// an object of strings. When `file_bytes` >= 0 it must equal 8 + json.size() + data_bytes
// (a truncated or padded file is refused). Errors name the entry and field.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json,
                                                         int64_t file_bytes = -1);

// One entry to write: its data follows the previous one's.
struct SafetensorsEntrySpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
};

// The 8-byte length and the JSON header (padded with spaces to a multiple of 8 bytes) of a
// file holding `entries` in this order, data packed from offset 0. `header` receives what
// was laid out (offsets) when not null. INVALID_ARGUMENT for a duplicate or reserved name
// ("__metadata__") or sizes that overflow.
absl::StatusOr<std::string> BuildSafetensorsHeader(
    const std::vector<SafetensorsEntrySpec>& entries,
    const std::vector<std::pair<std::string, std::string>>& metadata = {},
    SafetensorsHeader* header = nullptr);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_SAFETENSORS_H_
