// KvWrite (with and without given scores), KvEvict, Convert and MaskUnits of every backend under
// test against the reference, on fresh seeded random inputs: caches full of garbage (every byte an
// op must not write is compared too), contiguous and, on backends that read them, paged through a
// permuted block table (the reference itself is checked there against its own contiguous answer).
// All four ops are exact: each output is compared bit for bit (NaNs only by being NaN where the
// host's and the device's conversions may encode them differently).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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
using testing::ComparedBackends;
using testing::CopyOf;
using testing::KvOnBackend;
using testing::KvToBackend;
using testing::PagedLayout;
using testing::RandomPagedLayout;
using testing::KvDTypes;
using testing::RandomKvRows;
using testing::RandomTensor;
using testing::Runs;
using testing::Scatter;
using testing::Unsupported;
using testing::ViewOf;

// Identical bytes, or the first differing element (of `elem` bytes) named.
::testing::AssertionResult SameBytes(const Tensor& got, const Tensor& want, const char* what) {
  if (got.bytes() != want.bytes()) {
    return ::testing::AssertionFailure()
           << what << ": " << got.bytes() << " bytes, want " << want.bytes();
  }
  if (std::memcmp(got.data(), want.data(), got.bytes()) == 0) {
    return ::testing::AssertionSuccess();
  }
  const size_t elem = DTypeSize(got.dtype());
  for (size_t i = 0; i < got.bytes(); i += elem) {
    if (std::memcmp(static_cast<const char*>(got.data()) + i,
                    static_cast<const char*>(want.data()) + i, elem) != 0) {
      return ::testing::AssertionFailure()
             << what << " differs at element " << i / elem << ": got "
             << LoadAsFloat(got.data(), got.dtype(), i / elem) << ", want "
             << LoadAsFloat(want.data(), want.dtype(), i / elem);
    }
  }
  return ::testing::AssertionFailure() << what << " differs";
}

// A paged case on a backend that reads contiguous caches only: the op must refuse the view by
// name. Returns the skip reason ("" when the backend reads paged views).
std::string PagedRefusal(Backend& b, const Status& s) {
  if (b.SupportsPagedKv()) return "";
  EXPECT_NE(s.message().find("'kv.blocks'"), std::string::npos) << s.ToString();
  return b.name() + " reads contiguous KV caches only";
}

uint32_t BaseSeed() { return testing::BaseSeed("compare_kv_test"); }

// block_slots 0: contiguous. Paged cases alternate odd and power-of-two block sizes.
const int32_t kBlockSlots[] = {0, 16, 7};

// ---- KvWrite ----

struct KvWriteCase {
  int32_t heads, head_dim, capacity, used, n;
  bool score;
  std::string Label() const {
    return "heads=" + std::to_string(heads) + " head_dim=" + std::to_string(head_dim) +
           " capacity=" + std::to_string(capacity) + " used=" + std::to_string(used) +
           " n=" + std::to_string(n) + (score ? " score" : "");
  }
};

