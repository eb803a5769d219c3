#ifndef SHARDCOORD_CLIENT_MESH_COMMAND_H_
#define SHARDCOORD_CLIENT_MESH_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "client/coordinator_client.h"

namespace CLI {
class App;
}  // namespace CLI

namespace shardcoord {

struct ConnectionFlags;

// Registers `shardctl mesh create|list|get|delete`.
void AddMeshCommand(CLI::App& app, const ConnectionFlags* conn);

struct MeshCreateFlags {
  std::string name;
  std::string shape;            // "2x2"
  std::string dims;             // "dp,tp"; empty: unnamed.
  std::string workers = "all";  // "all" or "w1,w2,..." in row-major order of positions.
};

// The request the flags describe. INVALID_ARGUMENT "--flag: ..." for bad flags.
absl::StatusOr<v1::CreateMeshRequest> BuildCreateMeshRequest(const MeshCreateFlags& flags);

// Each returns the exit status: 0, 1 (the coordinator refused), 2 (bad flags).
int RunMeshCreateCommand(CoordinatorClient& client, const MeshCreateFlags& flags, bool json,
                         std::ostream& out, std::ostream& err);
int RunMeshListCommand(CoordinatorClient& client, bool json, std::ostream& out, std::ostream& err);
int RunMeshGetCommand(CoordinatorClient& client, const std::string& name, bool json,
                      std::ostream& out, std::ostream& err);
int RunMeshDeleteCommand(CoordinatorClient& client, const std::string& name, bool json,
                         std::ostream& out, std::ostream& err);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_MESH_COMMAND_H_
