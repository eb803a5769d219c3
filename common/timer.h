#ifndef SHARDCOORD_COMMON_TIMER_H_
#define SHARDCOORD_COMMON_TIMER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shardcoord {

// Runs callbacks at given times: the deadlines of rendezvous waits and plans. Callbacks run
// without any timer lock held and may schedule or cancel others.
class Timer {
 public:
  using Id = int64_t;
  virtual ~Timer() = default;

  virtual Id Schedule(absl::Time when, std::function<void()> fn) = 0;
  // True when the callback was still pending (it will not run).
  virtual bool Cancel(Id id) = 0;
};

// Callbacks due at the same time run in scheduling order.
class TimerQueue {
 public:
  Timer::Id Add(absl::Time when, std::function<void()> fn);
  bool Remove(Timer::Id id);
  // The earliest entry due at or before `now`, removed; false when none.
  bool PopDue(absl::Time now, std::function<void()>* fn);
  // absl::InfiniteFuture() when empty.
  absl::Time Next() const;
  size_t size() const { return by_id_.size(); }
  void Clear();

 private:
  Timer::Id next_id_ = 1;
  std::map<std::pair<absl::Time, Timer::Id>, std::function<void()>> queue_;
  std::map<Timer::Id, absl::Time> by_id_;
};

// Real time, one background thread. The destructor stops the thread; pending callbacks are
// dropped (owners cancel or complete their work before destroying the timer).
class ThreadTimer : public Timer {
 public:
  ThreadTimer();
  ~ThreadTimer() override;

  Id Schedule(absl::Time when, std::function<void()> fn) override;
  bool Cancel(Id id) override;

  // Joins the thread and drops what is pending; later Schedules never run. Call at shutdown
  // before destroying the owners of pending callbacks. Idempotent.
  void Stop();

 private:
  void Loop();

  absl::Mutex mu_;
  TimerQueue queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// For tests: time moves with a FakeClock, callbacks run inside Advance / RunDue on the
// caller's thread.
class FakeTimer : public Timer {
 public:
  explicit FakeTimer(FakeClock* clock) : clock_(clock) {}

  Id Schedule(absl::Time when, std::function<void()> fn) override;
  bool Cancel(Id id) override;

  // Moves the clock forward and runs every callback that became due, in time order (the
  // clock reads each callback's time while it runs).
  void Advance(absl::Duration d);
  // Runs callbacks due now; returns how many ran.
  int RunDue();
  size_t pending() const;

 private:
  FakeClock* const clock_;
  mutable absl::Mutex mu_;
  TimerQueue queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_TIMER_H_
