#include "client/layout_command.h"

#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/command_util.h"
#include "client/layout_format.h"
#include "sharding/dtype.h"

namespace shardcoord {

int RunLayoutCommand(const LayoutFlags& flags, bool json, std::ostream& out, std::ostream& err) {
  absl::StatusOr<LayoutRequest> request = BuildLayout(flags);
  if (!request.ok()) {
    err << "shardctl layout: " << request.status().message() << "\n";
    return 2;
  }
  if (json) {
    out << LayoutJson(request->layout) << "\n";
    return 0;
  }
  out << LayoutTable(request->layout, request->dtype);
  const std::string picture = LayoutPicture(request->layout);
  if (!picture.empty()) out << "\n" << picture;
  return 0;
}

void AddLayoutCommand(CLI::App& app, const ConnectionFlags* conn) {
  CLI::App* cmd = app.add_subcommand(
      "layout",
      "Show which rank holds which block of a tensor under a sharding spec (offline, no "
      "daemon). Give exactly one of --placements or --flat. With the global --json, prints "
      "{\"chunks\": [{\"rank\", \"coord\", \"offset\", \"shape\"}, ...]} instead of the "
      "table and picture.");
  // Owned by the callback, which CLI11 keeps alive as long as the app.
  auto flags = std::make_shared<LayoutFlags>();
  cmd->add_option("--mesh", flags->mesh, "Device mesh shape, dims separated by 'x': 8, 2x4, 2x2x2")
      ->required()
      ->type_name("SHAPE");
  cmd->add_option("--ranks", flags->ranks,
                  "Global rank at each mesh position in row-major order, comma-separated "
                  "(default 0,1,...,size-1); one per position, distinct, non-negative")
      ->type_name("LIST");
  cmd->add_option("--dims", flags->dims, "Mesh dim names, one per mesh dim, comma-separated: dp,tp")
      ->type_name("NAMES");
  cmd->add_option("--shape", flags->shape,
                  "Global tensor shape, comma-separated: 8,4 (empty string for a scalar)")
      ->required()
      ->type_name("DIMS");
  CLI::Option* placements =
      cmd->add_option("--placements",
                      "DTensor placements, one per mesh dim, comma-separated: S(d) shards "
                      "tensor dim d as torch.chunk, S(d,[3,5]) with explicit sizes, R "
                      "replicates, P(sum|avg|min|max) holds partial values. Example: S(0),R");
  placements->type_name("SPEC");
  CLI::Option* flat =
      cmd->add_option("--flat",
                      "Flat ranges into the row-major flattened tensor (OLMo-core ShardingSpec): "
                      "one group per mesh position separated by ';', ranges start:end separated by "
                      "','; a group may be empty. Example: '0:4,20:30;4:20;;'");
  flat->type_name("SPEC");
  cmd->add_option("--dtype", flags->dtype,
                  absl::StrCat("Element type for byte counts: ", DTypeNameList()))
      ->capture_default_str()
      ->type_name("TYPE");
  cmd->callback([flags, conn, placements, flat]() {
    if (placements->count() > 0) flags->placements = placements->as<std::string>();
    if (flat->count() > 0) flags->flat = flat->as<std::string>();
    const int rc = RunLayoutCommand(*flags, conn->json, std::cout, std::cerr);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace shardcoord
