// `--kv-dtype int8` (common/kv_row.h: int8 keys and values with a scale per token and head) on
// the trained fixture opt-mini: the bytes a cached token costs, perplexity on both held-out files
// within 0.5% of the f16 KV cache's, greedy agreement with it, the same answers on the simulated
// device (paged KV pool, batched decode attention, the reference's kernels) as on the CPU, and
// under bounded policies whose evictions and compactions move int8 rows with their scales.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "tests/common/sim_device.h"
#include "tests/worker/golden_util.h"
#include "tests/worker/heldout_util.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"

namespace deja::worker {
namespace {

using test_util::Greedy;
using test_util::GreedyAgreement;
using test_util::HeldOut;
using test_util::ModelDir;

StatusOr<std::unique_ptr<model::Model>> Load(kernels::Backend* be, DType kv) {
  model::LoadOptions o;
  o.kv_dtype = kv;
  return model::LoadModel(ModelDir("opt-mini"), be, nullptr, o);
}

class Int8KvModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = kernels::MakeCpuBackend(2);
    auto i8 = Load(backend_.get(), DType::kI8);
    auto f16 = Load(backend_.get(), DType::kF16);
    ASSERT_TRUE(i8.ok() && f16.ok()) << i8.status().ToString();
    int8_ = std::move(*i8);
    f16_ = std::move(*f16);
  }
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> int8_, f16_;
};

TEST_F(Int8KvModelTest, CachedTokensCostLittleMoreThanHalfOfF16) {
  const kv::KvGeometry g = int8_->kv_geometry();
  EXPECT_EQ(g.kv_dtype, DType::kI8);
  // Per slot and head: K and V rows of head_dim + 4 bytes, a score and a position.
  EXPECT_EQ(g.SlotBytes(),
            static_cast<size_t>(g.layers) * g.heads * (2 * (g.head_dim + 4) + 8));
  const double ratio = static_cast<double>(g.SlotBytes()) / f16_->kv_geometry().SlotBytes();
  std::printf("bytes per cached token: int8 %zu, f16 %zu (%.3f)\n", g.SlotBytes(),
              f16_->kv_geometry().SlotBytes(), ratio);
  EXPECT_LT(ratio, 0.6);
}

TEST_F(Int8KvModelTest, PerplexityWithinHalfAPercentOfF16Kv) {
  for (const char* file : {"kjv.txt", "tinyshakespeare.txt"}) {
    const double rel = test_util::RelativePerplexity(*f16_, *int8_, file, "f16 KV", "int8 KV");
    EXPECT_LE(std::abs(rel), 0.005) << file;
    EXPECT_GT(std::abs(rel), 0.0) << file << ": int8 K/V should not reproduce f16 exactly";
  }
}

TEST_F(Int8KvModelTest, GreedyAgreementWithF16Kv) {
  const std::vector<int32_t> text = HeldOut("tinyshakespeare.txt", 4096);
  const double agreement = GreedyAgreement(*f16_, *int8_, text, 16, 200);
  std::printf("greedy agreement int8 KV vs f16 KV over 16 x 32 tokens: %.3f\n", agreement);
  EXPECT_GE(agreement, 0.85);
}

// The simulated device keeps K and V in a paged pool and decodes every sequence of a step in one
// DecodeAttention call (the reference's kernels): the same perplexity as the CPU's int8 cache to
// float rounding, so the pool's rows, their scales and the batched path agree with the host's.
TEST_F(Int8KvModelTest, SimulatedDeviceMatchesTheCpu) {
  auto sim = test_util::MakeSimDeviceBackend();
  auto dev = Load(sim.get(), DType::kI8);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  const std::vector<int32_t> ids = HeldOut("kjv.txt", 700);
  auto want = model::Perplexity(*int8_, ids, 256);
  auto got = model::Perplexity(**dev, ids, 256);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status().ToString();
  EXPECT_NEAR(got->perplexity, want->perplexity, 1e-4 * want->perplexity);
  std::vector<int32_t> prompt = {2};
  prompt.insert(prompt.end(), ids.begin(), ids.begin() + 40);
  EXPECT_EQ(Greedy(**dev, prompt, 24), Greedy(*int8_, prompt, 24));
}

// Bounded policies evict slots and (after a prefill) compact the cache: int8 rows move with
// their scales, so an h2o or window sequence decodes as it does over f16 rows to within the
// rounding of the values.
TEST_F(Int8KvModelTest, BoundedPoliciesKeepTheirAnswers) {
  const std::vector<int32_t> text = HeldOut("kjv.txt", 1024);
  std::vector<int32_t> prompt = {2};
  prompt.insert(prompt.end(), text.begin(), text.begin() + 120);
  for (auto [policy, kind] : {std::pair{"h2o", kv::CachePolicyKind::kH2O},
                              std::pair{"window", kv::CachePolicyKind::kWindow}}) {
    SCOPED_TRACE(policy);
    model::GenerationOptions g;
    g.max_new_tokens = 40;
    g.stop_at_eos = false;
    g.cache.kind = kind;
    g.cache.heavy_tokens = kind == kv::CachePolicyKind::kH2O ? 32 : 0;
    g.cache.recent_tokens = kind == kv::CachePolicyKind::kH2O ? 16 : 48;
    auto a = model::Generate(*f16_, prompt, g);
    auto b = model::Generate(*int8_, prompt, g);
    ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
    ASSERT_EQ(a->tokens.size(), b->tokens.size());
    int agree = 0;
    for (size_t i = 0; i < a->tokens.size(); ++i) agree += a->tokens[i].id == b->tokens[i].id;
    std::printf("%s, budget 48: int8 KV agrees with f16 KV on %d of %zu tokens\n", policy, agree,
                a->tokens.size());
    EXPECT_GE(agree, static_cast<int>(a->tokens.size() * 3 / 4));
    EXPECT_GT(b->evictions, 0);
  }
}

}  // namespace
}  // namespace deja::worker
