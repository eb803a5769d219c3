// shardctl: the shardcoord command-line client. Each subcommand lives in its own
// *_command.cc and registers itself here.

#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_replace.h"
#include "client/layout_command.h"
#include "client/mesh_command.h"
#include "client/plan_command.h"
#include "client/tensor_command.h"
#include "client/workers_command.h"

int main(int argc, char** argv) {
  CLI::App app{"shardctl: inspect and drive shardcoord sharding layouts.", "shardctl"};
  app.require_subcommand(1);
  shardcoord::AddLayoutCommand(app);
  shardcoord::AddWorkersCommand(app);
  shardcoord::AddMeshCommand(app);
  shardcoord::AddTensorCommand(app);
  shardcoord::AddPlanCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help goes to stdout with status 0; a subcommand has already reported its own errors.
    if (e.get_exit_code() == 0 || e.get_name() == "RuntimeError") return app.exit(e);
    // Usage errors: one line naming the flag, status 2, like the subcommands' own errors.
    std::cerr << "shardctl: " << absl::StrReplaceAll(e.what(), {{"\n", " "}}) << "\n";
    return 2;
  }
  return 0;
}
