// `deja prefix-eval`: what important-token loading (worker/prefix/importance.h) costs in
// quality. One shared prefix (the first --prefix-tokens of --text, whole KV blocks of it cached
// once) and --continuations later stretches of the same text, each read after the prefix: the
// perplexity of each stretch's --tokens tokens and the greedy continuation of its first 16
// tokens (--greedy tokens), with the whole prefix loaded and with only the important tokens at
// each --kept fraction; and, per layer, how often the probe heads disagreed (a fallback to the
// whole prefix).
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lab/cli/commands.h"
#include "cli/common_flags.h"
#include "common/tokenizer.h"
#include "common/vec_math.h"

namespace deja::cli {
namespace {

using worker::model::Model;
using worker::model::SequenceStep;
using worker::model::StepResult;
namespace kv = worker::kv;

constexpr int32_t kGreedyPrompt = 16;

// Runs one sequence from the cached prefix: `tail` in one step (all logits kept), then `greedy`
// greedy tokens. kept < 1: important-token loading at that fraction.
struct Run {
  std::vector<float> logprobs;  // log p of tail[i + 1] given everything before, i < tail - 1
  std::vector<int32_t> greedy;
};
StatusOr<Run> RunFromPrefix(Model& model, const kv::SequenceKv& prefix, int32_t cached,
                            const std::vector<int32_t>& tail, int32_t greedy, double kept) {
  const int32_t bs = model.kv_block_slots();
  std::vector<int32_t> blocks;
  for (int32_t b = 0; b < cached / bs; ++b) blocks.push_back(prefix.pool_block(b));
  const int32_t total = cached + static_cast<int32_t>(tail.size()) + greedy;
  DEJA_ASSIGN_OR_RETURN(std::unique_ptr<kv::SequenceKv> kv, model.NewSequence(total));
  DEJA_RETURN_IF_ERROR(kv->SeedPrefix(blocks, /*share=*/false));
  if (kept < 1.0) kv->SetImportantPrefix(cached);
  StepResult step;
  DEJA_RETURN_IF_ERROR(
      model.Forward({{kv.get(), tail.data(), static_cast<int32_t>(tail.size()), true}}, &step));
  const int64_t vocab = model.config().vocab_size;
  Run run;
  std::vector<float> row(static_cast<size_t>(vocab));
  const float* logits = step.logits.as<float>();
  for (size_t i = 0; i + 1 < tail.size(); ++i) {
    const float* x = logits + i * vocab;
    float most = x[0];
    for (int64_t t = 1; t < vocab; ++t) most = std::max(most, x[t]);
    double sum = 0;
    for (int64_t t = 0; t < vocab; ++t) sum += std::exp(static_cast<double>(x[t] - most));
    run.logprobs.push_back(x[tail[i + 1]] - most - static_cast<float>(std::log(sum)));
  }
  const float* last = logits + (tail.size() - 1) * vocab;
  for (int32_t g = 0; g < greedy; ++g) {
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    run.greedy.push_back(next);
    if (g + 1 == greedy) break;
    DEJA_RETURN_IF_ERROR(model.Forward({{kv.get(), &run.greedy.back(), 1, false}}, &step));
    last = step.logits.as<float>();
  }
  return run;
}

}  // namespace

int RunPrefixEval(int argc, char** argv, int first) {
  Args args("prefix-eval",
            "Quality of important-token loading from a cached prefix against loading all of it.");
  AddModelFlags(args);
  args.Flag("text", "UTF-8 text file", "", true)
      .Flag("prefix-tokens", "the shared prefix, BOS included (whole KV blocks of it are cached)",
            "700")
      .Flag("continuations", "stretches of the text read after the prefix", "32")
      .Flag("tokens", "tokens per stretch (the first predicts the second)", "64")
      .Flag("greedy", "greedy tokens after a stretch's first 16", "32")
      .Flag("kept", "kept fractions, comma-separated", "0.5,0.2")
      .Flag("alpha", "the Jaccard threshold's exponent", "0.6")
      .Flag("probe-heads", "this rank's probe heads, comma-separated", "0,1,2")
      .Flag("dense-layers", "the first layers, which keep the whole prefix", "1");
  args.Bool("json", "print one JSON object as the last line");
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("prefix-eval", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> Status {
    DEJA_ASSIGN_OR_RETURN(int64_t prefix_tokens, args.Int("prefix-tokens"));
    DEJA_ASSIGN_OR_RETURN(int64_t n_cont, args.Int("continuations"));
    DEJA_ASSIGN_OR_RETURN(int64_t n_tokens, args.Int("tokens"));
    DEJA_ASSIGN_OR_RETURN(int64_t greedy, args.Int("greedy"));
    if (n_cont < 1 || n_tokens < kGreedyPrompt + 1 || greedy < 1 || prefix_tokens < 2) {
      return InvalidArgument(
          "--continuations and --greedy must be >= 1, --tokens >= 17, --prefix-tokens >= 2");
    }
    DEJA_ASSIGN_OR_RETURN(std::vector<double> kept, ParseNumberList(args.Str("kept"), "kept"));
    DEJA_ASSIGN_OR_RETURN(std::vector<double> probes_d,
                          ParseNumberList(args.Str("probe-heads"), "probe-heads"));
    DEJA_ASSIGN_OR_RETURN(double alpha, args.Double("alpha"));
    DEJA_ASSIGN_OR_RETURN(int64_t dense_layers, args.Int("dense-layers"));
    DEJA_ASSIGN_OR_RETURN(std::string text, ReadFile(args.Str("text")));
    DEJA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(args.Str("model")));
    StatusOr<std::vector<int32_t>> ids = tok->Encode(text, /*add_bos=*/false);
    if (!ids.ok()) return ids.status().WithContext("--text " + args.Str("text"));
    DEJA_ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromFlags(args, /*kv_pool_mb=*/256));
    Model& model = *m.model;
    const int32_t bs = model.kv_block_slots();
    if (bs <= 0) return FailedPrecondition("the model has no KV block pool");
    const int64_t limit = model.config().max_position_embeddings;
    if (prefix_tokens + n_tokens + greedy > limit) {
      return InvalidArgument("--prefix-tokens + --tokens + --greedy exceed the model's " +
                             std::to_string(limit) + " positions");
    }
    const int64_t need = prefix_tokens - 1 + n_cont * n_tokens;
    if (static_cast<int64_t>(ids->size()) < need) {
      return InvalidArgument("--text has " + std::to_string(ids->size()) + " tokens, " +
                             std::to_string(need) + " needed");
    }
    // The prefix, computed once; its whole blocks are what every run starts from.
    std::vector<int32_t> prefix = {static_cast<int32_t>(model.config().bos_token_id)};
    prefix.insert(prefix.end(), ids->begin(), ids->begin() + (prefix_tokens - 1));
    const int32_t cached = static_cast<int32_t>(prefix.size()) / bs * bs;
    DEJA_ASSIGN_OR_RETURN(std::unique_ptr<kv::SequenceKv> pre, model.NewSequence(cached));
    StepResult step;
    DEJA_RETURN_IF_ERROR(model.Forward({{pre.get(), prefix.data(), cached, false}}, &step));
    const std::vector<int32_t> rest(prefix.begin() + cached, prefix.end());

    std::vector<double> modes = {1.0};
    modes.insert(modes.end(), kept.begin(), kept.end());
    nlohmann::json out = nlohmann::json::array();
    std::vector<std::vector<int32_t>> full_greedy(static_cast<size_t>(n_cont));
    const int32_t layers = static_cast<int32_t>(model.config().num_hidden_layers);
    for (double f : modes) {
      if (f < 1.0) {
        worker::prefix::ImportanceOptions o;
        o.kept_fraction = static_cast<float>(f);
        o.alpha = static_cast<float>(alpha);
        o.dense_layers = static_cast<int32_t>(dense_layers);
        o.probe_heads.clear();
        for (double h : probes_d) o.probe_heads.push_back(static_cast<int32_t>(h));
        DEJA_RETURN_IF_ERROR(model.SetPrefixImportance(o));
      }
      model.TakeImportanceStats();
      double nll = 0;
      int64_t scored = 0, agree = 0, compared = 0;
      for (int64_t c = 0; c < n_cont; ++c) {
        const auto at = ids->begin() + (prefix_tokens - 1) + c * n_tokens;
        std::vector<int32_t> tail = rest;
        tail.insert(tail.end(), at, at + n_tokens);
        DEJA_ASSIGN_OR_RETURN(Run r, RunFromPrefix(model, *pre, cached, tail, 0 + 1, f));
        // Score the stretch's tokens only (not the prefix remainder's).
        for (size_t i = rest.empty() ? 0 : rest.size() - 1; i < r.logprobs.size(); ++i) {
          nll -= r.logprobs[i];
          ++scored;
        }
        std::vector<int32_t> prompt = rest;
        prompt.insert(prompt.end(), at, at + kGreedyPrompt);
        DEJA_ASSIGN_OR_RETURN(
            Run g, RunFromPrefix(model, *pre, cached, prompt, static_cast<int32_t>(greedy), f));
        if (f == 1.0) {
          full_greedy[c] = g.greedy;
        } else {
          for (size_t i = 0; i < g.greedy.size(); ++i) agree += g.greedy[i] == full_greedy[c][i];
          compared += static_cast<int64_t>(g.greedy.size());
        }
      }
      const Model::ImportanceStats st = model.TakeImportanceStats();
      nlohmann::json row;
      row["kept"] = f;
      row["perplexity"] = std::exp(nll / static_cast<double>(scored));
      row["scored_tokens"] = scored;
      if (f < 1.0) {
        row["greedy_agreement"] = static_cast<double>(agree) / static_cast<double>(compared);
        nlohmann::json fallback = nlohmann::json::array(), jac = nlohmann::json::array();
        // null for a dense layer (it never chose).
        for (int32_t l = 0; l < layers && l < static_cast<int32_t>(st.chosen.size()); ++l) {
          const double runs = static_cast<double>(st.chosen[l] + st.fallbacks[l]);
          fallback.push_back(runs > 0 ? nlohmann::json(st.fallbacks[l] / runs) : nlohmann::json());
          jac.push_back(runs > 0 ? nlohmann::json(st.jaccard_sum[l] / runs) : nlohmann::json());
        }
        row["fallback_rate_per_layer"] = fallback;
        row["mean_jaccard_per_layer"] = jac;
        row["jaccard_threshold"] = worker::prefix::JaccardThreshold(f, alpha);
      }
      std::printf(
          "kept %.2f: perplexity %.3f over %lld tokens%s\n", f, row["perplexity"].get<double>(),
          static_cast<long long>(scored),
          f < 1.0 ? (", greedy agreement " + std::to_string(row["greedy_agreement"].get<double>()))
                        .c_str()
                  : "");
      out.push_back(row);
    }
    nlohmann::json j;
    j["text"] = args.Str("text");
    j["prefix_tokens"] = prefix.size();
    j["cached_tokens"] = cached;
    j["continuations"] = n_cont;
    j["alpha"] = alpha;
    j["dense_layers"] = dense_layers;
    j["modes"] = out;
    if (args.On("json")) std::printf("%s\n", j.dump().c_str());
    return Status::Ok();
  };
  if (Status s = run(); !s.ok()) return Fail("prefix-eval", s);
  return 0;
}

}  // namespace deja::cli
