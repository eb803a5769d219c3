#ifndef SHARDCOORD_CLIENT_TRANSFER_COMMAND_H_
#define SHARDCOORD_CLIENT_TRANSFER_COMMAND_H_

// `shardctl transfer create|run|list|show|delete`: prepared transfers (issue 27), a weight
// sync checked, planned and admitted once and run every RL step. Each Run* function does one
// subcommand once its flags are parsed and returns the exit status: 0, 1 when the
// coordinator (or the file system) refused, 2 for bad flags.

#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "client/coordinator_client.h"

namespace CLI {
class App;
}  // namespace CLI

namespace shardcoord {

struct ConnectionFlags;

void AddTransferCommand(CLI::App& app, const ConnectionFlags* conn);

// The CreateTransferRequest of NAME and a copies file's text (the file of `tensor copy
// --from-file`: {"copies": [{"src": "a", "dst": "b"}, ...]}); INVALID_ARGUMENT naming what is
// wrong.
absl::StatusOr<v1::CreateTransferRequest> BuildCreateTransferRequest(const std::string& name,
                                                                     absl::string_view json);

int RunTransferCreateCommand(CoordinatorClient& client, const std::string& name,
                             const std::string& from_file, bool json, std::ostream& out,
                             std::ostream& err);
// Runs once and waits. --json: {"name", "run_id", "state", "seconds", "bytes_moved",
// "lower_bound_bytes", "members", "replanned", "version", "prepare_seconds"}.
int RunTransferRunCommand(CoordinatorClient& client, const std::string& name, bool json,
                          std::ostream& out, std::ostream& err);
int RunTransferListCommand(CoordinatorClient& client, bool json, std::ostream& out,
                           std::ostream& err);
int RunTransferShowCommand(CoordinatorClient& client, const std::string& name, bool json,
                           std::ostream& out, std::ostream& err);
int RunTransferDeleteCommand(CoordinatorClient& client, const std::string& name, bool json,
                             std::ostream& out, std::ostream& err);

// Formats (no I/O).
std::string TransferRunJson(const v1::RunTransferResponse& r);
std::string TransferRunText(const v1::RunTransferResponse& r);
std::string TransferInfoJson(const v1::TransferInfo& t);
std::string TransferInfoText(const v1::TransferInfo& t);
std::string TransfersTable(const std::vector<v1::TransferInfo>& transfers);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_TRANSFER_COMMAND_H_
