#include "sharding/plan.h"

#include "sharding/enum_names.h"

namespace shardcoord {

std::string StepOpName(StepOp op) {
  static constexpr EnumName<StepOp> kNames[] = {
      {StepOp::kAllGather, "all_gather"}, {StepOp::kReduceScatter, "reduce_scatter"},
      {StepOp::kAllReduce, "all_reduce"}, {StepOp::kAllToAll, "all_to_all"},
      {StepOp::kBroadcast, "broadcast"},  {StepOp::kPointToPoint, "p2p"}};
  return NameOf(kNames, op);
}

std::vector<Transfer> Plan::AllTransfers() const {
  size_t n = 0;
  for (const Step& s : steps) n += s.transfers.size();
  std::vector<Transfer> out;
  out.reserve(n);
  for (const Step& s : steps) out.insert(out.end(), s.transfers.begin(), s.transfers.end());
  return out;
}

}  // namespace shardcoord
