#include "client/plan_command.h"

#include <fstream>
#include <iostream>
#include <memory>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/command_util.h"
#include "client/coordinator_format.h"
#include "client/tensor_command.h"
#include "proto/convert.h"
#include "proto/plan_trace.h"
#include "sharding/planner.h"

namespace shardcoord {

int RunOfflinePlanCommand(const PlanFlags& flags, bool explain, bool json, std::ostream& out,
                          std::ostream& err) {
  absl::StatusOr<PlanInput> input = BuildPlanInput(flags);
  if (!input.ok()) return ReportFlagError(err, "plan", input.status().message());
  absl::StatusOr<Plan> plan =
      Redistribute(input->source, input->target, input->dtype, input->options);
  // The layouts are valid, so a refusal is about their combination (e.g. shapes): a flag error.
  if (!plan.ok()) return ReportFlagError(err, "plan", plan.status().message());
  if (json) {
    out << PlanJson(*plan) << "\n";
  } else if (explain) {
    out << ExplainPlan(*plan);
  } else {
    out << "plan " << ShapeToString(input->source.global_shape()) << " " << DTypeName(input->dtype)
        << ": " << input->source.SpecString() << " -> " << input->target.SpecString() << "\n"
        << PlanText(PlanToProto(*plan, "", ""), /*explain=*/false);
  }
  return 0;
}

int RunOnlinePlanCommand(CoordinatorClient& client, const OnlinePlanFlags& flags, bool explain,
                         bool json, std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::ShardingSpec> spec = BuildSpec(flags.mesh, flags.placements, flags.flat);
  if (!spec.ok()) return ReportFlagError(err, "plan", spec.status().message());
  v1::PlanRequest request;
  request.set_tensor(flags.tensor);
  *request.mutable_target() = *std::move(spec);
  absl::StatusOr<v1::Plan> plan = client.PlanRedistribute(request);
  if (!plan.ok()) return ReportStatus(err, plan.status(), client.address());
  if (json) {
    out << PlanJson(*plan) << "\n";
  } else if (explain && !plan->explain().empty()) {
    out << plan->explain();
    if (plan->explain().back() != '\n') out << "\n";
  } else {
    out << PlanText(*plan, explain);
  }
  return 0;
}

int RunPlanTraceCommand(CoordinatorClient& client, const std::string& plan_id,
                        const std::string& out_path, std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::PlanTrace> trace = client.GetPlanTrace(plan_id);
  if (!trace.ok()) return ReportStatus(err, trace.status(), client.address());
  std::ofstream file(out_path, std::ios::binary | std::ios::trunc);
  file << ChromeTraceJson(*trace) << "\n";
  file.close();
  if (!file) {
    return ReportFlagError(err, "plan trace", absl::StrCat("--out: cannot write '", out_path, "'"));
  }
  int64_t steps = 0;
  for (const v1::RankTrace& r : trace->ranks()) steps += r.steps_size();
  out << "wrote " << out_path << ": plan " << trace->plan_id() << " ("
      << v1::PlanState_Name(trace->state()) << "), " << trace->ranks_size() << " ranks, " << steps
      << " steps; open it in https://ui.perfetto.dev\n";
  return 0;
}

int RunPlanListCommand(CoordinatorClient& client, int64_t limit, bool json, std::ostream& out,
                       std::ostream& err) {
  if (limit < 0) return ReportFlagError(err, "plan list", absl::StrCat("--limit: ", limit, " < 0"));
  absl::StatusOr<v1::ListPlansResponse> plans = client.ListPlans(limit);
  if (!plans.ok()) return ReportStatus(err, plans.status(), client.address());
  out << (json ? PlansJson(*plans) + "\n" : PlansTable(*plans));
  return 0;
}

void AddPlanCommand(CLI::App& app, const ConnectionFlags* conn) {
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Show the plan that moves a tensor between layouts. Offline (no TENSOR): the source as "
      "for `layout` and the target as --to-* flags, each defaulting to the source's. Online "
      "(TENSOR given): asks the coordinator, with --mesh naming the target mesh.");
  auto tensor = std::make_shared<std::string>();
  auto flags = std::make_shared<PlanFlags>();
  auto explain = std::make_shared<bool>(false);
  cmd->add_option("tensor", *tensor, "Tensor on the coordinator (online plan)")
      ->type_name("TENSOR");
  CLI::Option* mesh = cmd->add_option(
      "--mesh", flags->source.mesh,
      "Offline: source mesh shape (2x4). Online: target mesh name (default: the tensor's)");
  mesh->type_name("MESH");
  std::vector<CLI::Option*> offline_only;
  offline_only.push_back(
      cmd->add_option("--ranks", flags->source.ranks,
                      "Source global rank at each mesh position (default 0..size-1)")
          ->type_name("LIST"));
  offline_only.push_back(
      cmd->add_option("--dims", flags->source.dims, "Source mesh dim names: dp,tp")
          ->type_name("NAMES"));
  CLI::Option* shape = cmd->add_option("--shape", flags->source.shape,
                                       "Global tensor shape, comma-separated: 64,48");
  shape->type_name("DIMS");
  offline_only.push_back(shape);
  offline_only.push_back(cmd->add_option("--dtype", flags->source.dtype,
                                         absl::StrCat(DTypeNameList(), " (default f32)"))
                             ->type_name("TYPE"));
  CLI::Option* placements = cmd->add_option(
      "--placements", "Offline: source placements (S(0),R). Online: target placements");
  placements->type_name("SPEC");
  CLI::Option* flat = cmd->add_option(
      "--flat", "Offline: source flat ranges ('0:4;4:8'). Online: target flat ranges");
  flat->type_name("SPEC");
  CLI::Option* to_mesh = cmd->add_option("--to-mesh", "Target mesh shape (default: --mesh)");
  to_mesh->type_name("SHAPE");
  CLI::Option* to_ranks = cmd->add_option(
      "--to-ranks", "Target ranks (default: the source's when the sizes match, else 0..n-1)");
  to_ranks->type_name("LIST");
  CLI::Option* to_dims = cmd->add_option("--to-dims", "Target mesh dim names");
  to_dims->type_name("NAMES");
  CLI::Option* to_placements =
      cmd->add_option("--to-placements", "Target placements (default: the source's)");
  to_placements->type_name("SPEC");
  CLI::Option* to_flat = cmd->add_option("--to-flat", "Target flat ranges");
  to_flat->type_name("SPEC");
  for (CLI::Option* o : {to_mesh, to_ranks, to_dims, to_placements, to_flat}) {
    offline_only.push_back(o);
  }
  offline_only.push_back(
      cmd->add_option("--hosts", flags->hosts,
                      "Host of each global rank 0,1,...: h0,h0,h1,h1 (same-host senders are "
                      "preferred and links priced accordingly)")
          ->type_name("NAMES"));
  offline_only.push_back(
      cmd->add_option("--cost", flags->cost,
                      "Cost model: intra_alpha_us, intra_gbps, inter_alpha_us, inter_gbps, "
                      "e.g. 'intra_gbps=100,inter_gbps=25'")
          ->type_name("PARAMS"));
  cmd->add_flag("--explain", *explain, "Steps, per-rank bytes and estimated time");
  // The global flag lives on the root app (`app`), which subcommands fall through to.
  CLI::Option* coordinator = app.get_option("--coordinator");

