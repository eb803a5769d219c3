#include "sharding/cost_model.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shardcoord {

std::string CostModel::Fingerprint() const {
  return absl::StrFormat("%a,%a,%a,%a", intra_alpha_s, intra_beta_s_per_byte, inter_alpha_s,
                         inter_beta_s_per_byte);
}

absl::StatusOr<CostModel> ParseCostModel(absl::string_view text) {
  CostModel m;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    double v = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(kv.second), &v) || !(v > 0) ||
        !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost model item '", item, "': value must be a positive number"));
    }
    if (key == "intra_alpha_us") {
      m.intra_alpha_s = v * 1e-6;
    } else if (key == "inter_alpha_us") {
      m.inter_alpha_s = v * 1e-6;
    } else if (key == "intra_gbps") {
      m.intra_beta_s_per_byte = 1.0 / (v * 1e9);
    } else if (key == "inter_gbps") {
      m.inter_beta_s_per_byte = 1.0 / (v * 1e9);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("cost model key '", key,
                       "' is unknown (intra_alpha_us, intra_gbps, inter_alpha_us, inter_gbps)"));
    }
  }
  return m;
}

HostMap HostMap::FromNames(absl::Span<const std::string> host_by_rank) {
  HostMap h;
  absl::flat_hash_map<std::string, int64_t> ids;
  h.host_.reserve(host_by_rank.size());
  for (const std::string& name : host_by_rank) {
    if (name.empty()) {
      h.host_.push_back(-1);
      continue;
    }
    auto it = ids.emplace(name, static_cast<int64_t>(ids.size())).first;
    h.host_.push_back(it->second);
  }
  return h;
}

HostMap HostMap::Blocks(int64_t ranks_per_host) {
  HostMap h;
  h.ranks_per_host_ = std::max<int64_t>(ranks_per_host, 0);
  return h;
}

double EstimateAllGather(const CostModel& m, int64_t n, int64_t piece_bytes, bool same_host) {
  if (n < 2) return 0;
  return (n - 1) * (m.Alpha(same_host) + piece_bytes * m.Beta(same_host));
}

double EstimateReduceScatter(const CostModel& m, int64_t n, int64_t piece_bytes, bool same_host) {
  return EstimateAllGather(m, n, piece_bytes, same_host);
}

double EstimateAllReduce(const CostModel& m, int64_t n, int64_t bytes, bool same_host) {
  if (n < 2) return 0;
  return 2.0 * (n - 1) * m.Alpha(same_host) + 2.0 * (n - 1) / n * bytes * m.Beta(same_host);
}

double EstimateBroadcast(const CostModel& m, int64_t n, int64_t bytes, bool same_host) {
  if (n < 2) return 0;
  // Pipelined: the data crosses each link once; latency grows with the tree depth.
  return std::ceil(std::log2(static_cast<double>(n))) * m.Alpha(same_host) +
         bytes * m.Beta(same_host);
}

double EstimatePointToPoint(const CostModel& m, const HostMap& hosts,
                            absl::Span<const Transfer> transfers) {
  if (transfers.empty()) return 0;
  // (rank, peer, bytes) aggregated per ordered pair, once from the sender's and once from the
  // receiver's side.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> pairs;
  pairs.reserve(transfers.size() * 2);
  for (const Transfer& t : transfers) {
    pairs.emplace_back(t.src, t.dst, t.bytes);
    pairs.emplace_back(-1 - t.dst, t.src, t.bytes);  // Receiving side, kept apart by sign.
  }
  std::sort(pairs.begin(), pairs.end());
  double worst = 0, cur = 0;
  for (size_t i = 0; i < pairs.size();) {
    const int64_t side = std::get<0>(pairs[i]), peer = std::get<1>(pairs[i]);
    int64_t bytes = 0;
    size_t j = i;
    for (; j < pairs.size() && std::get<0>(pairs[j]) == side && std::get<1>(pairs[j]) == peer;
         ++j) {
      bytes += std::get<2>(pairs[j]);
    }
    const int64_t rank = side >= 0 ? side : -1 - side;
    const bool same = hosts.SameHost(rank, peer);
    if (i == 0 || std::get<0>(pairs[i - 1]) != side) cur = 0;
    cur += m.Alpha(same) + bytes * m.Beta(same);
    worst = std::max(worst, cur);
    i = j;
  }
  return worst;
}

namespace {

bool OneHost(const HostMap& hosts, absl::Span<const int64_t> ranks) {
  for (int64_t r : ranks) {
    if (!hosts.SameHost(r, ranks.front())) return false;
  }
  return true;
}

// Largest number of bytes one ordered pair of ranks exchanges in the step.
int64_t LargestPairBytes(absl::Span<const Transfer> transfers) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> pairs;
  pairs.reserve(transfers.size());
  for (const Transfer& t : transfers) pairs.emplace_back(t.src, t.dst, t.bytes);
  std::sort(pairs.begin(), pairs.end());
  int64_t best = 0;
  for (size_t i = 0; i < pairs.size();) {
    int64_t b = 0;
    size_t j = i;
    for (; j < pairs.size() && std::get<0>(pairs[j]) == std::get<0>(pairs[i]) &&
           std::get<1>(pairs[j]) == std::get<1>(pairs[i]);
         ++j) {
      b += std::get<2>(pairs[j]);
    }
    best = std::max(best, b);
    i = j;
  }
  return best;
}

}  // namespace

double EstimateStep(const CostModel& m, const HostMap& hosts, const Step& step) {
  const int64_t n = static_cast<int64_t>(step.ranks.size());
  switch (step.op) {
    case StepOp::kAllToAll:
    case StepOp::kPointToPoint:
      return EstimatePointToPoint(m, hosts, step.transfers);
    default:
      break;
  }
  if (step.ranks.empty()) return 0;
  const bool same = OneHost(hosts, step.ranks);
  const int64_t piece = LargestPairBytes(step.transfers);
  switch (step.op) {
    case StepOp::kAllGather:
      return EstimateAllGather(m, n, piece, same);
    case StepOp::kReduceScatter:
      return EstimateReduceScatter(m, n, piece, same);
    case StepOp::kAllReduce:
      return EstimateAllReduce(m, n, piece, same);
    case StepOp::kBroadcast:
      return EstimateBroadcast(m, n, piece, same);
    default:
      return EstimatePointToPoint(m, hosts, step.transfers);
  }
}

double EstimatePlan(const CostModel& m, const HostMap& hosts, const Plan& plan) {
  absl::flat_hash_map<int64_t, double> busy;
  double worst = 0;
  for (const Step& s : plan.steps) {
    const double t = EstimateStep(m, hosts, s);
    for (int64_t r : s.ranks) worst = std::max(worst, busy[r] += t);
  }
  return worst;
}

}  // namespace shardcoord
