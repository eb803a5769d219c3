#include "sharding/plan_explain.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sharding/dtype.h"
#include "sharding/placement.h"

namespace shardcoord {
namespace {

std::string HumanBytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / double(int64_t{1} << 30));
  if (b >= (int64_t{1} << 20)) return absl::StrFormat("%.2f MiB", b / double(int64_t{1} << 20));
  if (b >= (int64_t{1} << 10)) return absl::StrFormat("%.2f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

std::string HumanSeconds(double s) {
  if (s >= 1) return absl::StrFormat("%.3f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.3f ms", s * 1e3);
  return absl::StrFormat("%.1f us", s * 1e6);
}

std::string RankList(const std::vector<int64_t>& ranks) {
  constexpr size_t kShown = 16;
  if (ranks.size() <= kShown) return absl::StrCat("[", absl::StrJoin(ranks, ","), "]");
  std::vector<int64_t> head(ranks.begin(), ranks.begin() + kShown);
  return absl::StrCat("[", absl::StrJoin(head, ","), ",... (", ranks.size(), " ranks)]");
}

}  // namespace

std::string ExplainPlan(const Plan& plan) {
  std::string out =
      absl::StrCat("plan ", ShapeToString(plan.source.global_shape()), " ", DTypeName(plan.dtype),
                   ": ", plan.source.SpecString(), " -> ", plan.target.SpecString(), "\n");
  if (plan.cast_to.has_value()) {
    absl::StrAppend(&out, "cast ", DTypeName(plan.dtype), " -> ", DTypeName(*plan.cast_to),
                    " by the ", CastSideName(plan.cast_side()), ": transfers carry ",
                    DTypeName(plan.wire_dtype()), " (", ElementSize(plan.wire_dtype()),
                    " bytes an element); local copies convert as they copy\n");
  }
  absl::StrAppend(&out, "bytes moved ", plan.bytes_moved, " (", HumanBytes(plan.bytes_moved),
                  "), lower bound ", plan.lower_bound_bytes, ", estimated ",
                  HumanSeconds(plan.estimated_seconds), "\n");
  absl::StrAppend(&out, "hosts: ", plan.bytes_within_hosts, " bytes within hosts, ",
                  plan.bytes_across_hosts, " across hosts (", HumanBytes(plan.bytes_across_hosts),
                  "), cross-host lower bound ", plan.cross_host_lower_bound_bytes, "\n");
  int64_t local_bytes = 0;
  const int64_t esize = ElementSize(plan.target_dtype());
  for (const LocalCopy& c : plan.local_copies) local_bytes += c.box.Volume() * esize;
  absl::StrAppend(&out, "local copies: ", plan.local_copies.size(), " (", HumanBytes(local_bytes),
                  ")\n");
  if (plan.source.is_partial()) {
    absl::StrAppend(&out, "reduce: ", ReduceOpName(plan.reduce_op), " of ",
                    plan.source.num_partials(), " partial contributions");
    if (plan.divide_by > 1) absl::StrAppend(&out, ", then divide by ", plan.divide_by);
    absl::StrAppend(&out, "\n");
  }
  if (!plan.zero_fill_ranks.empty()) {
    absl::StrAppend(&out, "zero-fill contributions != 0 on ranks ", RankList(plan.zero_fill_ranks),
                    "\n");
  }
  absl::StrAppend(&out, "steps: ", plan.steps.size(), "\n");
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    absl::StrAppend(&out, "  step ", i, ": ", StepOpName(s.op), " ranks ", RankList(s.ranks));
    if (s.op == StepOp::kBroadcast) absl::StrAppend(&out, " root ", s.root);
    if (s.op == StepOp::kAllReduce || s.op == StepOp::kReduceScatter) {
      absl::StrAppend(&out, " op ", ReduceOpName(s.reduce_op));
    }
    absl::StrAppend(&out, ", ", s.transfers.size(), " transfers, ", HumanBytes(s.bytes),
                    ", estimated ", HumanSeconds(s.estimated_seconds), "\n");
  }
  absl::StrAppend(&out, "per-rank bytes (sent / received):\n");
  for (const RankTraffic& t : plan.traffic) {
    if (t.bytes_sent == 0 && t.bytes_received == 0) continue;
    absl::StrAppend(&out, "  rank ", t.rank, ": ", t.bytes_sent, " / ", t.bytes_received, "\n");
  }
  return out;
}

}  // namespace shardcoord