  {
    CLI::App* trace = cmd->add_subcommand(
        "trace",
        "Write a plan's timeline (each rank's steps, the coordinator's phases) as Chrome trace "
        "JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open");
    auto plan_id = std::make_shared<std::string>();
    auto out_path = std::make_shared<std::string>();
    trace->add_option("plan_id", *plan_id, "Plan id, as redistribute and copy print it")
        ->required()
        ->type_name("PLAN_ID");
    trace->add_option("--out", *out_path, "Output file (trace.json)")
        ->required()
        ->type_name("PATH");
    trace->callback([conn, plan_id, out_path]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      const int rc = RunPlanTraceCommand(client, *plan_id, *out_path, std::cout, std::cerr);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  {
    CLI::App* list = cmd->add_subcommand(
        "list", "List recent plans, newest first: running ones and the last ended ones");
    auto limit = std::make_shared<int64_t>(0);
    list->add_option("--limit", *limit, "At most this many (0: the coordinator's default, 100)")
        ->capture_default_str();
    list->callback([conn, limit]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      const int rc = RunPlanListCommand(client, *limit, conn->json, std::cout, std::cerr);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  cmd->callback([=]() {
    // `plan trace` or `plan list` ran instead.
    if (cmd->got_subcommand("trace") || cmd->got_subcommand("list")) return;
    auto value = [](const CLI::Option* o) -> std::optional<std::string> {
      if (o->count() == 0) return std::nullopt;
      return o->as<std::string>();
    };
    int rc;
    if (tensor->empty()) {
      if (coordinator->count() > 0) {
        rc = ReportFlagError(std::cerr, "plan",
                             "--coordinator: offline plans need no coordinator (give a tensor "
                             "name to ask one)");
      } else if (mesh->count() == 0 || shape->count() == 0) {
        rc = ReportFlagError(std::cerr, "plan",
                             mesh->count() == 0
                                 ? "--mesh: an offline plan needs the source mesh shape (or give "
                                   "a tensor name to ask the coordinator)"
                                 : "--shape: an offline plan needs the tensor shape");
      } else {
        flags->source.placements = value(placements);
        flags->source.flat = value(flat);
        flags->to_mesh = value(to_mesh);
        flags->to_ranks = value(to_ranks);
        flags->to_dims = value(to_dims);
        flags->to_placements = value(to_placements);
        flags->to_flat = value(to_flat);
        rc = RunOfflinePlanCommand(*flags, *explain, conn->json, std::cout, std::cerr);
      }
    } else {
      rc = 0;
      for (const CLI::Option* o : offline_only) {
        if (o->count() > 0) {
          rc = ReportFlagError(std::cerr, "plan",
                               absl::StrCat(o->get_name(),
                                            ": only for offline plans (the "
                                            "coordinator knows the tensor's source layout)"));
          break;
        }
      }
      if (rc == 0) {
        OnlinePlanFlags online;
        online.tensor = *tensor;
        online.mesh = flags->source.mesh;
        online.placements = value(placements);
        online.flat = value(flat);
        CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
        rc = RunOnlinePlanCommand(client, online, *explain, conn->json, std::cout, std::cerr);
      }
    }
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace shardcoord
