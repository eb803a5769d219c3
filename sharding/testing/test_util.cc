#include "sharding/testing/test_util.h"

#include <utility>

namespace shardcoord {
namespace sharding_testing {

DeviceMesh Mesh(Shape shape, std::vector<int64_t> ranks) {
  absl::StatusOr<DeviceMesh> m = DeviceMesh::Create(std::move(shape), std::move(ranks));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : DeviceMesh();
}

}  // namespace sharding_testing
}  // namespace shardcoord
