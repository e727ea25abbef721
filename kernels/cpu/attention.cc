// CPU attention over a slot-mapped KV cache: for each (query token, head) the visible slots are
// gathered (position known and <= the query's), scored, soft-maxed in f32 and used to weight V.
// With head_ids (head-sparse attention) head h of q/out reads cache head head_ids[h]; the ids are
// distinct (kernels/ops.cc checks), so the split below still gives each score row one writer.
// Paged caches (KvView::blocks) are read through the same slot lists: each list entry is the slot's
// index from the view's base (KvSlotIndex), so a head's slots may lie in any blocks.
// One query (decode) is attended per head; several per head and block of queries, each query's
// result bit-identical to its own single-query call (AttendHeadBlock). Work is split over heads
// when H2O scores are accumulated (each head's score row then has one writer, and tokens add into
// it in order, as the reference does) and over (head, block) pairs otherwise. Calls with many
// query tokens (prefill) that need no such identity (AttentionArgs::per_query unset; the model
// always sets it on the CPU) take a GEMM path per head instead.
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/kv_row.h"
#include "common/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

namespace deja::kernels::cpu {
namespace {

// Calls f(index) for every slot [0, used) of cache head `ch`, in slot order, where index is
// KvSlotIndex(kv, ch, s): the slot's element of slot_pos and score, and its row of k and v.
template <typename F>
inline void ForEachSlot(const KvView& kv, int64_t ch, F&& f) {
  if (kv.blocks == nullptr) {
    const int64_t base = ch * kv.capacity;
    for (int64_t s = 0; s < kv.used; ++s) f(base + s);
    return;
  }
  const int64_t bs = kv.block_slots;
  for (int64_t s0 = 0, b = 0; s0 < kv.used; s0 += bs, ++b) {
    const int64_t base = kv.blocks[b] * kv.block_stride + ch * bs;
    const int64_t n = std::min(bs, kv.used - s0);
    for (int64_t i = 0; i < n; ++i) f(base + i);
  }
}

// The call's one query (decode), head h.
void AttendOne(const AttentionArgs& a, int64_t h, std::vector<float>& probs,
               std::vector<int32_t>& slots) {
  const KvView& kv = a.kv;
  const int64_t d = a.head_dim;
  // h indexes q and out (compact when head-sparse); the cache is indexed by the cache head.
  const int64_t ch = a.head_ids != nullptr ? a.head_ids[h] : h;
  const float* q = a.q.as<float>() + h * d;
  float* out = a.out.as<float>() + h * d;
  const int32_t q_pos = a.q_pos[0];
  if (a.keep != nullptr && a.keep[h] == 0) {
    std::memset(out, 0, static_cast<size_t>(d) * sizeof(float));
    return;
  }

  int64_t count = 0;
  ForEachSlot(kv, ch, [&](int64_t at) {
    const int32_t pos = kv.slot_pos[at];
    if (pos >= 0 && pos <= q_pos) slots[count++] = static_cast<int32_t>(at);
  });
  if (count == 0) {
    std::memset(out, 0, static_cast<size_t>(d) * sizeof(float));
    return;
  }
  DotRows(q, kv.k, kv.dtype, slots.data(), count, d, a.scale, probs.data());
  const float max_score = MaxOf(probs.data(), count);
  const float inv_sum = 1.f / ExpShiftInPlace(probs.data(), count, max_score);
  for (int64_t j = 0; j < count; ++j) probs[j] *= inv_sum;
  WeightedSumRows(probs.data(), kv.v, kv.dtype, slots.data(), count, d, out);
  if (kv.score != nullptr) {
    for (int64_t j = 0; j < count; ++j) kv.score[slots[j]] += probs[j];
  }
}

// Calls with several queries, per_query or too few for the GEMM path: per head and block of
// queries, the slots any query of the block sees (position known and <= the block's latest
// query), in slot order; every query's scores against them in one DotRowsMulti; each query's
// softmax over its own visible slots, as AttendOne computes it; and the outputs in one
// WeightedSumRowsMulti, each query summing only the slots it sees, in slot order. Each
// (token, head) is then AttendOne's bit for bit (simd.h), with K and V rows widened once per
// block instead of once per query; H2O scores are added token by token in order.
constexpr int64_t kBlockQueries = 32;

struct BlockScratch {
  std::vector<int32_t> slots, pos, q_pos;
  std::vector<float> p, row;
};

void AttendHeadBlock(const AttentionArgs& a, int64_t h, int64_t t0, int64_t t1, BlockScratch& g) {
  const KvView& kv = a.kv;
  const int64_t d = a.head_dim;
  const int64_t width = static_cast<int64_t>(a.heads) * d;
  const int64_t ch = a.head_ids != nullptr ? a.head_ids[h] : h;
  const int64_t nq = t1 - t0;
  const float* q = a.q.as<float>() + t0 * width + h * d;
  float* out = a.out.as<float>() + t0 * width + h * d;

  // A skipped (token, head) (AttentionArgs::keep) sees no slot: a zero output and no score.
  g.q_pos.resize(nq);
  int32_t latest = -1;
  for (int64_t i = 0; i < nq; ++i) {
    const bool skip = a.keep != nullptr && a.keep[(t0 + i) * a.heads + h] == 0;
    g.q_pos[i] = skip ? -1 : a.q_pos[t0 + i];
    latest = std::max(latest, g.q_pos[i]);
  }
  g.slots.clear();
  g.pos.clear();
  bool sorted = true;
  ForEachSlot(kv, ch, [&](int64_t at) {
    const int32_t pos = kv.slot_pos[at];
    if (pos < 0 || pos > latest) return;
    if (!g.pos.empty() && pos < g.pos.back()) sorted = false;
    g.slots.push_back(static_cast<int32_t>(at));
    g.pos.push_back(pos);
  });
  const int64_t n = static_cast<int64_t>(g.slots.size());
  if (n == 0) {
    for (int64_t i = 0; i < nq; ++i) std::memset(out + i * width, 0, d * sizeof(float));
    return;
  }
  g.p.resize(nq * n);
  DotRowsMulti(q, width, nq, kv.k, kv.dtype, g.slots.data(), n, d, a.scale, g.p.data(), n);
  // Each query's softmax over the slots it sees, compacted (in slot order) unless they are a
  // prefix of the list already (slots in position order: the usual prefill).
  g.row.resize(n);
  for (int64_t i = 0; i < nq; ++i) {
    float* p = g.p.data() + i * n;
    const int32_t qp = g.q_pos[i];
    if (qp < 0) continue;
    float* x = p;
    int64_t count;
    if (sorted) {
      count = std::upper_bound(g.pos.begin(), g.pos.end(), qp) - g.pos.begin();
    } else {
      x = g.row.data();
      count = 0;
      for (int64_t j = 0; j < n; ++j)
        if (g.pos[j] <= qp) x[count++] = p[j];
    }
    if (count == 0) continue;
    const float inv_sum = 1.f / ExpShiftInPlace(x, count, MaxOf(x, count));
    for (int64_t j = 0; j < count; ++j) x[j] *= inv_sum;
    if (!sorted) {
      for (int64_t j = 0, c = 0; j < n; ++j)
        if (g.pos[j] <= qp) p[j] = x[c++];
    }
  }
  WeightedSumRowsMulti(g.p.data(), n, nq, g.q_pos.data(), kv.v, kv.dtype, g.slots.data(),
                       g.pos.data(), n, d, out, width);
  if (kv.score != nullptr) {
    for (int64_t i = 0; i < nq; ++i) {
      const float* p = g.p.data() + i * n;
      for (int64_t j = 0; j < n; ++j)
        if (g.pos[j] <= g.q_pos[i]) kv.score[g.slots[j]] += p[j];
    }
  }
}

// Prefill-sized calls, one head at a time: the head's visible slots sorted by position (so every
// query sees a prefix of them), their K and V rows widened to f32 once, then per block of
// queries the scores as one SGEMM, a softmax over each query's prefix (the rest of its row
// zeroed) and the outputs as a second SGEMM. Per (query, slot) the work is that of AttendOne,
// but K and V are read and widened once per call instead of once per query, and the products run
// at GEMM speed; H2O scores are added token by token in order, as AttendOne adds them. The sums
// run in another order than DotRows', so results agree with the per-query path to f32 rounding,
// not bit for bit (over int8 K rows, with the query rounded to int16 as there).
constexpr int64_t kGemmMinTokens = 8;
constexpr int64_t kGemmQueryBlock = 64;

struct GemmScratch {
  std::vector<int32_t> slots, pos;
  std::vector<float> k, v, p, q;
  std::vector<int16_t> q16;
};

void AttendHeadGemm(const AttentionArgs& a, int64_t h, GemmScratch& g) {
  const KvView& kv = a.kv;
  const int64_t d = a.head_dim;
  const int64_t width = static_cast<int64_t>(a.heads) * d;
  const int64_t tokens = a.q.rows();
  const int64_t ch = a.head_ids != nullptr ? a.head_ids[h] : h;
  const int32_t* slot_pos = kv.slot_pos;

  g.slots.clear();
  ForEachSlot(kv, ch, [&](int64_t at) {
    if (slot_pos[at] >= 0) g.slots.push_back(static_cast<int32_t>(at));
  });
  std::stable_sort(g.slots.begin(), g.slots.end(),
                   [slot_pos](int32_t x, int32_t y) { return slot_pos[x] < slot_pos[y]; });
  const int64_t n = static_cast<int64_t>(g.slots.size());
  g.pos.resize(n);
  for (int64_t j = 0; j < n; ++j) g.pos[j] = slot_pos[g.slots[j]];
  g.k.resize(n * d);
  g.v.resize(n * d);
  const size_t row_bytes = KvRowBytes(kv.dtype, d);
  const char* k_head = static_cast<const char*>(kv.k);
  const char* v_head = static_cast<const char*>(kv.v);
  for (int64_t j = 0; j < n; ++j) {
    KvRowToF32(k_head + g.slots[j] * row_bytes, kv.dtype, d, g.k.data() + j * d);
    KvRowToF32(v_head + g.slots[j] * row_bytes, kv.dtype, d, g.v.data() + j * d);
  }

  const float* q = a.q.as<float>() + h * d;
  int64_t ldq = width;
  if (kv.dtype == DType::kI8) {
    // int8 K rows meet each query rounded to int16 (common/kv_row.h), as in DotRowsI8.
    g.q.resize(tokens * d);
    g.q16.resize(d);
    for (int64_t t = 0; t < tokens; ++t) {
      const float qs = KvQueryToI16(q + t * width, d, g.q16.data());
      for (int64_t e = 0; e < d; ++e) g.q[t * d + e] = qs * static_cast<float>(g.q16[e]);
    }
    q = g.q.data();
    ldq = d;
  }
  float* out = a.out.as<float>() + h * d;
  for (int64_t t0 = 0; t0 < tokens; t0 += kGemmQueryBlock) {
    const int64_t tb = std::min(kGemmQueryBlock, tokens - t0);
    // Slots each query of the block sees (a prefix of the sorted list); the block's widest.
    int64_t visible[kGemmQueryBlock];
    int64_t nb = 0;
    for (int64_t i = 0; i < tb; ++i) {
      visible[i] = std::upper_bound(g.pos.begin(), g.pos.end(), a.q_pos[t0 + i]) - g.pos.begin();
      nb = std::max(nb, visible[i]);
    }
    if (nb == 0) {
      for (int64_t i = 0; i < tb; ++i) std::memset(out + (t0 + i) * width, 0, d * sizeof(float));
      continue;
    }
    g.p.resize(tb * nb);
    float* p = g.p.data();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(tb), static_cast<int>(nb),
                static_cast<int>(d), a.scale, q + t0 * ldq, static_cast<int>(ldq), g.k.data(),
                static_cast<int>(d), 0.f, p, static_cast<int>(nb));
    for (int64_t i = 0; i < tb; ++i) {
      float* row = p + i * nb;
      // A skipped (token, head) (AttentionArgs::keep): a zero row of probabilities, so a zero
      // output and no score.
      if (a.keep != nullptr && a.keep[(t0 + i) * a.heads + h] == 0) visible[i] = 0;
      const int64_t count = visible[i];
      if (count > 0) {
        const float inv_sum = 1.f / ExpShiftInPlace(row, count, MaxOf(row, count));
        for (int64_t j = 0; j < count; ++j) row[j] *= inv_sum;
      }
      std::fill(row + count, row + nb, 0.f);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(tb),
                static_cast<int>(d), static_cast<int>(nb), 1.f, p, static_cast<int>(nb), g.v.data(),
                static_cast<int>(d), 0.f, out + t0 * width, static_cast<int>(width));
    if (kv.score != nullptr) {
      float* score = kv.score;
      for (int64_t i = 0; i < tb; ++i) {
        const float* row = p + i * nb;
        for (int64_t j = 0; j < visible[i]; ++j) score[g.slots[j]] += row[j];
      }
    }
  }
}

}  // namespace

