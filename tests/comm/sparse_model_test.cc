// Deja Vu at the model level (worker/sparse_runtime.h) on models/opt-mini:
//  - with every unit selected, the sparse kernels' path (gather decode, masked prefill) equals
//    the dense model within fp32 tolerance;
//  - the oracle keeps the fraction asked for, per layer, and changes the output;
//  - a batch computes the union of its rows' sets, with the dense kernels above the threshold;
//  - TP=2 sparse (threads over the in-process communicator) equals TP=1 sparse with the same
//    selection groups;
//  - with the committed predictors: decoding token by token (gather kernels) gives the same
//    logits as evaluating the whole window at once (masked per-token sparsity), and both differ
//    from dense;
//  - with H2O, a head skipped for a token still appends its K/V and keeps its scores, within
//    the budget;
//  - bad options are InvalidArgument naming the option.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "tests/comm/sparse_trace.h"
#include "tests/worker/golden_util.h"
#include "worker/comm/in_process_communicator.h"
#include "worker/model/model.h"

namespace deja::worker {
namespace {

using namespace std::chrono_literals;

constexpr double kRelTol = 1e-4;

std::string MiniDir() { return test_util::ModelDir("opt-mini"); }

using test_util::RandomSequences;
using test_util::RelErr;
using test_util::RunTrace;
using test_util::Trace;

std::unique_ptr<model::Model> LoadMini(kernels::Backend* backend) {
  auto m = model::LoadModel(MiniDir(), backend);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

model::SparsityOptions Oracle(float fraction) {
  model::SparsityOptions o;
  o.oracle_fraction = fraction;
  return o;
}

TEST(SparseModelTest, EverythingSelectedEqualsDense) {
  auto backend = kernels::MakeCpuBackend(2);
  auto model = LoadMini(backend.get());
  ASSERT_NE(model, nullptr);
  auto seqs = RandomSequences(3, static_cast<int32_t>(model->config().vocab_size), 11);
  auto dense = RunTrace(*model, seqs, 6, false);
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  model::SparsityOptions all = Oracle(1.0f);
  all.dense_fallback = 1.0f;  // run the gather kernels even with every unit selected
  all.dense_layers = 0;
  ASSERT_TRUE(model->EnableSparsity(all).ok());
  auto sparse = RunTrace(*model, seqs, 6, true);
  ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
  EXPECT_LE(RelErr(*sparse, *dense), kRelTol);
  for (float f : sparse->neuron_fraction) EXPECT_FLOAT_EQ(f, 1.0f);
  // Dense steps of a sparsity-enabled model are the dense model.
  auto dense_again = RunTrace(*model, seqs, 6, false);
  ASSERT_TRUE(dense_again.ok());
  EXPECT_EQ(RelErr(*dense_again, *dense), 0.0);
}

TEST(SparseModelTest, OracleKeepsTheFractionAskedFor) {
  auto backend = kernels::MakeCpuBackend(2);
  auto model = LoadMini(backend.get());
  ASSERT_NE(model, nullptr);
  auto seqs = RandomSequences(1, static_cast<int32_t>(model->config().vocab_size), 12);
  auto dense = RunTrace(*model, seqs, 4, false);
  ASSERT_TRUE(dense.ok());
  ASSERT_TRUE(model->EnableSparsity(Oracle(0.5f)).ok());
  auto sparse = RunTrace(*model, seqs, 4, true);
  ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
  const int layers = static_cast<int>(model->config().num_hidden_layers);
  // Every step: half the neurons of every layer; half the heads of layers 1.., all of layer 0.
  for (size_t s = 0; s < sparse->neuron_fraction.size(); ++s) {
    EXPECT_FLOAT_EQ(sparse->neuron_fraction[s], 0.5f) << "step " << s;
    EXPECT_FLOAT_EQ(sparse->head_fraction[s], (1.0f + 0.5f * (layers - 1)) / layers) << s;
  }
  EXPECT_GT(RelErr(*sparse, *dense), 1e-3) << "skipping half the units changed nothing";
}

// Deja Vu with H2O (docs/architecture.md#deja-vu-with-h2o): an H2O sequence's scores sum every
// head's attention, so under sparsity it skips MLP neurons but never heads (which heads attend
// would otherwise depend on the batch's block plan): every head appends the token's K/V, every
// head's scores move every step, eviction keeps every head within its budget, and the MLP still
// runs half its neurons. Oracle at 0.5.
TEST(SparseModelTest, H2OSequencesKeepEveryHeadAndSkipNeurons) {
  auto backend = kernels::MakeCpuBackend(1);
  auto model = LoadMini(backend.get());
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->EnableSparsity(Oracle(0.5f)).ok());
  const int32_t heavy = 4, recent = 4, prompt = 16, steps = 24;
  kv::CachePolicyConfig h2o;
  h2o.kind = kv::CachePolicyKind::kH2O;
  h2o.heavy_tokens = heavy;
  h2o.recent_tokens = recent;
  auto kv_or = model->NewSequence(prompt + steps, h2o, prompt, prompt);
  ASSERT_TRUE(kv_or.ok()) << kv_or.status().ToString();
  kv::SequenceKv& kv = **kv_or;
  const kv::KvGeometry g = kv.geometry();
  auto seqs = RandomSequences(1, static_cast<int32_t>(model->config().vocab_size), 21);
  model::StepResult out;
  ASSERT_TRUE(model->Forward({{&kv, seqs[0].data(), prompt, false, false}}, &out).ok());
  int skipped_total = 0;
  for (int32_t s = 0; s < steps; ++s) {
    // Each head's scores by position before the step.
    std::vector<std::map<int32_t, float>> before(static_cast<size_t>(g.layers) * g.heads);
    // And every slot's K as it was (a reused slot still holds an evicted token's K).
    std::vector<std::vector<float>> k_before(g.layers);
    for (int32_t l = 0; l < g.layers; ++l) {
      const kernels::KvView v = kv.View(l);
      const size_t k_elems = static_cast<size_t>(g.heads) * v.capacity * g.head_dim;
      for (size_t i = 0; i < k_elems; ++i) k_before[l].push_back(LoadAsFloat(v.k, v.dtype, i));
      for (int32_t h = 0; h < g.heads; ++h) {
        for (int32_t slot = 0; slot < v.used; ++slot) {
          const int32_t pos = v.slot_pos[h * v.capacity + slot];
          if (pos >= 0) before[l * g.heads + h][pos] = v.score[h * v.capacity + slot];
        }
      }
    }
    const int32_t new_pos = kv.length();
    const int32_t token = seqs[0][(prompt + s) % seqs[0].size()];
    ASSERT_TRUE(model->Forward({{&kv, &token, 1, false, true}}, &out).ok());
    for (int32_t l = 0; l < g.layers; ++l) {
      const kernels::KvView v = kv.View(l);
      int skipped = 0;
      for (int32_t h = 0; h < g.heads; ++h) {
        SCOPED_TRACE("step " + std::to_string(s) + " layer " + std::to_string(l) + " head " +
                     std::to_string(h));
        int occupied = 0;
        bool has_new = false, any_changed = false;
        float new_score = -1.f;
        for (int32_t slot = 0; slot < v.used; ++slot) {
          const int32_t pos = v.slot_pos[h * v.capacity + slot];
          if (pos < 0) continue;
          ++occupied;
          const float score = v.score[h * v.capacity + slot];
          if (pos == new_pos) {
            has_new = true;
            new_score = score;
            // Its K row was written this step (the exact rule): it differs from what the slot
            // held before (zeros, or an evicted token's K).
            const size_t row = (static_cast<size_t>(h) * v.capacity + slot) * g.head_dim;
            bool written = false;
            for (int32_t e = 0; e < g.head_dim; ++e) {
              written |= LoadAsFloat(v.k, v.dtype, row + e) != k_before[l][row + e];
            }
            EXPECT_TRUE(written) << "no K for the new token";
          } else {
            auto it = before[l * g.heads + h].find(pos);
            ASSERT_NE(it, before[l * g.heads + h].end())
                << "evicted position " << pos << " came back";
            any_changed |= score != it->second;
          }
        }
        EXPECT_LE(occupied, heavy + recent);
        EXPECT_TRUE(has_new) << "the new token is always among the recent ones";
        // Attended: the query's own probability lands on its slot, and the others' scores move.
        if (new_score == 0.f) ++skipped;
        EXPECT_GT(new_score, 0.f);
        EXPECT_TRUE(any_changed || occupied == 1) << "an attending head's scores did not move";
      }
      skipped_total += skipped;
    }
    EXPECT_EQ(out.active_head_fraction, 1.0f) << "step " << s;
    EXPECT_LT(out.active_neuron_fraction, 0.75f) << "step " << s;
  }
  EXPECT_EQ(skipped_total, 0);
  EXPECT_GT(kv.evictions(), 0);
}

TEST(SparseModelTest, BatchUsesTheUnionAndFallsBackToDense) {
  auto backend = kernels::MakeCpuBackend(2);
  auto model = LoadMini(backend.get());
  ASSERT_NE(model, nullptr);
  auto seqs = RandomSequences(4, static_cast<int32_t>(model->config().vocab_size), 13);
  model::SparsityOptions o = Oracle(0.25f);
  o.dense_fallback = 1.0f;
  ASSERT_TRUE(model->EnableSparsity(o).ok());
  auto unioned = RunTrace(*model, seqs, 3, true);
  ASSERT_TRUE(unioned.ok()) << unioned.status().ToString();
  // Decode steps (index >= 1): four independent 25% sets cover about 1 - 0.75^4 = 68%.
  for (size_t s = 1; s < unioned->neuron_fraction.size(); ++s) {
    EXPECT_GT(unioned->neuron_fraction[s], 0.5f);
    EXPECT_LT(unioned->neuron_fraction[s], 0.85f);
  }
  // Above the fallback fraction the dense kernels run, masked to the same union: same result.
  o.dense_fallback = 0.4f;
  ASSERT_TRUE(model->EnableSparsity(o).ok());
  auto fallback = RunTrace(*model, seqs, 3, true);
  ASSERT_TRUE(fallback.ok());
  EXPECT_LE(RelErr(*fallback, *unioned), kRelTol);
  EXPECT_EQ(fallback->neuron_fraction, unioned->neuron_fraction);
  auto dense = RunTrace(*model, seqs, 3, false);
  ASSERT_TRUE(dense.ok());
  EXPECT_GT(RelErr(*fallback, *dense), 1e-3);
}

// One TP=2 rank pair over threads, every rank running the same trace.
std::vector<StatusOr<Trace>> RunTp(const std::string& dir, int world,
                                   model::SparsityOptions options,
                                   const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<StatusOr<Trace>> traces(world, Internal("not run"));
  auto group = worker::comm::MakeInProcessGroup(world, 60s);
  EXPECT_TRUE(group.ok());
  if (!group.ok()) return traces;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto backend = kernels::MakeCpuBackend(1);
      auto model = model::LoadModel(dir, backend.get(), std::move((*group)[r]));
      if (!model.ok()) {
        traces[r] = model.status();
        return;
      }
      if (Status s = (*model)->EnableSparsity(options); !s.ok()) {
        traces[r] = s;
        return;
      }
      traces[r] = RunTrace(**model, seqs, 5, true);
    });
  }
  for (std::thread& t : threads) t.join();
  return traces;
}

