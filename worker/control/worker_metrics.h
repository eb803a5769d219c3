#ifndef SHARDCOORD_WORKER_CONTROL_WORKER_METRICS_H_
#define SHARDCOORD_WORKER_CONTROL_WORKER_METRICS_H_

#include "common/metrics.h"

namespace shardcoord {

// The worker's metrics, registered in `registry` (which must outlive this) in the order they
// render: the Worker owns it, hands the families to the parts that update them, and sets the
// gauges from a collector when scraped. Label values are bounded (results, reasons, RPC
// methods and codes), never tensor names.
struct WorkerMetrics {
  explicit WorkerMetrics(Registry* registry);

  // Communicators built, by result ("ok", "error"), and torn down, by reason
  // ("plan_aborted", "broken"): the CommunicatorCache's metrics.
  CounterFamily* communicator_builds;
  CounterFamily* communicator_aborts;
  // Communicators held for reuse; tensor buffers held and their bytes.
  Gauge* communicators;
  Gauge* buffers;
  Gauge* buffer_bytes;
  // The memory budget, what is held against it, and the most ever held.
  Gauge* memory_budget;
  Gauge* memory_used;
  Gauge* memory_peak;
  // Buffers user processes lent this worker, and their bytes (not the worker's memory).
  Gauge* attached_bytes;
  Gauge* attachments;
  // Worker service calls handled by method and status code, their latency by method, and
  // the serialized bytes of their messages by method and direction.
  CounterFamily* rpcs;
  HistogramFamily* rpc_duration_seconds;
  CounterFamily* rpc_message_bytes;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_CONTROL_WORKER_METRICS_H_
