// Deja Vu on device backends (the simulated device here; CUDA where present), against the CPU:
//  - with every unit selected, the sparse path (gather decode, masked prefill) equals the dense
//    model on the same device;
//  - the oracle at 0.5 (its selection does not depend on the arithmetic) gives the CPU's logits
//    and active fractions at batch 1 (gather kernels, transposed out/fc2 on the device) and at
//    batch 3 (the union, masked by MaskUnits above the dense fallback);
//  - with the committed predictors (run on the device: Linear, TopK there, only the ids back)
//    the CPU's logits and fractions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "tests/comm/sparse_trace.h"
#include "tests/common/sim_device.h"
#include "tests/worker/golden_util.h"
#include "worker/model/model.h"

namespace deja::worker {
namespace {

std::string MiniDir() { return test_util::ModelDir("opt-mini"); }

using test_util::RelErr;
using test_util::Trace;

// 3 random sequences (or 1) prefilled together, then `steps` decode steps.
StatusOr<Trace> RunTrace(model::Model& model, int batch, int32_t steps, bool sparse) {
  return test_util::RunTrace(
      model, test_util::RandomSequences(batch, static_cast<int32_t>(model.config().vocab_size), 21),
      steps, sparse);
}

model::SparsityOptions Oracle(float fraction) {
  model::SparsityOptions o;
  o.oracle_fraction = fraction;
  return o;
}

class SparseDeviceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = test_util::MakeTestBackend(GetParam());
    if (!b.ok()) GTEST_SKIP() << GetParam() << ": " << b.status().ToString();
    device_ = std::move(*b);
    cpu_ = kernels::MakeCpuBackend(2);
  }

  // The device loads f32 weights where it can (ExactWeightDType); the CPU keeps the checkpoint's.
  std::unique_ptr<model::Model> Load(kernels::Backend* backend) {
    model::LoadOptions o;
    o.kv_memory_bytes = 8 << 20;  // devices: a small pool leaves room for the transposes
    if (backend == device_.get()) o.weight_dtype = test_util::ExactWeightDType(GetParam());
    auto m = model::LoadModel(MiniDir(), backend, nullptr, o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }

  // The device's trace and the CPU's, both sparse with `options`.
  void ExpectMatchesCpu(const model::SparsityOptions& options, int batch, double tol) {
    auto dev = Load(device_.get());
    auto cpu = Load(cpu_.get());
    ASSERT_TRUE(dev && cpu);
    ASSERT_TRUE(dev->EnableSparsity(options).ok());
    ASSERT_TRUE(cpu->EnableSparsity(options).ok());
    auto want = RunTrace(*cpu, batch, 5, true);
    auto got = RunTrace(*dev, batch, 5, true);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_LE(RelErr(*got, *want), tol) << "batch " << batch;
    EXPECT_EQ(got->neuron_fraction, want->neuron_fraction) << "batch " << batch;
    EXPECT_EQ(got->head_fraction, want->head_fraction) << "batch " << batch;
    bool sparse = false;
    for (float f : got->neuron_fraction) sparse |= f < 1.0f;
    EXPECT_TRUE(sparse) << "no step ran sparse";
    // Not the dense model: the check can fail.
    auto dense = RunTrace(*cpu, batch, 5, false);
    ASSERT_TRUE(dense.ok());
    EXPECT_GT(RelErr(*got, *dense), 1e-3);
  }

  std::unique_ptr<kernels::Backend> device_, cpu_;
};

TEST_P(SparseDeviceTest, EverythingSelectedEqualsDense) {
  auto model = Load(device_.get());
  ASSERT_NE(model, nullptr);
  auto dense = RunTrace(*model, 3, 5, false);
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  model::SparsityOptions all = Oracle(1.0f);
  all.dense_fallback = 1.0f;  // the gather kernels even with every unit selected
  all.dense_layers = 0;
  ASSERT_TRUE(model->EnableSparsity(all).ok());
  for (int batch : {1, 3}) {
    auto dense_b = RunTrace(*model, batch, 5, false);
    auto sparse = RunTrace(*model, batch, 5, true);
    ASSERT_TRUE(dense_b.ok() && sparse.ok()) << sparse.status().ToString();
    EXPECT_LE(RelErr(*sparse, *dense_b), 1e-4) << "batch " << batch;
    for (float f : sparse->neuron_fraction) EXPECT_FLOAT_EQ(f, 1.0f);
  }
}

TEST_P(SparseDeviceTest, OracleMatchesCpu) {
  // Batch 1: gather kernels; batch 3: the union of three half sets (~7/8) passes the dense
  // fallback, so the dense kernels run masked.
  for (int batch : {1, 3}) ExpectMatchesCpu(Oracle(0.5f), batch, 1e-4);
}

TEST_P(SparseDeviceTest, PredictorsMatchCpu) {
  const std::string predictors = MiniDir() + "/predictors.safetensors";
  if (!std::filesystem::exists(predictors)) GTEST_SKIP() << "no " << predictors;
  model::SparsityOptions o;
  o.predictors = predictors;
  // The simulated device computes with the CPU backend's kernels: the same scores, so the same
  // selection. A GPU's summation order may flip a near tie in the top-k: looser there.
  ExpectMatchesCpu(o, 1, GetParam() == "sim" ? 1e-4 : 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Devices, SparseDeviceTest, ::testing::Values("sim", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace deja::worker
