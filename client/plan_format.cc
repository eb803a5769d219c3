#include "client/plan_format.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/command_util.h"
#include "common/json_writer.h"
#include "proto/convert.h"
#include "sharding/cost_model.h"

namespace shardcoord {
namespace {

// BuildLayout names the source's flags; for the target, errors name the --to- flag.
absl::Status ForTarget(const absl::Status& status) {
  absl::string_view message = status.message();
  for (absl::string_view flag : {"--mesh", "--ranks", "--dims", "--placements", "--flat"}) {
    if (absl::StartsWith(message, absl::StrCat(flag, ":"))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--to-", flag.substr(2), message.substr(flag.size())));
    }
  }
  return status;
}

std::vector<int64_t> Ints(const google::protobuf::RepeatedField<int64_t>& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

// A transfer's or local copy's box: "offset" and "shape".
void BoxFields(JsonWriter& w, const v1::Box& box) {
  w.Key("offset").IntArray(Ints(box.offset()));
  w.Key("shape").IntArray(Ints(box.shape()));
}

// "reduce" and "partial_index", only for a reducing transfer or local copy.
void ReduceFields(JsonWriter& w, bool reduce, int64_t partial_index) {
  if (!reduce) return;
  w.Key("reduce").Bool(true);
  w.Key("partial_index").Int(partial_index);
}

std::string StepOpText(v1::StepOp op) {
  absl::StatusOr<StepOp> parsed = StepOpFromProto(op, "op");
  return parsed.ok() ? StepOpName(*parsed) : v1::StepOp_Name(op);
}

std::string ReduceOpText(v1::ReduceOp op) {
  absl::StatusOr<ReduceOp> parsed = ReduceOpFromProto(op, "reduce_op");
  return parsed.ok() ? ReduceOpName(*parsed) : v1::ReduceOp_Name(op);
}

bool Reducing(v1::StepOp op) { return op == v1::REDUCE_SCATTER || op == v1::ALL_REDUCE; }

std::string Seconds(double s) {
  if (s <= 0) return "0 s";
  if (s < 1e-3) return absl::StrFormat("%.1f us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.2f ms", s * 1e3);
  return absl::StrFormat("%.3f s", s);
}

// "[0, 1, 2, 3]", or "[0..7]" for a long consecutive run.
std::string RankText(const std::vector<int64_t>& ranks) {
  bool consecutive = ranks.size() > 4;
  for (size_t i = 1; consecutive && i < ranks.size(); ++i)
    consecutive = ranks[i] == ranks[i - 1] + 1;
  if (consecutive) return absl::StrCat("[", ranks.front(), "..", ranks.back(), "]");
  return BracketList(ranks);
}

}  // namespace

absl::StatusOr<PlanInput> BuildPlanInput(const PlanFlags& flags) {
  absl::StatusOr<LayoutRequest> source = BuildLayout(flags.source);
  if (!source.ok()) return source.status();
  const DeviceMesh& source_mesh = *source->layout.mesh();  // BuildLayout always has one.

  if (flags.to_placements.has_value() && flags.to_flat.has_value()) {
    return absl::InvalidArgumentError(
        "--to-flat: give at most one of --to-placements or --to-flat, not both");
  }
  LayoutFlags target = flags.source;
  if (flags.to_mesh.has_value()) {
    target.mesh = *flags.to_mesh;
    absl::StatusOr<SizedMeshShape> mesh = ParseSizedMeshShape(target.mesh);
    if (!mesh.ok())
      return absl::InvalidArgumentError(absl::StrCat("--to-mesh: ", mesh.status().message()));
    // The source's ranks and dim names carry over only where they fit the new mesh.
    if (mesh->size != source_mesh.size()) target.ranks = "";
    if (static_cast<int>(mesh->shape.size()) != source_mesh.ndim()) target.dims = "";
  }
  if (flags.to_ranks.has_value()) target.ranks = *flags.to_ranks;
  if (flags.to_dims.has_value()) target.dims = *flags.to_dims;
  if (flags.to_placements.has_value() || flags.to_flat.has_value()) {
    target.placements = flags.to_placements;
    target.flat = flags.to_flat;
  }
  absl::StatusOr<LayoutRequest> target_layout = BuildLayout(target);
  if (!target_layout.ok()) return ForTarget(target_layout.status());

  PlanInput input;
  input.source = std::move(source->layout);
  input.target = std::move(target_layout->layout);
  input.dtype = source->dtype;

  if (!flags.hosts.empty()) {
    std::vector<std::string> hosts = ParseNameList(flags.hosts);
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (hosts[i].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--hosts: the host of rank ", i, " is empty"));
      }
    }
    int64_t max_rank = -1;
    for (const Layout* l : {&input.source, &input.target}) {
      for (const RankChunks& rc : l->ranks()) max_rank = std::max(max_rank, rc.rank);
    }
    if (max_rank >= static_cast<int64_t>(hosts.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--hosts: ", hosts.size(), " hosts given (one per global rank from 0), but rank ",
          max_rank, " takes part in the plan"));
    }
    input.options.hosts_by_rank = std::move(hosts);
  }
  if (!flags.cost.empty()) {
    absl::StatusOr<CostModel> cost = ParseCostModel(flags.cost);
    if (!cost.ok())
      return absl::InvalidArgumentError(absl::StrCat("--cost: ", cost.status().message()));
    input.options.cost = *cost;
  }
  return input;
}

std::string PlanJson(const Plan& plan) { return PlanJson(PlanToProto(plan, "", "")); }

