#ifndef SHARDCOORD_COORDINATOR_PLANS_PLAN_RELAY_H_
#define SHARDCOORD_COORDINATOR_PLANS_PLAN_RELAY_H_

// Small plans relayed through the coordinator (issue 10, small-op latency).
//
// A plan's data step on the workers costs a dispatch, a thread per fragment, a rendezvous of
// every participant in the same step and a report each: about eight sequential wake-ups
// across five processes, milliseconds on a loaded host, whatever the bytes. For a tensor of
// a few KiB the coordinator can move the bytes itself in two parallel rounds of RPCs it
// already has: read one replica of every source chunk (one unary ReadBoxes per holder), lay
// out every target rank's new local buffer, write it (one unary WriteBuffer at the plan's
// target version). The workers answer both on their reactors. Their answers (chunks with
// checksums) stand in for their final reports, and the plan validates and commits exactly
// as one executed on the workers; FinishPlan drops the old version.
//
// Only plans that are plain copies qualify (RelayEligible): no Partial layout on either
// side (a reduction stays in the executor, whose order is the plan's), no target written
// in place (attached), nothing larger than the coordinator's --relay-max-bytes.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/state/tensor_bands.h"
#include "proto/convert.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/plan.h"

namespace shardcoord {

// The daemon's default --relay-max-bytes: a 64 KiB tensor is a few hundred microseconds of
// copying in the coordinator, far below a plan's fixed cost on the workers.
inline constexpr int64_t kDefaultRelayMaxBytes = 64 << 10;
// Its largest value: a worker answers ReadBoxes and WriteBuffer of at most 1 MiB
// (worker/control/worker_core.h kMaxRelayBytes).
inline constexpr int64_t kMaxRelayMaxBytes = 1 << 20;

// Whether `plan` may be relayed: its tensor holds at most `max_bytes` (0 disables relaying),
// neither layout is Partial, and the target is not written in place.
bool RelayEligible(const Plan& plan, bool target_attached, int64_t max_bytes);

// `rc`'s local buffer (rc.local_elements elements), laid out from `pieces`: data[i] holds
// the elements of sources[i].box row-major. Every target chunk must be covered by pieces
// (INTERNAL otherwise, naming the chunk); elements outside every chunk are zero.
absl::StatusOr<std::string> AssembleLocalBuffer(const RankChunks& rc,
                                                const std::vector<BandSource>& sources,
                                                const std::vector<std::string>& data,
                                                int64_t element_size);

struct RelayRequest {
  std::string plan_id;  // For errors.
  std::string tensor;   // Read at source_version.
  int64_t source_version = 0;
  std::string target_tensor;  // Written at target_version.
  int64_t target_version = 0;
  DType dtype = DType::kF32;
  Layout source;  // Live chunks only.
  Layout target;
  std::map<int64_t, WorkerEndpoint> workers;  // Every rank of source and target.
};

// One target rank's new buffer, as its worker answered.
struct RelayedRank {
  RankChunks chunks;
  ChunkChecksums checksums;
  int64_t bytes = 0;
  absl::Time start;  // Its write sent.
  absl::Time end;    // Answered.
};

struct RelayResult {
  absl::Status status;  // UNAVAILABLE naming the worker and box that failed.
  absl::Time reads_done;
  std::map<int64_t, RelayedRank> written;  // Every target rank, when status is OK.
  // Target ranks a WriteBuffer went to (stored or not): where the new version may exist.
  std::vector<int64_t> attempted;
};

// Reads, lays out and writes as described above; `done` runs once, after every call it made
// has been answered (so a failure never leaves a write in flight), on any thread, no lock
// held.
void RunRelay(WorkerClient* client, RelayRequest request, std::function<void(RelayResult)> done);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_PLANS_PLAN_RELAY_H_
