#include "worker/model/generation.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "worker/kv/policy_table.h"

namespace deja::worker::model {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double NextTokenNll(const float* row, int64_t vocab, int32_t next) {
  float mx = row[0];
  for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, row[j]);
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
  return -(static_cast<double>(row[next]) - mx - std::log(sum));
}

}  // namespace

StatusOr<GenerationResult> Generate(
    Model& model, const std::vector<int32_t>& prompt, const GenerationOptions& options,
    const std::function<void(const sampling::TokenChoice&)>& on_token) {
  DEJA_RETURN_IF_ERROR(options.sampling.Validate());
  if (prompt.empty()) return InvalidArgument("prompt must hold at least one token");
  if (options.max_new_tokens < 0) return InvalidArgument("max_new_tokens must be >= 0");
  if (options.prefill_chunk <= 0) return InvalidArgument("prefill_chunk must be > 0");
  const int64_t limit = model.config().max_position_embeddings;
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  if (total > limit) {
    return OutOfRange("prompt of " + std::to_string(prompt.size()) + " tokens plus " +
                      std::to_string(options.max_new_tokens) +
                      " new tokens exceeds the model's position limit of " + std::to_string(limit));
  }
  // Locret's cache holds its budget plus one prefill chunk and evicts after each; the other
  // bounded policies evict once the whole prompt is in (SequenceKv::SetEvictionBoundaries), so
  // their cache holds it all, whatever prefill_chunk splits it into.
  const int32_t chunk = static_cast<int32_t>(
      kv::CachePolicyOf(options.cache.kind).retaining_heads
          ? std::min<int64_t>(options.prefill_chunk, static_cast<int64_t>(prompt.size()))
          : static_cast<int64_t>(prompt.size()));
  DEJA_ASSIGN_OR_RETURN(
      std::unique_ptr<kv::SequenceKv> kv,
      model.NewSequence(static_cast<int32_t>(std::max<int64_t>(total, 1)), options.cache,
                        static_cast<int32_t>(prompt.size()), chunk));
  GenerationResult result;
  result.finish_reason = "length";
  if (options.max_new_tokens == 0) return result;

  sampling::Sampler sampler(options.sampling);
  // On a device the logits stay there when the top candidates decide the choice.
  const bool full_logits = !sampler.CanChooseFromTop(kDeviceTopCandidates);
  std::vector<int32_t> history = prompt;
  StepResult step;
  const int32_t vocab = static_cast<int32_t>(model.config().vocab_size);
  auto t0 = std::chrono::steady_clock::now();
  for (size_t done = 0; done < prompt.size();) {
    int32_t n = static_cast<int32_t>(std::min<size_t>(options.prefill_chunk, prompt.size() - done));
    SequenceStep s{kv.get(), prompt.data() + done, n, false, options.sparse, full_logits};
    DEJA_RETURN_IF_ERROR(model.Forward({s}, &step));
    done += n;
  }
  auto t1 = std::chrono::steady_clock::now();
  result.prefill_seconds = Seconds(t0, t1);
  // A bounded policy needs only budget + 1 slots per head from here on.
  if (kv->policy().budget() > 0 && kv->policy().budget() + 1 < kv->capacity()) {
    DEJA_RETURN_IF_ERROR(kv->Resize(kv->policy().budget() + 1));
  }
  result.kv_bytes = kv->bytes();
  const int32_t eos = static_cast<int32_t>(model.config().eos_token_id);
  for (int32_t i = 0; i < options.max_new_tokens; ++i) {
    DEJA_ASSIGN_OR_RETURN(
        sampling::TokenChoice c,
        step.top_k > 0 && !full_logits
            ? sampler.ChooseFromTop(step.top_logprobs.data(), step.top_ids.data(), step.top_k)
            : sampler.Choose(step.logits.as<float>(), vocab, history));
    history.push_back(c.id);
    if (on_token) on_token(c);
    result.tokens.push_back(c);
    if (options.stop_at_eos && c.id == eos) {
      result.finish_reason = "eos";
      break;
    }
    if (i + 1 == options.max_new_tokens) break;
    SequenceStep s{kv.get(), &history.back(), 1, false, options.sparse, full_logits};
    DEJA_RETURN_IF_ERROR(model.Forward({s}, &step));
  }
  result.decode_seconds = Seconds(t1, std::chrono::steady_clock::now());
  result.evictions = kv->evictions();
  return result;
}

