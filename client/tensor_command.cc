#include "client/tensor_command.h"

#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <tuple>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/command_util.h"
#include "client/coordinator_format.h"
#include "client/layout_format.h"
#include "client/npy.h"
#include "common/json_writer.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "proto/convert.h"
#include "sharding/placement.h"

namespace shardcoord {
namespace {

absl::Status FlagError(absl::string_view flag, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", message));
}

// Parses `json` into `request`, refusing unknown fields; the error says "not a <form>: " and
// the parser's message.
absl::Status ParseJsonRequest(absl::string_view json, absl::string_view form,
                              google::protobuf::Message* request) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), request, options);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "not a ", form, ": ", std::string(parsed.message().data(), parsed.message().size())));
}

// Whether a streaming download or upload failed on this side (the .npy file), not the
// coordinator's: a local error is reported without the coordinator's address.
struct LocalFailure {
  bool failed = false;

  // `s`, noting whether it failed.
  absl::Status Track(absl::Status s) {
    failed = !s.ok();
    return s;
  }

  int Report(std::ostream& err, const absl::Status& s, absl::string_view address) const {
    return failed ? ReportStatus(err, s) : ReportStatus(err, s, address);
  }
};

bool Terminal(v1::PlanState state) { return state == v1::COMMITTED || state == v1::ABORTED; }

// Runs a plan to its end. With `progress`, starts it without waiting and follows WatchPlan,
// drawing a bar; otherwise one call that returns when the plan has ended.
absl::StatusOr<v1::RedistributeResponse> RunPlan(
    CoordinatorClient& client,
    const std::function<absl::StatusOr<v1::RedistributeResponse>(bool wait)>& start, bool progress,
    const std::string& label, std::ostream& err) {
  absl::StatusOr<v1::RedistributeResponse> response = start(/*wait=*/!progress);
  if (!response.ok() || !progress || Terminal(response->progress().state())) return response;
  ProgressBar bar(err, true, label);
  bar.Update(response->progress().bytes_done(), response->progress().bytes_total());
  absl::StatusOr<v1::PlanProgress> last = client.WatchPlan(
      response->progress().plan_id(),
      [&](const v1::PlanProgress& p) { bar.Update(p.bytes_done(), p.bytes_total()); });
  bar.Finish();
  if (!last.ok()) return last.status();
  *response->mutable_progress() = *last;
  return response;
}

// A plan that ended ABORTED (reported as an answer rather than a status) is an error too:
// its exit code, or nullopt when the plan did not fail.
std::optional<int> ReportFailure(CoordinatorClient& client,
                                 const absl::StatusOr<v1::RedistributeResponse>& response,
                                 std::ostream& err) {
  if (!response.ok()) return ReportStatus(err, response.status(), client.address());
  if (response->progress().state() == v1::ABORTED) {
    const std::string why = response->progress().error().empty()
                                ? absl::StrCat("plan ", response->progress().plan_id(), " aborted")
                                : response->progress().error();
    return ReportStatus(err, absl::AbortedError(why), client.address());
  }
  return std::nullopt;
}

int ReportOutcome(CoordinatorClient& client, absl::string_view verb,
                  const absl::StatusOr<v1::RedistributeResponse>& response, bool json,
                  std::ostream& out, std::ostream& err) {
  if (std::optional<int> rc = ReportFailure(client, response, err)) return *rc;
  out << (json ? PlanOutcomeJson(*response) + "\n" : PlanOutcomeText(verb, *response));
  return 0;
}

absl::StatusOr<v1::InitKind> ParseInit(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "zeros" || t == "zero") return v1::ZEROS;
  if (t == "arange") return v1::ARANGE;
  if (t == "random" || t == "rand") return v1::RANDOM;
  if (t == "attached") return v1::ATTACHED;
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not an init kind (zeros, arange, random, attached)"));
}

void AddSpecFlags(CLI::App* cmd, CLI::Option** placements, CLI::Option** flat) {
  *placements = cmd->add_option(
      "--placements",
      "DTensor placements, one per mesh dim: S(d), S(d,[3,5]), R, P(sum|avg|min|max). "
      "Example: S(0),R");
  (*placements)->type_name("SPEC");
  *flat = cmd->add_option("--flat",
                          "Flat ranges per mesh position (OLMo-core ShardingSpec): "
                          "'0:4,20:30;4:20;;'");
  (*flat)->type_name("SPEC");
}

std::optional<std::string> Value(const CLI::Option* option) {
  if (option->count() == 0) return std::nullopt;
  return option->as<std::string>();
}

int ReportJsonOrText(std::ostream& out, bool json, const std::string& json_text,
                     const std::string& text) {
  out << (json ? json_text + "\n" : text);
  return 0;
}

}  // namespace

