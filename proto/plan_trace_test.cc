#include "proto/plan_trace.h"

#include "common/chrome_trace_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

v1::PlanTrace TwoRanks() {
  v1::PlanTrace t;
  t.set_plan_id("p-1.3");
  t.set_tensor("w");
  t.set_op("redistribute");
  t.set_state(v1::COMMITTED);
  t.set_start_unix_us(1000000);
  t.set_transferred_unix_us(1004000);
  t.set_end_unix_us(1005000);
  for (int r = 0; r < 2; ++r) {
    v1::RankTrace* rank = t.add_ranks();
    rank->set_rank(r);
    rank->set_worker(r == 0 ? "w0" : "w1");
    rank->set_start_unix_us(1001000);
    rank->set_end_unix_us(1003500);
    v1::StepTiming* s = rank->add_steps();
    s->set_index(0);
    s->set_op("all_to_all");
    s->set_start_unix_us(1001500);
    s->set_duration_us(1200);
    s->set_bytes_sent(4096);
    s->set_bytes_received(2048);
  }
  return t;
}

TEST(PlanTraceTest, OneTrackPerRankPlusTheCoordinator) {
  const std::string json = ChromeTraceJson(TwoRanks());
  absl::StatusOr<ChromeTraceSummary> s = CheckChromeTrace(json);
  ASSERT_TRUE(s.ok()) << s.status() << "\n" << json;
  EXPECT_THAT(s->thread_names,
              ElementsAre(Pair(0, "coordinator"), Pair(1, "rank 0 (w0)"), Pair(2, "rank 1 (w1)")));
  // transfer + validate/commit; a fragment and a step per rank.
  EXPECT_THAT(s->complete_events, ElementsAre(Pair(0, 2), Pair(1, 2), Pair(2, 2)));
  // Relative microseconds: the step starts 1.5 ms after the plan.
  EXPECT_THAT(json, HasSubstr("{\"name\": \"step 0 all_to_all\", \"ph\": \"X\", \"pid\": 1, "
                              "\"tid\": 1, \"ts\": 1500, \"dur\": 1200, \"args\": "
                              "{\"bytes_sent\": 4096, \"bytes_received\": 2048}}"));
}

TEST(PlanTraceTest, AnAbortedPlanWithoutReportsIsStillValid) {
  v1::PlanTrace t = TwoRanks();
  t.set_state(v1::ABORTED);
  t.set_error("worker w1 (rank 1) failed: out of memory");
  t.set_transferred_unix_us(0);
  t.mutable_ranks(1)->clear_steps();
  t.mutable_ranks(1)->set_start_unix_us(0);
  t.mutable_ranks(1)->set_end_unix_us(0);
  t.mutable_ranks(0)->set_error("peer gone");
  t.mutable_ranks(0)->set_end_unix_us(900000);  // A clock step back: clamped, not negative.
  const std::string json = ChromeTraceJson(t);
  absl::StatusOr<ChromeTraceSummary> s = CheckChromeTrace(json);
  ASSERT_TRUE(s.ok()) << s.status() << "\n" << json;
  EXPECT_EQ(s->thread_names.size(), 3u);
  EXPECT_THAT(json, HasSubstr("\"error\": \"peer gone\""));
  EXPECT_THAT(json, HasSubstr("\"state\": \"ABORTED\""));
}

TEST(ChromeTraceCheckTest, RefusesWhatPerfettoWouldNot) {
  EXPECT_FALSE(CheckChromeTrace("{").ok());
  EXPECT_FALSE(CheckChromeTrace("{\"events\": []}").ok());
  EXPECT_THAT(CheckChromeTrace(R"({"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 0,
                                            "ts": 0, "dur": -1}]})")
                  .status()
                  .message(),
              HasSubstr("traceEvents[0]: an X event needs numeric ts and dur >= 0"));
  EXPECT_FALSE(CheckChromeTrace(R"({"traceEvents": [{"name": "a", "ph": "X"}]})").ok());
}

}  // namespace
}  // namespace shardcoord
