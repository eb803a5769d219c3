#ifndef SHARDCOORD_COMMON_METRICS_H_
#define SHARDCOORD_COMMON_METRICS_H_

// A small metrics library: counters, gauges and fixed-bucket histograms in labelled
// families, and a Registry that renders them in Prometheus' text exposition format 0.0.4.
// No HTTP, no gRPC: a daemon serves Registry::Render() however it likes.
//
// Label values must come from bounded sets (an op, a state, an RPC method), never from user
// input such as tensor names: every distinct label set is a time series kept forever.
//
// Everything is thread-safe. Metric objects returned by a family live as long as the
// registry, so callers keep the pointers and update them without a lookup.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardcoord {

// A value that only goes up (reset when the process restarts).
class Counter {
 public:
  // `v` must be >= 0; negative values are ignored.
  void Increment(double v = 1);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted in fixed buckets (upper bounds, increasing; +Inf is implicit).
class Histogram {
 public:
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // cumulative[i] = observations <= bounds[i].
    uint64_t count = 0;
    double sum = 0;
  };

  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // Per bucket, not cumulative; +Inf last.
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// Bucket bounds: `count` bounds start, start*factor, start*factor^2, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// One metric name with a fixed list of label names; one child per list of label values.
template <typename T>
class Family {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::function<std::unique_ptr<T>()> make)
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        make_(std::move(make)) {}

  // The child with these label values (as many as label names, in their order), created at
  // first use. Extra values are dropped and missing ones are empty.
  T* WithLabels(std::vector<std::string> values) {
    values.resize(label_names_.size());
    absl::MutexLock lock(&mu_);
    std::unique_ptr<T>& child = children_[values];
    if (child == nullptr) child = make_();
    return child.get();
  }

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Calls fn(label values, child) for every child in label-value order.
  void ForEach(const std::function<void(const std::vector<std::string>&, const T&)>& fn) const {
    absl::MutexLock lock(&mu_);
    for (const auto& [values, child] : children_) fn(values, *child);
  }

 private:
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

// Owns families and renders them. Names must be unique and valid Prometheus names (not
// checked beyond a debug assertion); families render in the order they were added.
class Registry {
 public:
  CounterFamily* AddCounter(const std::string& name, const std::string& help,
                            std::vector<std::string> label_names = {});
  GaugeFamily* AddGauge(const std::string& name, const std::string& help,
                        std::vector<std::string> label_names = {});
  HistogramFamily* AddHistogram(const std::string& name, const std::string& help,
                                std::vector<std::string> label_names, std::vector<double> bounds);

  // Runs before every Render, e.g. to set gauges from a manager's current state. Must not
  // call Render. Not owned state: whatever `fn` captures must outlive the registry's use.
  void AddCollector(std::function<void()> fn);

  // The text exposition format 0.0.4: for each family "# HELP", "# TYPE", then its samples.
  std::string Render() const;

  // The Content-Type of Render's text.
  static constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Entry {
    std::unique_ptr<CounterFamily> counter;
    std::unique_ptr<GaugeFamily> gauge;
    std::unique_ptr<HistogramFamily> histogram;
  };
  // Adds `family` as the entry's `slot`, in the order of the calls.
  template <typename F>
  F* Keep(std::unique_ptr<F> Entry::*slot, std::unique_ptr<F> family);

  mutable absl::Mutex mu_;
  std::vector<Entry> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// How the exposition writes a sample value: integers without a fraction ("42"), others with
// the fewest digits that read back exactly, "+Inf", "-Inf", "NaN".
std::string FormatMetricValue(double v);
// Escapes a label value (backslash, double quote, newline).
std::string EscapeLabelValue(const std::string& v);

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_METRICS_H_
