#include "worker/comm/shm_communicator.h"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "worker/comm/shm_layout.h"
#include "worker/comm/shm_segment.h"
#include "worker/comm/timed_communicator.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DEJA_SHM_PAUSE() _mm_pause()
#else
#define DEJA_SHM_PAUSE() ((void)0)
#endif

namespace deja::worker::comm {
namespace {

using Clock = std::chrono::steady_clock;

// A sleeping rank wakes this often to look at the deadline, its peers' liveness and the
// group's failure flag (a dead peer cannot wake it).
constexpr auto kSleepSlice = std::chrono::milliseconds(5);

// The least a waiting rank polls before it sleeps, so it still sees when peers have come back
// to arriving within microseconds.
constexpr Clock::duration kMinSpin = std::chrono::microseconds(4);

// Up to this many floats in all slots together, every rank sums the whole round itself (one
// barrier per round); above it, each sums its 1/world share into the next round's set and the
// ranks copy the others' shares from there (two barriers, 1/world of the additions). Both add
// in rank order, so they give the same bits. On 2 processes of a 2-core machine the two took
// the same time (p50 1.1-1.6 us at 2048 floats, 21 us at 32768, 38 us at 65536); one barrier
// fewer is one chance fewer to wait for a descheduled peer, so the whole sum covers up to 256
// KiB (a decode step of 32 sequences at hidden size 1024, or 16 at 2048, on 2 ranks).
constexpr int64_t kWholeSumFloats = 65536;

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// dst[i] = src[0][i] + src[1][i] + ... + src[world - 1][i], added in exactly that order
// (world >= 2). Blocks keep dst in L1 while the later ranks are added.
void SumInRankOrder(float* __restrict dst, const float* const* src, int world, int64_t n) {
  constexpr int64_t kBlock = 2048;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    const float* __restrict s0 = src[0] + b;
    const float* __restrict s1 = src[1] + b;
    float* __restrict d = dst + b;
    for (int64_t i = 0; i < m; ++i) d[i] = s0[i] + s1[i];
    for (int k = 2; k < world; ++k) {
      const float* __restrict sk = src[k] + b;
      for (int64_t i = 0; i < m; ++i) d[i] += sk[i];
    }
  }
}

// The peers' processes, to tell a dead peer from a slow one without waiting for the timeout.
// Only peers in this pid namespace (their published pid means the same process here), and not
// this process itself (ranks as threads). A pidfd turns readable when its process exits, zombie
// or not; without pidfds (kernels before 5.3), kill(pid, 0) sees reaped processes only.
class PeerWatch {
 public:
  PeerWatch(const ShmLayout& layout, int rank) {
    const pid_t self = ::getpid();
    const uint64_t ns = layout.line(rank).pid_ns.load(std::memory_order_relaxed);
    for (int k = 0; k < layout.world(); ++k) {
      const pid_t pid = layout.line(k).pid.load(std::memory_order_relaxed);
      if (k == rank || pid <= 0 || pid == self || ns == 0 ||
          layout.line(k).pid_ns.load(std::memory_order_relaxed) != ns) {
        continue;
      }
      const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      peers_.push_back({k, pid, fd});
    }
  }
  ~PeerWatch() {
    for (const Peer& p : peers_) {
      if (p.fd >= 0) ::close(p.fd);
    }
  }
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // A watched rank whose process has ended, or -1.
  int FirstDead() const {
    for (const Peer& p : peers_) {
      if (p.fd >= 0) {
        struct pollfd pfd = {p.fd, POLLIN, 0};
        if (::poll(&pfd, 1, 0) > 0) return p.rank;
      } else if (::kill(p.pid, 0) != 0 && errno == ESRCH) {
        return p.rank;
      }
    }
    return -1;
  }

  pid_t pid(int rank) const {
    for (const Peer& p : peers_) {
      if (p.rank == rank) return p.pid;
    }
    return 0;
  }

