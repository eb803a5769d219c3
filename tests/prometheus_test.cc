// Both daemons' /metrics as Prometheus itself reads them (issue 25), with Debian's
// `prometheus` package (tools/setup.sh installs it; the test fails without it):
// - `promtool check metrics` finds nothing to complain about on the coordinator's and every
//   worker's /metrics, on a fresh cluster and after plans, transfers and refused calls;
// - a real Prometheus server started here on loopback (its own config, storage under
//   TEST_TMPDIR, scraping every second) scrapes the coordinator and every worker (`up == 1`
//   for each target), and after the redistributes the test runs, its queries return exactly
//   that many committed plans (the coordinator's shardcoord_plans_total) and that many
//   Execute calls on each worker (the workers' shardcoord_rpcs_total).

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/cluster.h"
#include "tests/etcd_process.h"
#include "tests/process.h"
#include "tests/tensor_check.h"
#include "tests/test_files.h"

namespace shardcoord {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kPromtool[] = "/usr/bin/promtool";
constexpr char kMissing[] = " is missing: Debian's prometheus package (bash tools/setup.sh)";
constexpr int kWorkers = 3;
// Bound on every condition polled; never reached when all is well.
constexpr absl::Duration kTimeout = absl::Seconds(90);
constexpr absl::Duration kPoll = absl::Milliseconds(100);

bool Executable(const char* path) { return access(path, X_OK) == 0; }

// GET http://`address``path`: the body of a 200 answer.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  http.set_connection_timeout(10);
  http.set_read_timeout(30);
  httplib::Result res = http.Get(path.c_str());
  if (!res) return absl::UnavailableError(httplib::to_string(res.error()));
  if (res->status != 200) {
    return absl::InternalError(absl::StrCat("HTTP ", res->status, ": ", res->body));
  }
  return res->body;
}

