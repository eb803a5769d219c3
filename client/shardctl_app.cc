#include "client/shardctl_app.h"

#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "client/checkpoint_command.h"
#include "client/command_util.h"
#include "client/layout_command.h"
#include "client/mesh_command.h"
#include "client/plan_command.h"
#include "client/tensor_command.h"
#include "client/token_command.h"
#include "client/transfer_command.h"
#include "client/version.h"
#include "client/workers_command.h"

namespace shardcoord {

int ShardctlMain(int argc, const char* const* argv) {
  // Declared before the app: the subcommands' callbacks read it during parse.
  ConnectionFlags globals;
  CLI::App app{"shardctl: inspect and drive shardcoord sharding layouts.", "shardctl"};
  app.require_subcommand(1);
  AddGlobalFlags(&app, &globals);
  app.set_version_flag("--version", absl::StrCat("shardctl ", kShardctlVersion),
                       "Print the shardctl version and exit")
      ->group(kGlobalFlagsGroup);
  AddLayoutCommand(app, &globals);
  AddWorkersCommand(app, &globals);
  AddMeshCommand(app, &globals);
  AddTensorCommand(app, &globals);
  AddPlanCommand(app, &globals);
  AddTransferCommand(app, &globals);
  AddCheckpointCommand(app, &globals);
  AddTokenCommand(app);
  DescribeGlobalFlags(&app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and version go to stdout with status 0; a subcommand has already reported its
    // own errors.
    if (e.get_exit_code() == 0 || e.get_name() == "RuntimeError") {
      return app.exit(e, std::cout, std::cerr);
    }
    // Usage errors: one line naming the flag, status 2, like the subcommands' own errors.
    std::cerr << "shardctl: " << absl::StrReplaceAll(e.what(), {{"\n", " "}}) << "\n";
    return kExitBadFlags;
  }
  return 0;
}

}  // namespace shardcoord
