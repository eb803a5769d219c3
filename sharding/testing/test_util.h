#ifndef SHARDCOORD_SHARDING_TESTING_TEST_UTIL_H_
#define SHARDCOORD_SHARDING_TESTING_TEST_UTIL_H_

// What the tests of sharding/ types and their conversions share.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "sharding/box.h"
#include "sharding/mesh.h"
#include "sharding/plan.h"

namespace shardcoord {
namespace sharding_testing {

// The message of an INVALID_ARGUMENT `s` (an expectation fails when it is anything else).
template <typename T>
std::string ErrorOf(const absl::StatusOr<T>& s) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  return std::string(s.status().message());
}

// Calls fn(global index) for every element of `region`, row-major.
template <typename Fn>
void ForEachIndex(const Box& region, Fn fn) {
  if (region.Empty()) return;
  Shape idx = region.offset();
  while (true) {
    fn(idx);
    int d = region.ndim() - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < region.end(d)) break;
      idx[d] = region.offset(d);
    }
    if (d < 0) return;
  }
}

// A mesh of `shape` over `ranks` (empty: 0..n-1); a bad one fails the test (a non-fatal
// expectation) and gives an empty mesh.
DeviceMesh Mesh(Shape shape, std::vector<int64_t> ranks = {});

// A plan of 8 f32 elements from S(0) on four ranks: an all-gather among {0, 1} and a
// point-to-point step among {2, 3}, a local copy on every rank.
Plan TwoStepPlan();

}  // namespace sharding_testing
}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_TESTING_TEST_UTIL_H_
