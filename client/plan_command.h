#ifndef SHARDCOORD_CLIENT_PLAN_COMMAND_H_
#define SHARDCOORD_CLIENT_PLAN_COMMAND_H_

#include <optional>
#include <ostream>
#include <string>

#include "client/coordinator_client.h"
#include "client/plan_format.h"

namespace CLI {
class App;
}  // namespace CLI

namespace shardcoord {

struct ConnectionFlags;

// Registers `shardctl plan`: without a tensor name, plans offline from layout flags (no
// daemon); with one, asks the coordinator for the plan a redistribute would run.
void AddPlanCommand(CLI::App& app, const ConnectionFlags* conn);

// `shardctl plan trace PLAN_ID --out FILE`: the plan's timeline as Chrome trace JSON.
int RunPlanTraceCommand(CoordinatorClient& client, const std::string& plan_id,
                        const std::string& out_path, std::ostream& out, std::ostream& err);

// `shardctl plan list [--limit N]`: recent plans as a table or JSON.
int RunPlanListCommand(CoordinatorClient& client, int64_t limit, bool json, std::ostream& out,
                       std::ostream& err);

// Offline: the plan as JSON, or a summary (with --explain: the planner's explanation).
// Returns 0, or 2 with one line "shardctl plan: --flag: problem" on `err`.
int RunOfflinePlanCommand(const PlanFlags& flags, bool explain, bool json, std::ostream& out,
                          std::ostream& err);

struct OnlinePlanFlags {
  std::string tensor;
  std::string mesh;  // Target mesh name; empty: the tensor's.
  std::optional<std::string> placements;
  std::optional<std::string> flat;
};
// Online: 0, 1 (the coordinator refused) or 2 (bad flags).
int RunOnlinePlanCommand(CoordinatorClient& client, const OnlinePlanFlags& flags, bool explain,
                         bool json, std::ostream& out, std::ostream& err);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_PLAN_COMMAND_H_
