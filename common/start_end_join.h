#ifndef SHARDCOORD_COMMON_START_END_JOIN_H_
#define SHARDCOORD_COMMON_START_END_JOIN_H_

#include <functional>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardcoord {

// An asynchronous operation whose start returns what the caller records first (a plan, an
// id) and whose end comes through a callback that may run before the start returned (inline,
// or on another thread). The join holds the end until Started(), then runs `on_end` once, on
// the thread of whichever of the two came second: no caller writes a state machine for it.
// If the start fails, do not call Started() (the end, if any, is dropped). Thread-safe.
template <typename End>
class StartEndJoin {
 public:
  explicit StartEndJoin(std::function<void(End)> on_end) : on_end_(std::move(on_end)) {}

  StartEndJoin(const StartEndJoin&) = delete;
  StartEndJoin& operator=(const StartEndJoin&) = delete;

  // The operation's end, from its callback (once).
  void Ended(End end) {
    {
      absl::MutexLock lock(&mu_);
      if (!started_) {
        end_ = std::move(end);
        return;
      }
    }
    on_end_(std::move(end));
  }

  // The start returned and its result was recorded (once).
  void Started() {
    std::optional<End> end;
    {
      absl::MutexLock lock(&mu_);
      started_ = true;
      end.swap(end_);
    }
    if (end.has_value()) on_end_(*std::move(end));
  }

 private:
  const std::function<void(End)> on_end_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<End> end_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_START_END_JOIN_H_
