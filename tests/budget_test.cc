// Memory budgets over real daemons (issue 10): four Gloo workers with --memory-budget=16MiB.
// A group whose new buffers cannot fit is refused with RESOURCE_EXHAUSTED naming the worker
// and changes nothing; one whose buffers fit only with small buckets completes with every
// value checked and each worker's peak, from its own accounting, within its budget; creates
// and uploads beyond the budget are refused the same way; a plan that does not fit next to a
// running one waits for it (observed through its progress, not a sleep) and then runs.
//
// Tensors are f32 on a 4-rank mesh, S(0): a [2048, 1024] tensor (8 MiB) holds 2 MiB per
// worker; S(0) -> S(1) gives every worker a new 2 MiB buffer and sends 3 strided pieces of
// 512 KiB, which are packed (staged) before they leave.

#include <signal.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "sharding/staging.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kBudget = 16 * kMiB;
const Shape kEight = {2048, 1024};  // 8 MiB: 2 MiB per worker under S(0).

class BudgetTest : public ClusterTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(ClusterTest::SetUp());
    static bool made = false;
    if (!made) {
      absl::StatusOr<v1::MeshInfo> mesh = MakeMesh(client(), "line", {4}, cluster_->WorkerNames());
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      made = true;
    }
    // Every earlier test deleted its tensors: wait until the workers report holding nothing,
    // so each test starts from empty workers (a condition, polled; not a sleep).
    ASSERT_NO_FATAL_FAILURE(AwaitWorkersHoldingAtMost(0));
  }

  void AwaitWorkersHoldingAtMost(int64_t bytes) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (true) {
      absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client().ListWorkers();
      ASSERT_TRUE(workers.ok()) << workers.status();
      bool done = true;
      std::string report;
      for (const v1::WorkerInfo& w : *workers) {
        ASSERT_EQ(w.memory_budget_bytes(), kBudget) << w.name();
        done &= w.memory_used_bytes() <= bytes;
        absl::StrAppend(&report, " ", w.name(), "=", w.memory_used_bytes());
      }
      if (done) return;
      ASSERT_LT(absl::Now(), deadline) << "workers still report holding" << report;
      absl::SleepFor(absl::Milliseconds(50));  // Polling interval of the condition.
    }
  }

  void Create(const std::string& name, const Shape& shape) {
    absl::StatusOr<v1::TensorInfo> t =
        CreateFilled(client(), name, shape, DType::kF32, "line", "S(0)");
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
  }

  void ExpectArange(const std::string& name, const Shape& shape) {
    absl::Status s = DownloadAndCheck(client(), name, DType::kF32, shape, FillKind::kArange);
    EXPECT_TRUE(s.ok()) << name << ": " << s;
  }

  void Delete(const std::vector<std::string>& names) {
    for (const std::string& n : names) EXPECT_TRUE(client().DeleteTensor(n).ok()) << n;
  }

  // A value of the coordinator's /metrics, or -1.
  double CoordinatorMetric(const std::string& series) {
    const std::string& address = cluster_->metrics_address();
    if (address.empty()) return -1;
    const size_t colon = address.rfind(':');
    httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
    httplib::Result res = http.Get("/metrics");
    if (!res || res->status != 200) return -1;
    for (absl::string_view line : absl::StrSplit(res->body, '\n')) {
      if (!absl::StartsWith(line, series + " ")) continue;
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
    return -1;
  }
};

TEST_F(BudgetTest, AGroupThatDoesNotFitIsRefusedNamingTheWorkerAndChangesNothing) {
  const std::vector<std::string> names = {"big0", "big1", "big2", "big3"};
  std::map<std::string, int64_t> versions;
  for (const std::string& n : names) {
    ASSERT_NO_FATAL_FAILURE(Create(n, kEight));
    versions[n] = client().GetTensor(n)->version();
  }
  absl::StatusOr<v1::ListPlansResponse> plans_before = client().ListPlans(1000);
  ASSERT_TRUE(plans_before.ok());
  // Replicating all four needs 4 x 8 MiB more on every worker, which holds 8 MiB of 16.
  v1::RedistributeGroupRequest group;
  for (const std::string& n : names) {
    v1::RedistributeItem* item = group.add_redistributes();
    item->set_tensor(n);
    *item->mutable_target() = SpecFromText("", "R");
  }
  group.set_wait(true);
  absl::StatusOr<v1::RedistributeGroupResponse> r = client().RedistributeGroup(group);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("worker w"), HasSubstr(" needs "),
                    HasSubstr(absl::StrCat("new buffers ", 4 * 8 * kMiB)),
                    HasSubstr(absl::StrCat("has ", 8 * kMiB, " bytes (8.00 MiB) free")),
                    HasSubstr(absl::StrCat("of its ", kBudget, "-byte budget"))));
  // Nothing started, nothing changed: same versions, layouts and values, nothing busy.
  absl::StatusOr<v1::ListPlansResponse> plans_after = client().ListPlans(1000);
  ASSERT_TRUE(plans_after.ok());
  EXPECT_EQ(plans_after->plans_size(), plans_before->plans_size());
  for (const std::string& n : names) {
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(n);
    ASSERT_TRUE(t.ok()) << n;
    EXPECT_EQ(t->version(), versions[n]) << n;
    EXPECT_EQ(t->spec(), "S(0)") << n;
    EXPECT_TRUE(t->busy_plan().empty()) << n;
    ExpectArange(n, kEight);
  }
  Delete(names);
}

