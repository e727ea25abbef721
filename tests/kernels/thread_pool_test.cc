// ThreadPool: every index covered exactly once, contiguous chunks, nested and concurrent callers
// run inline instead of deadlocking, and workers survive sleeping between jobs.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace deja {
namespace {

void ExpectCoversOnce(ThreadPool& pool, int64_t n, int64_t min_chunk) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int> calls{0};
  pool.ParallelFor(
      n,
      [&](int64_t b, int64_t e) {
        EXPECT_LT(b, e);
        EXPECT_GE(e - b, std::min(n, min_chunk) / 2) << "chunk far below min_chunk";
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        calls.fetch_add(1);
      },
      min_chunk);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  EXPECT_LE(calls.load(), 4 * pool.num_threads());
  if (n > 0 && min_chunk >= n) {
    EXPECT_EQ(calls.load(), 1);
  }
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 100, 1001}) {
      for (int64_t min_chunk : {1, 4, 1000}) ExpectCoversOnce(pool, n, min_chunk);
    }
  }
}

TEST(ThreadPool, UsesSeveralThreads) {
  ThreadPool pool(2);
  std::atomic<int> distinct{0};
  // Chunks that wait for each other can only finish if two threads run them at once.
  std::atomic<int> arrived{0};
  pool.ParallelFor(2, [&](int64_t, int64_t) {
    arrived.fetch_add(1);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) {
    }
    distinct.fetch_add(1);
  });
  EXPECT_EQ(arrived.load(), 2);
  EXPECT_EQ(distinct.load(), 2);
}

TEST(ThreadPool, ManySmallJobsAndSleeps) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int it = 0; it < 20000; ++it) {
    pool.ParallelFor(10, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum.fetch_add(i);
    });
    // Let workers fall asleep now and then so the wake path is exercised too.
    if (it % 5000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(sum.load(), int64_t{20000} * 45);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.ParallelFor(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(100, [&](int64_t b2, int64_t e2) { total.fetch_add(e2 - b2); });
    }
  });
  EXPECT_EQ(total.load(), 400);
}

TEST(ThreadPool, ConcurrentCallers) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int it = 0; it < 2000; ++it) {
      pool.ParallelFor(64, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 2000 * 64);
}

}  // namespace
}  // namespace deja
