#include "sharding/planner.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace shardcoord {
namespace {

// Whole pieces may overshoot a sender's fair share by this factor before they are split.
constexpr double kBalanceSlack = 1.05;

// Dense ids 0..n-1 for the global ranks of both layouts, in ascending rank order. Rank
// numbers are usually dense, so a table replaces sorting and hashing.
class RankIndex {
 public:
  RankIndex(const Layout& a, const Layout& b) {
    int64_t max_rank = 0;
    const size_t count = a.ranks().size() + b.ranks().size();
    for (const Layout* l : {&a, &b}) {
      for (const RankChunks& rc : l->ranks()) max_rank = std::max(max_rank, rc.rank);
    }
    if (max_rank <= 4 * static_cast<int64_t>(count) + 1024) {
      table_.assign(max_rank + 1, -1);
      for (const Layout* l : {&a, &b}) {
        for (const RankChunks& rc : l->ranks()) table_[rc.rank] = 0;
      }
      for (int64_t r = 0; r <= max_rank; ++r) {
        if (table_[r] < 0) continue;
        table_[r] = static_cast<int>(ranks_.size());
        ranks_.push_back(r);
      }
      return;
    }
    for (const Layout* l : {&a, &b}) {
      for (const RankChunks& rc : l->ranks()) ranks_.push_back(rc.rank);
    }
    std::sort(ranks_.begin(), ranks_.end());
    ranks_.erase(std::unique(ranks_.begin(), ranks_.end()), ranks_.end());
    for (size_t i = 0; i < ranks_.size(); ++i) map_[ranks_[i]] = static_cast<int>(i);
  }
  int Id(int64_t rank) const { return map_.empty() ? table_[rank] : map_.at(rank); }
  int64_t Rank(int id) const { return ranks_[id]; }
  int size() const { return static_cast<int>(ranks_.size()); }

 private:
  std::vector<int64_t> ranks_;
  std::vector<int> table_;
  absl::flat_hash_map<int64_t, int> map_;
};

// A distinct (partial contribution, box) of the source and the ranks holding it.
struct SourceBox {
  const Box* box;  // Into the source layout.
  int64_t partial = 0;
  size_t holders_begin = 0;  // Range in Planner::holders_ (rank ids, ascending).
  size_t holders_end = 0;
};

// Finds the source boxes that overlap a query box without looking at all of them. Boxes are
// ordered by their offsets along two discriminating dims d0 < d1 (for 1-d and 2-d tensors
// simply dims 0 and 1, the lexicographic order they arrive in). A query binary-searches the
// d0 offsets that can reach it (offset > query start minus the longest d0 extent) and,
// inside each d0 group, the d1 offsets the same way; so a regular grid costs O(log R + hits).
class BoxIndex {
 public:
  // `all[begin, end)` are non-empty and in lexicographic order of their offsets.
  void Build(const std::vector<SourceBox>& all, size_t begin, size_t end, int ndim) {
    ndim_ = ndim;
    ids_.resize(end - begin);
    std::iota(ids_.begin(), ids_.end(), begin);
    if (ids_.empty() || ndim == 0) return;
    d0_ = 0;
    d1_ = ndim >= 2 ? 1 : -1;
    if (ndim >= 3) ChooseDims(all);
    const int d0 = d0_, d1 = d1_;
    auto before = [&](size_t a, size_t b) {
      const Box& x = *all[a].box;
      const Box& y = *all[b].box;
      if (x.offset(d0) != y.offset(d0)) return x.offset(d0) < y.offset(d0);
      if (d1 >= 0 && x.offset(d1) != y.offset(d1)) return x.offset(d1) < y.offset(d1);
      return a < b;
    };
    if (!std::is_sorted(ids_.begin(), ids_.end(), before)) {
      std::sort(ids_.begin(), ids_.end(), before);
    }
    lo_.resize(ids_.size() * ndim);
    hi_.resize(ids_.size() * ndim);
    for (size_t i = 0; i < ids_.size(); ++i) {
      const Box& b = *all[ids_[i]].box;
      for (int d = 0; d < ndim; ++d) {
        lo_[i * ndim + d] = b.offset(d);
        hi_[i * ndim + d] = b.end(d);
      }
      max_ext0_ = std::max(max_ext0_, b.shape(d0));
      if (i == 0 || b.offset(d0) != group_off_.back()) {
        group_off_.push_back(b.offset(d0));
        group_start_.push_back(i);
        group_ext1_.push_back(0);
      }
      if (d1 >= 0) {
        key1_.push_back(b.offset(d1));
        group_ext1_.back() = std::max(group_ext1_.back(), b.shape(d1));
      }
    }
    group_start_.push_back(ids_.size());
  }