std::string PlanJson(const v1::Plan& plan) {
  JsonWriter w;
  w.BeginObject();
  if (!plan.id().empty()) w.Key("id").String(plan.id());
  if (!plan.tensor().empty()) w.Key("tensor").String(plan.tensor());
  w.Key("steps").BeginArray();
  for (const v1::Step& s : plan.steps()) {
    w.BeginObject();
    w.Key("op").String(StepOpText(s.op()));
    w.Key("ranks").IntArray(Ints(s.ranks()));
    w.Key("bytes").Int(s.bytes());
    w.Key("transfers").Int(s.transfers_size());
    w.Key("estimated_seconds").Double(s.estimated_seconds());
    if (s.op() == v1::BROADCAST) w.Key("root").Int(s.root());
    if (Reducing(s.op())) w.Key("reduce_op").String(ReduceOpText(s.reduce_op()));
    w.EndObject();
  }
  w.EndArray();
  w.Key("transfers").BeginArray();
  for (int i = 0; i < plan.steps_size(); ++i) {
    for (const v1::Transfer& t : plan.steps(i).transfers()) {
      w.BeginObject();
      w.Key("step").Int(i);
      w.Key("src").Int(t.src());
      w.Key("dst").Int(t.dst());
      BoxFields(w, t.box());
      w.Key("bytes").Int(t.bytes());
      ReduceFields(w, t.reduce(), t.partial_index());
      w.EndObject();
    }
  }
  w.EndArray();
  w.Key("local_copies").BeginArray();
  for (const v1::LocalCopy& c : plan.local_copies()) {
    w.BeginObject();
    w.Key("rank").Int(c.rank());
    BoxFields(w, c.box());
    ReduceFields(w, c.reduce(), c.partial_index());
    w.EndObject();
  }
  w.EndArray();
  w.Key("traffic").BeginArray();
  for (const v1::RankTraffic& t : plan.traffic()) {
    w.BeginObject();
    w.Key("rank").Int(t.rank());
    w.Key("bytes_sent").Int(t.bytes_sent());
    w.Key("bytes_received").Int(t.bytes_received());
    w.EndObject();
  }
  w.EndArray();
  w.Key("bytes_moved").Int(plan.bytes_moved());
  w.Key("lower_bound_bytes").Int(plan.lower_bound_bytes());
  w.Key("bytes_within_hosts").Int(plan.bytes_within_hosts());
  w.Key("bytes_across_hosts").Int(plan.bytes_across_hosts());
  w.Key("cross_host_lower_bound_bytes").Int(plan.cross_host_lower_bound_bytes());
  w.Key("estimated_seconds").Double(plan.estimated_seconds());
  if (plan.divide_by() > 1) w.Key("divide_by").Int(plan.divide_by());
  if (plan.zero_fill_ranks_size() > 0)
    w.Key("zero_fill_ranks").IntArray(Ints(plan.zero_fill_ranks()));
  w.EndObject();
  return w.str();
}

std::string PlanText(const v1::Plan& plan, bool explain) {
  std::string out;
  if (!plan.tensor().empty()) absl::StrAppend(&out, "plan for tensor '", plan.tensor(), "'\n");
  int64_t transfers = 0;
  for (const v1::Step& s : plan.steps()) transfers += s.transfers_size();
  absl::StrAppend(&out, "bytes moved ", plan.bytes_moved(), " (", HumanBytes(plan.bytes_moved()),
                  "), lower bound ", plan.lower_bound_bytes(), "; ", transfers, " transfers, ",
                  plan.local_copies_size(), " local copies; estimated ",
                  Seconds(plan.estimated_seconds()), "\n");
  if (plan.steps_size() == 0) {
    absl::StrAppend(&out, "no communication\n");
  } else {
    std::vector<std::vector<std::string>> rows = {
        {"step", "op", "ranks", "transfers", "bytes", "estimated"}};
    for (int i = 0; i < plan.steps_size(); ++i) {
      const v1::Step& s = plan.steps(i);
      std::string op = StepOpText(s.op());
      if (s.op() == v1::BROADCAST) absl::StrAppend(&op, " (root ", s.root(), ")");
      if (Reducing(s.op())) absl::StrAppend(&op, " (", ReduceOpText(s.reduce_op()), ")");
      rows.push_back({absl::StrCat(i), op, RankText(Ints(s.ranks())),
                      absl::StrCat(s.transfers_size()), HumanBytes(s.bytes()),
                      Seconds(s.estimated_seconds())});
    }
    absl::StrAppend(&out, FormatTable(rows, {0, 3, 4, 5}));
  }
  if (explain) {
    absl::StrAppend(&out, "hosts: ", HumanBytes(plan.bytes_within_hosts()), " within hosts, ",
                    HumanBytes(plan.bytes_across_hosts()), " across hosts (lower bound ",
                    HumanBytes(plan.cross_host_lower_bound_bytes()), ")\n");
    std::vector<std::vector<std::string>> rows = {{"rank", "sent", "received"}};
    for (const v1::RankTraffic& t : plan.traffic()) {
      if (t.bytes_sent() == 0 && t.bytes_received() == 0) continue;
      rows.push_back(
          {absl::StrCat(t.rank()), absl::StrCat(t.bytes_sent()), absl::StrCat(t.bytes_received())});
    }
    absl::StrAppend(&out, "per-rank bytes:\n", FormatTable(rows, {0, 1, 2}));
  }
  return out;
}

}  // namespace shardcoord
