// int4 weights (`--dtype int4`: the layers' matrices int4 in groups, the embeddings and lm head
// int8) on the trained fixture opt-mini: perplexity on both held-out files within 3% of the
// checkpoint's f16, greedy agreement with f16, the bytes of the layers' matrices, the fallback
// to int8 by error and by group, a token's logits independent of its batch and of its prompt's
// split, and the refusals (Deja Vu's gathers, a bad group, a device).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer.h"
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

StatusOr<std::unique_ptr<model::Model>> Load(kernels::Backend* be, std::optional<DType> dtype,
                                             int32_t group = 128, double max_error = 0.15) {
  model::LoadOptions o;
  o.weight_dtype = dtype;
  o.int4_group = group;
  o.int4_max_error = max_error;
  return model::LoadModel(ModelDir("opt-mini"), be, nullptr, o);
}


class Int4ModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = kernels::MakeCpuBackend(2);
    auto i4 = Load(backend_.get(), DType::kI4);
    auto i8 = Load(backend_.get(), DType::kI8);
    auto f16 = Load(backend_.get(), std::nullopt);
    ASSERT_TRUE(i4.ok() && i8.ok() && f16.ok()) << i4.status().ToString();
    int4_ = std::move(*i4);
    int8_ = std::move(*i8);
    f16_ = std::move(*f16);
  }
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> int4_, int8_, f16_;
};

TEST_F(Int4ModelTest, LayerMatricesInInt4) {
  EXPECT_EQ(int4_->weight_dtype(), DType::kI4);
  // The layers' matrices at half a byte per weight plus a scale per 128: 0.53 of int8's bytes;
  // the embedding table (most of opt-mini's weights) and the lm head int8 in both.
  const double vs_int8 = static_cast<double>(int4_->weight_bytes()) / int8_->weight_bytes();
  const double vs_f16 = static_cast<double>(int4_->weight_bytes()) / f16_->weight_bytes();
  std::printf("weight bytes: int4 %lld, int8 %lld, f16 %lld\n",
              static_cast<long long>(int4_->weight_bytes()),
              static_cast<long long>(int8_->weight_bytes()),
              static_cast<long long>(f16_->weight_bytes()));
  EXPECT_LT(vs_int8, 0.8);
  EXPECT_LT(vs_f16, 0.4);
}

TEST_F(Int4ModelTest, PerplexityWithinThreePercentOfF16) {
  for (const char* file : {"kjv.txt", "tinyshakespeare.txt"}) {
    const double rel = test_util::RelativePerplexity(*f16_, *int4_, file, "f16", "int4");
    EXPECT_LE(std::abs(rel), 0.03) << file;
    EXPECT_GT(std::abs(rel), 0.0) << file << ": int4 should not reproduce f16 exactly";
  }
}

TEST_F(Int4ModelTest, GreedyAgreementWithF16) {
  const std::vector<int32_t> text = HeldOut("tinyshakespeare.txt", 4096);
  const double agreement = GreedyAgreement(*f16_, *int4_, text, 16, 200);
  std::printf("greedy agreement int4 vs f16 over 16 x 32 tokens: %.3f\n", agreement);
  EXPECT_GE(agreement, 0.6);
}

TEST_F(Int4ModelTest, HighErrorMatricesAndUnevenGroupsStayInt8) {
  // A bound no int4 matrix meets: every layer matrix int8, the same logits as --dtype int8.
  auto all8 = Load(backend_.get(), DType::kI4, 128, 0.0);
  ASSERT_TRUE(all8.ok());
  EXPECT_EQ((*all8)->weight_dtype(), DType::kI8);
  EXPECT_EQ((*all8)->weight_bytes(), int8_->weight_bytes());
  // Groups of 512: fc2's 1024 columns divide, the 256 of the others do not.
  auto some = Load(backend_.get(), DType::kI4, 512);
  ASSERT_TRUE(some.ok());
  EXPECT_EQ((*some)->weight_dtype(), DType::kI4);
  EXPECT_GT((*some)->weight_bytes(), int4_->weight_bytes());
  EXPECT_LT((*some)->weight_bytes(), int8_->weight_bytes());
  const std::vector<int32_t> ids = HeldOut("kjv.txt", 1024);
  auto p8 = model::Perplexity(*int8_, ids, 512);
  auto p = model::Perplexity(**all8, ids, 512);
  ASSERT_TRUE(p8.ok() && p.ok());
  EXPECT_EQ(p->perplexity, p8->perplexity);
}

