// What setting a model up costs: --tensors tensors created one CreateTensor at a time (the
// baseline, what a client did before CreateTensors) against one CreateTensors of all of them,
// and deleted one DeleteTensor at a time against one DeleteTensors by prefix, on one cluster
// in one run, alternating; plus one full ListTensors (every page).
//
//   bazel run -c opt //bench:bulk_bench -- [--json] [--reps 3] [--tensors 2000] [--workers 8]
//
// CPU (Gloo) workers, the coordinator's state in SQLite (--state-dir: every create is a
// durable commit, as in a deployment), tensors of 64 f32 with S(0) on a 1-d mesh of every
// worker, filled with arange. Timed at the client, best and median of --reps.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_common.h"
#include "client/coordinator_client.h"
#include "common/json_writer.h"
#include "tests/cluster.h"
#include "tests/tensor_check.h"

ABSL_FLAG(bool, json, false, "Print one JSON object with every number instead of text.");
ABSL_FLAG(int, reps, 3, "Timed repetitions of each kind.");
ABSL_FLAG(int, tensors, 2000, "Tensors created and deleted per repetition.");
ABSL_FLAG(int, workers, 8, "CPU workers.");
ABSL_FLAG(std::string, state_dir, "",
          "The coordinator's --state-dir (default: a fresh directory under /tmp).");

namespace shardcoord {
namespace {

using bench::Die;
using bench::OrDie;

std::string Name(int i) { return absl::StrFormat("b.%06d", i); }

v1::CreateTensorRequest Member(int i) {
  v1::CreateTensorRequest t;
  t.set_name(Name(i));
  t.add_shape(64);
  t.set_dtype(v1::F32);
  *t.mutable_spec() = SpecFromText("all", "S(0)");
  t.set_init(v1::ARANGE);
  return t;
}

double Seconds(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

int Main() {
  const int reps = absl::GetFlag(FLAGS_reps);
  const int tensors = absl::GetFlag(FLAGS_tensors);
  std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  if (state_dir.empty()) {
    char tmpl[] = "/tmp/bulk_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
    state_dir = tmpl;
  }
  ClusterOptions options;
  options.num_workers = absl::GetFlag(FLAGS_workers);
  options.state_dir = state_dir;
  options.echo_stdout = false;
  std::unique_ptr<Cluster> cluster = OrDie(Cluster::Start(options), "cluster");
  CoordinatorClient& client = cluster->client();
  OrDie(MakeMesh(client, "all", {options.num_workers}, cluster->WorkerNames()).status(), "mesh");

  v1::CreateTensorsRequest bulk;
  for (int i = 0; i < tensors; ++i) *bulk.add_tensors() = Member(i);
  bench::Stats create_one, create_bulk, delete_one, delete_bulk, list;
  for (int rep = 0; rep < reps; ++rep) {
    absl::Time start = absl::Now();
    for (int i = 0; i < tensors; ++i) OrDie(client.CreateTensor(Member(i)).status(), Name(i));
    create_one.seconds.push_back(Seconds(start));
    start = absl::Now();
    for (int i = 0; i < tensors; ++i) OrDie(client.DeleteTensor(Name(i)), Name(i));
    delete_one.seconds.push_back(Seconds(start));

    start = absl::Now();
    OrDie(client.CreateTensors(bulk).status(), "CreateTensors");
    create_bulk.seconds.push_back(Seconds(start));
    start = absl::Now();
    std::vector<v1::TensorInfo> all = OrDie(client.ListTensors("b."), "ListTensors");
    list.seconds.push_back(Seconds(start));
    if (static_cast<int>(all.size()) != tensors) {
      Die(absl::StrCat("listed ", all.size(), " tensors, not ", tensors));
    }
    if (rep == 0) {
      OrDie(DownloadAndCheck(client, Name(tensors - 1), DType::kF32, {64}, FillKind::kArange),
            "values");
    }
    start = absl::Now();
    const int64_t deleted = OrDie(client.DeleteTensors({}, "b."), "DeleteTensors");
    delete_bulk.seconds.push_back(Seconds(start));
    if (deleted != tensors) Die(absl::StrCat("deleted ", deleted, " tensors, not ", tensors));
  }

  const double create_ratio = create_one.Best() / create_bulk.Best();
  const double delete_ratio = delete_one.Best() / delete_bulk.Best();
  if (absl::GetFlag(FLAGS_json)) {
    JsonWriter w;
    w.BeginObject().Key("tensors").Int(tensors).Key("workers").Int(options.num_workers);
    w.Key("reps").Int(reps);
    auto series = [&w](const char* key, const bench::Stats& s) {
      w.Key(key).BeginObject().Key("best_seconds").Double(s.Best());
      w.Key("median_seconds").Double(s.Median()).EndObject();
    };
    series("create_each", create_one);
    series("create_bulk", create_bulk);
    series("delete_each", delete_one);
    series("delete_bulk", delete_bulk);
    series("list_all", list);
    w.Key("create_each_over_bulk").Double(create_ratio);
    w.Key("delete_each_over_bulk").Double(delete_ratio);
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    auto line = [](const char* what, const bench::Stats& s) {
      std::printf("%-40s best %8.3f s  median %8.3f s\n", what, s.Best(), s.Median());
    };
    std::printf("%d tensors of 64 f32, S(0) on %d workers, SQLite state, %d reps\n", tensors,
                options.num_workers, reps);
    line("CreateTensor, one call per tensor", create_one);
    line("CreateTensors, one call", create_bulk);
    line("DeleteTensor, one call per tensor", delete_one);
    line("DeleteTensors by prefix, one call", delete_bulk);
    line("ListTensors, every page", list);
    std::printf("create: each / bulk = %.1fx; delete: each / bulk = %.1fx\n", create_ratio,
                delete_ratio);
  }
  return 0;
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  return shardcoord::bench::Main(argc, argv, "bulk_bench", shardcoord::Main);
}