absl::StatusOr<v1::ShardingSpec> BuildSpec(const std::string& mesh,
                                           const std::optional<std::string>& placements,
                                           const std::optional<std::string>& flat) {
  if (placements.has_value() == flat.has_value()) {
    return placements.has_value()
               ? FlagError("--flat", "give exactly one of --placements or --flat, not both")
               : FlagError("--placements", "give exactly one of --placements or --flat");
  }
  // Checked here for syntax; sent as text, which the coordinator parses the same way.
  v1::ShardingSpec spec;
  spec.set_mesh(mesh);
  if (placements.has_value()) {
    absl::StatusOr<std::vector<Placement>> parsed = ParsePlacements(*placements);
    if (!parsed.ok()) return FlagError("--placements", parsed.status().message());
    spec.set_placements_text(PlacementsToString(*parsed));
  } else {
    absl::StatusOr<FlatSpec> parsed = ParseFlatSpec(*flat);
    if (!parsed.ok()) return FlagError("--flat", parsed.status().message());
    spec.set_flat_text(FlatSpecToString(*parsed));
  }
  return spec;
}

absl::StatusOr<v1::CreateTensorRequest> BuildCreateTensorRequest(const TensorCreateFlags& flags) {
  v1::CreateTensorRequest request;
  request.set_name(flags.name);
  absl::StatusOr<std::vector<int64_t>> shape = ParseIntList(flags.shape);
  if (!shape.ok()) return FlagError("--shape", shape.status().message());
  if (absl::Status s = ValidateShape(*shape); !s.ok()) return FlagError("--shape", s.message());
  for (int64_t d : *shape) request.add_shape(d);
  absl::StatusOr<DType> dtype = ParseDType(absl::StripAsciiWhitespace(flags.dtype));
  if (!dtype.ok()) return FlagError("--dtype", dtype.status().message());
  request.set_dtype(DTypeToProto(*dtype));
  if (flags.mesh.empty()) return FlagError("--mesh", "the tensor needs a mesh");
  absl::StatusOr<v1::ShardingSpec> spec = BuildSpec(flags.mesh, flags.placements, flags.flat);
  if (!spec.ok()) return spec.status();
  *request.mutable_spec() = *std::move(spec);
  absl::StatusOr<v1::InitKind> init = ParseInit(flags.init);
  if (!init.ok()) return FlagError("--init", init.status().message());
  request.set_init(*init);
  request.set_seed(flags.seed);
  return request;
}

int RunTensorCreateCommand(CoordinatorClient& client, const TensorCreateFlags& flags, bool json,
                           std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::CreateTensorRequest> request = BuildCreateTensorRequest(flags);
  if (!request.ok()) return ReportFlagError(err, "tensor create", request.status().message());
  absl::StatusOr<v1::TensorInfo> tensor = client.CreateTensor(*request);
  if (!tensor.ok()) return ReportStatus(err, tensor.status(), client.address());
  return ReportJsonOrText(out, json, TensorJson(*tensor),
                          absl::StrCat("created tensor ", TensorLine(*tensor), "\n"));
}

absl::StatusOr<v1::RedistributeRequest> BuildRedistributeRequest(const RedistributeFlags& flags) {
  v1::RedistributeRequest request;
  request.set_tensor(flags.name);
  absl::StatusOr<v1::ShardingSpec> spec = BuildSpec(flags.mesh, flags.placements, flags.flat);
  if (!spec.ok()) return spec.status();
  *request.mutable_target() = *std::move(spec);
  return request;
}

int RunRedistributeCommand(CoordinatorClient& client, const RedistributeFlags& flags, bool json,
                           bool progress, std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::RedistributeRequest> request = BuildRedistributeRequest(flags);
  if (!request.ok()) {
    return ReportFlagError(err, "tensor redistribute", request.status().message());
  }
  absl::StatusOr<v1::RedistributeResponse> response = RunPlan(
      client,
      [&](bool wait) {
        request->set_wait(wait);
        return client.Redistribute(*request);
      },
      progress, absl::StrCat("redistribute ", flags.name), err);
  return ReportOutcome(client, "redistributed", response, json, out, err);
}

v1::GatherRequest BuildGatherRequest(const GatherFlags& flags) {
  v1::GatherRequest request;
  request.set_tensor(flags.name);
  request.set_mesh(flags.mesh);
  if (flags.to_rank.has_value()) {
    request.set_has_to_rank(true);
    request.set_to_rank(*flags.to_rank);
  }
  return request;
}

int RunGatherCommand(CoordinatorClient& client, const GatherFlags& flags, bool json, bool progress,
                     std::ostream& out, std::ostream& err) {
  if (flags.to_rank.has_value() && *flags.to_rank < 0) {
    return ReportFlagError(err, "tensor gather",
                           absl::StrCat("--to-rank: ", *flags.to_rank, " is negative"));
  }
  if (!flags.more.empty()) {
    v1::GatherGroupRequest group;
    group.add_tensors(flags.name);
    for (const std::string& name : flags.more) group.add_tensors(name);
    group.set_mesh(flags.mesh);
    if (flags.to_rank.has_value()) {
      group.set_has_to_rank(true);
      group.set_to_rank(*flags.to_rank);
    }
    group.set_wait(true);
    absl::StatusOr<v1::RedistributeGroupResponse> response = client.GatherGroup(group);
    if (!response.ok()) return ReportStatus(err, response.status(), client.address());
    out << (json ? RedistributeGroupOutcomeJson(*response) + "\n"
                 : RedistributeGroupOutcomeText(*response, "gathered"));
    return 0;
  }
  v1::GatherRequest request = BuildGatherRequest(flags);
  absl::StatusOr<v1::RedistributeResponse> response = RunPlan(
      client,
      [&](bool wait) {
        request.set_wait(wait);
        return client.Gather(request);
      },
      progress, absl::StrCat("gather ", flags.name), err);
  return ReportOutcome(client, "gathered", response, json, out, err);
}

