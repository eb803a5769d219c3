#include "coordinator/http/dashboard.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/http/layout_svg.h"
#include "coordinator/rpc/coordinator_convert.h"
#include "google/protobuf/util/json_util.h"
#include "proto/plan_trace.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {
namespace {

constexpr char kText[] = "text/plain; charset=utf-8";

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

HttpResponse Error(int status, const absl::Status& why) {
  return HttpResponse{status, kText, std::string(why.message()) + "\n"};
}

}  // namespace

absl::StatusOr<std::string> StateJson(const WorkerManager& workers, const MeshManager& meshes,
                                      const TensorManager& tensors, const PlanManager* plans) {
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
  v1::ListPlansResponse p;
  if (plans != nullptr) {
    for (v1::PlanSummary& s : plans->List(kDashboardPlans)) *p.add_plans() = std::move(s);
  }
  std::string out = "{";
  for (const google::protobuf::Message* part :
       std::initializer_list<const google::protobuf::Message*>{&w, &m, &t, &p}) {
    absl::StatusOr<std::string> members = Members(*part);
    if (!members.ok()) return members.status();
    if (out.size() > 1) out += ",";
    out += *members;
  }
  out += "}";
  return out;
}

std::optional<HttpResponse> Dashboard::Refusal(const HttpRequest& req, const char* rpc) const {
  if (auth_ == nullptr) return std::nullopt;
  absl::StatusOr<std::string> token = BearerToken(req.authorization);
  absl::Status allowed = token.status();
  if (allowed.ok()) {
    allowed = auth_->Authorize(absl::StrCat("/shardcoord.v1.Coordinator/", rpc), *token).status();
  }
  if (allowed.ok()) return std::nullopt;
  if (allowed.code() == absl::StatusCode::kUnauthenticated) {
    HttpResponse r = Error(401, allowed);
    r.headers["WWW-Authenticate"] = "Bearer";
    return r;
  }
  return Error(403, allowed);
}

HttpResponse Dashboard::State(const HttpRequest& req) const {
  if (auto refused = Refusal(req, "ListTensors")) return *std::move(refused);
  absl::StatusOr<std::string> json = StateJson(*workers_, *meshes_, *tensors_, plans_);
  if (!json.ok()) return Error(500, json.status());
  return HttpResponse{200, "application/json", *std::move(json)};
}

HttpResponse Dashboard::LayoutPicture(const HttpRequest& req) const {
  if (auto refused = Refusal(req, "GetTensor")) return *std::move(refused);
  const std::string name = req.Param("tensor");
  if (name.empty()) return Error(400, absl::InvalidArgumentError("tensor: missing (?tensor=NAME)"));
  absl::StatusOr<TensorRecord> t = tensors_->Get(name);
  if (!t.ok()) {
    return Error(t.status().code() == absl::StatusCode::kNotFound ? 404 : 503, t.status());
  }
  const std::string title = absl::StrCat(t->name, ": ", t->spec, t->mesh.empty() ? "" : " on ",
                                         t->mesh, ", version ", t->version);
  return HttpResponse{200, "image/svg+xml", LayoutSvg(t->layout, title)};
}

HttpResponse Dashboard::Trace(const HttpRequest& req) const {
  if (auto refused = Refusal(req, "GetPlanTrace")) return *std::move(refused);
  const std::string plan = req.Param("plan");
  if (plan.empty()) return Error(400, absl::InvalidArgumentError("plan: missing (?plan=ID)"));
  if (plans_ == nullptr) return Error(404, absl::NotFoundError("no plans here"));
  absl::StatusOr<v1::PlanTrace> trace = plans_->Trace(plan);
  if (!trace.ok()) return Error(404, trace.status());
  HttpResponse r{200, "application/json", ChromeTraceJson(*trace)};
  r.headers["Content-Disposition"] = absl::StrCat("attachment; filename=\"trace-", plan, ".json\"");
  return r;
}

void Dashboard::Register(HttpServer& http) const {
  http.Get("/", [] { return HttpResponse{200, "text/html; charset=utf-8", DashboardHtml()}; });
  http.Get("/api/state", [this](const HttpRequest& req) { return State(req); });
  http.Get("/api/layout.svg", [this](const HttpRequest& req) { return LayoutPicture(req); });
  http.Get("/api/trace", [this](const HttpRequest& req) { return Trace(req); });
}

