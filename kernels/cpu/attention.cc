// CPU attention over a slot-mapped KV cache: for each (query token, head) the visible slots are
// gathered (position known and <= the query's), scored, soft-maxed in f32 and used to weight V.
// With head_ids (head-sparse attention) head h of q/out reads cache head head_ids[h]; the ids are
// distinct (kernels/ops.cc checks), so the split below still gives each score row one writer.
// Work is split over heads when H2O scores are accumulated (each head's score row then has one
// writer, and tokens add into it in order, as the reference does) and over (token, head) pairs
// otherwise.
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

namespace deja::kernels::cpu {
namespace {

void AttendOne(const AttentionArgs& a, int64_t t, int64_t h, std::vector<float>& probs,
               std::vector<int32_t>& slots) {
  const KvView& kv = a.kv;
  const int64_t d = a.head_dim;
  const int64_t width = static_cast<int64_t>(a.heads) * d;
  // h indexes q and out (compact when head-sparse); the cache is indexed by the cache head.
  const int64_t base = (a.head_ids != nullptr ? a.head_ids[h] : h) * kv.capacity;
  const float* q = a.q.as<float>() + t * width + h * d;
  float* out = a.out.as<float>() + t * width + h * d;
  const int32_t q_pos = a.q_pos[t];

  int64_t count = 0;
  for (int64_t s = 0; s < kv.used; ++s) {
    const int32_t pos = kv.slot_pos[base + s];
    if (pos < 0 || pos > q_pos) continue;
    slots[count++] = static_cast<int32_t>(s);
  }
  if (count == 0) {
    std::memset(out, 0, static_cast<size_t>(d) * sizeof(float));
    return;
  }
  const size_t es = DTypeSize(kv.dtype);
  const char* k_head = static_cast<const char*>(kv.k) + base * d * es;
  const char* v_head = static_cast<const char*>(kv.v) + base * d * es;
  DotRows(q, k_head, kv.dtype, slots.data(), count, d, a.scale, probs.data());
  const float max_score = MaxOf(probs.data(), count);
  const float inv_sum = 1.f / ExpShiftInPlace(probs.data(), count, max_score);
  for (int64_t j = 0; j < count; ++j) probs[j] *= inv_sum;
  WeightedSumRows(probs.data(), v_head, kv.dtype, slots.data(), count, d, out);
  if (kv.score != nullptr) {
    for (int64_t j = 0; j < count; ++j) kv.score[base + slots[j]] += probs[j];
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
  if (a.kv.score != nullptr) {
    backend.pool()->ParallelFor(
        heads,
        [&](int64_t h0, int64_t h1) {
          run([&](std::vector<float>& probs, std::vector<int32_t>& slots) {
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t t = 0; t < tokens; ++t) AttendOne(a, t, h, probs, slots);
          });
        },
        std::max<int64_t>(1, min_items / std::max<int64_t>(1, tokens)));
  } else {
    backend.pool()->ParallelFor(
        tokens * heads,
        [&](int64_t i0, int64_t i1) {
          run([&](std::vector<float>& probs, std::vector<int32_t>& slots) {
            for (int64_t i = i0; i < i1; ++i) AttendOne(a, i / heads, i % heads, probs, slots);
          });
        },
        min_items);
  }
  return Status::Ok();
}

}  // namespace deja::kernels::cpu
