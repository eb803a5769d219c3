#include "sharding/redistribute.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sharding/box.h"
#include "sharding/lowering.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/rank_index.h"
#include "sharding/sender_assignment.h"
#include "sharding/spatial_index.h"

namespace shardcoord {
namespace {

bool NeedsValue(const Layout& target, const Chunk& c) {
  return !(target.is_partial() && target.partial_op() == ReduceOp::kSum && c.partial_index != 0);
}

class Planner {
 public:
  Planner(const Layout& source, const Layout& target, DType dtype, const PlanOptions& options,
          Plan* plan)
      : source_(source),
        target_(target),
        options_(options),
        hosts_(HostMapFor(options)),
        esize_(ElementSize(dtype)),
        plan_(plan),
        ranks_(source, target) {
    host_.reserve(ranks_.size());
    for (int id = 0; id < ranks_.size(); ++id) host_.push_back(hosts_.HostOf(ranks_.Rank(id)));
  }

  void Run() {
    const bool partial = source_.is_partial();
    plan_->reduce_op =
        source_.partial_op() == ReduceOp::kAvg ? ReduceOp::kSum : source_.partial_op();
    if (partial && source_ == target_) {  // Contributions stay where they are.
      for (const RankChunks& rc : source_.ranks()) {
        for (const Chunk& c : rc.chunks) {
          if (!c.box.Empty())
            plan_->local_copies.push_back({rc.rank, c.box, false, c.partial_index, -1});
        }
      }
      SortLocalCopies();
      Finish({});
      return;
    }
    if (partial && source_.partial_op() == ReduceOp::kAvg) {
      plan_->divide_by = source_.num_partials();
    }
    if (target_.is_partial() && target_.partial_op() == ReduceOp::kSum) {
      for (const RankChunks& rc : target_.ranks()) {
        for (const Chunk& c : rc.chunks) {
          if (c.partial_index != 0 && !c.box.Empty()) {
            plan_->zero_fill_ranks.push_back(rc.rank);
            break;
          }
        }
      }
      std::sort(plan_->zero_fill_ranks.begin(), plan_->zero_fill_ranks.end());
    }
    BuildSourceBoxes();
    std::vector<Transfer> transfers = Intersect();
    SortLocalCopies();
    AssignSenders({source_, target_, ranks_, host_, hosts_.known(), boxes_, holders_,
                   demand_source_, demand_dst_},
                  transfers);
    Finish(std::move(transfers));
  }

 private:
  // Groups the source chunks into distinct (partial, box) with their holders. Distinct
  // non-empty boxes of one contribution cannot share an offset (the layout was validated),
  // so the row-major flat offset identifies a box and sorts it lexicographically.
  void BuildSourceBoxes() {
    struct Entry {
      int64_t partial;
      int64_t flat;
      int id;
      const Box* box;
    };
    const Shape strides = RowMajorStrides(source_.global_shape());
    std::vector<Entry> entries;
    entries.reserve(source_.ranks().size());
    for (const RankChunks& rc : source_.ranks()) {
      const int id = ranks_.Id(rc.rank);
      for (const Chunk& c : rc.chunks) {
        if (c.box.Empty()) continue;
        int64_t flat = 0;
        for (int d = 0; d < c.box.ndim(); ++d) flat += c.box.offset(d) * strides[d];
        entries.push_back({c.partial_index, flat, id, &c.box});
      }
    }
    auto before = [](const Entry& a, const Entry& b) {
      if (a.partial != b.partial) return a.partial < b.partial;
      return a.flat < b.flat;
    };
    if (!std::is_sorted(entries.begin(), entries.end(), before)) {
      // Stable LSD radix sort by flat offset, then by partial index: linear, where a
      // comparison sort of thousands of ranks would dominate planning.
      std::vector<Entry> tmp(entries.size());
      auto pass = [&](auto digit, size_t buckets) {
        std::vector<size_t> count(buckets + 1, 0);
        for (const Entry& e : entries) ++count[digit(e) + 1];
        for (size_t b = 0; b < buckets; ++b) count[b + 1] += count[b];
        for (const Entry& e : entries) tmp[count[digit(e)]++] = e;
        entries.swap(tmp);
      };
      int64_t max_flat = 0;
      for (const Entry& e : entries) max_flat = std::max(max_flat, e.flat);
      constexpr int kBits = 11;
      for (int shift = 0; shift < 63 && (shift == 0 || (max_flat >> shift) > 0); shift += kBits) {
        pass([shift](const Entry& e) { return (e.flat >> shift) & ((1 << kBits) - 1); },
             size_t{1} << kBits);
      }
      if (source_.num_partials() > 1) {
        pass([](const Entry& e) { return static_cast<size_t>(e.partial); }, source_.num_partials());
      }
    }
    partial_begin_.assign(source_.num_partials() + 1, 0);
    holders_.reserve(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i == 0 || entries[i].partial != entries[i - 1].partial ||
          entries[i].flat != entries[i - 1].flat) {
        if (!boxes_.empty()) boxes_.back().holders_end = holders_.size();
        boxes_.push_back({entries[i].box, entries[i].partial, holders_.size(), 0});
      }
      holders_.push_back(entries[i].id);
    }
    if (!boxes_.empty()) boxes_.back().holders_end = holders_.size();
    for (const SourceBox& b : boxes_) {  // Holders ascending (they came in layout order).
      if (b.holders_end - b.holders_begin > 1) {
        std::sort(holders_.begin() + b.holders_begin, holders_.begin() + b.holders_end);
      }
    }
    for (const SourceBox& b : boxes_) ++partial_begin_[b.partial + 1];
    for (int64_t p = 0; p < source_.num_partials(); ++p) {
      partial_begin_[p + 1] += partial_begin_[p];
    }
    index_.resize(source_.num_partials());
    for (int64_t p = 0; p < source_.num_partials(); ++p) {
      index_[p].Build(boxes_, partial_begin_[p], partial_begin_[p + 1], source_.ndim());
    }
  }

