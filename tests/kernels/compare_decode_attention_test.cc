// DecodeAttention (a decode step of many sequences over one layer of a paged pool, metadata in
// device memory) on every backend, against each sequence's KvWrite and one-token Attention on the
// reference through the public ops: the outputs and the whole pool afterwards (keys, values,
// positions and scores, the garbage around the sequences' blocks untouched). Sequences of mixed
// lengths in one call (a few slots next to 2,000: CUDA splits the long ones' slots and gives the
// short ones empty splits), with holes, f32 and f16 pools, strided q/k/v rows as the stacked
// projection leaves them, and every flag: no scores, scores kept (zeroed on write), scores kept
// and accumulated (H2O). Fresh random inputs per run (the seed is printed).
//
// Tolerance: 1e-5 relative (kernel_test_util.h Close) on outputs and scores, as for Attention;
// keys, values and positions are written exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels {
namespace {

using testing::AllBackends;
using testing::BackendTest;
using testing::Close;
using testing::CopyOf;
using testing::KvDTypes;
using testing::RandomKvRows;
using testing::RandomTensor;
using testing::Runs;

uint32_t BaseSeed() { return testing::BaseSeed("compare_decode_attention_test"); }

struct DecodeCase {
  int32_t heads, head_dim, block_slots;
  std::vector<int32_t> used;  // per sequence: its slots [0, used)
  int32_t stride_extra;       // q/k/v rows this many floats longer than heads * head_dim
  std::string Label() const {
    std::string s = "heads=" + std::to_string(heads) + " head_dim=" + std::to_string(head_dim) +
                    " block_slots=" + std::to_string(block_slots) + " used=";
    for (int32_t u : used) s += std::to_string(u) + ",";
    return s + " stride_extra=" + std::to_string(stride_extra);
  }
};

// One pool layer and a step over it, on the host.
struct Step {
  int32_t seqs = 0, max_blocks = 0, max_used = 0;
  int64_t block_stride = 0, pool_slots = 0;
  Tensor k, v, slot_pos, score;               // the pool
  Tensor q, nk, nv;                           // [seqs, stride]
  std::vector<int32_t> q_pos, used, flags;    // [seqs]
  std::vector<int32_t> slots;                 // [seqs, heads]
  std::vector<int32_t> blocks;                // [seqs, max_blocks]
};

Step MakeStep(std::mt19937& rng, const DecodeCase& c, DType kv_dtype) {
  Step st;
  st.seqs = static_cast<int32_t>(c.used.size());
  const int32_t bs = c.block_slots;
  st.block_stride = static_cast<int64_t>(c.heads) * bs;
  for (int32_t u : c.used) {
    st.max_blocks = std::max(st.max_blocks, (u + bs - 1) / bs);
    st.max_used = std::max(st.max_used, u);
  }
  int32_t total_blocks = 3;  // spare blocks: garbage no sequence owns
  for (int32_t u : c.used) total_blocks += (u + bs - 1) / bs;
  st.pool_slots = total_blocks * st.block_stride;
  st.k = RandomKvRows(rng, kv_dtype, st.pool_slots, c.head_dim, -2.f, 2.f);
  st.v = RandomKvRows(rng, kv_dtype, st.pool_slots, c.head_dim, -1.f, 1.f);
  st.score = RandomTensor(rng, DType::kF32, {st.pool_slots}, 0.f, 3.f);
  st.slot_pos = Tensor::Empty(DType::kI32, {st.pool_slots});
  // Garbage positions everywhere (0: a slot every query would see if it were read).
  std::fill_n(st.slot_pos.as<int32_t>(), st.pool_slots, 0);
  std::vector<int32_t> order(total_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const int64_t stride = static_cast<int64_t>(c.heads) * c.head_dim + c.stride_extra;
  st.q = RandomTensor(rng, DType::kF32, {st.seqs, stride}, -2.f, 2.f);
  st.nk = RandomTensor(rng, DType::kF32, {st.seqs, stride}, -2.f, 2.f);
  st.nv = RandomTensor(rng, DType::kF32, {st.seqs, stride}, -1.f, 1.f);
  st.blocks.assign(static_cast<size_t>(st.seqs) * st.max_blocks, order.back());
  st.slots.resize(static_cast<size_t>(st.seqs) * c.heads);
  size_t next = 0;
  for (int32_t i = 0; i < st.seqs; ++i) {
    const int32_t u = c.used[i];
    const int32_t nb = (u + bs - 1) / bs;
    for (int32_t b = 0; b < nb; ++b) st.blocks[static_cast<size_t>(i) * st.max_blocks + b] = order[next++];
    st.used.push_back(u);
    st.q_pos.push_back(u + static_cast<int32_t>(rng() % 3));  // the new token's position
    st.flags.push_back(static_cast<int32_t>(rng() % 3 == 0   ? 0
                                            : rng() % 2 == 0 ? kDecodeKeepsScore
                                                             : kDecodeKeepsScore | kDecodeAddsScore));
    // Per head: shuffled positions below q_pos, a fifth of them holes, one slot left for the
    // new token (the one AppendPositions took).
    for (int32_t h = 0; h < c.heads; ++h) {
      std::vector<int32_t> pos(u);
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng);
      const int32_t fresh = static_cast<int32_t>(rng() % u);
      for (int32_t s = 0; s < u; ++s) {
        const int32_t b = st.blocks[static_cast<size_t>(i) * st.max_blocks + s / bs];
        const int64_t at = b * st.block_stride + static_cast<int64_t>(h) * bs + s % bs;
        st.slot_pos.as<int32_t>()[at] = s == fresh ? -1 : (rng() % 5 == 0 ? -1 : pos[s]);
      }
      st.slots[static_cast<size_t>(i) * c.heads + h] = fresh;
    }
  }
  return st;
}

KvView PoolView(void* k, void* v, int32_t* slot_pos, float* score, DType dtype, Device device,
                const DecodeCase& c, const Step& st) {
  KvView kv;
  kv.k = k;
  kv.v = v;
  kv.slot_pos = slot_pos;
  kv.score = score;
  kv.dtype = dtype;
  kv.device = device;
  kv.block_slots = c.block_slots;
  kv.block_stride = st.block_stride;
  return kv;
}

// Each sequence's KvWrite and Attention on the reference backend, through the validating ops.
void Expected(const DecodeCase& c, DType kv_dtype, Step& st, Tensor* out) {
  auto ref = MakeReferenceBackend();
  const int64_t width = static_cast<int64_t>(c.heads) * c.head_dim;
  const int64_t stride = st.q.view().cols();
  for (int32_t i = 0; i < st.seqs; ++i) {
    KvView kv = PoolView(st.k.data(), st.v.data(), st.slot_pos.as<int32_t>(), nullptr, kv_dtype,
                         Device::Host(), c, st);
    kv.blocks = st.blocks.data() + static_cast<size_t>(i) * st.max_blocks;
    kv.capacity = st.max_blocks * c.block_slots;
    kv.used = st.used[i];
    if (st.flags[i] & kDecodeKeepsScore) kv.score = st.score.as<float>();
    TensorView k{st.nk.as<float>() + i * stride, DType::kF32, Shape{1, width}};
    TensorView v{st.nv.as<float>() + i * stride, DType::kF32, Shape{1, width}};
    ASSERT_TRUE(KvWrite(*ref, kv, c.heads, c.head_dim,
                        st.slots.data() + static_cast<size_t>(i) * c.heads, &st.q_pos[i], 1, k, v,
                        nullptr)
                    .ok());
    AttentionArgs a;
    a.q = TensorView{st.q.as<float>() + i * stride, DType::kF32, Shape{1, width}};
    a.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    a.q_pos = &st.q_pos[i];
    a.kv = kv;
    if ((st.flags[i] & kDecodeAddsScore) == 0) a.kv.score = nullptr;
    a.heads = c.heads;
    a.head_dim = c.head_dim;
    a.out = out->view().RowSlice(i, i + 1);
    const Status s = Attention(*ref, a);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
}

StatusOr<Tensor> IntsTo(Backend& b, const std::vector<int32_t>& host) {
  Tensor t = Tensor::Empty(DType::kI32, {static_cast<int64_t>(host.size())});
  std::copy(host.begin(), host.end(), t.as<int32_t>());
  return b.ToBackend(t);
}

void CheckDecode(Backend& b, const DecodeCase& c, DType kv_dtype, uint32_t seed) {
  SCOPED_TRACE(c.Label() + " kv " + DTypeName(kv_dtype) + " seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  Step st = MakeStep(rng, c, kv_dtype);
  const int64_t width = static_cast<int64_t>(c.heads) * c.head_dim;
  // The device's copies, made before the host's expected values change the pool.
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor dk, b.ToBackend(st.k));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor dv, b.ToBackend(st.v));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor dpos, b.ToBackend(st.slot_pos));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor dscore, b.ToBackend(st.score));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor dq, b.ToBackend(st.q));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor dnk, b.ToBackend(st.nk));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor dnv, b.ToBackend(st.nv));
  Tensor garbage = RandomTensor(rng, DType::kF32, {st.seqs, width}, 50.f, 60.f);
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor dout, b.ToBackend(garbage));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_qpos, IntsTo(b, st.q_pos));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_used, IntsTo(b, st.used));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_slots, IntsTo(b, st.slots));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_flags, IntsTo(b, st.flags));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_blocks, IntsTo(b, st.blocks));

  DecodeAttentionArgs a;
  a.q = dq.as<float>();
  a.q_stride = st.q.view().cols();
  a.k = dnk.as<float>();
  a.v = dnv.as<float>();
  a.kv_stride = st.q.view().cols();
  a.out = dout.as<float>();
  a.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  a.kv = PoolView(dk.data(), dv.data(), dpos.as<int32_t>(), dscore.as<float>(), kv_dtype,
                  b.device(), c, st);
  a.seqs = st.seqs;
  a.heads = c.heads;
  a.head_dim = c.head_dim;
  a.q_pos = d_qpos.as<int32_t>();
  a.used = d_used.as<int32_t>();
  a.slots = d_slots.as<int32_t>();
  a.flags = d_flags.as<int32_t>();
  a.blocks = d_blocks.as<int32_t>();
  a.max_blocks = st.max_blocks;
  a.max_used = st.max_used;
  a.device = b.device();
  const Status s = DecodeAttention(b, a);
  ASSERT_TRUE(s.ok()) << s.ToString();

  Tensor want = Tensor::Zeros(DType::kF32, {st.seqs, width});
  Expected(c, kv_dtype, st, &want);
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(dout.view()));
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), want.numel())) << "out";
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_pos, b.ToHost(dpos.view()));
  EXPECT_TRUE(std::equal(st.slot_pos.as<int32_t>(), st.slot_pos.as<int32_t>() + st.pool_slots,
                         got_pos.as<int32_t>()))
      << "slot positions";
  for (auto [name, dev, host] : {std::tuple{"k", &dk, &st.k}, std::tuple{"v", &dv, &st.v}}) {
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_kv, b.ToHost(dev->view()));
    EXPECT_EQ(0, std::memcmp(got_kv.data(), host->data(), host->view().bytes())) << name;
  }
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_score, b.ToHost(dscore.view()));
  EXPECT_TRUE(Close(got_score.as<float>(), st.score.as<float>(), st.pool_slots)) << "scores";
}

