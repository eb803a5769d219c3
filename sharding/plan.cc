#include "sharding/plan.h"

namespace shardcoord {

std::string StepOpName(StepOp op) {
  switch (op) {
    case StepOp::kAllGather:
      return "all_gather";
    case StepOp::kReduceScatter:
      return "reduce_scatter";
    case StepOp::kAllReduce:
      return "all_reduce";
    case StepOp::kAllToAll:
      return "all_to_all";
    case StepOp::kBroadcast:
      return "broadcast";
    case StepOp::kPointToPoint:
      return "p2p";
  }
  return "unknown";
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