  // Whether a holder of source box `s` lives on `host` (HostOf ids; unknown hosts are
  // distinct, so only the holder itself matches).
  bool HolderOnHost(size_t s, int64_t host) {
    const SourceBox& b = boxes_[s];
    if (b.holders_end - b.holders_begin == 1) return host_[holders_[b.holders_begin]] == host;
    if (box_hosts_.empty()) box_hosts_.resize(boxes_.size());
    std::vector<int64_t>& hosts = box_hosts_[s];
    if (hosts.empty()) {
      for (size_t i = b.holders_begin; i < b.holders_end; ++i) hosts.push_back(host_[holders_[i]]);
      std::sort(hosts.begin(), hosts.end());
    }
    return std::binary_search(hosts.begin(), hosts.end(), host);
  }

  bool Holds(const SourceBox& b, int id) const {
    return std::binary_search(holders_.begin() + b.holders_begin, holders_.begin() + b.holders_end,
                              id);
  }

  // The boxes of target chunks of `rc` that need a value, made disjoint (only Partial
  // targets can hold overlapping ones).
  std::vector<Box> NeededBoxes(const RankChunks& rc) const {
    std::vector<Box> out;
    for (const Chunk& c : rc.chunks) {
      if (!c.box.Empty() && NeedsValue(target_, c)) out.push_back(c.box);
    }
    if (!target_.is_partial() || out.size() < 2) return out;
    std::vector<Box> disjoint;
    for (const Box& b : out) {
      std::vector<Box> pieces{b};
      for (const Box& a : disjoint) {
        std::vector<Box> next;
        for (const Box& p : pieces) {
          for (Box& q : SubtractBox(p, a)) next.push_back(std::move(q));
        }
        pieces = std::move(next);
      }
      for (Box& p : pieces) disjoint.push_back(std::move(p));
    }
    return disjoint;
  }

