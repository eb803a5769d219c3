#include "client/checkpoint_command.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "client/command_util.h"
#include "client/tensor_command.h"
#include "google/protobuf/util/json_util.h"
#include "proto/convert.h"
#include "sharding/block_quant.h"

namespace shardcoord {
namespace {

// Hugging Face's and DeepSeek-V3's name for an FP8 entry's block scales: "N" + this.
constexpr char kScaleInvSuffix[] = "_scale_inv";

std::string ProtoJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

std::string Rate(int64_t bytes, double seconds) {
  if (seconds <= 0) return "";
  return absl::StrFormat(" (%.0f MB/s)", static_cast<double>(bytes) / seconds / 1e6);
}

// Sends `request` (built from the flags of `command`: an error is a flag error) with `send`,
// drawing its progress (polled by request id) as `label` on `err` with `progress`. Returns
// the exit code where the command ends here: an error, or --json with the response printed;
// else nullopt and the response in `response`, for the caller to print as text.
template <typename Request, typename Response>
std::optional<int> SendWithProgress(
    CoordinatorClient& client, const absl::StatusOr<Request>& request, absl::string_view command,
    const std::string& label, absl::StatusOr<Response> (CoordinatorClient::*send)(const Request&),
    bool json, bool progress, std::ostream& out, std::ostream& err,
    std::optional<Response>& response) {
  if (!request.ok()) return ReportFlagError(err, command, request.status().message());
  absl::Notification finished;
  std::optional<std::thread> poller;
  if (progress) {
    poller.emplace([&] {
      ProgressBar bar(err, true, label);
      while (!finished.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
        absl::StatusOr<v1::CheckpointProgress> p =
            client.GetCheckpointProgress(request->request_id());
        if (p.ok()) bar.Update(p->bytes_done(), p->bytes_total());
      }
      bar.Finish();
    });
  }
  absl::StatusOr<Response> r = (client.*send)(*request);
  finished.Notify();
  if (poller.has_value()) poller->join();
  if (!r.ok()) return ReportStatus(err, r.status(), client.address());
  if (json) {
    out << ProtoJson(*r) << "\n";
    return 0;
  }
  response = *std::move(r);
  return std::nullopt;
}

}  // namespace

std::string AbsoluteCheckpointPath(const std::string& dir) {
  if (dir.empty()) return dir;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  if (ec) return dir;
  std::string out = p.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

absl::StatusOr<v1::SaveCheckpointRequest> BuildSaveCheckpointRequest(
    const CheckpointSaveFlags& flags) {
  if (flags.dir.empty()) return absl::InvalidArgumentError("DIR: missing");
  if (flags.all == !flags.tensors.empty()) {
    return absl::InvalidArgumentError("name the tensors to save, or pass --all (not both)");
  }
  v1::SaveCheckpointRequest request;
  request.set_dir(AbsoluteCheckpointPath(flags.dir));
  for (const std::string& t : flags.tensors) request.add_tensors(t);
  request.set_all(flags.all);
  request.set_overwrite(flags.overwrite);
  request.set_request_id(NewRequestId());
  return request;
}

int RunCheckpointSaveCommand(CoordinatorClient& client, const CheckpointSaveFlags& flags, bool json,
                             bool progress, std::ostream& out, std::ostream& err) {
  std::optional<v1::SaveCheckpointResponse> r;
  if (std::optional<int> rc =
          SendWithProgress(client, BuildSaveCheckpointRequest(flags), "checkpoint save", "save",
                           &CoordinatorClient::SaveCheckpoint, json, progress, out, err, r)) {
    return *rc;
  }
  out << "saved " << r->tensors() << " tensor" << (r->tensors() == 1 ? "" : "s") << " to "
      << r->dir() << ": " << HumanBytes(r->bytes()) << " in " << r->files_size() << " file"
      << (r->files_size() == 1 ? "" : "s") << ", " << absl::StrFormat("%.3f", r->seconds()) << " s"
      << Rate(r->bytes(), r->seconds()) << "\n";
  if (r->ideal_writer_bytes() > 0) {
    out << "  busiest writer " << HumanBytes(r->max_writer_bytes()) << ", ideal "
        << HumanBytes(static_cast<int64_t>(r->ideal_writer_bytes()))
        << absl::StrFormat(" (%.2fx)", r->max_writer_bytes() / r->ideal_writer_bytes()) << "\n";
  }
  std::vector<std::vector<std::string>> rows = {
      {"  file", "worker", "rank", "bytes", "entries", "seconds"}};
  for (const v1::CheckpointFileInfo& f : r->files()) {
    rows.push_back({"  " + f.file(), f.worker(), absl::StrCat(f.rank()), HumanBytes(f.bytes()),
                    absl::StrCat(f.entries()), absl::StrFormat("%.3f", f.seconds())});
  }
  out << FormatTable(rows, {2, 3, 4, 5});
  return 0;
}

absl::StatusOr<v1::LoadCheckpointRequest> BuildLoadCheckpointRequest(
    const CheckpointLoadFlags& flags, const std::string& from_file_text) {
  if (flags.dir.empty()) return absl::InvalidArgumentError("DIR: missing");
  v1::LoadCheckpointRequest request;
  request.set_dir(AbsoluteCheckpointPath(flags.dir));
  request.set_prefix(flags.prefix);
  request.set_into(flags.into);
  if (!flags.dtype.empty()) {
    absl::StatusOr<DType> dtype = ParseDType(absl::StripAsciiWhitespace(flags.dtype));
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--dtype: ", dtype.status().message()));
    }
    request.set_dtype(DTypeToProto(*dtype));
  }
  request.set_dequantize(flags.dequantize);
  if (!flags.block.empty()) {
    if (!flags.dequantize) return absl::InvalidArgumentError("--block: only with --dequantize");
    std::string block(absl::StripAsciiWhitespace(flags.block));
    if (!absl::StartsWith(block, "block:")) block = absl::StrCat("block:", block);
    absl::StatusOr<BlockSize> parsed = ParseBlockQuantization(block);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--block: ", parsed.status().message()));
    }
    request.set_block(BlockQuantizationText(*parsed));
  }
  request.set_request_id(NewRequestId());
  const bool has_spec = flags.placements.has_value() || flags.flat.has_value();
  if (!flags.from_file.empty()) {
    if (!flags.tensors.empty() || has_spec || !flags.mesh.empty()) {
      return absl::InvalidArgumentError(
          "--from-file: give the tensors and their layouts in the file, not as flags");
    }
    absl::StatusOr<v1::RedistributeGroupRequest> moves = ParseRedistributesJson(from_file_text);
    if (!moves.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--from-file ", flags.from_file, ": ", moves.status().message()));
    }
    for (const v1::RedistributeItem& item : moves->redistributes()) {
      v1::LoadTarget* t = request.add_targets();
      t->set_tensor(item.tensor());
      *t->mutable_target() = item.target();
      if (!flags.into && t->target().mesh().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--from-file ", flags.from_file, ": tensor '", item.tensor(), "' has no \"mesh\""));
      }
    }
    return request;
  }
  v1::ShardingSpec spec;
  if (flags.into) {
    if (has_spec || !flags.mesh.empty()) {
      return absl::InvalidArgumentError(
          "--into: the tensors keep their own layouts (drop --mesh, --placements, --flat)");
    }
  } else {
    if (flags.mesh.empty()) return absl::InvalidArgumentError("--mesh: missing");
    absl::StatusOr<v1::ShardingSpec> s = BuildSpec(flags.mesh, flags.placements, flags.flat);
    if (!s.ok()) return s.status();
    spec = *std::move(s);
  }
  if (flags.tensors.empty()) {
    request.set_all(true);
    *request.mutable_spec() = spec;
  }
  for (const std::string& name : flags.tensors) {
    v1::LoadTarget* t = request.add_targets();
    t->set_tensor(name);
    if (!flags.into) *t->mutable_target() = spec;
  }
  return request;
}

