#ifndef SHARDCOORD_SHARDING_TRANSFER_TABLE_H_
#define SHARDCOORD_SHARDING_TRANSFER_TABLE_H_

// A prepared transfer (issue 27) as every worker sees it: the members of a weight-sync step
// (copies src -> dst) and their layouts, each distinct layout once. The coordinator builds the
// table from its tensor records and sends the same table to every participant; each worker
// expands it into its own part with ExpandTransfer. The coordinator never expands plans: its
// work and message bytes grow with members plus distinct layouts, not members x ranks, which
// is what makes a model of 10^5 tensors on 10^3 ranks cheap to prepare and to run.
//
// Expansion is deterministic (the planner is): every worker that expands the same table
// computes the same plan for each template (distinct src layout, dst layout, dtypes) and so
// agrees with every other on who sends what to whom.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/plan_fragment.h"

namespace shardcoord {

// One member: dst gets src's values.
struct TransferMemberSpec {
  std::string src;
  std::string dst;
  int64_t src_version = 0;
  int64_t dst_version = 0;  // dst's committed version when prepared.
  // dst is attached: its lent buffers are written in place (of dst_version, then of each
  // run's version).
  bool dst_attached = false;
  int32_t src_layout = 0;  // Index into TransferTable::layouts.
  int32_t dst_layout = 0;
  DType dtype = DType::kF32;  // The src's elements.
  // The dst's dtype where it differs from the src's: a run converts (the rules and the side
  // that converts as a Copy's, sharding/cast.h), and bytes travel in the narrower dtype.
  std::optional<DType> cast_to;

  DType target_dtype() const { return cast_to.value_or(dtype); }
};

struct TransferTable {
  // Distinct layouts. A rank that holds nothing of a layout may be left out of it.
  std::vector<Layout> layouts;
  std::vector<TransferMemberSpec> members;
  // PlanOptions::hosts_by_rank: senders on the destination's host are preferred.
  std::vector<std::string> hosts_by_rank;
};

// INVALID_ARGUMENT naming the member and field: a layout index out of range, src and dst
// layouts of different global shapes, an empty name, src == dst, a tensor named twice (as
// src or dst), a non-positive version, a cast CheckCast refuses.
absl::Status ValidateTransferTable(const TransferTable& table);

// Every rank that holds a chunk of any layout of the table, sorted: the ranks of a run's one
// exchange (a superset of those that move bytes; the rest exchange nothing).
std::vector<int64_t> TransferParticipants(const TransferTable& table);

// A template: the distinct (src layout, dst layout, dtype, cast) members share, in the order
// of their first member.
struct TransferTemplate {
  int32_t src_layout = 0;
  int32_t dst_layout = 0;
  DType dtype = DType::kF32;
  std::optional<DType> cast_to;

  DType target_dtype() const { return cast_to.value_or(dtype); }
};
// The templates of the table and, for each member, the index of its template.
struct TransferTemplates {
  std::vector<TransferTemplate> templates;
  std::vector<int32_t> of_member;
};
TransferTemplates TemplatesOf(const TransferTable& table);

struct ExpandOptions {
  std::string transfer_id;  // The fragment's plan_id, and each member's.
  // Incarnations of the exchange's ranks (missing ranks get 0).
  absl::flat_hash_map<int64_t, int64_t> incarnations;
  int64_t step_timeout_ms = 0;
};

// What one rank does in every run of a prepared transfer.
struct RankTransfer {
  // A fused fragment (Fragment::fused): the shape of every template the rank takes part in,
  // owning its chunks, local copies and the transfers it sends or receives; every member it
  // takes part in, in table order, with FragmentMember::index its index in the table and
  // target_version its dst_version (a run sets the run's); exchange_ranks the
  // TransferParticipants when the rank is among them. bucket_bytes and communicator_prefix
  // are a run's to set.
  Fragment fragment;
  int64_t bytes_sent = 0;      // Per run, by this rank.
  int64_t bytes_received = 0;  // Per run, by this rank.
  // New target buffers a run allocates here: members not attached, non-empty targets.
  int64_t target_bytes = 0;
  // Over the rank's target chunks (member index, boxes, partial indices) of every member:
  // ranks with equal keys hold the same values after a run. 0 when it holds no target.
  uint64_t replica_key = 0;
  // The totals of every template whose lowest participant is this rank, times its members:
  // summed over all ranks they give the transfer's totals (each plan counted once).
  int64_t owned_bytes_moved = 0;
  int64_t owned_lower_bound_bytes = 0;
  int64_t templates_planned = 0;  // Templates this rank took part in (and planned).
};

// Plans every template `rank` holds a source or target chunk of (PlanOptions with the
// table's hosts, no collectives: a fused exchange moves transfers) and keeps the rank's part.
// INVALID_ARGUMENT as ValidateTransferTable (callers validate once and may skip it); a
// planning error names the member whose template failed.
absl::StatusOr<RankTransfer> ExpandTransfer(const TransferTable& table, int64_t rank,
                                            const ExpandOptions& options);

// What ExpandTransfer computes for each rank, without any rank's fragment: bytes sent and
// received, target bytes, replica key, owned totals and templates planned, indexed by rank
// (every rank below the table's hosts_by_rank size and its layouts' ranks; ranks outside every
// layout have zeros), each template planned once rather than once per rank. For fake workers
// and benchmarks of a coordinator at 10^3 ranks, where every rank's expansion would plan each
// template up to 10^3 times. Errors as ExpandTransfer's.
absl::StatusOr<std::vector<RankTransfer>> SummarizeTransfer(const TransferTable& table);

// A 64-bit hash that is the same in every process and build (absl::Hash is seeded per
// process): digests workers compare across machines.
class StableHash {
 public:
  void Add(uint64_t v);
  void Add(const Box& b);
  uint64_t value() const;

 private:
  uint64_t h_ = 0x9e3779b97f4a7c15ull;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_TRANSFER_TABLE_H_
