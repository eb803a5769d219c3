#include "sharding/lowering.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "sharding/spatial_index.h"

namespace shardcoord {
namespace {

class Lowering {
 public:
  Lowering(const LoweringInput& in, Plan* plan)
      : ranks_(in.ranks),
        host_(in.host),
        cost_(in.cost),
        use_collectives_(in.use_collectives),
        num_partials_(in.num_partials),
        plan_(plan) {}

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
        keyed.emplace_back(
            static_cast<uint64_t>(ranks_.Id(x.src)) << 32 | static_cast<uint32_t>(ranks_.Id(x.dst)),
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
      bool collective = use_collectives_ && Classify(t, members, &step, &marks);
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

 private:
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
    const CostModel& m = cost_;
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
        return EstimateAllGather(cost_, n, piece, same);
      case StepOp::kReduceScatter:
        return EstimateReduceScatter(cost_, n, piece, same);
      case StepOp::kAllReduce:
        return EstimateAllReduce(cost_, n, piece, same);
      case StepOp::kBroadcast:
        return EstimateBroadcast(cost_, n, piece, same);
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
        for (const auto& [b, e] : senders_)
          first.emplace_back(&t[edges[b].begin]->box, edges[b].src);
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
    if (num_senders != n || n != num_partials_) return false;
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
      std::vector<const Box*> owned;
      std::vector<int64_t> owners;
      for (size_t re : receiver_edge) {
        for (size_t m = edges[re].begin; m < edges[re].end; ++m) {
          owned.push_back(&t[m]->box);
          owners.push_back(edges[re].dst);
        }
      }
      if (FindOverlap(owned, owners)) return false;
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

  const RankIndex& ranks_;
  const std::vector<int64_t>& host_;  // Host by rank id.
  const CostModel& cost_;
  const bool use_collectives_;
  const int64_t num_partials_;
  Plan* plan_;
  // Scratch, reused across groups.
  std::vector<Edge> edges_;
  std::vector<std::pair<size_t, size_t>> senders_;
  std::vector<double> recv_time_;  // By rank id, zero between groups.
};

}  // namespace

void LowerToSteps(const LoweringInput& in, std::vector<Transfer> transfers, Plan* plan) {
  Lowering(in, plan).Lower(std::move(transfers));
}

}  // namespace shardcoord
