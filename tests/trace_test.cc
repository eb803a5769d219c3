// Issue 16, acceptance 3: the trace of a real plan (four workers over Gloo) is valid Chrome
// trace JSON with one track per rank, and its times hold together.

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/chrome_trace_check.h"
#include "client/plan_command.h"
#include "client/plan_trace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
}

}  // namespace
}  // namespace shardcoord

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new shardcoord::ClusterEnvironment());
  return RUN_ALL_TESTS();
}
