#include "sharding/plan_fragment.h"

#include <algorithm>
#include <set>
#include <utility>

#include "sharding/plan_participants.h"

namespace shardcoord {
namespace {

// `rank`'s shape in `shapes` (sorted by rank). Every rank a plan names is a participant; one
// that is not gets a bare shape of its own, as a map's operator[] would give it.
FragmentShape& ShapeOf(std::vector<FragmentShape>& shapes, int64_t rank) {
  auto it = std::lower_bound(shapes.begin(), shapes.end(), rank,
                             [](const FragmentShape& s, int64_t r) { return s.rank < r; });
  if (it == shapes.end() || it->rank != rank) {
    it = shapes.insert(it, FragmentShape{});
    it->rank = rank;
    it->source.rank = rank;
    it->target.rank = rank;
  }
  return *it;
}

// What each participant of `plan` does in it, sorted by rank, without steps or transfers. A
// sorted vector: a plan has a handful of ranks, and this runs for every plan sent.
std::vector<FragmentShape> BareShapes(const Plan& plan) {
  const std::vector<int64_t> ranks = PlanParticipants(plan);  // Sorted.
  std::vector<FragmentShape> out(ranks.size());
  const std::vector<int64_t>& zero_fill = plan.zero_fill_ranks;  // Sorted.
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int64_t rank = ranks[i];
    FragmentShape& s = out[i];
    s.rank = rank;
    s.dtype = plan.dtype;
    if (const RankChunks* rc = plan.source.Find(rank)) s.source = *rc;
    s.source.rank = rank;
    if (const RankChunks* rc = plan.target.Find(rank)) s.target = *rc;
    s.target.rank = rank;
    s.zero_fill = std::binary_search(zero_fill.begin(), zero_fill.end(), rank);
    s.divide_by = plan.divide_by;
    s.reduce_op = plan.source.partial_op();
    s.num_partials = plan.source.num_partials();
  }
  for (const LocalCopy& c : plan.local_copies) ShapeOf(out, c.rank).local_copies.push_back(c);
  return out;
}

FragmentMember MemberFor(const Plan& plan, int64_t rank, const FragmentMemberOptions& o, int shape,
                         const FragmentOptions& options) {
  FragmentMember m;
  m.index = o.index;
  m.plan_id = o.plan_id.empty() ? options.plan_id : o.plan_id;
  m.tensor = o.tensor;
  m.target_tensor = o.target_tensor.empty() ? o.tensor : o.target_tensor;
  m.source_version = o.source_version;
  m.target_version = o.target_version;
  // Only ranks of the target layout hold a lent buffer of the target tensor.
  if (plan.target.Find(rank) != nullptr) m.attached_target_version = o.attached_target_version;
  m.shape = shape;
  return m;
}

int64_t IncarnationOf(const FragmentOptions& options, int64_t rank) {
  auto it = options.incarnations.find(rank);
  return it == options.incarnations.end() ? 0 : it->second;
}

Fragment EmptyFragment(int64_t rank, const FragmentOptions& options) {
  Fragment f;
  f.plan_id = options.plan_id;
  f.rank = rank;
  f.fused = options.fused;
  f.bucket_bytes = options.bucket_bytes;
  f.step_timeout_ms = options.step_timeout_ms;
  f.communicator_prefix = options.communicator_prefix;
  return f;
}

// One plan's fragments: each rank's steps, run in order.
std::map<int64_t, Fragment> PlanFragments(const Plan& plan, const FragmentMemberOptions& member,
                                          const FragmentOptions& options) {
  std::map<int64_t, Fragment> out;
  std::vector<int64_t> peers;
  for (FragmentShape& shape : BareShapes(plan)) {
    const int64_t rank = shape.rank;
    Fragment& f = out.emplace_hint(out.end(), rank, EmptyFragment(rank, options))->second;
    shape.plan_steps = &plan.steps;
    peers.assign(1, rank);
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      const Step& s = plan.steps[i];
      if (std::find(s.ranks.begin(), s.ranks.end(), rank) == s.ranks.end()) continue;
      shape.step_indices.push_back(static_cast<int>(i));
      peers.insert(peers.end(), s.ranks.begin(), s.ranks.end());
    }
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    f.member_incarnations.reserve(peers.size());
    for (int64_t p : peers) f.member_incarnations.emplace(p, IncarnationOf(options, p));
    f.members.push_back(MemberFor(plan, rank, member, 0, options));
    f.shapes.push_back(std::move(shape));
  }
  return out;
}

