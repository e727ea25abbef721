// Attention with AttentionArgs::per_query: a call with many query tokens gives each (token, head)
// exactly the bits of the same query attended alone (a one-token call), H2O scores included, so a
// token's attention does not depend on the queries beside it (the batch invariance that quantized
// models rely on). On every backend, f32, f16 and int8 caches, contiguous and paged, slots in
// position order (a prefill) and shuffled with holes (after evictions and window reuse), with
// Deja Vu keep masks and head_ids, over token counts on both sides of the CPU's query blocks;
// the CPU's multi-query kernels under every SIMD target this CPU runs. Also against the
// reference (1e-5 relative, kernel_test_util.h Close). Fresh random inputs (the seed is printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/paged_kv_util.h"

namespace deja::kernels {
namespace {

using testing::AllBackends;
using testing::BackendTest;
using testing::Close;
using testing::CopyOf;
using testing::CpuBackends;
using testing::KvDTypes;
using testing::KvToBackend;
using testing::PagedLayout;
using testing::RandomKvRows;
using testing::RandomPagedLayout;
using testing::RandomTensor;
using testing::Runs;
using testing::ViewOf;

uint32_t BaseSeed() { return testing::BaseSeed("attention_per_query_test"); }

struct PerQueryCase {
  int32_t heads, head_dim, capacity, used, tokens;
  int32_t cache_heads;  // > heads: head-sparse (head_ids a random subset); 0: dense
  bool score, shuffled, keep;
  std::string Label() const {
    return "heads=" + std::to_string(heads) + " head_dim=" + std::to_string(head_dim) +
           " used=" + std::to_string(used) + " tokens=" + std::to_string(tokens) +
           (cache_heads > 0 ? " cache_heads=" + std::to_string(cache_heads) : "") +
           (score ? " score" : "") + (shuffled ? " shuffled" : " in order") +
           (keep ? " keep" : "");
  }
};

// True when the two float arrays hold the same bits.
bool SameBits(const float* a, const float* b, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) {
      ADD_FAILURE() << what << " differ at " << i << ": " << a[i] << " vs " << b[i];
      return false;
    }
  }
  return true;
}

