#include "common/timer.h"

#include "absl/time/clock.h"

namespace shardcoord {

Timer::Id TimerQueue::Add(absl::Time when, std::function<void()> fn) {
  const Timer::Id id = next_id_++;
  queue_.emplace(std::make_pair(when, id), std::move(fn));
  by_id_.emplace(id, when);
  return id;
}

bool TimerQueue::Remove(Timer::Id id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  queue_.erase(std::make_pair(it->second, id));
  by_id_.erase(it);
  return true;
}

bool TimerQueue::PopDue(absl::Time now, std::function<void()>* fn) {
  if (queue_.empty() || queue_.begin()->first.first > now) return false;
  auto it = queue_.begin();
  *fn = std::move(it->second);
  by_id_.erase(it->first.second);
  queue_.erase(it);
  return true;
}

absl::Time TimerQueue::Next() const {
  return queue_.empty() ? absl::InfiniteFuture() : queue_.begin()->first.first;
}

void TimerQueue::Clear() {
  queue_.clear();
  by_id_.clear();
}

ThreadTimer::ThreadTimer() : thread_([this] { Loop(); }) {}

ThreadTimer::~ThreadTimer() { Stop(); }

void ThreadTimer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    queue_.Clear();
  }
  if (thread_.joinable()) thread_.join();
}

Timer::Id ThreadTimer::Schedule(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stop_) return 0;
  // The loop waits on a condition over the queue head, so a new earlier entry wakes it.
  return queue_.Add(when, std::move(fn));
}

bool ThreadTimer::Cancel(Id id) {
  absl::MutexLock lock(&mu_);
  return queue_.Remove(id);
}

void ThreadTimer::Loop() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && !queue_.PopDue(absl::Now(), &fn)) {
        const absl::Time next = queue_.Next();
        auto changed = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || queue_.Next() < next;
        };
        mu_.AwaitWithDeadline(absl::Condition(&changed), next);
      }
      if (stop_) return;
    }
    fn();
  }
}

Timer::Id FakeTimer::Schedule(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  return queue_.Add(when, std::move(fn));
}

bool FakeTimer::Cancel(Id id) {
  absl::MutexLock lock(&mu_);
  return queue_.Remove(id);
}

void FakeTimer::Advance(absl::Duration d) {
  const absl::Time end = clock_->Now() + d;
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time next = queue_.Next();
      if (next > end) break;
      if (next > clock_->Now()) clock_->Set(next);
      queue_.PopDue(next, &fn);
    }
    fn();
  }
  clock_->Set(end);
}

int FakeTimer::RunDue() {
  int n = 0;
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      if (!queue_.PopDue(clock_->Now(), &fn)) return n;
    }
    fn();
    ++n;
  }
}

size_t FakeTimer::pending() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

}  // namespace shardcoord
