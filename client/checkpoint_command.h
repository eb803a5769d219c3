#ifndef SHARDCOORD_CLIENT_CHECKPOINT_COMMAND_H_
#define SHARDCOORD_CLIENT_CHECKPOINT_COMMAND_H_

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

// Registers `shardctl checkpoint save|load|inspect` (issue 13).
void AddCheckpointCommand(CLI::App& app, const ConnectionFlags* conn);

// DIR as the workers see it: absolute, made so against this process's working directory
// (the workers reach the same path on a shared file system, or on this host).
std::string AbsoluteCheckpointPath(const std::string& dir);

struct CheckpointSaveFlags {
  std::string dir;
  std::vector<std::string> tensors;
  bool all = false;
  bool overwrite = false;
};
absl::StatusOr<v1::SaveCheckpointRequest> BuildSaveCheckpointRequest(
    const CheckpointSaveFlags& flags);
// With `progress`, draws a bar on `err` from GetCheckpointProgress while the save runs.
int RunCheckpointSaveCommand(CoordinatorClient& client, const CheckpointSaveFlags& flags, bool json,
                             bool progress, std::ostream& out, std::ostream& err);

struct CheckpointLoadFlags {
  std::string dir;
  std::vector<std::string> tensors;  // Empty: every tensor of the checkpoint.
  std::string mesh;
  std::optional<std::string> placements;
  std::optional<std::string> flat;
  std::string prefix;
  std::string from_file;  // {"moves": [{"tensor": "a", "mesh": "m", "placements": "S(0)"}]}.
  bool into = false;
  std::string dtype;        // Cast every tensor to it as it loads; empty: the checkpoint's.
  bool dequantize = false;  // Block-scaled FP8 entries with their _scale_inv (issue 28).
  std::string block;        // "128x128" or "block:128x128"; empty: 128x128.
};
absl::StatusOr<v1::LoadCheckpointRequest> BuildLoadCheckpointRequest(
    const CheckpointLoadFlags& flags, const std::string& from_file_text = "");
int RunCheckpointLoadCommand(CoordinatorClient& client, const CheckpointLoadFlags& flags, bool json,
                             bool progress, std::ostream& out, std::ostream& err);

int RunCheckpointInspectCommand(CoordinatorClient& client, const std::string& dir, bool json,
                                std::ostream& out, std::ostream& err);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_CHECKPOINT_COMMAND_H_