// Returns a skip reason when the backend refused a paged view (after checking it did so by name).
std::string CheckKvWrite(Backend& b, const KvWriteCase& c, DType dtype, int32_t block_slots,
                         uint32_t seed) {
  SCOPED_TRACE(c.Label() + " " + DTypeName(dtype) + " block_slots=" + std::to_string(block_slots));
  std::mt19937 rng(seed);
  const int64_t cache = static_cast<int64_t>(c.heads) * c.capacity;
  const int64_t width = static_cast<int64_t>(c.heads) * c.head_dim;
  // The old contents: garbage keys and values, positions and scores.
  Tensor k0 = RandomKvRows(rng, dtype, cache, c.head_dim, 40.f, 50.f);
  Tensor v0 = RandomKvRows(rng, dtype, cache, c.head_dim, 40.f, 50.f);
  Tensor pos0 = Tensor::Empty(DType::kI32, {cache});
  for (int64_t i = 0; i < cache; ++i) pos0.as<int32_t>()[i] = static_cast<int32_t>(rng() % 50) - 1;
  Tensor score0 = c.score ? RandomTensor(rng, DType::kF32, {cache}, 0.f, 3.f) : Tensor();
  Tensor k = RandomTensor(rng, DType::kF32, {c.n, width}, -2.f, 2.f);
  Tensor v = RandomTensor(rng, DType::kF32, {c.n, width}, -2.f, 2.f);
  // Cases with scores alternate between given scores (locret) and none (zeros).
  const bool given = c.score && (seed % 2 == 0);
  Tensor scores = given ? RandomTensor(rng, DType::kF32, {c.n, c.heads}, -5.f, 5.f) : Tensor();
  // Each head writes n distinct slots of [0, used); the tokens have distinct positions.
  std::vector<int32_t> slots(static_cast<size_t>(c.heads) * c.n);
  std::vector<int32_t> order(c.used);
  for (int32_t h = 0; h < c.heads; ++h) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::copy_n(order.begin(), c.n, slots.begin() + static_cast<int64_t>(h) * c.n);
  }
  std::vector<int32_t> positions(c.n);
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(rng() % 1000));
  std::shuffle(positions.begin(), positions.end(), rng);

  auto ref = MakeReferenceBackend();
  Tensor want_k = CopyOf(k0), want_v = CopyOf(v0), want_pos = CopyOf(pos0);
  Tensor want_score = c.score ? CopyOf(score0) : Tensor();
  KvView host{want_k.data(), want_v.data(), want_pos.as<int32_t>(),
              c.capacity,    c.used,        c.score ? want_score.as<float>() : nullptr,
              dtype};
  EXPECT_TRUE(KvWrite(*ref, host, c.heads, c.head_dim, slots.data(), positions.data(), c.n,
                      k.view(), v.view(), given ? scores.as<float>() : nullptr)
                  .ok());

  PagedLayout layout;
  if (block_slots > 0) layout = RandomPagedLayout(rng, c.heads, c.capacity, block_slots);
  const PagedLayout* paged = block_slots > 0 ? &layout : nullptr;
  Tensor pools[4];
  auto d = KvToBackend(b, rng, paged, k0, v0, pos0, score0, pools);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return "";
  auto d_k = b.ToBackend(k);
  auto d_v = b.ToBackend(v);
  EXPECT_TRUE(d_k.ok() && d_v.ok());
  if (!d_k.ok() || !d_v.ok()) return "";
  StatusOr<Tensor> d_scores = given ? b.ToBackend(scores) : StatusOr<Tensor>(Tensor());
  EXPECT_TRUE(d_scores.ok());
  if (!d_scores.ok()) return "";
  const KvView kv = ViewOf(*d, c.capacity, c.used, dtype, c.head_dim, paged);
  Status s = KvWrite(b, kv, c.heads, c.head_dim, slots.data(), positions.data(), c.n, d_k->view(),
                     d_v->view(), given ? d_scores->as<float>() : nullptr);
  if (paged != nullptr) {
    std::string why = PagedRefusal(b, s);
    if (!why.empty()) return why;
  }
  EXPECT_TRUE(s.ok()) << s.ToString();
  // The whole of each buffer: the written slots, and everything else unchanged.
  const Tensor* want[4] = {&want_k, &want_v, &want_pos, &want_score};
  const Tensor* got_dev[4] = {&d->k, &d->v, &d->slot_pos, &d->score};
  const char* names[4] = {"k", "v", "slot_pos", "score"};
  for (int i = 0; i < 4; ++i) {
    if (want[i]->data() == nullptr) continue;
    auto got = b.ToHost(got_dev[i]->view());
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (!got.ok()) continue;
    const Tensor expected =
        paged != nullptr ? Scatter(layout, *want[i], pools[i]) : CopyOf(*want[i]);
    EXPECT_TRUE(SameBytes(*got, expected, names[i]));
  }
  return "";
}

