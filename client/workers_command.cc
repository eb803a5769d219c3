#include "client/workers_command.h"

#include <iostream>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "client/command_util.h"
#include "client/coordinator_format.h"

namespace shardcoord {

int RunWorkersCommand(CoordinatorClient& client, bool json, std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
  if (!workers.ok()) return ReportStatus(err, workers.status(), client.address());
  if (json) {
    out << WorkersJson(*workers) << "\n";
  } else {
    out << WorkersTable(*workers, absl::ToUnixMillis(absl::Now()));
  }
  return 0;
}

void AddWorkersCommand(CLI::App& app, const ConnectionFlags* conn) {
  CLI::App* cmd = app.add_subcommand("workers", "List the workers registered with the coordinator");
  cmd->callback([conn]() {
    CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
    const int rc = RunWorkersCommand(client, conn->json, std::cout, std::cerr);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace shardcoord
