#ifndef SHARDCOORD_SHARDING_SPATIAL_INDEX_H_
#define SHARDCOORD_SHARDING_SPATIAL_INDEX_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "sharding/box.h"

namespace shardcoord {

// A distinct (partial contribution, box) of the source and the ranks holding it.
struct SourceBox {
  const Box* box;  // Into the source layout.
  int64_t partial = 0;
  size_t holders_begin = 0;  // Range in the planner's holder list (rank ids, ascending).
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
  void Build(const std::vector<SourceBox>& all, size_t begin, size_t end, int ndim);

  // Calls f(i) for every indexed i whose box overlaps `q`.
  template <typename F>
  void ForEachOverlap(const Box& q, F&& f) const {
    if (ids_.empty()) return;
    if (ndim_ == 0) {  // Scalars: every box is the whole tensor.
      for (size_t id : ids_) f(id);
      return;
    }
    const auto g_begin =
        std::lower_bound(group_off_.begin(), group_off_.end(), q.offset(d0_) - max_ext0_ + 1);
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
  void ChooseDims(const std::vector<SourceBox>& all);

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
std::vector<Box> SubtractBox(const Box& x, const Box& a);

// Two overlapping boxes of different owners, as indices (earlier, later) into `boxes`, or
// nullopt when there are none (boxes of one owner may overlap each other). Sweeps along
// the dim with the most distinct offsets, keeping the boxes that still reach the sweep
// position, so regular grids keep a small active set. Deterministic: boxes are visited in
// order of (offset along the sweep dim, box, owner) and the first overlap found is
// returned. `boxes` and `owners` have the same length; all boxes have the same ndim.
std::optional<std::pair<size_t, size_t>> FindOverlap(const std::vector<const Box*>& boxes,
                                                     const std::vector<int64_t>& owners);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_SPATIAL_INDEX_H_
