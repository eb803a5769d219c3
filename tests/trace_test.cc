// Issue 16, acceptance 3: the trace of a real plan (four workers over Gloo) is valid Chrome
// trace JSON with one track per rank, and its times hold together.

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/plan_command.h"
#include "common/chrome_trace_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/plan_trace.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

TEST(TraceTest, ARealPlanTracesEveryRankAsChromeJson) {
  Cluster* cluster = ClusterEnvironment::Get();
  ASSERT_NE(cluster, nullptr);
  CoordinatorClient& client = cluster->client();
  ASSERT_TRUE(MakeMesh(client, "grid", {2, 2}, {"w0", "w1", "w2", "w3"}).ok());
  ASSERT_TRUE(CreateFilled(client, "T", {64, 48}, DType::kF32, "grid", "S(0),R").ok());
  absl::StatusOr<v1::RedistributeResponse> moved =
      client.Redistribute(RedistributeTo("T", "", "R,S(1)"));
  ASSERT_TRUE(moved.ok()) << moved.status();
  const std::string plan_id = moved->progress().plan_id();

  absl::StatusOr<v1::PlanTrace> trace = client.GetPlanTrace(plan_id);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->state(), v1::COMMITTED);
  EXPECT_EQ(trace->op(), "redistribute");
  EXPECT_EQ(trace->tensor(), "T");
  ASSERT_EQ(trace->ranks_size(), 4);
  EXPECT_LE(trace->start_unix_us(), trace->transferred_unix_us());
  EXPECT_LE(trace->transferred_unix_us(), trace->end_unix_us());
  int64_t steps = 0;
  for (const v1::RankTrace& r : trace->ranks()) {
    SCOPED_TRACE(r.DebugString());
    EXPECT_EQ(r.worker(), absl::StrCat("w", cluster->WorkerIndexOfRank(r.rank())));
    // One host, one clock: each rank ran inside the plan's transfer phase.
    EXPECT_GE(r.start_unix_us(), trace->start_unix_us());
    EXPECT_LE(r.start_unix_us(), r.end_unix_us());
    EXPECT_LE(r.end_unix_us(), trace->transferred_unix_us());
    for (const v1::StepTiming& s : r.steps()) {
      EXPECT_GE(s.start_unix_us(), r.start_unix_us());
      EXPECT_LE(s.start_unix_us() + s.duration_us(), r.end_unix_us());
      EXPECT_FALSE(s.op().empty());
    }
    steps += r.steps_size();
  }
  EXPECT_GT(steps, 0);

  // What `shardctl plan trace` writes.
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/trace.json");
  std::ostringstream out, err;
  ASSERT_EQ(RunPlanTraceCommand(client, plan_id, path, out, err), 0) << err.str();
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("plan ", plan_id, " (COMMITTED), 4 ranks")));
  std::ifstream in(path);
  std::stringstream json;
  json << in.rdbuf();
  absl::StatusOr<ChromeTraceSummary> summary = CheckChromeTrace(json.str());
  ASSERT_TRUE(summary.ok()) << summary.status() << "\n" << json.str();
  ASSERT_EQ(summary->thread_names.size(), 5u);  // The coordinator and one track per rank.
  EXPECT_EQ(summary->thread_names.at(0), "coordinator");
  for (int64_t rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(summary->thread_names.at(rank + 1), HasSubstr(absl::StrCat("rank ", rank, " (w")));
    EXPECT_GE(summary->complete_events[rank + 1], 1) << "rank " << rank;  // Its fragment.
  }

  EXPECT_EQ(client.GetPlanTrace("no-such-plan").status().code(), absl::StatusCode::kNotFound);

  // The plan heads `shardctl plan list`, with its bytes against the lower bound.
  absl::StatusOr<v1::ListPlansResponse> plans = client.ListPlans(5);
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_GE(plans->plans_size(), 1);
  const v1::PlanSummary& newest = plans->plans(0);
  EXPECT_EQ(newest.plan_id(), plan_id);
  EXPECT_EQ(newest.op(), "redistribute");
  EXPECT_EQ(newest.tensor(), "T");
  EXPECT_EQ(newest.state(), v1::COMMITTED);
  EXPECT_EQ(newest.bytes_moved(), moved->plan().bytes_moved());
  EXPECT_EQ(newest.lower_bound_bytes(), moved->plan().lower_bound_bytes());
  EXPECT_EQ(newest.bytes_done(), newest.bytes_moved());
  std::ostringstream table, table_err;
  ASSERT_EQ(RunPlanListCommand(client, 5, /*json=*/false, table, table_err), 0) << table_err.str();
  EXPECT_THAT(table.str(),
              ::testing::ContainsRegex(absl::StrCat(plan_id, " +redistribute +T +COMMITTED")));
  std::ostringstream neg, neg_err;
  EXPECT_EQ(RunPlanListCommand(client, -1, false, neg, neg_err), 2);
  EXPECT_THAT(neg_err.str(), HasSubstr("--limit: -1"));
}

}  // namespace
}  // namespace shardcoord
