#include "sharding/safetensors.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/json.h"

namespace shardcoord {
namespace {

constexpr char kMetadataKey[] = "__metadata__";

struct DTypeInfo {
  const char* name;
  int64_t size;
  std::optional<DType> dtype;
};

// Every dtype of the format whose elements are whole bytes, each shardcoord's.
const DTypeInfo kDTypes[] = {
    {"BOOL", 1, DType::kBool},      {"U8", 1, DType::kU8},          {"I8", 1, DType::kI8},
    {"F8_E5M2", 1, DType::kF8E5M2}, {"F8_E4M3", 1, DType::kF8E4M3}, {"F8_E8M0", 1, DType::kF8E8M0},
    {"I16", 2, DType::kI16},        {"U16", 2, DType::kU16},        {"F16", 2, DType::kF16},
    {"BF16", 2, DType::kBF16},      {"I32", 4, DType::kI32},        {"U32", 4, DType::kU32},
    {"F32", 4, DType::kF32},        {"F64", 8, DType::kF64},        {"I64", 8, DType::kI64},
    {"U64", 8, DType::kU64},
};

const DTypeInfo* FindDType(absl::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

std::string Quoted(absl::string_view name) { return QuoteJson(name); }

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const JsonValue& v) {
  const std::string where = absl::StrCat("entry ", Quoted(name));
  if (!v.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected an object, got ", JsonKindName(v.kind())));
  }
  for (const JsonValue::Member& m : v.members()) {
    if (m.first != "dtype" && m.first != "shape" && m.first != "data_offsets") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown field ", Quoted(m.first)));
    }
  }
  SafetensorsEntry e;
  e.name = name;
  const JsonValue* dtype = v.Find("dtype");
  if (dtype == nullptr || !dtype->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".dtype: missing or not a string"));
  }
  const DTypeInfo* info = FindDType(dtype->text());
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".dtype: unknown dtype ", Quoted(dtype->text())));
  }
  e.dtype_name = info->name;
  e.dtype = info->dtype;
  e.element_size = info->size;
  const JsonValue* shape = v.Find("shape");
  if (shape == nullptr || !shape->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".shape: missing or not an array"));
  }
  if (shape->items().size() > static_cast<size_t>(kMaxSafetensorsDims)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".shape: ", shape->items().size(),
                                                   " dims, more than ", kMaxSafetensorsDims));
  }
  for (size_t i = 0; i < shape->items().size(); ++i) {
    absl::StatusOr<int64_t> d = shape->items()[i].AsInt64(absl::StrCat(where, ".shape[", i, "]"));
    if (!d.ok()) return d.status();
    if (*d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".shape[", i, "]: negative ", *d));
    }
    e.shape.push_back(*d);
  }
  absl::StatusOr<int64_t> bytes = CheckedBytes(e.shape, e.element_size);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".shape: ", ShapeToString(e.shape), " has too many bytes for int64"));
  }
  const JsonValue* offsets = v.Find("data_offsets");
  if (offsets == nullptr || !offsets->is_array() || offsets->items().size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".data_offsets: missing or not an array of two integers"));
  }
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<int64_t> o =
        offsets->items()[i].AsInt64(absl::StrCat(where, ".data_offsets[", i, "]"));
    if (!o.ok()) return o.status();
    if (*o < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".data_offsets[", i, "]: negative ", *o));
    }
    (i == 0 ? e.begin : e.end) = *o;
  }
  if (e.end < e.begin || e.end - e.begin != *bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".data_offsets: [", e.begin, ", ", e.end, ") holds ", e.end - e.begin, " bytes but ",
        ShapeToString(e.shape), " of ", e.dtype_name, " needs ", *bytes));
  }
  return e;
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::Find(absl::string_view name) const {
  for (const SafetensorsEntry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string SafetensorsDTypeName(DType dtype) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view name) {
  const DTypeInfo* d = FindDType(name);
  if (d == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown safetensors dtype ", Quoted(name)));
  }
  if (!d->dtype.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors dtype ", d->name, " has no shardcoord dtype"));
  }
  return *d->dtype;
}

absl::StatusOr<int64_t> ParseSafetensorsPrefix(absl::string_view first8) {
  if (first8.size() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: ", first8.size(), " bytes, shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(first8[i]);
  if (n == 0 || n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: header length ", n, " is not in [1, ", kMaxSafetensorsHeaderBytes, "]"));
  }
  return static_cast<int64_t>(n);
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json,
                                                         int64_t file_bytes) {
  absl::StatusOr<JsonValue> doc = ParseJson(json);
  if (!doc.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors header: ", doc.status().message()));
  }
  if (!doc->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors header: expected an object, got ", JsonKindName(doc->kind())));
  }
  SafetensorsHeader out;
  out.json_bytes = static_cast<int64_t>(json.size());
  for (const JsonValue::Member& m : doc->members()) {
    if (m.first == kMetadataKey) {
      if (!m.second.is_object()) {
        return absl::InvalidArgumentError("safetensors header: __metadata__ is not an object");
      }
      for (const JsonValue::Member& kv : m.second.members()) {
        if (!kv.second.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("safetensors header: __metadata__.", kv.first, " is not a string"));
        }
        out.metadata.emplace_back(kv.first, kv.second.text());
      }
      continue;
    }
    absl::StatusOr<SafetensorsEntry> e = ParseEntry(m.first, m.second);
    if (!e.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors header: ", e.status().message()));
    }
    out.entries.push_back(*std::move(e));
  }
  std::sort(out.entries.begin(), out.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  int64_t at = 0;
  for (const SafetensorsEntry& e : out.entries) {
    if (e.begin != at) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors header: entry ", Quoted(e.name), " starts at data offset ", e.begin,
          " but the entries before end at ", at, " (entries must tile the data)"));
    }
    at = e.end;
  }
  out.data_bytes = at;
  if (file_bytes >= 0) {
    absl::StatusOr<int64_t> want = CheckedAdd(out.data_start(), out.data_bytes);
    if (!want.ok() || *want != file_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: the file has ", file_bytes, " bytes but its header describes ",
                       want.ok() ? absl::StrCat(*want) : std::string("more than int64"), " (",
                       file_bytes < (want.ok() ? *want : 0) ? "truncated" : "trailing data", ")"));
    }
  }
  return out;
}