StatusOr<PerplexityResult> Perplexity(Model& model, const std::vector<int32_t>& tokens,
                                      int32_t context, bool sparse) {
  if (context < 2) return InvalidArgument("context must be >= 2");
  if (context > model.config().max_position_embeddings) {
    return OutOfRange("context " + std::to_string(context) +
                      " exceeds the model's position limit of " +
                      std::to_string(model.config().max_position_embeddings));
  }
  if (tokens.empty()) return InvalidArgument("the text has no tokens to score");
  const int32_t bos = static_cast<int32_t>(model.config().bos_token_id);
  const int64_t vocab = model.config().vocab_size;
  PerplexityResult r;
  std::vector<int32_t> window;
  StepResult step;
  for (size_t begin = 0; begin < tokens.size(); begin += context - 1) {
    size_t end = std::min(tokens.size(), begin + context - 1);
    window.assign(1, bos);
    window.insert(window.end(), tokens.begin() + begin, tokens.begin() + end);
    DEJA_ASSIGN_OR_RETURN(std::unique_ptr<kv::SequenceKv> kv,
                          model.NewSequence(static_cast<int32_t>(window.size())));
    SequenceStep s{kv.get(), window.data(), static_cast<int32_t>(window.size()), true, sparse};
    DEJA_RETURN_IF_ERROR(model.Forward({s}, &step));
    const float* logits = step.logits.as<float>();
    for (size_t i = 0; i + 1 < window.size(); ++i) {
      r.total_nll += NextTokenNll(logits + i * vocab, vocab, window[i + 1]);
      ++r.tokens;
    }
    ++r.windows;
  }
  r.perplexity = std::exp(r.total_nll / static_cast<double>(r.tokens));
  return r;
}

StatusOr<PolicyPerplexityResult> PolicyPerplexity(
    Model& model, const std::vector<int32_t>& tokens, int32_t context, int32_t prompt_tokens,
    const kv::CachePolicyConfig& cache, bool sparse, int32_t locret_chunk,
    const std::function<Status(const std::vector<int32_t>&)>& before_window) {
  if (prompt_tokens < 1 || prompt_tokens >= context) {
    return InvalidArgument("prompt_tokens must be in [1, context)");
  }
  if (locret_chunk < 1) return InvalidArgument("locret_chunk must be >= 1");
  const int32_t chunk = kv::CachePolicyOf(cache.kind).retaining_heads
                            ? std::min(locret_chunk, prompt_tokens)
                            : prompt_tokens;
  if (context > model.config().max_position_embeddings) {
    return OutOfRange("context " + std::to_string(context) +
                      " exceeds the model's position limit of " +
                      std::to_string(model.config().max_position_embeddings));
  }
  const int32_t bos = static_cast<int32_t>(model.config().bos_token_id);
  const int64_t vocab = model.config().vocab_size;
  PolicyPerplexityResult out;
  PerplexityResult& r = out.result;
  std::vector<int32_t> window;
  StepResult step;
  for (size_t begin = 0; begin < tokens.size(); begin += context - 1) {
    size_t end = std::min(tokens.size(), begin + context - 1);
    window.assign(1, bos);
    window.insert(window.end(), tokens.begin() + begin, tokens.begin() + end);
    const int32_t n = static_cast<int32_t>(window.size());
    if (n <= prompt_tokens) continue;
    if (before_window) DEJA_RETURN_IF_ERROR(before_window(window));
    DEJA_ASSIGN_OR_RETURN(std::unique_ptr<kv::SequenceKv> kv,
                          model.NewSequence(n, cache, prompt_tokens, chunk));
    const int64_t heads = static_cast<int64_t>(kv->geometry().layers) * kv->geometry().heads;
    for (int32_t done = 0; done < prompt_tokens;) {
      const int32_t m = std::min(chunk, prompt_tokens - done);
      // Every head holds the same count (evictions are per head but to one budget).
      const int32_t held = static_cast<int32_t>(kv->cached_slots() / heads) + m;
      out.peak_prompt_tokens = std::max(out.peak_prompt_tokens, held);
      DEJA_RETURN_IF_ERROR(
          model.Forward({{kv.get(), window.data() + done, m, false, sparse}}, &step));
      done += m;
    }
    out.peak_prompt_kv_bytes =
        static_cast<size_t>(out.peak_prompt_tokens) * kv->geometry().SlotBytes();
    if (kv->policy().budget() > 0 && kv->policy().budget() + 1 < kv->capacity()) {
      DEJA_RETURN_IF_ERROR(kv->Resize(kv->policy().budget() + 1));
    }
    out.kv_bytes_per_sequence = std::max(out.kv_bytes_per_sequence, kv->bytes());
    for (int32_t i = prompt_tokens;; ++i) {
      r.total_nll += NextTokenNll(step.logits.as<float>(), vocab, window[i]);
      ++r.tokens;
      if (i + 1 >= n) break;
      DEJA_RETURN_IF_ERROR(model.Forward({{kv.get(), &window[i], 1, false, sparse}}, &step));
    }
    out.evictions += kv->evictions();
    ++r.windows;
  }
  if (r.tokens == 0) return InvalidArgument("no window is longer than prompt_tokens");
  r.perplexity = std::exp(r.total_nll / static_cast<double>(r.tokens));
  return out;
}

}  // namespace deja::worker::model
