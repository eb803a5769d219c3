#include "sharding/checkpoint_index.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sharding/json.h"
#include "sharding/layout.h"

namespace shardcoord {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

std::string Hex64(uint64_t v) { return absl::StrFormat("%016x", v); }

absl::StatusOr<uint64_t> ParseHex64(absl::string_view field, const JsonValue& v) {
  uint64_t out = 0;
  if (!v.is_string() || v.text().size() != 16 || !absl::SimpleHexAtoi(v.text(), &out) ||
      v.text()[0] == '+' || v.text()[0] == '-') {
    return Bad(field, "expected 16 hex digits");
  }
  for (char c : v.text()) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return Bad(field, "expected 16 hex digits");
    }
  }
  return out;
}

// Only the listed keys may appear.
absl::Status CheckKeys(absl::string_view field, const JsonValue& v,
                       std::initializer_list<absl::string_view> keys) {
  if (!v.is_object()) {
    return Bad(field, absl::StrCat("expected an object, got ", JsonKindName(v.kind())));
  }
  for (const JsonValue::Member& m : v.members()) {
    if (std::find(keys.begin(), keys.end(), m.first) == keys.end()) {
      return Bad(field, absl::StrCat("unknown field ", QuoteJson(m.first)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const JsonValue*> Require(absl::string_view field, const JsonValue& obj,
                                         absl::string_view key, JsonValue::Kind kind) {
  const JsonValue* v = obj.Find(key);
  const std::string f = absl::StrCat(field, ".", key);
  if (v == nullptr) return Bad(f, "missing");
  if (v->kind() != kind) {
    return Bad(f, absl::StrCat("expected ", JsonKindName(kind), ", got ", JsonKindName(v->kind())));
  }
  return v;
}

absl::StatusOr<Shape> ParseDims(absl::string_view field, const JsonValue& v) {
  if (!v.is_array()) return Bad(field, "expected an array");
  if (v.items().size() > static_cast<size_t>(kMaxSafetensorsDims)) {
    return Bad(field, absl::StrCat(v.items().size(), " dims, more than ", kMaxSafetensorsDims));
  }
  Shape out;
  for (size_t i = 0; i < v.items().size(); ++i) {
    const std::string f = absl::StrCat(field, "[", i, "]");
    absl::StatusOr<int64_t> d = v.items()[i].AsInt64(f);
    if (!d.ok()) return d.status();
    if (*d < 0) return Bad(f, absl::StrCat("negative ", *d));
    out.push_back(*d);
  }
  return out;
}

absl::StatusOr<CheckpointPiece> ParsePiece(const std::string& field, const JsonValue& v) {
  if (absl::Status s =
          CheckKeys(field, v, {"box", "file", "entry", "xxh64", "rows_per_block", "blocks"});
      !s.ok()) {
    return s;
  }
  CheckpointPiece p;
  absl::StatusOr<const JsonValue*> box = Require(field, v, "box", JsonValue::Kind::kObject);
  if (!box.ok()) return box.status();
  const std::string bf = absl::StrCat(field, ".box");
  if (absl::Status s = CheckKeys(bf, **box, {"offset", "shape"}); !s.ok()) return s;
  absl::StatusOr<const JsonValue*> off = Require(bf, **box, "offset", JsonValue::Kind::kArray);
  if (!off.ok()) return off.status();
  absl::StatusOr<const JsonValue*> shp = Require(bf, **box, "shape", JsonValue::Kind::kArray);
  if (!shp.ok()) return shp.status();
  absl::StatusOr<Shape> offset = ParseDims(absl::StrCat(bf, ".offset"), **off);
  if (!offset.ok()) return offset.status();
  absl::StatusOr<Shape> shape = ParseDims(absl::StrCat(bf, ".shape"), **shp);
  if (!shape.ok()) return shape.status();
  if (offset->size() != shape->size()) {
    return Bad(bf, absl::StrCat("offset has ", offset->size(), " dims but shape ", shape->size()));
  }
  p.box = Box(*std::move(offset), *std::move(shape));
  absl::StatusOr<const JsonValue*> file = Require(field, v, "file", JsonValue::Kind::kString);
  if (!file.ok()) return file.status();
  p.file = (*file)->text();
  absl::StatusOr<const JsonValue*> entry = Require(field, v, "entry", JsonValue::Kind::kString);
  if (!entry.ok()) return entry.status();
  p.entry = (*entry)->text();
  if (const JsonValue* x = v.Find("xxh64"); x != nullptr) {
    absl::StatusOr<uint64_t> h = ParseHex64(absl::StrCat(field, ".xxh64"), *x);
    if (!h.ok()) return h.status();
    p.has_xxh64 = true;
    p.xxh64 = *h;
  }
  if (const JsonValue* r = v.Find("rows_per_block"); r != nullptr) {
    absl::StatusOr<int64_t> rows = r->AsInt64(absl::StrCat(field, ".rows_per_block"));
    if (!rows.ok()) return rows.status();
    if (*rows <= 0) return Bad(absl::StrCat(field, ".rows_per_block"), "must be positive");
    p.rows_per_block = *rows;
  }
  if (const JsonValue* b = v.Find("blocks"); b != nullptr) {
    const std::string f = absl::StrCat(field, ".blocks");
    if (!b->is_array()) return Bad(f, "expected an array");
    for (size_t i = 0; i < b->items().size(); ++i) {
      absl::StatusOr<uint64_t> h = ParseHex64(absl::StrCat(f, "[", i, "]"), b->items()[i]);
      if (!h.ok()) return h.status();
      p.blocks.push_back(*h);
    }
  }
  if ((p.rows_per_block > 0) != (v.Find("blocks") != nullptr)) {
    return Bad(field, "rows_per_block and blocks come together");
  }
  return p;
}

absl::StatusOr<CheckpointTensor> ParseTensor(const std::string& name, const JsonValue& v) {
  const std::string field = absl::StrCat("tensors.", name);
  if (absl::Status s = CheckKeys(field, v, {"dtype", "shape", "pieces"}); !s.ok()) return s;
  CheckpointTensor t;
  t.name = name;
  absl::StatusOr<const JsonValue*> dtype = Require(field, v, "dtype", JsonValue::Kind::kString);
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<DType> d = DTypeFromSafetensors((*dtype)->text());
  if (!d.ok()) return Bad(absl::StrCat(field, ".dtype"), d.status().message());
  t.dtype = *d;
  absl::StatusOr<const JsonValue*> shape = Require(field, v, "shape", JsonValue::Kind::kArray);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<Shape> dims = ParseDims(absl::StrCat(field, ".shape"), **shape);
  if (!dims.ok()) return dims.status();
  t.shape = *std::move(dims);
  absl::StatusOr<const JsonValue*> pieces = Require(field, v, "pieces", JsonValue::Kind::kArray);
  if (!pieces.ok()) return pieces.status();
  for (size_t i = 0; i < (*pieces)->items().size(); ++i) {
    absl::StatusOr<CheckpointPiece> p =
        ParsePiece(absl::StrCat(field, ".pieces[", i, "]"), (*pieces)->items()[i]);
    if (!p.ok()) return p.status();
    t.pieces.push_back(*std::move(p));
  }
  return t;
}

}  // namespace

const CheckpointTensor* CheckpointIndex::Find(absl::string_view name) const {
  auto it =
      std::lower_bound(tensors.begin(), tensors.end(), name,
                       [](const CheckpointTensor& t, absl::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

int64_t CheckpointIndex::TotalBytes() const {
  int64_t total = 0;
  for (const CheckpointTensor& t : tensors) {
    total += Box::Whole(t.shape).Volume() * ElementSize(t.dtype);
  }
  return total;
}

int64_t BoxRows(const Box& box) { return box.ndim() == 0 ? 1 : box.shape(0); }

int64_t BoxRowElements(const Box& box) {
  int64_t n = 1;
  for (int d = 1; d < box.ndim(); ++d) n *= box.shape(d);
  return n;
}

std::string PieceEntryName(absl::string_view tensor, const Box& box) {
  std::vector<std::string> dims;
  for (int d = 0; d < box.ndim(); ++d) dims.push_back(absl::StrCat(box.offset(d), ":", box.end(d)));
  return absl::StrCat(tensor, "[", absl::StrJoin(dims, ","), "]");
}

std::string CheckpointFileName(int64_t rank) {
  return absl::StrFormat("rank-%05d.safetensors", rank);
}

absl::Status CheckCheckpointFileName(absl::string_view field, absl::string_view name) {
  if (name.empty() || name == "." || name == ".." || absl::StrContains(name, '/') ||
      absl::StrContains(name, '\0') || name.size() > 255 || !absl::EndsWith(name, ".safetensors")) {
    return Bad(field,
               absl::StrCat(QuoteJson(name), " is not a plain file name ending in .safetensors"));
  }
  return absl::OkStatus();
}

int64_t RowsPerBlock(int64_t row_bytes) {
  if (row_bytes <= 0) return 1;
  return std::max<int64_t>(1, (kCheckpointBlockBytes + row_bytes - 1) / row_bytes);
}

std::string SerializeCheckpointIndex(const CheckpointIndex& index) {
  std::string out = absl::StrCat("{\"format\": ", QuoteJson(kCheckpointFormat),
                                 ", \"version\": ", kCheckpointFormatVersion, ",\n \"files\": [");
  for (size_t i = 0; i < index.files.size(); ++i) {
    const CheckpointFile& f = index.files[i];
    absl::StrAppend(&out, i == 0 ? "" : ",", "\n  {\"file\": ", QuoteJson(f.file),
                    ", \"rank\": ", f.rank, ", \"writer\": ", QuoteJson(f.writer),
                    ", \"bytes\": ", f.bytes, "}");
  }
  absl::StrAppend(&out, "],\n \"tensors\": {");
  for (size_t i = 0; i < index.tensors.size(); ++i) {
    const CheckpointTensor& t = index.tensors[i];
    absl::StrAppend(&out, i == 0 ? "" : ",", "\n  ", QuoteJson(t.name),
                    ": {\"dtype\": ", QuoteJson(SafetensorsDTypeName(t.dtype)), ", \"shape\": [",
                    absl::StrJoin(t.shape, ", "), "], \"pieces\": [");
    for (size_t j = 0; j < t.pieces.size(); ++j) {
      const CheckpointPiece& p = t.pieces[j];
      absl::StrAppend(&out, j == 0 ? "" : ",", "\n    {\"box\": {\"offset\": [",
                      absl::StrJoin(p.box.offset(), ", "), "], \"shape\": [",
                      absl::StrJoin(p.box.shape(), ", "), "]}, \"file\": ", QuoteJson(p.file),
                      ", \"entry\": ", QuoteJson(p.entry));
      if (p.has_xxh64) absl::StrAppend(&out, ", \"xxh64\": \"", Hex64(p.xxh64), "\"");
      if (p.rows_per_block > 0) {
        absl::StrAppend(&out, ", \"rows_per_block\": ", p.rows_per_block, ", \"blocks\": [");
        for (size_t k = 0; k < p.blocks.size(); ++k) {
          absl::StrAppend(&out, k == 0 ? "" : ", ", "\"", Hex64(p.blocks[k]), "\"");
        }
        absl::StrAppend(&out, "]");
      }
      absl::StrAppend(&out, "}");
    }
    absl::StrAppend(&out, "]}");
  }
  absl::StrAppend(&out, "}}\n");
  return out;
}

absl::StatusOr<CheckpointIndex> ParseCheckpointIndex(absl::string_view json) {
  absl::StatusOr<JsonValue> doc = ParseJson(json);
  if (!doc.ok()) return doc.status();
  if (absl::Status s = CheckKeys("index", *doc, {"format", "version", "files", "tensors"});
      !s.ok()) {
    return s;
  }
  absl::StatusOr<const JsonValue*> format =
      Require("index", *doc, "format", JsonValue::Kind::kString);
  if (!format.ok()) return format.status();
  if ((*format)->text() != kCheckpointFormat) {
    return Bad("index.format", absl::StrCat(QuoteJson((*format)->text()), " is not ",
                                            QuoteJson(kCheckpointFormat)));
  }
  absl::StatusOr<const JsonValue*> version =
      Require("index", *doc, "version", JsonValue::Kind::kNumber);
  if (!version.ok()) return version.status();
  absl::StatusOr<int64_t> v = (*version)->AsInt64("index.version");
  if (!v.ok()) return v.status();
  if (*v != kCheckpointFormatVersion) {
    return Bad("index.version", absl::StrCat(*v, " is not supported (this build reads version ",
                                             kCheckpointFormatVersion, ")"));
  }
  CheckpointIndex index;
  absl::StatusOr<const JsonValue*> files = Require("index", *doc, "files", JsonValue::Kind::kArray);
  if (!files.ok()) return files.status();
  for (size_t i = 0; i < (*files)->items().size(); ++i) {
    const JsonValue& f = (*files)->items()[i];
    const std::string field = absl::StrCat("files[", i, "]");
    if (absl::Status s = CheckKeys(field, f, {"file", "rank", "writer", "bytes"}); !s.ok())
      return s;
    CheckpointFile out;
    absl::StatusOr<const JsonValue*> name = Require(field, f, "file", JsonValue::Kind::kString);
    if (!name.ok()) return name.status();
    out.file = (*name)->text();
    for (const char* key : {"rank", "bytes"}) {
      absl::StatusOr<const JsonValue*> n = Require(field, f, key, JsonValue::Kind::kNumber);
      if (!n.ok()) return n.status();
      absl::StatusOr<int64_t> x = (*n)->AsInt64(absl::StrCat(field, ".", key));
      if (!x.ok()) return x.status();
      (absl::string_view(key) == "rank" ? out.rank : out.bytes) = *x;
    }
    absl::StatusOr<const JsonValue*> writer = Require(field, f, "writer", JsonValue::Kind::kString);
    if (!writer.ok()) return writer.status();
    out.writer = (*writer)->text();
    index.files.push_back(std::move(out));
  }
  absl::StatusOr<const JsonValue*> tensors =
      Require("index", *doc, "tensors", JsonValue::Kind::kObject);
  if (!tensors.ok()) return tensors.status();
  for (const JsonValue::Member& m : (*tensors)->members()) {
    absl::StatusOr<CheckpointTensor> t = ParseTensor(m.first, m.second);
    if (!t.ok()) return t.status();
    index.tensors.push_back(*std::move(t));
  }
  std::sort(index.tensors.begin(), index.tensors.end(),
            [](const CheckpointTensor& a, const CheckpointTensor& b) { return a.name < b.name; });
  if (absl::Status s = ValidateCheckpointIndex(index); !s.ok()) return s;
  return index;
}

absl::Status ValidateCheckpointIndex(const CheckpointIndex& index) {
  std::map<std::string, std::set<std::string>> entries;  // file -> entry names
  for (size_t i = 0; i < index.files.size(); ++i) {
    const CheckpointFile& f = index.files[i];
    const std::string field = absl::StrCat("files[", i, "]");
    if (absl::Status s = CheckCheckpointFileName(absl::StrCat(field, ".file"), f.file); !s.ok()) {
      return s;
    }
    if (f.bytes < 0) return Bad(absl::StrCat(field, ".bytes"), "negative");
    if (!entries.emplace(f.file, std::set<std::string>{}).second) {
      return Bad(absl::StrCat(field, ".file"), absl::StrCat(QuoteJson(f.file), " listed twice"));
    }
  }
  for (size_t i = 0; i < index.tensors.size(); ++i) {
    const CheckpointTensor& t = index.tensors[i];
    const std::string field = absl::StrCat("tensors.", t.name);
    if (t.name.empty()) return Bad("tensors", "empty tensor name");
    if (i > 0 && index.tensors[i - 1].name == t.name) return Bad(field, "listed twice");
    if (absl::Status s = ValidateShape(t.shape); !s.ok()) {
      return Bad(absl::StrCat(field, ".shape"), s.message());
    }
    if (!CheckedBytes(t.shape, ElementSize(t.dtype)).ok()) {
      return Bad(absl::StrCat(field, ".shape"), "too many bytes for int64");
    }
    RankChunks all;
    all.rank = 0;
    for (size_t j = 0; j < t.pieces.size(); ++j) {
      const CheckpointPiece& p = t.pieces[j];
      const std::string pf = absl::StrCat(field, ".pieces[", j, "]");
      if (p.box.ndim() != static_cast<int>(t.shape.size())) {
        return Bad(absl::StrCat(pf, ".box"),
                   absl::StrCat("has ", p.box.ndim(), " dims, the tensor ", t.shape.size()));
      }
      for (int d = 0; d < p.box.ndim(); ++d) {
        if (p.box.offset(d) > t.shape[d] || p.box.shape(d) > t.shape[d] - p.box.offset(d)) {
          return Bad(absl::StrCat(pf, ".box"),
                     absl::StrCat(p.box.ToString(), " is outside shape ", ShapeToString(t.shape)));
        }
      }
      auto file = entries.find(p.file);
      if (file == entries.end()) {
        return Bad(absl::StrCat(pf, ".file"), absl::StrCat(QuoteJson(p.file), " is not in files"));
      }
      if (!file->second.insert(p.entry).second) {
        return Bad(absl::StrCat(pf, ".entry"),
                   absl::StrCat(QuoteJson(p.entry), " appears twice in ", QuoteJson(p.file)));
      }
      if (p.rows_per_block > 0) {
        const int64_t rows = BoxRows(p.box);
        const int64_t want = p.box.Empty() ? 0 : (rows + p.rows_per_block - 1) / p.rows_per_block;
        if (static_cast<int64_t>(p.blocks.size()) != want) {
          return Bad(absl::StrCat(pf, ".blocks"),
                     absl::StrCat(p.blocks.size(), " checksums but ", rows, " rows in blocks of ",
                                  p.rows_per_block, " make ", want));
        }
      } else if (!p.blocks.empty()) {
        return Bad(absl::StrCat(pf, ".blocks"), "without rows_per_block");
      }
      Chunk c;
      c.box = p.box;
      c.local_offset = all.local_elements;
      absl::StatusOr<int64_t> next = CheckedAdd(all.local_elements, p.box.Volume());
      if (!next.ok() || *next > Box::Whole(t.shape).Volume()) {
        return Bad(absl::StrCat(field, ".pieces"),
                   absl::StrCat("cover more elements than the tensor's ",
                                Box::Whole(t.shape).Volume(), " (pieces overlap)"));
      }
      all.local_elements = *next;
      all.chunks.push_back(std::move(c));
    }
    std::vector<RankChunks> ranks;
    ranks.push_back(std::move(all));
    if (absl::Status s = ValidateLayout(t.shape, ranks); !s.ok()) {
      return Bad(
          absl::StrCat(field, ".pieces"),
          absl::StrCat("do not tile the tensor (\"rank 0\" is the checkpoint): ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointIndex> IndexFromSafetensors(
    const std::vector<std::pair<std::string, SafetensorsHeader>>& files) {
  CheckpointIndex index;
  std::map<std::string, std::string> seen;  // tensor -> file
  for (const auto& [file, header] : files) {
    CheckpointFile f;
    f.file = file;
    f.bytes = header.file_bytes();
    index.files.push_back(f);
    for (const SafetensorsEntry& e : header.entries) {
      const std::string where = absl::StrCat(file, ": entry ", QuoteJson(e.name));
      if (!e.dtype.has_value()) continue;  // A dtype shardcoord cannot hold (none today).
      auto [it, inserted] = seen.emplace(e.name, file);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": the tensor is also in ", it->second));
      }
      CheckpointTensor t;
      t.name = e.name;
      t.shape = e.shape;
      t.dtype = *e.dtype;
      CheckpointPiece p;
      p.box = Box::Whole(e.shape);
      p.file = file;
      p.entry = e.name;
      t.pieces.push_back(std::move(p));
      index.tensors.push_back(std::move(t));
    }
  }
  std::sort(index.tensors.begin(), index.tensors.end(),
            [](const CheckpointTensor& a, const CheckpointTensor& b) { return a.name < b.name; });
  if (absl::Status s = ValidateCheckpointIndex(index); !s.ok()) return s;
  return index;
}

absl::Status CheckPiecesAgainstHeader(const CheckpointIndex& index, absl::string_view file,
                                      const SafetensorsHeader& header) {
  for (const CheckpointTensor& t : index.tensors) {
    for (const CheckpointPiece& p : t.pieces) {
      if (p.file != file) continue;
      const std::string where = absl::StrCat(file, ": entry ", QuoteJson(p.entry));
      const SafetensorsEntry* e = header.Find(p.entry);
      if (e == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " (tensor '", t.name, "') is not in the file"));
      }
      if (e->dtype != t.dtype) {
        return absl::InvalidArgumentError(absl::StrCat(where, " has dtype ", e->dtype_name,
                                                       " but the index says ",
                                                       SafetensorsDTypeName(t.dtype)));
      }
      if (e->shape != p.box.shape()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " has shape ", ShapeToString(e->shape), " but the index's box is ",
                         p.box.ToString()));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardcoord
