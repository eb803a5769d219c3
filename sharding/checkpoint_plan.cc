#include "sharding/checkpoint_plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sharding/shard_distribution.h"

namespace shardcoord {
namespace {

// The first dim longer than 1 (all dims before it are 1, so cutting it keeps every part one
// contiguous row-major range of the box), or -1.
int SplitDim(const Box& box) {
  for (int d = 0; d < box.ndim(); ++d) {
    if (box.shape(d) > 1) return d;
  }
  return -1;
}

// {offset, size} of part j when `total` is cut into `parts` parts whose sizes differ by at
// most one (unlike torch.chunk, which may leave the last parts empty).
std::pair<int64_t, int64_t> EvenPart(int64_t total, int64_t parts, int64_t j) {
  const int64_t q = total / parts, r = total % parts;
  return {j * q + std::min(j, r), q + (j < r ? 1 : 0)};
}

// Part j of `parts` of `box` along `dim`.
Box PartOf(const Box& box, int dim, int64_t parts, int64_t j) {
  const auto [off, size] = EvenPart(box.shape(dim), parts, j);
  Shape offset = box.offset(), shape = box.shape();
  offset[dim] += off;
  shape[dim] = size;
  return Box(std::move(offset), std::move(shape));
}

std::string ShardId(size_t a, size_t b, size_t c, size_t d) {
  return absl::StrFormat("%08d/%08d/%08d/%08d", a, b, c, d);
}

}  // namespace

absl::StatusOr<SavePlan> PlanSave(absl::Span<const SaveTensor> tensors,
                                  const SavePlanOptions& options) {
  absl::flat_hash_set<std::string> names;
  struct Part {
    size_t tensor;
    Box box;
    int64_t bytes;
  };
  absl::btree_map<std::string, Part> parts;
  absl::btree_map<std::string, std::vector<int64_t>> holders_of;
  absl::btree_map<std::string, int64_t> size_of;
  std::set<int64_t> candidates;
  int64_t max_rank = 0;
  SavePlan plan;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const SaveTensor& st = tensors[t];
    if (st.name.empty())
      return absl::InvalidArgumentError(absl::StrCat("tensors[", t, "]: empty name"));
    if (!names.insert(st.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", t, "]: tensor '", st.name, "' is named twice"));
    }
    if (st.layout.is_partial()) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", st.name,
                       "' holds Partial values (a pending reduction): redistribute it to a "
                       "spec without P first"));
    }
    const int64_t esize = ElementSize(st.dtype);
    // Distinct boxes and their holders (chunks with equal boxes are replicas).
    std::map<Box, std::vector<int64_t>> pieces;
    for (const RankChunks& rc : st.layout.ranks()) {
      for (const Chunk& c : rc.chunks) {
        if (c.box.Empty()) continue;
        pieces[c.box].push_back(rc.rank);
        candidates.insert(rc.rank);
        max_rank = std::max(max_rank, rc.rank);
      }
    }
    size_t p = 0;
    for (auto& [box, holders] : pieces) {
      std::sort(holders.begin(), holders.end());
      holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
      const int64_t bytes = box.Volume() * esize;
      plan.total_bytes += bytes;
      const int dim = SplitDim(box);
      int64_t n = 1;
      if (dim >= 0 && holders.size() > 1) {
        const int64_t by_size = options.min_part_bytes > 0
                                    ? std::max<int64_t>(1, bytes / options.min_part_bytes)
                                    : bytes;
        n = std::min({static_cast<int64_t>(holders.size()), box.shape(dim), by_size});
      }
      for (int64_t j = 0; j < n; ++j) {
        Box part = n == 1 ? box : PartOf(box, dim, n, j);
        if (part.Empty()) continue;
        const std::string id = ShardId(t, p, static_cast<size_t>(j), 0);
        const int64_t part_bytes = part.Volume() * esize;
        parts.emplace(id, Part{t, std::move(part), part_bytes});
        holders_of.emplace(id, holders);
        size_of.emplace(id, part_bytes);
      }
      ++p;
    }
  }
  absl::StatusOr<absl::btree_map<std::string, int64_t>> writers =
      DistributeShardsToRanks(holders_of, size_of, max_rank + 1);
  if (!writers.ok()) return writers.status();
  std::map<int64_t, SaveFile> files;
  for (const auto& [id, part] : parts) {  // Id order: tensor, then box order.
    const int64_t rank = writers->at(id);
    SaveFile& f = files[rank];
    f.rank = rank;
    SaveEntry e;
    e.tensor = part.tensor;
    e.box = part.box;
    e.entry = PieceEntryName(tensors[part.tensor].name, part.box);
    e.bytes = part.bytes;
    f.bytes += e.bytes;
    f.entries.push_back(std::move(e));
  }
  for (auto& [rank, f] : files) {
    f.file = CheckpointFileName(rank);
    plan.max_writer_bytes = std::max(plan.max_writer_bytes, f.bytes);
    plan.files.push_back(std::move(f));
  }
  plan.candidate_writers = static_cast<int64_t>(candidates.size());
  if (plan.candidate_writers > 0) {
    plan.ideal_writer_bytes =
        static_cast<double>(plan.total_bytes) / static_cast<double>(plan.candidate_writers);
  }
  return plan;
}

