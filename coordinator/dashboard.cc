#include "coordinator/dashboard.h"

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_service.h"
#include "google/protobuf/util/json_util.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {
namespace {

// `{"field": [...]}` -> `"field": [...]`, to splice several list responses into one object.
absl::StatusOr<std::string> Members(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;  // Empty lists too.
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(m, &json, options);
  if (!status.ok()) return absl::InternalError(std::string(status.message()));
  if (json.size() < 2 || json.front() != '{' || json.back() != '}') {
    return absl::InternalError(absl::StrCat("not a JSON object: ", json));
  }
  return json.substr(1, json.size() - 2);
}

}  // namespace

absl::StatusOr<std::string> StateJson(const WorkerManager& workers, const MeshManager& meshes,
                                      const TensorManager& tensors) {
  v1::ListWorkersResponse w;
  for (const WorkerRecord& r : workers.List()) *w.add_workers() = WorkerInfoToProto(r);
  v1::ListMeshesResponse m;
  for (const MeshRecord& r : meshes.List()) *m.add_meshes() = MeshInfoToProto(r);
  v1::ListTensorsResponse t;
  const LivenessFn live = [&workers](int64_t rank, int64_t incarnation) {
    return workers.IsLive(rank, incarnation);
  };
  for (const TensorRecord& r : tensors.List()) {
    v1::TensorInfo* info = t.add_tensors();
    *info = TensorInfoToProto(r, live);
    info->clear_layout();
  }
  std::string out = "{";
  for (const google::protobuf::Message* part :
       std::initializer_list<const google::protobuf::Message*>{&w, &m, &t}) {
    absl::StatusOr<std::string> members = Members(*part);
    if (!members.ok()) return members.status();
    if (out.size() > 1) out += ",";
    out += *members;
  }
  out += "}";
  return out;
}

const std::string& DashboardHtml() {
  static const std::string* const kPage = new std::string(R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>shardcoord</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; } th, td { padding: 0.2em 0.8em; text-align: left; }
th { border-bottom: 1px solid #999; } tr:nth-child(even) { background: #f4f4f4; }
.ALIVE { color: #070; } .DEAD { color: #b00; } #status { color: #666; }
</style>
</head>
<body>
<h1>shardcoord coordinator</h1>
<p id="status">loading...</p>
<p><a href="/metrics">Prometheus metrics</a></p>
<h2>Workers</h2>
<table id="workers"><thead><tr><th>rank</th><th>name</th><th>state</th><th>host</th>
<th>device</th><th>backend</th><th>address</th><th>incarnation</th></tr></thead>
<tbody></tbody></table>
<h2>Meshes</h2>
<table id="meshes"><thead><tr><th>name</th><th>shape</th><th>dims</th><th>workers</th></tr>
</thead><tbody></tbody></table>
<h2>Tensors</h2>
<table id="tensors"><thead><tr><th>name</th><th>shape</th><th>dtype</th><th>mesh</th>
<th>spec</th><th>version</th><th>bytes</th><th>busy</th><th>lost chunks</th></tr></thead>
<tbody></tbody></table>
<script>
"use strict";
function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const row of rows) {
    const tr = document.createElement("tr");
    for (const cell of row) {
      const td = document.createElement("td");
      td.textContent = cell.text !== undefined ? cell.text : String(cell);
      if (cell.cls) td.className = cell.cls;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}
const dims = (a) => (a || []).join("x");
async function refresh() {
  try {
    const response = await fetch("/api/state", {cache: "no-store"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    const s = await response.json();
    fill("workers", s.workers.map((w) => [w.rank, w.name, {text: w.state, cls: w.state},
        w.host, w.device, w.backend, w.address, w.incarnation]));
    fill("meshes", s.meshes.map((m) => [m.name, dims(m.shape), (m.dim_names || []).join(","),
        (m.workers || []).join(", ")]));
    fill("tensors", s.tensors.map((t) => [t.name, dims(t.shape), t.dtype, t.mesh, t.spec,
        t.version, t.bytes, t.busy_plan, (t.lost_chunks || []).length]));
    document.getElementById("status").textContent =
        "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("status").textContent = "cannot reach the coordinator: " + e;
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)html");
  return *kPage;
}

}  // namespace shardcoord
