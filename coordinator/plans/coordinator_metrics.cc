#include "coordinator/plans/coordinator_metrics.h"

namespace shardcoord {
namespace {

// 1 ms .. ~66 s, doubling.
std::vector<double> SecondsBuckets() { return ExponentialBuckets(0.001, 2, 17); }

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(Registry* registry)
    : plans(registry->AddCounter("shardcoord_plans_total", "Plans that ended, by op and end state.",
                                 {"op", "state"})),
      plan_duration_seconds(registry->AddHistogram("shardcoord_plan_duration_seconds",
                                                   "Time from a plan's start to its end, by op.",
                                                   {"op"}, SecondsBuckets())),
      plan_bytes(registry->AddHistogram("shardcoord_plan_bytes",
                                        "Bytes each plan moves between workers, by op.", {"op"},
                                        ExponentialBuckets(1024, 4, 12))),  // 1 KiB .. 4 GiB.
      bytes_moved(registry
                      ->AddCounter("shardcoord_plan_bytes_moved_total",
                                   "Bytes moved between workers by committed plans.")
                      ->WithLabels({})),
      lower_bound_bytes(registry
                            ->AddCounter("shardcoord_plan_lower_bound_bytes_total",
                                         "Lower bound of the bytes committed plans had to move "
                                         "(each needed element arriving once).")
                            ->WithLabels({})),
      workers(registry->AddGauge("shardcoord_workers", "Registered workers by state.", {"state"})),
      heartbeats_missed(registry
                            ->AddCounter("shardcoord_heartbeats_missed_total",
                                         "Workers declared dead because no heartbeat came "
                                         "within the heartbeat timeout.")
                            ->WithLabels({})),
      rpcs(registry->AddCounter("shardcoord_rpcs_total",
                                "gRPC calls handled, by method and status code.",
                                {"method", "code"})),
      rpc_duration_seconds(registry->AddHistogram("shardcoord_rpc_duration_seconds",
                                                  "Time from a call's start to its status, by "
                                                  "method.",
                                                  {"method"}, SecondsBuckets())),
      upload_bytes(registry
                       ->AddCounter("shardcoord_upload_bytes_total",
                                    "Tensor data bytes received by Upload streams.")
                       ->WithLabels({})),
      download_bytes(registry
                         ->AddCounter("shardcoord_download_bytes_total",
                                      "Tensor data bytes sent by Download streams.")
                         ->WithLabels({})),
      rpc_message_bytes(registry->AddCounter(
          "shardcoord_rpc_message_bytes_total",
          "Bytes of the gRPC messages the coordinator received and sent (serialized), on its "
          "services and its calls to workers, by method and direction.",
          {"method", "direction"})),
      admission_wait_seconds(registry->AddHistogram(
          "shardcoord_plan_admission_wait_seconds",
          "Time plans, groups, creates and uploads waited for memory on the workers before "
          "they were admitted or refused, by result (admitted, waited, refused, timed_out).",
          {"result"}, SecondsBuckets())),
      admission_waiting(registry
                            ->AddGauge("shardcoord_plan_admission_waiting",
                                       "Plans and groups waiting for memory on the workers now.")
                            ->WithLabels({})),
      worker_memory_budget(registry->AddGauge(
          "shardcoord_workers_memory_budget_bytes",
          "Each worker's memory budget as it reports it (worker --memory-budget).", {"worker"})),
      worker_memory_used(registry->AddGauge("shardcoord_workers_memory_used_bytes",
                                            "Bytes each worker reported holding against its "
                                            "budget at its last heartbeat.",
                                            {"worker"})),
      worker_memory_peak(registry->AddGauge(
          "shardcoord_workers_memory_peak_bytes",
          "The most bytes each worker reported having held against its budget.", {"worker"})),
      checkpoints(registry->AddCounter("shardcoord_checkpoints_total",
                                       "Checkpoint saves and loads that ended, by op and result.",
                                       {"op", "result"})),
      checkpoint_bytes(registry->AddCounter(
          "shardcoord_checkpoint_bytes_total",
          "Bytes workers wrote (save) or read from storage (load) for checkpoints that succeeded.",
          {"op"})),
      transfer_runs(registry->AddCounter("shardcoord_transfer_runs_total",
                                         "Runs of prepared transfers that ended, by result "
                                         "(committed, aborted).",
                                         {"result"})),
      transfer_run_seconds(registry
                               ->AddHistogram("shardcoord_transfer_run_seconds",
                                              "Time from a prepared transfer's run start to its "
                                              "end, its preparation excluded.",
                                              {}, SecondsBuckets())
                               ->WithLabels({})),
      transfer_prepare_seconds(registry->AddHistogram(
          "shardcoord_transfer_prepare_seconds",
          "Time each preparation of a prepared transfer took (snapshot, table, every worker "
          "planning its part), by result (ok, failed).",
          {"result"}, SecondsBuckets())),
      transfer_replans(registry
                           ->AddCounter("shardcoord_transfer_replans_total",
                                        "Preparations runs made because their transfer was "
                                        "invalidated (a member changed, a participant died or "
                                        "registered again) or not prepared since a restart.")
                           ->WithLabels({})) {
  for (const char* state : {"alive", "dead"}) workers->WithLabels({state});
  for (const char* result : {"admitted", "waited", "refused", "timed_out"}) {
    admission_wait_seconds->WithLabels({result});
  }
}

}  // namespace shardcoord