TEST_F(BudgetTest, AGroupThatFitsOnlyWithSmallBucketsCompletesWithinEveryBudget) {
  // Ballast: 7 MiB per worker; with a and b, 11 of 16 MiB are committed. Moving a and b to
  // S(1) takes 4 MiB of new buffers, leaving 1 MiB for the group's staging, where default
  // 64 MiB buckets would stage 2 MiB (a window of every stream each way).
  const Shape ballast = {7 * 1024, 1024};
  ASSERT_NO_FATAL_FAILURE(Create("ballast", ballast));
  ASSERT_NO_FATAL_FAILURE(Create("a", kEight));
  ASSERT_NO_FATAL_FAILURE(Create("b", kEight));
  v1::RedistributeGroupRequest group;
  for (const char* n : {"a", "b"}) {
    v1::RedistributeItem* item = group.add_redistributes();
    item->set_tensor(n);
    *item->mutable_target() = SpecFromText("", "S(1)");
  }
  group.set_wait(true);
  absl::StatusOr<v1::RedistributeGroupResponse> r = client().RedistributeGroup(group);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::COMMITTED);
  ASSERT_EQ(r->members_size(), 2);
  for (const v1::RedistributeGroupMember& m : r->members()) {
    EXPECT_EQ(m.progress().state(), v1::COMMITTED) << m.tensor();
    // The group runs as one fused fragment per worker with the bucket that fits: its
    // kBucketsInFlight buckets within the 1 MiB left (its streams, 1 MiB to each peer and
    // from each, would stage 2 MiB with the default buckets).
    EXPECT_GE(m.progress().bucket_bytes(), kMinBucketBytes) << m.tensor();
    EXPECT_LE(m.progress().bucket_bytes(), kMiB / kBucketsInFlight) << m.tensor();
    EXPECT_EQ(m.progress().bucket_bytes(), r->bucket_bytes()) << m.tensor();
    // Each worker's own accounting while its fragment ran: the buffers (ballast, a, b and
    // this member's new 2 MiB at least) were counted, and the peak stayed in the budget.
    absl::StatusOr<v1::PlanTrace> trace = client().GetPlanTrace(m.progress().plan_id());
    ASSERT_TRUE(trace.ok()) << trace.status();
    ASSERT_EQ(trace->ranks_size(), 4);
    for (const v1::RankTrace& rank : trace->ranks()) {
      EXPECT_EQ(rank.memory_budget_bytes(), kBudget) << rank.worker();
      EXPECT_GE(rank.memory_peak_bytes(), 13 * kMiB) << rank.worker();
      EXPECT_LE(rank.memory_peak_bytes(), kBudget) << rank.worker();
    }
  }
  ExpectArange("a", kEight);
  ExpectArange("b", kEight);
  ExpectArange("ballast", ballast);
  EXPECT_EQ(client().GetTensor("a")->spec(), "S(1)");
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client().ListWorkers();
  ASSERT_TRUE(workers.ok());
  for (const v1::WorkerInfo& w : *workers) {
    EXPECT_LE(w.memory_peak_bytes(), kBudget) << w.name();
    EXPECT_EQ(w.bucket_bytes(), kDefaultBucketBytes) << w.name();
  }
  Delete({"ballast", "a", "b"});
}

