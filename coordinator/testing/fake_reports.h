#ifndef SHARDCOORD_COORDINATOR_TESTING_FAKE_REPORTS_H_
#define SHARDCOORD_COORDINATOR_TESTING_FAKE_REPORTS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "coordinator/plans/plan_manager.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// A chunk's checksum as a fake worker reports it: any function of the chunk alone (so
// replicas agree).
using FakeChecksumFn = std::function<uint64_t(const Chunk&)>;
// By default: offset(0) * 131 + offset(1) + 7 * partial_index.
uint64_t DefaultFakeChecksum(const Chunk& c);

// What a worker that ran `fragment` correctly reports, for tests and benchmarks that play
// the workers: its target chunks, each with `checksum` of the chunk. Testonly.
WorkerReport FakeFinalReport(const v1::PlanFragment& fragment, const std::string& worker,
                             int64_t incarnation,
                             const FakeChecksumFn& checksum = DefaultFakeChecksum);
// As FakeFinalReport for a fused group's fragment: every member's target chunks, and one
// fused_exchange step in its timing.
WorkerReport FakeFusedFinalReport(const v1::PlanFragment& fragment, const std::string& worker,
                                  int64_t incarnation,
                                  const FakeChecksumFn& checksum = DefaultFakeChecksum);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TESTING_FAKE_REPORTS_H_
