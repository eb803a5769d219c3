#include "coordinator/state/tensor_bands.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

namespace shardcoord {
namespace {

// Elements of one dim-0 index of `box` (all of it for a scalar).
int64_t InnerVolume(const Box& box) {
  int64_t v = 1;
  for (int d = 1; d < box.ndim(); ++d) v *= box.shape(d);
  return v;
}

}  // namespace

BandPlan::BandPlan(Shape shape, int64_t element_size, int64_t band_bytes)
    : shape_(std::move(shape)), element_size_(element_size) {
  if (band_bytes <= 0) band_bytes = 1;
  const Box whole = Box::Whole(shape_);
  if (whole.Empty()) return;  // No elements, no band.
  if (shape_.empty()) {
    num_bands_ = 1;
    return;
  }
  const int64_t row_bytes = InnerVolume(whole) * element_size_;
  rows_per_band_ = std::max<int64_t>(1, std::min(shape_[0], band_bytes / row_bytes));
  num_bands_ = (shape_[0] + rows_per_band_ - 1) / rows_per_band_;
}

Box BandPlan::band(int64_t i) const {
  Box whole = Box::Whole(shape_);
  if (shape_.empty()) return whole;
  Shape offset = whole.offset();
  Shape extent = whole.shape();
  offset[0] = i * rows_per_band_;
  extent[0] = std::max<int64_t>(0, std::min(rows_per_band_, shape_[0] - offset[0]));
  return Box(std::move(offset), std::move(extent));
}

std::vector<BandSource> ChooseSources(const Layout& layout,
                                      const std::function<bool(int64_t rank)>& live) {
  std::map<std::pair<Box, int64_t>, size_t> index;
  std::vector<BandSource> out;
  std::map<int64_t, int64_t> load;
  for (const RankChunks& rc : layout.ranks()) {
    if (!live(rc.rank)) continue;
    for (const Chunk& c : rc.chunks) {
      if (c.box.Empty()) continue;
      const int64_t v = c.box.Volume();
      auto [it, inserted] = index.try_emplace({c.box, c.partial_index}, out.size());
      if (inserted) {
        out.push_back(BandSource{c.box, c.partial_index, rc.rank});
        load[rc.rank] += v;
      } else if (load[rc.rank] + v < load[out[it->second].rank]) {
        load[out[it->second].rank] -= v;
        load[rc.rank] += v;
        out[it->second].rank = rc.rank;
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const BandSource& a, const BandSource& b) {
    return a.partial_index < b.partial_index;
  });
  return out;
}

std::vector<BandSource> BandReads(const std::vector<BandSource>& sources, const Box& band) {
  std::vector<BandSource> out;
  for (const BandSource& s : sources) {
    Box part = s.box.Intersect(band);
    if (part.Empty()) continue;
    out.push_back(BandSource{std::move(part), s.partial_index, s.rank});
  }
  return out;
}

std::vector<LocalWrite> BandWrites(const RankChunks& rc, const Box& band, bool zero_partials) {
  std::vector<LocalWrite> out;
  for (const Chunk& c : rc.chunks) {
    Box part = c.box.Intersect(band);
    if (part.Empty()) continue;
    int64_t offset = c.local_offset;
    if (part.ndim() > 0) offset += (part.offset(0) - c.box.offset(0)) * InnerVolume(c.box);
    out.push_back(LocalWrite{offset, std::move(part), zero_partials && c.partial_index != 0});
  }
  std::sort(out.begin(), out.end(), [](const LocalWrite& a, const LocalWrite& b) {
    return a.local_offset < b.local_offset;
  });
  return out;
}

bool WritesInOrder(const Layout& layout, const BandPlan& plan) {
  if (plan.num_bands() <= 1) return true;
  const int64_t rows = plan.rows_per_band();
  for (const RankChunks& rc : layout.ranks()) {
    std::vector<const Chunk*> chunks;
    for (const Chunk& c : rc.chunks) {
      if (!c.box.Empty()) chunks.push_back(&c);
    }
    std::sort(chunks.begin(), chunks.end(),
              [](const Chunk* a, const Chunk* b) { return a->local_offset < b->local_offset; });
    // Bands are written one after another and, within a band, by local offset: a chunk may
    // start in no band before the last band of a chunk in front of it in the buffer.
    int64_t last_band = std::numeric_limits<int64_t>::min();
    for (const Chunk* c : chunks) {
      const int64_t first = c->box.offset(0) / rows;
      if (first < last_band) return false;
      last_band = std::max(last_band, (c->box.end(0) - 1) / rows);
    }
  }
  return true;
}

}  // namespace shardcoord
