#include "worker/control/worker_metrics.h"

namespace shardcoord {
namespace {

// A gauge without labels: its family's one series.
Gauge* UnlabelledGauge(Registry* registry, const std::string& name, const std::string& help) {
  return registry->AddGauge(name, help)->WithLabels({});
}

}  // namespace

WorkerMetrics::WorkerMetrics(Registry* registry)
    : communicator_builds(registry->AddCounter("shardcoord_worker_communicator_builds_total",
                                               "Communicators built (a rendezvous with the other "
                                               "members), by result.",
                                               {"result"})),
      communicator_aborts(registry->AddCounter(
          "shardcoord_worker_communicator_aborts_total",
          "Communicators torn down: released with an aborted plan's epoch, or found broken.",
          {"reason"})),
      communicators(UnlabelledGauge(registry, "shardcoord_worker_communicators",
                                    "Communicators this worker holds for reuse.")),
      buffers(UnlabelledGauge(registry, "shardcoord_worker_buffers",
                              "Tensor buffers held (one per tensor version).")),
      buffer_bytes(UnlabelledGauge(registry, "shardcoord_worker_buffer_bytes",
                                   "Bytes of the tensor buffers held.")),
      memory_budget(UnlabelledGauge(
          registry, "shardcoord_worker_memory_budget_bytes",
          "The worker's --memory-budget: bytes it may hold in its buffers' memory.")),
      memory_used(UnlabelledGauge(registry, "shardcoord_worker_memory_used_bytes",
                                  "Bytes the worker holds against its budget: buffers, "
                                  "buffers of plans in flight, staging (not lent memory).")),
      memory_peak(UnlabelledGauge(
          registry, "shardcoord_worker_memory_peak_bytes",
          "The most bytes the worker has held against its budget since it started.")),
      attached_bytes(UnlabelledGauge(registry, "shardcoord_worker_attached_bytes",
                                     "Bytes of the buffers user processes lent this worker (not "
                                     "the worker's own memory).")),
      attachments(UnlabelledGauge(registry, "shardcoord_worker_attachments",
                                  "Buffers user processes lent this worker.")),
      rpcs(registry->AddCounter("shardcoord_rpcs_total",
                                "gRPC calls handled, by method and status code.",
                                {"method", "code"})),
      rpc_duration_seconds(registry->AddHistogram(
          "shardcoord_rpc_duration_seconds", "Time from a call's start to its status, by method.",
          {"method"}, ExponentialBuckets(0.001, 2, 17))),  // 1 ms .. ~66 s, doubling.
      rpc_message_bytes(registry->AddCounter("shardcoord_rpc_message_bytes_total",
                                             "Bytes of the gRPC messages the Worker service "
                                             "received and sent (serialized), by method and "
                                             "direction.",
                                             {"method", "direction"})) {
  // Every result and reason from the start, so a scrape shows zeros rather than nothing.
  for (const char* result : {"ok", "error"}) communicator_builds->WithLabels({result});
  for (const char* reason : {"plan_aborted", "broken"}) communicator_aborts->WithLabels({reason});
}

}  // namespace shardcoord
