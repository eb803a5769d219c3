#include "sharding/sender_assignment.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace shardcoord {
namespace {

// Whole pieces may overshoot a sender's fair share by this factor before they are split.
constexpr double kBalanceSlack = 1.05;

int CountEqual(const Shape* a, const Shape* b) {
  if (a == nullptr || b == nullptr || a->size() != b->size()) return 0;
  int n = 0;
  for (size_t i = 0; i < a->size(); ++i) n += (*a)[i] == (*b)[i];
  return n;
}

class SenderAssigner {
 public:
  explicit SenderAssigner(const SenderAssignmentInput& in)
      : source_(in.source),
        target_(in.target),
        ranks_(in.ranks),
        host_(in.host),
        host_aware_(in.host_aware),
        boxes_(in.boxes),
        holders_(in.holders),
        demand_source_(in.demand_source),
        demand_dst_(in.demand_dst) {}

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
      if (!host_aware_) {
        AssignAmong(holders, nh, order.begin() + start[s], order.begin() + start[s + 1], t);
        continue;
      }
      // A destination with a holder on its own host reads only from such holders (bytes
      // across hosts are the dearest); the others read from any holder. Groups by the
      // destination's host, holder-less hosts last, each balanced among its candidates.
      std::vector<int64_t> holder_hosts(nh);
      for (size_t i = 0; i < nh; ++i) holder_hosts[i] = host_[holders[i]];
      std::sort(holder_hosts.begin(), holder_hosts.end());
      using GroupKey = std::pair<int, int64_t>;  // (0, host) or (1, 0): any holder.
      std::vector<std::pair<GroupKey, size_t>> keyed;
      for (size_t k = start[s]; k < start[s + 1]; ++k) {
        const int64_t h = host_[demand_dst_[order[k]]];
        const bool local = std::binary_search(holder_hosts.begin(), holder_hosts.end(), h);
        keyed.push_back({local ? GroupKey{0, h} : GroupKey{1, 0}, order[k]});
      }
      std::stable_sort(keyed.begin(), keyed.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t i = 0; i < keyed.size(); ++i) order[start[s] + i] = keyed[i].second;
      std::vector<int> candidates;
      for (size_t i = 0; i < keyed.size();) {
        const GroupKey group = keyed[i].first;
        size_t end = i + 1;
        while (end < keyed.size() && keyed[end].first == group) ++end;
        candidates.clear();
        for (size_t h = 0; h < nh; ++h) {
          if (group.first == 1 || host_[holders[h]] == group.second) {
            candidates.push_back(holders[h]);
          }
        }
        AssignAmong(candidates.data(), candidates.size(), order.begin() + start[s] + i,
                    order.begin() + start[s] + end, t);
        i = end;
      }
    }
  }

 private:
  // Assigns the demands order[first, last) of one source box among `holders` (rank ids,
  // ascending): water-filling, whole pieces where they fit, else slabs.
  void AssignAmong(const int* holders, size_t nh, std::vector<size_t>::iterator first,
                   std::vector<size_t>::iterator last, std::vector<Transfer>& t) {
    int64_t total = 0;
    std::vector<int64_t> loads;
    for (size_t h = 0; h < nh; ++h) loads.push_back(load_[holders[h]]);
    for (auto it = first; it != last; ++it) total += t[*it].bytes;
    const double level = WaterLevel(std::move(loads), total);
    const double limit = level * kBalanceSlack;
    std::sort(first, last, [&](size_t a, size_t b) {
      return t[a].bytes != t[b].bytes ? t[a].bytes > t[b].bytes : a < b;
    });
    for (auto it = first; it != last; ++it) {
      const size_t di = *it;
      const int dst = demand_dst_[di];
      const int64_t bytes = t[di].bytes;
      // Preference key, larger is better: (fits, same host, affinity, -load, -rank id).
      auto key = [&](int h, bool fits) {
        return std::make_tuple(fits, host_aware_ && host_[h] == host_[dst], Affinity(h, dst),
                               -load_[h], -h);
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

  const Layout& source_;
  const Layout& target_;
  const RankIndex& ranks_;
  const std::vector<int64_t>& host_;
  const bool host_aware_;
  const std::vector<SourceBox>& boxes_;
  const std::vector<int>& holders_;
  const std::vector<size_t>& demand_source_;
  const std::vector<int>& demand_dst_;

  std::vector<int64_t> load_;                        // Bytes sent, by rank id.
  std::vector<const Shape*> src_coord_, tgt_coord_;  // Mesh coordinates by rank id.
};

}  // namespace

void AssignSenders(const SenderAssignmentInput& in, std::vector<Transfer>& t) {
  SenderAssigner(in).AssignSenders(t);
}

double WaterLevel(std::vector<int64_t> loads, int64_t demand) {
  std::sort(loads.begin(), loads.end());
  double prefix = 0;
  for (size_t k = 1; k <= loads.size(); ++k) {
    prefix += static_cast<double>(loads[k - 1]);
    const double level = (static_cast<double>(demand) + prefix) / k;
    if (k == loads.size() || level <= static_cast<double>(loads[k])) return level;
  }
  return static_cast<double>(demand);
}

}  // namespace shardcoord
