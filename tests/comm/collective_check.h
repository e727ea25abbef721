// The collective-correctness grid shared by the thread tests and the multi-process peer: each
// rank derives every rank's seeded input, so it can check its own results against a reference
// without talking to the test process. Returns the problems found (empty when all is right) and
// a digest of the all-reduce outputs, to compare ranks and runs bitwise.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"

namespace deja::test_util {

inline const std::vector<int64_t>& CollectiveSizes() {
  static const std::vector<int64_t> sizes = {0, 1, 2, 3, 5, 17, 256, 1000, 2048, 4099, 300001};
  return sizes;
}

inline std::vector<float> RankData(int rank, int64_t n, uint64_t salt) {
  std::mt19937_64 rng(salt * 1000003u + static_cast<uint64_t>(rank) * 7919u +
                      static_cast<uint64_t>(n));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

inline void Fnv(uint64_t* h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) *h = (*h ^ p[i]) * 1099511628211ull;
}

struct CheckResult {
  std::vector<std::string> problems;
  uint64_t digest = 1469598103934665603ull;
};

inline void Note(CheckResult* r, const std::string& what) {
  if (r->problems.size() < 20) r->problems.push_back(what);
}

inline CheckResult CheckCollectives(worker::comm::Communicator& comm, uint64_t salt = 1) {
  CheckResult r;
  const int rank = comm.rank(), world = comm.world_size();
  for (int64_t n : CollectiveSizes()) {
    const std::string tag = " n=" + std::to_string(n) + " world=" + std::to_string(world);
    std::vector<std::vector<float>> all;
    for (int k = 0; k < world; ++k) all.push_back(RankData(k, n, salt));

    // All-reduce: every element within fp32 rounding of the exact sum.
    std::vector<float> data = all[rank];
    Status s = comm.AllReduceSum(data.data(), n);
    if (!s.ok()) Note(&r, "all-reduce" + tag + ": " + s.ToString());
    for (int64_t i = 0; s.ok() && i < n; ++i) {
      double want = 0, mag = 0;
      for (int k = 0; k < world; ++k) {
        want += all[k][i];
        mag += std::fabs(all[k][i]);
      }
      if (std::fabs(data[i] - want) > 1e-6 * mag + 1e-30) {
        Note(&r, "all-reduce" + tag + " element " + std::to_string(i) + ": got " +
                     std::to_string(data[i]) + " want " + std::to_string(want));
        break;
      }
    }
    Fnv(&r.digest, data.data(), data.size() * sizeof(float));

    // All-gather: the concatenation, bit for bit.
    std::vector<float> gathered(static_cast<size_t>(n) * world, -1.0f);
    s = comm.AllGather(all[rank].data(), n, gathered.data());
    if (!s.ok()) Note(&r, "all-gather" + tag + ": " + s.ToString());
    for (int k = 0; s.ok() && k < world; ++k) {
      if (n > 0 && std::memcmp(gathered.data() + k * n, all[k].data(), n * sizeof(float)) != 0) {
        Note(&r, "all-gather" + tag + ": block of rank " + std::to_string(k) + " differs");
      }
    }

    // Broadcast from every root: the root's bytes everywhere.
    for (int root = 0; root < world; ++root) {
      std::vector<float> b = all[rank];
      s = comm.Broadcast(b.data(), b.size() * sizeof(float), root);
      if (!s.ok()) Note(&r, "broadcast" + tag + ": " + s.ToString());
      if (s.ok() && n > 0 && std::memcmp(b.data(), all[root].data(), n * sizeof(float)) != 0) {
        Note(&r, "broadcast" + tag + " root " + std::to_string(root) + ": data differs");
      }
    }
    s = comm.Barrier();
    if (!s.ok()) Note(&r, "barrier" + tag + ": " + s.ToString());
  }
  return r;
}

}  // namespace deja::test_util
