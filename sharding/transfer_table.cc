#include "sharding/transfer_table.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "sharding/cast.h"
#include "sharding/plan_participants.h"
#include "sharding/redistribute.h"

namespace shardcoord {
namespace {

std::string Where(size_t i, const char* field) { return absl::StrCat("members[", i, "].", field); }

bool HoldsChunks(const Layout& layout, int64_t rank) {
  const RankChunks* rc = layout.Find(rank);
  return rc != nullptr && !rc->chunks.empty();
}

// Adds member `i`'s target chunks on a rank to the rank's replica key (RankTransfer::
// replica_key): ExpandTransfer and SummarizeTransfer hash alike.
void AddReplica(size_t i, const RankChunks& target, StableHash* key) {
  key->Add(i);
  for (const Chunk& c : target.chunks) {
    key->Add(c.box);
    key->Add(static_cast<uint64_t>(c.partial_index));
  }
}

}  // namespace

void StableHash::Add(uint64_t v) {
  // splitmix64's finalizer over the running value: cheap, and every input bit reaches every
  // output bit.
  uint64_t z = h_ ^ (v + 0x9e3779b97f4a7c15ull + (h_ << 6) + (h_ >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  h_ = z ^ (z >> 31);
}

void StableHash::Add(const Box& b) {
  Add(static_cast<uint64_t>(b.ndim()));
  for (int d = 0; d < b.ndim(); ++d) {
    Add(static_cast<uint64_t>(b.offset(d)));
    Add(static_cast<uint64_t>(b.shape(d)));
  }
}

uint64_t StableHash::value() const { return h_; }

absl::Status ValidateTransferTable(const TransferTable& table) {
  const int64_t layouts = static_cast<int64_t>(table.layouts.size());
  absl::flat_hash_map<absl::string_view, size_t> named;
  named.reserve(table.members.size() * 2);
  for (size_t i = 0; i < table.members.size(); ++i) {
    const TransferMemberSpec& m = table.members[i];
    if (m.src.empty()) return absl::InvalidArgumentError(absl::StrCat(Where(i, "src"), ": empty"));
    if (m.dst.empty()) return absl::InvalidArgumentError(absl::StrCat(Where(i, "dst"), ": empty"));
    if (m.src == m.dst) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(i, "dst"), ": '", m.dst, "' is also the member's src"));
    }
    for (const bool is_src : {true, false}) {
      const std::string& name = is_src ? m.src : m.dst;
      auto [it, added] = named.try_emplace(name, i);
      if (!added) {
        return absl::InvalidArgumentError(absl::StrCat(Where(i, is_src ? "src" : "dst"), ": '",
                                                       name, "' is also named by members[",
                                                       it->second, "]"));
      }
    }
    if (m.src_version <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(i, "src_version"), ": ", m.src_version, " (must be positive)"));
    }
    if (m.dst_version <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(i, "dst_version"), ": ", m.dst_version, " (must be positive)"));
    }
    if (m.src_layout < 0 || m.src_layout >= layouts) {
      return absl::InvalidArgumentError(absl::StrCat(Where(i, "src_layout"), ": ", m.src_layout,
                                                     " (the table has ", layouts, " layouts)"));
    }
    if (m.dst_layout < 0 || m.dst_layout >= layouts) {
      return absl::InvalidArgumentError(absl::StrCat(Where(i, "dst_layout"), ": ", m.dst_layout,
                                                     " (the table has ", layouts, " layouts)"));
    }
    if (table.layouts[m.src_layout].global_shape() != table.layouts[m.dst_layout].global_shape()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(i, "dst_layout"), ": layout ", m.dst_layout,
                       " is of another global shape than the src's (layout ", m.src_layout, ")"));
    }
    if (m.cast_to.has_value()) {
      if (absl::Status s = CheckCast(m.dtype, *m.cast_to); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(Where(i, "cast_to"), ": ", s.message()));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> TransferParticipants(const TransferTable& table) {
  std::vector<int64_t> out;
  for (const Layout& layout : table.layouts) {
    for (const RankChunks& rc : layout.ranks()) {
      if (!rc.chunks.empty()) out.push_back(rc.rank);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

TransferTemplates TemplatesOf(const TransferTable& table) {
  TransferTemplates out;
  out.of_member.reserve(table.members.size());
  absl::flat_hash_map<std::tuple<int32_t, int32_t, int, int>, int32_t> index;
  for (const TransferMemberSpec& m : table.members) {
    auto [it, added] =
        index.try_emplace(std::make_tuple(m.src_layout, m.dst_layout, static_cast<int>(m.dtype),
                                          static_cast<int>(m.target_dtype())),
                          static_cast<int32_t>(out.templates.size()));
    if (added) out.templates.push_back({m.src_layout, m.dst_layout, m.dtype, m.cast_to});
    out.of_member.push_back(it->second);
  }
  return out;
}

namespace {

// A table's templates, each with its first member (to name it in errors) and its number of
// members, planned alike by ExpandTransfer and SummarizeTransfer.
struct TemplateIndex {
  explicit TemplateIndex(const TransferTable& table)
      : templates(TemplatesOf(table)),
        first_member(templates.templates.size(), table.members.size()),
        members_of(templates.templates.size(), 0) {
    for (size_t i = table.members.size(); i-- > 0;) {
      first_member[templates.of_member[i]] = i;
      ++members_of[templates.of_member[i]];
    }
    plan_options.hosts_by_rank = table.hosts_by_rank;
    plan_options.use_collectives = false;
  }

  // Template k's plan; an error names its first member.
  absl::StatusOr<Plan> PlanOf(const TransferTable& table, size_t k) const {
    const TransferTemplate& t = templates.templates[k];
    absl::StatusOr<Plan> plan =
        Redistribute(table.layouts[t.src_layout], table.layouts[t.dst_layout], t.dtype,
                     t.target_dtype(), plan_options);
    if (!plan.ok()) {
      const TransferMemberSpec& m = table.members[first_member[k]];
      return absl::Status(plan.status().code(),
                          absl::StrCat("members[", first_member[k], "] ('", m.src, "' -> '", m.dst,
                                       "'): ", plan.status().message()));
    }
    return plan;
  }

  TransferTemplates templates;
  std::vector<size_t> first_member;
  std::vector<int64_t> members_of;
  PlanOptions plan_options;
};

}  // namespace

absl::StatusOr<RankTransfer> ExpandTransfer(const TransferTable& table, int64_t rank,
                                            const ExpandOptions& options) {
  if (absl::Status s = ValidateTransferTable(table); !s.ok()) return s;
  const TemplateIndex index(table);
  const TransferTemplates& templates = index.templates;

  RankTransfer out;
  Fragment& f = out.fragment;
  f.plan_id = options.transfer_id;
  f.rank = rank;
  f.fused = true;
  f.step_timeout_ms = options.step_timeout_ms;
  // Template -> index of its shape in f.shapes, or -1: the rank takes no part.
  std::vector<int> shape_of(templates.templates.size(), -1);
  std::vector<int64_t> received_of(templates.templates.size(), 0);
  for (size_t k = 0; k < templates.templates.size(); ++k) {
    const TransferTemplate& t = templates.templates[k];
    const Layout& src = table.layouts[t.src_layout];
    const Layout& dst = table.layouts[t.dst_layout];
    // Only holders of source chunks and ranks of the target ever send, receive, copy or hold
    // a target buffer (a rank listed with no target chunks may hold a lent buffer, which
    // follows the dst's versions): the rest need not plan.
    if (!HoldsChunks(src, rank) && dst.Find(rank) == nullptr) continue;
    absl::StatusOr<Plan> plan = index.PlanOf(table, k);
    if (!plan.ok()) return plan.status();
    ++out.templates_planned;
    FragmentShape shape;
    if (!FusedShapeFor(*plan, rank, &shape)) continue;
    // A source listed with no chunks holds nothing to read.
    if (!HoldsChunks(src, rank)) shape.source.chunks.clear();
    const std::vector<int64_t> participants = PlanParticipants(*plan);
    const bool owner = !participants.empty() && participants.front() == rank;
    const int64_t members = index.members_of[k];
    if (owner) {
      out.owned_bytes_moved += plan->bytes_moved * members;
      out.owned_lower_bound_bytes += plan->lower_bound_bytes * members;
    }
    for (const Transfer& tr : shape.transfers) {
      if (tr.dst == rank) received_of[k] += tr.bytes;
      if (tr.src == rank) out.bytes_sent += tr.bytes * members;
    }
    shape_of[k] = static_cast<int>(f.shapes.size());
    f.shapes.push_back(std::move(shape));
  }

  StableHash replicas;
  bool holds_target = false;
  for (size_t i = 0; i < table.members.size(); ++i) {
    const int32_t k = templates.of_member[i];
    if (shape_of[k] < 0) continue;
    const TransferMemberSpec& m = table.members[i];
    const FragmentShape& shape = f.shapes[shape_of[k]];
    FragmentMember& fm = f.members.emplace_back();
    fm.index = static_cast<int32_t>(i);
    fm.plan_id = options.transfer_id;
    fm.tensor = m.src;
    fm.target_tensor = m.dst;
    fm.source_version = m.src_version;
    fm.target_version = m.dst_version;
    // Only ranks of the dst's layout hold a lent buffer of it.
    if (m.dst_attached && table.layouts[m.dst_layout].Find(rank) != nullptr) {
      fm.attached_target_version = m.dst_version;
    }
    fm.shape = shape_of[k];
    out.bytes_received += received_of[k];
    if (!shape.target.chunks.empty()) {
      holds_target = true;
      AddReplica(i, shape.target, &replicas);
      if (!m.dst_attached)
        out.target_bytes += shape.target.local_elements * ElementSize(m.target_dtype());
    }
  }
  out.replica_key = holds_target ? replicas.value() : 0;

  const std::vector<int64_t> exchange = TransferParticipants(table);
  if (std::binary_search(exchange.begin(), exchange.end(), rank)) {
    f.exchange_ranks = exchange;
    f.member_incarnations.reserve(exchange.size());
    for (int64_t r : exchange) {
      auto it = options.incarnations.find(r);
      f.member_incarnations[r] = it == options.incarnations.end() ? 0 : it->second;
    }
  }
  return out;
}

absl::StatusOr<std::vector<RankTransfer>> SummarizeTransfer(const TransferTable& table) {
  if (absl::Status s = ValidateTransferTable(table); !s.ok()) return s;
  int64_t ranks = static_cast<int64_t>(table.hosts_by_rank.size());
  for (const Layout& layout : table.layouts) {
    for (const RankChunks& rc : layout.ranks()) ranks = std::max(ranks, rc.rank + 1);
  }
  std::vector<RankTransfer> out(static_cast<size_t>(ranks));
  const TemplateIndex index(table);
  const TransferTemplates& templates = index.templates;

  // Each template planned once; its bytes go to the ranks that send and receive them, as each
  // rank's ExpandTransfer counts them.
  for (size_t k = 0; k < templates.templates.size(); ++k) {
    const TransferTemplate& t = templates.templates[k];
    const Layout& src = table.layouts[t.src_layout];
    const Layout& dst = table.layouts[t.dst_layout];
    absl::StatusOr<Plan> plan = index.PlanOf(table, k);
    if (!plan.ok()) return plan.status();
    const int64_t members = index.members_of[k];
    // The ranks that plan it: holders of source chunks and ranks of the target.
    std::vector<int64_t> planners;
    for (const RankChunks& rc : src.ranks()) {
      if (!rc.chunks.empty()) planners.push_back(rc.rank);
    }
    for (const RankChunks& rc : dst.ranks()) planners.push_back(rc.rank);
    std::sort(planners.begin(), planners.end());
    planners.erase(std::unique(planners.begin(), planners.end()), planners.end());
    for (int64_t r : planners) ++out[r].templates_planned;
    const std::vector<int64_t> participants = PlanParticipants(*plan);
    if (!participants.empty()) {
      out[participants.front()].owned_bytes_moved += plan->bytes_moved * members;
      out[participants.front()].owned_lower_bound_bytes += plan->lower_bound_bytes * members;
    }
    for (const Step& step : plan->steps) {
      for (const Transfer& tr : step.transfers) {
        out[tr.src].bytes_sent += tr.bytes * members;
        out[tr.dst].bytes_received += tr.bytes * members;
      }
    }
  }

  // Target bytes and replica keys follow from each rank's target chunks of every member:
  // computed once per class of ranks whose target chunks are equal in every dst layout (the
  // replicas of a data-parallel engine), then shared.
  std::vector<int32_t> dst_layouts;
  for (const TransferMemberSpec& m : table.members) dst_layouts.push_back(m.dst_layout);
  std::sort(dst_layouts.begin(), dst_layouts.end());
  dst_layouts.erase(std::unique(dst_layouts.begin(), dst_layouts.end()), dst_layouts.end());
  auto target_of = [&table](int32_t layout, int64_t rank) -> const RankChunks* {
    const RankChunks* rc = table.layouts[layout].Find(rank);
    return rc != nullptr && !rc->chunks.empty() ? rc : nullptr;
  };
  auto same_targets = [&](int64_t a, int64_t b) {
    for (int32_t l : dst_layouts) {
      const RankChunks* x = target_of(l, a);
      const RankChunks* y = target_of(l, b);
      if ((x == nullptr) != (y == nullptr)) return false;
      if (x != nullptr && (x->chunks != y->chunks || x->local_elements != y->local_elements)) {
        return false;
      }
    }
    return true;
  };
  absl::flat_hash_map<uint64_t, std::vector<int64_t>> classes;  // By a hash of the targets.
  for (int64_t rank = 0; rank < ranks; ++rank) {
    StableHash signature;
    for (int32_t l : dst_layouts) {
      if (const RankChunks* rc = target_of(l, rank); rc != nullptr) {
        AddReplica(static_cast<size_t>(l), *rc, &signature);
      }
    }
    std::vector<int64_t>& same = classes[signature.value()];
    auto it = std::find_if(same.begin(), same.end(),
                           [&](int64_t other) { return same_targets(other, rank); });
    if (it != same.end()) {
      out[rank].target_bytes = out[*it].target_bytes;
      out[rank].replica_key = out[*it].replica_key;
      continue;
    }
    same.push_back(rank);
    StableHash replicas;
    bool holds_target = false;
    for (size_t i = 0; i < table.members.size(); ++i) {
      const TransferMemberSpec& m = table.members[i];
      const RankChunks* rc = target_of(m.dst_layout, rank);
      if (rc == nullptr) continue;
      holds_target = true;
      AddReplica(i, *rc, &replicas);
      if (!m.dst_attached)
        out[rank].target_bytes += rc->local_elements * ElementSize(m.target_dtype());
    }
    out[rank].replica_key = holds_target ? replicas.value() : 0;
  }
  return out;
}

}  // namespace shardcoord
