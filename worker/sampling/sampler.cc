#include "worker/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "common/vec_math.h"
#include "worker/rules/request_rules.h"

namespace deja::worker::sampling {
namespace {

// log(sum_i exp(x[i])), numerically stable: the max by SIMD, then exp(x - max) summed by SIMD in
// chunks whose f32 sums are added in double (a 50,272-entry row: relative error ~1e-7).
float LogSumExp(const float* x, int32_t n, float* max_out) {
  const float mx = MaxOf(x, n);
  *max_out = mx;
  if (!std::isfinite(mx)) return mx;
  constexpr int32_t kChunk = 1024;
  double sum = 0.0;
  for (int32_t i = 0; i < n; i += kChunk) {
    sum += SumExpShift(x + i, std::min(kChunk, n - i), mx);
  }
  return mx + static_cast<float>(std::log(sum));
}

// The n largest of x (n small), best first, ties to the lower index: one pass keeping a sorted
// list, most entries rejected by one comparison with its last.
void TopN(const float* x, int32_t size, int32_t n, std::vector<int32_t>* out) {
  out->clear();
  auto better = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  for (int32_t i = 0; i < size; ++i) {
    if (static_cast<int32_t>(out->size()) == n && !better(i, out->back())) continue;
    if (static_cast<int32_t>(out->size()) == n) out->pop_back();
    out->insert(std::upper_bound(out->begin(), out->end(), i, better), i);
  }
}

// An index into probs[0, keep) (unnormalised, best first, summing to `total`) drawn from the
// smallest prefix whose mass reaches top_p (at least one entry; all of them when top_p is 1).
int32_t DrawNucleus(const std::vector<double>& probs, int32_t keep, double total, float top_p,
                    std::mt19937_64& rng) {
  if (top_p < 1.0f) {
    double cum = 0.0;
    int32_t n = 0;
    while (n < keep) {
      cum += probs[n] / total;
      ++n;
      if (cum >= top_p) break;
    }
    keep = n;
    total = 0.0;
    for (int32_t i = 0; i < keep; ++i) total += probs[i];
  }
  std::uniform_real_distribution<double> uni(0.0, total);
  const double r = uni(rng);
  double acc = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (r < acc) return i;
  }
  return keep - 1;
}

int32_t ArgMax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

Status SamplingParams::Validate() const {
  DEJA_RETURN_IF_ERROR(rules::CheckTemperature(temperature, "temperature"));
  if (do_sample && temperature == 0.f) {
    return InvalidArgument("temperature must be > 0 when do_sample is set");
  }
  DEJA_RETURN_IF_ERROR(rules::CheckTopK(top_k, "top_k"));
  DEJA_RETURN_IF_ERROR(rules::CheckTopP(top_p, "top_p"));
  DEJA_RETURN_IF_ERROR(rules::CheckRepetitionPenalty(repetition_penalty, "repetition_penalty"));
  DEJA_RETURN_IF_ERROR(rules::CheckTokenPenalty(presence_penalty, "presence_penalty"));
  DEJA_RETURN_IF_ERROR(rules::CheckTokenPenalty(frequency_penalty, "frequency_penalty"));
  DEJA_RETURN_IF_ERROR(rules::CheckLogitBiasCount(logit_bias.size(), "logit_bias"));
  for (const auto& [id, bias] : logit_bias) {
    // The vocabulary is the row's, checked at each choice; ids only need to be >= 0 here.
    DEJA_RETURN_IF_ERROR(rules::CheckLogitBias(id, bias, INT32_MAX, "logit_bias"));
  }
  return rules::CheckTopN(top_n, "top_n");
}

StatusOr<TokenChoice> Sampler::Choose(const float* logits, int32_t vocab,
                                      const std::vector<int32_t>& history) {
  if (vocab <= 0) return InvalidArgument("the logits row is empty");
  // Log-probabilities under the model's own distribution: logits[i] - lse, computed only for
  // the tokens reported (one pass for lse instead of a whole log_softmax row per call).
  float max_logit = 0.f;
  const float lse = LogSumExp(logits, vocab, &max_logit);
  // Finite exactly when the max is finite and no entry is NaN (MaxOf returns NaN then): the
  // one check the row needs, at no extra pass.
  if (!std::isfinite(lse)) {
    const float* bad = std::find_if(logits, logits + vocab,
                                    [](float x) { return std::isnan(x) || x == INFINITY; });
    return Internal(bad != logits + vocab ? "the logits row holds " + std::to_string(*bad) +
                                                " at token id " + std::to_string(bad - logits)
                                          : std::string("every logit of the row is -inf"));
  }

  // The logits the choice is made from: the raw row unless a penalty or bias changes it.
  const float* work = logits;
  const bool adjusts = params_.AdjustsLogits();
  if (adjusts || params_.do_sample) {
    work_.assign(logits, logits + vocab);
    work = work_.data();
  }
  if (params_.repetition_penalty != 1.0f) {
    for (int32_t id : history) {
      if (id < 0 || id >= vocab) continue;
      float& l = work_[id];
      // Applied once per distinct token: a second occurrence must not penalise again.
      if (l == logits[id])
        l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    }
  }
  if ((params_.presence_penalty != 0.f || params_.frequency_penalty != 0.f) &&
      history.size() > params_.output_start) {
    // Each distinct generated id once: presence + frequency * its count.
    seen_.assign(history.begin() + static_cast<std::ptrdiff_t>(params_.output_start),
                 history.end());
    std::sort(seen_.begin(), seen_.end());
    for (size_t i = 0; i < seen_.size();) {
      size_t j = i;
      while (j < seen_.size() && seen_[j] == seen_[i]) ++j;
      if (seen_[i] >= 0 && seen_[i] < vocab) {
        work_[seen_[i]] -= params_.presence_penalty +
                           params_.frequency_penalty * static_cast<float>(j - i);
      }
      i = j;
    }
  }
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id < vocab) work_[id] += bias;
  }

  TokenChoice choice;
  if (!params_.do_sample) {
    // The first index holding the row's max (what ArgMax returns), found by the SIMD max above
    // when the row is the raw logits; ArgMax otherwise (a penalty, or a NaN in the row).
    const float* at = work == logits ? std::find(logits, logits + vocab, max_logit) : nullptr;
    choice.id = at != nullptr && at != logits + vocab ? static_cast<int32_t>(at - logits)
                                                      : ArgMax(work, vocab);
  } else {
    // Scaled relative to the row's max, so every value is <= 0: a tiny temperature sends all but
    // the maxima to -inf (greedy, ties shared) instead of overflowing to inf - inf = NaN.
    const float t = params_.temperature;
    // The raw row's max is known already (LogSumExp); a penalty may have changed it.
    const float m = !adjusts ? max_logit : MaxOf(work_.data(), vocab);
    const float shift = std::isfinite(m) ? m : 0.f;
    for (float& l : work_) l = (l - shift) / t;
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
    choice.id = order_[DrawNucleus(probs, keep, total, params_.top_p, rng_)];
  }
  choice.logprob = logits[choice.id] - lse;
  if (params_.top_n > 0) {
    // The n most likely tokens of the raw distribution (ties to the lower id).
    TopN(logits, vocab, std::min(params_.top_n, vocab), &order_);
    for (int32_t id : order_) choice.top.emplace_back(id, logits[id] - lse);
  }
  return choice;
}

