#ifndef SHARDCOORD_SHARDING_TENSOR_SPLIT_H_
#define SHARDCOORD_SHARDING_TENSOR_SPLIT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/layout.h"

namespace shardcoord {

// Helpers users know from OLMo-core and Megatron, on Layout. `full` is always a dense
// row-major buffer for the whole tensor; a rank's local buffer holds layout's
// Find(rank)->local_elements elements, each chunk at its local_offset.

// OLMo-core's chunk_unsharded: every rank's local buffer, in layout.ranks() order. For a
// partial layout the partials reduce back to `full`: with kSum, contribution 0 holds the
// values and the others zeros (all-zero bytes are zero in every dtype); with kAvg, kMin and
// kMax every contribution holds the values. Bytes not covered by a chunk are zero.
absl::StatusOr<std::vector<std::vector<char>>> ChunkUnsharded(const Layout& layout,
                                                              const void* full,
                                                              int64_t element_size);

// One rank's local buffer, as ChunkUnsharded builds it; NOT_FOUND if the layout has no such
// rank.
absl::StatusOr<std::vector<char>> ShardedChunk(const Layout& layout, int64_t rank, const void* full,
                                               int64_t element_size);

// The inverse for gathers: writes every chunk of every rank into `full`. Buffers are given
// in layout.ranks() order (null is allowed for a rank without elements); replicas simply
// overwrite each other. Partial layouts are rejected: they need a reduction
// (ReduceIntoBox), not a copy.
absl::Status AssembleFull(const Layout& layout,
                          const std::vector<const void*>& local_buffers_by_rank_index,
                          int64_t element_size, void* full);

// Megatron's split_dtensor: splits the tensor along `dim` (negative counts from the end)
// into consecutive pieces of `sections` elements, which must sum to the extent of `dim`.
// Piece i's layout has the global shape with dim = sections[i]; each rank holds the
// non-empty intersections of its chunks with the piece, in piece coordinates and in chunk
// order, packed contiguously from local offset 0. Every rank of the layout appears in every
// piece (with no chunks where it holds nothing of it), nothing is replicated that was not
// already, and num_partials, partial_op and partial_index carry over. Mesh and spec
// information does not: pieces are chunk layouts.
absl::StatusOr<std::vector<Layout>> SplitLayout(const Layout& layout, int dim,
                                                absl::Span<const int64_t> sections);

// torch.split with an int: pieces of `split_size` along `dim`, the last one smaller when the
// extent is not a multiple; an extent of 0 gives one empty piece.
absl::StatusOr<std::vector<Layout>> SplitLayoutEvery(const Layout& layout, int dim,
                                                     int64_t split_size);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_TENSOR_SPLIT_H_