// `promtool check metrics` on `text`: OK when it exits 0 and prints nothing; otherwise its
// complaints.
absl::Status Promtool(const std::string& label, const std::string& text) {
  const std::string file = absl::StrCat(TmpDir(), "/", label, ".metrics");
  WriteFile(file, text);
  const std::string command = absl::StrCat(kPromtool, " check metrics < '", file, "' 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen failed");
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !output.empty()) {
    return absl::InternalError(absl::StrCat("promtool on ", label, "'s /metrics (", file, ", exit ",
                                            WEXITSTATUS(status), "):\n", output));
  }
  return absl::OkStatus();
}

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Executable(kPromtool)) << kPromtool << kMissing;
    ASSERT_TRUE(Executable(kPrometheus)) << kPrometheus << kMissing;
    ClusterOptions options;
    options.num_workers = kWorkers;
    options.worker_flags = {"--http-listen=127.0.0.1:0"};
    absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    ASSERT_FALSE(cluster_->metrics_address().empty());
    for (int i = 0; i < kWorkers; ++i) {
      ASSERT_FALSE(cluster_->worker_metrics_address(i).empty()) << "worker " << i;
    }
    ASSERT_TRUE(MakeMesh(client(), "all", {kWorkers}, cluster_->WorkerNames()).ok());
  }

  CoordinatorClient& client() { return cluster_->client(); }

  // Every daemon's /metrics, by label ("coordinator", "w0", ...).
  std::map<std::string, std::string> ScrapeAll() {
    std::map<std::string, std::string> out;
    absl::StatusOr<std::string> c = HttpGet(cluster_->metrics_address(), "/metrics");
    EXPECT_TRUE(c.ok()) << c.status();
    out["coordinator"] = c.value_or("");
    for (int i = 0; i < kWorkers; ++i) {
      absl::StatusOr<std::string> w = HttpGet(cluster_->worker_metrics_address(i), "/metrics");
      EXPECT_TRUE(w.ok()) << w.status();
      out[Cluster::WorkerName(i)] = w.value_or("");
    }
    return out;
  }

  // `n` redistributes of a fresh tensor over every worker (S(0) <-> S(1)), each committed.
  void Redistribute(const std::string& tensor, int n) {
    const Shape shape = {48, 16};
    ASSERT_TRUE(CreateFilled(client(), tensor, shape, DType::kF32, "all", "S(0)").ok());
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<v1::RedistributeResponse> r =
          client().Redistribute(RedistributeTo(tensor, "", i % 2 == 0 ? "S(1)" : "S(0)"));
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->progress().state(), v1::COMMITTED) << r->progress().error();
    }
    absl::Status values = DownloadAndCheck(client(), tensor, DType::kF32, shape, FillKind::kArange);
    ASSERT_TRUE(values.ok()) << values;
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(PrometheusTest, PromtoolFindsNothingToLintOnEitherDaemon) {
  for (const auto& [label, text] : ScrapeAll()) {
    absl::Status lint = Promtool(absl::StrCat(label, "-fresh"), text);
    EXPECT_TRUE(lint.ok()) << lint;
  }
  // Every family gets samples: plans, transfers, histograms, and calls that failed.
  ASSERT_NO_FATAL_FAILURE(Redistribute("lint", 2));
  EXPECT_EQ(client().GetTensor("no_such_tensor").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(client().Redistribute(RedistributeTo("lint", "", "S(7)")).ok());
  for (const auto& [label, text] : ScrapeAll()) {
    absl::Status lint = Promtool(absl::StrCat(label, "-busy"), text);
    EXPECT_TRUE(lint.ok()) << lint;
    if (label == "coordinator") {
      EXPECT_NE(text.find("shardcoord_plans_total{"), std::string::npos) << text;
      EXPECT_NE(text.find("shardcoord_plan_duration_seconds_bucket{"), std::string::npos);
    } else {
      EXPECT_NE(text.find("shardcoord.v1.Worker/Execute"), std::string::npos) << label;
    }
  }
}

// A Prometheus server on loopback, scraping every second; stopped (SIGTERM) with the test.
class PrometheusServer {
 public:
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const std::map<std::string, std::vector<std::string>>& targets_by_job) {
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    const std::string dir = absl::StrCat(TmpDir(), "/prometheus");
    std::string config =
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n";
    for (const auto& [job, targets] : targets_by_job) {
      absl::StrAppend(&config, "  - job_name: ", job, "\n    static_configs:\n      - targets: ['",
                      absl::StrJoin(targets, "', '"), "']\n");
    }
    const std::string config_file = absl::StrCat(TmpDir(), "/prometheus.yml");
    WriteFile(config_file, config);
    std::unique_ptr<PrometheusServer> server(new PrometheusServer());
    server->address_ = absl::StrCat("127.0.0.1:", *port);
    server->log_ = absl::StrCat(TmpDir(), "/prometheus.log");
    ProcessOptions po;
    po.name = "prometheus";
    po.stderr_path = server->log_;
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(
        {kPrometheus, absl::StrCat("--config.file=", config_file),
         absl::StrCat("--storage.tsdb.path=", dir),
         absl::StrCat("--web.listen-address=", server->address_), "--log.level=warn"},
        po);
    if (!p.ok()) return p.status();
    server->process_ = *std::move(p);
    // Ready once its TSDB is open and the config loaded.
    const absl::Time deadline = absl::Now() + kTimeout;
    while (true) {
      absl::StatusOr<std::string> ready = HttpGet(server->address_, "/-/ready");
      if (ready.ok()) break;
      const bool exited = server->process_->Wait(absl::ZeroDuration()).ok();
      if (exited || absl::Now() > deadline) {
        return absl::UnavailableError(
            absl::StrCat("prometheus not ready: ", ready.status().ToString(), "; its log:\n",
                         ReadFile(server->log_)));
      }
      absl::SleepFor(kPoll);  // Polling its readiness endpoint.
    }
    return server;
  }

  const std::string& log() const { return log_; }

  // An instant query: each series' labels and value.
  struct Series {
    std::map<std::string, std::string> labels;
    double value = 0;
  };
  absl::StatusOr<std::vector<Series>> Query(const std::string& promql) {
    absl::StatusOr<std::string> body =
        HttpGet(address_, httplib::append_query_params("/api/v1/query", {{"query", promql}}));
    if (!body.ok()) return body.status();
    google::protobuf::Struct answer;
    if (!google::protobuf::util::JsonStringToMessage(*body, &answer).ok()) {
      return absl::InternalError(absl::StrCat("not JSON: ", *body));
    }
    const auto& f = answer.fields();
    if (!f.count("status") || f.at("status").string_value() != "success" || !f.count("data")) {
      return absl::InternalError(absl::StrCat("query ", promql, ": ", *body));
    }
    const auto& data = f.at("data").struct_value().fields();
    if (!data.count("resultType") || data.at("resultType").string_value() != "vector") {
      return absl::InternalError(absl::StrCat("not a vector: ", *body));
    }
    std::vector<Series> out;
    for (const google::protobuf::Value& r : data.at("result").list_value().values()) {
      Series s;
      const auto& item = r.struct_value().fields();
      for (const auto& [k, v] : item.at("metric").struct_value().fields()) {
        s.labels[k] = v.string_value();
      }
      const auto& value = item.at("value").list_value().values();  // [time, "value"]
      if (value.size() != 2 || !absl::SimpleAtod(value[1].string_value(), &s.value)) {
        return absl::InternalError(absl::StrCat("bad value in ", *body));
      }
      out.push_back(std::move(s));
    }
    return out;
  }

  // Polls `promql` until `done` holds for its answer; DEADLINE_EXCEEDED with the last one.
  absl::StatusOr<std::vector<Series>> AwaitQuery(
      const std::string& promql, const std::function<bool(const std::vector<Series>&)>& done) {
    const absl::Time deadline = absl::Now() + kTimeout;
    std::string last;
    while (true) {
      absl::StatusOr<std::vector<Series>> r = Query(promql);
      if (r.ok() && done(*r)) return r;
      if (r.ok()) {
        std::vector<std::string> shown;
        for (const Series& s : *r) {
          std::vector<std::string> labels;
          for (const auto& [k, v] : s.labels) labels.push_back(absl::StrCat(k, "=", v));
          shown.push_back(absl::StrCat("{", absl::StrJoin(labels, ","), "} ", s.value));
        }
        last = absl::StrJoin(shown, "; ");
      } else {
        last = r.status().ToString();
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("query ", promql, " never answered as expected; last: [", last, "]"));
      }
      absl::SleepFor(kPoll);  // Scrapes come every second: poll the query.
    }
  }

 private:
  PrometheusServer() = default;
  std::string address_;
  std::string log_;
  std::unique_ptr<Process> process_;
};

