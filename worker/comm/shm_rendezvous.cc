// The shared-memory communicator's rendezvous (MakeShmCommunicator): the segment's name, its
// creation by rank 0 and publication through the store, the other ranks' mapping of it, and the
// unlink once all have mapped it.
#include <glog/logging.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "worker/comm/shm_communicator.h"
#include "worker/comm/shm_layout.h"
#include "worker/comm/shm_segment.h"

namespace deja::worker::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Best effort on the failure paths (the error being returned matters more).
void UnlinkOrWarn(const std::string& name) {
  if (Status s = SharedSegment::Unlink(name); !s.ok()) LOG(WARNING) << s.ToString();
}

uint64_t PidNamespace() {
  struct stat st = {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

// A name no other group can have picked: the key prefix (made name-safe) for the reader of
// /dev/shm, this process's id and random bits.
StatusOr<std::string> NewSegmentName(const std::string& key_prefix) {
  uint64_t bits = 0;
  if (::getentropy(&bits, sizeof(bits)) != 0) {
    return Internal(std::string("getentropy failed: ") + std::strerror(errno));
  }
  std::string tag;
  for (char c : key_prefix.substr(0, 64)) {
    tag += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '-';
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(bits));
  return "/deja-" + tag + "-" + std::to_string(::getpid()) + "-" + hex;
}

// Rank 0 creates and publishes the segment; the others open what it published.
StatusOr<SharedSegment> CreateOrOpen(KeyValueStore& store, const ShmOptions& o) {
  const std::string key = o.key_prefix + "/segment";
  if (o.rank == 0) {
    DEJA_ASSIGN_OR_RETURN(std::string name, NewSegmentName(o.key_prefix));
    DEJA_ASSIGN_OR_RETURN(
        SharedSegment s,
        SharedSegment::Create(name, ShmLayout::TotalBytes(o.world_size, o.slot_bytes)));
    ShmLayout::Init(s.data(), o.world_size, o.slot_bytes, name);
    if (Status st = store.Set(key, name); !st.ok()) {
      UnlinkOrWarn(name);
      return st.WithContext("publishing the segment's name");
    }
    return s;
  }
  StatusOr<std::string> name = store.Get(key, o.timeout);
  if (!name.ok()) return name.status().WithContext("waiting for rank 0's segment");
  StatusOr<SharedSegment> s = SharedSegment::Open(*name);
  if (!s.ok()) return s.status().WithContext("is every rank on one host?");
  DEJA_RETURN_IF_ERROR(ShmLayout::Check(s->data(), s->size(), o.world_size, *name));
  return s;
}

// Maps the segment, publishes this rank's process, and waits until every rank has mapped it;
// the name is unlinked once they all have (or when this rank gives up).
StatusOr<std::unique_ptr<comm::Communicator>> Join(KeyValueStore& store, const ShmOptions& o) {
  DEJA_ASSIGN_OR_RETURN(SharedSegment segment, CreateOrOpen(store, o));
  const std::string name = segment.name();
  ShmLayout layout(segment.data());
  RankLine& me = layout.line(o.rank);
  me.pid.store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
  me.pid_ns.store(PidNamespace(), std::memory_order_relaxed);
  ShmHeader& h = layout.header();
  // The last rank to map the segment removes its name: from then on it lives only as long as
  // the mappings, so no process death can leave it behind in /dev/shm.
  if (h.attached.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(o.world_size)) {
    UnlinkOrWarn(name);
  }
  const Clock::time_point deadline = Clock::now() + o.timeout;
  auto sleep = std::chrono::microseconds(50);
  for (;;) {
    const uint32_t attached = h.attached.load(std::memory_order_acquire);
    if (h.failed.load(std::memory_order_acquire) != 0) {
      UnlinkOrWarn(name);
      return Unavailable("another rank gave up on segment " + name);
    }
    if (attached >= static_cast<uint32_t>(o.world_size)) break;
    if (Clock::now() >= deadline) {
      // Fails the ranks that did map it at once, and keeps late ones from joining a group that
      // has failed.
      h.failed.store(static_cast<uint32_t>(o.rank + 1), std::memory_order_release);
      UnlinkOrWarn(name);
      return Unavailable("only " + std::to_string(attached) + " of " +
                         std::to_string(o.world_size) + " ranks mapped segment " + name +
                         " within " + std::to_string(o.timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min<std::chrono::microseconds>(sleep * 2, std::chrono::milliseconds(5));
  }
  LOG(INFO) << "shm rank " << o.rank << "/" << o.world_size << " mapped " << name << " ("
            << segment.size() << " bytes, " << layout.slot_bytes() << " per slot)";
  return NewShmCommunicator(std::move(segment), o);
}

}  // namespace

StatusOr<std::unique_ptr<comm::Communicator>> MakeShmCommunicator(KeyValueStore& store,
                                                                  const ShmOptions& options) {
  if (options.world_size < 1 || options.world_size > kShmMaxWorld || options.rank < 0 ||
      options.rank >= options.world_size) {
    return InvalidArgument("shm: rank " + std::to_string(options.rank) + " is outside world size " +
                           std::to_string(options.world_size) + " (at most " +
                           std::to_string(kShmMaxWorld) + ")");
  }
  if (options.timeout.count() <= 0) return InvalidArgument("shm: timeout must be positive");
  if (options.spin.count() < 0) return InvalidArgument("shm: spin must be >= 0");
  if (options.slot_bytes < 4096 || options.slot_bytes % kShmLine != 0 ||
      options.slot_bytes > (size_t{1} << 30)) {
    return InvalidArgument("shm: slot_bytes " + std::to_string(options.slot_bytes) +
                           " must be a multiple of 64 in [4 KiB, 1 GiB]");
  }
  StatusOr<std::unique_ptr<comm::Communicator>> comm = Join(store, options);
  if (!comm.ok()) {
    const Status& s = comm.status();
    return Status(s.code() == StatusCode::kDeadlineExceeded ? StatusCode::kUnavailable : s.code(),
                  "shm rendezvous: " + s.message() + " (rank " + std::to_string(options.rank) +
                      " of " + std::to_string(options.world_size) + ")");
  }
  return comm;
}

}  // namespace deja::worker::comm
