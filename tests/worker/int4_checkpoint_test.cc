// int4 checkpoints (`deja quantize --bits 4`) on the trained fixture opt-mini: the checkpoint
// loads to exactly the model `--dtype int4` makes at load (the same bytes, logits and greedy
// tokens), whatever dtype is asked for; the per-matrix fallback to int8 by error and by group
// is the load's too; a third of the float checkpoint's bytes on disk; a device, Deja Vu and
// malformed int4 tensors are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/safetensors.h"
#include "kernels/backend.h"
#include "tests/common/sim_device.h"
#include "tests/common/temp_dir.h"
#include "tests/worker/checkpoint_edit.h"
#include "tests/worker/golden_util.h"
#include "tests/worker/heldout_util.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"
#include "worker/model/quantize_checkpoint.h"

namespace deja::worker {
namespace {

using test_util::HeldOut;
using test_util::ModelDir;
using test_util::PrefillLogits;
using test_util::TempDir;

StatusOr<std::unique_ptr<model::Model>> Load(kernels::Backend* be, const std::string& dir,
                                             std::optional<DType> dtype, int32_t group = 128,
                                             double max_error = 0.15) {
  model::LoadOptions o;
  o.weight_dtype = dtype;
  o.int4_group = group;
  o.int4_max_error = max_error;
  return model::LoadModel(dir, be, nullptr, o);
}

model::QuantizeOptions Bits4(int32_t group = 128, double max_error = 0.15) {
  model::QuantizeOptions o;
  o.bits = 4;
  o.group = group;
  o.max_error = max_error;
  return o;
}

// Greedy tokens after `prompt`, `n` of them, one decode step each.
std::vector<int32_t> GreedyTokens(model::Model& m, const std::vector<int32_t>& prompt, int n) {
  auto kv = m.NewSequence(static_cast<int32_t>(prompt.size()) + n);
  EXPECT_TRUE(kv.ok());
  if (!kv.ok()) return {};
  std::vector<int32_t> out;
  model::StepResult r;
  std::vector<int32_t> next = prompt;
  const int64_t vocab = m.config().vocab_size;
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(m.Forward({{kv->get(), next.data(), static_cast<int32_t>(next.size())}}, &r).ok());
    const float* last = r.logits.as<float>() + (r.logits.numel() - vocab);
    const int32_t t = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    out.push_back(t);
    next = {t};
  }
  return out;
}

class Int4CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = kernels::MakeCpuBackend(2);
    auto i4 = Load(backend_.get(), ModelDir("opt-mini"), DType::kI4);
    ASSERT_TRUE(i4.ok()) << i4.status().ToString();
    at_load_ = std::move(*i4);
  }
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> at_load_;  // --dtype int4 on the float checkpoint
  TempDir tmp_;
};

TEST_F(Int4CheckpointTest, LoadsToExactlyTheModelInt4MakesAtLoad) {
  const std::string out = tmp_.path() + "/int4";
  auto r = model::QuantizeCheckpoint(ModelDir("opt-mini"), out, backend_->pool(), Bits4());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Six matrices per layer: fc2's 1,024 columns and the others' 256 are whole groups of 128.
  EXPECT_EQ(r->matrices, 4 * 6 + 1);
  EXPECT_EQ(r->int4 + r->int4_fallbacks, 4 * 6);
  EXPECT_GT(r->int4, 0);
  std::printf("int4 checkpoint: %lld int4, %lld int8 by error; %.2f MiB -> %.2f MiB\n",
              static_cast<long long>(r->int4), static_cast<long long>(r->int4_fallbacks),
              r->bytes_in / 1048576.0, r->bytes_out / 1048576.0);
  EXPECT_LT(r->bytes_out, r->bytes_in * 0.5);  // f16 in; the embedding table stays int8
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer_config.json"));
  const std::vector<int32_t> ids = HeldOut("kjv.txt", 48);
  const std::vector<float> want = PrefillLogits(*at_load_, ids);
  const std::vector<int32_t> greedy = GreedyTokens(*at_load_, ids, 12);
  // No dtype, bf16, int8 or int4 asked: the int4 and int8 matrices stay as the file has them.
  for (std::optional<DType> dtype :
       {std::optional<DType>(), std::optional<DType>(DType::kBF16),
        std::optional<DType>(DType::kI8), std::optional<DType>(DType::kI4)}) {
    SCOPED_TRACE(dtype ? DTypeName(*dtype) : "none");
    auto m = Load(backend_.get(), out, dtype);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->weight_dtype(), DType::kI4);
    if (dtype == DType::kI8 || dtype == DType::kI4) {
      // The position embeddings follow the request as at load (f16 otherwise).
      EXPECT_EQ((*m)->weight_bytes(), at_load_->weight_bytes());
      EXPECT_EQ(PrefillLogits(**m, ids), want);
      EXPECT_EQ(GreedyTokens(**m, ids, 12), greedy);
    }
  }
  // A quantized checkpoint is not quantized again.
  auto twice = model::QuantizeCheckpoint(out, tmp_.path() + "/twice", nullptr, Bits4());
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("already quantized"), std::string::npos);
}