 private:
  struct Peer {
    int rank;
    pid_t pid;
    int fd;  // pidfd, or -1 (no pidfd_open: kill(pid, 0))
  };
  std::vector<Peer> peers_;
};

enum class Op : uint64_t { kBarrier = 1, kAllReduce = 2, kAllGather = 3, kBroadcast = 4 };

const char* OpName(uint64_t post) {
  switch (static_cast<Op>(post >> 56)) {
    case Op::kBarrier:
      return "barrier";
    case Op::kAllReduce:
      return "all-reduce";
    case Op::kAllGather:
      return "all-gather";
    case Op::kBroadcast:
      return "broadcast";
  }
  return "?";
}

// What a rank posts at each barrier: the collective, its root and its count (the low 40 bits),
// so that ranks calling different collectives fail instead of mixing their data.
uint64_t Post(Op op, int root, uint64_t count) {
  return (static_cast<uint64_t>(op) << 56) | (static_cast<uint64_t>(root & 0xffff) << 40) |
         (count & ((uint64_t{1} << 40) - 1));
}

std::string DescribePost(uint64_t post) {
  return std::string(OpName(post)) + " of " + std::to_string(post & ((uint64_t{1} << 40) - 1)) +
         " (root " + std::to_string((post >> 40) & 0xffff) + ")";
}

class ShmCommunicator final : public TimedCommunicator {
 public:
  ShmCommunicator(SharedSegment segment, int rank, const ShmOptions& options)
      : segment_(std::move(segment)),
        layout_(segment_.data()),
        rank_(rank),
        world_(layout_.world()),
        slot_bytes_(layout_.slot_bytes()),
        timeout_(options.timeout),
        spin_(options.spin),
        watch_(layout_, rank),
        src_(static_cast<size_t>(world_)),
        min_spin_(std::min<Clock::duration>(kMinSpin, spin_)),
        spin_now_(spin_) {}

  ~ShmCommunicator() override {
    // A peer waiting for this rank fails at once instead of at its timeout.
    RankLine& me = layout_.line(rank_);
    me.left.store(1, std::memory_order_seq_cst);
    FutexWakeAll(&me.arrived);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  Status AllGather(const float* in, int64_t n, float* out) override {
    if (n < 0) return InvalidArgument("all-gather of a negative count");
    if (!failure_.ok()) return failure_;
    if (n == 0) return Status::Ok();
    const int64_t per = static_cast<int64_t>(slot_bytes_ / sizeof(float));
    for (int64_t off = 0; off < n; off += per) {
      const size_t bytes = static_cast<size_t>(std::min(per, n - off)) * sizeof(float);
      std::memcpy(Slot(gen_ + 1, rank_), in + off, bytes);
      DEJA_RETURN_IF_ERROR(Arrive(Post(Op::kAllGather, 0, static_cast<uint64_t>(n))));
      for (int k = 0; k < world_; ++k) {
        float* to = out + k * n + off;
        // memmove: `in` may be this rank's block of `out`.
        if (k == rank_) {
          std::memmove(to, in + off, bytes);
        } else {
          std::memcpy(to, Slot(gen_, k), bytes);
        }
      }
    }
    return Status::Ok();
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= world_) {
      return InvalidArgument("broadcast root " + std::to_string(root) + " is outside world size " +
                             std::to_string(world_));
    }
    if (!failure_.ok()) return failure_;
    auto* p = static_cast<uint8_t*>(data);
    for (size_t off = 0; off < bytes; off += slot_bytes_) {
      const size_t m = std::min(slot_bytes_, bytes - off);
      if (rank_ == root) std::memcpy(Slot(gen_ + 1, root), p + off, m);
      DEJA_RETURN_IF_ERROR(Arrive(Post(Op::kBroadcast, root, bytes)));
      if (rank_ != root) std::memcpy(p + off, Slot(gen_, root), m);
    }
    return Status::Ok();
  }

  Status Barrier() override {
    if (!failure_.ok()) return failure_;
    return Arrive(Post(Op::kBarrier, 0, 0));
  }

