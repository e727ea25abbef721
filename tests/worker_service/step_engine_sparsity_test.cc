// StepEngine and Deja Vu (TP 1, in process): SequenceConfig.sparse is FAILED_PRECONDITION on a
// model without sparsity and an unknown schedule INVALID_ARGUMENT, each naming the field and
// changing nothing; with oracle sparsity (fraction 0.5) a sparse sequence prefills and decodes
// with active fractions below 1 in its StepResponse, while a dense sequence on the same engine
// still gives model::Generate's tokens and reports fractions of 1.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/comm/tp_util.h"
#include "tests/worker_service/step_util.h"
#include "worker/service/step_engine.h"

namespace deja::worker::service {
namespace {

using deja::v1::StepRequest;
using deja::v1::StepResponse;
using test_util::FirstChunk;
using test_util::NextChunk;

constexpr int32_t kNewTokens = 6;

class StepEngineSparsityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = kernels::MakeCpuBackend(1);
    auto m = model::LoadModel(test_util::ModelDir(test_util::TpModelName()), backend_.get());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
    prompts_ = test_util::TpPrompts(test_util::LoadGolden(test_util::TpModelName()));
    ASSERT_GE(prompts_.size(), 1u);
  }
  void MakeEngine() {
    auto engine = StepEngine::Create(model_.get(), 64ull << 20);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    ASSERT_TRUE(engine_->WarmUp().ok());
  }
  StepResponse Run(const StepRequest& req) {
    StepResponse resp;
    Status fatal = engine_->Run(req, &resp);
    EXPECT_TRUE(fatal.ok()) << fatal.ToString();
    return resp;
  }
  static deja::v1::SequenceWork Sparse(uint64_t id, const std::vector<int32_t>& p,
                                       const std::string& schedule) {
    deja::v1::SequenceWork w = FirstChunk(id, p, p.size(), kNewTokens);
    w.mutable_config()->set_sparse(true);
    w.mutable_config()->set_sparsity_schedule(schedule);
    return w;
  }
  // Runs `first`, then feeds back sampled tokens until kNewTokens; every response is checked
  // and handed to `check`.
  std::vector<int32_t> Decode(const deja::v1::SequenceWork& first,
                              const std::function<void(const StepResponse&)>& check) {
    StepRequest req;
    req.set_step_id(1);
    *req.add_sequences() = first;
    uint32_t len = static_cast<uint32_t>(first.tokens_size());
    std::vector<int32_t> out;
    for (int32_t i = 0; i < kNewTokens; ++i) {
      StepResponse resp = Run(req);
      EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
      if (resp.error_code() != 0 || resp.results_size() != 1) break;
      check(resp);
      out.push_back(resp.results(0).token_id());
      req.Clear();
      req.set_step_id(resp.step_id() + 1);
      *req.add_sequences() = NextChunk(first.seq_id(), {out.back()}, len++, true);
    }
    StepRequest release;
    release.set_step_id(req.step_id());
    release.add_release_seq_ids(first.seq_id());
    Run(release);
    return out;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<StepEngine> engine_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(StepEngineSparsityTest, SparseIsRefusedWithoutSparsityAndDenseStepsReportOne) {
  MakeEngine();
  const std::vector<int32_t>& p = prompts_.front();
  const deja::v1::KvUsage before = engine_->Usage();
  StepRequest req;
  req.set_step_id(1);
  *req.add_sequences() = Sparse(1, p, "");
  StepResponse r = Run(req);
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_EQ(r.results(0).error_code(), static_cast<int>(StatusCode::kFailedPrecondition))
      << r.results(0).error_message();
  EXPECT_NE(r.results(0).error_message().find("config.sparse"), std::string::npos)
      << r.results(0).error_message();
  EXPECT_FALSE(r.fatal());
  EXPECT_FALSE(r.has_sparsity());
  EXPECT_EQ(r.kv().free_bytes(), before.free_bytes());
  EXPECT_EQ(r.kv().sequences(), 0u);
  // Dense work goes on, and reports that it computed everything.
  const std::vector<int32_t> tokens =
      Decode(FirstChunk(2, p, p.size(), kNewTokens), [](const StepResponse& resp) {
        ASSERT_TRUE(resp.has_sparsity());
        EXPECT_EQ(resp.sparsity().active_head_fraction(), 1.0f);
        EXPECT_EQ(resp.sparsity().active_neuron_fraction(), 1.0f);
        EXPECT_EQ(resp.sparsity().sparse_sequences(), 0u);
        EXPECT_EQ(resp.sparsity().dense_sequences(), 1u);
      });
  EXPECT_EQ(tokens, test_util::ReferenceGreedy(*model_, p, kNewTokens));
}

TEST_F(StepEngineSparsityTest, OracleSparsityRunsSparseSequencesAndKeepsDenseOnesExact) {
  // The dense reference first, before sparsity is enabled on the model.
  const std::vector<int32_t>& p = prompts_.front();
  const std::vector<int32_t> reference = test_util::ReferenceGreedy(*model_, p, kNewTokens);
  model::SparsityOptions so;
  so.oracle_fraction = 0.5f;
  ASSERT_TRUE(model_->EnableSparsity(so).ok());
  ASSERT_TRUE(model_->sparsity_enabled());
  MakeEngine();

  // An unknown schedule changes nothing.
  StepRequest bad;
  bad.set_step_id(1);
  *bad.add_sequences() = Sparse(1, p, "fast");
  StepResponse r = Run(bad);
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_EQ(r.results(0).error_code(), static_cast<int>(StatusCode::kInvalidArgument))
      << r.results(0).error_message();
  EXPECT_NE(r.results(0).error_message().find("config.sparsity_schedule"), std::string::npos)
      << r.results(0).error_message();
  EXPECT_EQ(r.kv().sequences(), 0u);

  for (const char* schedule : {"", "default"}) {
    int steps = 0;
    const std::vector<int32_t> sparse =
        Decode(Sparse(3, p, schedule), [&](const StepResponse& resp) {
          ASSERT_TRUE(resp.has_sparsity());
          EXPECT_EQ(resp.sparsity().sparse_sequences(), 1u);
          EXPECT_EQ(resp.sparsity().dense_sequences(), 0u);
          EXPECT_GT(resp.sparsity().active_head_fraction(), 0.0f);
          EXPECT_GT(resp.sparsity().active_neuron_fraction(), 0.0f);
          // A decode step has one row: the oracle's half of the units in its sparse layers.
          if (steps++ > 0) {
            EXPECT_LT(resp.sparsity().active_head_fraction(), 1.0f);
            EXPECT_LT(resp.sparsity().active_neuron_fraction(), 1.0f);
          }
        });
    EXPECT_EQ(sparse.size(), static_cast<size_t>(kNewTokens)) << schedule;
  }

  // A dense sequence on the same engine: exact, and reported dense.
  const std::vector<int32_t> dense =
      Decode(FirstChunk(4, p, p.size(), kNewTokens), [](const StepResponse& resp) {
        ASSERT_TRUE(resp.has_sparsity());
        EXPECT_EQ(resp.sparsity().sparse_sequences(), 0u);
        EXPECT_EQ(resp.sparsity().active_head_fraction(), 1.0f);
        EXPECT_EQ(resp.sparsity().active_neuron_fraction(), 1.0f);
      });
  EXPECT_EQ(dense, reference);

  // Both kinds in one step: each is counted.
  StepRequest mixed;
  mixed.set_step_id(100);
  *mixed.add_sequences() = Sparse(5, p, "");
  *mixed.add_sequences() = FirstChunk(6, p, p.size(), kNewTokens);
  r = Run(mixed);
  EXPECT_EQ(r.error_code(), 0) << r.error_message();
  ASSERT_TRUE(r.has_sparsity());
  EXPECT_EQ(r.sparsity().sparse_sequences(), 1u);
  EXPECT_EQ(r.sparsity().dense_sequences(), 1u);
}

}  // namespace
}  // namespace deja::worker::service
