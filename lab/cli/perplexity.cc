// `deja ppl`: perplexity of a text file in windows of --context tokens (the fixture's
// procedure, see worker/generation.h).
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "lab/cli/commands.h"
#include "cli/common_flags.h"
#include "cli/sparsity_cli.h"
#include "common/tokenizer.h"
#include "lab/locret_oracle.h"
#include "worker/model/generation.h"

namespace deja::cli {

int RunPerplexity(int argc, char** argv, int first) {
  Args args("ppl", "Perplexity of --text in windows of --context tokens.");
  AddModelFlags(args);
  args.Flag("text", "UTF-8 text file", "", true)
      .Flag("context", "window length in tokens, BOS included", "1024")
      .Flag("prompt-tokens",
            "with --kv-policy: prompt length per window; the rest is decoded "
            "token by token and only those tokens are scored",
            "256")
      .Flag("h2o-score",
            "with --kv-policy h2o: rank heavy hitters by accumulated attention (sum, the "
            "reference) or by it divided by the queries that saw the token (mean, an alternative)",
            "sum")
      .Flag("sink-tokens", "with --kv-policy h2o: the first positions never evicted", "0")
      .Flag("locret-chunk",
            "with --kv-policy locret: prompt tokens per prefill step (the cache holds at most "
            "its budget plus this many)",
            "64")
      .Flag("locret-oracle",
            "with --kv-policy locret, an upper-bound study: off, or score each token by the "
            "attention the window's scored positions give it in a dense run instead of by the "
            "retaining heads: max (the largest log probability) or sum (the log of the summed "
            "probability)",
            "off")
      .Flag("locret-oracle-skip",
            "with --locret-oracle: the first positions are never kept by score (the BOS is 1)",
            "0");
  AddRetainingFlag(args);
  AddCachePolicyFlags(args, std::nullopt);
  AddSparsityRunFlags(args);
  args.Bool("json", "print one JSON object (perplexity, tokens, ...) as the last line");
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("ppl", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> Status {
    DEJA_ASSIGN_OR_RETURN(int64_t context, args.Int("context"));
    if (context < 2 || context > (1 << 20)) return InvalidArgument("--context must be >= 2");
    DEJA_ASSIGN_OR_RETURN(std::string text, ReadFile(args.Str("text")));
    DEJA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(args.Str("model")));
    StatusOr<std::vector<int32_t>> ids = tok->Encode(text, /*add_bos=*/false);
    if (!ids.ok()) return ids.status().WithContext("--text " + args.Str("text"));
    DEJA_ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromFlags(args));
    DEJA_ASSIGN_OR_RETURN(std::optional<worker::model::SparsityOptions> sparsity,
                          SparsityRunOptions(args));
    if (sparsity) {
      DEJA_RETURN_IF_ERROR(m.model->EnableSparsity(*sparsity));
    }
    auto t0 = std::chrono::steady_clock::now();
    worker::model::PerplexityResult r;
    nlohmann::json j;
    if (args.Has("kv-policy")) {
      DEJA_ASSIGN_OR_RETURN(worker::kv::CachePolicyConfig cache, CachePolicyFromFlags(args));
      const std::string score = args.Str("h2o-score");
      if (score != "sum" && score != "mean") {
        return InvalidArgument("--h2o-score must be sum or mean");
      }
      cache.h2o_mean_score = score == "mean";
      DEJA_ASSIGN_OR_RETURN(int64_t sinks, args.Int("sink-tokens"));
      if (sinks < 0) return InvalidArgument("--sink-tokens must be >= 0");
      if (sinks > 0 &&
          (cache.kind != worker::kv::CachePolicyKind::kH2O || !m.backend->device().is_host())) {
        return InvalidArgument("--sink-tokens applies to --kv-policy h2o on the CPU");
      }
      cache.sink_tokens = static_cast<int32_t>(sinks);
      DEJA_ASSIGN_OR_RETURN(int64_t prompt, args.Int("prompt-tokens"));
      DEJA_ASSIGN_OR_RETURN(int64_t chunk, args.Int("locret-chunk"));
      if (chunk < 1 || chunk > (1 << 20)) return InvalidArgument("--locret-chunk must be >= 1");
      DEJA_RETURN_IF_ERROR(EnableRetainingFromFlags(args, cache, *m.model));
      const std::string oracle = args.Str("locret-oracle");
      if (oracle != "off" && oracle != "max" && oracle != "sum") {
        return InvalidArgument("--locret-oracle must be off, max or sum");
      }
      DEJA_ASSIGN_OR_RETURN(int64_t oracle_skip, args.Int("locret-oracle-skip"));
      if (oracle_skip < 0 || oracle_skip > (1 << 20)) {
        return InvalidArgument("--locret-oracle-skip must be >= 0");
      }
      std::unique_ptr<worker::locret::OracleScorer> scorer;
      std::function<Status(const std::vector<int32_t>&)> before_window;
      if (oracle != "off") {
        if (cache.kind != worker::kv::CachePolicyKind::kLocret || !m.backend->device().is_host()) {
          return InvalidArgument("--locret-oracle applies to --kv-policy locret on the CPU");
        }
        scorer = std::make_unique<worker::locret::OracleScorer>(
            *m.model,
            oracle == "max" ? worker::locret::OracleKind::kMax : worker::locret::OracleKind::kSum,
            static_cast<int32_t>(oracle_skip));
        // The window's last token is only scored: its own query predicts nothing. The queries
        // whose predictions are scored start at the prompt's last position.
        before_window = [&](const std::vector<int32_t>& window) {
          return scorer->Prepare(std::vector<int32_t>(window.begin(), window.end() - 1),
                                 static_cast<int32_t>(prompt) - 1);
        };
      }
      DEJA_ASSIGN_OR_RETURN(
          worker::model::PolicyPerplexityResult pr,
          worker::model::PolicyPerplexity(*m.model, *ids, static_cast<int32_t>(context),
                                          static_cast<int32_t>(prompt), cache, sparsity.has_value(),
                                          static_cast<int32_t>(chunk), before_window));
      if (oracle != "off") {
        j["locret_oracle"] = oracle;
        j["locret_oracle_skip"] = oracle_skip;
      }
      r = pr.result;
      j["kv_policy"] = args.Str("kv-policy");
      if (cache.kind == worker::kv::CachePolicyKind::kH2O) j["h2o_score"] = score;
      j["prompt_tokens"] = prompt;
      j["kv_bytes_per_sequence"] = pr.kv_bytes_per_sequence;
      j["peak_prompt_tokens_per_head"] = pr.peak_prompt_tokens;
      j["peak_prompt_kv_bytes"] = pr.peak_prompt_kv_bytes;
      if (cache.kind == worker::kv::CachePolicyKind::kLocret) j["locret_chunk"] = chunk;
      j["evictions"] = pr.evictions;
    } else {
      DEJA_ASSIGN_OR_RETURN(r,
                            worker::model::Perplexity(*m.model, *ids, static_cast<int32_t>(context),
                                                      sparsity.has_value()));
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (args.On("json")) {
      j["perplexity"] = r.perplexity;
      j["tokens"] = r.tokens;
      j["windows"] = r.windows;
      j["nll"] = r.total_nll;
      j["context"] = context;
      j["seconds"] = secs;
      j["sparse"] = sparsity.has_value();
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("perplexity %.4f over %ld tokens in %ld windows (%.1f s)\n", r.perplexity,
                  static_cast<long>(r.tokens), static_cast<long>(r.windows), secs);
    }
    return Status::Ok();
  };
  if (Status s = run(); !s.ok()) return Fail("ppl", s);
  return 0;
}

}  // namespace deja::cli
