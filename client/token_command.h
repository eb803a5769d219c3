#ifndef SHARDCOORD_CLIENT_TOKEN_COMMAND_H_
#define SHARDCOORD_CLIENT_TOKEN_COMMAND_H_

#include <istream>
#include <ostream>

namespace CLI {
class App;
}  // namespace CLI

namespace shardcoord {

// Registers `shardctl token hash`: reads a token from stdin and prints the hex SHA-256 that
// a line of the coordinator's --auth-tokens file holds. Needs no coordinator.
void AddTokenCommand(CLI::App& app);

// Reads all of `in`, drops trailing newlines and spaces (TrimToken) and prints the hash on
// `out`; an empty token is a flag error (2) on `err`. Returns the exit status.
int RunTokenHashCommand(std::istream& in, std::ostream& out, std::ostream& err);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_TOKEN_COMMAND_H_
