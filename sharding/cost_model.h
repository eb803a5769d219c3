#ifndef SHARDCOORD_SHARDING_COST_MODEL_H_
#define SHARDCOORD_SHARDING_COST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sharding/plan.h"

namespace shardcoord {

// Alpha-beta model per link class: sending m bytes over one link costs alpha + m * beta.
// Defaults are round numbers for NVLink-class intra-host and 100 Gb/s-class inter-host links;
// measure and set them for real clusters.
struct CostModel {
  double intra_alpha_s = 5e-6;                // Same host.
  double intra_beta_s_per_byte = 1.0 / 20e9;  // 20 GB/s.
  double inter_alpha_s = 20e-6;               // Across hosts.
  double inter_beta_s_per_byte = 1.0 / 10e9;  // 10 GB/s.

  double Alpha(bool same_host) const { return same_host ? intra_alpha_s : inter_alpha_s; }
  double Beta(bool same_host) const {
    return same_host ? intra_beta_s_per_byte : inter_beta_s_per_byte;
  }
  // Exact, for plan cache keys.
  std::string Fingerprint() const;
};

// "intra_alpha_us=5,intra_gbps=20,inter_alpha_us=20,inter_gbps=10" (any subset; GB/s are
// 1e9 bytes per second). Unknown keys and non-positive values are INVALID_ARGUMENT.
absl::StatusOr<CostModel> ParseCostModel(absl::string_view text);

// Which host each rank lives on. Ranks without a known host count as alone on their own
// host, so by default every pair of distinct ranks uses the inter-host link class.
class HostMap {
 public:
  HostMap() = default;
  // host_by_rank[r] is the host name of global rank r; empty names mean unknown.
  static HostMap FromNames(absl::Span<const std::string> host_by_rank);
  // Ranks [k*n, (k+1)*n) share host k.
  static HostMap Blocks(int64_t ranks_per_host);

  // A host id; distinct unknown ranks get distinct (negative) ids.
  int64_t HostOf(int64_t rank) const {
    if (rank >= 0 && rank < static_cast<int64_t>(host_.size()) && host_[rank] >= 0) {
      return host_[rank];
    }
    if (host_.empty() && ranks_per_host_ > 0 && rank >= 0) return rank / ranks_per_host_;
    return -1 - rank;  // Alone on its own host.
  }
  bool SameHost(int64_t a, int64_t b) const { return a == b || HostOf(a) == HostOf(b); }
  bool known() const { return ranks_per_host_ > 0 || !host_.empty(); }

 private:
  std::vector<int64_t> host_;  // By rank; -1 unknown.
  int64_t ranks_per_host_ = 0;
};

// Ring-style collective estimates as nccl-tests counts them, over `n` ranks whose slowest link
// is intra-host when `same_host`. `piece_bytes` is the largest per-rank piece (all-gather:
// what one rank contributes; reduce-scatter: what one rank receives, per contribution);
// `bytes` the full buffer (all-reduce, broadcast).
double EstimateAllGather(const CostModel& m, int64_t n, int64_t piece_bytes, bool same_host);
double EstimateReduceScatter(const CostModel& m, int64_t n, int64_t piece_bytes, bool same_host);
double EstimateAllReduce(const CostModel& m, int64_t n, int64_t bytes, bool same_host);
double EstimateBroadcast(const CostModel& m, int64_t n, int64_t bytes, bool same_host);
// Grouped point-to-point (also all-to-all): every rank pays one alpha per peer plus its bytes
// per link class, sends and receives overlap; the step takes as long as the busiest rank.
double EstimatePointToPoint(const CostModel& m, const HostMap& hosts,
                            absl::Span<const Transfer> transfers);

// One step, by its op (point-to-point formula for kAllToAll and kPointToPoint).
double EstimateStep(const CostModel& m, const HostMap& hosts, const Step& step);
// Each rank runs the steps it is in one after another and ranks run in parallel, so the plan
// takes the largest per-rank sum of step estimates. Local copies are not counted.
double EstimatePlan(const CostModel& m, const HostMap& hosts, const Plan& plan);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_COST_MODEL_H_