absl::StatusOr<v1::CopyGroupRequest> ParseCopiesJson(absl::string_view json) {
  v1::CopyGroupRequest request;
  if (absl::Status s = ParseJsonRequest(
          json, "copies file {\"copies\": [{\"src\": ..., \"dst\": ...}, ...]}", &request);
      !s.ok()) {
    return s;
  }
  if (request.copies_size() == 0) return absl::InvalidArgumentError("\"copies\": empty");
  request.set_wait(true);
  return request;
}

absl::Status ParseOffsetsFlag(absl::string_view flag, absl::string_view text,
                              google::protobuf::RepeatedField<int64_t>* out) {
  out->Clear();
  if (text.empty()) return absl::OkStatus();
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(item, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": '", text, "' is not a comma-separated list of integers (\"0,4096\")"));
    }
    out->Add(v);
  }
  return absl::OkStatus();
}

namespace {

int RunCopyGroupCommand(CoordinatorClient& client, const CopyFlags& flags, bool json,
                        std::ostream& out, std::ostream& err) {
  if (!flags.src.empty() || !flags.dst.empty()) {
    return ReportFlagError(err, "tensor copy",
                           "--from-file: give SRC DST or --from-file, not both");
  }
  absl::StatusOr<v1::CopyGroupRequest> request = ParseFlagFile(flags.from_file, ParseCopiesJson);
  if (!request.ok()) return ReportFlagError(err, "tensor copy", request.status().message());
  absl::StatusOr<v1::CopyGroupResponse> response = client.CopyGroup(*request);
  if (!response.ok()) return ReportStatus(err, response.status(), client.address());
  out << (json ? CopyGroupOutcomeJson(*response) + "\n" : CopyGroupOutcomeText(*response));
  return 0;
}

}  // namespace

namespace {

// {"moves": [{"tensor": "a", "mesh": "m4", "placements": "S(0)"}, {"tensor": "b", "flat":
// "0:4;4:8;;"}]}, read through google.protobuf.Struct so that errors name the item and key.
absl::StatusOr<v1::RedistributeGroupRequest> ParseMovesJson(const google::protobuf::Struct& doc) {
  v1::RedistributeGroupRequest request;
  const google::protobuf::Value& moves = doc.fields().at("moves");
  if (!moves.has_list_value()) return absl::InvalidArgumentError("\"moves\": not a list");
  if (doc.fields().size() != 1) {
    return absl::InvalidArgumentError("only \"moves\" may be given at the top level");
  }
  const auto& items = moves.list_value().values();
  if (items.empty()) return absl::InvalidArgumentError("\"moves\": empty");
  for (int i = 0; i < items.size(); ++i) {
    const std::string where = absl::StrCat("moves[", i, "]");
    if (!items[i].has_struct_value()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
    }
    v1::RedistributeItem* item = request.add_redistributes();
    for (const auto& [key, value] : items[i].struct_value().fields()) {
      if (value.kind_case() != google::protobuf::Value::kStringValue) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": not a string"));
      }
      const std::string& text = value.string_value();
      if (key == "tensor") {
        item->set_tensor(text);
      } else if (key == "mesh") {
        item->mutable_target()->set_mesh(text);
      } else if (key == "placements") {
        item->mutable_target()->set_placements_text(text);
      } else if (key == "flat") {
        item->mutable_target()->set_flat_text(text);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown key \"", key, "\" (tensor, mesh, placements or flat)"));
      }
    }
    if (item->tensor().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".tensor: missing"));
    }
    if (item->target().placements_text().empty() == item->target().flat_text().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": give exactly one of \"placements\" and \"flat\""));
    }
  }
  request.set_wait(true);
  return request;
}

}  // namespace

absl::StatusOr<v1::RedistributeGroupRequest> ParseRedistributesJson(absl::string_view json) {
  google::protobuf::Struct doc;
  if (google::protobuf::util::JsonStringToMessage(
          google::protobuf::StringPiece(json.data(), json.size()), &doc)
          .ok() &&
      doc.fields().count("moves") > 0) {
    return ParseMovesJson(doc);
  }
  v1::RedistributeGroupRequest request;
  if (absl::Status s = ParseJsonRequest(json,
                                        "redistributes file {\"redistributes\": [{\"tensor\": ..., "
                                        "\"target\": {\"mesh\": ..., \"placements_text\": ...}}, "
                                        "...]}",
                                        &request);
      !s.ok()) {
    return s;
  }
  if (request.redistributes_size() == 0) {
    return absl::InvalidArgumentError("\"redistributes\": empty");
  }
  request.set_wait(true);
  return request;
}

