// Prometheus metrics of a real cluster: the coordinator's /metrics is scraped before and
// after a redistribute and a download, parsed as text exposition format 0.0.4, and the
// counters must have moved by exactly what the plan and the transfer report.

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Exposition {
  std::map<std::string, std::string> types;  // Family name -> counter, gauge, histogram...
  std::set<std::string> helps;
  std::vector<Sample> samples;

  // The value of the sample `name` whose labels include `labels`; NOT_FOUND if none.
  absl::StatusOr<double> Value(const std::string& name,
                               const std::map<std::string, std::string>& labels = {}) const {
    for (const Sample& s : samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : labels) {
        auto it = s.labels.find(k);
        if (it == s.labels.end() || it->second != v) match = false;
      }
      if (match) return s.value;
    }
    return absl::NotFoundError(absl::StrCat("no sample ", name));
  }
  // As Value, 0 when absent (a labelled counter appears at its first increment).
  double ValueOr0(const std::string& name,
                  const std::map<std::string, std::string>& labels = {}) const {
    absl::StatusOr<double> v = Value(name, labels);
    return v.ok() ? *v : 0;
  }
};

// Parses `name{k="v",...} value` (labels optional) with the format's escapes in values.
absl::StatusOr<Sample> ParseSample(const std::string& line) {
  Sample s;
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  s.name = line.substr(0, i);
  if (s.name.empty()) return absl::InvalidArgumentError(absl::StrCat("no name: ", line));
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t eq = line.find('=', i);
      if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
        return absl::InvalidArgumentError(absl::StrCat("bad label: ", line));
      }
      const std::string key = line.substr(i, eq - i);
      std::string value;
      size_t j = eq + 2;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) {
          ++j;
          value += line[j] == 'n' ? '\n' : line[j];
        } else {
          value += line[j];
        }
      }
      if (j >= line.size()) return absl::InvalidArgumentError(absl::StrCat("unclosed: ", line));
      s.labels[key] = value;
      i = j + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return absl::InvalidArgumentError(absl::StrCat("no '}': ", line));
    ++i;
  }
  if (i >= line.size() || line[i] != ' ') {
    return absl::InvalidArgumentError(absl::StrCat("no value: ", line));
  }
  const std::string value = line.substr(i + 1);
  if (value == "+Inf") {
    s.value = std::numeric_limits<double>::infinity();
  } else if (!absl::SimpleAtod(value, &s.value)) {
    return absl::InvalidArgumentError(absl::StrCat("bad value: ", line));
  }
  return s;
}

// Every line is a comment or a sample; every sample's family has HELP and TYPE before it.
absl::StatusOr<Exposition> Parse(const std::string& text) {
  Exposition e;
  for (absl::string_view view : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string line(view);
    if (line[0] == '#') {
      std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 3));
      if (parts.size() >= 3 && parts[1] == "HELP") e.helps.insert(parts[2]);
      if (parts.size() == 4 && parts[1] == "TYPE") e.types[parts[2]] = parts[3];
      continue;
    }
    absl::StatusOr<Sample> s = ParseSample(line);
    if (!s.ok()) return s.status();
    std::string family = s->name;
    if (!e.types.count(family)) {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        absl::string_view name = s->name;
        if (absl::ConsumeSuffix(&name, suffix)) {
          family = std::string(name);
          break;
        }
      }
    }
    if (!e.types.count(family) || !e.helps.count(family)) {
      return absl::InvalidArgumentError(absl::StrCat("sample before HELP and TYPE: ", line));
    }
    e.samples.push_back(*std::move(s));
  }
  return e;
}

class MetricsTest : public ClusterTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(ClusterTest::SetUp());
    ASSERT_FALSE(cluster_->metrics_address().empty()) << "the coordinator printed no metrics line";
  }

  // The coordinator's metrics, or worker `worker`'s.
  absl::StatusOr<Exposition> Scrape(int worker = -1) {
    const std::string& address =
        worker < 0 ? cluster_->metrics_address() : cluster_->worker_metrics_address(worker);
    if (address.empty()) return absl::FailedPreconditionError("no metrics address");
    const std::string path = "/metrics";
    const size_t colon = address.rfind(':');
    httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
    httplib::Result res = http.Get(path);
    if (!res) return absl::UnavailableError(httplib::to_string(res.error()));
    if (res->status != 200) return absl::InternalError(absl::StrCat("HTTP ", res->status));
    if (res->get_header_value("Content-Type") != "text/plain; version=0.0.4; charset=utf-8") {
      return absl::InternalError(res->get_header_value("Content-Type"));
    }
    return Parse(res->body);
  }
};