 protected:
  Status DoAllReduceSum(float* data, int64_t n) override {
    if (n < 0) return InvalidArgument("all-reduce of a negative count");
    if (!failure_.ok()) return failure_;
    if (n == 0 || world_ == 1) return Status::Ok();
    const uint64_t post = Post(Op::kAllReduce, 0, static_cast<uint64_t>(n));
    const int64_t per = static_cast<int64_t>(slot_bytes_ / sizeof(float));
    std::vector<const float*>& src = src_;
    for (int64_t off = 0; off < n; off += per) {
      const int64_t m = std::min(per, n - off);
      float* mine = data + off;
      std::memcpy(Slot(gen_ + 1, rank_), mine, static_cast<size_t>(m) * sizeof(float));
      DEJA_RETURN_IF_ERROR(Arrive(post));
      for (int k = 0; k < world_; ++k) src[k] = Slot(gen_, k);
      if (m * world_ <= kWholeSumFloats) {
        SumInRankOrder(mine, src.data(), world_, m);
        continue;
      }
      // Reduce-scatter into rank 0's slot of the next round's set, then gather. Shares start on
      // cache lines so no two ranks write the same one.
      auto share = [&](int k) { return k == world_ ? m : (m * k / world_) & ~int64_t{15}; };
      const int64_t lo = share(rank_), hi = share(rank_ + 1);
      for (int k = 0; k < world_; ++k) src[k] += lo;
      SumInRankOrder(mine + lo, src.data(), world_, hi - lo);
      float* result = Slot(gen_ + 1, 0);
      std::memcpy(result + lo, mine + lo, static_cast<size_t>(hi - lo) * sizeof(float));
      DEJA_RETURN_IF_ERROR(Arrive(post));
      result = Slot(gen_, 0);
      std::memcpy(mine, result, static_cast<size_t>(lo) * sizeof(float));
      std::memcpy(mine + hi, result + hi, static_cast<size_t>(m - hi) * sizeof(float));
    }
    return Status::Ok();
  }

 private:
  // Rank k's slot in the set of barrier generation `gen`. Data written before arriving at
  // generation g goes to set g % 2 and is read after g, before arriving at g + 1; the next
  // write to that set (for g + 2) needs every rank past g + 1, hence after all its readers.
  float* Slot(uint32_t gen, int k) const {
    return reinterpret_cast<float*>(layout_.slot(static_cast<int>(gen & 1u), k));
  }

  // Arrives at the next barrier generation, waits for every peer to arrive there too, and
  // checks that all ranks are in the same collective.
  Status Arrive(uint64_t post) {
    // A peer that failed may have arrived at this generation before it did; the flag it left
    // keeps this rank from running on with a group that is gone.
    if (layout_.header().failed.load(std::memory_order_relaxed) != 0) {
      return CheckPeers();
    }
    const uint32_t g = gen_ + 1;
    RankLine& me = layout_.line(rank_);
    me.posted[g & 1u].store(post, std::memory_order_relaxed);
    // seq_cst pairs with the sleepers' increment-then-check, so either the sleeper sees the new
    // value or this rank sees the sleeper and wakes it. Also releases this rank's slot writes.
    me.arrived.store(g, std::memory_order_seq_cst);
    if (me.sleepers.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&me.arrived);
    gen_ = g;
    DEJA_RETURN_IF_ERROR(WaitForPeers(g));
    for (int k = 0; k < world_; ++k) {
      const uint64_t theirs = layout_.line(k).posted[g & 1u].load(std::memory_order_relaxed);
      // Every rank sees the same posts, so all of them return here, at the same generation,
      // and the group stays usable.
      if (theirs != post) {
        return InvalidArgument("shm: rank " + std::to_string(rank_) + " called " +
                               DescribePost(post) + " while rank " + std::to_string(k) +
                               " called " + DescribePost(theirs));
      }
    }
    return Status::Ok();
  }

  bool Reached(int k, uint32_t g) const {
    const uint32_t a = layout_.line(k).arrived.load(std::memory_order_acquire);
    return static_cast<int32_t>(a - g) >= 0;
  }

  // The first rank from `k` on that has not arrived at `g`, or -1.
  int FirstBehind(uint32_t g, int k) const {
    for (; k < world_; ++k) {
      if (!Reached(k, g)) return k;
    }
    return -1;
  }

