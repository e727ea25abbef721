// Attention over paged KV caches (a randomly permuted block table into a pool with garbage around
// the cache) of every backend that reads them, against the reference on the same cache laid out
// contiguously; and a long context (70,000 slots) on every backend, contiguous and paged. Decode
// (one query token, the slots split on CUDA) and prefill with causality (the first token sees no
// slot, later ones more), f32 and f16 caches, H2O scores, head-sparse head_ids, head sizes that
// take every CUDA load path. Fresh random inputs per run (the seed is printed).
//
// Tolerance: 1e-5 relative (kernel_test_util.h Close) for f32 and f16 caches alike, on outputs and
// scores: the reference widens the same f16 values exactly, so only the summation order differs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/paged_kv_util.h"

namespace deja::kernels {
namespace {

using testing::AllBackends;
using testing::BackendTest;
using testing::Close;
using testing::CopyOf;
using testing::KvToBackend;
using testing::PagedLayout;
using testing::RandomPagedLayout;
using testing::KvDTypes;
using testing::RandomKvRows;
using testing::RandomTensor;
using testing::Runs;
using testing::Scatter;
using testing::ViewOf;

uint32_t BaseSeed() { return testing::BaseSeed("compare_paged_attention_test"); }

struct PagedAttentionCase {
  int32_t heads, head_dim, capacity, used, tokens;
  int32_t cache_heads;  // > heads: head-sparse, head_ids a random subset; 0: dense
  bool score;
  std::string Label() const {
    return "heads=" + std::to_string(heads) + " head_dim=" + std::to_string(head_dim) +
           " capacity=" + std::to_string(capacity) + " used=" + std::to_string(used) +
           " tokens=" + std::to_string(tokens) +
           (cache_heads > 0 ? " cache_heads=" + std::to_string(cache_heads) : "") +
           (score ? " score" : "");
  }
};

// block_slots 0: contiguous. positive_values: values in [0, 1) rather than [-1, 1), so that the
// output of a very long context does not shrink towards zero (with zero-mean values it falls as
// 1 / sqrt(slots) while the rounding error does not, and a relative bound would measure noise).
// Returns a skip reason where the backend refused a paged view (having checked it did by name).
std::string CheckPagedAttention(Backend& b, const PagedAttentionCase& c, DType kv_dtype,
                                int32_t block_slots, uint32_t seed, bool positive_values = false) {
  SCOPED_TRACE(c.Label() + " kv " + DTypeName(kv_dtype) +
               " block_slots=" + std::to_string(block_slots));
  std::mt19937 rng(seed);
  const int32_t cache_heads = c.cache_heads > 0 ? c.cache_heads : c.heads;
  const int64_t width = static_cast<int64_t>(c.heads) * c.head_dim;
  const int64_t cache = static_cast<int64_t>(cache_heads) * c.capacity;
  Tensor q = RandomTensor(rng, DType::kF32, {c.tokens, width}, -2.f, 2.f);
  Tensor k = RandomKvRows(rng, kv_dtype, cache, c.head_dim, -2.f, 2.f);
  Tensor v = RandomKvRows(rng, kv_dtype, cache, c.head_dim, positive_values ? 0.f : -1.f, 1.f);
  Tensor score0 = c.score ? RandomTensor(rng, DType::kF32, {cache}, 0.f, 3.f) : Tensor();
  // Positions 1..used in shuffled slots, a fifth of them holes; slots past `used` hold position
  // 0, which every query would see if they were read.
  Tensor slot_pos = Tensor::Empty(DType::kI32, {cache});
  std::vector<int32_t> pos(c.used);
  for (int32_t h = 0; h < cache_heads; ++h) {
    std::iota(pos.begin(), pos.end(), 1);
    std::shuffle(pos.begin(), pos.end(), rng);
    int32_t* p = slot_pos.as<int32_t>() + static_cast<int64_t>(h) * c.capacity;
    for (int32_t s = 0; s < c.used; ++s) p[s] = rng() % 5 == 0 ? -1 : pos[s];
    for (int32_t s = c.used; s < c.capacity; ++s) p[s] = 0;
  }
  // Decode: one token seeing every slot. Prefill: the last tokens - 1 positions are the new
  // tokens', each seeing the slots up to its own; token 0 at position 0 sees none (a zero row).
  std::vector<int32_t> q_pos(c.tokens);
  for (int32_t t = 0; t < c.tokens; ++t) {
    q_pos[t] = c.tokens == 1 ? c.used : (t == 0 ? 0 : std::max(0, c.used - c.tokens + 1 + t));
  }
  std::vector<int32_t> head_ids;
  if (c.cache_heads > 0) head_ids = testing::RandomHeadIds(rng, cache_heads, c.heads);
  Tensor garbage = RandomTensor(rng, DType::kF32, {c.tokens, width}, 50.f, 60.f);

  auto args = [&](const Tensor& qt, const KvView& kv, const Tensor& out) {
    AttentionArgs a;
    a.q = qt.view();
    a.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    a.q_pos = q_pos.data();
    a.kv = kv;
    a.heads = c.heads;
    a.head_dim = c.head_dim;
    a.out = out.view();
    if (c.cache_heads > 0) {
      a.head_ids = head_ids.data();
      a.cache_heads = c.cache_heads;
    }
    return a;
  };
  PagedLayout layout;
  if (block_slots > 0) layout = RandomPagedLayout(rng, cache_heads, c.capacity, block_slots);
  const PagedLayout* paged = block_slots > 0 ? &layout : nullptr;
  Tensor pools[4];
  auto d = KvToBackend(b, rng, paged, k, v, slot_pos, score0, pools);
  auto d_q = b.ToBackend(q);
  auto d_out = b.ToBackend(garbage);  // every element must be written, zero rows included
  EXPECT_TRUE(d.ok() && d_q.ok() && d_out.ok());
  if (!d.ok() || !d_q.ok() || !d_out.ok()) return "";
  const KvView kv = ViewOf(*d, c.capacity, c.used, kv_dtype, c.head_dim, paged);
  Status s = Attention(b, args(*d_q, kv, *d_out));
  if (paged != nullptr && !b.SupportsPagedKv()) {
    EXPECT_NE(s.message().find("'kv.blocks'"), std::string::npos) << s.ToString();
    return b.name() + " reads contiguous KV caches only";
  }
  EXPECT_TRUE(s.ok()) << s.ToString();
  auto ref = MakeReferenceBackend();
  Tensor want = Tensor::Zeros(DType::kF32, {c.tokens, width});
  Tensor want_score = c.score ? CopyOf(score0) : Tensor();
  KvView host{k.data(),   v.data(), slot_pos.as<int32_t>(),
              c.capacity, c.used,   c.score ? want_score.as<float>() : nullptr,
              kv_dtype};
  Status rs = Attention(*ref, args(q, host, want));
  EXPECT_TRUE(rs.ok()) << rs.ToString();
  auto got = b.ToHost(d_out->view());
  EXPECT_TRUE(got.ok());
  if (got.ok()) {
    EXPECT_TRUE(Close(got->as<float>(), want.as<float>(), want.numel()));
  }
  if (c.score) {
    // The whole score buffer: the pool's garbage around the cache must be untouched.
    auto got_score = b.ToHost(d->score.view());
    EXPECT_TRUE(got_score.ok());
    if (got_score.ok()) {
      const Tensor expected =
          paged != nullptr ? Scatter(layout, want_score, pools[3]) : CopyOf(want_score);
      EXPECT_TRUE(Close(got_score->as<float>(), expected.as<float>(), expected.numel()))
          << "scores";
    }
  }
  return "";
}

// Head sizes: 1, 3, 17 and 333 (one element per load), 64, 80, 128 and 256 (16-byte loads of f32
// and f16; 80 f16 rows are 160 bytes), 600 and 1024 (several loads per lane). Decode cases with
// 500+ slots and few heads split the slots on CUDA; prefill ones do not.
const PagedAttentionCase kCases[] = {
    {1, 1, 1, 1, 1, 0, true},         {2, 3, 5, 5, 1, 0, true},
    {4, 64, 40, 33, 1, 0, true},      {4, 64, 1600, 1500, 1, 0, true},
    {2, 128, 2100, 2050, 1, 6, true}, {3, 17, 20, 13, 5, 0, true},
    {2, 80, 300, 260, 40, 0, true},   {8, 64, 256, 200, 16, 12, false},
    {2, 256, 600, 520, 3, 0, true},   {3, 64, 300, 260, 96, 0, true},
    {1, 1024, 70, 64, 2, 0, true},    {2, 600, 40, 30, 2, 0, false},
    {1, 333, 50, 45, 2, 0, true},     {2, 64, 64, 0, 2, 0, true},
    {4, 128, 900, 777, 1, 0, false},
};

// Odd, power-of-two and large blocks.
const int32_t kBlockSlots[] = {16, 7, 64};

class ComparePagedAttention : public BackendTest {};

TEST_P(ComparePagedAttention, Grid) {
  uint32_t seed = BaseSeed() + 8000;
  int i = 0;
  for (DType dt : KvDTypes()) {
    if (!Runs(backend(), OpId::kAttention, dt)) continue;
    for (const auto& c : kCases) {
      const std::string skipped =
          CheckPagedAttention(backend(), c, dt, kBlockSlots[i++ % 3], seed++);
      if (!skipped.empty()) GTEST_SKIP() << skipped;
    }
  }
}

// 70,000 slots: beyond what a kernel keeping one value per slot in shared memory can hold (about
// 40k on an A100). Decode, and a head-sparse prefill of three tokens.
void CheckLongContext(Backend& b, int32_t block_slots, uint32_t seed) {
  const PagedAttentionCase cases[] = {{2, 64, 70003, 70000, 1, 0, true},
                                      {2, 64, 70003, 70000, 3, 3, true}};
  for (DType dt : KvDTypes()) {
    if (!Runs(b, OpId::kAttention, dt)) continue;
    for (const auto& c : cases) {
      const std::string skipped =
          CheckPagedAttention(b, c, dt, block_slots, seed++, /*positive_values=*/true);
      if (!skipped.empty()) GTEST_SKIP() << skipped;
    }
  }
}

TEST_P(ComparePagedAttention, LongContext) { CheckLongContext(backend(), 0, BaseSeed() + 8500); }

TEST_P(ComparePagedAttention, LongContextPaged) {
  CheckLongContext(backend(), 256, BaseSeed() + 8600);
}

// The reference too: its paged path against its own contiguous one.
DEJA_INSTANTIATE_BACKEND_TEST(ComparePagedAttention, AllBackends());

}  // namespace
}  // namespace deja::kernels