const KvWriteCase kKvWriteCases[] = {
    {1, 1, 1, 1, 1, true},        {2, 3, 5, 4, 2, false},       {4, 64, 40, 33, 1, true},
    {3, 17, 20, 13, 13, true},    {8, 64, 256, 200, 16, false}, {2, 128, 300, 300, 70, true},
    {5, 80, 1100, 1030, 3, true}, {2, 256, 70, 65, 1, false},
};

class CompareKvWrite : public BackendTest {};

TEST_P(CompareKvWrite, Contiguous) {
  uint32_t seed = BaseSeed() + 7000;
  for (DType dt : KvDTypes()) {
    for (const auto& c : kKvWriteCases) {
      if (!Runs(backend(), OpId::kKvWrite, dt)) continue;
      CheckKvWrite(backend(), c, dt, 0, seed++);
    }
  }
}

TEST_P(CompareKvWrite, Paged) {
  uint32_t seed = BaseSeed() + 7100;
  std::string skipped;
  for (DType dt : KvDTypes()) {
    for (size_t i = 0; i < std::size(kKvWriteCases); ++i) {
      if (!Runs(backend(), OpId::kKvWrite, dt)) continue;
      skipped = CheckKvWrite(backend(), kKvWriteCases[i], dt, kBlockSlots[1 + i % 2], seed++);
      if (!skipped.empty()) GTEST_SKIP() << skipped;
    }
  }
}

// The reference too: its paged path against its own contiguous one.
DEJA_INSTANTIATE_BACKEND_TEST(CompareKvWrite, AllBackends());

// ---- KvEvict ----

struct KvEvictCase {
  int32_t heads, capacity, used, excess;
  std::string Label() const {
    return "heads=" + std::to_string(heads) + " capacity=" + std::to_string(capacity) +
           " used=" + std::to_string(used) + " excess=" + std::to_string(excess);
  }
};

const char* RankName(KvRank r) {
  switch (r) {
    case KvRank::kScore:
      return "score";
    case KvRank::kMeanScore:
      return "mean_score";
    case KvRank::kPosition:
      return "position";
  }
  return "?";
}