absl::StatusOr<LoadPlan> PlanLoad(absl::Span<const LoadTensor> tensors,
                                  const LoadPlanOptions& options) {
  // A unit: rows [begin, end) of one piece, needed by `needers`.
  struct Shard {
    size_t tensor;
    size_t piece;
    int64_t row_begin;
    int64_t row_end;
  };
  absl::btree_map<std::string, Shard> shards;
  // By group: each is balanced on its own.
  absl::btree_map<int64_t, absl::btree_map<std::string, std::vector<int64_t>>> needers_of;
  absl::btree_map<std::string, int64_t> size_of;
  int64_t max_rank = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const CheckpointTensor& ct = *tensors[t].tensor;
    const Layout& target = tensors[t].target;
    if (target.global_shape() != ct.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", ct.name, "': the target has shape ", ShapeToString(target.global_shape()),
          " but the checkpoint ", ShapeToString(ct.shape)));
    }
    if (target.is_partial()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", ct.name, "': a checkpoint cannot load into a Partial layout"));
    }
    const int64_t esize = ElementSize(ct.dtype);
    for (size_t p = 0; p < ct.pieces.size(); ++p) {
      const CheckpointPiece& piece = ct.pieces[p];
      if (piece.box.Empty()) continue;
      const int64_t rows = BoxRows(piece.box);
      const int64_t row_bytes = BoxRowElements(piece.box) * esize;
      // Rows [ra, rb) of the piece each target chunk overlaps.
      std::vector<std::pair<std::pair<int64_t, int64_t>, int64_t>> wants;
      for (const RankChunks& rc : target.ranks()) {
        for (const Chunk& c : rc.chunks) {
          const Box x = c.box.Intersect(piece.box);
          if (x.Empty()) continue;
          int64_t ra = 0, rb = 1;
          if (piece.box.ndim() > 0) {
            ra = x.offset(0) - piece.box.offset(0);
            rb = ra + x.shape(0);
          }
          wants.push_back({{ra, rb}, rc.rank});
          max_rank = std::max(max_rank, rc.rank);
        }
      }
      // The piece's rows cut where the set of ranks needing them changes: at every chunk
      // boundary, or (with block checksums, which a reader checks whole) at block
      // boundaries, a block needed by the ranks needing any of its rows.
      // A LoadTensor::row_align as well: the least common multiple of both.
      const int64_t check_grain = piece.rows_per_block > 0 ? piece.rows_per_block : 1;
      const int64_t align = std::max<int64_t>(1, tensors[t].row_align);
      const int64_t grain = check_grain / std::gcd(check_grain, align) * align;
      std::vector<int64_t> cuts = {0, rows};
      for (const auto& [range, rank] : wants) {
        cuts.push_back(range.first / grain * grain);
        cuts.push_back(std::min(rows, (range.second + grain - 1) / grain * grain));
      }
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      std::vector<std::vector<int64_t>> needers(cuts.size() - 1);
      for (const auto& [range, rank] : wants) {
        const size_t from =
            std::upper_bound(cuts.begin(), cuts.end(), range.first) - cuts.begin() - 1;
        for (size_t i = from; i + 1 < cuts.size() && cuts[i] < range.second; ++i) {
          needers[i].push_back(rank);
        }
      }
      for (auto& n : needers) {
        std::sort(n.begin(), n.end());
        n.erase(std::unique(n.begin(), n.end()), n.end());
        if (n.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor '", ct.name, "': the target layout does not cover piece ",
                           piece.box.ToString()));
        }
      }
      // Segments of rows with the same needers, each cut into as many parts (of whole
      // grains) as it has needers, for them to share.
      size_t seg = 0;
      for (size_t u = 0; u < needers.size(); ++seg) {
        size_t v = u + 1;
        while (v < needers.size() && needers[v] == needers[u]) ++v;
        const std::vector<int64_t>& who = needers[u];
        const int64_t first = cuts[u], last = cuts[v];
        const int64_t grains = (last - first + grain - 1) / grain;
        const int64_t n = std::min(static_cast<int64_t>(who.size()), grains);
        for (int64_t j = 0; j < n; ++j) {
          const auto [off, len] = EvenPart(grains, n, j);
          if (len == 0) continue;
          const int64_t rb = first + off * grain;
          const int64_t re = std::min(last, first + (off + len) * grain);
          const std::string id = ShardId(t, p, seg, static_cast<size_t>(j));
          shards.emplace(id, Shard{t, p, rb, re});
          needers_of[tensors[t].group].emplace(id, who);
          size_of.emplace(id, (re - rb) * row_bytes);
        }
        u = v;
      }
    }
  }
  absl::btree_map<std::string, int64_t> readers;
  for (const auto& [group, needers] : needers_of) {
    absl::StatusOr<absl::btree_map<std::string, int64_t>> picked =
        DistributeShardsToRanks(needers, size_of, max_rank + 1);
    if (!picked.ok()) return picked.status();
    readers.merge(*picked);
  }

  LoadPlan plan;
  plan.tensors.resize(tensors.size());
  // Per tensor, per rank: runs in (piece, row) order, adjacent ones merged.
  std::vector<std::map<int64_t, std::vector<ReadRun>>> runs(tensors.size());
  for (const auto& [id, s] : shards) {  // Id order: tensor, piece, rows.
    const int64_t rank = readers.at(id);
    std::vector<ReadRun>& mine = runs[s.tensor][rank];
    plan.bytes_by_rank[rank] += size_of.at(id);
    plan.total_bytes += size_of.at(id);
    if (!mine.empty() && mine.back().piece == s.piece && mine.back().row_end == s.row_begin) {
      mine.back().row_end = s.row_end;
      continue;
    }
    ReadRun r;
    r.rank = rank;
    r.piece = s.piece;
    r.row_begin = s.row_begin;
    r.row_end = s.row_end;
    mine.push_back(r);
  }
  const int64_t align = options.align_bytes;
  if (align < 0 || (align & (align - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("align_bytes: ", align, " is not a power of two"));
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    const CheckpointTensor& ct = *tensors[t].tensor;
    const std::vector<int64_t>& offsets = tensors[t].piece_file_offsets;
    if (!offsets.empty() && offsets.size() != ct.pieces.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", ct.name, "': ", offsets.size(),
                                                     " piece offsets for ", ct.pieces.size(),
                                                     " pieces"));
    }
    const int64_t esize = ElementSize(ct.dtype);
    std::vector<RankChunks> ranks;
    TensorRead& out = plan.tensors[t];
    for (auto& [rank, list] : runs[t]) {
      RankChunks rc;
      rc.rank = rank;
      for (ReadRun& r : list) {
        const Box& pb = ct.pieces[r.piece].box;
        if (pb.ndim() == 0) {
          r.box = pb;
        } else {
          Shape offset = pb.offset(), shape = pb.shape();
          offset[0] += r.row_begin;
          shape[0] = r.row_end - r.row_begin;
          r.box = Box(std::move(offset), std::move(shape));
        }
        r.local_offset = rc.local_elements;
        int64_t end = r.local_offset + r.box.Volume();
        if (!offsets.empty()) {
          r.file_offset = offsets[r.piece] + r.row_begin * BoxRowElements(pb) * esize;
          const int64_t bytes = r.box.Volume() * esize;
          const int64_t residue = align > 0 ? r.file_offset % align : 0;
          if (align > 0 && bytes >= kAlignedRunBytes && residue % esize == 0) {
            // Its own pages: it starts at its file offset's residue past the first page
            // boundary after the run before, and the next run starts after its last page.
            const int64_t start = (rc.local_elements * esize + align - 1) / align * align + residue;
            r.local_offset = start / esize;
            end = (start + bytes + align - 1) / align * align / esize;
          }
        }
        rc.chunks.push_back(Chunk{r.box, r.local_offset, 0});
        rc.local_elements = end;
        out.runs.push_back(r);
      }
      ranks.push_back(std::move(rc));
    }
    absl::StatusOr<Layout> layout = Layout::FromChunks(ct.shape, std::move(ranks));
    if (!layout.ok()) {
      return absl::InternalError(absl::StrCat(
          "tensor '", ct.name, "': the read layout is invalid: ", layout.status().message()));
    }
    out.read_layout = *std::move(layout);
  }
  return plan;
}

