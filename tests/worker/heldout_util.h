// Held-out text and greedy continuations for the reduced-precision model tests (int8, int4).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer.h"
#include "tests/worker/golden_util.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"

namespace deja::test_util {

// The first max_tokens tokens of tests/data/heldout/<file> under opt-mini's tokenizer.
inline std::vector<int32_t> HeldOut(const std::string& file, int64_t max_tokens) {
  auto tok = Tokenizer::Load(ModelDir("opt-mini"));
  EXPECT_TRUE(tok.ok());
  std::ifstream in(SourceDir() + "/tests/data/heldout/" + file);
  std::stringstream ss;
  ss << in.rdbuf();
  auto ids = (*tok)->Encode(ss.str(), false);
  EXPECT_TRUE(ids.ok());
  std::vector<int32_t> v = *ids;
  if (static_cast<int64_t>(v.size()) > max_tokens) v.resize(static_cast<size_t>(max_tokens));
  return v;
}

// Greedy continuation of `prompt` (BOS included) for `n` tokens, EOS ignored.
inline std::vector<int32_t> Greedy(worker::model::Model& m, const std::vector<int32_t>& prompt,
                                   int n) {
  worker::model::GenerationOptions g;
  g.max_new_tokens = n;
  g.stop_at_eos = false;
  auto r = worker::model::Generate(m, prompt, g);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  std::vector<int32_t> ids;
  if (r.ok())
    for (const auto& t : r->tokens) ids.push_back(t.id);
  return ids;
}

// Perplexity of `b` relative to `a`, (b - a) / a, on the first 8,192 tokens of held-out `file`
// in 512-token windows; prints both as "<file>: <name_a> ppl <name_b> ppl (rel)".
inline double RelativePerplexity(worker::model::Model& a, worker::model::Model& b,
                                 const std::string& file, const char* name_a,
                                 const char* name_b) {
  const std::vector<int32_t> ids = HeldOut(file, 8192);
  auto want = worker::model::Perplexity(a, ids, 512);
  auto got = worker::model::Perplexity(b, ids, 512);
  EXPECT_TRUE(want.ok() && got.ok());
  if (!want.ok() || !got.ok()) return 1.0;
  const double rel = (got->perplexity - want->perplexity) / want->perplexity;
  std::printf("%s: %s %.4f %s %.4f (%+.3f%%)\n", file.c_str(), name_a, want->perplexity, name_b,
              got->perplexity, 100.0 * rel);
  return rel;
}

// The share of positions where `b` picks `a`'s token in 32-token greedy continuations of
// `prompts` prompts of 48 held-out tokens, `stride` tokens apart (positions after a divergence
// compare continuations of different prefixes, so they are compared too but rarely agree).
inline double GreedyAgreement(worker::model::Model& a, worker::model::Model& b,
                              const std::vector<int32_t>& text, int prompts, int stride) {
  int agree = 0, total = 0;
  for (int p = 0; p < prompts; ++p) {
    std::vector<int32_t> prompt = {2};
    prompt.insert(prompt.end(), text.begin() + p * stride, text.begin() + p * stride + 48);
    const std::vector<int32_t> x = Greedy(a, prompt, 32), y = Greedy(b, prompt, 32);
    EXPECT_EQ(x.size(), 32u);
    EXPECT_EQ(y.size(), 32u);
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) agree += x[i] == y[i];
    total += 32;
  }
  return static_cast<double>(agree) / total;
}

}  // namespace deja::test_util