// As for int8 (Int8ModelTest.AnswersDoNotDependOnTheBatchOrThePrefillSplit): the prompt alone in
// one step and three decode steps alone, against chunks of 8, 8 and 25 beside another
// sequence's 20-token chunk and decode steps beside a decode row, a 30-token chunk and nothing.
TEST_F(Int4ModelTest, AnswersDoNotDependOnTheBatchOrThePrefillSplit) {
  model::Model& m = *int4_;
  const std::vector<int32_t> text = HeldOut("tinyshakespeare.txt", 256);
  std::vector<int32_t> prompt = {2};
  prompt.insert(prompt.end(), text.begin(), text.begin() + 40);
  const std::vector<int32_t> decode = {text[100], text[101], text[102]};
  const int64_t vocab = m.config().vocab_size;
  auto row = [&](const model::StepResult& r, int64_t i) {
    return std::vector<double>(r.logits.as<float>() + i * vocab,
                               r.logits.as<float>() + (i + 1) * vocab);
  };
  auto alone = m.NewSequence(64);
  ASSERT_TRUE(alone.ok());
  model::StepResult r;
  std::vector<std::vector<double>> want;
  ASSERT_TRUE(m.Forward({{alone->get(), prompt.data(), 41}}, &r).ok());
  want.push_back(row(r, 0));
  for (const int32_t& t : decode) {
    ASSERT_TRUE(m.Forward({{alone->get(), &t, 1}}, &r).ok());
    want.push_back(row(r, 0));
  }
  auto seq = m.NewSequence(64), other = m.NewSequence(128);
  ASSERT_TRUE(seq.ok() && other.ok());
  const std::vector<int32_t> other_text(text.begin() + 150, text.begin() + 230);
  const int32_t* o = other_text.data();
  std::vector<std::vector<double>> got;
  ASSERT_TRUE(m.Forward({{seq->get(), prompt.data(), 8}}, &r).ok());
  ASSERT_TRUE(m.Forward({{seq->get(), prompt.data() + 8, 8}, {other->get(), o, 20}}, &r).ok());
  ASSERT_TRUE(m.Forward({{seq->get(), prompt.data() + 16, 25}}, &r).ok());
  got.push_back(row(r, 0));
  ASSERT_TRUE(m.Forward({{seq->get(), &decode[0], 1}, {other->get(), o + 20, 1}}, &r).ok());
  got.push_back(row(r, 0));
  ASSERT_TRUE(m.Forward({{other->get(), o + 21, 30}, {seq->get(), &decode[1], 1}}, &r).ok());
  got.push_back(row(r, 1));
  ASSERT_TRUE(m.Forward({{seq->get(), &decode[2], 1}}, &r).ok());
  got.push_back(row(r, 0));
  for (size_t i = 0; i < want.size(); ++i) {
    std::vector<float> g(got[i].begin(), got[i].end());
    EXPECT_LE(test_util::RelError(g.data(), want[i]), 1e-5) << "logits row " << i;
  }
}

TEST_F(Int4ModelTest, RefusalsNameTheirReason) {
  model::SparsityOptions s;
  s.oracle_fraction = 0.5f;
  Status st = int4_->EnableSparsity(s);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("int4"), std::string::npos) << st.ToString();
  auto bad = Load(backend_.get(), DType::kI4, 12);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("group"), std::string::npos) << bad.status().ToString();
  auto sim = test_util::MakeSimDeviceBackend();
  auto dev = Load(sim.get(), DType::kI4);
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().ToString().find("int4"), std::string::npos) << dev.status().ToString();
}

}  // namespace
}  // namespace deja::worker
