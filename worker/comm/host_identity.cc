#include "worker/comm/host_identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace deja::worker::comm {

std::string HostIdentity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  if (boot.empty()) return "unknown";
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  // Without a /dev/shm (glibc's shm_open lives there) there is nothing to share.
  struct stat st = {};
  if (::stat("/dev/shm", &st) != 0) return "unknown";
  return "boot_id=" + boot + " host=" + host + " uid=" + std::to_string(::geteuid()) +
         " shm=" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

StatusOr<SameHostCheck> CheckSameHost(KeyValueStore& store, const std::string& key_prefix, int rank,
                                      int world_size, std::chrono::milliseconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgument("rank " + std::to_string(rank) + " is outside world size " +
                           std::to_string(world_size));
  }
  const std::string mine = HostIdentity();
  DEJA_RETURN_IF_ERROR(store.Set(key_prefix + "/" + std::to_string(rank), mine));
  SameHostCheck check;
  check.same = mine != "unknown";
  check.detail = check.same ? mine : "no boot id or no /dev/shm here";
  for (int k = 0; k < world_size; ++k) {
    const std::string key = key_prefix + "/" + std::to_string(k);
    StatusOr<std::string> theirs = store.Get(key, timeout);
    if (!theirs.ok()) {
      return theirs.status().WithContext("waiting for rank " + std::to_string(k) +
                                         "'s host identity");
    }
    if (*theirs != mine) {
      check.same = false;
      check.detail = "rank " + std::to_string(k) + " has " + *theirs + ", rank " +
                     std::to_string(rank) + " " + mine;
      break;
    }
  }
  return check;
}

}  // namespace deja::worker::comm
