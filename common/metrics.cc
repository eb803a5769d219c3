#include "common/metrics.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace {

void AtomicAdd(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

// Backslash and newline escaped, and with `quote` the double quote too: HELP text escapes
// the first two, label values all three.
std::string Escape(const std::string& v, bool quote) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& v) { return Escape(v, /*quote=*/false); }

// `{a="x",b="y"}` from names and values plus an optional extra pair (a histogram's le); empty
// when there are no labels at all.
std::string LabelText(const std::vector<std::string>& names, const std::vector<std::string>& values,
                      const std::string& extra_name = "", const std::string& extra_value = "") {
  std::vector<std::string> parts;
  for (size_t i = 0; i < names.size(); ++i) {
    parts.push_back(absl::StrCat(names[i], "=\"", EscapeLabelValue(values[i]), "\""));
  }
  if (!extra_name.empty()) {
    parts.push_back(absl::StrCat(extra_name, "=\"", EscapeLabelValue(extra_value), "\""));
  }
  if (parts.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += ",";
    out += parts[i];
  }
  out += "}";
  return out;
}

void Header(std::string& out, const std::string& name, const std::string& help, const char* type) {
  absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(help), "\n");
  absl::StrAppend(&out, "# TYPE ", name, " ", type, "\n");
}

}  // namespace

void Counter::Increment(double v) {
  if (!(v >= 0)) return;
  AtomicAdd(value_, v);
}

void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  assert(std::is_sorted(bounds_.begin(), bounds_.end()));
}

void Histogram::Observe(double v) {
  // The first bucket whose upper bound is >= v ("le"); past the end is +Inf.
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[i];
  sum_ += v;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    total += counts_[i];
    s.cumulative.push_back(total);
  }
  s.count = total + counts_.back();
  s.sum = sum_;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) out.push_back(b);
  return out;
}

template <typename F>
F* Registry::Keep(std::unique_ptr<F> Entry::*slot, std::unique_ptr<F> family) {
  F* out = family.get();
  Entry e;
  e.*slot = std::move(family);
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(e));
  return out;
}

CounterFamily* Registry::AddCounter(const std::string& name, const std::string& help,
                                    std::vector<std::string> label_names) {
  return Keep(&Entry::counter,
              std::make_unique<CounterFamily>(name, help, std::move(label_names),
                                              [] { return std::make_unique<Counter>(); }));
}

GaugeFamily* Registry::AddGauge(const std::string& name, const std::string& help,
                                std::vector<std::string> label_names) {
  return Keep(&Entry::gauge, std::make_unique<GaugeFamily>(name, help, std::move(label_names), [] {
    return std::make_unique<Gauge>();
  }));
}

HistogramFamily* Registry::AddHistogram(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds) {
  return Keep(&Entry::histogram,
              std::make_unique<HistogramFamily>(
                  name, help, std::move(label_names),
                  [bounds = std::move(bounds)] { return std::make_unique<Histogram>(bounds); }));
}

void Registry::AddCollector(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(fn));
}

std::string Registry::Render() const {
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  for (const auto& fn : collectors) fn();

  std::string out;
  absl::MutexLock lock(&mu_);
  for (const Entry& e : families_) {
    if (e.counter != nullptr) {
      const CounterFamily& f = *e.counter;
      Header(out, f.name(), f.help(), "counter");
      f.ForEach([&](const std::vector<std::string>& values, const Counter& c) {
        absl::StrAppend(&out, f.name(), LabelText(f.label_names(), values), " ",
                        FormatMetricValue(c.Value()), "\n");
      });
    } else if (e.gauge != nullptr) {
      const GaugeFamily& f = *e.gauge;
      Header(out, f.name(), f.help(), "gauge");
      f.ForEach([&](const std::vector<std::string>& values, const Gauge& g) {
        absl::StrAppend(&out, f.name(), LabelText(f.label_names(), values), " ",
                        FormatMetricValue(g.Value()), "\n");
      });
    } else {
      const HistogramFamily& f = *e.histogram;
      Header(out, f.name(), f.help(), "histogram");
      f.ForEach([&](const std::vector<std::string>& values, const Histogram& h) {
        const Histogram::Snapshot s = h.Read();
        for (size_t i = 0; i < s.bounds.size(); ++i) {
          absl::StrAppend(&out, f.name(), "_bucket",
                          LabelText(f.label_names(), values, "le", FormatMetricValue(s.bounds[i])),
                          " ", s.cumulative[i], "\n");
        }
        absl::StrAppend(&out, f.name(), "_bucket", LabelText(f.label_names(), values, "le", "+Inf"),
                        " ", s.count, "\n");
        absl::StrAppend(&out, f.name(), "_sum", LabelText(f.label_names(), values), " ",
                        FormatMetricValue(s.sum), "\n");
        absl::StrAppend(&out, f.name(), "_count", LabelText(f.label_names(), values), " ", s.count,
                        "\n");
      });
    }
  }
  return out;
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::trunc(v) && std::fabs(v) < 9007199254740992.0) {  // 2^53: exact integers.
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string EscapeLabelValue(const std::string& v) { return Escape(v, /*quote=*/true); }

}  // namespace shardcoord