const std::string& DashboardHtml() {
  static const std::string* const kPage = new std::string(R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>shardcoord</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin-bottom: 0.2em; } h2 { font-size: 1.1em; margin-top: 1.4em; }
table { border-collapse: collapse; } th, td { padding: 0.2em 0.7em; text-align: left; }
th { border-bottom: 1px solid #999; } tr:nth-child(even) { background: #f4f4f4; }
.ALIVE, .COMMITTED { color: #070; } .DEAD, .ABORTED { color: #b00; }
#status { color: #666; } .muted { color: #777; }
.bar { display: inline-block; width: 8em; height: 0.8em; background: #e4e4e4;
       vertical-align: middle; border-radius: 2px; overflow: hidden; }
.bar > span { display: block; height: 100%; background: #4a8; }
.meshes { display: flex; flex-wrap: wrap; gap: 1.5em; }
.mesh td { border: 1px solid #bbb; background: #fafafa; font-size: 12px; min-width: 5em; }
#tensors tbody tr { cursor: pointer; } #tensors tbody tr.selected { background: #dde8ff; }
#layout { margin-top: 0.8em; }
#login { display: none; background: #fff4d6; padding: 0.6em; }
</style>
</head>
<body>
<h1>shardcoord coordinator</h1>
<p id="status">loading...</p>
<form id="login">This coordinator needs a token (a reader's will do):
<input id="token" type="password" size="40"> <button>Use it</button></form>
<p><a href="/metrics">Prometheus metrics</a></p>
<h2>Workers</h2>
<table id="workers"><thead><tr><th>rank</th><th>name</th><th>state</th><th>host</th>
<th>device</th><th>backend</th><th>address</th><th>heartbeat</th><th>memory</th></tr></thead>
<tbody></tbody></table>
<h2>Meshes</h2>
<div id="meshes" class="meshes"></div>
<h2>Tensors</h2>
<table id="tensors"><thead><tr><th>name</th><th>shape</th><th>dtype</th><th>mesh</th>
<th>spec</th><th>version</th><th>bytes</th><th>busy</th><th>lost chunks</th></tr></thead>
<tbody></tbody></table>
<p class="muted">Click a tensor for its layout: which rank holds which block.</p>
<div id="layout"></div>
<h2>Plans</h2>
<table id="plans"><thead><tr><th>plan</th><th>op</th><th>tensors</th><th>state</th>
<th>progress</th><th>moved / lower bound</th><th>seconds</th><th>trace</th></tr></thead>
<tbody></tbody></table>
<script>
"use strict";
const params = new URLSearchParams(location.hash.slice(1));
let token = params.get("token") || sessionStorage.getItem("shardcoord-token") || "";
if (params.get("token")) sessionStorage.setItem("shardcoord-token", token);
let selected = params.get("tensor") || "";
let shownVersion = null;

function get(url) {
  const headers = token ? {Authorization: "Bearer " + token} : {};
  return fetch(url, {cache: "no-store", headers}).then((r) => {
    if (r.status === 401 || r.status === 403) document.getElementById("login").style.display = "block";
    if (!r.ok) return r.text().then((t) => { throw new Error("HTTP " + r.status + ": " + t); });
    return r;
  });
}
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function bytes(n) {
  n = Number(n);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; ++i; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}
function bar(fraction, label) {
  const td = el("td");
  const b = el("span", null, "bar");
  const fill = el("span");
  fill.style.width = Math.max(0, Math.min(1, fraction)) * 100 + "%";
  b.appendChild(fill);
  td.appendChild(b);
  td.appendChild(document.createTextNode(" " + label));
  return td;
}
function fill(id, rows, onclick) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const row of rows) {
    const tr = el("tr");
    for (const cell of row.cells) {
      if (cell instanceof Node) { tr.appendChild(cell); continue; }
      tr.appendChild(cell !== null && typeof cell === "object" ? el("td", cell.text, cell.cls)
                                                               : el("td", cell));
    }
    if (row.key !== undefined) {
      tr.dataset.key = row.key;
      if (row.key === selected) tr.className = "selected";
      if (onclick) tr.onclick = () => onclick(row.key);
    }
    body.appendChild(tr);
  }
}
const dims = (a) => (a || []).join("x") || "scalar";
function age(ms) {
  if (!Number(ms)) return "never";
  const s = Math.max(0, (Date.now() - Number(ms)) / 1000);
  return s < 60 ? s.toFixed(1) + " s ago" : Math.round(s / 60) + " min ago";
}
function workerRow(w) {
  const budget = Number(w.memory_budget_bytes || 0), used = Number(w.memory_used_bytes || 0);
  return {cells: [w.rank, w.name, {text: w.state, cls: w.state}, w.host, w.device, w.backend,
                  w.address, age(w.last_heartbeat_unix_ms),
                  budget > 0 ? bar(used / budget, bytes(used) + " / " + bytes(budget))
                             : {text: "no budget", cls: "muted"}]};
}
function meshGrid(m, byName) {
  const box = el("div", null, "mesh");
  box.appendChild(el("div", m.name + ": " + dims(m.shape) +
      (m.dim_names && m.dim_names.length ? " (" + m.dim_names.join(", ") + ")" : "")));
  const shape = (m.shape || []).map(Number);
  const cols = shape.length ? shape[shape.length - 1] : 1;
  const table = el("table");
  const ranks = m.ranks || [], names = m.workers || [];
  for (let i = 0; i < ranks.length; i += cols) {
    const tr = el("tr");
    for (let j = i; j < Math.min(i + cols, ranks.length); ++j) {
      const w = byName[names[j]] || {};
      const td = el("td");
      td.appendChild(el("b", "rank " + ranks[j]));
      td.appendChild(el("div", names[j] || "?"));
      td.appendChild(el("div", w.host || "", "muted"));
      tr.appendChild(td);
    }
    table.appendChild(tr);
  }
  box.appendChild(table);
  return box;
}
function traceLink(id) {
  const a = el("a", "trace");
  a.href = "#";
  a.onclick = (ev) => {
    ev.preventDefault();
    get("/api/trace?plan=" + encodeURIComponent(id)).then((r) => r.blob()).then((blob) => {
      const link = el("a");
      link.href = URL.createObjectURL(blob);
      link.download = "trace-" + id + ".json";
      link.click();
    }).catch((e) => { document.getElementById("status").textContent = String(e); });
  };
  const td = el("td");
  td.appendChild(a);
  return td;
}
function showLayout(name, version) {
  selected = name;
  shownVersion = version;
  get("/api/layout.svg?tensor=" + encodeURIComponent(name)).then((r) => r.text()).then((text) => {
    const svg = new DOMParser().parseFromString(text, "image/svg+xml").documentElement;
    document.getElementById("layout").replaceChildren(document.importNode(svg, true));
  }).catch((e) => { document.getElementById("layout").textContent = String(e); });
}
async function refresh() {
  try {
    const s = await (await get("/api/state")).json();
    const byName = {};
    for (const w of s.workers) byName[w.name] = w;
    fill("workers", s.workers.map(workerRow));
    document.getElementById("meshes").replaceChildren(...s.meshes.map((m) => meshGrid(m, byName)));
    const versions = {};
    fill("tensors", s.tensors.map((t) => {
      versions[t.name] = t.version;
      return {key: t.name, cells: [t.name, dims(t.shape), t.dtype, t.mesh, t.spec, t.version,
                                   bytes(t.bytes), t.busy_plan,
                                   (t.lost_chunks || []).length]};
    }), (name) => { showLayout(name, versions[name]); refreshSoon(); });
    if (selected && versions[selected] !== undefined && versions[selected] !== shownVersion) {
      showLayout(selected, versions[selected]);
    }
    fill("plans", (s.plans || []).map((p) => {
      const total = Number(p.bytes_moved);
      return {cells: [p.plan_id, p.op + (p.group ? " (" + p.group + ")" : ""),
                      p.source_tensor === p.tensor ? p.tensor : p.source_tensor + " \u2192 " + p.tensor,
                      {text: p.state, cls: p.state},
                      bar(total ? Number(p.bytes_done) / total : 1, bytes(p.bytes_done)),
                      bytes(p.bytes_moved) + " / " + bytes(p.lower_bound_bytes),
                      Number(p.seconds).toFixed(3), traceLink(p.plan_id)]};
    }));
    document.getElementById("status").textContent =
        "updated " + new Date().toLocaleTimeString() + ": " + s.workers.length + " workers, " +
        s.meshes.length + " meshes, " + s.tensors.length + " tensors";
  } catch (e) {
    document.getElementById("status").textContent = "cannot read the coordinator: " + e;
  }
}
let timer = null;
function refreshSoon() { clearTimeout(timer); refresh().then(() => { timer = setTimeout(refreshSoon, 2000); }); }
document.getElementById("login").onsubmit = (ev) => {
  ev.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("shardcoord-token", token);
  document.getElementById("login").style.display = "none";
  refreshSoon();
};
refreshSoon();
</script>
</body>
</html>
)html");
  return *kPage;
}

}  // namespace shardcoord
