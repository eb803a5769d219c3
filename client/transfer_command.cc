#include "client/transfer_command.h"

#include <iostream>
#include <memory>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/command_util.h"
#include "client/tensor_command.h"
#include "common/json_writer.h"

namespace shardcoord {

absl::StatusOr<v1::CreateTransferRequest> BuildCreateTransferRequest(const std::string& name,
                                                                     absl::string_view json) {
  // The same file as `tensor copy --from-file`, checked the same way.
  absl::StatusOr<v1::CopyGroupRequest> copies = ParseCopiesJson(json);
  if (!copies.ok()) return copies.status();
  v1::CreateTransferRequest request;
  request.set_name(name);
  *request.mutable_copies() = std::move(*copies->mutable_copies());
  return request;
}

std::string TransferRunJson(const v1::RunTransferResponse& r) {
  JsonWriter w;
  w.BeginObject()
      .Key("name")
      .String(r.name())
      .Key("run_id")
      .String(r.run_id())
      .Key("state")
      .String(v1::PlanState_Name(r.state()))
      .Key("seconds")
      .Double(r.seconds())
      .Key("bytes_moved")
      .Int(r.bytes_moved())
      .Key("lower_bound_bytes")
      .Int(r.lower_bound_bytes())
      .Key("members")
      .Int(r.members())
      .Key("replanned")
      .Bool(r.replanned())
      .Key("version")
      .Int(r.version())
      .Key("prepare_seconds")
      .Double(r.prepare_seconds())
      .EndObject();
  return w.str();
}

std::string TransferRunText(const v1::RunTransferResponse& r) {
  std::string out = absl::StrFormat(
      "ran transfer %s (run %s): %s in %.3f s, %d tensors at version %d\n", r.name(), r.run_id(),
      v1::PlanState_Name(r.state()), r.seconds(), r.members(), r.version());
  absl::StrAppend(&out, "  ", HumanBytes(r.bytes_moved()), " moved (lower bound ",
                  HumanBytes(r.lower_bound_bytes()), ")\n");
  if (r.replanned()) {
    absl::StrAppend(&out,
                    absl::StrFormat("  prepared again first in %.3f s\n", r.prepare_seconds()));
  }
  return out;
}

std::string TransferInfoJson(const v1::TransferInfo& t) {
  JsonWriter w;
  w.BeginObject()
      .Key("name")
      .String(t.name())
      .Key("members")
      .Int(t.members())
      .Key("prepared")
      .Bool(t.prepared())
      .Key("invalid_reason")
      .String(t.invalid_reason())
      .Key("runs")
      .Int(t.runs())
      .Key("replans")
      .Int(t.replans())
      .Key("version")
      .Int(t.version())
      .Key("participants")
      .Int(t.participants())
      .Key("templates")
      .Int(t.templates())
      .Key("layouts")
      .Int(t.layouts())
      .Key("bytes")
      .Int(t.bytes())
      .Key("bytes_moved")
      .Int(t.bytes_moved())
      .Key("lower_bound_bytes")
      .Int(t.lower_bound_bytes())
      .Key("max_rank_send_bytes")
      .Int(t.max_rank_send_bytes())
      .Key("max_rank_recv_bytes")
      .Int(t.max_rank_recv_bytes())
      .Key("prepare_seconds")
      .Double(t.prepare_seconds())
      .Key("last_run_id")
      .String(t.last_run_id())
      .Key("last_run_state")
      .String(t.last_run_id().empty() ? "" : v1::PlanState_Name(t.last_run_state()))
      .Key("last_run_seconds")
      .Double(t.last_run_seconds())
      .Key("last_error")
      .String(t.last_error())
      .Key("running")
      .Bool(t.running());
  if (t.copies_size() > 0) {
    w.Key("copies").BeginArray();
    for (const v1::CopyPair& c : t.copies()) {
      w.BeginObject().Key("src").String(c.src()).Key("dst").String(c.dst()).EndObject();
    }
    w.EndArray();
  }
  w.EndObject();
  return w.str();
}

std::string TransferInfoText(const v1::TransferInfo& t) {
  std::string out =
      absl::StrCat("transfer ", t.name(), ": ", t.members(), " tensors, ", HumanBytes(t.bytes()),
                   ", ", t.running() ? "running" : (t.prepared() ? "prepared" : "not prepared"),
                   t.prepared() ? "" : absl::StrCat(" (", t.invalid_reason(), ")"), "\n");
  absl::StrAppend(&out, "  runs ", t.runs(), ", version ", t.version(), ", prepared again ",
                  t.replans(), " times\n");
  absl::StrAppend(&out, "  ", t.participants(), " workers, ", t.templates(), " shapes over ",
                  t.layouts(), " layouts; a run moves ", HumanBytes(t.bytes_moved()),
                  " (lower bound ", HumanBytes(t.lower_bound_bytes()), "), at most ",
                  HumanBytes(t.max_rank_send_bytes()), " sent and ",
                  HumanBytes(t.max_rank_recv_bytes()), " received by one worker\n");
  absl::StrAppend(&out, absl::StrFormat("  last preparation %.3f s", t.prepare_seconds()));
  if (!t.last_run_id().empty()) {
    absl::StrAppend(&out,
                    absl::StrFormat("; last run %s %s in %.3f s", t.last_run_id(),
                                    v1::PlanState_Name(t.last_run_state()), t.last_run_seconds()));
  }
  absl::StrAppend(&out, "\n");
  if (!t.last_error().empty()) absl::StrAppend(&out, "  last error: ", t.last_error(), "\n");
  for (const v1::CopyPair& c : t.copies()) {
    absl::StrAppend(&out, "  ", c.src(), " -> ", c.dst(), "\n");
  }
  return out;
}

std::string TransfersTable(const std::vector<v1::TransferInfo>& transfers) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "TENSORS", "BYTES", "STATE", "RUNS", "VERSION", "LAST RUN"}};
  for (const v1::TransferInfo& t : transfers) {
    rows.push_back(
        {t.name(), absl::StrCat(t.members()), HumanBytes(t.bytes()),
         t.running() ? "running" : (t.prepared() ? "prepared" : "not prepared"),
         absl::StrCat(t.runs()), absl::StrCat(t.version()),
         t.last_run_id().empty()
             ? "-"
             : absl::StrCat(t.last_run_id(), " ", v1::PlanState_Name(t.last_run_state()))});
  }
  return FormatTable(rows, {1, 2, 4, 5});
}

