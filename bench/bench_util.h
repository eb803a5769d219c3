#ifndef SHARDCOORD_BENCH_BENCH_UTIL_H_
#define SHARDCOORD_BENCH_BENCH_UTIL_H_

// What the benchmarks share: dying with a message on a failed step, and the best and median
// of repeated measurements.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace bench {

// Prints "<program>: <message>" to stderr and exits 1.
[[noreturn]] inline void Die(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, message.c_str());
  std::exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}

inline void OrDie(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

// Seconds of repeated runs of one measurement.
struct Samples {
  std::vector<double> seconds;

  double Best() const { return *std::min_element(seconds.begin(), seconds.end()); }
  double Median() const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    return n % 2 == 1 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  }
};

}  // namespace bench
}  // namespace shardcoord

#endif  // SHARDCOORD_BENCH_BENCH_UTIL_H_
