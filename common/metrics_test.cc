#include "common/metrics.h"

#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(MetricsTest, RendersTheExpositionExactly) {
  Registry r;
  CounterFamily* plans =
      r.AddCounter("shardcoord_plans_total", "Plans by op and end state.", {"op", "state"});
  GaugeFamily* workers = r.AddGauge("shardcoord_workers", "Workers by state.", {"state"});
  HistogramFamily* seconds =
      r.AddHistogram("shardcoord_plan_duration_seconds", "Plan duration.", {"op"}, {0.1, 1});
  CounterFamily* plain = r.AddCounter("shardcoord_things_total", "A line\nwith \\ in help.");
  plans->WithLabels({"redistribute", "committed"})->Increment();
  plans->WithLabels({"redistribute", "committed"})->Increment(2);
  plans->WithLabels({"gather", "aborted"})->Increment();
  workers->WithLabels({"alive"})->Set(4);
  seconds->WithLabels({"copy"})->Observe(0.05);
  seconds->WithLabels({"copy"})->Observe(0.1);
  seconds->WithLabels({"copy"})->Observe(0.5);
  seconds->WithLabels({"copy"})->Observe(3);
  plain->WithLabels({})->Increment(4194304);

  EXPECT_EQ(r.Render(),
            "# HELP shardcoord_plans_total Plans by op and end state.\n"
            "# TYPE shardcoord_plans_total counter\n"
            "shardcoord_plans_total{op=\"gather\",state=\"aborted\"} 1\n"
            "shardcoord_plans_total{op=\"redistribute\",state=\"committed\"} 3\n"
            "# HELP shardcoord_workers Workers by state.\n"
            "# TYPE shardcoord_workers gauge\n"
            "shardcoord_workers{state=\"alive\"} 4\n"
            "# HELP shardcoord_plan_duration_seconds Plan duration.\n"
            "# TYPE shardcoord_plan_duration_seconds histogram\n"
            "shardcoord_plan_duration_seconds_bucket{op=\"copy\",le=\"0.1\"} 2\n"
            "shardcoord_plan_duration_seconds_bucket{op=\"copy\",le=\"1\"} 3\n"
            "shardcoord_plan_duration_seconds_bucket{op=\"copy\",le=\"+Inf\"} 4\n"
            "shardcoord_plan_duration_seconds_sum{op=\"copy\"} 3.65\n"
            "shardcoord_plan_duration_seconds_count{op=\"copy\"} 4\n"
            "# HELP shardcoord_things_total A line\\nwith \\\\ in help.\n"
            "# TYPE shardcoord_things_total counter\n"
            "shardcoord_things_total 4194304\n");
}

TEST(MetricsTest, FamiliesWithoutSamplesStillHaveHelpAndType) {
  Registry r;
  r.AddCounter("x_total", "X.", {"a"});
  EXPECT_EQ(r.Render(), "# HELP x_total X.\n# TYPE x_total counter\n");
}

TEST(MetricsTest, EscapesLabelValues) {
  Registry r;
  r.AddGauge("g", "G.", {"v"})->WithLabels({"a\"b\\c\nd"})->Set(-1.5);
  EXPECT_EQ(r.Render(), "# HELP g G.\n# TYPE g gauge\ng{v=\"a\\\"b\\\\c\\nd\"} -1.5\n");
}

TEST(MetricsTest, CollectorsRunBeforeRendering) {
  Registry r;
  Gauge* g = r.AddGauge("g", "G.")->WithLabels({});
  int calls = 0;
  r.AddCollector([&] { g->Set(++calls); });
  EXPECT_EQ(r.Render(), "# HELP g G.\n# TYPE g gauge\ng 1\n");
  EXPECT_EQ(r.Render(), "# HELP g G.\n# TYPE g gauge\ng 2\n");
}

TEST(MetricsTest, CounterIgnoresNegativeIncrements) {
  Counter c;
  c.Increment(5);
  c.Increment(-3);
  EXPECT_EQ(c.Value(), 5);
}

TEST(MetricsTest, FormatsValues) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(1e15), "1000000000000000");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(FormatMetricValue(1e300), "1e+300");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(MetricsTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(1, 4, 3), (std::vector<double>{1, 4, 16}));
}

TEST(MetricsTest, ConcurrentUpdatesAreAllCounted) {
  Registry r;
  CounterFamily* f = r.AddCounter("c_total", "C.", {"t"});
  HistogramFamily* h = r.AddHistogram("h", "H.", {}, {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        f->WithLabels({"x"})->Increment();
        h->WithLabels({})->Observe(0.5);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(f->WithLabels({"x"})->Value(), 40000);
  EXPECT_EQ(h->WithLabels({})->Read().count, 40000u);
}

}  // namespace
}  // namespace shardcoord
