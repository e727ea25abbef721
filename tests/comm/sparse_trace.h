// The traces the Deja Vu model tests compare (sparse_model_test on the CPU,
// sparse_device_test on devices): random sequences prefilled in one batched step, then decoded
// together, teacher-forced; each step's last-position logits and active fractions.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/status.h"
#include "worker/model/model.h"

namespace deja::test_util {

// Per step: logits rows (one per sequence, the last position) and the active fractions.
struct Trace {
  std::vector<std::vector<float>> logits;
  std::vector<float> head_fraction, neuron_fraction;
};

inline std::vector<std::vector<int32_t>> RandomSequences(int batch, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(4, vocab - 1);
  std::vector<std::vector<int32_t>> seqs(batch);
  for (int b = 0; b < batch; ++b) {
    seqs[b].resize(40);
    for (int32_t& t : seqs[b]) t = tok(rng);
  }
  return seqs;
}

// Prefills each sequence (prompt lengths 5, 9, 13, ...) in one batched step, then decodes
// `steps` tokens for all of them together (teacher-forced from `seqs`).
inline StatusOr<Trace> RunTrace(worker::model::Model& model,
                                const std::vector<std::vector<int32_t>>& seqs, int32_t steps,
                                bool sparse) {
  Trace trace;
  const int batch = static_cast<int>(seqs.size());
  std::vector<std::unique_ptr<worker::kv::SequenceKv>> kvs;
  std::vector<int32_t> prompt(batch);
  std::vector<worker::model::SequenceStep> step;
  for (int b = 0; b < batch; ++b) {
    prompt[b] = 5 + 4 * b;
    DEJA_ASSIGN_OR_RETURN(auto kv, model.NewSequence(prompt[b] + steps));
    step.push_back({kv.get(), seqs[b].data(), prompt[b], false, sparse});
    kvs.push_back(std::move(kv));
  }
  worker::model::StepResult out;
  auto record = [&] {
    const int64_t vocab = out.logits.shape()[1];
    for (size_t r = 0; r < out.row_seq.size(); ++r) {
      const float* row = out.logits.as<float>() + r * vocab;
      trace.logits.emplace_back(row, row + vocab);
    }
    trace.head_fraction.push_back(out.active_head_fraction);
    trace.neuron_fraction.push_back(out.active_neuron_fraction);
  };
  DEJA_RETURN_IF_ERROR(model.Forward(step, &out));
  record();
  for (int32_t s = 0; s < steps; ++s) {
    for (int b = 0; b < batch; ++b)
      step[b] = {kvs[b].get(), &seqs[b][prompt[b] + s], 1, false, sparse};
    DEJA_RETURN_IF_ERROR(model.Forward(step, &out));
    record();
  }
  return trace;
}

// max |a - b| / max |b| over all rows.
inline double RelErr(const Trace& a, const Trace& b) {
  double diff = 0, scale = 0;
  EXPECT_EQ(a.logits.size(), b.logits.size());
  for (size_t r = 0; r < std::min(a.logits.size(), b.logits.size()); ++r) {
    for (size_t i = 0; i < a.logits[r].size(); ++i) {
      diff = std::max(diff, std::fabs(double(a.logits[r][i]) - b.logits[r][i]));
      scale = std::max(scale, std::fabs(double(b.logits[r][i])));
    }
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace deja::test_util
