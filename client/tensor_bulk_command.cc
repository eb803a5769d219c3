// `shardctl tensor create --from-file`, `tensor delete A B ... --prefix P`: a model's tensors
// in one call each, all or nothing (issue 27).

#include <algorithm>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/command_util.h"
#include "client/tensor_command.h"
#include "common/json_writer.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace shardcoord {
namespace {

using google::protobuf::Value;

absl::Status MemberError(int i, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("tensors[", i, "].", message));
}

absl::StatusOr<std::string> StringField(int i, const std::string& key, const Value& v) {
  if (v.kind_case() != Value::kStringValue)
    return MemberError(i, absl::StrCat(key, ": not a string"));
  return v.string_value();
}

// One entry of the file as create's flags, so both check the same way.
absl::StatusOr<TensorCreateFlags> EntryFlags(int i, const Value& entry) {
  if (entry.kind_case() != Value::kStructValue) {
    return absl::InvalidArgumentError(absl::StrCat("tensors[", i, "]: not an object"));
  }
  TensorCreateFlags f;
  static const char* const kKeys[] = {"name",       "shape", "dtype", "mesh",
                                      "placements", "flat",  "init",  "seed"};
  for (const auto& [key, v] : entry.struct_value().fields()) {
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      return MemberError(i, absl::StrCat(key,
                                         ": unknown key (name, shape, dtype, mesh, "
                                         "placements, flat, init, seed)"));
    }
    if (key == "shape") {
      if (v.kind_case() != Value::kListValue) return MemberError(i, "shape: not a list");
      std::vector<std::string> dims;
      for (const Value& d : v.list_value().values()) {
        if (d.kind_case() != Value::kNumberValue || d.number_value() < 0 ||
            d.number_value() != static_cast<double>(static_cast<int64_t>(d.number_value()))) {
          return MemberError(i, "shape: every dim must be a whole number >= 0");
        }
        dims.push_back(absl::StrCat(static_cast<int64_t>(d.number_value())));
      }
      f.shape = absl::StrJoin(dims, ",");
    } else if (key == "seed") {
      if (v.kind_case() != Value::kNumberValue || v.number_value() < 0) {
        return MemberError(i, "seed: not a whole number >= 0");
      }
      f.seed = static_cast<uint64_t>(v.number_value());
    } else {
      absl::StatusOr<std::string> s = StringField(i, key, v);
      if (!s.ok()) return s.status();
      if (key == "name") {
        f.name = *s;
      } else if (key == "dtype") {
        f.dtype = *s;
      } else if (key == "mesh") {
        f.mesh = *s;
      } else if (key == "placements") {
        f.placements = *s;
      } else if (key == "flat") {
        f.flat = *s;
      } else {
        f.init = *s;
      }
    }
  }
  if (f.name.empty()) return MemberError(i, "name: missing");
  if (f.shape.empty() && entry.struct_value().fields().count("shape") == 0) {
    return MemberError(i, "shape: missing");
  }
  return f;
}

}  // namespace

absl::StatusOr<v1::CreateTensorsRequest> ParseTensorsJson(const std::string& json) {
  google::protobuf::Struct root;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &root);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a tensors file {\"tensors\": [{\"name\": ..., \"shape\": [...], ...}]}: ",
                     std::string(parsed.message().data(), parsed.message().size())));
  }
  auto it = root.fields().find("tensors");
  if (it == root.fields().end() || it->second.kind_case() != Value::kListValue) {
    return absl::InvalidArgumentError("\"tensors\": missing or not a list");
  }
  if (it->second.list_value().values_size() == 0) {
    return absl::InvalidArgumentError("\"tensors\": empty");
  }
  v1::CreateTensorsRequest request;
  int i = 0;
  for (const Value& entry : it->second.list_value().values()) {
    absl::StatusOr<TensorCreateFlags> flags = EntryFlags(i, entry);
    if (!flags.ok()) return flags.status();
    absl::StatusOr<v1::CreateTensorRequest> one = BuildCreateTensorRequest(*flags);
    if (!one.ok()) {
      // "--shape: ..." from the flags' checks names the key of this entry instead.
      absl::string_view m = one.status().message();
      if (absl::StartsWith(m, "--")) m.remove_prefix(2);
      return absl::InvalidArgumentError(absl::StrCat("tensors[", i, "] '", flags->name, "': ", m));
    }
    *request.add_tensors() = *std::move(one);
    ++i;
  }
  return request;
}

int RunTensorCreateManyCommand(CoordinatorClient& client, const std::string& from_file, bool json,
                               std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::CreateTensorsRequest> request = ParseFlagFile(from_file, ParseTensorsJson);
  if (!request.ok()) return ReportFlagError(err, "tensor create", request.status().message());
  absl::StatusOr<v1::CreateTensorsResponse> made = client.CreateTensors(*request);
  if (!made.ok()) return ReportStatus(err, made.status(), client.address());
  JsonWriter w;
  w.BeginObject().Key("created").Int(made->created()).Key("bytes").Int(made->bytes()).EndObject();
  out << (json ? w.str() + "\n"
               : absl::StrCat("created ", made->created(), " tensors (", made->bytes(),
                              " bytes)\n"));
  return 0;
}

int RunTensorDeleteManyCommand(CoordinatorClient& client, const std::vector<std::string>& names,
                               const std::string& prefix, bool json, std::ostream& out,
                               std::ostream& err) {
  if (names.empty() && prefix.empty()) {
    return ReportFlagError(err, "tensor delete", "give NAME... or --prefix P");
  }
  absl::StatusOr<int64_t> deleted = client.DeleteTensors(names, prefix);
  if (!deleted.ok()) return ReportStatus(err, deleted.status(), client.address());
  JsonWriter w;
  w.BeginObject().Key("deleted").Int(*deleted).EndObject();
  out << (json ? w.str() + "\n" : absl::StrCat("deleted ", *deleted, " tensors\n"));
  return 0;
}

}  // namespace shardcoord
