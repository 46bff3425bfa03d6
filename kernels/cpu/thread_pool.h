// ThreadPool: a fixed set of worker threads running ParallelFor loops.
//
// The CPU backend splits a batch into (slot, head) items; each item is
// independent, so ParallelFor hands out indices dynamically and returns when
// all are done. Thread-safe: concurrent ParallelFor calls from several
// threads share the workers (each call waits only for its own items).
//
//   ThreadPool pool(ThreadPool::DefaultThreads());
//   pool.ParallelFor(n, [&](int64_t i) { Work(i); });
#ifndef STATECACHE_KERNELS_CPU_THREAD_POOL_H_
#define STATECACHE_KERNELS_CPU_THREAD_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace statecache {

class ThreadPool {
 public:
  // `threads` workers (>= 1); the calling thread also works inside ParallelFor.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs fn(i) for i in [0, n), in any order and on any thread; returns when
  // all calls have returned. Small n runs inline.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

  int threads() const { return static_cast<int>(workers_.size()); }
  // std::thread::hardware_concurrency(), at least 1.
  static int DefaultThreads();

 private:
  void WorkerLoop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_CPU_THREAD_POOL_H_