  template <typename F>
  void ForEachOverlap(const Box& q, F&& f) const {
    if (ids_.empty()) return;
    if (ndim_ == 0) {  // Scalars: every box is the whole tensor.
      for (size_t id : ids_) f(id);
      return;
    }
    const auto g_begin = std::lower_bound(group_off_.begin(), group_off_.end(),
                                          q.offset(d0_) - max_ext0_ + 1);
    const auto g_end = std::lower_bound(g_begin, group_off_.end(), q.end(d0_));
    for (auto g = g_begin; g != g_end; ++g) {
      const size_t gi = g - group_off_.begin();
      size_t lo = group_start_[gi], hi = group_start_[gi + 1];
      if (d1_ >= 0) {
        const auto k0 = key1_.begin();
        lo = std::lower_bound(k0 + lo, k0 + hi, q.offset(d1_) - group_ext1_[gi] + 1) - k0;
        hi = std::lower_bound(k0 + lo, k0 + hi, q.end(d1_)) - k0;
      }
      for (size_t i = lo; i < hi; ++i) {
        if (Hits(i, q)) f(ids_[i]);
      }
    }
  }

 private:
  bool Hits(size_t i, const Box& q) const {
    const int64_t* lo = &lo_[i * ndim_];
    const int64_t* hi = &hi_[i * ndim_];
    for (int d = 0; d < ndim_; ++d) {
      if (std::max(lo[d], q.offset(d)) >= std::min(hi[d], q.end(d))) return false;
    }
    return true;
  }

  // The two dims with the most distinct offsets, in dim order.
  void ChooseDims(const std::vector<SourceBox>& all) {
    std::vector<std::pair<size_t, int>> distinct;  // (count, -dim)
    for (int d = 0; d < ndim_; ++d) {
      absl::flat_hash_set<int64_t> offs;
      for (size_t id : ids_) offs.insert(all[id].box->offset(d));
      distinct.emplace_back(offs.size(), -d);
    }
    std::sort(distinct.rbegin(), distinct.rend());
    d0_ = std::min(-distinct[0].second, -distinct[1].second);
    d1_ = std::max(-distinct[0].second, -distinct[1].second);
  }