  // Splits every destination's needs along the source boxes: pieces it holds become local
  // copies, the rest transfers whose sender AssignSenders picks (src -1 until then; the
  // source box and destination id of each are kept in demand_source_ and demand_dst_).
  std::vector<Transfer> Intersect() {
    std::vector<Transfer> demands;
    demands.reserve(4 * target_.ranks().size());
    demand_source_.reserve(4 * target_.ranks().size());
    demand_dst_.reserve(4 * target_.ranks().size());
    plan_->local_copies.reserve(target_.ranks().size());
    const bool reduce = source_.is_partial();
    for (const RankChunks& rc : target_.ranks()) {
      const int dst = ranks_.Id(rc.rank);
      auto visit = [&](const Box& t) {
        for (int64_t p = 0; p < source_.num_partials(); ++p) {
          index_[p].ForEachOverlap(t, [&](size_t s) {
            const SourceBox& sb = boxes_[s];
            Box piece = t.Intersect(*sb.box);
            if (Holds(sb, dst)) {
              plan_->local_copies.push_back({rc.rank, std::move(piece), reduce, p, -1});
            } else {
              const int64_t bytes = piece.Volume() * esize_;
              plan_->lower_bound_bytes += bytes;
              if (!HolderOnHost(s, host_[dst])) plan_->cross_host_lower_bound_bytes += bytes;
              demands.push_back({-1, rc.rank, std::move(piece), bytes, reduce, p});
              demand_source_.push_back(s);
              demand_dst_.push_back(dst);
            }
          });
        }
      };
      if (!target_.is_partial()) {  // Chunks of one rank are disjoint: no copies needed.
        for (const Chunk& c : rc.chunks) {
          if (!c.box.Empty()) visit(c.box);
        }
      } else {
        for (const Box& t : NeededBoxes(rc)) visit(t);
      }
    }
    return demands;
  }

  void SortLocalCopies() {
    auto before = [](const LocalCopy& a, const LocalCopy& b) {
      if (a.rank != b.rank) return a.rank < b.rank;
      if (a.partial_index != b.partial_index) return a.partial_index < b.partial_index;
      return a.box < b.box;
    };
    std::vector<LocalCopy>& lc = plan_->local_copies;
    if (!std::is_sorted(lc.begin(), lc.end(), before)) std::sort(lc.begin(), lc.end(), before);
  }

  void Finish(std::vector<Transfer> transfers) {
    LowerToSteps({ranks_, host_, options_.cost, options_.use_collectives, source_.num_partials()},
                 std::move(transfers), plan_);
    std::vector<int64_t> sent(ranks_.size(), 0), received(ranks_.size(), 0);
    std::vector<double> busy(ranks_.size(), 0.0);  // Step time per rank id.
    for (Step& s : plan_->steps) {
      s.bytes = 0;
      for (const Transfer& t : s.transfers) {
        s.bytes += t.bytes;
        sent[ranks_.Id(t.src)] += t.bytes;
        received[ranks_.Id(t.dst)] += t.bytes;
        (hosts_.SameHost(t.src, t.dst) ? plan_->bytes_within_hosts : plan_->bytes_across_hosts) +=
            t.bytes;
      }
      plan_->bytes_moved += s.bytes;
      for (int64_t r : s.ranks) busy[ranks_.Id(r)] += s.estimated_seconds;
    }
    plan_->estimated_seconds = 0;
    for (double b : busy) plan_->estimated_seconds = std::max(plan_->estimated_seconds, b);
    plan_->traffic.reserve(ranks_.size());
    for (int id = 0; id < ranks_.size(); ++id) {
      plan_->traffic.push_back({ranks_.Rank(id), sent[id], received[id]});
    }
  }

  const Layout& source_;
  const Layout& target_;
  const PlanOptions& options_;
  const HostMap hosts_;
  const int64_t esize_;
  Plan* plan_;
  const RankIndex ranks_;

  std::vector<SourceBox> boxes_;                 // Sorted by (partial, box).
  std::vector<int> holders_;                     // Rank ids, per source box.
  std::vector<std::vector<int64_t>> box_hosts_;  // Sorted holder hosts, per box (lazily).
  std::vector<size_t> partial_begin_;
  std::vector<BoxIndex> index_;        // Per partial index.
  std::vector<size_t> demand_source_;  // Per pending transfer: its source box.
  std::vector<int> demand_dst_;        // Per pending transfer: its destination id.
  std::vector<int64_t> host_;          // Host by rank id (HostMap::HostOf).
};

}  // namespace

HostMap HostMapFor(const PlanOptions& options) {
  if (!options.hosts_by_rank.empty()) return HostMap::FromNames(options.hosts_by_rank);
  if (options.ranks_per_host > 0) return HostMap::Blocks(options.ranks_per_host);
  return HostMap();
}

