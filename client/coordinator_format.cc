#include "client/coordinator_format.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/command_util.h"
#include "client/layout_format.h"
#include "common/json_writer.h"
#include "proto/convert.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/plan.h"

namespace shardcoord {
namespace {

std::vector<int64_t> Ints(const google::protobuf::RepeatedField<int64_t>& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

void StringArray(JsonWriter& w, const google::protobuf::RepeatedPtrField<std::string>& values) {
  w.BeginArray();
  for (const std::string& v : values) w.String(v);
  w.EndArray();
}

std::string Or(const std::string& value, absl::string_view fallback) {
  return value.empty() ? std::string(fallback) : value;
}

std::string StepOpText(v1::StepOp op) {
  absl::StatusOr<StepOp> parsed = StepOpFromProto(op, "op");
  return parsed.ok() ? StepOpName(*parsed) : v1::StepOp_Name(op);
}

std::string Checksum(uint64_t checksum) {
  return checksum == 0 ? "-" : absl::StrFormat("%016x", checksum);
}

std::string AgeText(int64_t now_ms, int64_t then_ms) {
  if (then_ms <= 0) return "never";
  const int64_t age = now_ms - then_ms;
  if (age < 0) return "just now";
  if (age < 60'000) return absl::StrFormat("%.1f s ago", age / 1000.0);
  if (age < 3'600'000) return absl::StrFormat("%d min ago", age / 60'000);
  return absl::StrFormat("%d h ago", age / 3'600'000);
}

void MeshObject(JsonWriter& w, const v1::MeshInfo& mesh) {
  w.BeginObject();
  w.Key("name").String(mesh.name());
  w.Key("shape").IntArray(Ints(mesh.shape()));
  w.Key("dim_names");
  StringArray(w, mesh.dim_names());
  w.Key("ranks").IntArray(Ints(mesh.ranks()));
  w.Key("workers");
  StringArray(w, mesh.workers());
  w.EndObject();
}

std::string MeshShapeText(const v1::MeshInfo& mesh) {
  std::string shape = absl::StrJoin(mesh.shape(), "x");
  if (mesh.dim_names_size() > 0)
    absl::StrAppend(&shape, " (", absl::StrJoin(mesh.dim_names(), ", "), ")");
  return shape;
}

}  // namespace

std::string DTypeText(v1::DType dtype) {
  absl::StatusOr<DType> d = DTypeFromProto(dtype);
  return d.ok() ? DTypeName(*d) : v1::DType_Name(dtype);
}

std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers, int64_t now_unix_ms) {
  if (workers.empty()) return "no workers registered\n";
  std::vector<std::vector<std::string>> rows = {{"rank", "name", "host", "device", "backend",
                                                 "address", "state", "incarnation", "heartbeat",
                                                 "memory (used / budget, peak)"}};
  int alive = 0;
  for (const v1::WorkerInfo& w : workers) {
    if (w.state() == v1::ALIVE) ++alive;
    rows.push_back({absl::StrCat(w.rank()), w.name(), Or(w.host(), "-"), Or(w.device(), "-"),
                    Or(w.backend(), "-"), Or(w.address(), "-"),
                    w.leaving() ? "LEAVING" : v1::WorkerState_Name(w.state()),
                    absl::StrCat(w.incarnation()), AgeText(now_unix_ms, w.last_heartbeat_unix_ms()),
                    w.memory_budget_bytes() > 0
                        ? absl::StrCat(HumanBytes(w.memory_used_bytes()), " / ",
                                       HumanBytes(w.memory_budget_bytes()), ", peak ",
                                       HumanBytes(w.memory_peak_bytes()))
                        : "-"});
  }
  return absl::StrCat(FormatTable(rows, {0, 7}), "\n", workers.size(), " workers, ", alive,
                      " alive\n");
}

std::string WorkersJson(const std::vector<v1::WorkerInfo>& workers) {
  JsonWriter w;
  w.BeginObject().Key("workers").BeginArray();
  for (const v1::WorkerInfo& info : workers) {
    w.BeginObject();
    w.Key("name").String(info.name());
    w.Key("rank").Int(info.rank());
    w.Key("host").String(info.host());
    w.Key("device").String(info.device());
    w.Key("address").String(info.address());
    w.Key("backend").String(info.backend());
    w.Key("state").String(v1::WorkerState_Name(info.state()));
    w.Key("incarnation").Int(info.incarnation());
    w.Key("last_heartbeat_unix_ms").Int(info.last_heartbeat_unix_ms());
    w.Key("leaving").Bool(info.leaving());
    w.Key("memory_budget_bytes").Int(info.memory_budget_bytes());
    w.Key("memory_used_bytes").Int(info.memory_used_bytes());
    w.Key("memory_peak_bytes").Int(info.memory_peak_bytes());
    w.Key("bucket_bytes").Int(info.bucket_bytes());
    w.EndObject();
  }
  w.EndArray().EndObject();
  return w.str();
}

std::string MeshesTable(const std::vector<v1::MeshInfo>& meshes) {
  if (meshes.empty()) return "no meshes\n";
  std::vector<std::vector<std::string>> rows = {{"name", "shape", "ranks", "workers"}};
  for (const v1::MeshInfo& m : meshes) {
    rows.push_back({m.name(), MeshShapeText(m), BracketList(Ints(m.ranks())),
                    absl::StrJoin(m.workers(), ",")});
  }
  return FormatTable(rows);
}

std::string MeshesJson(const std::vector<v1::MeshInfo>& meshes) {
  JsonWriter w;
  w.BeginObject().Key("meshes").BeginArray();
  for (const v1::MeshInfo& m : meshes) MeshObject(w, m);
  w.EndArray().EndObject();
  return w.str();
}

std::string MeshJson(const v1::MeshInfo& mesh) {
  JsonWriter w;
  MeshObject(w, mesh);
  return w.str();
}

std::string MeshText(const v1::MeshInfo& mesh) {
  std::string out = absl::StrCat("mesh ", mesh.name(), "  ", MeshShapeText(mesh), "  ",
                                 mesh.ranks_size(), " ranks\n");
  const int ndim = mesh.shape_size();
  if ((ndim != 1 && ndim != 2) || mesh.ranks_size() == 0) return out;
  const int64_t rows = ndim == 2 ? mesh.shape(0) : 1;
  const int64_t cols = mesh.shape(ndim - 1);
  if (rows * cols != mesh.ranks_size()) return out;  // Malformed; the line above suffices.
  std::vector<std::vector<std::string>> grid;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<std::string> row;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const std::string worker = i < mesh.workers_size() ? mesh.workers(i) : "";
      row.push_back(worker.empty() ? absl::StrCat("rank ", mesh.ranks(i))
                                   : absl::StrCat(worker, " (", mesh.ranks(i), ")"));
    }
    grid.push_back(std::move(row));
  }
  std::string table = FormatTable(grid);
  // Indent the grid under the summary.
  for (absl::string_view line : absl::StrSplit(table, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, "  ", line, "\n");
  }
  return out;
}

std::string TensorsTable(const std::vector<v1::TensorInfo>& tensors) {
  if (tensors.empty()) return "no tensors\n";
  std::vector<std::vector<std::string>> rows = {
      {"name", "shape", "dtype", "mesh", "spec", "bytes", "version", "plan"}};
  for (const v1::TensorInfo& t : tensors) {
    rows.push_back({t.name(), BracketList(Ints(t.shape())), DTypeText(t.dtype()), t.mesh(),
                    t.spec(), HumanBytes(t.bytes()), absl::StrCat(t.version()),
                    Or(t.busy_plan(), "-")});
  }
  return FormatTable(rows, {5, 6});
}

std::string TensorsJson(const std::vector<v1::TensorInfo>& tensors) {
  JsonWriter w;
  w.BeginObject().Key("tensors").BeginArray();
  for (const v1::TensorInfo& t : tensors) {
    w.BeginObject();
    w.Key("name").String(t.name());
    w.Key("shape").IntArray(Ints(t.shape()));
    w.Key("dtype").String(DTypeText(t.dtype()));
    w.Key("mesh").String(t.mesh());
    w.Key("spec").String(t.spec());
    w.Key("bytes").Int(t.bytes());
    w.Key("version").Int(t.version());
    w.Key("busy_plan").String(t.busy_plan());
    w.EndObject();
  }
  w.EndArray().EndObject();
  return w.str();
}

namespace {
std::string PlanTensors(const v1::PlanSummary& p) {
  return p.source_tensor().empty() || p.source_tensor() == p.tensor()
             ? p.tensor()
             : absl::StrCat(p.source_tensor(), " -> ", p.tensor());
}
}  // namespace

std::string PlansTable(const v1::ListPlansResponse& plans) {
  if (plans.plans().empty()) return "no plans\n";
  std::vector<std::vector<std::string>> rows = {
      {"plan", "op", "tensors", "state", "done", "moved", "lower bound", "seconds", "group"}};
  for (const v1::PlanSummary& p : plans.plans()) {
    rows.push_back({p.plan_id(), p.op(), PlanTensors(p), v1::PlanState_Name(p.state()),
                    HumanBytes(p.bytes_done()), HumanBytes(p.bytes_moved()),
                    HumanBytes(p.lower_bound_bytes()), absl::StrFormat("%.3f", p.seconds()),
                    Or(p.group(), "-")});
  }
  std::string out = FormatTable(rows, {4, 5, 6, 7});
  for (const v1::PlanSummary& p : plans.plans()) {
    if (!p.error().empty()) absl::StrAppend(&out, p.plan_id(), ": ", p.error(), "\n");
  }
  return out;
}

std::string PlansJson(const v1::ListPlansResponse& plans) {
  JsonWriter w;
  w.BeginObject().Key("plans").BeginArray();
  for (const v1::PlanSummary& p : plans.plans()) {
    w.BeginObject();
    w.Key("plan_id").String(p.plan_id()).Key("op").String(p.op());
    w.Key("tensor").String(p.tensor()).Key("source_tensor").String(p.source_tensor());
    w.Key("group").String(p.group()).Key("state").String(v1::PlanState_Name(p.state()));
    w.Key("bytes_done").Int(p.bytes_done()).Key("bytes_moved").Int(p.bytes_moved());
    w.Key("lower_bound_bytes").Int(p.lower_bound_bytes());
    w.Key("start_unix_ms").Int(p.start_unix_ms()).Key("seconds").Double(p.seconds());
    w.Key("error").String(p.error());
    w.EndObject();
  }
  w.EndArray().EndObject();
  return w.str();
}

std::string TensorLine(const v1::TensorInfo& t) {
  return absl::StrCat(t.name(), "  ", BracketList(Ints(t.shape())), " ", DTypeText(t.dtype()), "  ",
                      t.spec(), " on mesh ", t.mesh(), "  ", HumanBytes(t.bytes()), "  version ",
                      t.version());
}

std::string TensorText(const v1::TensorInfo& t) {
  std::string out = absl::StrCat("tensor ", TensorLine(t), "\n");
  if (!t.busy_plan().empty()) absl::StrAppend(&out, "plan ", t.busy_plan(), " is running on it\n");
  if (t.attached()) {
    absl::StrAppend(&out, "attached: its ranks' buffers live in user processes",
                    t.unattached_ranks_size() > 0
                        ? absl::StrCat("; no buffer attached on rank",
                                       t.unattached_ranks_size() > 1 ? "s " : " ",
                                       absl::StrJoin(t.unattached_ranks(), ", "))
                        : std::string(),
                    "\n");
  }
  if (t.lost_chunks_size() > 0) {
    absl::StrAppend(&out, "LOST (no live replica): ", absl::StrJoin(t.lost_chunks(), "; "), "\n");
  }
  const int64_t element_size = [&] {
    absl::StatusOr<DType> d = DTypeFromProto(t.dtype());
    return d.ok() ? ElementSize(*d) : int64_t{0};
  }();
  const v1::Layout& layout = t.layout();
  bool partial = layout.num_partials() > 1, local = false;
  for (const v1::RankChunks& rc : layout.ranks()) {
    for (const v1::Chunk& c : rc.chunks()) local |= c.local_offset() != 0;
  }
  std::vector<std::string> header = {"rank", "coord", "offset", "shape", "bytes"};
  if (local) header.push_back("local offset");
  if (partial) header.push_back("partial");
  header.push_back("checksum");
  std::vector<std::vector<std::string>> rows = {header};
  for (const v1::RankChunks& rc : layout.ranks()) {
    const std::string coord = rc.coord_size() == 0 ? "-" : BracketList(Ints(rc.coord()));
    if (rc.chunks_size() == 0) {
      std::vector<std::string> row = {absl::StrCat(rc.rank()), coord, "-", "-", "0"};
      if (local) row.push_back("-");
      if (partial) row.push_back("-");
      row.push_back("-");
      rows.push_back(std::move(row));
    }
    for (const v1::Chunk& c : rc.chunks()) {
      int64_t volume = 1;
      for (int64_t d : c.box().shape()) volume *= d;
      std::vector<std::string> row = {
          absl::StrCat(rc.rank()), coord, BracketList(Ints(c.box().offset())),
          BracketList(Ints(c.box().shape())), absl::StrCat(volume * element_size)};
      if (local) row.push_back(absl::StrCat(c.local_offset()));
      if (partial) row.push_back(absl::StrCat(c.partial_index()));
      row.push_back(Checksum(c.checksum()));
      rows.push_back(std::move(row));
    }
  }
  absl::StrAppend(&out, "\n", FormatTable(rows, {0, 4}));
  absl::StatusOr<Layout> parsed = LayoutFromProto(layout, "layout");
  if (parsed.ok()) {
    const std::string picture = LayoutPicture(*parsed);
    if (!picture.empty()) absl::StrAppend(&out, "\n", picture);
  } else {
    // Show what arrived even when it does not validate; say why there is no picture.
    absl::StrAppend(&out, "\nno picture: ", parsed.status().message(), "\n");
  }
  return out;
}

std::string TensorJson(const v1::TensorInfo& t) {
  JsonWriter w;
  w.BeginObject();
  w.Key("name").String(t.name());
  w.Key("shape").IntArray(Ints(t.shape()));
  w.Key("dtype").String(DTypeText(t.dtype()));
  w.Key("mesh").String(t.mesh());
  w.Key("spec").String(t.spec());
  w.Key("version").Int(t.version());
  w.Key("bytes").Int(t.bytes());
  w.Key("busy_plan").String(t.busy_plan());
  w.Key("lost_chunks");
  StringArray(w, t.lost_chunks());
  w.Key("attached").Bool(t.attached());
  w.Key("unattached_ranks").IntArray(Ints(t.unattached_ranks()));
  w.Key("chunks").BeginArray();
  for (const v1::RankChunks& rc : t.layout().ranks()) {
    for (const v1::Chunk& c : rc.chunks()) {
      w.BeginObject();
      w.Key("rank").Int(rc.rank());
      w.Key("coord").IntArray(Ints(rc.coord()));
      w.Key("offset").IntArray(Ints(c.box().offset()));
      w.Key("shape").IntArray(Ints(c.box().shape()));
      w.Key("local_offset").Int(c.local_offset());
      w.Key("partial_index").Int(c.partial_index());
      w.Key("checksum").String(absl::StrFormat("%016x", c.checksum()));
      w.EndObject();
    }
  }
  w.EndArray().EndObject();
  return w.str();
}

std::string PlanOutcomeText(absl::string_view verb, const v1::RedistributeResponse& response) {
  const v1::PlanProgress& p = response.progress();
  const v1::Plan& plan = response.plan();
  std::string out = absl::StrCat(verb, " '", Or(p.tensor(), plan.tensor()), "': plan ",
                                 Or(p.plan_id(), plan.id()), " ", v1::PlanState_Name(p.state()));
  if (p.seconds() > 0) absl::StrAppend(&out, absl::StrFormat(" in %.3f s", p.seconds()));
  absl::StrAppend(&out, "\n");
  // Count steps by op, in order of first appearance.
  std::vector<std::pair<std::string, int>> ops;
  for (const v1::Step& s : plan.steps()) {
    const std::string name = StepOpText(s.op());
    auto it = std::find_if(ops.begin(), ops.end(), [&](const auto& e) { return e.first == name; });
    if (it == ops.end()) {
      ops.emplace_back(name, 1);
    } else {
      ++it->second;
    }
  }
  std::vector<std::string> op_text;
  for (const auto& [name, n] : ops) op_text.push_back(n == 1 ? name : absl::StrCat(name, " x", n));
  absl::StrAppend(&out, "  ", HumanBytes(plan.bytes_moved()), " moved (lower bound ",
                  HumanBytes(plan.lower_bound_bytes()), "), ", plan.steps_size(),
                  plan.steps_size() == 1 ? " step" : " steps", op_text.empty() ? "" : ": ",
                  absl::StrJoin(op_text, ", "), "\n");
  if (plan.has_target() && plan.target().ranks_size() > 0) {
    absl::StrAppend(&out, "  now on ranks ");
    std::vector<int64_t> ranks;
    for (const v1::RankChunks& rc : plan.target().ranks()) ranks.push_back(rc.rank());
    absl::StrAppend(&out, BracketList(ranks), "\n");
  }
  if (p.bucket_bytes() > 0) {
    absl::StrAppend(&out, "  buckets of at most ", HumanBytes(p.bucket_bytes()), "\n");
  }
  if (!p.waiting_for_memory().empty()) {
    absl::StrAppend(&out, "  waiting for memory: ", p.waiting_for_memory(), "\n");
  }
  if (!p.error().empty()) absl::StrAppend(&out, "  error: ", p.error(), "\n");
  return out;
}

namespace {

// PlanOutcomeJson's fields, inside an object the caller opened.
void PlanOutcomeFields(const v1::PlanProgress& p, const v1::Plan& plan, JsonWriter& w) {
  w.Key("plan_id").String(Or(p.plan_id(), plan.id()));
  w.Key("tensor").String(Or(p.tensor(), plan.tensor()));
  w.Key("state").String(v1::PlanState_Name(p.state()));
  w.Key("seconds").Double(p.seconds());
  w.Key("bytes_done").Int(p.bytes_done());
  w.Key("bytes_total").Int(p.bytes_total());
  w.Key("bytes_moved").Int(plan.bytes_moved());
  w.Key("lower_bound_bytes").Int(plan.lower_bound_bytes());
  w.Key("steps").BeginArray();
  for (const v1::Step& s : plan.steps()) {
    w.BeginObject();
    w.Key("op").String(StepOpText(s.op()));
    w.Key("ranks").IntArray(Ints(s.ranks()));
    w.Key("bytes").Int(s.bytes());
    w.EndObject();
  }
  w.EndArray();
  w.Key("bucket_bytes").Int(p.bucket_bytes());
  w.Key("error").String(p.error());
}

v1::RedistributeResponse AsPlanResponse(const v1::CopyResponse& response) {
  v1::RedistributeResponse r;
  *r.mutable_progress() = response.progress();
  *r.mutable_plan() = response.plan();
  return r;
}

}  // namespace

std::string PlanOutcomeJson(const v1::RedistributeResponse& response) {
  JsonWriter w;
  w.BeginObject();
  PlanOutcomeFields(response.progress(), response.plan(), w);
  w.EndObject();
  return w.str();
}

std::string CopyOutcomeText(const v1::CopyRequest& request, const v1::CopyResponse& response) {
  std::string out =
      PlanOutcomeText(absl::StrCat("copied '", request.src(), "' into"), AsPlanResponse(response));
  if (response.progress().state() == v1::COMMITTED) {
    absl::StrAppend(&out, "  ", request.dst(), " is now version ", response.dst_version(), "\n");
  }
  return out;
}

std::string CopyOutcomeJson(const v1::CopyRequest& request, const v1::CopyResponse& response) {
  JsonWriter w;
  w.BeginObject();
  w.Key("src").String(request.src());
  w.Key("dst").String(request.dst());
  w.Key("dst_version").Int(response.dst_version());
  PlanOutcomeFields(response.progress(), response.plan(), w);
  w.EndObject();
  return w.str();
}

namespace {

// "  4.00 MiB moved (lower bound 4.00 MiB) in 12 buckets of at most 64.00 MiB\n"
std::string GroupBytesLine(int64_t moved, int64_t lower_bound, int64_t buckets,
                           int64_t bucket_bytes) {
  std::string out =
      absl::StrCat("  ", HumanBytes(moved), " moved (lower bound ", HumanBytes(lower_bound), ")");
  if (bucket_bytes > 0) {
    absl::StrAppend(&out, " in ", buckets, buckets == 1 ? " bucket" : " buckets", " of at most ",
                    HumanBytes(bucket_bytes));
  }
  return out + "\n";
}

// A group's text: "<verb> N tensors as group g-1: STATE in S s\n", the bytes line, and a line
// "  <member_label(m)> (plan P)\n" for each member. CopyGroupResponse and
// RedistributeGroupResponse share the group fields; only their members differ.
template <typename Response, typename MemberLabel>
std::string GroupOutcomeText(const Response& response, absl::string_view verb,
                             MemberLabel member_label) {
  const int members = response.members_size();
  std::string out =
      absl::StrCat(verb, " ", members, members == 1 ? " tensor" : " tensors", " as group ",
                   response.group_id(), ": ", v1::PlanState_Name(response.state()));
  if (response.seconds() > 0)
    absl::StrAppend(&out, absl::StrFormat(" in %.3f s", response.seconds()));
  absl::StrAppend(&out, "\n",
                  GroupBytesLine(response.bytes_moved(), response.lower_bound_bytes(),
                                 response.buckets(), response.bucket_bytes()));
  for (const auto& m : response.members()) {
    absl::StrAppend(&out, "  ", member_label(m), " (plan ",
                    Or(m.progress().plan_id(), m.plan().id()), ")\n");
  }
  return out;
}

// A group's JSON object: the group fields, then "members", each member's own fields
// (member_fields) followed by its plan's.
template <typename Response, typename MemberFields>
std::string GroupOutcomeJson(const Response& response, MemberFields member_fields) {
  JsonWriter w;
  w.BeginObject();
  w.Key("group_id").String(response.group_id());
  w.Key("state").String(v1::PlanState_Name(response.state()));
  w.Key("seconds").Double(response.seconds());
  w.Key("tensors").Int(response.members_size());
  w.Key("bytes_moved").Int(response.bytes_moved());
  w.Key("lower_bound_bytes").Int(response.lower_bound_bytes());
  w.Key("buckets").Int(response.buckets());
  w.Key("bucket_bytes").Int(response.bucket_bytes());
  w.Key("members").BeginArray();
  for (const auto& m : response.members()) {
    w.BeginObject();
    member_fields(w, m);
    w.Key("plan_id").String(Or(m.progress().plan_id(), m.plan().id()));
    w.Key("state").String(v1::PlanState_Name(m.progress().state()));
    w.Key("bytes_moved").Int(m.plan().bytes_moved());
    w.Key("lower_bound_bytes").Int(m.plan().lower_bound_bytes());
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return w.str();
}

}  // namespace

std::string CopyGroupOutcomeText(const v1::CopyGroupResponse& response) {
  std::string out = GroupOutcomeText(response, "copied", [](const v1::CopyGroupMember& m) {
    std::string label = absl::StrCat(m.src(), " -> ", m.dst(), ": version ", m.dst_version());
    if (m.has_block_copy()) {
      const v1::BlockCopyInfo& b = m.block_copy();
      if (b.scale_version() > 0) absl::StrAppend(&label, ", scales version ", b.scale_version());
      absl::StrAppend(&label, "; ", b.blocks(), " blocks, ", b.cut_blocks(),
                      " cut across source ranks, ", HumanBytes(b.staged_bytes()), " staged, ",
                      HumanBytes(b.bytes_moved()), " moved in all");
    }
    return label;
  });
  if (!response.stage_group().empty()) {
    absl::StrAppend(&out, "  blocks made whole by group ", response.stage_group(), ": ",
                    HumanBytes(response.staged_bytes()), " staged (in the bytes above)\n");
  }
  return out;
}

std::string CopyGroupOutcomeJson(const v1::CopyGroupResponse& response) {
  return GroupOutcomeJson(response, [](JsonWriter& w, const v1::CopyGroupMember& m) {
    w.Key("src").String(m.src());
    w.Key("dst").String(m.dst());
    w.Key("dst_version").Int(m.dst_version());
    if (m.has_block_copy()) {
      const v1::BlockCopyInfo& b = m.block_copy();
      w.Key("block_copy").BeginObject();
      w.Key("scale_version").Int(b.scale_version());
      w.Key("blocks").Int(b.blocks());
      w.Key("cut_blocks").Int(b.cut_blocks());
      w.Key("staged_bytes").Int(b.staged_bytes());
      w.Key("bytes_moved").Int(b.bytes_moved());
      w.EndObject();
    }
  });
}

std::string RedistributeGroupOutcomeText(const v1::RedistributeGroupResponse& response,
                                         absl::string_view verb) {
  return GroupOutcomeText(response, verb, [](const v1::RedistributeGroupMember& m) {
    return absl::StrCat(m.tensor(), ": version ", m.version());
  });
}

std::string RedistributeGroupOutcomeJson(const v1::RedistributeGroupResponse& response) {
  return GroupOutcomeJson(response, [](JsonWriter& w, const v1::RedistributeGroupMember& m) {
    w.Key("tensor").String(m.tensor());
    w.Key("version").Int(m.version());
  });
}

}  // namespace shardcoord
