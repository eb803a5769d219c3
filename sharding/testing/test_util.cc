#include "sharding/testing/test_util.h"

#include <utility>

#include "sharding/layout.h"
#include "sharding/placement.h"

namespace shardcoord {
namespace sharding_testing {

DeviceMesh Mesh(Shape shape, std::vector<int64_t> ranks) {
  absl::StatusOr<DeviceMesh> m = DeviceMesh::Create(std::move(shape), std::move(ranks));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : DeviceMesh();
}

Plan TwoStepPlan() {
  Plan plan;
  plan.source = *Layout::FromPlacements(Mesh({4}), {8}, {Placement::Shard(0)});
  plan.target = *Layout::FromChunks({8}, {RankChunks{0, {}, {Chunk{Box({0}, {4}), 0, 0}}, 4},
                                          RankChunks{1, {}, {Chunk{Box({0}, {4}), 0, 0}}, 4},
                                          RankChunks{2, {}, {Chunk{Box({4}, {4}), 0, 0}}, 4},
                                          RankChunks{3, {}, {Chunk{Box({4}, {4}), 0, 0}}, 4}});
  plan.dtype = DType::kF32;
  for (int64_t r = 0; r < 4; ++r) {
    plan.local_copies.push_back(LocalCopy{r, Box({2 * r}, {2}), false, 0});
  }
  Step gather;
  gather.op = StepOp::kAllGather;
  gather.ranks = {0, 1};
  gather.transfers = {Transfer{0, 1, Box({0}, {2}), 8, false, 0},
                      Transfer{1, 0, Box({2}, {2}), 8, false, 0}};
  gather.bytes = 16;
  Step p2p;
  p2p.op = StepOp::kPointToPoint;
  p2p.ranks = {2, 3};
  p2p.transfers = {Transfer{2, 3, Box({4}, {2}), 8, false, 0},
                   Transfer{3, 2, Box({6}, {2}), 8, false, 0}};
  p2p.bytes = 16;
  plan.steps = {gather, p2p};
  plan.bytes_moved = 32;
  plan.lower_bound_bytes = 32;
  plan.traffic = {RankTraffic{0, 8, 8}};
  return plan;
}

}  // namespace sharding_testing
}  // namespace shardcoord