int RunRedistributeManyCommand(CoordinatorClient& client, const std::string& from_file, bool json,
                               std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::RedistributeGroupRequest> request =
      ParseFlagFile(from_file, ParseRedistributesJson);
  if (!request.ok()) {
    return ReportFlagError(err, "tensor redistribute-many", request.status().message());
  }
  absl::StatusOr<v1::RedistributeGroupResponse> response = client.RedistributeGroup(*request);
  if (!response.ok()) return ReportStatus(err, response.status(), client.address());
  out << (json ? RedistributeGroupOutcomeJson(*response) + "\n"
               : RedistributeGroupOutcomeText(*response));
  return 0;
}

int RunCopyCommand(CoordinatorClient& client, const CopyFlags& flags, bool json, bool progress,
                   std::ostream& out, std::ostream& err) {
  if (!flags.from_file.empty()) return RunCopyGroupCommand(client, flags, json, out, err);
  if (flags.src.empty() || flags.dst.empty()) {
    return ReportFlagError(err, "tensor copy", "SRC and DST are required (or --from-file)");
  }
  v1::CopyRequest request;
  request.set_src(flags.src);
  request.set_dst(flags.dst);
  for (const auto& [flag, text, field] :
       {std::make_tuple("--dst-offset", &flags.dst_offset, request.mutable_dst_offset()),
        std::make_tuple("--src-offset", &flags.src_offset, request.mutable_src_offset()),
        std::make_tuple("--src-shape", &flags.src_shape, request.mutable_src_shape())}) {
    if (absl::Status s = ParseOffsetsFlag(flag, *text, field); !s.ok()) {
      return ReportFlagError(err, "tensor copy", s.message());
    }
  }
  if (!flags.quantize.empty() || flags.dequantize || !flags.scale.empty()) {
    // A block copy: several steps, answered when all ended (no plan to follow).
    request.set_quantize(flags.quantize);
    request.set_dequantize(flags.dequantize);
    request.set_scale(flags.scale);
    request.set_wait(true);
    absl::StatusOr<v1::CopyResponse> r = client.Copy(request);
    if (!r.ok()) return ReportStatus(err, r.status(), client.address());
    const v1::BlockCopyInfo& b = r->block_copy();
    if (json) {
      out << "{\"src\": \"" << flags.src << "\", \"dst\": \"" << flags.dst << "\", \"scale\": \""
          << flags.scale << "\", \"dst_version\": " << r->dst_version()
          << ", \"scale_version\": " << b.scale_version() << ", \"blocks\": " << b.blocks()
          << ", \"cut_blocks\": " << b.cut_blocks() << ", \"staged_bytes\": " << b.staged_bytes()
          << ", \"bytes_moved\": " << b.bytes_moved() << "}\n";
      return 0;
    }
    out << (flags.dequantize ? "dequantized " : "quantized ") << flags.src << " -> " << flags.dst
        << " (version " << r->dst_version() << ")";
    if (!flags.dequantize)
      out << ", scales " << flags.scale << " (version " << b.scale_version() << ")";
    out << "\n  blocks: " << b.blocks() << ", cut across source ranks: " << b.cut_blocks()
        << ", staged: " << b.staged_bytes() << " bytes, moved in all: " << b.bytes_moved()
        << " bytes\n";
    for (const std::string& where : b.staging()) out << "  made whole on " << where << "\n";
    return 0;
  }
  v1::CopyResponse copied;
  if (!request.dst_offset().empty() || !request.src_offset().empty() ||
      !request.src_shape().empty()) {
    // A slice copy runs through the coordinator (no plan to follow): wait for it.
    request.set_wait(true);
    absl::StatusOr<v1::CopyResponse> r = client.Copy(request);
    if (!r.ok()) return ReportStatus(err, r.status(), client.address());
    if (r->progress().state() != v1::COMMITTED) {
      err << "tensor copy: " << r->progress().error() << "\n";
      return 1;
    }
    out << (json ? CopyOutcomeJson(request, *r) + "\n" : CopyOutcomeText(request, *r));
    return 0;
  }
  // RunPlan follows any plan through its progress and plan; dst_version rides alongside.
  absl::StatusOr<v1::RedistributeResponse> response = RunPlan(
      client,
      [&](bool wait) -> absl::StatusOr<v1::RedistributeResponse> {
        request.set_wait(wait);
        absl::StatusOr<v1::CopyResponse> r = client.Copy(request);
        if (!r.ok()) return r.status();
        copied = *r;
        v1::RedistributeResponse plan;
        *plan.mutable_progress() = r->progress();
        *plan.mutable_plan() = r->plan();
        return plan;
      },
      progress, absl::StrCat("copy ", flags.src, " -> ", flags.dst), err);
  if (std::optional<int> rc = ReportFailure(client, response, err)) return *rc;
  *copied.mutable_progress() = response->progress();
  out << (json ? CopyOutcomeJson(request, copied) + "\n" : CopyOutcomeText(request, copied));
  return 0;
}

