#ifndef SHARDCOORD_WORKER_BACKENDS_NCCL_CLOCK_H_
#define SHARDCOORD_WORKER_BACKENDS_NCCL_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardcoord {
namespace nccl {

// Time for the watchdog's polling loop, behind an interface so tests drive it without
// sleeping.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  virtual void SleepFor(absl::Duration d) = 0;
};

class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
};

// Time stands still except when someone sleeps or calls Advance: a polling loop under a
// FakeClock advances it by exactly its poll intervals, so timeouts are reached in a known
// number of polls and no real time passes.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1700000000)) : now_(start) {}

  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void SleepFor(absl::Duration d) override {
    absl::MutexLock lock(&mu_);
    now_ += d;
    slept_ += d;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  absl::Duration slept() const {
    absl::MutexLock lock(&mu_);
    return slept_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Duration slept_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_BACKENDS_NCCL_CLOCK_H_