int RunTransferCreateCommand(CoordinatorClient& client, const std::string& name,
                             const std::string& from_file, bool json, std::ostream& out,
                             std::ostream& err) {
  if (from_file.empty()) return ReportFlagError(err, "transfer create", "--from-file is required");
  absl::StatusOr<v1::CreateTransferRequest> request = ParseFlagFile(
      from_file,
      [&name](const std::string& text) { return BuildCreateTransferRequest(name, text); });
  if (!request.ok()) return ReportFlagError(err, "transfer create", request.status().message());
  absl::StatusOr<v1::TransferInfo> info = client.CreateTransfer(*request);
  if (!info.ok()) return ReportStatus(err, info.status(), client.address());
  out << (json ? TransferInfoJson(*info) + "\n" : TransferInfoText(*info));
  return 0;
}

int RunTransferRunCommand(CoordinatorClient& client, const std::string& name, bool json,
                          std::ostream& out, std::ostream& err) {
  v1::RunTransferRequest request;
  request.set_name(name);
  request.set_wait(true);
  absl::StatusOr<v1::RunTransferResponse> run = client.RunTransfer(request);
  if (!run.ok()) return ReportStatus(err, run.status(), client.address());
  out << (json ? TransferRunJson(*run) + "\n" : TransferRunText(*run));
  return 0;
}

int RunTransferListCommand(CoordinatorClient& client, bool json, std::ostream& out,
                           std::ostream& err) {
  absl::StatusOr<std::vector<v1::TransferInfo>> transfers = client.ListTransfers();
  if (!transfers.ok()) return ReportStatus(err, transfers.status(), client.address());
  if (!json) {
    out << TransfersTable(*transfers);
    return 0;
  }
  out << "[";
  for (size_t i = 0; i < transfers->size(); ++i) {
    out << (i == 0 ? "" : ", ") << TransferInfoJson((*transfers)[i]);
  }
  out << "]\n";
  return 0;
}

int RunTransferShowCommand(CoordinatorClient& client, const std::string& name, bool json,
                           std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::TransferInfo> info = client.GetTransfer(name, /*copies=*/true);
  if (!info.ok()) return ReportStatus(err, info.status(), client.address());
  out << (json ? TransferInfoJson(*info) + "\n" : TransferInfoText(*info));
  return 0;
}

int RunTransferDeleteCommand(CoordinatorClient& client, const std::string& name, bool json,
                             std::ostream& out, std::ostream& err) {
  absl::Status s = client.DeleteTransfer(name);
  if (!s.ok()) return ReportStatus(err, s, client.address());
  return ReportDeleted(out, json, "transfer", name);
}

void AddTransferCommand(CLI::App& app, const ConnectionFlags* conn) {
  CLI::App* transfer = app.add_subcommand(
      "transfer",
      "Prepared transfers: a weight sync (copies, as `tensor copy --from-file`) checked, "
      "planned and left on the workers once, then run every step with one message per worker");
  transfer->require_subcommand(1);
  auto add_name = [](CLI::App* cmd, std::string* name) {
    cmd->add_option("name", *name, "Transfer name")->required()->type_name("NAME");
  };
  {
    CLI::App* cmd = transfer->add_subcommand(
        "create", "Check and prepare a transfer: every worker keeps its part; nothing moves yet");
    auto name = std::make_shared<std::string>();
    auto from_file = std::make_shared<std::string>();
    add_name(cmd, name.get());
    cmd->add_option("--from-file", *from_file,
                    "JSON {\"copies\": [{\"src\": \"a\", \"dst\": \"b\"}, ...]} (the file of "
                    "`tensor copy --from-file`), at most 100,000 copies")
        ->required()
        ->type_name("PATH");
    cmd->callback([conn, name, from_file]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(
          RunTransferCreateCommand(client, *name, *from_file, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = transfer->add_subcommand(
        "run",
        "Run a transfer once and wait: every dst gets its src's values and one new version, all "
        "or nothing (prepared again first when a member or worker changed)");
    auto name = std::make_shared<std::string>();
    add_name(cmd, name.get());
    cmd->callback([conn, name]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunTransferRunCommand(client, *name, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = transfer->add_subcommand("list", "List transfers (every page)");
    cmd->callback([conn]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunTransferListCommand(client, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = transfer->add_subcommand(
        "show", "A transfer: whether it is prepared (else why not), its runs, what a run moves");
    auto name = std::make_shared<std::string>();
    add_name(cmd, name.get());
    cmd->callback([conn, name]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunTransferShowCommand(client, *name, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = transfer->add_subcommand(
        "delete", "Delete a transfer (its workers drop their parts; the tensors stay)");
    auto name = std::make_shared<std::string>();
    add_name(cmd, name.get());
    cmd->callback([conn, name]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunTransferDeleteCommand(client, *name, conn->json, std::cout, std::cerr));
    });
  }
}

}  // namespace shardcoord