TEST_F(MetricsTest, TheDashboardShowsWorkersMeshesAndTensors) {
  CoordinatorClient& client = cluster_->client();
  absl::StatusOr<v1::MeshInfo> mesh = MakeMesh(client, "d_pair", {2}, {"w1", "w2"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<v1::TensorInfo> t =
      CreateFilled(client, "d_t", {6, 4}, DType::kF32, "d_pair", "S(1)");
  ASSERT_TRUE(t.ok()) << t.status();

  const std::string& address = cluster_->metrics_address();
  const size_t colon = address.rfind(':');
  httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  httplib::Result page = http.Get("/");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("<title>shardcoord</title>"), std::string::npos);
  EXPECT_NE(page->body.find("get(\"/api/state\")"), std::string::npos);
  // Self-contained: nothing loaded from elsewhere.
  EXPECT_EQ(page->body.find("http://"), std::string::npos);
  EXPECT_EQ(page->body.find("https://"), std::string::npos);

  httplib::Result state = http.Get("/api/state");
  ASSERT_TRUE(state) << httplib::to_string(state.error());
  EXPECT_EQ(state->status, 200);
  EXPECT_EQ(state->get_header_value("Content-Type"), "application/json");
  // Each list reads back as the gRPC API's own answer.
  google::protobuf::util::JsonParseOptions lenient;
  lenient.ignore_unknown_fields = true;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(state->body, &workers, lenient).ok())
      << state->body;
  ASSERT_EQ(workers.workers_size(), cluster_->num_workers());
  for (const v1::WorkerInfo& w : workers.workers()) EXPECT_EQ(w.state(), v1::ALIVE) << w.name();
  v1::ListMeshesResponse meshes;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(state->body, &meshes, lenient).ok());
  bool found_mesh = false;
  for (const v1::MeshInfo& m : meshes.meshes()) {
    if (m.name() != "d_pair") continue;
    found_mesh = true;
    EXPECT_EQ(m.workers_size(), 2);
  }
  EXPECT_TRUE(found_mesh) << state->body;
  v1::ListTensorsResponse tensors;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(state->body, &tensors, lenient).ok());
  bool found_tensor = false;
  for (const v1::TensorInfo& info : tensors.tensors()) {
    if (info.name() != "d_t") continue;
    found_tensor = true;
    EXPECT_EQ(info.mesh(), "d_pair");
    EXPECT_EQ(info.spec(), "S(1)");
    EXPECT_EQ(info.version(), t->version());
    EXPECT_EQ(info.bytes(), 6 * 4 * 4);
    EXPECT_FALSE(info.has_layout());
  }
  EXPECT_TRUE(found_tensor) << state->body;
  EXPECT_TRUE(client.DeleteTensor("d_t").ok());
}

TEST(ExpositionParserTest, RejectsWhatIsNotExposition) {
  EXPECT_FALSE(Parse("x 1\n").ok());  // No HELP/TYPE.
  EXPECT_FALSE(Parse("# HELP x X.\n# TYPE x counter\nx{a=\"1\" 1\n").ok());
  EXPECT_FALSE(Parse("# HELP x X.\n# TYPE x counter\nx one\n").ok());
  absl::StatusOr<Exposition> ok =
      Parse("# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\",a=\"q\\\"\"} 2\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->ValueOr0("h_bucket", {{"a", "q\""}, {"le", "+Inf"}}), 2);
}