// Returns a skip reason where the backend refused the paged view.
std::string CheckPerQuery(Backend& b, const PerQueryCase& c, DType kv_dtype, int32_t block_slots,
                          uint32_t seed) {
  SCOPED_TRACE(c.Label() + " kv " + DTypeName(kv_dtype) +
               " block_slots=" + std::to_string(block_slots) + " seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int32_t cache_heads = c.cache_heads > 0 ? c.cache_heads : c.heads;
  const int64_t width = static_cast<int64_t>(c.heads) * c.head_dim;
  const int64_t cache = static_cast<int64_t>(cache_heads) * c.capacity;
  Tensor q = RandomTensor(rng, DType::kF32, {c.tokens, width}, -2.f, 2.f);
  Tensor k = RandomKvRows(rng, kv_dtype, cache, c.head_dim, -2.f, 2.f);
  Tensor v = RandomKvRows(rng, kv_dtype, cache, c.head_dim, -1.f, 1.f);
  Tensor score0 = c.score ? RandomTensor(rng, DType::kF32, {cache}, 0.f, 3.f) : Tensor();
  // The cache holds positions [0, used - tokens) and the call's own tokens after them (a prefill
  // chunk), in slot order or shuffled with a fifth of the slots holes; slots past `used` hold
  // position 0, which every query would see if they were read.
  Tensor slot_pos = Tensor::Empty(DType::kI32, {cache});
  std::vector<int32_t> pos(c.used);
  for (int32_t h = 0; h < cache_heads; ++h) {
    std::iota(pos.begin(), pos.end(), 0);
    if (c.shuffled) std::shuffle(pos.begin(), pos.end(), rng);
    int32_t* p = slot_pos.as<int32_t>() + static_cast<int64_t>(h) * c.capacity;
    for (int32_t s = 0; s < c.used; ++s) p[s] = c.shuffled && rng() % 5 == 0 ? -1 : pos[s];
    for (int32_t s = c.used; s < c.capacity; ++s) p[s] = 0;
  }
  std::vector<int32_t> q_pos(c.tokens);
  for (int32_t t = 0; t < c.tokens; ++t) q_pos[t] = std::max(0, c.used - c.tokens) + t;
  // Shuffled caches also get queries out of order (a block's latest query is not its last).
  if (c.shuffled) std::shuffle(q_pos.begin(), q_pos.end(), rng);
  std::vector<int32_t> head_ids;
  if (c.cache_heads > 0) head_ids = testing::RandomHeadIds(rng, cache_heads, c.heads);
  std::vector<uint8_t> keep;
  if (c.keep) {
    keep.resize(static_cast<size_t>(c.tokens) * c.heads);
    for (auto& x : keep) x = rng() % 3 != 0;
  }
  PagedLayout layout;
  if (block_slots > 0) layout = RandomPagedLayout(rng, cache_heads, c.capacity, block_slots);
  const PagedLayout* paged = block_slots > 0 ? &layout : nullptr;

  // The whole call, then the same cache (fresh copies) one token at a time.
  Tensor garbage = RandomTensor(rng, DType::kF32, {c.tokens, width}, 50.f, 60.f);
  std::mt19937 pool_rng(seed + 1), pool_rng_again(seed + 1);
  auto whole = KvToBackend(b, pool_rng, paged, k, v, slot_pos, score0);
  auto alone = KvToBackend(b, pool_rng_again, paged, k, v, slot_pos, score0);
  auto d_q = b.ToBackend(q);
  auto d_out = b.ToBackend(garbage);
  EXPECT_TRUE(whole.ok() && alone.ok() && d_q.ok() && d_out.ok());
  if (!whole.ok() || !alone.ok() || !d_q.ok() || !d_out.ok()) return "";
  auto args = [&](const KvView& kv, TensorView qv, TensorView out, const int32_t* qp,
                  const uint8_t* kp) {
    AttentionArgs a;
    a.q = qv;
    a.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    a.q_pos = qp;
    a.kv = kv;
    a.heads = c.heads;
    a.head_dim = c.head_dim;
    a.out = out;
    a.per_query = true;
    a.keep = kp;
    if (c.cache_heads > 0) {
      a.head_ids = head_ids.data();
      a.cache_heads = c.cache_heads;
    }
    return a;
  };
  const KvView kv_whole = ViewOf(*whole, c.capacity, c.used, kv_dtype, c.head_dim, paged);
  Status s = Attention(b, args(kv_whole, d_q->view(), d_out->view(), q_pos.data(),
                               c.keep ? keep.data() : nullptr));
  if (paged != nullptr && !b.SupportsPagedKv()) return b.name() + " reads contiguous KV caches only";
  EXPECT_TRUE(s.ok()) << s.ToString();

  const KvView kv_alone = ViewOf(*alone, c.capacity, c.used, kv_dtype, c.head_dim, paged);
  auto d_one = b.ToBackend(garbage);
  EXPECT_TRUE(d_one.ok());
  if (!d_one.ok()) return "";
  for (int32_t t = 0; t < c.tokens; ++t) {
    Status st = Attention(b, args(kv_alone, d_q->view().RowSlice(t, t + 1),
                                  d_one->view().RowSlice(t, t + 1),
                                  &q_pos[t], c.keep ? keep.data() + t * c.heads : nullptr));
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  auto got = b.ToHost(d_out->view());
  auto want = b.ToHost(d_one->view());
  EXPECT_TRUE(got.ok() && want.ok());
  if (!got.ok() || !want.ok()) return "";
  SameBits(got->as<float>(), want->as<float>(), got->numel(), "outputs");
  if (c.score) {
    auto got_score = b.ToHost(whole->score.view());
    auto want_score = b.ToHost(alone->score.view());
    EXPECT_TRUE(got_score.ok() && want_score.ok());
    if (got_score.ok() && want_score.ok()) {
      SameBits(got_score->as<float>(), want_score->as<float>(), got_score->numel(), "scores");
    }
  }

  // And the answer itself, against the reference on the contiguous cache.
  auto ref = MakeReferenceBackend();
  Tensor ref_out = Tensor::Zeros(DType::kF32, {c.tokens, width});
  Tensor ref_score = c.score ? CopyOf(score0) : Tensor();
  KvView host{k.data(),   v.data(), slot_pos.as<int32_t>(),
              c.capacity, c.used,   c.score ? ref_score.as<float>() : nullptr,
              kv_dtype};
  Status rs = Attention(*ref, args(host, q.view(), ref_out.view(), q_pos.data(),
                                   c.keep ? keep.data() : nullptr));
  EXPECT_TRUE(rs.ok()) << rs.ToString();
  EXPECT_TRUE(Close(got->as<float>(), ref_out.as<float>(), ref_out.numel()));
  return "";
}

// Token counts below, at and across the CPU's 32-query blocks; head sizes with and without the
// 16-lane reduction (17, 40, 72 take the per-query fallback on AVX-512), 80 and 128 with other
// register groupings, 256 with two chunks of 128.
const PerQueryCase kCases[] = {
    {2, 64, 40, 33, 2, 0, false, false, false},  {4, 64, 120, 100, 70, 0, true, false, false},
    {3, 64, 200, 150, 33, 0, true, true, true},  {2, 128, 90, 80, 64, 0, false, true, false},
    {2, 80, 70, 65, 40, 0, true, false, true},   {2, 17, 50, 45, 9, 0, true, true, false},
    {2, 72, 60, 50, 31, 0, false, false, true},  {1, 256, 50, 40, 12, 0, true, false, false},
    {3, 64, 100, 90, 50, 6, true, true, true},   {2, 40, 30, 30, 30, 0, true, true, false},
    {2, 64, 64, 20, 20, 0, true, false, false},  {2, 32, 300, 280, 100, 0, false, true, true},
};

class AttentionPerQuery : public BackendTest {};

TEST_P(AttentionPerQuery, EqualsOneQueryAtATime) {
  uint32_t seed = BaseSeed();
  int i = 0;
  const int32_t block_slots[] = {0, 16, 7};
  for (DType dt : KvDTypes()) {
    if (!Runs(backend(), OpId::kAttention, dt)) continue;
    for (const auto& c : kCases) {
      const std::string skipped = CheckPerQuery(backend(), c, dt, block_slots[i++ % 3], seed++);
      if (!skipped.empty()) GTEST_SKIP() << skipped;
    }
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(AttentionPerQuery, AllBackends());

TEST(CpuSimdTargets, AttentionPerQuery) {
  // The multi-query kernels (kernels/cpu/simd.h) have an AVX-512 path and a generic one: each
  // compiled target this CPU runs.
  uint32_t seed = BaseSeed() + 500;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (DType dt : KvDTypes()) {
      for (const auto& c : kCases) CheckPerQuery(*CpuBackends()[0].backend, c, dt, 16, seed++);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace deja::kernels
