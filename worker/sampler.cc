#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

namespace deja::worker {
namespace {

// log_softmax of x into out; returns nothing, numerically stable.
void LogSoftmaxRow(const float* x, int32_t n, float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const float lse = mx + static_cast<float>(std::log(sum));
  for (int32_t i = 0; i < n; ++i) out[i] = x[i] - lse;
}

int32_t ArgMax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

Status SamplingParams::Validate() const {
  if (!(temperature >= 0.f) || !std::isfinite(temperature)) {
    return InvalidArgument("temperature must be a finite number >= 0");
  }
  if (do_sample && temperature == 0.f) {
    return InvalidArgument("temperature must be > 0 when do_sample is set");
  }
  if (top_k < 0) return InvalidArgument("top_k must be >= 0");
  if (!(top_p > 0.f && top_p <= 1.f)) return InvalidArgument("top_p must be in (0, 1]");
  if (!(repetition_penalty > 0.f) || !std::isfinite(repetition_penalty)) {
    return InvalidArgument("repetition_penalty must be a finite number > 0");
  }
  if (top_n < 0 || top_n > 20) return InvalidArgument("top_n_tokens must be in [0, 20]");
  return Status::Ok();
}

TokenChoice Sampler::Choose(const float* logits, int32_t vocab,
                            const std::vector<int32_t>& history) {
  logprobs_.resize(vocab);
  LogSoftmaxRow(logits, vocab, logprobs_.data());

  work_.assign(logits, logits + vocab);
  if (params_.repetition_penalty != 1.0f) {
    for (int32_t id : history) {
      if (id < 0 || id >= vocab) continue;
      float& l = work_[id];
      // Applied once per distinct token: a second occurrence must not penalise again.
      if (l == logits[id]) l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    }
  }

  TokenChoice choice;
  if (!params_.do_sample) {
    choice.id = ArgMax(work_.data(), vocab);
  } else {
    const float t = params_.temperature;
    for (float& l : work_) l /= t;
    // Candidates sorted by logit (descending, ties to the lower id).
    order_.resize(vocab);
    std::iota(order_.begin(), order_.end(), 0);
    int32_t keep = vocab;
    if (params_.top_k > 0 && params_.top_k < vocab) keep = params_.top_k;
    auto by_logit = [&](int32_t a, int32_t b) {
      return work_[a] > work_[b] || (work_[a] == work_[b] && a < b);
    };
    if (keep < vocab) {
      std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_logit);
    } else {
      std::sort(order_.begin(), order_.end(), by_logit);
    }
    const float mx = work_[order_[0]];
    double total = 0.0;
    std::vector<double>& probs = probs_;
    probs.resize(keep);
    for (int32_t i = 0; i < keep; ++i) {
      probs[i] = std::exp(static_cast<double>(work_[order_[i]]) - mx);
      total += probs[i];
    }
    if (params_.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p (at least one)
      double cum = 0.0;
      int32_t n = 0;
      while (n < keep) {
        cum += probs[n] / total;
        ++n;
        if (cum >= params_.top_p) break;
      }
      keep = n;
      total = 0.0;
      for (int32_t i = 0; i < keep; ++i) total += probs[i];
    }
    std::uniform_real_distribution<double> uni(0.0, total);
    double r = uni(rng_), acc = 0.0;
    choice.id = order_[keep - 1];
    for (int32_t i = 0; i < keep; ++i) {
      acc += probs[i];
      if (r < acc) {
        choice.id = order_[i];
        break;
      }
    }
  }
  choice.logprob = logprobs_[choice.id];
  if (params_.top_n > 0) {
    int32_t n = std::min(params_.top_n, vocab);
    order_.resize(vocab);
    std::iota(order_.begin(), order_.end(), 0);
    std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), [&](int32_t a, int32_t b) {
      return logprobs_[a] > logprobs_[b] || (logprobs_[a] == logprobs_[b] && a < b);
    });
    for (int32_t i = 0; i < n; ++i) choice.top.emplace_back(order_[i], logprobs_[order_[i]]);
  }
  return choice;
}

}  // namespace deja::worker
