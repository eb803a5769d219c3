#include "client/layout_format.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json_writer.h"
#include "sharding/placement.h"

namespace shardcoord {
namespace {

// The layout command prints a row per rank; a bigger mesh is a typo, not a request.
constexpr int64_t kMaxCliRanks = int64_t{1} << 20;
// Rank lists longer than this become legend keys in the picture.
constexpr int kMaxCellLabel = 10;

// "--flag: message", kept on one line: the CLI promises one line per error.
absl::Status FlagError(absl::string_view flag, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": ", absl::StrReplaceAll(message, {{"\n", " "}})));
}

std::string Brackets(absl::Span<const int64_t> values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

bool ShowLocalOffsets(const Layout& layout) {
  for (const RankChunks& rc : layout.ranks()) {
    for (const Chunk& c : rc.chunks) {
      if (c.local_offset != 0) return true;
    }
  }
  return false;
}

// "0", "0,4", "0-3", "0-3,8-11": runs of three or more consecutive ranks are shortened.
std::string RankListLabel(const std::vector<int64_t>& sorted_ranks) {
  if (sorted_ranks.empty()) return ".";
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < sorted_ranks.size()) {
    size_t j = i;
    while (j + 1 < sorted_ranks.size() && sorted_ranks[j + 1] == sorted_ranks[j] + 1) ++j;
    if (j - i >= 2) {
      parts.push_back(absl::StrCat(sorted_ranks[i], "-", sorted_ranks[j]));
    } else {
      for (size_t k = i; k <= j; ++k) parts.push_back(absl::StrCat(sorted_ranks[k]));
    }
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

// Index of the first element of each of `cells` cells over an extent of `n` (cells <= n).
// Computed without r * n, which could overflow for huge extents.
std::vector<int64_t> CellStarts(int64_t n, int64_t cells) {
  std::vector<int64_t> starts(cells);
  const int64_t q = n / cells, rem = n % cells;
  for (int64_t r = 0; r < cells; ++r) starts[r] = r * q + (r * rem) / cells;
  return starts;
}

// Cells whose start lies in [begin, end): a range of indexes into `starts`.
std::pair<size_t, size_t> CellsIn(const std::vector<int64_t>& starts, int64_t begin, int64_t end) {
  const size_t lo = std::lower_bound(starts.begin(), starts.end(), begin) - starts.begin();
  const size_t hi = std::lower_bound(starts.begin(), starts.end(), end) - starts.begin();
  return {lo, hi};
}

}  // namespace

absl::StatusOr<Shape> ParseMeshShape(absl::string_view text) {
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t.empty()) return absl::InvalidArgumentError("mesh shape is empty (want e.g. 2x4)");
  Shape shape;
  for (absl::string_view item : absl::StrSplit(t, 'x')) {
    int64_t v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh shape '", text, "': '", item, "' is not a positive integer (want e.g. 2x4)"));
    }
    shape.push_back(v);
  }
  return shape;
}

absl::StatusOr<SizedMeshShape> ParseSizedMeshShape(absl::string_view text) {
  absl::StatusOr<Shape> shape = ParseMeshShape(text);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<int64_t> size = CheckedProduct(*shape);
  if (!size.ok()) return size.status();
  return SizedMeshShape{*std::move(shape), *size};
}

absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text) {
  std::vector<int64_t> out;
  if (absl::StripAsciiWhitespace(text).empty()) return out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", text, "': '", item, "' is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> ParseNameList(absl::string_view text) {
  std::vector<std::string> out;
  if (absl::StripAsciiWhitespace(text).empty()) return out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    out.emplace_back(absl::StripAsciiWhitespace(item));
  }
  return out;
}

