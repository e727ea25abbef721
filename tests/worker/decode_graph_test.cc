// Decode steps as captured op graphs (worker/model/opt_model_graph.cc). The invariant: a replayed
// step gives exactly the tokens and log-probabilities of the same step run eagerly, whatever was
// captured before it (other sequences, lengths, block tables, batch sizes), because nothing that
// changes from step to step is baked into the capture. Checked over mixed batches (full, window
// and h2o caches evicting and decaying inside the graph, sequences joining and leaving, block
// tables growing, a prefill reallocating the workspace between replays) against the same program run eagerly (bit for bit) and against the
// model without graphs (bit for bit on the simulated device, whose ops are the same; 1e-5 on CUDA,
// where cuBLAS may choose another kernel for the padded batch).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "tests/common/sim_device.h"
#include "tests/worker/golden_util.h"
#include "tests/worker/h2o_reference.h"
#include "worker/model/model.h"

namespace deja::worker {
namespace {

using test_util::ModelDir;

class DecodeGraphTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cpu") GTEST_SKIP() << "host backends run ops as they are called: no graphs";
    auto b = test_util::MakeTestBackend(GetParam());
    if (!b.ok()) GTEST_SKIP() << GetParam() << ": " << b.status().ToString();
    backend_ = std::move(*b);
  }

  std::unique_ptr<model::Model> Load(bool graphs, bool replay) {
    model::LoadOptions options;
    if (GetParam() == "cuda") options.kv_memory_bytes = 256ll << 20;
    options.weight_dtype = test_util::ExactWeightDType(GetParam());
    options.decode_graphs = graphs;
    options.decode_graph_replay = replay;
    auto m = model::LoadModel(ModelDir("opt-mini"), backend_.get(), nullptr, options);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }

  std::unique_ptr<kernels::Backend> backend_;
};

TEST_P(DecodeGraphTest, ReplayEqualsEagerOverMixedBatches) {
  // replayed: graphs captured and replayed; eager: the same program never captured; plain: the
  // batched decode path without graphs.
  std::unique_ptr<model::Model> models[3] = {Load(true, true), Load(true, false),
                                             Load(false, true)};
  for (const auto& m : models) ASSERT_NE(m, nullptr);
  std::vector<kv::CachePolicyConfig> policies(6);
  policies[1].kind = kv::CachePolicyKind::kH2O;  // decays every step, evicts from about step 20
  policies[1].heavy_tokens = 30;
  policies[1].recent_tokens = 35;
  policies[1].h2o_decay = 0.7f;
  policies[3].kind = kv::CachePolicyKind::kWindow;  // evicts from about step 14 on
  policies[3].heavy_tokens = 0;
  policies[3].recent_tokens = 64;
  policies[4].kind = kv::CachePolicyKind::kH2O;  // evicts from about step 10 on
  policies[4].heavy_tokens = 20;
  policies[4].recent_tokens = 20;
  const int lengths[6] = {10, 45, 90, 50, 30, 100};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(RandomPrompt(lengths[i], 70 + i));
  std::vector<std::unique_ptr<kv::SequenceKv>> seqs[3];
  for (int m = 0; m < 3; ++m) {
    for (int i = 0; i < 6; ++i) {
      const int32_t n = lengths[i];
      auto kv = models[m]->NewSequence(200, policies[i], n, n);
      ASSERT_TRUE(kv.ok()) << kv.status().ToString();
      seqs[m].push_back(std::move(*kv));
    }
  }
  model::StepResult results[3];
  auto prefill = [&](int i) {
    for (int m = 0; m < 3; ++m) {
      model::SequenceStep s{seqs[m][i].get(), prompts[i].data(), lengths[i], false, false, false};
      ASSERT_TRUE(models[m]->Forward({s}, &results[m]).ok());
    }
  };
  for (int i = 0; i < 5; ++i) prefill(i);
  // Batches of 5, then 6 (sequence 5 joins at step 8 after a 100-token prefill, which regrows the
  // workspace the graphs point at), then 5 (sequence 0 leaves after step 20): padded to 8 each
  // time; sequence 1 leaves at step 30 (4 sequences, padded to 4).
  std::vector<int> running = {0, 1, 2, 3, 4};
  int64_t captures_before_join = 0;
  for (int step = 0; step < 40; ++step) {
    if (step == 8) {
      captures_before_join = models[0]->graph_stats().captures;
      prefill(5);
      running.push_back(5);
    }
    if (step == 21) running.erase(running.begin());
    if (step == 30) running.erase(running.begin());
    std::vector<model::SequenceStep> batch[3];
    for (int i : running) {
      prompts[i].push_back(static_cast<int32_t>(100 + 7 * step + 13 * i));
      for (int m = 0; m < 3; ++m) {
        batch[m].push_back({seqs[m][i].get(), &prompts[i].back(), 1, false, false, false});
      }
    }
    for (int m = 0; m < 3; ++m) {
      const Status st = models[m]->Forward(batch[m], &results[m]);
      ASSERT_TRUE(st.ok()) << "model " << m << " step " << step << ": " << st.ToString();
    }
    const model::StepResult& got = results[0];
    ASSERT_EQ(got.top_k, results[1].top_k);
    ASSERT_EQ(got.top_ids.size(), running.size() * got.top_k);
    for (int m = 1; m < 3; ++m) {
      const model::StepResult& want = results[m];
      ASSERT_EQ(got.top_ids, want.top_ids) << "model " << m << " step " << step;
      if (m == 1 || GetParam() == "sim") {
        ASSERT_EQ(0, std::memcmp(got.top_logprobs.data(), want.top_logprobs.data(),
                                 got.top_logprobs.size() * sizeof(float)))
            << "model " << m << " step " << step;
      } else {
        for (size_t j = 0; j < got.top_logprobs.size(); ++j) {
          ASSERT_NEAR(got.top_logprobs[j], want.top_logprobs[j],
                      1e-5 * (1 + std::fabs(want.top_logprobs[j])))
              << "step " << step << " candidate " << j;
        }
      }
    }
  }
  const model::Model::GraphStats replayed = models[0]->graph_stats();
  const model::Model::GraphStats eager = models[1]->graph_stats();
  const model::Model::GraphStats plain = models[2]->graph_stats();
  EXPECT_EQ(replayed.capture_failures, 0);
  EXPECT_GE(replayed.replays, 8);
  // The join's prefill regrew the workspace: the batch of 8 was captured again after it.
  EXPECT_GT(replayed.captures, captures_before_join);
  EXPECT_GT(captures_before_join, 0);
  // Every step ran the graph form, evicting or not: a shape's first run is eager, its second is
  // captured, the rest replay.
  EXPECT_EQ(replayed.replays, 40 - replayed.eager);
  EXPECT_GE(replayed.replays, 30);
  EXPECT_EQ(eager.captures + eager.replays, 0);
  EXPECT_GT(eager.eager, 8);
  EXPECT_EQ(plain.captures + plain.replays + plain.eager, 0);
  for (int i : {1, 3, 4}) {
    EXPECT_GT(seqs[0][i]->evictions(), 0) << i;
    EXPECT_EQ(seqs[0][i]->evictions(), seqs[2][i]->evictions()) << i;
  }
}