TEST(SparseModelTest, Tp2SparseEqualsTp1Sparse) {
  auto backend = kernels::MakeCpuBackend(1);
  auto model = LoadMini(backend.get());
  ASSERT_NE(model, nullptr);
  auto seqs = RandomSequences(2, static_cast<int32_t>(model->config().vocab_size), 14);
  model::SparsityOptions o = Oracle(0.5f);
  o.dense_fallback = 1.0f;
  o.selection_groups = 2;  // TP=1 takes its top-k within the halves the two ranks hold
  ASSERT_TRUE(model->EnableSparsity(o).ok());
  auto tp1 = RunTrace(*model, seqs, 5, true);
  ASSERT_TRUE(tp1.ok()) << tp1.status().ToString();
  auto tp2 = RunTp(MiniDir(), 2, o, seqs);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(tp2[r].ok()) << r << ": " << tp2[r].status().ToString();
  EXPECT_LE(RelErr(*tp2[0], *tp1), kRelTol);
  // Each rank reports its own half; together they are TP=1's fractions.
  for (size_t s = 0; s < tp1->neuron_fraction.size(); ++s) {
    EXPECT_FLOAT_EQ((tp2[0]->neuron_fraction[s] + tp2[1]->neuron_fraction[s]) / 2,
                    tp1->neuron_fraction[s]);
    EXPECT_FLOAT_EQ((tp2[0]->head_fraction[s] + tp2[1]->head_fraction[s]) / 2,
                    tp1->head_fraction[s]);
  }
  // And it is not the dense model.
  auto dense_backend = kernels::MakeCpuBackend(1);
  auto dense_model = LoadMini(dense_backend.get());
  auto dense = RunTrace(*dense_model, seqs, 5, false);
  ASSERT_TRUE(dense.ok());
  EXPECT_GT(RelErr(*tp1, *dense), 1e-3);
}