  int ndim_ = 0, d0_ = -1, d1_ = -1;
  std::vector<size_t> ids_;
  std::vector<int64_t> lo_, hi_;  // Per position in ids_, ndim_ values each.
  std::vector<int64_t> key1_;
  std::vector<int64_t> group_off_;
  std::vector<size_t> group_start_;
  std::vector<int64_t> group_ext1_;
  int64_t max_ext0_ = 0;
};

// The parts of `x` outside `a` (at most 2*ndim boxes).
std::vector<Box> Subtract(const Box& x, const Box& a) {
  if (!x.Overlaps(a)) return {x};
  std::vector<Box> out;
  Shape off = x.offset(), shp = x.shape();
  for (int d = 0; d < x.ndim(); ++d) {
    const int64_t lo = off[d], hi = off[d] + shp[d];
    const int64_t alo = std::max(lo, a.offset(d)), ahi = std::min(hi, a.end(d));
    if (alo > lo) {
      Shape s = shp;
      s[d] = alo - lo;
      out.emplace_back(off, s);
    }
    if (ahi < hi) {
      Shape o = off, s = shp;
      o[d] = ahi;
      s[d] = hi - ahi;
      out.emplace_back(o, s);
    }
    off[d] = alo;
    shp[d] = ahi - alo;
  }
  return out;
}

// True if boxes of different owners overlap. Sweeps along the dim with the most distinct
// offsets, keeping the boxes that still reach the sweep position.
bool OwnersOverlap(std::vector<std::pair<Box, int64_t>> boxes) {
  if (boxes.size() < 2) return false;
  const int ndim = boxes[0].first.ndim();
  if (ndim == 0) return true;
  int sweep = 0;
  size_t best = 0;
  for (int d = 0; d < ndim; ++d) {
    std::vector<int64_t> offs;
    for (const auto& b : boxes) offs.push_back(b.first.offset(d));
    std::sort(offs.begin(), offs.end());
    const size_t n = std::unique(offs.begin(), offs.end()) - offs.begin();
    if (n > best) best = n, sweep = d;
  }
  std::sort(boxes.begin(), boxes.end(), [sweep](const auto& a, const auto& b) {
    if (a.first.offset(sweep) != b.first.offset(sweep)) {
      return a.first.offset(sweep) < b.first.offset(sweep);
    }
    return a < b;
  });
  std::vector<size_t> active;
  for (size_t i = 0; i < boxes.size(); ++i) {
    size_t keep = 0;
    for (size_t a : active) {
      if (boxes[a].first.end(sweep) <= boxes[i].first.offset(sweep)) continue;
      active[keep++] = a;
      if (boxes[a].second != boxes[i].second && boxes[a].first.Overlaps(boxes[i].first)) {
        return true;
      }
    }
    active.resize(keep);
    active.push_back(i);
  }
  return false;
}

bool NeedsValue(const Layout& target, const Chunk& c) {
  return !(target.is_partial() && target.partial_op() == ReduceOp::kSum &&
           c.partial_index != 0);
}

int CountEqual(const Shape* a, const Shape* b) {
  if (a == nullptr || b == nullptr || a->size() != b->size()) return 0;
  int n = 0;
  for (size_t i = 0; i < a->size(); ++i) n += (*a)[i] == (*b)[i];
  return n;
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
    plan_->reduce_op = source_.partial_op() == ReduceOp::kAvg ? ReduceOp::kSum
                                                              : source_.partial_op();
    if (partial && source_ == target_) {  // Contributions stay where they are.
      for (const RankChunks& rc : source_.ranks()) {
        for (const Chunk& c : rc.chunks) {
          if (!c.box.Empty()) plan_->local_copies.push_back({rc.rank, c.box, false,
                                                             c.partial_index, -1});
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
    AssignSenders(transfers);
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
      for (int shift = 0; shift < 63 && (shift == 0 || (max_flat >> shift) > 0);
           shift += kBits) {
        pass([shift](const Entry& e) { return (e.flat >> shift) & ((1 << kBits) - 1); },
             size_t{1} << kBits);
      }
      if (source_.num_partials() > 1) {
        pass([](const Entry& e) { return static_cast<size_t>(e.partial); },
             source_.num_partials());
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

  bool Holds(const SourceBox& b, int id) const {
    return std::binary_search(holders_.begin() + b.holders_begin,
                              holders_.begin() + b.holders_end, id);
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
          for (Box& q : Subtract(p, a)) next.push_back(std::move(q));
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

  void BuildCoords() {
    if (!src_coord_.empty()) return;
    src_coord_.assign(ranks_.size(), nullptr);
    tgt_coord_.assign(ranks_.size(), nullptr);
    for (const RankChunks& rc : source_.ranks()) {
      if (!rc.coord.empty()) src_coord_[ranks_.Id(rc.rank)] = &rc.coord;
    }
    for (const RankChunks& rc : target_.ranks()) {
      if (!rc.coord.empty()) tgt_coord_[ranks_.Id(rc.rank)] = &rc.coord;
    }
  }
  // How close two ranks sit: equal mesh coordinates in the source and target meshes. Picking
  // close senders keeps exchanges inside mesh sub-groups, where they form collectives.
  int Affinity(int a, int b) const {
    return CountEqual(src_coord_[a], src_coord_[b]) + CountEqual(tgt_coord_[a], tgt_coord_[b]);
  }

  // Chooses a sender for every demand. Per source box, the demand is spread over its holders
  // by water-filling (each holder's fair level given what it already sends); a piece goes
  // whole to a holder that stays within kBalanceSlack of the level, preferring the
  // destination's host, then mesh affinity, then the lighter and lower rank; a piece that
  // fits nowhere is split into slabs across holders.
  void AssignSenders(std::vector<Transfer>& t) {
    const size_t n = t.size();
    load_.assign(ranks_.size(), 0);
    // Bucket demands by source box (stable: keeps destination order).
    std::vector<size_t> start(boxes_.size() + 1, 0);
    for (size_t i = 0; i < n; ++i) ++start[demand_source_[i] + 1];
    for (size_t s = 0; s < boxes_.size(); ++s) start[s + 1] += start[s];
    std::vector<size_t> order(n);
    {
      std::vector<size_t> fill(start.begin(), start.end() - 1);
      for (size_t i = 0; i < n; ++i) order[fill[demand_source_[i]]++] = i;
    }
    const bool host_aware = hosts_.known();
    for (size_t s = 0; s < boxes_.size(); ++s) {
      if (start[s] == start[s + 1]) continue;
      const SourceBox& sb = boxes_[s];
      const size_t nh = sb.holders_end - sb.holders_begin;
      const int* holders = holders_.data() + sb.holders_begin;
      if (nh == 1) {
        const int64_t src = ranks_.Rank(holders[0]);
        for (size_t k = start[s]; k < start[s + 1]; ++k) {
          t[order[k]].src = src;
          load_[holders[0]] += t[order[k]].bytes;
        }
        continue;
      }
      BuildCoords();
      int64_t total = 0;
      std::vector<int64_t> loads;
      for (size_t h = 0; h < nh; ++h) loads.push_back(load_[holders[h]]);
      for (size_t k = start[s]; k < start[s + 1]; ++k) total += t[order[k]].bytes;
      const double level = WaterLevel(std::move(loads), total);
      const double limit = level * kBalanceSlack;
      std::sort(order.begin() + start[s], order.begin() + start[s + 1], [&](size_t a, size_t b) {
        return t[a].bytes != t[b].bytes ? t[a].bytes > t[b].bytes : a < b;
      });
      for (size_t k = start[s]; k < start[s + 1]; ++k) {
        const size_t di = order[k];
        const int dst = demand_dst_[di];
        const int64_t bytes = t[di].bytes;
        // Preference key, larger is better: (fits, same host, affinity, -load, -rank id).
        auto key = [&](int h, bool fits) {
          return std::make_tuple(
              fits, host_aware && host_[h] == host_[dst],
              Affinity(h, dst), -load_[h], -h);
        };
        int best = holders[0];
        auto best_key = key(best, load_[best] + bytes <= limit);
        for (size_t h = 1; h < nh; ++h) {
          auto k2 = key(holders[h], load_[holders[h]] + bytes <= limit);
          if (k2 > best_key) best = holders[h], best_key = k2;
        }
        if (std::get<0>(best_key)) {
          t[di].src = ranks_.Rank(best);
          load_[best] += bytes;
          continue;
        }
        // Split along the longest dim into slabs that fill holders up to the level; the
        // first slab stays in place, the others are appended.
        const Box whole = t[di].box;
        int dim = 0;
        for (int e = 1; e < whole.ndim(); ++e) {
          if (whole.shape(e) > whole.shape(dim)) dim = e;
        }
        const int64_t rows = whole.ndim() == 0 ? 1 : whole.shape(dim);
        const int64_t row_bytes = bytes / rows;
        int64_t lo = 0;
        while (lo < rows) {
          int pick = holders[0];
          auto pick_key = key(pick, load_[pick] < level);
          for (size_t h = 1; h < nh; ++h) {
            auto k2 = key(holders[h], load_[holders[h]] < level);
            if (k2 > pick_key) pick = holders[h], pick_key = k2;
          }
          int64_t take = rows - lo;
          if (std::get<0>(pick_key)) {
            const double room = level - static_cast<double>(load_[pick]);
            take = std::clamp<int64_t>(static_cast<int64_t>(room / row_bytes), 1, rows - lo);
          }
          load_[pick] += take * row_bytes;
          if (take == rows) {
            t[di].src = ranks_.Rank(pick);
            break;
          }
          Shape off = whole.offset(), shp = whole.shape();
          off[dim] += lo;
          shp[dim] = take;
          Transfer slab = t[di];
          slab.src = ranks_.Rank(pick);
          slab.box = Box(std::move(off), std::move(shp));
          slab.bytes = take * row_bytes;
          if (lo == 0) {
            t[di] = std::move(slab);
          } else {
            t.push_back(std::move(slab));
          }
          lo += take;
        }
      }
    }
  }

  // The level L such that raising every load below L up to L absorbs `demand`.
  static double WaterLevel(std::vector<int64_t> loads, int64_t demand) {
    std::sort(loads.begin(), loads.end());
    double prefix = 0;
    for (size_t k = 1; k <= loads.size(); ++k) {
      prefix += static_cast<double>(loads[k - 1]);
      const double level = (static_cast<double>(demand) + prefix) / k;
      if (k == loads.size() || level <= static_cast<double>(loads[k])) return level;
    }
    return static_cast<double>(demand);
  }

  // ---- Lowering ----

  int Find(std::vector<int>& parent, int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }

  // Local copies of `rank`, as a range of the sorted plan_->local_copies.
  std::pair<size_t, size_t> LocalRange(int64_t rank) const {
    const auto& lc = plan_->local_copies;
    auto lo = std::lower_bound(lc.begin(), lc.end(), rank,
                               [](const LocalCopy& c, int64_t r) { return c.rank < r; });
    auto hi = std::upper_bound(lo, lc.end(), rank,
                               [](int64_t r, const LocalCopy& c) { return r < c.rank; });
    return {static_cast<size_t>(lo - lc.begin()), static_cast<size_t>(hi - lc.begin())};
  }

  struct Edge {
    int64_t src, dst;
    int src_id, dst_id;
    size_t begin, end;  // Range in the component's transfers (sorted by src, dst, box).
    int64_t bytes;
  };

  // Point-to-point estimate from a component's edges (sorted by src, dst): each rank pays one
  // alpha per peer plus its bytes, sending and receiving overlap. Same as
  // EstimatePointToPoint, without re-sorting the transfers.
  double PointToPointCost() {
    const CostModel& m = options_.cost;
    double worst = 0, cur = 0;
    for (size_t i = 0; i < edges_.size(); ++i) {
      const Edge& e = edges_[i];
      if (i == 0 || edges_[i - 1].src != e.src) cur = 0;
      const bool same = host_[e.src_id] == host_[e.dst_id];
      cur += m.Alpha(same) + e.bytes * m.Beta(same);
      worst = std::max(worst, cur);
    }
    // Receiving side: accumulate per destination id, then clear what was touched.
    recv_time_.resize(ranks_.size(), 0.0);
    for (const Edge& e : edges_) {
      const bool same = host_[e.src_id] == host_[e.dst_id];
      double& r = recv_time_[e.dst_id];
      r += m.Alpha(same) + e.bytes * m.Beta(same);
      worst = std::max(worst, r);
    }
    for (const Edge& e : edges_) recv_time_[e.dst_id] = 0;
    return worst;
  }

  double CollectiveCost(const Step& step) const {
    bool same = true;
    for (const Edge& e : edges_) same = same && host_[e.src_id] == host_[e.dst_id];
    int64_t piece = 0;
    for (const Edge& e : edges_) piece = std::max(piece, e.bytes);
    const int64_t n = static_cast<int64_t>(step.ranks.size());
    switch (step.op) {
      case StepOp::kAllGather:
        return EstimateAllGather(options_.cost, n, piece, same);
      case StepOp::kReduceScatter:
        return EstimateReduceScatter(options_.cost, n, piece, same);
      case StepOp::kAllReduce:
        return EstimateAllReduce(options_.cost, n, piece, same);
      case StepOp::kBroadcast:
        return EstimateBroadcast(options_.cost, n, piece, same);
      default:
        return 0;
    }
  }

  // Orders `ranks` by the first box each one is given in `first_box` (members without one
  // keep their order, last).
  static void OrderByPieces(std::vector<std::pair<const Box*, int64_t>> first_box,
                            std::vector<int64_t>* ranks) {
    std::sort(first_box.begin(), first_box.end(), [](const auto& a, const auto& b) {
      if (*a.first != *b.first) return *a.first < *b.first;
      return a.second < b.second;
    });
    std::vector<int64_t>& r = *ranks;
    size_t keep = 0;  // Members without a piece, compacted to the front, then moved last.
    for (int64_t x : r) {
      bool listed = false;
      for (const auto& o : first_box) listed = listed || o.second == x;
      if (!listed) r[keep++] = x;
    }
    std::copy_backward(r.begin(), r.begin() + keep, r.end());
    for (size_t i = 0; i < first_box.size(); ++i) r[i] = first_box[i].second;
  }

  // Tries to recognise `t` (one connected component, sorted by src, dst, partial, box; its
  // edges in edges_) as a collective over `members`. On success fills `step` (op and ranks)
  // and the local copies the collective consumes, and returns true.
  bool Classify(const std::vector<const Transfer*>& t, const std::vector<int64_t>& members,
                Step* step, std::vector<size_t>* marked_copies) {
    const int64_t n = static_cast<int64_t>(members.size());
    if (n < 2) return false;
    const std::vector<Edge>& edges = edges_;
    auto same_boxes = [&](const Edge& a, const Edge& b) {
      if (a.end - a.begin != b.end - b.begin) return false;
      for (size_t k = 0; k < a.end - a.begin; ++k) {
        if (t[a.begin + k]->box != t[b.begin + k]->box) return false;
      }
      return true;
    };
    // Senders with their edge ranges; does every sender send to all other members, the
    // same boxes to each?
    senders_.clear();
    for (size_t i = 0; i < edges.size();) {
      size_t j = i;
      while (j < edges.size() && edges[j].src == edges[i].src) ++j;
      senders_.emplace_back(i, j);
      i = j;
    }
    bool complete_out = true, uniform_out = true;
    for (const auto& [b, e] : senders_) {
      if (static_cast<int64_t>(e - b) != n - 1) complete_out = false;
      for (size_t k = b + 1; k < e && uniform_out; ++k) {
        uniform_out = same_boxes(edges[b], edges[k]);
      }
    }
    const int64_t num_senders = static_cast<int64_t>(senders_.size());
    if (!t.front()->reduce) {
      if (num_senders == 1 && n >= 3 && complete_out && uniform_out) {
        step->ranks = members;
        step->op = StepOp::kBroadcast;
        step->root = edges.front().src;
        return true;
      }
      if (num_senders >= 2 && complete_out && uniform_out && SendersKeepPieces(t)) {
        step->op = StepOp::kAllGather;
        step->ranks = members;
        std::vector<std::pair<const Box*, int64_t>> first;
        for (const auto& [b, e] : senders_) first.emplace_back(&t[edges[b].begin]->box, edges[b].src);
        OrderByPieces(std::move(first), &step->ranks);
        return true;
      }
      if (num_senders == n && complete_out) {
        step->ranks = members;
        step->op = StepOp::kAllToAll;
        return true;
      }
      return false;
    }
    // Reductions: every member contributes one distinct partial index to the others.
    if (num_senders != n || n != source_.num_partials()) return false;
    absl::flat_hash_map<int64_t, int64_t> partial_of;
    std::vector<bool> seen(n, false);
    for (const auto& [b, e] : senders_) {
      const int64_t p = t[edges[b].begin]->partial_index;
      for (size_t k = edges[b].begin; k < edges[e - 1].end; ++k) {
        if (t[k]->partial_index != p) return false;
      }
      if (seen[p]) return false;
      seen[p] = true;
      partial_of[edges[b].src] = p;
    }
    // Receivers: each gets the same boxes from every other member.
    std::vector<size_t> by_dst(edges.size());
    std::iota(by_dst.begin(), by_dst.end(), 0);
    std::sort(by_dst.begin(), by_dst.end(), [&](size_t a, size_t b) {
      return edges[a].dst != edges[b].dst ? edges[a].dst < edges[b].dst : a < b;
    });
    std::vector<size_t> receiver_edge;  // One reference edge per receiver.
    for (size_t i = 0; i < by_dst.size();) {
      size_t j = i;
      while (j < by_dst.size() && edges[by_dst[j]].dst == edges[by_dst[i]].dst) ++j;
      if (static_cast<int64_t>(j - i) != n - 1) return false;
      for (size_t k = i + 1; k < j; ++k) {
        if (!same_boxes(edges[by_dst[i]], edges[by_dst[k]])) return false;
      }
      receiver_edge.push_back(by_dst[i]);
      i = j;
    }
    // Each receiver's own contribution to exactly those boxes is a local reducing copy.
    std::vector<size_t> marks;
    for (size_t re : receiver_edge) {
      const Edge& e = edges[re];
      const int64_t p = partial_of[e.dst];
      std::vector<size_t> own;
      const auto [lo, hi] = LocalRange(e.dst);
      for (size_t k = lo; k < hi; ++k) {
        const LocalCopy& c = plan_->local_copies[k];
        if (!c.reduce || c.partial_index != p) continue;
        bool overlaps = false;
        for (size_t m = e.begin; m < e.end && !overlaps; ++m) overlaps = c.box.Overlaps(t[m]->box);
        if (overlaps) own.push_back(k);
      }
      if (own.size() != e.end - e.begin) return false;
      for (size_t m = 0; m < own.size(); ++m) {  // Both sorted by box.
        if (plan_->local_copies[own[m]].box != t[e.begin + m]->box) return false;
      }
      marks.insert(marks.end(), own.begin(), own.end());
    }
    step->reduce_op = plan_->reduce_op;
    step->ranks = members;
    const int64_t num_receivers = static_cast<int64_t>(receiver_edge.size());
    bool all_same = num_receivers == n;
    for (size_t r = 1; r < receiver_edge.size() && all_same; ++r) {
      all_same = same_boxes(edges[receiver_edge[0]], edges[receiver_edge[r]]);
    }
    if (all_same) {
      step->op = StepOp::kAllReduce;
    } else {
      if (num_receivers < 2) return false;
      std::vector<std::pair<Box, int64_t>> owned;
      for (size_t re : receiver_edge) {
        for (size_t m = edges[re].begin; m < edges[re].end; ++m) {
          owned.emplace_back(t[m]->box, edges[re].dst);
        }
      }
      if (OwnersOverlap(owned)) return false;
      step->op = StepOp::kReduceScatter;
      std::vector<std::pair<const Box*, int64_t>> first;
      for (size_t re : receiver_edge) first.emplace_back(&t[edges[re].begin]->box, edges[re].dst);
      OrderByPieces(std::move(first), &step->ranks);
    }
    *marked_copies = std::move(marks);
    return true;
  }

  // All-gather needs each sender to end with its own piece too.
  bool SendersKeepPieces(const std::vector<const Transfer*>& t) const {
    for (const auto& [b, e] : senders_) {
      const Edge& edge = edges_[b];
      const auto [lo, hi] = LocalRange(edge.src);
      for (size_t m = edge.begin; m < edge.end; ++m) {
        bool kept = false;
        for (size_t k = lo; k < hi && !kept; ++k) {
          kept = plan_->local_copies[k].box.Contains(t[m]->box);
        }
        if (!kept) return false;
      }
    }
    return true;
  }

  // Splits the transfers into connected groups of ranks (union-find), bucketed by the
  // group's smallest rank, and turns each group into a collective step where its pattern is
  // exactly one and the cost model does not prefer point-to-point; the rest forms one
  // point-to-point step.
  void Lower(std::vector<Transfer> transfers) {
    const int nr = ranks_.size();
    std::vector<int> parent(nr);
    std::iota(parent.begin(), parent.end(), 0);
    for (const Transfer& tr : transfers) {
      const int a = Find(parent, ranks_.Id(tr.src)), b = Find(parent, ranks_.Id(tr.dst));
      if (a != b) parent[std::max(a, b)] = std::min(a, b);  // Root = smallest id = rank.
    }
    // Counting sort by component root.
    std::vector<int> comp(transfers.size());
    std::vector<size_t> start(nr + 1, 0);
    for (size_t i = 0; i < transfers.size(); ++i) {
      comp[i] = Find(parent, ranks_.Id(transfers[i].src));
      ++start[comp[i] + 1];
    }
    for (int r = 0; r < nr; ++r) start[r + 1] += start[r];
    std::vector<size_t> ord(transfers.size());
    {
      std::vector<size_t> fill(start.begin(), start.end() - 1);
      for (size_t i = 0; i < transfers.size(); ++i) ord[fill[comp[i]]++] = i;
    }
    // Within a group: by (src, dst) through integer keys (ids order like ranks), then by
    // (partial, box) for the rare pairs exchanging several pieces.
    std::vector<std::pair<uint64_t, size_t>> keyed;
    auto same_pair_before = [&](const std::pair<uint64_t, size_t>& a,
                                const std::pair<uint64_t, size_t>& b) {
      const Transfer& x = transfers[a.second];
      const Transfer& y = transfers[b.second];
      if (x.partial_index != y.partial_index) return x.partial_index < y.partial_index;
      return x.box < y.box;
    };
    int groups = 0;
    for (int root = 0; root < nr; ++root) groups += start[root] != start[root + 1];
    plan_->steps.reserve(groups + 1);
    Step p2p;
    p2p.reduce_op = plan_->reduce_op;
    std::vector<bool> in_p2p(nr, false);
    std::vector<int64_t> members;
    std::vector<const Transfer*> t;
    for (int root = 0; root < nr; ++root) {
      const size_t i = start[root], j = start[root + 1];
      if (i == j) continue;
      keyed.clear();
      for (size_t k = i; k < j; ++k) {
        const Transfer& x = transfers[ord[k]];
        keyed.emplace_back(static_cast<uint64_t>(ranks_.Id(x.src)) << 32 |
                               static_cast<uint32_t>(ranks_.Id(x.dst)),
                           ord[k]);
      }
      std::sort(keyed.begin(), keyed.end());
      for (size_t a = 0; a < keyed.size();) {
        size_t b = a + 1;
        while (b < keyed.size() && keyed[b].first == keyed[a].first) ++b;
        if (b - a > 1) std::sort(keyed.begin() + a, keyed.begin() + b, same_pair_before);
        a = b;
      }
      for (size_t k = i; k < j; ++k) ord[k] = keyed[k - i].second;
      t.clear();
      members.clear();
      edges_.clear();
      for (size_t k = i; k < j; ++k) {
        const Transfer& x = transfers[ord[k]];
        t.push_back(&x);
        members.push_back(x.src);
        members.push_back(x.dst);
        if (edges_.empty() || edges_.back().src != x.src || edges_.back().dst != x.dst) {
          edges_.push_back(
              {x.src, x.dst, ranks_.Id(x.src), ranks_.Id(x.dst), t.size() - 1, t.size(), 0});
        }
        edges_.back().end = t.size();
        edges_.back().bytes += x.bytes;
      }
      std::sort(members.begin(), members.end());
      members.erase(std::unique(members.begin(), members.end()), members.end());
      Step step;
      std::vector<size_t> marks;
      bool collective = options_.use_collectives && Classify(t, members, &step, &marks);
      const double p = PointToPointCost();
      if (collective) {
        // All-to-all is point-to-point under another name; other collectives stay unless
        // point-to-point is estimated strictly cheaper.
        step.estimated_seconds = step.op == StepOp::kAllToAll ? p : CollectiveCost(step);
        collective = step.estimated_seconds <= p;
      }
      std::vector<Transfer>* out = &p2p.transfers;
      if (collective) {
        for (size_t m : marks) {
          plan_->local_copies[m].collective_step = static_cast<int64_t>(plan_->steps.size());
        }
        step.transfers.reserve(j - i);
        out = &step.transfers;
      } else {
        // Groups share no ranks, so the busiest rank of the merged step is the busiest of
        // the busiest group.
        p2p.estimated_seconds = std::max(p2p.estimated_seconds, p);
        for (int64_t r : members) in_p2p[ranks_.Id(r)] = true;
        if (p2p.transfers.empty()) p2p.transfers.reserve(transfers.size() - i);
      }
      for (size_t k = i; k < j; ++k) out->push_back(std::move(transfers[ord[k]]));
      if (collective) plan_->steps.push_back(std::move(step));
    }
    if (!p2p.transfers.empty()) {
      for (int id = 0; id < nr; ++id) {
        if (in_p2p[id]) p2p.ranks.push_back(ranks_.Rank(id));
      }
      plan_->steps.push_back(std::move(p2p));
    }
  }

  void Finish(std::vector<Transfer> transfers) {
    Lower(std::move(transfers));
    std::vector<int64_t> sent(ranks_.size(), 0), received(ranks_.size(), 0);
    std::vector<double> busy(ranks_.size(), 0.0);  // Step time per rank id.
    for (Step& s : plan_->steps) {
      s.bytes = 0;
      for (const Transfer& t : s.transfers) {
        s.bytes += t.bytes;
        sent[ranks_.Id(t.src)] += t.bytes;
        received[ranks_.Id(t.dst)] += t.bytes;
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

  std::vector<SourceBox> boxes_;    // Sorted by (partial, box).
  std::vector<int> holders_;        // Rank ids, per source box.
  std::vector<size_t> partial_begin_;
  std::vector<BoxIndex> index_;     // Per partial index.
  std::vector<int64_t> load_;       // Bytes sent, by rank id.
  std::vector<size_t> demand_source_;  // Per pending transfer: its source box.
  std::vector<int> demand_dst_;        // Per pending transfer: its destination id.
  std::vector<const Shape*> src_coord_, tgt_coord_;  // Mesh coordinates by rank id.
  std::vector<int64_t> host_;  // Host by rank id (HostMap::HostOf).
  // Scratch for lowering, reused across groups.
  std::vector<Edge> edges_;
  std::vector<std::pair<size_t, size_t>> senders_;
  std::vector<double> recv_time_;  // By rank id, zero between groups.
};

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
    return absl::InvalidArgumentError(absl::StrCat(
        "source shape ", ShapeToString(source.global_shape()), " (", source.SpecString(),
        ") does not match target shape ", ShapeToString(target.global_shape()), " (",
        target.SpecString(), ")"));
  }
  if (absl::StatusOr<int64_t> bytes = CheckedBytes(source.global_shape(), ElementSize(dtype));
      !bytes.ok()) {
    return bytes.status();
  }
  if (options.ranks_per_host < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks_per_host ", options.ranks_per_host, " is negative"));
  }
  return absl::OkStatus();
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

absl::StatusOr<Plan> Gather(const Layout& source, absl::Span<const int64_t> destination_ranks,
                            DType dtype, const PlanOptions& options) {
  if (destination_ranks.empty()) {
    return absl::InvalidArgumentError("gather needs at least one destination rank");
  }
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(
      {static_cast<int64_t>(destination_ranks.size())},
      std::vector<int64_t>(destination_ranks.begin(), destination_ranks.end()));
  if (!mesh.ok()) return mesh.status();
  absl::StatusOr<Layout> target =
      Layout::FromPlacements(*mesh, source.global_shape(), {Placement::Replicate()});
  if (!target.ok()) return target.status();
  return Redistribute(Layout(source), *std::move(target), dtype, options);
}

std::string ExplainPlan(const Plan& plan) {
  std::string out = absl::StrCat(
      "plan ", ShapeToString(plan.source.global_shape()), " ", DTypeName(plan.dtype), ": ",
      plan.source.SpecString(), " -> ", plan.target.SpecString(), "\n");
  absl::StrAppend(&out, "bytes moved ", plan.bytes_moved, " (", HumanBytes(plan.bytes_moved),
                  "), lower bound ", plan.lower_bound_bytes, ", estimated ",
                  HumanSeconds(plan.estimated_seconds), "\n");
  int64_t local_bytes = 0;
  const int64_t esize = ElementSize(plan.dtype);
  for (const LocalCopy& c : plan.local_copies) local_bytes += c.box.Volume() * esize;
  absl::StrAppend(&out, "local copies: ", plan.local_copies.size(), " (",
                  HumanBytes(local_bytes), ")\n");
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

std::string PlanCache::Key(const Layout& source, const Layout& target, DType dtype,
                           const PlanOptions& options) {
  return absl::StrCat(source.Fingerprint(), "\n", target.Fingerprint(), "\n", DTypeName(dtype),
                      "\n", OptionsFingerprint(options));
}

std::shared_ptr<const Plan> PlanCache::Find(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  entries_.splice(entries_.begin(), entries_, it->second);
  return it->second->second;
}

void PlanCache::Insert(const std::string& key, std::shared_ptr<const Plan> plan) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    it->second->second = std::move(plan);
    entries_.splice(entries_.begin(), entries_, it->second);
    return;
  }
  entries_.emplace_front(key, std::move(plan));
  index_[key] = entries_.begin();
  while (entries_.size() > capacity_) {
    index_.erase(entries_.back().first);
    entries_.pop_back();
  }
}

absl::StatusOr<std::shared_ptr<const Plan>> PlanCache::GetOrPlan(const Layout& source,
                                                                 const Layout& target,
                                                                 DType dtype,
                                                                 const PlanOptions& options) {
  const std::string key = Key(source, target, dtype, options);
  if (std::shared_ptr<const Plan> hit = Find(key)) {
    ++hits_;
    return hit;
  }
  ++misses_;
  absl::StatusOr<Plan> plan = Redistribute(source, target, dtype, options);
  if (!plan.ok()) return plan.status();
  auto shared = std::make_shared<const Plan>(*std::move(plan));
  Insert(key, shared);
  return shared;
}

}  // namespace shardcoord