// One request never changes another's answer: with graphs on, a sequence decoded beside others
// (batches padded to 8, other block-table widths, other sequences evicting in the same graph) gets
// the tokens and log-probabilities it gets alone (padded to 1): bit for bit on the simulated
// device, within 1e-5 on CUDA.
TEST_P(DecodeGraphTest, AnswersDoNotDependOnTheBatch) {
  std::unique_ptr<model::Model> model = Load(true, true);
  ASSERT_NE(model, nullptr);
  std::vector<kv::CachePolicyConfig> policies(5);
  policies[1].kind = kv::CachePolicyKind::kH2O;
  policies[1].heavy_tokens = 12;
  policies[1].recent_tokens = 12;
  policies[2].kind = kv::CachePolicyKind::kWindow;
  policies[2].heavy_tokens = 0;
  policies[2].recent_tokens = 40;
  policies[3].kind = kv::CachePolicyKind::kH2O;
  policies[3].heavy_tokens = 8;
  policies[3].recent_tokens = 8;
  policies[3].h2o_decay = 0.8f;
  const int lengths[5] = {20, 33, 70, 41, 100};
  constexpr int kSteps = 24;
  // tops[alone?][sequence][step]: the step's top candidates' ids and log-probabilities.
  std::vector<std::vector<std::vector<int32_t>>> ids(2, std::vector<std::vector<int32_t>>(5));
  std::vector<std::vector<std::vector<float>>> lps(2, std::vector<std::vector<float>>(5));
  for (int together = 0; together < 2; ++together) {
    std::vector<std::unique_ptr<kv::SequenceKv>> seqs;
    std::vector<std::vector<int32_t>> prompts;
    model::StepResult r;
    for (int i = 0; i < 5; ++i) {
      prompts.push_back(RandomPrompt(lengths[i], 90 + i));
      auto kv = model->NewSequence(200, policies[i], lengths[i], lengths[i]);
      ASSERT_TRUE(kv.ok()) << kv.status().ToString();
      seqs.push_back(std::move(*kv));
      model::SequenceStep s{seqs[i].get(), prompts[i].data(), lengths[i], false, false, false};
      ASSERT_TRUE(model->Forward({s}, &r).ok());
    }
    // Alone: each sequence's steps in turn. Together: all five each step.
    const int rounds = together ? 1 : 5;
    for (int round = 0; round < rounds; ++round) {
      for (int step = 0; step < kSteps; ++step) {
        std::vector<int> members;
        if (together) {
          members = {0, 1, 2, 3, 4};
        } else {
          members = {round};
        }
        std::vector<model::SequenceStep> batch;
        for (int i : members) {
          prompts[i].push_back(static_cast<int32_t>(200 + 11 * step + 17 * i));
          batch.push_back({seqs[i].get(), &prompts[i].back(), 1, false, false, false});
        }
        ASSERT_TRUE(model->Forward(batch, &r).ok());
        for (size_t j = 0; j < members.size(); ++j) {
          const int i = members[j];
          ids[together][i].insert(ids[together][i].end(), r.top_ids.begin() + j * r.top_k,
                                  r.top_ids.begin() + (j + 1) * r.top_k);
          lps[together][i].insert(lps[together][i].end(), r.top_logprobs.begin() + j * r.top_k,
                                  r.top_logprobs.begin() + (j + 1) * r.top_k);
        }
      }
    }
  }
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(ids[0][i], ids[1][i]) << "sequence " << i;
    if (GetParam() == "sim") {
      EXPECT_EQ(lps[0][i], lps[1][i]) << "sequence " << i;
    } else {
      for (size_t j = 0; j < lps[0][i].size(); ++j) {
        ASSERT_NEAR(lps[1][i][j], lps[0][i][j], 1e-5 * (1 + std::fabs(lps[0][i][j])))
            << "sequence " << i << " candidate " << j;
      }
    }
  }
  EXPECT_GT(model->graph_stats().replays, 3 * kSteps);
}