absl::StatusOr<DeviceMesh> BuildMesh(const LayoutFlags& flags) {
  absl::StatusOr<SizedMeshShape> shape = ParseSizedMeshShape(flags.mesh);
  if (!shape.ok()) return FlagError("--mesh", shape.status().message());
  if (shape->size > kMaxCliRanks) {
    return FlagError("--mesh",
                     absl::StrCat("mesh ", absl::StrJoin(shape->shape, "x"), " has ", shape->size,
                                  " positions; at most ", kMaxCliRanks, " are supported here"));
  }
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(shape->shape);
  if (!mesh.ok()) return FlagError("--mesh", mesh.status().message());

  // Build in steps so that each error is charged to the flag that caused it.
  absl::StatusOr<std::vector<int64_t>> ranks = ParseIntList(flags.ranks);
  if (!ranks.ok()) return FlagError("--ranks", ranks.status().message());
  if (!ranks->empty()) {
    mesh = DeviceMesh::Create(shape->shape, *ranks);
    if (!mesh.ok()) return FlagError("--ranks", mesh.status().message());
  }
  std::vector<std::string> names = ParseNameList(flags.dims);
  if (!names.empty()) {
    mesh = DeviceMesh::Create(shape->shape, mesh->ranks(), std::move(names));
    if (!mesh.ok()) return FlagError("--dims", mesh.status().message());
  }
  return mesh;
}

absl::StatusOr<LayoutRequest> BuildLayout(const LayoutFlags& flags) {
  absl::StatusOr<DeviceMesh> mesh = BuildMesh(flags);
  if (!mesh.ok()) return mesh.status();

  absl::StatusOr<Shape> shape = ParseIntList(flags.shape);
  if (!shape.ok()) return FlagError("--shape", shape.status().message());
  if (absl::Status s = ValidateShape(*shape); !s.ok()) return FlagError("--shape", s.message());

  absl::StatusOr<DType> dtype = ParseDType(absl::StripAsciiWhitespace(flags.dtype));
  if (!dtype.ok()) return FlagError("--dtype", dtype.status().message());
  // Byte counts in the table must not overflow either.
  if (absl::StatusOr<int64_t> bytes = CheckedBytes(*shape, ElementSize(*dtype)); !bytes.ok()) {
    return FlagError("--shape", bytes.status().message());
  }

  if (flags.placements.has_value() == flags.flat.has_value()) {
    return flags.flat.has_value()
               ? FlagError("--flat", "give exactly one of --placements or --flat, not both")
               : FlagError("--placements",
                           "give exactly one of --placements or --flat (neither was given)");
  }
  absl::StatusOr<Layout> layout;
  if (flags.placements.has_value()) {
    absl::StatusOr<std::vector<Placement>> placements = ParsePlacements(*flags.placements);
    if (!placements.ok()) return FlagError("--placements", placements.status().message());
    layout = Layout::FromPlacements(*mesh, *shape, *placements);
    if (!layout.ok()) return FlagError("--placements", layout.status().message());
  } else {
    absl::StatusOr<FlatSpec> spec = ParseFlatSpec(*flags.flat);
    if (!spec.ok()) return FlagError("--flat", spec.status().message());
    layout = Layout::FromFlat(*mesh, *shape, *spec);
    if (!layout.ok()) return FlagError("--flat", layout.status().message());
  }
  return LayoutRequest{*std::move(layout), *dtype};
}

std::string LayoutJson(const Layout& layout) {
  const bool local = ShowLocalOffsets(layout);
  const bool partial = layout.is_partial();
  const Shape zeros(layout.ndim(), 0);
  JsonWriter w;
  w.BeginObject().Key("chunks").BeginArray();
  for (const RankChunks& rc : layout.ranks()) {
    auto entry = [&](const Shape& offset, const Shape& shape, int64_t local_offset,
                     int64_t partial_index) {
      w.BeginObject();
      w.Key("rank").Int(rc.rank);
      w.Key("coord").IntArray(rc.coord);
      w.Key("offset").IntArray(offset);
      w.Key("shape").IntArray(shape);
      if (local) w.Key("local_offset").Int(local_offset);
      if (partial) w.Key("partial_index").Int(partial_index);
      w.EndObject();
    };
    if (rc.chunks.empty()) entry(zeros, zeros, 0, 0);
    for (const Chunk& c : rc.chunks) {
      entry(c.box.offset(), c.box.shape(), c.local_offset, c.partial_index);
    }
  }
  w.EndArray().EndObject();
  return w.str();
}

