#ifndef SHARDCOORD_SHARDING_LIMITS_H_
#define SHARDCOORD_SHARDING_LIMITS_H_

// Bounds on what a client controls (issue 15). They belong to the model, not to the wire:
// the proto decoders enforce them on every request, and the core may rely on them.

namespace shardcoord {

// Tensor and mesh dims, and placements per spec.
inline constexpr int kMaxDims = 16;
// Ranges of one rank in a flat spec.
inline constexpr int kMaxFlatRangesPerRank = 4096;
// Buffers one request lends a worker (LocalAttachManyRequest, AttachBuffersRequest).
inline constexpr int kMaxAttachmentsPerRequest = 100000;

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_LIMITS_H_
