// ThreadPool: a persistent set of worker threads that kernels split ranges over. The calling
// thread takes part in every ParallelFor, so a pool of N threads starts N - 1 workers. Workers
// spin briefly after each job (decode issues many small ops back to back) and then sleep on a
// condition variable, so an idle server does not burn its cores.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace deja {

class ThreadPool {
 public:
  // threads <= 0 means one per available core. threads == 1 runs everything on the caller.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over contiguous chunks covering [0, n): a few chunks per thread, claimed
  // dynamically (so a descheduled thread holds up little), none smaller than min_chunk elements
  // (so tiny ranges stay on the caller). Chunks may run on any thread, in any order; fn must not
  // assume one chunk per thread. Returns when all chunks are done. Safe to call from several
  // threads: if the pool is busy with another caller's job, or when called from inside a job, the
  // range runs inline on the calling thread instead of blocking or deadlocking.
  template <typename Fn>
  void ParallelFor(int64_t n, Fn&& fn, int64_t min_chunk = 1) {
    using F = std::remove_reference_t<Fn>;
    Run(
        n, min_chunk, [](void* ctx, int64_t b, int64_t e) { (*static_cast<F*>(ctx))(b, e); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using Trampoline = void (*)(void* ctx, int64_t begin, int64_t end);

  void Run(int64_t n, int64_t min_chunk, Trampoline call, void* ctx);
  void WorkerLoop();
  // Claims and runs chunks of job `gen` until none are left.
  void RunChunks(uint64_t gen);

  int num_threads_ = 1;
  std::vector<std::thread> workers_;

  std::mutex submit_mu_;  // one job at a time; try_lock fails over to inline execution

  // The current job. Written by the submitter before generation_ is bumped (release) and read
  // by workers after they observe the new generation (acquire).
  Trampoline call_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t chunks_ = 0;
  std::atomic<uint64_t> claim_{0};  // see PackClaim in thread_pool.cc
  std::atomic<int64_t> chunks_done_{0};

  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mu_;
  std::condition_variable wake_cv_;
};

}  // namespace deja
