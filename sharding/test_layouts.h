#ifndef SHARDCOORD_SHARDING_TEST_LAYOUTS_H_
#define SHARDCOORD_SHARDING_TEST_LAYOUTS_H_

// Layouts for tests, from placements text ("S(0),R") on a fresh mesh. Bad input fails the
// calling test (a non-fatal expectation) and returns an empty layout.

#include <cstdint>
#include <string>
#include <vector>

#include "sharding/layout.h"

namespace shardcoord {

// A mesh of `mesh_shape` over ranks 0..n-1.
Layout Placed(const Shape& mesh_shape, const Shape& shape, const std::string& placements);
// A mesh of `mesh_shape` over `ranks` (row-major; empty: 0..n-1).
Layout Placed(const Shape& mesh_shape, std::vector<int64_t> ranks, const Shape& shape,
              const std::string& placements);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_TEST_LAYOUTS_H_