std::string OptionsFingerprint(const PlanOptions& options) {
  std::string fp = absl::StrCat("h", options.hosts_by_rank.size(), ":");
  for (const std::string& h : options.hosts_by_rank) absl::StrAppend(&fp, h.size(), "=", h, ";");
  absl::StrAppend(&fp, "|rph", options.ranks_per_host, "|", options.cost.Fingerprint(), "|c",
                  options.use_collectives ? 1 : 0);
  return fp;
}

namespace {

absl::Status CheckInputs(const Layout& source, const Layout& target, DType dtype,
                         const PlanOptions& options) {
  if (source.ranks().empty()) return absl::InvalidArgumentError("source layout has no ranks");
  if (target.ranks().empty()) return absl::InvalidArgumentError("target layout has no ranks");
  if (source.global_shape() != target.global_shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat("source shape ", ShapeToString(source.global_shape()), " (",
                     source.SpecString(), ") does not match target shape ",
                     ShapeToString(target.global_shape()), " (", target.SpecString(), ")"));
  }
  if (absl::StatusOr<int64_t> bytes = CheckedBytes(source.global_shape(), ElementSize(dtype));
      !bytes.ok()) {
    return bytes.status();
  }
  if (options.ranks_per_host < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks_per_host ", options.ranks_per_host, " is negative"));
  }
  if (absl::Status s = CheckPartialDType(dtype, source.is_partial(), source.SpecString(), "source");
      !s.ok()) {
    return s;
  }
  return CheckPartialDType(dtype, target.is_partial(), target.SpecString(), "target");
}

}  // namespace

absl::StatusOr<Plan> Redistribute(const Layout& source, const Layout& target, DType dtype,
                                  const PlanOptions& options) {
  if (absl::Status s = CheckInputs(source, target, dtype, options); !s.ok()) return s;
  return Redistribute(Layout(source), Layout(target), dtype, options);
}

absl::StatusOr<Plan> Redistribute(Layout&& source, Layout&& target, DType dtype,
                                  const PlanOptions& options) {
  if (absl::Status s = CheckInputs(source, target, dtype, options); !s.ok()) return s;
  Plan plan;
  plan.source = std::move(source);
  plan.target = std::move(target);
  plan.dtype = dtype;
  Planner(plan.source, plan.target, dtype, options, &plan).Run();
  return plan;
}

absl::StatusOr<Plan> Redistribute(const Layout& source, const Layout& target, DType dtype,
                                  DType target_dtype, const PlanOptions& options) {
  if (dtype == target_dtype) return Redistribute(source, target, dtype, options);
  if (absl::Status s = CheckCast(dtype, target_dtype); !s.ok()) return s;
  if (source.is_partial()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot cast ", DTypeName(dtype), " to ", DTypeName(target_dtype), ": the source is ",
        source.SpecString(),
        ", whose value is a reduction (reduce it in its own dtype first: redistribute it to a "
        "layout without Partial)"));
  }
  if (absl::Status s = CheckInputs(source, target, target_dtype, options); !s.ok()) return s;
  // The planner counts the bytes of what travels: the wire dtype's.
  const DType wire = WireDType(dtype, target_dtype);
  absl::StatusOr<Plan> plan = Redistribute(Layout(source), Layout(target), wire, options);
  if (!plan.ok()) return plan.status();
  plan->dtype = dtype;
  plan->cast_to = target_dtype;
  return plan;
}

absl::StatusOr<Plan> Gather(const Layout& source, absl::Span<const int64_t> destination_ranks,
                            DType dtype, const PlanOptions& options) {
  if (destination_ranks.empty()) {
    return absl::InvalidArgumentError("gather needs at least one destination rank");
  }
  absl::StatusOr<DeviceMesh> mesh =
      DeviceMesh::Create({static_cast<int64_t>(destination_ranks.size())},
                         std::vector<int64_t>(destination_ranks.begin(), destination_ranks.end()));
  if (!mesh.ok()) return mesh.status();
  absl::StatusOr<Layout> target =
      Layout::FromPlacements(*mesh, source.global_shape(), {Placement::Replicate()});
  if (!target.ok()) return target.status();
  return Redistribute(Layout(source), *std::move(target), dtype, options);
}
}  // namespace shardcoord
