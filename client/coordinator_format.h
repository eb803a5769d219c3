#ifndef SHARDCOORD_CLIENT_COORDINATOR_FORMAT_H_
#define SHARDCOORD_CLIENT_COORDINATOR_FORMAT_H_

// How shardctl shows what the coordinator returns: a human table (default) and one JSON
// object (--json) per kind of answer. Pure functions of the protos, so they are tested
// without a coordinator.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// "f32" for a known dtype, else the proto's enum name.
std::string DTypeText(v1::DType dtype);

// `now_unix_ms` turns last heartbeats into ages ("1.2 s ago").
std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers, int64_t now_unix_ms);
// {"workers": [{"name", "rank", "host", "device", "address", "backend", "state",
//   "incarnation", "last_heartbeat_unix_ms"}]}
std::string WorkersJson(const std::vector<v1::WorkerInfo>& workers);

std::string MeshesTable(const std::vector<v1::MeshInfo>& meshes);
// {"meshes": [{"name", "shape", "dim_names", "ranks", "workers"}]}
std::string MeshesJson(const std::vector<v1::MeshInfo>& meshes);
// One mesh: its line, then a grid of "worker (rank)" per position for 1-d and 2-d meshes.
std::string MeshText(const v1::MeshInfo& mesh);
// {"name", "shape", "dim_names", "ranks", "workers"}
std::string MeshJson(const v1::MeshInfo& mesh);

std::string TensorsTable(const std::vector<v1::TensorInfo>& tensors);
// {"tensors": [{"name", "shape", "dtype", "mesh", "spec", "bytes", "version", "busy_plan"}]}
std::string TensorsJson(const std::vector<v1::TensorInfo>& tensors);

// `shardctl plan list`: one row per plan (newest first), or {"plans": [...]}.
std::string PlansTable(const v1::ListPlansResponse& plans);
std::string PlansJson(const v1::ListPlansResponse& plans);

// `tensor show`: summary, one row per chunk with its checksum (hex; "-" when unknown), and
// the layout picture for 1-d and 2-d tensors. Lost chunks and a running plan are called out.
std::string TensorText(const v1::TensorInfo& tensor);
// {"name", "shape", "dtype", "mesh", "spec", "version", "bytes", "busy_plan",
//  "lost_chunks", "chunks": [{"rank", "coord", "offset", "shape", "local_offset",
//  "partial_index", "checksum"}]}; checksum is a 16-digit hex string (JSON numbers lose
// 64-bit precision in many readers).
std::string TensorJson(const v1::TensorInfo& tensor);
// The summary line of TensorText: "t  [64, 48] f32  S(0),R on mesh m  12.0 KiB  version 2".
std::string TensorLine(const v1::TensorInfo& tensor);

// After a redistribute or gather: "plan p1 COMMITTED in 0.21 s: 4.0 MiB moved (lower bound
// 4.0 MiB) in 2 steps: all_to_all x2" and the tensor's new spec when known.
std::string PlanOutcomeText(absl::string_view verb, const v1::RedistributeResponse& response);
// {"plan_id", "tensor", "state", "seconds", "bytes_done", "bytes_total", "bytes_moved",
//  "lower_bound_bytes", "steps": [{"op", "ranks", "bytes"}], "error"}
std::string PlanOutcomeJson(const v1::RedistributeResponse& response);

// After a copy: "copied 'a' into 'b': plan p1 COMMITTED ..." as PlanOutcomeText, then
// "  b is now version 7".
std::string CopyOutcomeText(const v1::CopyRequest& request, const v1::CopyResponse& response);
// PlanOutcomeJson's fields (tensor is dst) and "src", "dst", "dst_version".
std::string CopyOutcomeJson(const v1::CopyRequest& request, const v1::CopyResponse& response);

// After a copy group: "copied 2 tensors as group g-1: COMMITTED in 0.012 s", the bytes moved,
// their lower bound and the fused exchange's buckets ("4.00 MiB moved (lower bound 4.00 MiB)
// in 12 buckets of at most 64.00 MiB"), then "  a -> b: version 7 (plan p-3)" per member.
std::string CopyGroupOutcomeText(const v1::CopyGroupResponse& response);
// {"group_id", "state", "seconds", "tensors", "bytes_moved", "lower_bound_bytes", "buckets",
//  "bucket_bytes", "members": [{"src", "dst", "dst_version", "plan_id", "state",
//  "bytes_moved", "lower_bound_bytes"}]}
std::string CopyGroupOutcomeJson(const v1::CopyGroupResponse& response);

// After a redistribute group (or, with verb "gathered", a gather group): "redistributed 2
// tensors as group g-1: COMMITTED ...", the bytes, lower bound and buckets as for a copy
// group, then "  a: version 7 (plan p-3)" per member.
std::string RedistributeGroupOutcomeText(const v1::RedistributeGroupResponse& response,
                                         absl::string_view verb = "redistributed");
// {"group_id", "state", "seconds", "tensors", "bytes_moved", "lower_bound_bytes", "buckets",
//  "bucket_bytes", "members": [{"tensor", "version", "plan_id", "state", "bytes_moved",
//  "lower_bound_bytes"}]}
std::string RedistributeGroupOutcomeJson(const v1::RedistributeGroupResponse& response);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_COORDINATOR_FORMAT_H_