TEST(SparseModelTest, PredictorsDecodeEqualsWholeWindow) {
  const std::string predictors = MiniDir() + "/predictors.safetensors";
  if (!std::filesystem::exists(predictors)) {
    GTEST_SKIP() << "no " << predictors << " (trained by deja-lab train-predictors)";
  }
  // Both places the predictors can run: their own thread and inline on the forward thread.
  for (auto where : {model::SparsityOptions::PredictorThread::kOwnThread,
                     model::SparsityOptions::PredictorThread::kInline}) {
    SCOPED_TRACE(where == model::SparsityOptions::PredictorThread::kInline ? "inline"
                                                                           : "own thread");
    // The reference backend computes each row independently of the batch, so the predictors see
    // bit-identical inputs in both runs and select the same units.
    auto backend = kernels::MakeReferenceBackend();
    auto model = LoadMini(backend.get());
    ASSERT_NE(model, nullptr);
    model::SparsityOptions o;
    o.predictors = predictors;
    o.predictor_thread = where;
    ASSERT_TRUE(model->EnableSparsity(o).ok());
    auto seqs = RandomSequences(1, static_cast<int32_t>(model->config().vocab_size), 15);
    std::vector<int32_t> window(seqs[0].begin(), seqs[0].begin() + 24);
    // Whole window at once: masked per-token sparsity, logits for every position.
    auto kv = model->NewSequence(24);
    ASSERT_TRUE(kv.ok());
    model::StepResult whole;
    ASSERT_TRUE(model->Forward({{kv->get(), window.data(), 24, true, true}}, &whole).ok());
    // Token by token: batch-1 decode steps through the gather kernels.
    auto kv2 = model->NewSequence(24);
    ASSERT_TRUE(kv2.ok());
    const int64_t vocab = model->config().vocab_size;
    double diff = 0, scale = 0;
    int sparse_steps = 0;
    for (int32_t i = 0; i < 24; ++i) {
      model::StepResult one;
      ASSERT_TRUE(model->Forward({{kv2->get(), &window[i], 1, false, true}}, &one).ok());
      sparse_steps += one.active_neuron_fraction < 1.0f;
      for (int64_t v = 0; v < vocab; ++v) {
        const double a = one.logits.as<float>()[v], b = whole.logits.as<float>()[i * vocab + v];
        diff = std::max(diff, std::fabs(a - b));
        scale = std::max(scale, std::fabs(b));
      }
    }
    EXPECT_GT(sparse_steps, 0) << "the predictors' schedule kept every neuron";
    EXPECT_LE(diff / scale, kRelTol);
  }
}