int RunCheckpointLoadCommand(CoordinatorClient& client, const CheckpointLoadFlags& flags, bool json,
                             bool progress, std::ostream& out, std::ostream& err) {
  std::string text;
  if (!flags.from_file.empty()) {
    std::ifstream in(flags.from_file);
    if (!in) {
      return ReportFlagError(err, "checkpoint load",
                             absl::StrCat("--from-file: cannot read '", flags.from_file, "'"));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  std::optional<v1::LoadCheckpointResponse> r;
  if (std::optional<int> rc = SendWithProgress(
          client, BuildLoadCheckpointRequest(flags, text), "checkpoint load", "load",
          &CoordinatorClient::LoadCheckpoint, json, progress, out, err, r)) {
    return *rc;
  }
  out << "loaded " << r->tensors_size() << " tensor" << (r->tensors_size() == 1 ? "" : "s")
      << (flags.into ? " into existing tensors" : "") << ": " << HumanBytes(r->bytes()) << " in "
      << absl::StrFormat("%.3f", r->seconds()) << " s" << Rate(r->bytes(), r->seconds()) << "\n"
      << "  read " << HumanBytes(r->bytes_read()) << " from storage by " << r->readers_size()
      << " worker" << (r->readers_size() == 1 ? "" : "s") << " in "
      << absl::StrFormat("%.3f", r->read_seconds()) << " s; exchanged "
      << HumanBytes(r->exchange_bytes_moved()) << " (lower bound "
      << HumanBytes(r->exchange_lower_bound_bytes()) << ") in "
      << absl::StrFormat("%.3f", r->exchange_seconds()) << " s as group " << r->group_id() << "\n";
  std::vector<std::vector<std::string>> rows = {{"  reader", "rank", "read", "runs", "seconds"}};
  for (const v1::CheckpointFileInfo& f : r->readers()) {
    rows.push_back({"  " + f.worker(), absl::StrCat(f.rank()), HumanBytes(f.bytes()),
                    absl::StrCat(f.entries()), absl::StrFormat("%.3f", f.seconds())});
  }
  out << FormatTable(rows, {1, 2, 3, 4});
  if (r->tensors_size() <= 20) {
    for (const v1::LoadedTensor& t : r->tensors()) {
      out << "  " << t.name() << (t.name() == t.tensor() ? "" : absl::StrCat(" (", t.tensor(), ")"))
          << ": version " << t.version()
          << (t.scale_tensor().empty() ? "" : absl::StrCat(", dequantized with ", t.scale_tensor()))
          << "\n";
    }
  }
  return 0;
}

int RunCheckpointInspectCommand(CoordinatorClient& client, const std::string& dir, bool json,
                                std::ostream& out, std::ostream& err) {
  if (dir.empty()) return ReportFlagError(err, "checkpoint inspect", "DIR: missing");
  absl::StatusOr<v1::InspectCheckpointResponse> r =
      client.InspectCheckpoint(AbsoluteCheckpointPath(dir));
  if (!r.ok()) return ReportStatus(err, r.status(), client.address());
  if (json) {
    out << ProtoJson(*r) << "\n";
    return 0;
  }
  out << (r->plain() ? "safetensors files in " : "checkpoint ") << r->dir() << ": "
      << r->tensors_size() << " tensor" << (r->tensors_size() == 1 ? "" : "s") << ", "
      << HumanBytes(r->bytes()) << " in " << r->files_size() << " file"
      << (r->files_size() == 1 ? "" : "s") << "\n";
  // FP8 entries and their block scales, by the DeepSeek-V3 / Hugging Face convention: entry N
  // (f8) is paired with N_scale_inv, the f32 scales of its blocks (sharding/block_quant.h).
  absl::flat_hash_map<std::string, const v1::CheckpointTensorInfo*> by_name;
  for (const v1::CheckpointTensorInfo& t : r->tensors()) by_name[t.name()] = &t;
  auto is_fp8 = [](const v1::CheckpointTensorInfo& t) {
    return t.dtype() == v1::F8_E4M3 || t.dtype() == v1::F8_E5M2;
  };
  absl::flat_hash_map<std::string, std::string> scale_of, scaled_by;
  for (const v1::CheckpointTensorInfo& t : r->tensors()) {
    if (!is_fp8(t)) continue;
    auto it = by_name.find(t.name() + kScaleInvSuffix);
    if (it == by_name.end()) continue;
    const v1::CheckpointTensorInfo& scale = *it->second;
    std::string text = scale.name();
    // The block size, where the shapes say it: a whole number of blocks per scale entry.
    const int n = t.shape_size(), sn = scale.shape_size();
    if (n >= 2 && sn == n && scale.shape(n - 2) > 0 && scale.shape(n - 1) > 0) {
      const int64_t rows = (t.shape(n - 2) + scale.shape(n - 2) - 1) / scale.shape(n - 2);
      const int64_t cols = (t.shape(n - 1) + scale.shape(n - 1) - 1) / scale.shape(n - 1);
      absl::StrAppend(&text, " (blocks of ", rows, "x", cols, ")");
    }
    scale_of[t.name()] = text;
    scaled_by[scale.name()] = absl::StrCat("scale of ", t.name());
  }
  std::vector<std::string> header = {"tensor", "shape", "dtype", "bytes", "pieces"};
  if (!scale_of.empty()) header.push_back("scale");
  std::vector<std::vector<std::string>> rows = {header};
  for (const v1::CheckpointTensorInfo& t : r->tensors()) {
    absl::StatusOr<DType> dtype = DTypeFromProto(t.dtype());
    rows.push_back({t.name(), ShapeToString(Shape(t.shape().begin(), t.shape().end())),
                    dtype.ok() ? DTypeName(*dtype) : "?", HumanBytes(t.bytes()),
                    absl::StrCat(t.pieces_size())});
    if (scale_of.empty()) continue;
    auto scale = scale_of.find(t.name());
    auto of = scaled_by.find(t.name());
    rows.back().push_back(scale != scale_of.end() ? scale->second
                          : of != scaled_by.end() ? of->second
                          : is_fp8(t)             ? "none"
                                                  : "-");
  }
  out << FormatTable(rows, {3, 4});
  if (!scale_of.empty()) {
    out << scale_of.size() << " FP8 entr" << (scale_of.size() == 1 ? "y" : "ies")
        << " with block scales (" << kScaleInvSuffix << ", f32 per block of the last two dims)\n";
  }
  std::vector<std::vector<std::string>> files = {{"file", "writer", "rank", "bytes", "entries"}};
  for (const v1::CheckpointFileInfo& f : r->files()) {
    files.push_back({f.file(), f.worker().empty() ? "-" : f.worker(),
                     f.rank() < 0 ? "-" : absl::StrCat(f.rank()), HumanBytes(f.bytes()),
                     absl::StrCat(f.entries())});
  }
  out << FormatTable(files, {2, 3, 4});
  return 0;
}

void AddCheckpointCommand(CLI::App& app, const ConnectionFlags* conn) {
  CLI::App* cmd = app.add_subcommand(
      "checkpoint",
      "Save tensors to a directory of safetensors files and load them back into any layout "
      "(workers read and write the files; DIR must be reachable by every worker)");
  cmd->require_subcommand(1);
  {
    CLI::App* save = cmd->add_subcommand(
        "save",
        "Save tensors: every distinct piece written once, writers balanced; DIR appears "
        "complete or not at all");
    auto flags = std::make_shared<CheckpointSaveFlags>();
    save->add_option("dir", flags->dir, "Checkpoint directory (created)")
        ->required()
        ->type_name("DIR");
    save->add_option("tensors", flags->tensors, "Tensors to save")->type_name("T ...");
    save->add_flag("--all", flags->all, "Save every tensor");
    save->add_flag("--overwrite", flags->overwrite,
                   "Replace an existing DIR (swapped once the new checkpoint is complete)");
    save->callback([conn, flags]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      const int rc = RunCheckpointSaveCommand(
          client, *flags, conn->json, ProgressBar::StderrIsTerminal(), std::cout, std::cerr);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  {
    CLI::App* load = cmd->add_subcommand(
        "load",
        "Create tensors (or --into: copy into existing ones) from a checkpoint, a "
        ".safetensors file or a directory of them, in any layout: each byte is read once, then "
        "exchanged between workers; all tensors appear together or none does");
    auto flags = std::make_shared<CheckpointLoadFlags>();
    load->add_option("dir", flags->dir, "Checkpoint directory or .safetensors file")
        ->required()
        ->type_name("DIR");
    load->add_option("tensors", flags->tensors, "Tensors to load (default: all)")
        ->type_name("T ...");
    load->add_option("--mesh", flags->mesh, "Target mesh")->type_name("MESH");
    CLI::Option* placements = load->add_option("--placements", "Target placements: S(0),R");
    placements->type_name("SPEC");
    CLI::Option* flat = load->add_option("--flat", "Target flat ranges: '0:4;4:8'");
    flat->type_name("SPEC");
    load->add_option("--prefix", flags->prefix, "Prefix of the names created (p_ makes p_T)")
        ->type_name("P");
    load->add_option("--from-file", flags->from_file,
                     "Per-tensor targets: {\"moves\": [{\"tensor\": \"a\", \"mesh\": \"m\", "
                     "\"placements\": \"S(0)\"}, {\"tensor\": \"b\", \"mesh\": \"m\", \"flat\": "
                     "\"0:4;4:8\"}]}")
        ->type_name("FILE");
    load->add_flag("--into", flags->into,
                   "Copy into existing tensors of the same names (prefix included) and shapes; "
                   "each keeps its layout and dtype (values are cast to it)");
    load->add_option("--dtype", flags->dtype,
                     absl::StrCat("Cast every tensor to this dtype as it loads (the cast rules "
                                  "of Copy; with --into it must be the tensors' dtype): ",
                                  DTypeNameList()))
        ->type_name("TYPE");
    load->add_flag(
        "--dequantize", flags->dequantize,
        "Dequantize block-scaled FP8 (DeepSeek-V3 / Hugging Face): every F8_E4M3 entry N with "
        "an F32 entry N_scale_inv (one scale per block of the last two dims) loads as "
        "f32(q) * scale cast to --dtype (default bf16; with --into, the tensor's dtype); the "
        "_scale_inv entries are consumed, not loaded. Without it FP8 entries load unchanged");
    load->add_option("--block", flags->block,
                     "Block size of --dequantize, rows x cols (default 128x128)")
        ->type_name("RxC");
    load->callback([conn, flags, placements, flat]() {
      if (placements->count() > 0) flags->placements = placements->as<std::string>();
      if (flat->count() > 0) flags->flat = flat->as<std::string>();
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      const int rc = RunCheckpointLoadCommand(
          client, *flags, conn->json, ProgressBar::StderrIsTerminal(), std::cout, std::cerr);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  {
    CLI::App* inspect = cmd->add_subcommand(
        "inspect", "Show a checkpoint's tensors, pieces and writers (read by a worker)");
    auto dir = std::make_shared<std::string>();
    inspect->add_option("dir", *dir, "Checkpoint directory or .safetensors file")
        ->required()
        ->type_name("DIR");
    inspect->callback([conn, dir]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      const int rc = RunCheckpointInspectCommand(client, *dir, conn->json, std::cout, std::cerr);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
}

}  // namespace shardcoord
