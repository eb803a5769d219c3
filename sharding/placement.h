#ifndef SHARDCOORD_SHARDING_PLACEMENT_H_
#define SHARDCOORD_SHARDING_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardcoord {

// How partial values held by different ranks combine into the tensor's value.
enum class ReduceOp : int { kSum = 1, kAvg = 2, kMin = 3, kMax = 4 };

std::string ReduceOpName(ReduceOp op);
absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name);

// What one mesh dim does to the tensor, as in DTensor: shard a tensor dim across the mesh
// dim (evenly as torch.chunk, or with explicit sizes), replicate, or hold partial values.
struct Placement {
  enum class Kind : int { kReplicate = 0, kShard = 1, kPartial = 2 };

  Kind kind = Kind::kReplicate;
  int dim = 0;                   // Tensor dim for kShard; may be negative until normalised.
  std::vector<int64_t> sizes;    // kShard only: explicit piece sizes, empty = torch.chunk.
  ReduceOp op = ReduceOp::kSum;  // kPartial only.

  static Placement Replicate() { return Placement(); }
  static Placement Shard(int dim, std::vector<int64_t> sizes = {}) {
    Placement p;
    p.kind = Kind::kShard;
    p.dim = dim;
    p.sizes = std::move(sizes);
    return p;
  }
  static Placement Partial(ReduceOp op = ReduceOp::kSum) {
    Placement p;
    p.kind = Kind::kPartial;
    p.op = op;
    return p;
  }

  bool is_shard() const { return kind == Kind::kShard; }
  bool is_replicate() const { return kind == Kind::kReplicate; }
  bool is_partial() const { return kind == Kind::kPartial; }

  // "S(0)", "S(1,[3,5])", "R", "P(sum)": the syntax ParsePlacement accepts.
  std::string ToString() const;

  friend bool operator==(const Placement& a, const Placement& b) {
    return a.kind == b.kind && a.dim == b.dim && a.sizes == b.sizes && a.op == b.op;
  }
};

// Parses one item: S(d), S(d,[a,b,...]), Shard(d), R, Replicate, P, P(op), Partial(op).
absl::StatusOr<Placement> ParsePlacement(absl::string_view text);
// Comma-separated items, one per mesh dim: "S(0),S(1,[3,5]),R".
absl::StatusOr<std::vector<Placement>> ParsePlacements(absl::string_view text);
std::string PlacementsToString(absl::Span<const Placement> placements);

// OLMo-core's ShardingSpec: per rank, [start, end) ranges into the flattened tensor.
struct FlatRange {
  int64_t start = 0;
  int64_t end = 0;
  friend bool operator==(const FlatRange& a, const FlatRange& b) {
    return a.start == b.start && a.end == b.end;
  }
};
using FlatSpec = std::vector<std::vector<FlatRange>>;

// "0:4,20:30;4:20;;" -> four ranks; ranges separated by ',', ranks by ';'.
absl::StatusOr<FlatSpec> ParseFlatSpec(absl::string_view text);
std::string FlatSpecToString(const FlatSpec& spec);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_PLACEMENT_H_
