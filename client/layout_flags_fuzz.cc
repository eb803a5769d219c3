// Fuzzes `shardctl layout`'s flag parsing and rendering: the input's lines are --mesh,
// --ranks, --dims, --shape, --placements (or, when the line starts with '~', --flat) and
// --dtype. BuildLayout must only ever return statuses, and every layout it builds must render
// as JSON, a table and a picture. Meshes over 4096 ranks are skipped: shardctl builds what it
// is asked to, and the point here is the parsers, not the allocator.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/layout_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardcoord;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  lines.resize(6);
  LayoutFlags flags;
  flags.mesh = lines[0];
  flags.ranks = lines[1];
  flags.dims = lines[2];
  flags.shape = lines[3];
  if (!lines[4].empty() && lines[4][0] == '~') {
    flags.flat = lines[4].substr(1);
  } else {
    flags.placements = lines[4];
  }
  if (!lines[5].empty()) flags.dtype = lines[5];

  absl::StatusOr<Shape> mesh_shape = ParseMeshShape(flags.mesh);
  if (mesh_shape.ok()) {
    int64_t n = 1;
    for (int64_t d : *mesh_shape) {
      if (d > 4096 || (n *= d) > 4096) return 0;
    }
  }
  absl::StatusOr<LayoutRequest> request = BuildLayout(flags);
  if (!request.ok()) return 0;
  (void)LayoutJson(request->layout);
  (void)LayoutTable(request->layout, request->dtype);
  (void)LayoutPicture(request->layout);
  return 0;
}
