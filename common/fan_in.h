#ifndef SHARDCOORD_COMMON_FAN_IN_H_
#define SHARDCOORD_COMMON_FAN_IN_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace shardcoord {

// The fan-in of `n` calls made at once (one per worker, say): each call's callback reports
// its outcome once, on any thread; the last report runs `done` with the first error (OK when
// every call succeeded), on that thread with no lock held. Results go into slots the caller
// owns, one per call, each written by its own callback before it reports: the last report
// comes after every write, so `done` reads them all. Thread-safe.
class FanIn {
 public:
  using Done = std::function<void(absl::Status)>;

  // With n == 0, `done` runs at once (OK) and the result is null.
  static std::shared_ptr<FanIn> Start(size_t n, Done done) {
    if (n == 0) {
      done(absl::OkStatus());
      return nullptr;
    }
    return std::shared_ptr<FanIn>(new FanIn(n, std::move(done)));
  }

  FanIn(const FanIn&) = delete;
  FanIn& operator=(const FanIn&) = delete;

  // One call's outcome; the first error is kept.
  void Report(const absl::Status& s) {
    absl::Status error;
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && error_.ok()) error_ = s;
      if (--remaining_ > 0) return;
      error = error_;
    }
    done_(std::move(error));
  }

 private:
  FanIn(size_t n, Done done) : done_(std::move(done)), remaining_(n) {}

  const Done done_;
  absl::Mutex mu_;
  size_t remaining_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_FAN_IN_H_
