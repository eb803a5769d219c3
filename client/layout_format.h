#ifndef SHARDCOORD_CLIENT_LAYOUT_FORMAT_H_
#define SHARDCOORD_CLIENT_LAYOUT_FORMAT_H_

// The logic of `shardctl layout`, free of any command-line library so that it is testable
// without a process: parse the flags into a Layout, and render it as JSON, a table or a
// picture.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"

namespace shardcoord {

// The flags of `shardctl layout`, as typed on the command line.
struct LayoutFlags {
  std::string mesh;                       // "2x4"
  std::string ranks;                      // "0,1,..."; empty: 0..size-1 in row-major order.
  std::string dims;                       // "dp,tp"; empty: unnamed dims.
  std::string shape;                      // "8,4"; empty: a scalar (0-d) tensor.
  std::optional<std::string> placements;  // "S(0),R"; exactly one of placements / flat.
  std::optional<std::string> flat;        // "0:4,20:30;4:20;;"
  std::string dtype = "f32";
};

struct LayoutRequest {
  Layout layout;
  DType dtype = DType::kF32;
};

// "2x4" -> {2, 4}; "8" -> {8}. Every dim a positive integer.
absl::StatusOr<Shape> ParseMeshShape(absl::string_view text);
// ParseMeshShape's shape and its number of positions; an error too where that overflows.
struct SizedMeshShape {
  Shape shape;
  int64_t size = 0;
};
absl::StatusOr<SizedMeshShape> ParseSizedMeshShape(absl::string_view text);
// "8,4" -> {8, 4}; "" -> {}. Spaces around items are allowed.
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text);
// "dp,tp" -> {"dp", "tp"}; "" -> {}.
std::vector<std::string> ParseNameList(absl::string_view text);

// Builds the mesh and the layout the flags describe. Every error is INVALID_ARGUMENT with a
// one-line message that starts with the flag it is about, as in "--ranks: ...".
absl::StatusOr<DeviceMesh> BuildMesh(const LayoutFlags& flags);
absl::StatusOr<LayoutRequest> BuildLayout(const LayoutFlags& flags);

// {"chunks": [{"rank": 0, "coord": [0, 0], "offset": [0, 0], "shape": [1, 4]}, ...]}: one
// entry per chunk in rank (mesh) order, then local buffer order. A rank that holds nothing
// gets one entry with offset and shape all 0, so every rank appears. Keys that would be 0 for
// every chunk are left out: "local_offset" (elements into the rank's buffer) appears only
// when some chunk has a non-zero one, "partial_index" only for partial layouts.
std::string LayoutJson(const Layout& layout);

// A summary line, then one row per chunk: rank, mesh coordinate, offset, shape, bytes (and
// the local offset / partial index when they matter, as in LayoutJson).
std::string LayoutTable(const Layout& layout, DType dtype);

// For 1-d and 2-d tensors, a character grid of at most 32 rows and about 64 columns; each
// cell shows who holds its first element: a rank, a rank list for replicas or partial values
// ("0,4", "0-3"), "." where nobody does. Long rank lists become keys "g1", "g2", ... explained
// below the grid. Empty for other ranks.
std::string LayoutPicture(const Layout& layout);

// Max characters and rows of the picture grid.
inline constexpr int kPictureMaxWidth = 64;
inline constexpr int kPictureMaxRows = 32;

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_LAYOUT_FORMAT_H_