int RunDownloadCommand(CoordinatorClient& client, const DownloadFlags& flags, bool json,
                       bool progress, std::ostream& out, std::ostream& err) {
  if (flags.out_path.empty()) return ReportFlagError(err, "tensor download", "--out: empty path");
  // The .npy header goes out when the tensor's header arrives, the data as it streams in:
  // the tensor is never held whole. The file appears only once complete.
  std::unique_ptr<NpyFileWriter> file;
  DType dtype = DType::kF32;
  Shape shape;
  LocalFailure local;
  absl::StatusOr<v1::TensorHeader> header;
  {
    ProgressBar bar(err, progress, absl::StrCat("download ", flags.name));
    header = client.DownloadTo(
        flags.name,
        [&](const v1::TensorHeader& h) -> absl::Status {
          local.failed = true;
          absl::StatusOr<DType> d = DTypeFromProto(h.dtype(), "header.dtype");
          if (!d.ok()) return absl::InternalError(d.status().message());
          absl::StatusOr<Shape> s = ShapeFromProto(h.shape(), "header.shape");
          if (!s.ok()) return absl::InternalError(s.status().message());
          dtype = *d;
          shape = *std::move(s);
          absl::StatusOr<std::unique_ptr<NpyFileWriter>> w =
              NpyFileWriter::Create(flags.out_path, dtype, shape, flags.raw);
          if (!w.ok()) return w.status();
          file = *std::move(w);
          local.failed = false;
          return absl::OkStatus();
        },
        [&](absl::string_view data) { return local.Track(file->Append(data)); },
        [&](int64_t done, int64_t total) { bar.Update(done, total); });
  }
  if (!header.ok()) return local.Report(err, header.status(), client.address());
  if (absl::Status s = file->Commit(); !s.ok()) return ReportStatus(err, s);
  const int64_t bytes = header->total_bytes();
  if (!flags.raw && !NpyHasDType(dtype)) {
    err << "shardctl: note: " << DTypeName(dtype) << " has no NumPy dtype; " << flags.out_path
        << " holds the raw bits as '" << NpyDescr(dtype) << "' (view with ml_dtypes)\n";
  }
  JsonWriter w;
  w.BeginObject();
  w.Key("tensor").String(flags.name);
  w.Key("path").String(flags.out_path);
  w.Key("shape").IntArray(shape);
  w.Key("dtype").String(DTypeName(dtype));
  if (flags.raw) {
    w.Key("raw").Bool(true);
  } else {
    w.Key("npy_dtype").String(NpyDescr(dtype));
  }
  w.Key("bytes").Int(bytes);
  w.EndObject();
  return ReportJsonOrText(
      out, json, w.str(),
      absl::StrCat("downloaded '", flags.name, "' ", ShapeToString(shape), " ", DTypeName(dtype),
                   " (", HumanBytes(bytes), ") to ", flags.out_path, "\n"));
}

int RunUploadCommand(CoordinatorClient& client, const UploadFlags& flags, bool json, bool progress,
                     std::ostream& out, std::ostream& err) {
  constexpr absl::string_view kCommand = "tensor upload";
  if (flags.from_path.empty()) return ReportFlagError(err, kCommand, "--from: empty path");
  if (flags.mesh.empty()) return ReportFlagError(err, kCommand, "--mesh: the tensor needs a mesh");
  std::optional<DType> want;
  if (!flags.dtype.empty()) {
    absl::StatusOr<DType> d = ParseDType(absl::StripAsciiWhitespace(flags.dtype));
    if (!d.ok())
      return ReportFlagError(err, kCommand, absl::StrCat("--dtype: ", d.status().message()));
    want = *d;
  }
  absl::StatusOr<v1::ShardingSpec> spec = BuildSpec(flags.mesh, flags.placements, flags.flat);
  if (!spec.ok()) return ReportFlagError(err, kCommand, spec.status().message());

  NpyReadOptions options;
  if (want.has_value() && !NpyHasDType(*want)) options.bits_of = *want;
  // The header is checked (and the file's size against it) before anything is sent; the
  // data is then read and sent in pieces, never held whole.
  absl::StatusOr<std::unique_ptr<NpyFileReader>> file;
  if (flags.raw) {
    if (!want.has_value()) {
      return ReportFlagError(err, kCommand, "--dtype: required with --raw");
    }
    if (flags.shape.empty()) return ReportFlagError(err, kCommand, "--shape: required with --raw");
    absl::StatusOr<std::vector<int64_t>> shape = ParseIntList(flags.shape);
    if (!shape.ok()) {
      return ReportFlagError(err, kCommand, absl::StrCat("--shape: ", shape.status().message()));
    }
    if (absl::Status s = ValidateShape(*shape); !s.ok()) {
      return ReportFlagError(err, kCommand, absl::StrCat("--shape: ", s.message()));
    }
    file = NpyFileReader::OpenRaw(flags.from_path, *want, *shape);
  } else {
    if (!flags.shape.empty()) {
      return ReportFlagError(err, kCommand, "--shape: only with --raw (an .npy file has its own)");
    }
    file = NpyFileReader::Open(flags.from_path, options);
  }
  if (!file.ok()) return ReportStatus(err, file.status());
  const NpyFileHeader& npy = (*file)->header();
  if (want.has_value() && *want != npy.dtype) {
    return ReportFlagError(
        err, kCommand,
        absl::StrCat("--dtype: ", flags.from_path, " holds ", DTypeName(npy.dtype), ", not ",
                     DTypeName(*want),
                     " (uploads keep the file's dtype; only bf16 reinterprets a '<u2' file and "
                     "the float8s a '|u1' file; --raw takes any dtype)"));
  }

  v1::TensorHeader header;
  header.set_name(flags.name);
  for (int64_t d : npy.shape) header.add_shape(d);
  header.set_dtype(DTypeToProto(npy.dtype));
  *header.mutable_spec() = *std::move(spec);
  header.set_total_bytes(npy.data_bytes);
  absl::StatusOr<v1::TensorInfo> tensor;
  LocalFailure local;
  {
    ProgressBar bar(err, progress, absl::StrCat("upload ", flags.name));
    // Each attempt reads the file from its first data byte: an upload restarted after a
    // failover sends it all again (the coordinator commits only a whole one).
    NpyFileReader* reader = file->get();
    tensor = client.UploadFrom(
        header,
        [&]() -> absl::StatusOr<CoordinatorClient::ReadFn> {
          if (absl::Status s = reader->Rewind(); !s.ok()) return local.Track(s);
          return CoordinatorClient::ReadFn([&](size_t max_bytes, std::string* piece) {
            return local.Track(reader->Read(max_bytes, piece));
          });
        },
        [&](int64_t done, int64_t total) { bar.Update(done, total); });
  }
  if (!tensor.ok()) return local.Report(err, tensor.status(), client.address());
  return ReportJsonOrText(
      out, json, TensorJson(*tensor),
      absl::StrCat("uploaded ", flags.from_path, " as tensor ", TensorLine(*tensor), "\n"));
}

