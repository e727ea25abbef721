// Helpers shared by the worker-service tests: building StepRequests the way the coordinator does
// and the single-process reference continuation.
#pragma once

#include <cstdint>
#include <vector>

#include "deja/v1/worker.pb.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"

namespace deja::test_util {

// The first chunk of a new greedy sequence (or the whole prompt when `chunk` covers it).
inline deja::v1::SequenceWork FirstChunk(uint64_t seq_id, const std::vector<int32_t>& prompt,
                                         size_t chunk, uint32_t max_new_tokens,
                                         uint32_t top_n = 0) {
  deja::v1::SequenceWork w;
  w.set_seq_id(seq_id);
  const size_t n = std::min(chunk, prompt.size());
  for (size_t i = 0; i < n; ++i) w.add_tokens(prompt[i]);
  w.set_start_position(0);
  w.set_sample(n == prompt.size());
  deja::v1::SequenceConfig* c = w.mutable_config();
  c->set_prompt_tokens(static_cast<uint32_t>(prompt.size()));
  c->set_max_new_tokens(max_new_tokens);
  c->set_top_n(top_n);
  c->mutable_sampling()->set_top_p(1.f);
  c->mutable_sampling()->set_repetition_penalty(1.f);
  return w;
}

// Tokens [start, start + n) of a known sequence.
inline deja::v1::SequenceWork NextChunk(uint64_t seq_id, const std::vector<int32_t>& tokens,
                                        uint32_t start, bool sample) {
  deja::v1::SequenceWork w;
  w.set_seq_id(seq_id);
  for (int32_t t : tokens) w.add_tokens(t);
  w.set_start_position(start);
  w.set_sample(sample);
  return w;
}

// Greedy continuation of `prompt` by worker::model::Generate in this process (TP 1).
inline std::vector<int32_t> ReferenceGreedy(worker::model::Model& model,
                                            const std::vector<int32_t>& prompt, int32_t n) {
  worker::model::GenerationOptions opt;
  opt.max_new_tokens = n;
  opt.stop_at_eos = false;
  auto r = worker::model::Generate(model, prompt, opt);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  std::vector<int32_t> ids;
  if (r.ok()) {
    for (const worker::sampling::TokenChoice& c : r->tokens) ids.push_back(c.id);
  }
  return ids;
}

}  // namespace deja::test_util