TEST(SparseModelTest, BadOptionsAreInvalidArgument) {
  auto backend = kernels::MakeCpuBackend(1);
  auto model = LoadMini(backend.get());
  ASSERT_NE(model, nullptr);
  struct Case {
    model::SparsityOptions o;
    std::string want;
  };
  std::vector<Case> cases;
  cases.push_back({model::SparsityOptions{}, "predictors"});
  model::SparsityOptions both = Oracle(0.5f);
  both.predictors = "x.safetensors";
  cases.push_back({both, "oracle_fraction"});
  cases.push_back({Oracle(1.5f), "oracle_fraction"});
  model::SparsityOptions groups = Oracle(0.5f);
  groups.selection_groups = 3;
  cases.push_back({groups, "selection_groups"});
  model::SparsityOptions fallback = Oracle(0.5f);
  fallback.dense_fallback = 0.0f;
  cases.push_back({fallback, "dense_fallback"});
  model::SparsityOptions layers = Oracle(0.5f);
  layers.dense_layers = 99;
  cases.push_back({layers, "dense_layers"});
  for (const Case& c : cases) {
    Status s = model->EnableSparsity(c.o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(c.want), std::string::npos) << s.ToString();
  }
  model::SparsityOptions missing;
  missing.predictors = "/nonexistent/predictors.safetensors";
  Status s = model->EnableSparsity(missing);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/predictors"), std::string::npos) << s.ToString();
  EXPECT_FALSE(model->sparsity_enabled());
}

}  // namespace
}  // namespace deja::worker