// ties: scores from {0, 0.25, 0.5, 0.75} (many equal keys, ordered by position); else uniform.
// kPosition cases without ties run with no score buffer at all.
std::string CheckKvEvict(Backend& b, const KvEvictCase& c, KvRank rank, bool ties,
                         int32_t block_slots, uint32_t seed, float decay = 1.f) {
  SCOPED_TRACE(c.Label() + " rank=" + RankName(rank) + (ties ? " ties" : "") +
               " block_slots=" + std::to_string(block_slots) + " decay=" + std::to_string(decay));
  std::mt19937 rng(seed);
  const int64_t cache = static_cast<int64_t>(c.heads) * c.capacity;
  const bool with_score = rank != KvRank::kPosition || ties || decay != 1.f;
  // Per head: distinct positions in shuffled slots with holes; slots past `used` hold positions
  // that would be candidates if they were read.
  Tensor pos0 = Tensor::Empty(DType::kI32, {cache});
  std::vector<int32_t> order(c.used);
  for (int32_t h = 0; h < c.heads; ++h) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    int32_t* p = pos0.as<int32_t>() + static_cast<int64_t>(h) * c.capacity;
    for (int32_t s = 0; s < c.used; ++s) p[s] = rng() % 5 == 0 ? -1 : order[s];
    for (int32_t s = c.used; s < c.capacity; ++s) p[s] = 0;
  }
  Tensor score0 = with_score ? RandomTensor(rng, DType::kF32, {cache}, 0.f, 3.f) : Tensor();
  if (ties) {
    for (int64_t i = 0; i < cache; ++i) score0.as<float>()[i] = static_cast<float>(rng() % 4) / 4;
  }
  KvEvictArgs args;
  args.rank = rank;
  args.excess = c.excess;
  args.decay = decay;
  args.length = c.used + static_cast<int32_t>(rng() % 8);
  // Leave the most recent quarter (or so) out of the candidates; sometimes none.
  args.oldest_recent =
      c.used == 0 ? 0 : static_cast<int32_t>(rng() % (c.used + 1) / 4 + c.used / 2);
  // Victims are poisoned so a slot never written shows.
  Tensor victims0 =
      Tensor::Empty(DType::kI32, {std::max<int64_t>(1, static_cast<int64_t>(c.heads) * c.excess)});
  std::fill_n(victims0.as<int32_t>(), victims0.numel(), 0x7eadbeef);

  auto ref = MakeReferenceBackend();
  Tensor want_pos = CopyOf(pos0), want_victims = CopyOf(victims0);
  Tensor want_score = with_score ? CopyOf(score0) : Tensor();
  KvView host;
  host.k = host.v = want_pos.data();  // not read; must be non-null
  host.slot_pos = want_pos.as<int32_t>();
  host.capacity = c.capacity;
  host.used = c.used;
  host.score = with_score ? want_score.as<float>() : nullptr;
  // Excess 0 (a decay alone) passes no victim buffer, as a cache that never evicted has none.
  const bool no_victims = c.excess == 0;
  Status rs =
      KvEvict(*ref, host, c.heads, args, no_victims ? nullptr : want_victims.as<int32_t>());
  EXPECT_TRUE(rs.ok()) << rs.ToString();

  PagedLayout layout;
  if (block_slots > 0) layout = RandomPagedLayout(rng, c.heads, c.capacity, block_slots);
  const PagedLayout* paged = block_slots > 0 ? &layout : nullptr;
  Tensor pools[4];
  auto d = KvToBackend(b, rng, paged, Tensor(), Tensor(), pos0, score0, pools);
  auto d_victims = b.ToBackend(victims0);
  EXPECT_TRUE(d.ok() && d_victims.ok());
  if (!d.ok() || !d_victims.ok()) return "";
  KvView kv = ViewOf(*d, c.capacity, c.used, DType::kF32, 1, paged);
  kv.k = kv.v = const_cast<int32_t*>(kv.slot_pos);  // not read
  Status s = KvEvict(b, kv, c.heads, args, no_victims ? nullptr : d_victims->as<int32_t>());
  if (paged != nullptr) {
    std::string why = PagedRefusal(b, s);
    if (!why.empty()) return why;
  }
  EXPECT_TRUE(s.ok()) << s.ToString();
  auto got_victims = b.ToHost(d_victims->view());
  auto got_pos = b.ToHost(d->slot_pos.view());
  EXPECT_TRUE(got_victims.ok() && got_pos.ok());
  if (!got_victims.ok() || !got_pos.ok()) return "";
  EXPECT_TRUE(SameBytes(*got_victims, want_victims, "victims"));
  // Whole buffers: with a paged cache, the pool's garbage around it must be untouched.
  auto expected = [&](const Tensor& want, const Tensor& pool) {
    return paged != nullptr ? Scatter(layout, want, pool) : CopyOf(want);
  };
  EXPECT_TRUE(SameBytes(*got_pos, expected(want_pos, pools[2]), "slot_pos"));
  if (with_score) {
    auto got_score = b.ToHost(d->score.view());
    EXPECT_TRUE(got_score.ok());
    if (got_score.ok()) {
      EXPECT_TRUE(SameBytes(*got_score, expected(want_score, pools[3]), "score"));
    }
  }
  return "";
}

// Decode's excess of 1 and a prefill's many, more than the candidates, on caches of one slot to
// a few thousand (several of the CUDA kernel's 256-slot chunks and tiles), and none used.
const KvEvictCase kKvEvictCases[] = {
    {1, 1, 1, 1},     {1, 8, 5, 1},      {3, 40, 33, 1},     {3, 40, 33, 7},
    {4, 300, 257, 1}, {4, 300, 257, 64}, {2, 3000, 2900, 1}, {2, 3000, 2900, 500},
    {8, 64, 64, 100}, {2, 16, 0, 2},     {5, 700, 513, 256},
};

// Decayed scores (h2o's CachePolicy.score_decay): every occupied slot's score, recent ones
// included, is multiplied first; excess 0 only decays, with no victim buffer at all.
const KvEvictCase kKvDecayCases[] = {
    {3, 40, 33, 0}, {3, 40, 33, 1}, {4, 300, 257, 0}, {4, 300, 257, 64}, {2, 3000, 2900, 1},
};

