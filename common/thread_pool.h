#ifndef SHARDCOORD_COMMON_THREAD_POOL_H_
#define SHARDCOORD_COMMON_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardcoord {

// A fixed set of threads running queued work in order, so gRPC reactor threads never do
// long work (fills, checksums). Only for work that does not wait on other workers: a fixed
// pool could deadlock plans that wait on each other, so fragments get their own threads.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  // Runs what is queued, then joins.
  ~ThreadPool() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> work) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(work));
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> work;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
              return p->stopping_ || !p->queue_.empty();
            },
            this));
        if (queue_.empty()) return;  // Stopping and drained.
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_THREAD_POOL_H_
