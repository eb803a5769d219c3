#ifndef SHARDCOORD_COORDINATOR_PLANS_COORDINATOR_METRICS_H_
#define SHARDCOORD_COORDINATOR_PLANS_COORDINATOR_METRICS_H_

#include "common/metrics.h"

namespace shardcoord {

// The coordinator's metrics, registered in `registry` (which must outlive this): managers
// and services get a pointer to it and update what concerns them. Label values are bounded:
// ops, end states, worker states, RPC methods and status codes, never tensor names.
struct CoordinatorMetrics {
  explicit CoordinatorMetrics(Registry* registry);

  // Plans that ended, by op ("redistribute", "gather", "copy") and end state ("committed",
  // "aborted"); their duration and bytes_moved by op.
  CounterFamily* plans;
  HistogramFamily* plan_duration_seconds;
  HistogramFamily* plan_bytes;
  // Bytes moved by committed plans, and their lower bound (each needed element arriving
  // once): equal when the planner is optimal.
  Counter* bytes_moved;
  Counter* lower_bound_bytes;
  // Registered workers by state ("alive", "dead"), set when scraped.
  GaugeFamily* workers;
  // Workers declared dead because no heartbeat came within the heartbeat timeout.
  Counter* heartbeats_missed;
  // Handled RPCs by method ("shardcoord.v1.Coordinator/Redistribute") and status code
  // ("OK", "NOT_FOUND"), and their latency by method.
  CounterFamily* rpcs;
  HistogramFamily* rpc_duration_seconds;
  // Tensor data received by uploads and sent by downloads (message payload bytes).
  Counter* upload_bytes;
  Counter* download_bytes;
  // Serialized bytes of every gRPC message the coordinator received and sent, by method and
  // direction ("received", "sent"), on its services and on its calls to workers: all it
  // moves. Tensor bytes of plans never pass through it (attached or not).
  CounterFamily* rpc_message_bytes;
  // Memory admission (issue 10): how long operations waited for memory, by result
  // ("admitted" at once, "waited", "refused" at once, "timed_out"; the _count is how many);
  // how many wait now; each worker's reported budget, use and peak (by worker name, a
  // bounded set), set when scraped.
  HistogramFamily* admission_wait_seconds;
  Gauge* admission_waiting;
  GaugeFamily* worker_memory_budget;
  GaugeFamily* worker_memory_used;
  GaugeFamily* worker_memory_peak;
  // Checkpoint saves and loads that ended, by op ("save", "load") and result ("ok",
  // "failed"); the bytes the workers wrote or read for them (each distinct element once).
  CounterFamily* checkpoints;
  CounterFamily* checkpoint_bytes;
  // Prepared transfers (issue 27): runs that ended by result ("committed", "aborted") and
  // their seconds (preparation excluded); preparations by result ("ok", "failed") and their
  // seconds; preparations a run made because the transfer was invalid (replans).
  CounterFamily* transfer_runs;
  Histogram* transfer_run_seconds;
  HistogramFamily* transfer_prepare_seconds;
  Counter* transfer_replans;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_PLANS_COORDINATOR_METRICS_H_
