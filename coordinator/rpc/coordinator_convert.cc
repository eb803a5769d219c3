#include "coordinator/rpc/coordinator_convert.h"

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "proto/convert.h"

namespace shardcoord {

v1::WorkerInfo WorkerInfoToProto(const WorkerRecord& w) {
  v1::WorkerInfo out;
  out.set_name(w.spec.name);
  out.set_rank(w.rank);
  out.set_host(w.spec.host);
  out.set_device(w.spec.device);
  out.set_address(w.spec.address);
  out.set_incarnation(w.incarnation);
  out.set_state(w.alive ? v1::ALIVE : v1::DEAD);
  out.set_backend(w.spec.backend);
  out.set_local_socket(w.spec.local_socket);
  out.set_bucket_bytes(w.spec.bucket_bytes);
  out.set_last_heartbeat_unix_ms(absl::ToUnixMillis(w.last_heartbeat));
  out.set_leaving(w.alive && w.leaving);
  out.set_memory_budget_bytes(w.spec.memory.budget_bytes);
  out.set_memory_used_bytes(w.spec.memory.used_bytes);
  out.set_memory_peak_bytes(w.spec.memory.peak_bytes);
  return out;
}

v1::MeshInfo MeshInfoToProto(const MeshRecord& m) {
  v1::MeshInfo out;
  out.set_name(m.name);
  ShapeToProto(m.mesh.shape(), out.mutable_shape());
  for (const std::string& d : m.mesh.dim_names()) out.add_dim_names(d);
  ShapeToProto(m.mesh.ranks(), out.mutable_ranks());
  for (const std::string& w : m.workers) out.add_workers(w);
  return out;
}

v1::TensorInfo TensorInfoToProto(const TensorRecord& t, const LivenessFn& live) {
  v1::TensorInfo out;
  out.set_name(t.name);
  ShapeToProto(t.shape, out.mutable_shape());
  out.set_dtype(DTypeToProto(t.dtype));
  out.set_mesh(t.mesh);
  out.set_spec(t.spec);
  *out.mutable_layout() = LayoutToProto(t.layout, &t.checksums);
  out.set_version(t.version);
  out.set_bytes(t.bytes());
  out.set_busy_plan(t.busy_plan);
  out.set_attached(t.attached);
  for (int64_t r : t.unattached) out.add_unattached_ranks(r);
  if (t.recovering) {
    // Its holders have not all registered again: nothing is known lost yet.
    out.set_busy_plan("recovering after a coordinator restart");
    return out;
  }
  for (const LostChunk& c : LostChunks(t, live)) out.add_lost_chunks(c.ToString());
  return out;
}

v1::PlanProgress PlanProgressToProto(const PlanProgress& p) {
  v1::PlanProgress out;
  out.set_plan_id(p.plan_id);
  out.set_tensor(p.tensor);
  out.set_state(static_cast<v1::PlanState>(static_cast<int>(p.state)));
  out.set_bytes_done(p.bytes_done);
  out.set_bytes_total(p.bytes_total);
  out.set_error(p.error);
  out.set_seconds(p.seconds);
  out.set_bucket_bytes(p.bucket_bytes);
  out.set_waiting_for_memory(p.waiting_for_memory);
  return out;
}

}  // namespace shardcoord