Status CpuAttention(Backend& backend, const AttentionArgs& a) {
  const int64_t tokens = a.q.rows();
  const int64_t heads = a.heads;
  // Scratch sized by the cache; thread_local so pool threads reuse it across calls.
  auto run = [&a](auto&& body) {
    thread_local std::vector<float> probs;
    thread_local std::vector<int32_t> slots;
    if (probs.size() < static_cast<size_t>(a.kv.used)) {
      probs.resize(a.kv.used);
      slots.resize(a.kv.used);
    }
    body(probs, slots);
  };
  // Below ~16K multiply-adds per chunk the hand-off to another thread costs more than it saves.
  const int64_t per_item = std::max<int64_t>(1, int64_t{2} * a.kv.used * a.head_dim);
  const int64_t min_items = std::max<int64_t>(1, (int64_t{1} << 14) / per_item);
  const int64_t blocks = (tokens + kBlockQueries - 1) / kBlockQueries;
  if (tokens >= kGemmMinTokens && !a.per_query) {
    backend.pool()->ParallelFor(
        heads,
        [&](int64_t h0, int64_t h1) {
          thread_local GemmScratch scratch;
          for (int64_t h = h0; h < h1; ++h) AttendHeadGemm(a, h, scratch);
        },
        1);
  } else if (tokens > 1) {
    // With H2O scores each head's blocks run in order on one thread (its score row has one
    // writer, adding token by token); otherwise (head, block) pairs spread over the threads.
    const bool by_head = a.kv.score != nullptr;
    backend.pool()->ParallelFor(
        by_head ? heads : heads * blocks,
        [&](int64_t i0, int64_t i1) {
          thread_local BlockScratch scratch;
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t h = by_head ? i : i / blocks;
            const int64_t b0 = by_head ? 0 : i % blocks, b1 = by_head ? blocks : b0 + 1;
            for (int64_t b = b0; b < b1; ++b) {
              AttendHeadBlock(a, h, b * kBlockQueries,
                              std::min(tokens, (b + 1) * kBlockQueries), scratch);
            }
          }
        },
        std::max<int64_t>(1, min_items / (by_head ? tokens : std::min(tokens, kBlockQueries))));
  } else {
    backend.pool()->ParallelFor(
        heads,
        [&](int64_t h0, int64_t h1) {
          run([&](std::vector<float>& probs, std::vector<int32_t>& slots) {
            for (int64_t h = h0; h < h1; ++h) AttendOne(a, h, probs, slots);
          });
        },
        min_items);
  }
  return Status::Ok();
}

}  // namespace deja::kernels::cpu