absl::StatusOr<std::string> BuildSafetensorsHeader(
    const std::vector<SafetensorsEntrySpec>& entries,
    const std::vector<std::pair<std::string, std::string>>& metadata, SafetensorsHeader* header) {
  SafetensorsHeader h;
  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    json += absl::StrCat(Quoted(kMetadataKey), ":{");
    for (size_t i = 0; i < metadata.size(); ++i) {
      if (i > 0) json += ",";
      json += absl::StrCat(Quoted(metadata[i].first), ":", Quoted(metadata[i].second));
    }
    json += "}";
    first = false;
    h.metadata = metadata;
  }
  absl::flat_hash_set<std::string> names;
  int64_t at = 0;
  for (const SafetensorsEntrySpec& s : entries) {
    if (s.name == kMetadataKey || !names.insert(s.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: entry name ", Quoted(s.name), " is reserved or repeated"));
    }
    absl::StatusOr<int64_t> bytes = CheckedBytes(s.shape, ElementSize(s.dtype));
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<int64_t> end = CheckedAdd(at, *bytes);
    if (!end.ok()) return end.status();
    SafetensorsEntry e;
    e.name = s.name;
    e.dtype = s.dtype;
    e.dtype_name = SafetensorsDTypeName(s.dtype);
    e.element_size = ElementSize(s.dtype);
    e.shape = s.shape;
    e.begin = at;
    e.end = *end;
    if (!first) json += ",";
    first = false;
    json += absl::StrCat(Quoted(s.name), ":{\"dtype\":\"", e.dtype_name, "\",\"shape\":[",
                         absl::StrJoin(s.shape, ","), "],\"data_offsets\":[", e.begin, ",", e.end,
                         "]}");
    at = e.end;
    h.entries.push_back(std::move(e));
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  h.json_bytes = static_cast<int64_t>(json.size());
  h.data_bytes = at;
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += json;
  if (header != nullptr) *header = std::move(h);
  return out;
}

}  // namespace shardcoord
