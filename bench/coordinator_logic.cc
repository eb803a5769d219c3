#include "bench/coordinator_logic.h"

namespace shardcoord {
namespace bench {

CoordinatorLogic::CoordinatorLogic(WorkerClient* client, StateStore* store,
                                   absl::Duration plan_timeout)
    : timer_(&clock_),
      workers_(&clock_, absl::Seconds(5), store),
      meshes_(&workers_, store),
      tensors_(&meshes_, store),
      view_(&workers_, &tensors_),
      admission_(&clock_, &timer_, &view_, AdmissionOptions{}),
      plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, client, Options(plan_timeout)) {
  view_.set_controller(&admission_);
  workers_.AddListener(&plans_);
}

PlanManagerOptions CoordinatorLogic::Options(absl::Duration plan_timeout) {
  PlanManagerOptions o;
  o.plan_timeout = plan_timeout;
  o.metrics = &metrics_;
  o.admission = &admission_;
  return o;
}

}  // namespace bench
}  // namespace shardcoord