TEST_F(PrometheusTest, APrometheusServerScrapesTheCoordinatorAndEveryWorker) {
  std::vector<std::string> workers;
  for (int i = 0; i < kWorkers; ++i) workers.push_back(cluster_->worker_metrics_address(i));
  absl::StatusOr<std::unique_ptr<PrometheusServer>> prometheus = PrometheusServer::Start(
      {{"shardcoord-coordinator", {cluster_->metrics_address()}}, {"shardcoord-workers", workers}});
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();
  PrometheusServer& p = **prometheus;

  // Every target scraped and up.
  absl::StatusOr<std::vector<PrometheusServer::Series>> up =
      p.AwaitQuery("up", [](const std::vector<PrometheusServer::Series>& r) {
        int ups = 0;
        for (const auto& s : r) ups += s.value == 1;
        return ups == kWorkers + 1;
      });
  ASSERT_TRUE(up.ok()) << up.status() << "\nprometheus log:\n" << ReadFile(p.log());
  ASSERT_EQ(up->size(), kWorkers + 1u);
  std::map<std::string, std::string> job_of;
  for (const auto& s : *up) job_of[s.labels.at("instance")] = s.labels.at("job");
  EXPECT_EQ(job_of[cluster_->metrics_address()], "shardcoord-coordinator");
  for (const std::string& w : workers) EXPECT_EQ(job_of[w], "shardcoord-workers") << w;

  // Nothing planned yet: no committed plan in what was scraped.
  absl::StatusOr<std::vector<PrometheusServer::Series>> none =
      p.Query("sum(shardcoord_plans_total{job=\"shardcoord-coordinator\",op=\"redistribute\"})");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty() || (*none)[0].value == 0);

  constexpr int kPlans = 3;
  ASSERT_NO_FATAL_FAILURE(Redistribute("scraped", kPlans));
  // The coordinator's counter, scraped: exactly the plans this test ran. It only grows, so
  // more is a failure at once.
  bool overshot = false;
  absl::StatusOr<std::vector<PrometheusServer::Series>> plans = p.AwaitQuery(
      "shardcoord_plans_total{job=\"shardcoord-coordinator\",op=\"redistribute\","
      "state=\"committed\"}",
      [&](const std::vector<PrometheusServer::Series>& r) {
        if (r.size() == 1 && r[0].value > kPlans) overshot = true;
        return overshot || (r.size() == 1 && r[0].value == kPlans);
      });
  ASSERT_TRUE(plans.ok()) << plans.status();
  EXPECT_FALSE(overshot) << "more committed plans than the " << kPlans << " this test ran";
  EXPECT_EQ((*plans)[0].labels.at("instance"), cluster_->metrics_address());

  // Each worker executed one fragment of each plan: its own counter, scraped.
  absl::StatusOr<std::vector<PrometheusServer::Series>> executes = p.AwaitQuery(
      "shardcoord_rpcs_total{job=\"shardcoord-workers\",method=\"shardcoord.v1.Worker/"
      "Execute\",code=\"OK\"}",
      [&](const std::vector<PrometheusServer::Series>& r) {
        int done = 0;
        for (const auto& s : r) done += s.value >= kPlans;
        return done == kWorkers;
      });
  ASSERT_TRUE(executes.ok()) << executes.status();
  for (const auto& s : *executes) {
    EXPECT_EQ(s.value, kPlans) << s.labels.at("instance");
  }
}

}  // namespace
}  // namespace shardcoord