// Head sizes of each CUDA load path (one element per load, 16-byte loads, several per lane);
// decode batches from one sequence to 33, contexts from one slot to 2,000.
const DecodeCase kCases[] = {
    {1, 1, 4, {1}, 0},
    {2, 3, 7, {5, 1, 12}, 0},
    {4, 64, 16, {33, 200, 1, 64, 17}, 0},
    {4, 64, 16, {2000, 3, 700}, 64 * 4 * 2},  // q, k and v of one stacked row
    {3, 80, 32, {300, 260, 40}, 0},
    {2, 128, 64, {1500, 1}, 0},
    {1, 1024, 16, {70, 5}, 0},
    {2, 17, 5, std::vector<int32_t>(33, 9), 3},
};

class CompareDecodeAttention : public BackendTest {};

TEST_P(CompareDecodeAttention, MixedSequencesEqualPerSequenceOps) {
  uint32_t seed = BaseSeed() + 9100;
  for (DType kv_dtype : KvDTypes()) {
    if (!Runs(backend(), OpId::kDecodeAttention, kv_dtype)) continue;
    for (const DecodeCase& c : kCases) CheckDecode(backend(), c, kv_dtype, seed++);
  }
}

// A sequence's output does not depend on its step: alone, beside longer and shorter sequences,
// or under a max_used padded to the block table's bound (a captured graph's), the same bits.
TEST_P(CompareDecodeAttention, SequenceOutputIndependentOfItsStep) {
  Backend& b = backend();
  const DecodeCase c{4, 64, 16, {700, 5, 2000, 260}, 0};
  for (DType kv_dtype : KvDTypes()) {
    if (!Runs(b, OpId::kDecodeAttention, kv_dtype)) continue;
    SCOPED_TRACE(DTypeName(kv_dtype));
    std::mt19937 rng(BaseSeed() + 9300);
    const Step st = MakeStep(rng, c, kv_dtype);
    const int64_t width = static_cast<int64_t>(c.heads) * c.head_dim;
    // Sequence 0's row of `out` after a step over the first `seqs` sequences, on a fresh copy.
    auto run = [&](int32_t seqs, int32_t max_used) -> std::vector<float> {
      auto to = [&](const Tensor& t) { return b.ToBackend(t); };
      auto dk = to(st.k), dv = to(st.v), dpos = to(st.slot_pos), dscore = to(st.score);
      auto dq = to(st.q), dnk = to(st.nk), dnv = to(st.nv);
      auto dout = to(Tensor::Zeros(DType::kF32, {st.seqs, width}));
      auto qpos = IntsTo(b, st.q_pos), used = IntsTo(b, st.used), slots = IntsTo(b, st.slots);
      auto flags = IntsTo(b, st.flags), blocks = IntsTo(b, st.blocks);
      for (auto* t : {&dk, &dv, &dpos, &dscore, &dq, &dnk, &dnv, &dout, &qpos, &used, &slots,
                      &flags, &blocks}) {
        EXPECT_TRUE(t->ok()) << t->status().ToString();
        if (!t->ok()) return {};
      }
      DecodeAttentionArgs a;
      a.q = dq->as<float>();
      a.q_stride = a.kv_stride = st.q.view().cols();
      a.k = dnk->as<float>();
      a.v = dnv->as<float>();
      a.out = dout->as<float>();
      a.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
      a.kv = PoolView(dk->data(), dv->data(), dpos->as<int32_t>(), dscore->as<float>(), kv_dtype,
                      b.device(), c, st);
      a.seqs = seqs;
      a.heads = c.heads;
      a.head_dim = c.head_dim;
      a.q_pos = qpos->as<int32_t>();
      a.used = used->as<int32_t>();
      a.slots = slots->as<int32_t>();
      a.flags = flags->as<int32_t>();
      a.blocks = blocks->as<int32_t>();
      a.max_blocks = st.max_blocks;
      a.max_used = max_used;
      a.device = b.device();
      const Status s = DecodeAttention(b, a);
      EXPECT_TRUE(s.ok()) << s.ToString();
      std::vector<float> row(static_cast<size_t>(width));
      EXPECT_TRUE(b.CopyDeviceToHost(row.data(), a.out, row.size() * sizeof(float)).ok());
      return row;
    };
    const std::vector<float> alone = run(1, st.used[0]);
    ASSERT_EQ(alone.size(), static_cast<size_t>(width));
    const int32_t bound = st.max_blocks * c.block_slots;
    for (auto [seqs, max_used] : {std::pair{1, bound}, std::pair{2, st.max_used},
                                  std::pair{4, st.max_used}, std::pair{4, bound}}) {
      const std::vector<float> got = run(seqs, max_used);
      ASSERT_EQ(got.size(), alone.size());
      EXPECT_EQ(0, std::memcmp(got.data(), alone.data(), alone.size() * sizeof(float)))
          << seqs << " sequences, max_used " << max_used;
    }
  }
}

