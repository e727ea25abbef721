#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DEJA_CPU_RELAX() _mm_pause()
#else
#define DEJA_CPU_RELAX() std::this_thread::yield()
#endif

#include <glog/logging.h>

namespace deja {
namespace {

// True on pool workers and on a caller while it runs its own job: a nested ParallelFor from
// there must run inline (the workers are busy with the outer job).
thread_local bool tls_in_job = false;

// How long an idle worker polls for the next job before sleeping. Decode issues ops a few
// microseconds apart; a futex wake costs tens of microseconds, so polling briefly pays.
constexpr auto kSpinTime = std::chrono::microseconds(200);

// The claim word packs (generation, chunk count, next chunk index) so a worker that wakes late
// can never claim a chunk of a newer job with the parameters of an older one.
constexpr int kChunkBits = 16;
constexpr uint64_t kChunkMask = (1u << kChunkBits) - 1;

// Chunks are claimed dynamically, a few per thread, so a thread that is descheduled (another
// process, or a concurrent op on a second pool) delays the job by one small chunk instead of a
// whole 1/N share. The extra claims cost a compare-and-swap each.
constexpr int64_t kChunksPerThread = 4;

uint64_t PackClaim(uint64_t gen, uint64_t chunks, uint64_t index) {
  return (gen << 32) | (chunks << kChunkBits) | index;
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_threads_ = std::min<int>(threads, static_cast<int>(kChunkMask / kChunksPerThread));
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    stop_.store(true);
  }
  wake_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Run(int64_t n, int64_t min_chunk, Trampoline call, void* ctx) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int64_t chunks =
      std::min<int64_t>(num_threads_ * kChunksPerThread, (n + min_chunk - 1) / min_chunk);
  if (num_threads_ == 1 || chunks <= 1 || tls_in_job) {
    call(ctx, 0, n);
    return;
  }
  std::unique_lock<std::mutex> submit(submit_mu_, std::try_to_lock);
  if (!submit.owns_lock()) {
    call(ctx, 0, n);
    return;
  }

  call_ = call;
  ctx_ = ctx;
  n_ = n;
  chunks_ = chunks;
  chunks_done_.store(0, std::memory_order_relaxed);
  uint64_t gen = (generation_.load(std::memory_order_relaxed) + 1) & 0xffffffffu;
  if (gen == 0) gen = 1;  // workers start having "seen" generation 0
  claim_.store(PackClaim(gen, chunks, 0), std::memory_order_release);
  generation_.store(gen, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    // Taking the mutex orders this notify after any worker's predicate check.
    std::lock_guard<std::mutex> lock(sleep_mu_);
    wake_cv_.notify_all();
  }

  tls_in_job = true;
  RunChunks(gen);
  tls_in_job = false;
  while (chunks_done_.load(std::memory_order_acquire) < chunks) DEJA_CPU_RELAX();
}

void ThreadPool::RunChunks(uint64_t gen) {
  uint64_t word = claim_.load(std::memory_order_acquire);
  for (;;) {
    uint64_t index = word & kChunkMask;
    uint64_t chunks = (word >> kChunkBits) & kChunkMask;
    if ((word >> 32) != gen || index >= chunks) return;
    if (!claim_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel)) continue;
    // A claimed chunk keeps the job open, so its parameters are stable here.
    int64_t begin = n_ * static_cast<int64_t>(index) / chunks_;
    int64_t end = n_ * static_cast<int64_t>(index + 1) / chunks_;
    call_(ctx_, begin, end);
    chunks_done_.fetch_add(1, std::memory_order_release);
    word = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop() {
  tls_in_job = true;
  uint64_t seen = 0;
  for (;;) {
    auto spin_start = std::chrono::steady_clock::now();
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && !stop_.load(std::memory_order_relaxed); ++i) {
      DEJA_CPU_RELAX();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() - spin_start > kSpinTime) {
        std::unique_lock<std::mutex> lock(sleep_mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_cv_.wait(lock, [&] {
          return generation_.load(std::memory_order_seq_cst) != seen || stop_.load();
        });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        spin_start = std::chrono::steady_clock::now();
      }
      gen = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    seen = gen;
    RunChunks(gen);
  }
}

}  // namespace deja
