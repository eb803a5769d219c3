#include "sharding/spatial_index.h"

#include <numeric>

#include "absl/container/flat_hash_set.h"

namespace shardcoord {

void BoxIndex::Build(const std::vector<SourceBox>& all, size_t begin, size_t end, int ndim) {
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

void BoxIndex::ChooseDims(const std::vector<SourceBox>& all) {
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

std::vector<Box> SubtractBox(const Box& x, const Box& a) {
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

std::optional<std::pair<size_t, size_t>> FindOverlap(const std::vector<const Box*>& boxes,
                                                     const std::vector<int64_t>& owners) {
  const size_t n = boxes.size();
  if (n < 2) return std::nullopt;
  const int ndim = boxes[0]->ndim();
  if (ndim == 0) {  // Every scalar box is the whole tensor.
    for (size_t j = 1; j < n; ++j) {
      if (owners[j] != owners[0]) return std::make_pair(size_t{0}, j);
    }
    return std::nullopt;
  }
  int sweep = 0;
  size_t best = 0;
  std::vector<int64_t> offs;
  offs.reserve(n);
  for (int d = 0; d < ndim; ++d) {
    offs.clear();
    for (const Box* b : boxes) offs.push_back(b->offset(d));
    std::sort(offs.begin(), offs.end());
    const size_t distinct = std::unique(offs.begin(), offs.end()) - offs.begin();
    if (distinct > best) {
      best = distinct;
      sweep = d;
    }
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Box& x = *boxes[a];
    const Box& y = *boxes[b];
    if (x.offset(sweep) != y.offset(sweep)) return x.offset(sweep) < y.offset(sweep);
    if (x != y) return x < y;
    if (owners[a] != owners[b]) return owners[a] < owners[b];
    return a < b;
  });
  std::vector<size_t> active;
  for (size_t cur : order) {
    const Box& box = *boxes[cur];
    size_t keep = 0;
    for (size_t a : active) {
      if (boxes[a]->end(sweep) <= box.offset(sweep)) continue;  // Retire.
      active[keep++] = a;
      if (owners[a] != owners[cur] && boxes[a]->Overlaps(box)) return std::make_pair(a, cur);
    }
    active.resize(keep);
    active.push_back(cur);
  }
  return std::nullopt;
}

}  // namespace shardcoord
