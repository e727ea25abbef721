// What the tensor-parallel model tests run on every rank (threads or processes): for a few
// golden prompts, the last-position logits of the prefill and a greedy continuation.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "tests/worker/golden_util.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"

namespace deja::test_util {

constexpr int32_t kTpNewTokens = 12;
constexpr size_t kTpCases = 4;

struct TpCase {
  std::vector<int32_t> tokens;
  std::vector<float> last_logits;
};

// The trained fixture when it and its goldens exist, else the committed post-LN tiny model.
inline std::string TpModelName() {
  namespace fs = std::filesystem;
  const std::string mini = "opt-mini";
  if (fs::exists(ModelDir(mini) + "/config.json") &&
      fs::exists(SourceDir() + "/tests/golden/" + mini + "/cases.json")) {
    return mini;
  }
  return "opt-tiny-postln";
}

// The first golden prompts of at most 100 tokens.
inline std::vector<std::vector<int32_t>> TpPrompts(const nlohmann::json& golden) {
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : golden["cases"]) {
    if (c["input_ids"].size() <= 100 && prompts.size() < kTpCases) {
      prompts.push_back(c["input_ids"].get<std::vector<int32_t>>());
    }
  }
  return prompts;
}

// A device backend's top candidates of the last row (StepResult::top_*; none on the host) against
// that row's full logits: the ids of the largest logits in order, with their log-softmax within
// 1e-4 (absolute).
inline Status CheckTopCandidates(const worker::model::StepResult& step,
                                 const std::vector<float>& logits) {
  if (step.top_k == 0) return Status::Ok();
  const int64_t rows = static_cast<int64_t>(step.top_ids.size()) / step.top_k;
  const int32_t* ids = step.top_ids.data() + (rows - 1) * step.top_k;
  const float* lp = step.top_logprobs.data() + (rows - 1) * step.top_k;
  double max = -INFINITY, sum = 0;
  for (float z : logits) max = std::max<double>(max, z);
  for (float z : logits) sum += std::exp(z - max);
  const double lse = max + std::log(sum);
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (int32_t j = 0; j < step.top_k; ++j) {
    if (ids[j] != order[j] && logits[ids[j]] != logits[order[j]]) {
      return Internal("top candidate " + std::to_string(j) + " is token " + std::to_string(ids[j]) +
                      ", the logits rank token " + std::to_string(order[j]) + " there");
    }
    if (std::abs(lp[j] - (logits[ids[j]] - lse)) > 1e-4) {
      return Internal("top candidate " + std::to_string(j) + " has log-probability " +
                      std::to_string(lp[j]) + ", the logits give " +
                      std::to_string(logits[ids[j]] - lse));
    }
  }
  return Status::Ok();
}

inline StatusOr<std::vector<TpCase>> RunTpCases(worker::model::Model& model,
                                                const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<TpCase> out;
  const int64_t vocab = model.config().vocab_size;
  for (const std::vector<int32_t>& ids : prompts) {
    TpCase c;
    DEJA_ASSIGN_OR_RETURN(std::unique_ptr<worker::kv::SequenceKv> kv,
                          model.NewSequence(static_cast<int32_t>(ids.size())));
    worker::model::StepResult step;
    DEJA_RETURN_IF_ERROR(
        model.Forward({{kv.get(), ids.data(), static_cast<int32_t>(ids.size()), false}}, &step));
    c.last_logits.assign(step.logits.as<float>(), step.logits.as<float>() + vocab);
    DEJA_RETURN_IF_ERROR(CheckTopCandidates(step, c.last_logits));
    worker::model::GenerationOptions opt;
    opt.max_new_tokens = kTpNewTokens;
    opt.stop_at_eos = false;
    DEJA_ASSIGN_OR_RETURN(worker::model::GenerationResult g,
                          worker::model::Generate(model, ids, opt));
    for (const worker::sampling::TokenChoice& t : g.tokens) c.tokens.push_back(t.id);
    out.push_back(std::move(c));
  }
  return out;
}

inline nlohmann::json TpCasesToJson(const std::vector<TpCase>& cases) {
  nlohmann::json j = nlohmann::json::array();
  for (const TpCase& c : cases) j.push_back({{"tokens", c.tokens}, {"last_logits", c.last_logits}});
  return j;
}

inline std::vector<TpCase> TpCasesFromJson(const nlohmann::json& j) {
  std::vector<TpCase> cases;
  for (const auto& c : j) {
    cases.push_back(
        {c["tokens"].get<std::vector<int32_t>>(), c["last_logits"].get<std::vector<float>>()});
  }
  return cases;
}

}  // namespace deja::test_util
