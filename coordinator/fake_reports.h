#ifndef SHARDCOORD_COORDINATOR_FAKE_REPORTS_H_
#define SHARDCOORD_COORDINATOR_FAKE_REPORTS_H_

#include <cstdint>
#include <string>

#include "coordinator/plan_manager.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// What a worker that ran `fragment` correctly reports, for tests and benchmarks that play
// the workers: its target chunks, each with a checksum that depends only on the chunk (so
// replicas agree). Testonly.
WorkerReport FakeFinalReport(const v1::PlanFragment& fragment, const std::string& worker,
                             int64_t incarnation);
// As FakeFinalReport for a fused group's fragment: every member's target chunks, and one
// fused_exchange step in its timing.
WorkerReport FakeGroupFinalReport(const v1::PlanFragment& fragment, const std::string& worker,
                                  int64_t incarnation);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_FAKE_REPORTS_H_
