#include "sharding/test_layouts.h"

#include <utility>

#include "gtest/gtest.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace shardcoord {

Layout Placed(const Shape& mesh_shape, const Shape& shape, const std::string& placements) {
  return Placed(mesh_shape, {}, shape, placements);
}

Layout Placed(const Shape& mesh_shape, std::vector<int64_t> ranks, const Shape& shape,
              const std::string& placements) {
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(mesh_shape, std::move(ranks));
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  if (!mesh.ok()) return Layout();
  absl::StatusOr<std::vector<Placement>> p = ParsePlacements(placements);
  EXPECT_TRUE(p.ok()) << placements << ": " << p.status();
  if (!p.ok()) return Layout();
  absl::StatusOr<Layout> layout = Layout::FromPlacements(*mesh, shape, *p);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return layout.ok() ? *std::move(layout) : Layout();
}

}  // namespace shardcoord