// DecodeEvict equals each sequence's KvEvict on the reference, over random arguments per
// sequence (every rank, excesses 0 to 3, decays, recent windows), some sequences left alone.
TEST_P(CompareDecodeAttention, DecodeEvictEqualsPerSequenceKvEvict) {
  Backend& b = backend();
  for (DType kv_dtype : KvDTypes()) {
    if (!Runs(b, OpId::kDecodeEvict, kv_dtype)) continue;
    uint32_t seed = BaseSeed() + 9500;
    for (const DecodeCase& c : kCases) {
      SCOPED_TRACE(c.Label() + " kv " + DTypeName(kv_dtype));
      std::mt19937 rng(seed++);
      Step st = MakeStep(rng, c, kv_dtype);
      constexpr int32_t kCap = 3;
      std::vector<KvEvictArgs> args(st.seqs);
      for (KvEvictArgs& e : args) {
        e.rank = static_cast<KvRank>(rng() % 3);
        e.decay = rng() % 3 == 0 ? 0.7f : 1.0f;
        e.excess = static_cast<int32_t>(rng() % (kCap + 1));
      }
      args[0].excess = 0;  // left alone, or a decay only
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor dpos, b.ToBackend(st.slot_pos));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor dscore, b.ToBackend(st.score));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor dk, b.ToBackend(st.k));
      Tensor none = Tensor::Empty(DType::kI32, {static_cast<int64_t>(st.seqs) * c.heads * kCap});
      std::fill_n(none.as<int32_t>(), none.numel(), -7);
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor dvictims, b.ToBackend(none));
      std::vector<int32_t> params(static_cast<size_t>(st.seqs) * kDecodeEvictParams);
      for (int32_t i = 0; i < st.seqs; ++i) {
        KvEvictArgs& e = args[i];
        e.length = st.q_pos[i] + 1;
        e.oldest_recent = static_cast<int32_t>(rng() % (e.length + 1));
        PackDecodeEvict(e, dvictims.as<int32_t>() + static_cast<int64_t>(i) * c.heads * kCap,
                        params.data() + static_cast<size_t>(i) * kDecodeEvictParams);
      }
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_used, IntsTo(b, st.used));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_blocks, IntsTo(b, st.blocks));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_params, IntsTo(b, params));
      DecodeEvictArgs a;
      a.kv = PoolView(dk.data(), dk.data(), dpos.as<int32_t>(), dscore.as<float>(), kv_dtype,
                      b.device(), c, st);
      a.seqs = st.seqs;
      a.heads = c.heads;
      a.used = d_used.as<int32_t>();
      a.blocks = d_blocks.as<int32_t>();
      a.max_blocks = st.max_blocks;
      a.params = d_params.as<int32_t>();
      a.device = b.device();
      const Status s = DecodeEvict(b, a);
      ASSERT_TRUE(s.ok()) << s.ToString();

      auto ref = MakeReferenceBackend();
      for (int32_t i = 0; i < st.seqs; ++i) {
        const KvEvictArgs& e = args[i];
        if (e.excess == 0 && e.decay == 1.0f) continue;
        KvView kv = PoolView(st.k.data(), st.k.data(), st.slot_pos.as<int32_t>(),
                             st.score.as<float>(), kv_dtype, Device::Host(), c, st);
        kv.blocks = st.blocks.data() + static_cast<size_t>(i) * st.max_blocks;
        kv.used = st.used[i];
        kv.capacity = st.max_blocks * c.block_slots;
        const Status r = KvEvict(*ref, kv, c.heads, e,
                                 none.as<int32_t>() + static_cast<int64_t>(i) * c.heads * kCap);
        ASSERT_TRUE(r.ok()) << r.ToString();
      }
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_pos, b.ToHost(dpos.view()));
      EXPECT_TRUE(std::equal(st.slot_pos.as<int32_t>(), st.slot_pos.as<int32_t>() + st.pool_slots,
                             got_pos.as<int32_t>()))
          << "slot positions";
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_score, b.ToHost(dscore.view()));
      EXPECT_EQ(0, std::memcmp(got_score.data(), st.score.data(), st.score.view().bytes()))
          << "scores";
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_victims, b.ToHost(dvictims.view()));
      EXPECT_EQ(0, std::memcmp(got_victims.data(), none.data(), none.view().bytes())) << "victims";
    }
  }
}

