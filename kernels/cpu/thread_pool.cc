#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>

namespace statecache {

ThreadPool::ThreadPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : workers_) t.join();
}

int ThreadPool::DefaultThreads() {
  return std::max(1u, std::thread::hardware_concurrency());
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stopping_ || !p->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.size() <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  struct Shared {
    std::atomic<int64_t> next{0};
    absl::Mutex mu;
    int64_t done ABSL_GUARDED_BY(mu) = 0;
  };
  auto shared = std::make_shared<Shared>();
  auto drain = [shared, n, &fn] {
    int64_t finished = 0;
    for (int64_t i = shared->next.fetch_add(1); i < n; i = shared->next.fetch_add(1)) {
      fn(i);
      ++finished;
    }
    absl::MutexLock lock(&shared->mu);
    shared->done += finished;
  };
  const int helpers = static_cast<int>(std::min<int64_t>(workers_.size(), n - 1));
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < helpers; ++i) tasks_.push_back(drain);
  }
  drain();
  absl::MutexLock lock(&shared->mu);
  auto all_done = [&shared, n]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return shared->done == n; };
  shared->mu.Await(absl::Condition(&all_done));
}

}  // namespace statecache
