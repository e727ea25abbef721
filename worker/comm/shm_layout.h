// The layout of the same-host communicator's segment (internal to shm_communicator.cc and
// shm_rendezvous.cc): a header, one cache line of counters per rank, then two sets of one data
// slot per rank (consecutive rounds alternate between the sets). Rank 0 constructs it; the
// others check it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "common/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/shm_communicator.h"
#include "worker/comm/shm_segment.h"

namespace deja::worker::comm {

// Every process maps the segment at its own address, so it holds no pointers; and its atomics
// must be lock-free (an address-free atomic), or they would not synchronise across processes.
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);

inline constexpr size_t kShmLine = 64;
inline constexpr uint64_t kShmMagic = 0x31686d73616a6564ull;  // "dejashm1"
inline constexpr uint32_t kShmVersion = 1;
inline constexpr int kShmMaxWorld = 4096;

struct ShmHeader {
  std::atomic<uint64_t> magic;  // stored last, with release, by rank 0
  uint32_t version;
  uint32_t world;
  uint64_t slot_bytes;
  uint64_t total_bytes;
  char name[192];  // the segment's own name: a rank that opened a stale name notices
  alignas(kShmLine) std::atomic<uint32_t> attached;  // ranks that have mapped the segment
  // 1 + the rank whose collective failed first, 0 while none has: the others fail at once.
  std::atomic<uint32_t> failed;
  // That rank's error, readable once `reason_ready` is set, for the others' messages.
  std::atomic<uint32_t> reason_ready;
  char reason[256];
};

struct alignas(kShmLine) RankLine {
  // The barrier generation this rank last arrived at (wraps; compared by difference). A futex
  // word: peers sleep on it.
  std::atomic<uint32_t> arrived;
  // Peers asleep on `arrived`: the arriving rank makes the wake syscall only if there are any.
  std::atomic<uint32_t> sleepers;
  // The collective this rank called at the generations of each parity (see Post()).
  std::atomic<uint64_t> posted[2];
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> left;  // set when its communicator is destroyed
  // Its pid namespace (inode of /proc/self/ns/pid): its pid names its process only if equal.
  std::atomic<uint64_t> pid_ns;
};

class ShmLayout {
 public:
  static size_t LinesOffset() { return RoundUp(sizeof(ShmHeader), kShmLine); }
  static size_t DataOffset(int world) {
    return RoundUp(LinesOffset() + sizeof(RankLine) * static_cast<size_t>(world), 4096);
  }
  static size_t TotalBytes(int world, size_t slot_bytes) {
    return DataOffset(world) + 2 * static_cast<size_t>(world) * slot_bytes;
  }

  // Constructs the header and lines in fresh (zeroed) memory of TotalBytes(world, slot_bytes).
  static void Init(uint8_t* base, int world, size_t slot_bytes, const std::string& name) {
    auto* h = new (base) ShmHeader;
    h->version = kShmVersion;
    h->world = static_cast<uint32_t>(world);
    h->slot_bytes = slot_bytes;
    h->total_bytes = TotalBytes(world, slot_bytes);
    std::memset(h->name, 0, sizeof(h->name));
    std::memcpy(h->name, name.data(), std::min(name.size(), sizeof(h->name) - 1));
    h->attached.store(0, std::memory_order_relaxed);
    h->failed.store(0, std::memory_order_relaxed);
    h->reason_ready.store(0, std::memory_order_relaxed);
    std::memset(h->reason, 0, sizeof(h->reason));
    for (int k = 0; k < world; ++k) {
      auto* line = new (base + LinesOffset() + sizeof(RankLine) * k) RankLine;
      line->arrived.store(0, std::memory_order_relaxed);
      line->sleepers.store(0, std::memory_order_relaxed);
      line->posted[0].store(0, std::memory_order_relaxed);
      line->posted[1].store(0, std::memory_order_relaxed);
      line->pid.store(0, std::memory_order_relaxed);
      line->left.store(0, std::memory_order_relaxed);
      line->pid_ns.store(0, std::memory_order_relaxed);
    }
    h->magic.store(kShmMagic, std::memory_order_release);
  }

  // Whether `size` bytes at `base` are a segment Init made for `world` ranks under `name`.
  static Status Check(const uint8_t* base, size_t size, int world, const std::string& name) {
    if (size < sizeof(ShmHeader)) return DataLoss("segment " + name + " is too small");
    const auto* h = reinterpret_cast<const ShmHeader*>(base);
    if (h->magic.load(std::memory_order_acquire) != kShmMagic || h->version != kShmVersion) {
      return DataLoss("segment " + name + " is not a deja shm segment of this version");
    }
    if (static_cast<int>(h->world) != world) {
      return InvalidArgument("segment " + name + " is for " + std::to_string(h->world) +
                             " ranks, this rank was told " + std::to_string(world));
    }
    if (std::strncmp(h->name, name.c_str(), sizeof(h->name)) != 0 ||
        h->total_bytes != TotalBytes(world, h->slot_bytes) || h->total_bytes != size) {
      return DataLoss("segment " + name + " has an inconsistent header");
    }
    return Status::Ok();
  }

  explicit ShmLayout(uint8_t* base) : base_(base) {}

  ShmHeader& header() const { return *reinterpret_cast<ShmHeader*>(base_); }
  int world() const { return static_cast<int>(header().world); }
  size_t slot_bytes() const { return header().slot_bytes; }
  RankLine& line(int k) const {
    return *reinterpret_cast<RankLine*>(base_ + LinesOffset() + sizeof(RankLine) * k);
  }
  uint8_t* slot(int set, int k) const {
    return base_ + DataOffset(world()) + (static_cast<size_t>(set) * world() + k) * slot_bytes();
  }

 private:
  static size_t RoundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

  uint8_t* base_;
};

// The communicator of rank `options.rank` over a segment that every rank has mapped and
// published its process in (shm_communicator.cc).
std::unique_ptr<comm::Communicator> NewShmCommunicator(SharedSegment segment,
                                                       const ShmOptions& options);

}  // namespace deja::worker::comm
