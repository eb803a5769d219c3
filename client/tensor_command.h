#ifndef SHARDCOORD_CLIENT_TENSOR_COMMAND_H_
#define SHARDCOORD_CLIENT_TENSOR_COMMAND_H_

// `shardctl tensor create|redistribute|gather|download|upload|show|list|delete`. Each Run*
// function does one subcommand once its flags are parsed and returns the exit status: 0, 1
// when the coordinator (or the file system) refused, 2 for bad flags. Build* functions turn
// flags into requests without any I/O.

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/coordinator_client.h"

namespace CLI {
class App;
}  // namespace CLI

namespace shardcoord {

struct ConnectionFlags;

void AddTensorCommand(CLI::App& app, const ConnectionFlags* conn);

// A spec from flags: exactly one of placements and flat, checked for syntax here so that
// typos are flag errors (exit 2) rather than server errors. `mesh` may be empty.
absl::StatusOr<v1::ShardingSpec> BuildSpec(const std::string& mesh,
                                           const std::optional<std::string>& placements,
                                           const std::optional<std::string>& flat);

struct TensorCreateFlags {
  std::string name;
  std::string mesh;
  std::string shape;  // "64,48"
  std::string dtype = "f32";
  std::optional<std::string> placements;
  std::optional<std::string> flat;
  std::string init = "zeros";  // zeros | arange | random
  uint64_t seed = 0;
};
absl::StatusOr<v1::CreateTensorRequest> BuildCreateTensorRequest(const TensorCreateFlags& flags);
int RunTensorCreateCommand(CoordinatorClient& client, const TensorCreateFlags& flags, bool json,
                           std::ostream& out, std::ostream& err);

struct RedistributeFlags {
  std::string name;
  std::string mesh;  // Empty: the tensor's mesh.
  std::optional<std::string> placements;
  std::optional<std::string> flat;
};
absl::StatusOr<v1::RedistributeRequest> BuildRedistributeRequest(const RedistributeFlags& flags);
// With `progress`, starts the plan, watches it and draws a bar on `err`; otherwise one call
// that waits for the plan to end.
int RunRedistributeCommand(CoordinatorClient& client, const RedistributeFlags& flags, bool json,
                           bool progress, std::ostream& out, std::ostream& err);

// `shardctl tensor redistribute-many --from-file F`: F is {"redistributes": [{"tensor": "a",
// "target": {"mesh": "m", "placements_text": "S(1)"}}, ...]} (a RedistributeGroupRequest in
// proto JSON; "flat_text" for flat specs), run as one transaction.
absl::StatusOr<v1::RedistributeGroupRequest> ParseRedistributesJson(absl::string_view json);
int RunRedistributeManyCommand(CoordinatorClient& client, const std::string& from_file, bool json,
                               std::ostream& out, std::ostream& err);

struct GatherFlags {
  std::string name;
  // More tensors: all are gathered as one group (GatherGroup), with a group summary.
  std::vector<std::string> more;
  std::string mesh;                // Empty: the tensor's mesh.
  std::optional<int64_t> to_rank;  // One rank instead of every rank of the mesh.
};
v1::GatherRequest BuildGatherRequest(const GatherFlags& flags);
int RunGatherCommand(CoordinatorClient& client, const GatherFlags& flags, bool json, bool progress,
                     std::ostream& out, std::ostream& err);

struct CopyFlags {
  std::string src;
  std::string dst;
  // A JSON file {"copies": [{"src": "a", "dst": "b"}, ...]}: one CopyGroup (all or nothing)
  // instead of src and dst.
  std::string from_file;
  // Block-scaled FP8 (issue 28): --quantize block:RxC writes dst (f8_e4m3) and --scale (f32
  // scales); --dequantize reads dst's values back with --scale's scales (block: --quantize's
  // when given, else block:128x128).
  std::string quantize;
  bool dequantize = false;
  std::string scale;
  // Slices of fused tensors, comma-separated ("0,4096"; empty: the whole tensor): write src
  // into the box of dst at dst_offset; read only the box src_offset + src_shape of src.
  std::string dst_offset;
  std::string src_offset;
  std::string src_shape;
};
// A comma-separated list of integers ("0,4096") as a CopyRequest's slice field; INVALID_ARGUMENT
// naming `flag` and the value.
absl::Status ParseOffsetsFlag(absl::string_view flag, absl::string_view text,
                              google::protobuf::RepeatedField<int64_t>* out);
// The CopyGroupRequest (wait set) of a copies file's text; INVALID_ARGUMENT naming what is
// wrong (not JSON, unknown fields, no copies).
absl::StatusOr<v1::CopyGroupRequest> ParseCopiesJson(absl::string_view json);
// Writes src's values into dst; prints the plan summary and dst's new version. Progress as
// RunRedistributeCommand. With from_file, runs the file's copies as one group (waiting for
// it, no progress bar) and prints the group's summary.
int RunCopyCommand(CoordinatorClient& client, const CopyFlags& flags, bool json, bool progress,
                   std::ostream& out, std::ostream& err);

struct DownloadFlags {
  std::string name;
  std::string out_path;
  bool raw = false;  // The elements only (C order, little-endian), no .npy header.
};
int RunDownloadCommand(CoordinatorClient& client, const DownloadFlags& flags, bool json,
                       bool progress, std::ostream& out, std::ostream& err);

struct UploadFlags {
  std::string name;
  std::string mesh;
  std::optional<std::string> placements;
  std::optional<std::string> flat;
  std::string from_path;
  // Empty: the file's. bf16 reads a '<u2' file, a float8 a '|u1' file, as their bits.
  // Required with `raw`.
  std::string dtype;
  bool raw = false;   // A raw file: C-order little-endian elements, nothing else.
  std::string shape;  // With `raw` (required): "64,48".
};
int RunUploadCommand(CoordinatorClient& client, const UploadFlags& flags, bool json, bool progress,
                     std::ostream& out, std::ostream& err);

int RunTensorShowCommand(CoordinatorClient& client, const std::string& name, bool json,
                         std::ostream& out, std::ostream& err);
int RunTensorListCommand(CoordinatorClient& client, const std::string& prefix, bool json,
                         std::ostream& out, std::ostream& err);
// Bulk (client/tensor_bulk_command.cc). The tensors file of `tensor create --from-file`:
// {"tensors": [{"name", "shape": [..], "dtype", "mesh", "placements" | "flat", "init",
// "seed"}]}, each entry checked as create's flags (errors name "tensors[i]").
absl::StatusOr<v1::CreateTensorsRequest> ParseTensorsJson(const std::string& json);
int RunTensorCreateManyCommand(CoordinatorClient& client, const std::string& from_file, bool json,
                               std::ostream& out, std::ostream& err);
int RunTensorDeleteManyCommand(CoordinatorClient& client, const std::vector<std::string>& names,
                               const std::string& prefix, bool json, std::ostream& out,
                               std::ostream& err);
int RunTensorDeleteCommand(CoordinatorClient& client, const std::string& name, bool json,
                           std::ostream& out, std::ostream& err);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_TENSOR_COMMAND_H_