TEST_F(Int4CheckpointTest, FallbackByErrorAndByGroupIsTheLoads) {
  // No int4 matrix meets a bound of 0: all int8, as --dtype int4 with that bound.
  const std::string all8 = tmp_.path() + "/all8";
  auto r = model::QuantizeCheckpoint(ModelDir("opt-mini"), all8, nullptr, Bits4(128, 0.0));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->int4, 0);
  EXPECT_EQ(r->int4_fallbacks, 24);
  // Groups of 512: only fc2's 1,024 columns divide.
  const std::string g512 = tmp_.path() + "/g512";
  r = model::QuantizeCheckpoint(ModelDir("opt-mini"), g512, nullptr, Bits4(512, 1.0));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->int4, 4);
  EXPECT_EQ(r->int4_fallbacks, 20);
  const std::vector<int32_t> ids = HeldOut("tinyshakespeare.txt", 40);
  for (auto [dir, group, max_error] : {std::tuple<std::string, int32_t, double>{all8, 128, 0.0},
                                       {g512, 512, 1.0}}) {
    SCOPED_TRACE(dir);
    auto file = Load(backend_.get(), dir, DType::kI4, group, max_error);
    auto load = Load(backend_.get(), ModelDir("opt-mini"), DType::kI4, group, max_error);
    ASSERT_TRUE(file.ok() && load.ok());
    EXPECT_EQ((*file)->weight_dtype(), (*load)->weight_dtype());
    EXPECT_EQ((*file)->weight_bytes(), (*load)->weight_bytes());
    EXPECT_EQ(PrefillLogits(**file, ids), PrefillLogits(**load, ids));
  }
  // Bad options are refused before anything is written.
  for (model::QuantizeOptions bad : {Bits4(12), Bits4(0), Bits4(128, -1.0)}) {
    auto q = model::QuantizeCheckpoint(ModelDir("opt-mini"), tmp_.path() + "/bad", nullptr, bad);
    EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument) << q.status().ToString();
  }
  model::QuantizeOptions three;
  three.bits = 3;
  EXPECT_EQ(model::QuantizeCheckpoint(ModelDir("opt-mini"), tmp_.path() + "/b3", nullptr, three)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(tmp_.path() + "/bad"));
}

TEST_F(Int4CheckpointTest, DeviceAndDejaVuAreRefused) {
  const std::string out = tmp_.path() + "/int4";
  ASSERT_TRUE(model::QuantizeCheckpoint(ModelDir("opt-mini"), out, nullptr, Bits4()).ok());
  auto sim = test_util::MakeSimDeviceBackend(size_t{256} << 20);
  model::LoadOptions o;
  o.kv_memory_bytes = 16 << 20;
  auto dev = model::LoadModel(out, sim.get(), nullptr, o);
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dev.status().message().find("int4 runs on the CPU"), std::string::npos)
      << dev.status().ToString();
  auto cpu = Load(backend_.get(), out, std::nullopt);
  ASSERT_TRUE(cpu.ok());
  model::SparsityOptions s;
  s.oracle_fraction = 0.5f;
  Status st = (*cpu)->EnableSparsity(s);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("int4"), std::string::npos) << st.ToString();
}

TEST_F(Int4CheckpointTest, MalformedInt4TensorsAreRefusedByName) {
  const std::string q = tmp_.path() + "/q";
  ASSERT_TRUE(model::QuantizeCheckpoint(ModelDir("opt-mini"), q, nullptr, Bits4(128, 1.0)).ok());
  const std::string fc1 = "model.decoder.layers.1.fc1.weight";
  using Tensors = std::vector<std::pair<std::string, TensorView>>;
  std::vector<Tensor> keep;
  auto replace = [&](Tensors* t, const std::string& name, DType dtype, Shape shape) {
    for (auto& p : *t) {
      if (p.first != name) continue;
      Tensor b = Tensor::Zeros(dtype, shape);
      p.second = b.view();
      keep.push_back(std::move(b));
    }
  };
  struct Case {
    const char* name;
    std::function<void(Tensors*)> edit;
    const char* message;
  };
  const Case cases[] = {
      {"missing scale",
       [&](Tensors* t) {
         std::erase_if(*t, [&](const auto& p) { return p.first == fc1 + ".scale"; });
       },
       "int4 tensor 'model.decoder.layers.1.fc1.weight' has no"},
      {"scale of one column",
       [&](Tensors* t) { replace(t, fc1 + ".scale", DType::kF32, Shape{1024}); },
       "fc1.weight.scale' has shape [1024]"},
      {"21 groups",
       [&](Tensors* t) {
         // 256 columns in 21 groups do not divide: [1024, 21] is refused.
         replace(t, fc1 + ".scale", DType::kF32, Shape{1024, 21});
       },
       "groups of a multiple of 8 columns"},
      {"scale not f32",
       [&](Tensors* t) { replace(t, fc1 + ".scale", DType::kF16, Shape{1024, 2}); },
       "must be F32"},
      {"infinite scale",
       [&](Tensors* t) {
         for (auto& p : *t)
           if (p.first == fc1 + ".scale")
             static_cast<float*>(p.second.data)[7] = std::numeric_limits<float>::infinity();
       },
       "scales are finite"},
      {"packed of the wrong width",
       [&](Tensors* t) { replace(t, fc1, DType::kU8, Shape{1024, 64}); },
       "fc1.weight"},
      {"u8 bias",
       [&](Tensors* t) { replace(t, "model.decoder.layers.0.fc1.bias", DType::kU8, Shape{1024}); },
       "only matrices may be quantized"},
      {"int4 embedding",
       [&](Tensors* t) {
         replace(t, "model.decoder.embed_tokens.weight", DType::kU8, Shape{8192, 128});
         replace(t, "model.decoder.embed_tokens.weight.scale", DType::kF32, Shape{8192, 2});
       },
       "int4 is for the layers' matrices"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = tmp_.path() + "/bad" + std::to_string(i++);
    test_util::RewriteCheckpoint(q, dir, c.edit, &keep);
    auto m = Load(backend_.get(), dir, std::nullopt);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status().ToString();
    EXPECT_NE(m.status().message().find(c.message), std::string::npos) << m.status().ToString();
  }
}

}  // namespace
}  // namespace deja::worker