std::string LayoutTable(const Layout& layout, DType dtype) {
  const int64_t element_size = ElementSize(dtype);
  const int64_t tensor_bytes = layout.num_elements() * element_size;  // Checked when built.
  std::string out = absl::StrCat("tensor ", ShapeToString(layout.global_shape()), " ",
                                 DTypeName(dtype), ", ", tensor_bytes, " bytes\n");
  std::string where = layout.mesh().has_value() ? layout.mesh()->ToString()
                                                : absl::StrCat(layout.ranks().size(), " ranks");
  if (!layout.placements().empty()) {
    absl::StrAppend(&out, "layout ", PlacementsToString(layout.placements()), " on ", where, "\n");
  } else if (layout.flat_spec().has_value()) {
    absl::StrAppend(&out, "layout flat '", FlatSpecToString(*layout.flat_spec()), "' on ", where,
                    "\n");
  } else {
    absl::StrAppend(&out, "layout of explicit chunks on ", where, "\n");
  }
  if (layout.is_partial()) {
    absl::StrAppend(&out, "partial: ", layout.num_partials(),
                    " contributions (partial index) reduce with ",
                    ReduceOpName(layout.partial_op()), "\n");
  }
  out += "\n";

  const bool local = ShowLocalOffsets(layout);
  const bool partial = layout.is_partial();
  std::vector<std::string> header = {"rank", "coord", "offset", "shape", "bytes"};
  std::vector<bool> right = {true, false, false, false, true};
  if (local) {
    header.push_back("local offset");
    right.push_back(true);
  }
  if (partial) {
    header.push_back("partial");
    right.push_back(true);
  }
  std::vector<std::vector<std::string>> rows = {header};
  int64_t held = 0, largest = 0;
  bool held_overflows = false;
  for (const RankChunks& rc : layout.ranks()) {
    const std::string coord = rc.coord.empty() ? "-" : Brackets(rc.coord);
    int64_t rank_bytes = 0;
    if (rc.chunks.empty()) {
      std::vector<std::string> row = {absl::StrCat(rc.rank), coord, "-", "-", "0"};
      if (local) row.push_back("-");
      if (partial) row.push_back("-");
      rows.push_back(std::move(row));
    }
    for (const Chunk& c : rc.chunks) {
      const int64_t bytes = c.box.Volume() * element_size;  // At most the tensor's bytes.
      rank_bytes += bytes;  // A rank's chunks are disjoint, so this too.
      std::vector<std::string> row = {absl::StrCat(rc.rank), coord, Brackets(c.box.offset()),
                                      Brackets(c.box.shape()), absl::StrCat(bytes)};
      if (local) row.push_back(absl::StrCat(c.local_offset));
      if (partial) row.push_back(absl::StrCat(c.partial_index));
      rows.push_back(std::move(row));
    }
    largest = std::max(largest, rank_bytes);
    // Replicas over many ranks can exceed int64 in total.
    absl::StatusOr<int64_t> sum = CheckedAdd(held, rank_bytes);
    if (sum.ok()) {
      held = *sum;
    } else {
      held_overflows = true;
    }
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i > 0) line += "  ";
      const std::string pad(width[i] - row[i].size(), ' ');
      line += right[i] ? pad + row[i] : row[i] + pad;
    }
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  out += "\n";
  if (held_overflows) {
    out += "held: more than 2^63 bytes in total";
  } else {
    absl::StrAppend(&out, "held: ", held, " bytes in total");
    if (tensor_bytes > 0) {
      absl::StrAppend(
          &out, absl::StrFormat(" (%.3gx the tensor)", static_cast<double>(held) / tensor_bytes));
    }
  }
  absl::StrAppend(&out, ", at most ", largest, " bytes on one rank\n");
  return out;
}

