#ifndef SHARDCOORD_CLIENT_WORKERS_COMMAND_H_
#define SHARDCOORD_CLIENT_WORKERS_COMMAND_H_

#include <ostream>

#include "client/coordinator_client.h"

namespace CLI {
class App;
}  // namespace CLI

namespace shardcoord {

struct ConnectionFlags;

// Registers `shardctl workers`: the coordinator's workers with their health.
void AddWorkersCommand(CLI::App& app, const ConnectionFlags* conn);

// Prints the table (or JSON) on `out`; on error one line on `err`. Returns the exit status.
int RunWorkersCommand(CoordinatorClient& client, bool json, std::ostream& out, std::ostream& err);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_WORKERS_COMMAND_H_