// The wrapper names the argument it refuses, and refuses before reading device memory.
TEST_P(CompareDecodeAttention, RefusesBadArgumentsByName) {
  Backend& b = backend();
  DecodeAttentionArgs a;
  int32_t meta[4] = {0, 1, 0, 0};
  float rows[8] = {};
  float out[8] = {};
  int32_t pos[4] = {};
  a.q = a.k = a.v = rows;
  a.out = out;
  a.q_stride = a.kv_stride = 4;
  a.kv.k = a.kv.v = rows;
  a.kv.slot_pos = pos;
  a.kv.block_slots = 2;
  a.kv.block_stride = 4;
  a.kv.device = a.device = b.device();
  a.seqs = 1;
  a.heads = 2;
  a.head_dim = 2;
  a.q_pos = a.used = a.slots = a.flags = a.blocks = meta;
  a.max_blocks = 1;
  a.max_used = 2;
  auto refused = [&](DecodeAttentionArgs bad, const std::string& field) {
    const Status s = DecodeAttention(b, bad);
    EXPECT_FALSE(s.ok()) << field;
    EXPECT_NE(s.message().find("'" + field + "'"), std::string::npos) << s.ToString();
  };
  DecodeAttentionArgs bad = a;
  bad.blocks = nullptr;
  refused(bad, "blocks");
  bad = a;
  bad.max_used = 3;
  refused(bad, "max_used");
  bad = a;
  bad.q_stride = 3;
  refused(bad, "q_stride");
  bad = a;
  bad.kv.block_stride = 3;
  refused(bad, "kv.block_stride");
  bad = a;
  bad.out = rows + 2;
  refused(bad, "out");
  if (!b.device().is_host()) {
    bad = a;
    bad.device = Device::Host();
    refused(bad, "q");
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareDecodeAttention, AllBackends());

}  // namespace
}  // namespace deja::kernels