class CompareKvEvict : public BackendTest {};

void RunKvEvictGrid(Backend& b, bool paged, uint32_t seed) {
  int i = 0;
  for (const auto& c : kKvEvictCases) {
    for (KvRank rank : {KvRank::kScore, KvRank::kMeanScore, KvRank::kPosition}) {
      for (bool ties : {false, true}) {
        const int32_t block_slots = paged ? kBlockSlots[1 + i++ % 2] : 0;
        std::string skipped = CheckKvEvict(b, c, rank, ties, block_slots, seed++);
        if (!skipped.empty()) GTEST_SKIP() << skipped;
      }
    }
  }
  for (const auto& c : kKvDecayCases) {
    for (KvRank rank : {KvRank::kScore, KvRank::kMeanScore}) {
      const int32_t block_slots = paged ? kBlockSlots[1 + i++ % 2] : 0;
      std::string skipped = CheckKvEvict(b, c, rank, false, block_slots, seed++, 0.625f);
      if (!skipped.empty()) GTEST_SKIP() << skipped;
    }
  }
}

TEST_P(CompareKvEvict, Contiguous) {
  if (!Runs(backend(), OpId::kKvEvict, DType::kF32)) return;
  RunKvEvictGrid(backend(), false, BaseSeed() + 7200);
}

TEST_P(CompareKvEvict, Paged) {
  if (!Runs(backend(), OpId::kKvEvict, DType::kF32)) return;
  RunKvEvictGrid(backend(), true, BaseSeed() + 7300);
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareKvEvict, AllBackends());

// ---- Convert ----

// A mix of magnitudes: ordinary values, f16's overflow and subnormal ranges, bf16's extremes,
// exact rounding ties of f16 and bf16, and (for f32 sources) zeros, infinities and NaNs.
float MixedValue(std::mt19937& rng, bool specials) {
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const float sign = rng() % 2 == 0 ? 1.f : -1.f;
  switch (rng() % (specials ? 8 : 7)) {
    case 0:
      return sign * unit(rng);
    case 1:
      return sign * (1e3f + unit(rng) * 1e5f);  // f16 overflows past 65520
    case 2:
      return sign * std::ldexp(1.f + unit(rng), static_cast<int>(rng() % 40) + 88);  // ~1e26..3e38
    case 3:
      return sign * std::ldexp(1.f + unit(rng), -static_cast<int>(rng() % 16) - 14);  // f16 tiny
    case 4:  // halfway between two f16 values
      return sign * std::ldexp(1.f + static_cast<float>(2 * (rng() % 1024) + 1) / 2048.f,
                               static_cast<int>(rng() % 20) - 10);
    case 5:  // halfway between two bf16 values
      return sign * std::ldexp(1.f + static_cast<float>(2 * (rng() % 128) + 1) / 256.f,
                               static_cast<int>(rng() % 60) - 30);
    case 6:
      return sign * unit(rng) * 7e4f;
    default: {
      const float special[] = {0.f, std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()};
      return sign * special[rng() % 3];
    }
  }
}

// Bit-exact, except that NaNs need only be NaNs where the two sides' conversions may encode them
// differently (f16 destinations, and widening f16/bf16 NaNs); f32 NaNs to bf16 or f32 keep the
// host's exact bits (common/dtype.h FloatToBF16).
::testing::AssertionResult SameConversion(const Tensor& got, const Tensor& want, DType src) {
  const DType dst = want.dtype();
  const size_t es = DTypeSize(dst);
  const bool nan_bits = src == DType::kF32 && dst != DType::kF16;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const float w = LoadAsFloat(want.data(), dst, i), g = LoadAsFloat(got.data(), dst, i);
    if (std::isnan(w) && !nan_bits) {
      if (!std::isnan(g))
        return ::testing::AssertionFailure() << "at " << i << ": got " << g << ", want NaN";
      continue;
    }
    if (std::memcmp(static_cast<const char*>(got.data()) + i * es,
                    static_cast<const char*>(want.data()) + i * es, es) != 0) {
      return ::testing::AssertionFailure() << "at " << i << ": got " << g << ", want " << w;
    }
  }
  return ::testing::AssertionSuccess();
}

