#ifndef SHARDCOORD_COORDINATOR_HTTP_DASHBOARD_H_
#define SHARDCOORD_COORDINATOR_HTTP_DASHBOARD_H_

// The coordinator's read-only dashboard on its HTTP listener:
//   GET /                         the page (static HTML + JavaScript, nothing loaded from
//                                 elsewhere), which polls the three below;
//   GET /api/state                workers, meshes, tensors and recent plans as JSON;
//   GET /api/layout.svg?tensor=T  the tensor's layout picture (coordinator/http/layout_svg.h);
//   GET /api/trace?plan=P         the plan's timeline as Chrome trace JSON (a download).
// With an authenticator (--auth-tokens) every /api/ path needs `Authorization: Bearer TOKEN`
// of a role that may call the matching read RPC (ListTensors, GetTensor, GetPlanTrace):
// 401 without a known token, 403 for a role that may not. The page itself holds no data; it
// takes the token from the URL fragment (#token=...), which browsers never send to servers.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/http_server.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/rpc/auth.h"
#include "coordinator/state/tensor_manager.h"

namespace shardcoord {

// Plans /api/state lists, newest first.
inline constexpr int kDashboardPlans = 50;

// {"workers": [...], "meshes": [...], "tensors": [...], "plans": [...]}: each element the
// shardcoord.v1 WorkerInfo, MeshInfo, TensorInfo or PlanSummary in proto3's JSON mapping with
// proto field names (int64 as strings, enums by name), as ListWorkers, ListMeshes,
// ListTensors and ListPlans answer; tensors without their layout (per-chunk data that grows
// with the ranks); `plans` null when `plans` is null.
absl::StatusOr<std::string> StateJson(const WorkerManager& workers, const MeshManager& meshes,
                                      const TensorManager& tensors, const PlanManager* plans);

// The page: static HTML and JavaScript, no external resources.
const std::string& DashboardHtml();

// The handlers, over the managers (not owned). `auth` may be null (no tokens).
class Dashboard {
 public:
  Dashboard(const WorkerManager* workers, const MeshManager* meshes, const TensorManager* tensors,
            const PlanManager* plans, const Authenticator* auth)
      : workers_(workers), meshes_(meshes), tensors_(tensors), plans_(plans), auth_(auth) {}

  // Adds GET /, /api/state, /api/layout.svg and /api/trace to `http`.
  void Register(HttpServer& http) const;

  HttpResponse State(const HttpRequest& req) const;
  HttpResponse LayoutPicture(const HttpRequest& req) const;
  HttpResponse Trace(const HttpRequest& req) const;

 private:
  // The 401/403 answer for a caller that may not call `rpc`; nullopt when it may.
  std::optional<HttpResponse> Refusal(const HttpRequest& req, const char* rpc) const;

  const WorkerManager* const workers_;
  const MeshManager* const meshes_;
  const TensorManager* const tensors_;
  const PlanManager* const plans_;
  const Authenticator* const auth_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_HTTP_DASHBOARD_H_