TEST_F(MetricsTest, ARedistributeMovesTheCountersByExactlyThePlan) {
  CoordinatorClient& client = cluster_->client();
  absl::StatusOr<v1::MeshInfo> mesh = MakeMesh(client, "m_line", {4}, {"w0", "w1", "w2", "w3"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const Shape shape = {64, 32};
  absl::StatusOr<v1::TensorInfo> t =
      CreateFilled(client, "m_t", shape, DType::kF32, "m_line", "S(0)");
  ASSERT_TRUE(t.ok()) << t.status();

  absl::StatusOr<Exposition> before = Scrape();
  ASSERT_TRUE(before.ok()) << before.status();
  std::vector<Exposition> workers_before;
  for (int i = 0; i < cluster_->num_workers(); ++i) {
    absl::StatusOr<Exposition> w = Scrape(i);
    ASSERT_TRUE(w.ok()) << "worker " << i << ": " << w.status();
    for (const char* family :
         {"shardcoord_worker_communicator_builds_total",
          "shardcoord_worker_communicator_aborts_total", "shardcoord_worker_communicators",
          "shardcoord_worker_buffers", "shardcoord_worker_buffer_bytes"}) {
      EXPECT_TRUE(w->types.count(family)) << family;
    }
    workers_before.push_back(*std::move(w));
  }
  for (const char* family :
       {"shardcoord_plans_total", "shardcoord_plan_duration_seconds", "shardcoord_plan_bytes",
        "shardcoord_plan_bytes_moved_total", "shardcoord_plan_lower_bound_bytes_total",
        "shardcoord_workers", "shardcoord_heartbeats_missed_total", "shardcoord_rpcs_total",
        "shardcoord_rpc_duration_seconds", "shardcoord_upload_bytes_total",
        "shardcoord_download_bytes_total"}) {
    EXPECT_TRUE(before->types.count(family)) << family;
  }
  EXPECT_EQ(before->types.at("shardcoord_plans_total"), "counter");
  EXPECT_EQ(before->types.at("shardcoord_workers"), "gauge");
  EXPECT_EQ(before->types.at("shardcoord_plan_duration_seconds"), "histogram");
  EXPECT_EQ(before->ValueOr0("shardcoord_workers", {{"state", "alive"}}), 4);

  absl::StatusOr<v1::RedistributeResponse> moved =
      client.Redistribute(RedistributeTo("m_t", "", "S(1)"));
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_EQ(moved->progress().state(), v1::COMMITTED);
  ASSERT_GT(moved->plan().bytes_moved(), 0);
  ASSERT_TRUE(DownloadAndCheck(client, "m_t", DType::kF32, shape, FillKind::kArange).ok());

  absl::StatusOr<Exposition> after = Scrape();
  ASSERT_TRUE(after.ok()) << after.status();
  auto delta = [&](const std::string& name, const std::map<std::string, std::string>& labels) {
    return after->ValueOr0(name, labels) - before->ValueOr0(name, labels);
  };
  const std::map<std::string, std::string> redistribute = {{"op", "redistribute"}};
  EXPECT_EQ(delta("shardcoord_plans_total", {{"op", "redistribute"}, {"state", "committed"}}), 1);
  EXPECT_EQ(delta("shardcoord_plans_total", {{"op", "redistribute"}, {"state", "aborted"}}), 0);
  EXPECT_EQ(delta("shardcoord_plan_bytes_moved_total", {}), moved->plan().bytes_moved());
  EXPECT_EQ(delta("shardcoord_plan_lower_bound_bytes_total", {}),
            moved->plan().lower_bound_bytes());
  EXPECT_EQ(delta("shardcoord_plan_bytes_count", redistribute), 1);
  EXPECT_EQ(delta("shardcoord_plan_bytes_sum", redistribute), moved->plan().bytes_moved());
  EXPECT_EQ(delta("shardcoord_plan_duration_seconds_count", redistribute), 1);
  EXPECT_EQ(delta("shardcoord_rpcs_total",
                  {{"method", "shardcoord.v1.Coordinator/Redistribute"}, {"code", "OK"}}),
            1);
  EXPECT_EQ(delta("shardcoord_rpc_duration_seconds_count",
                  {{"method", "shardcoord.v1.Coordinator/Redistribute"}}),
            1);
  EXPECT_EQ(delta("shardcoord_download_bytes_total", {}), 64 * 32 * 4);
  EXPECT_EQ(delta("shardcoord_heartbeats_missed_total", {}), 0);

  // Every worker took part: the first plan of its group built a communicator (no other plan
  // ran in this cluster), and nothing was aborted.
  for (int i = 0; i < cluster_->num_workers(); ++i) {
    absl::StatusOr<Exposition> w = Scrape(i);
    ASSERT_TRUE(w.ok()) << "worker " << i << ": " << w.status();
    const Exposition& b = workers_before[i];
    const std::string builds = "shardcoord_worker_communicator_builds_total";
    const std::string aborts = "shardcoord_worker_communicator_aborts_total";
    EXPECT_GE(w->ValueOr0(builds, {{"result", "ok"}}) - b.ValueOr0(builds, {{"result", "ok"}}), 1)
        << "worker " << i;
    EXPECT_EQ(w->ValueOr0(builds, {{"result", "error"}}), 0) << "worker " << i;
    EXPECT_EQ(w->ValueOr0(aborts, {{"reason", "plan_aborted"}}), 0) << "worker " << i;
    EXPECT_GE(w->ValueOr0("shardcoord_worker_communicators"), 1) << "worker " << i;
    // Its S(1) chunk (64x8 f32) at least; a dropped version may not be freed yet.
    EXPECT_GE(w->ValueOr0("shardcoord_worker_buffers"), 1) << "worker " << i;
    // The coordinator sent each participant its fragment once.
    const std::map<std::string, std::string> execute = {{"method", "shardcoord.v1.Worker/Execute"},
                                                        {"code", "OK"}};
    EXPECT_EQ(w->ValueOr0("shardcoord_rpcs_total", execute) -
                  b.ValueOr0("shardcoord_rpcs_total", execute),
              1)
        << "worker " << i;
    EXPECT_GE(w->ValueOr0("shardcoord_worker_buffer_bytes"), 64 * 8 * 4) << "worker " << i;
  }

  // A refused call is counted with its code.
  EXPECT_FALSE(client.Redistribute(RedistributeTo("m_none", "", "S(1)")).ok());
  absl::StatusOr<Exposition> refused = Scrape();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->ValueOr0(
                "shardcoord_rpcs_total",
                {{"method", "shardcoord.v1.Coordinator/Redistribute"}, {"code", "NOT_FOUND"}}) -
                after->ValueOr0(
                    "shardcoord_rpcs_total",
                    {{"method", "shardcoord.v1.Coordinator/Redistribute"}, {"code", "NOT_FOUND"}}),
            1);
  EXPECT_TRUE(client.DeleteTensor("m_t").ok());
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  shardcoord::ClusterOptions options;
  options.worker_flags = {"--http-listen=127.0.0.1:0"};
  return shardcoord::RunWithCluster(argc, argv, std::move(options));
}