int RunTensorShowCommand(CoordinatorClient& client, const std::string& name, bool json,
                         std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::TensorInfo> tensor = client.GetTensor(name);
  if (!tensor.ok()) return ReportStatus(err, tensor.status(), client.address());
  return ReportJsonOrText(out, json, TensorJson(*tensor), TensorText(*tensor));
}

int RunTensorListCommand(CoordinatorClient& client, const std::string& prefix, bool json,
                         std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::vector<v1::TensorInfo>> tensors = client.ListTensors(prefix);
  if (!tensors.ok()) return ReportStatus(err, tensors.status(), client.address());
  return ReportJsonOrText(out, json, TensorsJson(*tensors), TensorsTable(*tensors));
}

int RunTensorDeleteCommand(CoordinatorClient& client, const std::string& name, bool json,
                           std::ostream& out, std::ostream& err) {
  absl::Status s = client.DeleteTensor(name);
  if (!s.ok()) return ReportStatus(err, s, client.address());
  return ReportDeleted(out, json, "tensor", name);
}

void AddTensorCommand(CLI::App& app, const ConnectionFlags* conn) {
  CLI::App* tensor = app.add_subcommand("tensor", "Create, move, read and write tensors");
  tensor->require_subcommand(1);
  auto add_name = [](CLI::App* cmd, std::string* name) {
    cmd->add_option("name", *name, "Tensor name")->required()->type_name("NAME");
  };
  const bool progress = ProgressBar::StderrIsTerminal();

  {
    CLI::App* cmd = tensor->add_subcommand(
        "create",
        "Create a tensor on a mesh, filled on the workers (no data is sent); or many at once, "
        "all or nothing, with --from-file");
    auto flags = std::make_shared<TensorCreateFlags>();
    auto from_file = std::make_shared<std::string>();
    cmd->add_option("name", flags->name, "Tensor name (or --from-file)")->type_name("NAME");
    cmd->add_option("--from-file", *from_file,
                    "JSON {\"tensors\": [{\"name\", \"shape\": [..], \"dtype\", \"mesh\", "
                    "\"placements\" | \"flat\", \"init\", \"seed\"}]}: every tensor in one call")
        ->type_name("FILE");
    CLI::Option* mesh_flag = cmd->add_option("--mesh", flags->mesh, "Mesh name")->type_name("MESH");
    CLI::Option* shape_flag =
        cmd->add_option("--shape", flags->shape, "Global shape, comma-separated: 64,48")
            ->type_name("DIMS");
    cmd->add_option("--dtype", flags->dtype, DTypeNameList())
        ->capture_default_str()
        ->type_name("TYPE");
    CLI::Option *placements, *flat;
    AddSpecFlags(cmd, &placements, &flat);
    cmd->add_option("--init", flags->init,
                    "zeros, arange (element i = i), random (uniform [0,1) from --seed) or "
                    "attached (every rank's buffer lent by a user process: the Python package's "
                    "attach)")
        ->capture_default_str()
        ->type_name("KIND");
    cmd->add_option("--seed", flags->seed, "Seed for --init random")->capture_default_str();
    cmd->callback([conn, flags, from_file, placements, flat, mesh_flag, shape_flag]() {
      if (!from_file->empty()) {
        if (!flags->name.empty() || mesh_flag->count() > 0 || shape_flag->count() > 0 ||
            placements->count() > 0 || flat->count() > 0) {
          FinishCommand(
              ReportFlagError(std::cerr, "tensor create",
                              "--from-file: give NAME and flags, or --from-file, not both"));
        }
        CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
        FinishCommand(
            RunTensorCreateManyCommand(client, *from_file, conn->json, std::cout, std::cerr));
        return;
      }
      if (flags->name.empty() || mesh_flag->count() == 0 || shape_flag->count() == 0) {
        FinishCommand(ReportFlagError(std::cerr, "tensor create",
                                      "NAME, --mesh and --shape are required (or --from-file)"));
      }
      flags->placements = Value(placements);
      flags->flat = Value(flat);
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunTensorCreateCommand(client, *flags, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = tensor->add_subcommand(
        "redistribute", "Move a tensor to a new layout, on its mesh or another one");
    auto flags = std::make_shared<RedistributeFlags>();
    cmd->add_option("name", flags->name, "Tensor name (or --from-file)")->type_name("NAME");
    cmd->add_option("--mesh", flags->mesh, "Target mesh (default: the tensor's)")
        ->type_name("MESH");
    CLI::Option *placements, *flat;
    AddSpecFlags(cmd, &placements, &flat);
    auto from_file = std::make_shared<std::string>();
    cmd->add_option("--from-file", *from_file,
                    "Move many as one transaction (all or nothing): a JSON file {\"moves\": "
                    "[{\"tensor\": \"a\", \"mesh\": \"m\", \"placements\": \"S(0)\"}, "
                    "{\"tensor\": \"b\", \"flat\": \"0:4;4:8\"}, ...]}")
        ->type_name("PATH");
    cmd->callback([conn, flags, placements, flat, from_file, progress]() {
      flags->placements = Value(placements);
      flags->flat = Value(flat);
      if (!from_file->empty()) {
        if (!flags->name.empty() || !flags->mesh.empty() || flags->placements || flags->flat) {
          return FinishCommand(
              ReportFlagError(std::cerr, "tensor redistribute",
                              "--from-file: give NAME and a spec, or --from-file, not both"));
        }
        CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
        return FinishCommand(
            RunRedistributeManyCommand(client, *from_file, conn->json, std::cout, std::cerr));
      }
      if (flags->name.empty()) {
        return FinishCommand(
            ReportFlagError(std::cerr, "tensor redistribute", "NAME is required (or --from-file)"));
      }
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(
          RunRedistributeCommand(client, *flags, conn->json, progress, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = tensor->add_subcommand(
        "redistribute-many",
        "Move many tensors to new layouts as one transaction (all or nothing)");
    auto from_file = std::make_shared<std::string>();
    cmd->add_option("--from-file", *from_file,
                    "JSON {\"redistributes\": [{\"tensor\": \"a\", \"target\": {\"mesh\": "
                    "\"m\", \"placements_text\": \"S(1)\"}}, ...]}")
        ->required()
        ->type_name("PATH");
    cmd->callback([conn, from_file]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(
          RunRedistributeManyCommand(client, *from_file, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = tensor->add_subcommand(
        "gather",
        "Replicate a tensor on every rank of a mesh, or on one rank; several tensors go as one "
        "group (one plan, all or nothing)");
    auto flags = std::make_shared<GatherFlags>();
    auto names = std::make_shared<std::vector<std::string>>();
    cmd->add_option("names", *names, "Tensor names")->required()->type_name("NAME...");
    cmd->add_option("--mesh", flags->mesh, "Mesh to gather on (default: the tensor's)")
        ->type_name("MESH");
    CLI::Option* to_rank = cmd->add_option("--to-rank", "Gather to this one global rank");
    to_rank->type_name("RANK");
    cmd->callback([conn, flags, names, to_rank, progress]() {
      if (to_rank->count() > 0) flags->to_rank = to_rank->as<int64_t>();
      flags->name = names->front();
      flags->more.assign(names->begin() + 1, names->end());
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunGatherCommand(client, *flags, conn->json, progress, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = tensor->add_subcommand(
        "copy",
        "Write one tensor's values into another of the same shape (any mesh and layout); the "
        "destination keeps its layout and dtype (values are cast to it: f64/f32/bf16/f16/"
        "f8_e4m3/f8_e5m2 among themselves, integer widening) and gets a new version; with "
        "--dst-offset (or --src-offset/--src-shape) into (or out of) a box of a larger, "
        "fused tensor");
    auto flags = std::make_shared<CopyFlags>();
    cmd->add_option("src", flags->src, "Source tensor (read only)")->type_name("SRC");
    cmd->add_option("dst", flags->dst, "Destination tensor")->type_name("DST");
    cmd->add_option("--from-file", flags->from_file,
                    "Copy many as one transaction (all or nothing): a JSON file "
                    "{\"copies\": [{\"src\": \"a\", \"dst\": \"b\"}, ...]}; a member may "
                    "name boxes: \"dst_offset\": [64, 0] (many srcs into one fused dst, boxes "
                    "of one dst must not overlap), \"src_offset\" with \"src_shape\" (a box "
                    "of src)")
        ->type_name("PATH");
    cmd->add_option("--quantize", flags->quantize,
                    "Block-scaled FP8: block:ROWSxCOLS (e.g. block:128x128). DST (f8_e4m3) gets "
                    "e4m3(SRC / s), --scale (f32, [..., ceil(M/ROWS), ceil(N/COLS)]) each "
                    "block's s = amax / 448 (1 for an all-zero block); blocks cut between ranks "
                    "are made whole first")
        ->type_name("BLOCK");
    cmd->add_flag("--dequantize", flags->dequantize,
                  "The inverse: DST = dtype(f32(SRC) * s) with s from --scale (block: "
                  "--quantize's, else block:128x128)");
    cmd->add_option("--scale", flags->scale,
                    "The scale tensor: written by --quantize, read by --dequantize")
        ->type_name("TENSOR");
    cmd->add_option("--dst-offset", flags->dst_offset,
                    "Write SRC into the box of DST starting here (q into a fused qkv: 0,0; k: "
                    "4096,0); the box has SRC's shape, with leading dims of 1 added to DST's rank "
                    "(an expert [2I,H] into [E,2I,H] at e,0,0); the rest of DST keeps its values")
        ->type_name("I,J,...");
    cmd->add_option("--src-offset", flags->src_offset,
                    "Read only the box of SRC starting here (with --src-shape): k out of a fused "
                    "qkv")
        ->type_name("I,J,...");
    cmd->add_option("--src-shape", flags->src_shape,
                    "The shape of the box of SRC read (with --src-offset); DST's shape, with "
                    "leading dims of 1 added or dropped")
        ->type_name("N,M,...");
    cmd->callback([conn, flags, progress]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunCopyCommand(client, *flags, conn->json, progress, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = tensor->add_subcommand("download", "Save a whole tensor as a NumPy .npy file");
    auto flags = std::make_shared<DownloadFlags>();
    add_name(cmd, &flags->name);
    cmd->add_option("--out", flags->out_path, "Output .npy path")->required()->type_name("PATH");
    cmd->add_flag("--raw", flags->raw,
                  "Write the elements only (C order, little-endian), no .npy header; any dtype");
    cmd->callback([conn, flags, progress]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunDownloadCommand(client, *flags, conn->json, progress, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = tensor->add_subcommand(
        "upload",
        "Create (or overwrite) a tensor from a NumPy .npy file, stored in the given layout");
    auto flags = std::make_shared<UploadFlags>();
    add_name(cmd, &flags->name);
    cmd->add_option("--mesh", flags->mesh, "Mesh name")->required()->type_name("MESH");
    CLI::Option *placements, *flat;
    AddSpecFlags(cmd, &placements, &flat);
    cmd->add_option("--from", flags->from_path,
                    "Input .npy path (C order, little-endian), or a raw file with --raw")
        ->required()
        ->type_name("PATH");
    cmd->add_option("--dtype", flags->dtype,
                    absl::StrCat("Expected dtype (default: the file's); bf16 reads a '<u2' file "
                                 "and f8_e4m3, f8_e5m2, f8_e8m0 a '|u1' file as their bits; "
                                 "required with --raw. One of ",
                                 DTypeNameList()))
        ->type_name("TYPE");
    cmd->add_flag("--raw", flags->raw,
                  "--from holds the elements only (C order, little-endian), no .npy header; "
                  "needs --dtype and --shape");
    cmd->add_option("--shape", flags->shape, "With --raw: the global shape, comma-separated")
        ->type_name("DIMS");
    cmd->callback([conn, flags, placements, flat, progress]() {
      flags->placements = Value(placements);
      flags->flat = Value(flat);
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunUploadCommand(client, *flags, conn->json, progress, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = tensor->add_subcommand(
        "show", "A tensor's layout: chunks per rank with checksums, and a picture");
    auto name = std::make_shared<std::string>();
    add_name(cmd, name.get());
    cmd->callback([conn, name]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunTensorShowCommand(client, *name, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = tensor->add_subcommand("list", "List tensors (every page)");
    auto prefix = std::make_shared<std::string>();
    cmd->add_option("--prefix", *prefix, "Only tensors whose name starts with P")->type_name("P");
    cmd->callback([conn, prefix]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunTensorListCommand(client, *prefix, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = tensor->add_subcommand(
        "delete", "Delete tensors and free their buffers; several (and --prefix) all or nothing");
    auto names = std::make_shared<std::vector<std::string>>();
    auto prefix = std::make_shared<std::string>();
    cmd->add_option("names", *names, "Tensor names")->type_name("NAME...");
    cmd->add_option("--prefix", *prefix, "Also every tensor whose name starts with P")
        ->type_name("P");
    cmd->callback([conn, names, prefix]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      if (names->size() == 1 && prefix->empty()) {
        FinishCommand(
            RunTensorDeleteCommand(client, names->front(), conn->json, std::cout, std::cerr));
        return;
      }
      FinishCommand(
          RunTensorDeleteManyCommand(client, *names, *prefix, conn->json, std::cout, std::cerr));
    });
  }
}

}  // namespace shardcoord