bool Sampler::CanChooseFromTop(int32_t k) const {
  if (params_.AdjustsLogits() || params_.top_n > k) return false;
  return !params_.do_sample || (params_.top_k > 0 && params_.top_k <= k);
}

StatusOr<TokenChoice> Sampler::ChooseFromTop(const float* logprobs, const int32_t* ids, int32_t k) {
  if (k <= 0) return InvalidArgument("no candidates to choose from");
  if (!std::isfinite(logprobs[0])) {
    return Internal("the logits row's best log-probability is " + std::to_string(logprobs[0]) +
                    " (a NaN or no finite logit in the row)");
  }
  TokenChoice choice;
  int32_t at = 0;  // index into the candidates
  if (params_.do_sample) {
    // As Choose: (logit - max) / T over the top_k candidates; log-probs differ from logits by
    // the row's log-sum-exp, which the shift by the max removes.
    const int32_t keep_k = std::min(params_.top_k, k);
    const float t = params_.temperature;
    probs_.resize(keep_k);
    double total = 0.0;
    for (int32_t i = 0; i < keep_k; ++i) {
      const float l = (logprobs[i] - logprobs[0]) / t;
      probs_[i] = std::exp(static_cast<double>(l));
      total += probs_[i];
    }
    at = DrawNucleus(probs_, keep_k, total, params_.top_p, rng_);
  }
  choice.id = ids[at];
  choice.logprob = logprobs[at];
  for (int32_t i = 0; i < std::min(params_.top_n, k); ++i) {
    choice.top.emplace_back(ids[i], logprobs[i]);
  }
  return choice;
}

}  // namespace deja::worker::sampling
