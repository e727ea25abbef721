// CPU KvEvict: each head's `excess` lowest-ranked old slots freed, as the reference does it (rank,
// then position, lowest first), over contiguous and paged caches. The reference sorts every
// candidate; here a partial sort finds only the victims (decode evicts one slot per head per step
// from a few hundred candidates), and heads run in parallel (each head's slots are its own).
#include <algorithm>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

namespace deja::kernels::cpu {
namespace {

struct Candidate {
  double rank;
  int32_t pos, slot;
  bool operator<(const Candidate& o) const {
    return rank < o.rank || (rank == o.rank && pos < o.pos);
  }
};

void EvictHead(const KvView& kv, int32_t h, const KvEvictArgs& a, int32_t* victims,
               std::vector<Candidate>& cand) {
  cand.clear();
  for (int32_t s = 0; s < kv.used; ++s) {
    const int64_t at = KvSlotIndex(kv, h, s);
    const int32_t pos = kv.slot_pos[at];
    if (pos >= 0 && a.decay != 1.f) kv.score[at] *= a.decay;
    if (a.excess == 0 || pos < 0 || pos >= a.oldest_recent) continue;
    double rank = pos;
    if (a.rank == KvRank::kScore) rank = kv.score[at];
    // In float, as the reference and the host policy divide.
    if (a.rank == KvRank::kMeanScore) rank = kv.score[at] / static_cast<float>(a.length - pos);
    cand.push_back({rank, pos, s});
  }
  const int32_t take = std::min<int32_t>(a.excess, static_cast<int32_t>(cand.size()));
  std::partial_sort(cand.begin(), cand.begin() + take, cand.end());
  for (int32_t j = 0; j < a.excess; ++j) {
    int32_t slot = -1;
    if (j < take) {
      slot = cand[j].slot;
      const int64_t at = KvSlotIndex(kv, h, slot);
      const_cast<int32_t*>(kv.slot_pos)[at] = -1;
      if (kv.score != nullptr) kv.score[at] = 0.f;
    }
    victims[static_cast<int64_t>(h) * a.excess + j] = slot;
  }
}

}  // namespace

Status CpuKvEvict(Backend& backend, const KvView& kv, int32_t heads, const KvEvictArgs& args,
                  int32_t* victims) {
  // A few thousand candidates per chunk at least: below that a hand-off costs more than it saves.
  const int64_t min_heads = std::max<int64_t>(1, 4096 / std::max<int32_t>(1, kv.used));
  backend.pool()->ParallelFor(
      heads,
      [&](int64_t h0, int64_t h1) {
        thread_local std::vector<Candidate> cand;
        for (int64_t h = h0; h < h1; ++h) {
          EvictHead(kv, static_cast<int32_t>(h), args, victims, cand);
        }
      },
      min_heads);
  return Status::Ok();
}

}  // namespace deja::kernels::cpu