std::string LayoutPicture(const Layout& layout) {
  const int ndim = layout.ndim();
  if (ndim != 1 && ndim != 2) return "";
  const int64_t n0 = ndim == 2 ? layout.global_shape()[0] : 1;
  const int64_t n1 = layout.global_shape()[ndim - 1];
  if (n0 == 0 || n1 == 0) return "picture: the tensor is empty, nothing to draw\n";

  const int64_t rows = std::min<int64_t>(n0, kPictureMaxRows);
  const std::vector<int64_t> row_starts = CellStarts(n0, rows);
  // Holder lists per cell depend on how many columns there are, and the column count on
  // the widest label: start from 1-character labels and shrink until the grid fits.
  int64_t cols = std::min<int64_t>(n1, kPictureMaxWidth / 2);
  std::vector<std::string> labels;
  std::vector<std::pair<std::string, std::string>> legend;  // key, rank list
  size_t cell_width = 1;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::vector<int64_t> col_starts = CellStarts(n1, cols);
    std::vector<std::vector<int64_t>> holders(rows * cols);
    for (const RankChunks& rc : layout.ranks()) {
      for (const Chunk& c : rc.chunks) {
        if (c.box.Empty()) continue;
        std::pair<size_t, size_t> rr = {0, 1};
        if (ndim == 2) rr = CellsIn(row_starts, c.box.offset(0), c.box.end(0));
        const auto [c0, c1] = CellsIn(col_starts, c.box.offset(ndim - 1), c.box.end(ndim - 1));
        for (size_t r = rr.first; r < rr.second; ++r) {
          for (size_t k = c0; k < c1; ++k) holders[r * cols + k].push_back(rc.rank);
        }
      }
    }
    labels.assign(holders.size(), "");
    legend.clear();
    absl::flat_hash_map<std::string, std::string> key_of;
    cell_width = 1;
    for (size_t i = 0; i < holders.size(); ++i) {
      std::vector<int64_t>& h = holders[i];
      std::sort(h.begin(), h.end());
      h.erase(std::unique(h.begin(), h.end()), h.end());
      std::string label = RankListLabel(h);
      if (label.size() > kMaxCellLabel) {
        auto [it, inserted] = key_of.emplace(label, absl::StrCat("g", key_of.size() + 1));
        if (inserted) legend.emplace_back(it->second, label);
        label = it->second;
      }
      cell_width = std::max(cell_width, label.size());
      labels[i] = std::move(label);
    }
    const int64_t fit = std::max<int64_t>(1, kPictureMaxWidth / (cell_width + 1));
    if (cols <= fit) break;
    cols = std::min(n1, fit);
  }

  std::string out;
  const int64_t cell_rows = (n0 + rows - 1) / rows, cell_cols = (n1 + cols - 1) / cols;
  if (ndim == 2) {
    absl::StrAppend(&out, "picture: rows are dim 0 (", n0, " in ", rows,
                    " cells), columns are dim 1 (", n1, " in ", cols, " cells)");
  } else {
    absl::StrAppend(&out, "picture: dim 0 (", n1, " in ", cols, " cells)");
  }
  if (cell_rows == 1 && cell_cols == 1) {
    out += "; each cell is one element\n";
  } else {
    absl::StrAppend(&out, "; each cell spans up to ", ndim == 2 ? absl::StrCat(cell_rows, "x") : "",
                    cell_cols, " elements and shows who holds its first\n");
  }
  for (int64_t r = 0; r < rows; ++r) {
    std::string line = "  ";
    for (int64_t k = 0; k < cols; ++k) {
      const std::string& label = labels[r * cols + k];
      if (k > 0) line += " ";
      line += std::string(cell_width - label.size(), ' ') + label;
    }
    absl::StrAppend(&out, line, "\n");
  }
  for (const auto& [key, ranks] : legend)
    absl::StrAppend(&out, "  ", key, " = ranks ", ranks, "\n");
  return out;
}

}  // namespace shardcoord
