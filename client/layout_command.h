#ifndef SHARDCOORD_CLIENT_LAYOUT_COMMAND_H_
#define SHARDCOORD_CLIENT_LAYOUT_COMMAND_H_

#include <ostream>

#include "client/layout_format.h"

namespace CLI {
class App;
}  // namespace CLI

namespace shardcoord {

struct ConnectionFlags;

// Registers `shardctl layout` (offline: no daemon) as a subcommand of `app`. On bad input the
// subcommand prints one line to stderr and throws CLI::RuntimeError(2) for main to return.
void AddLayoutCommand(CLI::App& app, const ConnectionFlags* conn);

// What the subcommand does once its flags are parsed: the JSON (`json`) or the table and
// picture on `out` and exit status 0, or one line "shardctl layout: --flag: problem" on `err`
// and exit status 2.
int RunLayoutCommand(const LayoutFlags& flags, bool json, std::ostream& out, std::ostream& err);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_LAYOUT_COMMAND_H_