// A replay reads the memory its ops point at as it is at replay time; an op given a host index
// array cannot be captured (its array would be staged once, at capture) and fails the capture.
TEST_P(DecodeGraphTest, CaptureRecordsPointersAndRefusesHostArrays) {
  ASSERT_TRUE(backend_->SupportsGraphs());
  const int64_t n = 300;
  std::vector<float> ones(n, 1.0f), host(n);
  auto x = backend_->ToBackend(TensorView{ones.data(), DType::kF32, Shape{1, n}});
  auto out = backend_->ToBackend(TensorView{ones.data(), DType::kF32, Shape{1, n}});
  ASSERT_TRUE(x.ok() && out.ok());
  ASSERT_TRUE(backend_->BeginCapture().ok());
  ASSERT_TRUE(kernels::Add(*backend_, x->view(), {}, out->view()).ok());  // out += x
  auto graph = backend_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  // Nothing ran during the capture: out is still 1.
  ASSERT_TRUE(backend_->CopyDeviceToHost(host.data(), out->data(), n * sizeof(float)).ok());
  EXPECT_EQ(host[7], 1.0f);
  std::vector<float> threes(n, 3.0f);
  ASSERT_TRUE(backend_->CopyHostToDevice(x->data(), threes.data(), n * sizeof(float)).ok());
  ASSERT_TRUE(backend_->Replay(**graph).ok());
  ASSERT_TRUE(backend_->Replay(**graph).ok());
  ASSERT_TRUE(backend_->CopyDeviceToHost(host.data(), out->data(), n * sizeof(float)).ok());
  EXPECT_EQ(host[0], 7.0f);
  EXPECT_EQ(host[n - 1], 7.0f);

  if (GetParam() != "sim") return;  // what CUDA refuses mid-capture is its runtime's to say
  std::vector<float> table_host(4 * n, 0.5f);
  auto table = backend_->ToBackend(TensorView{table_host.data(), DType::kF32, Shape{4, n}});
  ASSERT_TRUE(table.ok());
  const int32_t ids[1] = {2};
  ASSERT_TRUE(backend_->BeginCapture().ok());
  const Status staged = kernels::Embedding(*backend_, table->view(), ids, 1, false, out->view());
  EXPECT_EQ(staged.code(), StatusCode::kFailedPrecondition) << staged.ToString();
  auto refused = backend_->EndCapture();
  EXPECT_FALSE(refused.ok());
  ASSERT_TRUE(backend_->BeginCapture().ok());
  EXPECT_FALSE(backend_->CopyHostToDevice(x->data(), threes.data(), 4).ok());
  EXPECT_FALSE(backend_->EndCapture().ok());
  // The device-resident form captures.
  auto dev_ids = backend_->ToBackend(TensorView{const_cast<int32_t*>(ids), DType::kI32, Shape{1}});
  ASSERT_TRUE(dev_ids.ok());
  ASSERT_TRUE(backend_->BeginCapture().ok());
  ASSERT_TRUE(
      kernels::EmbeddingDeviceIds(*backend_, table->view(), dev_ids->view(), false, out->view())
          .ok());
  auto embedded = backend_->EndCapture();
  ASSERT_TRUE(embedded.ok()) << embedded.status().ToString();
  ASSERT_TRUE(backend_->Replay(**embedded).ok());
  ASSERT_TRUE(backend_->CopyDeviceToHost(host.data(), out->data(), n * sizeof(float)).ok());
  EXPECT_EQ(host[5], 0.5f);
}

INSTANTIATE_TEST_SUITE_P(Devices, DecodeGraphTest, ::testing::ValuesIn(test_util::TestDevices()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace deja::worker
