#include "client/mesh_command.h"

#include <iostream>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/command_util.h"
#include "client/coordinator_format.h"
#include "client/layout_format.h"
#include "common/json_writer.h"

namespace shardcoord {

absl::StatusOr<v1::CreateMeshRequest> BuildCreateMeshRequest(const MeshCreateFlags& flags) {
  v1::CreateMeshRequest request;
  if (flags.name.empty()) return absl::InvalidArgumentError("NAME: the mesh needs a name");
  request.set_name(flags.name);
  absl::StatusOr<SizedMeshShape> mesh = ParseSizedMeshShape(flags.shape);
  if (!mesh.ok())
    return absl::InvalidArgumentError(absl::StrCat("--shape: ", mesh.status().message()));
  for (int64_t d : mesh->shape) request.add_shape(d);
  const std::vector<std::string> dims = ParseNameList(flags.dims);
  if (!dims.empty() && dims.size() != mesh->shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dims: ", dims.size(), " names for a ", mesh->shape.size(), "-d mesh"));
  }
  for (const std::string& d : dims) request.add_dim_names(d);
  if (absl::StripAsciiWhitespace(flags.workers) != "all") {
    const std::vector<std::string> workers = ParseNameList(flags.workers);
    if (static_cast<int64_t>(workers.size()) != mesh->size) {
      return absl::InvalidArgumentError(absl::StrCat("--workers: ", workers.size(),
                                                     " workers for a mesh of ", mesh->size,
                                                     " positions (or give 'all')"));
    }
    for (const std::string& w : workers) {
      if (w.empty()) return absl::InvalidArgumentError("--workers: empty worker name");
      request.add_workers(w);
    }
  }
  return request;
}

int RunMeshCreateCommand(CoordinatorClient& client, const MeshCreateFlags& flags, bool json,
                         std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::CreateMeshRequest> request = BuildCreateMeshRequest(flags);
  if (!request.ok()) return ReportFlagError(err, "mesh create", request.status().message());
  absl::StatusOr<v1::MeshInfo> mesh = client.CreateMesh(*request);
  if (!mesh.ok()) return ReportStatus(err, mesh.status(), client.address());
  out << (json ? MeshJson(*mesh) + "\n" : MeshText(*mesh));
  return 0;
}

int RunMeshListCommand(CoordinatorClient& client, bool json, std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::vector<v1::MeshInfo>> meshes = client.ListMeshes();
  if (!meshes.ok()) return ReportStatus(err, meshes.status(), client.address());
  out << (json ? MeshesJson(*meshes) + "\n" : MeshesTable(*meshes));
  return 0;
}

int RunMeshGetCommand(CoordinatorClient& client, const std::string& name, bool json,
                      std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::MeshInfo> mesh = client.GetMesh(name);
  if (!mesh.ok()) return ReportStatus(err, mesh.status(), client.address());
  out << (json ? MeshJson(*mesh) + "\n" : MeshText(*mesh));
  return 0;
}

int RunMeshDeleteCommand(CoordinatorClient& client, const std::string& name, bool json,
                         std::ostream& out, std::ostream& err) {
  absl::Status s = client.DeleteMesh(name);
  if (!s.ok()) return ReportStatus(err, s, client.address());
  return ReportDeleted(out, json, "mesh", name);
}

void AddMeshCommand(CLI::App& app, const ConnectionFlags* conn) {
  CLI::App* mesh = app.add_subcommand("mesh", "Create, list, show and delete device meshes");
  mesh->require_subcommand(1);

  {
    CLI::App* cmd = mesh->add_subcommand("create", "Create a mesh over registered workers");
    auto flags = std::make_shared<MeshCreateFlags>();
    cmd->add_option("name", flags->name, "Mesh name")->required()->type_name("NAME");
    cmd->add_option("--shape", flags->shape, "Mesh shape, dims separated by 'x': 4, 2x2")
        ->required()
        ->type_name("SHAPE");
    cmd->add_option("--dims", flags->dims, "Mesh dim names, comma-separated: dp,tp")
        ->type_name("NAMES");
    cmd->add_option("--workers", flags->workers,
                    "'all' (live workers in rank order) or worker names, one per position in "
                    "row-major order: w0,w1,w2,w3")
        ->capture_default_str()
        ->type_name("LIST");
    cmd->callback([conn, flags]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunMeshCreateCommand(client, *flags, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = mesh->add_subcommand("list", "List meshes");
    cmd->callback([conn]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunMeshListCommand(client, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd =
        mesh->add_subcommand("get", "Show one mesh: its shape and the worker at each position");
    auto name = std::make_shared<std::string>();
    cmd->add_option("name", *name, "Mesh name")->required()->type_name("NAME");
    cmd->callback([conn, name]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunMeshGetCommand(client, *name, conn->json, std::cout, std::cerr));
    });
  }
  {
    CLI::App* cmd = mesh->add_subcommand("delete", "Delete a mesh that no tensor lives on");
    auto name = std::make_shared<std::string>();
    cmd->add_option("name", *name, "Mesh name")->required()->type_name("NAME");
    cmd->callback([conn, name]() {
      CoordinatorClient client(CoordinatorAddress(*conn), ClientOptions(*conn));
      FinishCommand(RunMeshDeleteCommand(client, *name, conn->json, std::cout, std::cerr));
    });
  }
}

}  // namespace shardcoord