class CompareConvert : public BackendTest {};

TEST_P(CompareConvert, AllPairs) {
  Backend& b = backend();
  uint32_t seed = BaseSeed() + 7400;
  auto ref = MakeReferenceBackend();
  const Shape shapes[] = {{1}, {5}, {3, 333}, {100003}};
  for (DType from : testing::WeightDTypes()) {
    for (DType to : testing::WeightDTypes()) {
      for (const Shape& shape : shapes) {
        SCOPED_TRACE(std::string(DTypeName(from)) + " -> " + DTypeName(to) + " " +
                     shape.ToString());
        std::mt19937 rng(seed++);
        Tensor src = Tensor::Empty(from, shape);
        for (int64_t i = 0; i < src.numel(); ++i) {
          StoreFromFloat(src.data(), from, i, MixedValue(rng, from == DType::kF32));
        }
        // Poisoned: random bits everywhere.
        Tensor dst0 = Tensor::Empty(to, shape);
        for (size_t i = 0; i < dst0.bytes(); ++i) {
          static_cast<unsigned char*>(dst0.data())[i] = static_cast<unsigned char>(rng());
        }
        if (!Runs(b, OpId::kConvert, to)) continue;
        Tensor want = CopyOf(dst0);
        DEJA_ASSERT_OK(Convert(*ref, src.view(), want.view()));
        DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_src, b.ToBackend(src));
        DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_dst, b.ToBackend(dst0));
        DEJA_ASSERT_OK(Convert(b, d_src.view(), d_dst.view()));
        DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_dst.view()));
        EXPECT_TRUE(SameConversion(got, want, from));
      }
    }
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareConvert, ComparedBackends());

// ---- MaskUnits ----

// Random masks (each unit kept with probability 0.3, 0.5 or 0.9) over random activations, unit
// widths 1 (neurons) and 64 / 80 (heads): kept columns keep their bits, the others become +0.
class CompareMaskUnits : public BackendTest {};

TEST_P(CompareMaskUnits, RandomMasks) {
  Backend& b = backend();
  uint32_t seed = BaseSeed() + 7500;
  auto ref = MakeReferenceBackend();
  struct Case {
    int64_t rows, units;
    int32_t width;
    double keep;
  };
  for (const Case& c : {Case{1, 4096, 1, 0.3}, Case{7, 3000, 1, 0.9}, Case{1, 32, 64, 0.5},
                        Case{5, 12, 80, 0.3}, Case{16, 40, 128, 0.9}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " units " + std::to_string(c.units) +
                 " width " + std::to_string(c.width));
    if (!Runs(b, OpId::kMaskUnits, DType::kF32)) return;
    std::mt19937 rng(seed++);
    Tensor x = RandomTensor(rng, DType::kF32, {c.rows, c.units * c.width});
    std::bernoulli_distribution kept(c.keep);
    std::vector<uint8_t> keep(static_cast<size_t>(c.rows * c.units));
    for (uint8_t& k : keep) k = kept(rng) ? 1 : 0;
    Tensor want = CopyOf(x);
    DEJA_ASSERT_OK(MaskUnits(*ref, want.view(), keep.data(), c.width));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
    DEJA_ASSERT_OK(MaskUnits(b, d_x.view(), keep.data(), c.width));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_x.view()));
    EXPECT_TRUE(SameBytes(got, want, "x"));
    // The reference itself: zeros exactly where the mask says, the input elsewhere.
    const float* w = want.as<float>();
    const float* in = x.as<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t r = i / (c.units * c.width), u = (i % (c.units * c.width)) / c.width;
      ASSERT_EQ(w[i], keep[r * c.units + u] ? in[i] : 0.0f) << i;
    }
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareMaskUnits, ComparedBackends());

}  // namespace
}  // namespace deja::kernels
