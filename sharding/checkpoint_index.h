#ifndef SHARDCOORD_SHARDING_CHECKPOINT_INDEX_H_
#define SHARDCOORD_SHARDING_CHECKPOINT_INDEX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/safetensors.h"

namespace shardcoord {

// A checkpoint directory: one safetensors file per writing rank and `index.json`, which says
// for every tensor its shape, dtype and pieces. A piece is one entry of one file holding one
// box of the tensor (row-major, little-endian), with the XXH64 (seed 0) of its bytes and of
// each block of `rows_per_block` rows along the box's dim 0 (the last block may be shorter;
// a 0-d box is one row), so a reader that reads some rows checks what it read.
//
//   {"format": "shardcoord-checkpoint", "version": 1,
//    "files": [{"file": "rank-00000.safetensors", "rank": 0, "writer": "w0", "bytes": 1234}],
//    "tensors": {"w": {"dtype": "F32", "shape": [8, 4], "pieces": [
//        {"box": {"offset": [0, 0], "shape": [4, 4]}, "file": "rank-00000.safetensors",
//         "entry": "w[0:4,0:4]", "xxh64": "0123456789abcdef", "rows_per_block": 4,
//         "blocks": ["0123456789abcdef"]}, ...]}}}
inline constexpr char kCheckpointIndexFile[] = "index.json";
inline constexpr char kCheckpointFormat[] = "shardcoord-checkpoint";
inline constexpr int kCheckpointFormatVersion = 1;

struct CheckpointPiece {
  Box box;
  std::string file;
  std::string entry;
  bool has_xxh64 = false;  // A plain safetensors file has no checksums.
  uint64_t xxh64 = 0;
  int64_t rows_per_block = 0;  // 0: no block checksums.
  std::vector<uint64_t> blocks;
};

struct CheckpointTensor {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  std::vector<CheckpointPiece> pieces;
};

struct CheckpointFile {
  std::string file;
  int64_t rank = -1;   // The writer's global rank; -1 unknown (a foreign file).
  std::string writer;  // The writer's worker name.
  int64_t bytes = 0;
};

struct CheckpointIndex {
  std::vector<CheckpointFile> files;
  std::vector<CheckpointTensor> tensors;  // Sorted by name.

  // The tensor named `name`, or null.
  const CheckpointTensor* Find(absl::string_view name) const;
  int64_t TotalBytes() const;
};

// Rows of a box along dim 0 (1 for a 0-d box) and the elements of one row.
int64_t BoxRows(const Box& box);
int64_t BoxRowElements(const Box& box);

// "w[0:4,0:4]": the entry name the writers use for a piece.
std::string PieceEntryName(absl::string_view tensor, const Box& box);
// "rank-00003.safetensors".
std::string CheckpointFileName(int64_t rank);
// A file name an index may reference: a plain name (no '/', not "." or "..", no NUL),
// ending in ".safetensors". INVALID_ARGUMENT naming `field`.
absl::Status CheckCheckpointFileName(absl::string_view field, absl::string_view name);

// Rows per checksum block for rows of `row_bytes`: blocks of about kCheckpointBlockBytes.
inline constexpr int64_t kCheckpointBlockBytes = int64_t{1} << 20;
int64_t RowsPerBlock(int64_t row_bytes);

std::string SerializeCheckpointIndex(const CheckpointIndex& index);
// Parses index.json strictly (unknown fields, wrong types, a format or version other than
// ours are errors naming the field, e.g. "tensors.w.pieces[2].box.shape") and validates it
// (ValidateCheckpointIndex).
absl::StatusOr<CheckpointIndex> ParseCheckpointIndex(absl::string_view json);

// Every tensor a valid name, shape and dtype; its pieces in bounds, disjoint and covering it;
// every piece in a listed file, entry names unique per file; block checksums consistent with
// the box (one per block). INVALID_ARGUMENT naming the tensor and piece.
absl::Status ValidateCheckpointIndex(const CheckpointIndex& index);

// The index of a directory of plain safetensors files (e.g. a Hugging Face model): every
// entry is one tensor of one piece, the whole tensor, without checksums; entries of dtypes
// shardcoord has no type for (BOOL, U16, F8...) are left out. INVALID_ARGUMENT for a name in
// two files (naming both files and the entry).
absl::StatusOr<CheckpointIndex> IndexFromSafetensors(
    const std::vector<std::pair<std::string, SafetensorsHeader>>& files);

// Checks that `header` (of `file`, as read from disk) holds every piece the index puts in it
// with the piece's dtype and box shape. INVALID_ARGUMENT naming the file and entry.
absl::Status CheckPiecesAgainstHeader(const CheckpointIndex& index, absl::string_view file,
                                      const SafetensorsHeader& header);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_CHECKPOINT_INDEX_H_