TEST_F(BudgetTest, CreatesAndUploadsBeyondTheBudgetAreRefused) {
  // 20 MiB per worker.
  absl::StatusOr<v1::TensorInfo> created =
      CreateFilled(client(), "huge", {20 * 1024, 1024}, DType::kF32, "line", "S(0)");
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(created.status().message(),
              AllOf(HasSubstr("creating 'huge': worker w"),
                    HasSubstr(absl::StrCat("needs ", 20 * kMiB, " bytes")),
                    HasSubstr(absl::StrCat("of its ", kBudget, "-byte budget"))));
  EXPECT_EQ(client().GetTensor("huge").status().code(), absl::StatusCode::kNotFound);
  // 18 MiB replicated on every worker.
  const Shape shape = {18 * 256, 1024};
  std::string data(static_cast<size_t>(18 * kMiB), '\0');
  v1::TensorHeader header;
  header.set_name("huge_upload");
  for (int64_t d : shape) header.add_shape(d);
  header.set_dtype(DTypeToProto(DType::kF32));
  *header.mutable_spec() = SpecFromText("line", "R");
  absl::StatusOr<v1::TensorInfo> uploaded = client().Upload(header, data);
  ASSERT_FALSE(uploaded.ok());
  EXPECT_EQ(uploaded.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(uploaded.status().message(),
              AllOf(HasSubstr("uploading 'huge_upload': worker w"),
                    HasSubstr(absl::StrCat("needs ", 18 * kMiB, " bytes"))));
  EXPECT_EQ(client().GetTensor("huge_upload").status().code(), absl::StatusCode::kNotFound);
  // The workers hold nothing of either.
  ASSERT_NO_FATAL_FAILURE(AwaitWorkersHoldingAtMost(0));
}

TEST_F(BudgetTest, APlanWaitsForAnotherToReleaseMemoryThenRuns) {
  // Ballast 8.5 MiB + a + b: 12.5 of 16 MiB committed. p1 (a -> S(1)) takes 2 MiB of new
  // buffers and the remaining 1.5 MiB for its buckets; p2 (b -> S(1)) cannot fit next to it,
  // and fits once p1 has committed.
  const Shape ballast = {8704, 1024};
  ASSERT_NO_FATAL_FAILURE(Create("ballast2", ballast));
  ASSERT_NO_FATAL_FAILURE(Create("a2", kEight));
  ASSERT_NO_FATAL_FAILURE(Create("b2", kEight));
  const double waited_before =
      CoordinatorMetric("shardcoord_plan_admission_wait_seconds_count{result=\"waited\"}");
  // p1 cannot end while worker 3 is stopped: it holds its memory for as long as we need.
  ASSERT_TRUE(cluster_->SignalWorker(3, SIGSTOP).ok());
  absl::StatusOr<v1::RedistributeResponse> p1 =
      client().Redistribute(RedistributeTo("a2", "", "S(1)", false, /*wait=*/false));
  absl::StatusOr<v1::RedistributeResponse> p2 =
      client().Redistribute(RedistributeTo("b2", "", "S(1)", false, /*wait=*/false));
  ASSERT_TRUE(cluster_->SignalWorker(3, SIGCONT).ok());
  ASSERT_TRUE(p1.ok()) << p1.status();
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_GT(p1->progress().bucket_bytes(), 0);  // Admitted at once.
  EXPECT_TRUE(p1->progress().waiting_for_memory().empty());
  EXPECT_EQ(p2->progress().state(), v1::PENDING);
  EXPECT_EQ(p2->progress().bucket_bytes(), 0);
  EXPECT_THAT(p2->progress().waiting_for_memory(),
              AllOf(HasSubstr("worker w"), HasSubstr("needs")));
  absl::StatusOr<v1::PlanProgress> end1 = client().WatchPlan(p1->progress().plan_id(), nullptr);
  ASSERT_TRUE(end1.ok()) << end1.status();
  EXPECT_EQ(end1->state(), v1::COMMITTED) << end1->error();
  absl::StatusOr<v1::PlanProgress> end2 = client().WatchPlan(p2->progress().plan_id(), nullptr);
  ASSERT_TRUE(end2.ok()) << end2.status();
  EXPECT_EQ(end2->state(), v1::COMMITTED) << end2->error();
  EXPECT_GT(end2->bucket_bytes(), 0);
  EXPECT_TRUE(end2->waiting_for_memory().empty());
  if (waited_before >= 0) {
    EXPECT_EQ(CoordinatorMetric("shardcoord_plan_admission_wait_seconds_count{result=\"waited\"}"),
              waited_before + 1);
  }
  ExpectArange("a2", kEight);
  ExpectArange("b2", kEight);
  ExpectArange("ballast2", ballast);
  Delete({"ballast2", "a2", "b2"});
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  shardcoord::ClusterOptions options;
  options.worker_flags = {"--memory-budget=16MiB"};
  // A worker is stopped (SIGSTOP) while a plan waits: it must not be declared dead; no
  // waiting plan times out on a slow machine.
  options.coordinator_flags = {"--heartbeat-timeout=120s", "--admission-timeout=300s"};
  return shardcoord::RunWithCluster(argc, argv, std::move(options));
}