// A fused transaction's fragments: the shape of every distinct plan, and every member.
std::map<int64_t, Fragment> FusedFragments(absl::Span<const Plan* const> plans,
                                           absl::Span<const FragmentMemberOptions> members,
                                           const FragmentOptions& options) {
  std::set<int64_t> exchange;
  std::map<int64_t, Fragment> out;
  // Members with the same plan (the plan cache hands out one object per distinct plan)
  // share its shapes: each rank's shape of a plan is made once.
  absl::flat_hash_map<const Plan*, std::map<int64_t, int>> shape_index;  // Rank -> index.
  for (size_t i = 0; i < plans.size(); ++i) {
    const Plan& plan = *plans[i];
    auto [it, inserted] = shape_index.try_emplace(&plan);
    std::map<int64_t, int>& index = it->second;
    if (inserted) {
      std::vector<FragmentShape> shapes = BareShapes(plan);
      for (const Step& step : plan.steps) {
        for (const Transfer& t : step.transfers) {
          ShapeOf(shapes, t.src).transfers.push_back(t);
          ShapeOf(shapes, t.dst).transfers.push_back(t);
          if (t.bytes == 0) continue;
          exchange.insert(t.src);
          exchange.insert(t.dst);
        }
      }
      for (FragmentShape& shape : shapes) {
        const int64_t rank = shape.rank;
        auto [fit, added] = out.try_emplace(rank);
        if (added) fit->second = EmptyFragment(rank, options);
        index[rank] = static_cast<int>(fit->second.shapes.size());
        fit->second.shapes.push_back(std::move(shape));
      }
    }
    for (const auto& [rank, k] : index) {
      out[rank].members.push_back(MemberFor(plan, rank, members[i], k, options));
    }
  }
  for (auto& [rank, f] : out) {
    if (exchange.count(rank) == 0) continue;
    f.exchange_ranks.assign(exchange.begin(), exchange.end());
    for (int64_t r : exchange) f.member_incarnations[r] = IncarnationOf(options, r);
  }
  return out;
}

}  // namespace

bool FusedShapeFor(const Plan& plan, int64_t rank, FragmentShape* out) {
  FragmentShape s;
  s.rank = rank;
  s.dtype = plan.dtype;
  const RankChunks* source = plan.source.Find(rank);
  const RankChunks* target = plan.target.Find(rank);
  if (source != nullptr) s.source = *source;
  s.source.rank = rank;
  if (target != nullptr) s.target = *target;
  s.target.rank = rank;
  s.zero_fill = std::binary_search(plan.zero_fill_ranks.begin(), plan.zero_fill_ranks.end(), rank);
  s.divide_by = plan.divide_by;
  s.reduce_op = plan.source.partial_op();
  s.num_partials = plan.source.num_partials();
  for (const LocalCopy& c : plan.local_copies) {
    if (c.rank == rank) s.local_copies.push_back(c);
  }
  for (const Step& step : plan.steps) {
    for (const Transfer& t : step.transfers) {
      if (t.src == rank || t.dst == rank) s.transfers.push_back(t);
    }
  }
  if (source == nullptr && target == nullptr && !s.zero_fill && s.local_copies.empty() &&
      s.transfers.empty()) {
    return false;
  }
  *out = std::move(s);
  return true;
}

std::map<int64_t, Fragment> MakeFragments(absl::Span<const Plan* const> plans,
                                          absl::Span<const FragmentMemberOptions> members,
                                          const FragmentOptions& options) {
  if (options.fused) return FusedFragments(plans, members, options);
  if (plans.empty() || members.empty()) return {};
  return PlanFragments(*plans[0], members[0], options);
}

}  // namespace shardcoord