std::vector<std::vector<size_t>> CutLoadBatches(absl::Span<const int64_t> bytes,
                                                int64_t batch_bytes, int64_t first_batch_bytes) {
  std::vector<std::vector<size_t>> out;
  if (bytes.empty()) return out;
  if (first_batch_bytes > 0 && batch_bytes > 0) {
    // In load order, every tensor that still fits (larger ones wait for a later batch).
    std::vector<size_t> first, rest;
    int64_t used = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
      const int64_t b = std::max<int64_t>(bytes[i], 0);
      if (used + b <= first_batch_bytes) {
        first.push_back(i);
        used += b;
      } else {
        rest.push_back(i);
      }
    }
    if (first.empty()) {  // Nothing fits: the first tensor alone.
      first.push_back(0);
      rest.erase(rest.begin());
    }
    out.push_back(std::move(first));
    std::vector<int64_t> rest_bytes;
    for (size_t i : rest) rest_bytes.push_back(bytes[i]);
    for (std::vector<size_t>& batch : CutLoadBatches(rest_bytes, batch_bytes)) {
      for (size_t& i : batch) i = rest[i];
      out.push_back(std::move(batch));
    }
    return out;
  }
  int64_t total = 0;
  for (int64_t b : bytes) total += std::max<int64_t>(b, 0);
  int64_t k = 1;
  if (batch_bytes > 0) k = std::max<int64_t>(1, (total + batch_bytes / 2) / batch_bytes);
  k = std::min<int64_t>(k, static_cast<int64_t>(bytes.size()));
  out.resize(static_cast<size_t>(k));
  int64_t before = 0;
  for (size_t t = 0; t < bytes.size(); ++t) {
    const int64_t b = std::max<int64_t>(bytes[t], 0);
    // The batch holding byte before + b/2 of `total` cut into k even ranges.
    int64_t batch = total == 0 ? 0 : (2 * before + b) * k / (2 * total);
    batch = std::min(batch, k - 1);
    out[static_cast<size_t>(batch)].push_back(t);
    before += b;
  }
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](const std::vector<size_t>& v) { return v.empty(); }),
            out.end());
  return out;
}

}  // namespace shardcoord