  Status WaitForPeers(uint32_t g) {
    const Clock::time_point start = Clock::now();
    int k = FirstBehind(g, 0);
    if (k < 0) return Status::Ok();
    // Poll first, for as long as polling has been paying off lately (up to `spin_`): after a
    // wait that ended asleep the next polls half as long, after one that ended polling twice.
    // Polling never yields the CPU: sched_yield hands it to whatever else is runnable on this
    // core for a whole time slice. On 2 processes of this 2-core machine while two other
    // processes kept both cores busy, 65536 floats took 94-218 us on average like this, 84-217
    // us sleeping at once, and 380-995 us (p90 3.7 ms) polling 100 us with yields.
    const Clock::time_point spin_end = start + spin_now_;
    for (uint32_t i = 1; k >= 0; ++i) {
      DEJA_SHM_PAUSE();
      k = FirstBehind(g, k);
      if ((i & 15) == 0 && Clock::now() >= spin_end) break;
    }
    spin_now_ = k < 0 ? std::min<Clock::duration>(spin_, spin_now_ * 2)
                      : std::max<Clock::duration>(min_spin_, spin_now_ / 2);
    // Then sleep on the first late rank's counter, checking for failures between slices.
    const Clock::time_point deadline = start + timeout_;
    while (k >= 0) {
      DEJA_RETURN_IF_ERROR(CheckPeers());
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        return Fail(Unavailable("rank " + std::to_string(k) +
                                " did not reach the collective within " +
                                std::to_string(timeout_.count()) + " ms (stopped or hung?)"));
      }
      RankLine& late = layout_.line(k);
      late.sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = late.arrived.load(std::memory_order_seq_cst);
      if (static_cast<int32_t>(seen - g) < 0) {
        FutexWait(&late.arrived, seen, std::min<Clock::duration>(kSleepSlice, deadline - now));
      }
      late.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      k = FirstBehind(g, k);
    }
    return Status::Ok();
  }

  // Fails if the group has failed elsewhere (first: that rank's reason is the cause, its exit
  // may follow), or a peer left or died.
  Status CheckPeers() {
    ShmHeader& h = layout_.header();
    const uint32_t failed = h.failed.load(std::memory_order_acquire);
    if (failed != 0) {
      std::string why = "rank " + std::to_string(failed - 1) + " failed";
      if (h.reason_ready.load(std::memory_order_acquire) != 0) {
        why += " (" + std::string(h.reason, strnlen(h.reason, sizeof(h.reason))) + ")";
      }
      return Fail(Unavailable(why + "; the group is unusable"));
    }
    for (int k = 0; k < world_; ++k) {
      if (k != rank_ && layout_.line(k).left.load(std::memory_order_acquire) != 0 &&
          !Reached(k, gen_)) {
        return Fail(Unavailable("rank " + std::to_string(k) + " left the group"));
      }
    }
    if (int dead = watch_.FirstDead(); dead >= 0) {
      return Fail(Unavailable("rank " + std::to_string(dead) + " (pid " +
                              std::to_string(watch_.pid(dead)) + ") died"));
    }
    return Status::Ok();
  }

  // Records the first failure (the communicator stays failed: the peers may be anywhere in the
  // protocol now) and flags it in the segment so that waiting peers fail at once too.
  Status Fail(const Status& s) {
    failure_ = Status(s.code(), "rank " + std::to_string(rank_) + ": shm " + s.message() +
                                    " (the group must be rebuilt)");
    ShmHeader& h = layout_.header();
    uint32_t none = 0;
    if (h.failed.compare_exchange_strong(none, static_cast<uint32_t>(rank_ + 1),
                                         std::memory_order_acq_rel)) {
      const size_t len = std::min(s.message().size(), sizeof(h.reason) - 1);
      std::memcpy(h.reason, s.message().data(), len);
      h.reason[len] = '\0';
      h.reason_ready.store(1, std::memory_order_release);
    }
    for (int k = 0; k < world_; ++k) FutexWakeAll(&layout_.line(k).arrived);
    return failure_;
  }

  SharedSegment segment_;
  ShmLayout layout_;
  const int rank_;
  const int world_;
  const size_t slot_bytes_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::microseconds spin_;
  PeerWatch watch_;
  std::vector<const float*> src_;   // the all-reduce's sources, kept to spare an allocation
  uint32_t gen_ = 0;                // the last barrier generation this rank arrived at
  const Clock::duration min_spin_;  // kMinSpin, or less if spin_ is
  Clock::duration spin_now_;        // the current polling time, in [min_spin_, spin_]
  Status failure_;
};

}  // namespace

std::unique_ptr<comm::Communicator> NewShmCommunicator(SharedSegment segment,
                                                       const ShmOptions& options) {
  return std::make_unique<ShmCommunicator>(std::move(segment), options.rank, options);
}

}  // namespace deja::worker::comm
