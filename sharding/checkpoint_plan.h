#ifndef SHARDCOORD_SHARDING_CHECKPOINT_PLAN_H_
#define SHARDCOORD_SHARDING_CHECKPOINT_PLAN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/box.h"
#include "sharding/checkpoint_index.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"

namespace shardcoord {

// Who writes what in a checkpoint save, and who reads what in a load (the format is
// sharding/checkpoint_index.h). Both are global: every tensor of the operation is planned at
// once and the work is balanced over all ranks with DistributeShardsToRanks.

// ---- Save ---------------------------------------------------------------------------------

struct SaveTensor {
  std::string name;
  DType dtype = DType::kF32;
  Layout layout;  // Live holders only (a dead rank's copy is not there to write).
};

struct SaveEntry {
  size_t tensor = 0;  // Index into the planned tensors.
  Box box;            // Lies inside one chunk of the writer.
  std::string entry;  // PieceEntryName(tensor, box).
  int64_t bytes = 0;
};

// One writer's file: its entries in file order.
struct SaveFile {
  int64_t rank = 0;
  std::string file;  // CheckpointFileName(rank).
  std::vector<SaveEntry> entries;
  int64_t bytes = 0;  // Data bytes (without the header).
};

struct SavePlan {
  std::vector<SaveFile> files;  // By rank; only ranks that write something.
  int64_t total_bytes = 0;      // Every distinct element once.
  // Ranks that hold any data (the candidates), and total / candidates.
  int64_t candidate_writers = 0;
  double ideal_writer_bytes = 0;
  int64_t max_writer_bytes = 0;
};

struct SavePlanOptions {
  // A piece held by k replicas is cut into k parts (along its outermost dim longer than 1)
  // so that k ranks share its writing, but into no parts smaller than this.
  int64_t min_part_bytes = int64_t{64} << 10;
};

// Every distinct piece (replicas deduplicated) is written once, by one rank holding it.
// FAILED_PRECONDITION for a Partial tensor (its value is a reduction: redistribute it
// first); INVALID_ARGUMENT for an empty or repeated name.
absl::StatusOr<SavePlan> PlanSave(absl::Span<const SaveTensor> tensors,
                                  const SavePlanOptions& options = {});

// ---- Load ---------------------------------------------------------------------------------

struct LoadTensor {
  const CheckpointTensor* tensor = nullptr;  // Its pieces, from the index.
  Layout target;                             // Where it goes (any layout but Partial, same shape).
  // Optional, one per piece: the byte offset of the piece's first byte in its file (for
  // LoadPlanOptions::align_bytes).
  std::vector<int64_t> piece_file_offsets = {};
  // The reading is balanced within each group of tensors (and so over all): a load that reads
  // its tensors in batches (CutLoadBatches) gives each batch its own group, so that no reader
  // of a batch holds up the others.
  int64_t group = 0;
  // > 1: every run starts on a multiple of row_align rows from its piece's first row (and ends
  // on one, or at the piece's end), so that a reader holds whole blocks of rows: a dequantizing
  // load (issue 28) reads an F8 entry's 128-row scale blocks whole. With block checksums, runs
  // are cut on multiples of both.
  int64_t row_align = 1;
};

// A contiguous range of rows (along dim 0 of the piece's box) of one piece, read by one rank
// with one pread into its staging buffer.
struct ReadRun {
  int64_t rank = 0;
  size_t piece = 0;  // Index into the tensor's pieces.
  int64_t row_begin = 0;
  int64_t row_end = 0;
  Box box;                   // The rows' global box.
  int64_t local_offset = 0;  // Elements, in the reader's staging buffer.
  int64_t file_offset = -1;  // Of its first byte, when the tensor's piece offsets are given.
};

struct TensorRead {
  // What every reader holds once it has read: each rank's runs as chunks (no mesh). Every
  // element of the tensor is in exactly one run, so this is a valid layout, and the planner
  // moves it to the target (the exchange).
  Layout read_layout;
  std::vector<ReadRun> runs;  // By rank, then local offset.
};

struct LoadPlan {
  std::vector<TensorRead> tensors;           // In the order given.
  std::map<int64_t, int64_t> bytes_by_rank;  // Bytes each rank reads from storage.
  int64_t total_bytes = 0;                   // Every checkpoint byte of these tensors, once.
};

struct LoadPlanOptions {
  // > 0 (a power of two, at least the element size): a run of at least kAlignedRunBytes
  // whose file offset is known is placed in its reader's buffer at a byte offset congruent to
  // its file offset modulo align_bytes, on pages of its own (no other run on its first and
  // last page: gaps of less than 2 * align_bytes around it), so that a reader whose buffer
  // starts aligned reads it with one O_DIRECT read of those whole pages straight into place.
  int64_t align_bytes = 0;
};
inline constexpr int64_t kAlignedRunBytes = int64_t{64} << 10;
// The alignment a load plans with and a worker reads with O_DIRECT at: the page size, which
// satisfies devices of 512- and 4096-byte sectors.
inline constexpr int64_t kDirectIoAlignment = 4096;

// Every row of every piece is read by exactly one rank, chosen among the ranks whose target
// chunks need part of that row (so no rank reads rows its layout holds nothing of), the rows a
// set of ranks all need being shared among them to balance the bytes each reads. A piece with
// block checksums is read in whole blocks (a reader checks what it read), each block by a
// rank needing part of it. The bytes are balanced within each LoadTensor::group.
// INVALID_ARGUMENT for a target of another shape or a Partial target.
absl::StatusOr<LoadPlan> PlanLoad(absl::Span<const LoadTensor> tensors,
                                  const LoadPlanOptions& options = {});

// The tensors of a load (their bytes, in load order) cut into consecutive batches of about
// `batch_bytes` each, no tensor split: round(total / batch_bytes) batches (at least one, at
// most one per tensor), each tensor in the batch where the middle of its bytes falls, so
// batches are even up to one tensor. A load reads batch k+1 while batch k's exchange runs.
// `batch_bytes` <= 0: one batch. Empty batches are left out.
//
// `first_batch_bytes` > 0 (with batch_bytes > 0): the first batch is small, every tensor in
// load order that still fits within first_batch_bytes (the first tensor alone when none
// fits), and the rest is cut as above: the exchange can start only once the first batch is
// read, so a small one starts it sooner.
std::vector<std::vector<size_t>> CutLoadBatches(absl::Span<const int64_t> bytes,
                                                int64_t batch_bytes, int64_t first_batch_bytes = 0);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_CHECKPOINT_PLAN_H_
