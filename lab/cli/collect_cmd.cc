// `deja collect`: records Deja Vu predictor training rows from a dense run over text files
// (predictors/collect.h).
#include <cstdio>
#include <sstream>

#include "lab/cli/commands.h"
#include "cli/common_flags.h"
#include "common/tokenizer.h"
#include "lab/dejavu_collect.h"
#include "lab/locret_collect.h"

namespace deja::cli {

int RunCollect(int argc, char** argv, int first) {
  Args args("collect", "Record predictor training rows (inputs, labels) from a dense run.");
  AddModelFlags(args);
  args.Flag("text", "UTF-8 text file(s), comma-separated", "", true)
      .Flag("out", "output directory (meta.json, layer_<L>.safetensors)", "", true)
      .Flag("context", "window length in tokens, BOS included", "512")
      .Flag("max-rows", "rows per layer at most (windows sampled in seeded random order)", "400000")
      .Flag("seed", "window order seed", "0")
      .Flag("answer-tokens",
            "with --locret: each window's last tokens, whose queries label the others", "128")
      .Flag("label",
            "with --locret: logit (the max pre-softmax logit, the paper's) or logprob (the max "
            "log attention probability)",
            "logprob");
  args.Bool("locret",
            "record Locret retaining-head rows (per head [q, k, v] and the max logit later "
            "answer queries give the token) instead of Deja Vu predictor rows");
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("collect", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> Status {
    worker::dejavu::CollectOptions o;
    DEJA_ASSIGN_OR_RETURN(int64_t context, args.Int("context"));
    DEJA_ASSIGN_OR_RETURN(o.max_rows, args.Int("max-rows"));
    DEJA_ASSIGN_OR_RETURN(int64_t seed, args.Int("seed"));
    if (context < 2 || context > (1 << 20)) return InvalidArgument("--context must be >= 2");
    if (o.max_rows < 1) return InvalidArgument("--max-rows must be >= 1");
    o.context = static_cast<int32_t>(context);
    o.seed = static_cast<uint64_t>(seed);
    o.model_dir = args.Str("model");
    std::stringstream list(args.Str("text"));
    for (std::string f; std::getline(list, f, ',');) {
      if (!f.empty()) o.texts.push_back(f);
    }
    if (o.texts.empty()) return InvalidArgument("--text names no file");
    DEJA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(o.model_dir));
    std::vector<std::vector<int32_t>> docs;
    for (const std::string& f : o.texts) {
      DEJA_ASSIGN_OR_RETURN(std::string text, ReadFile(f));
      StatusOr<std::vector<int32_t>> ids = tok->Encode(text, /*add_bos=*/false);
      if (!ids.ok()) return ids.status().WithContext("--text " + f);
      std::printf("collect: %s: %zu tokens\n", f.c_str(), ids->size());
      docs.push_back(std::move(*ids));
    }
    DEJA_ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromFlags(args));
    auto progress = [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    };
    if (args.On("locret")) {
      worker::locret::CollectOptions lo;
      lo.context = o.context;
      lo.max_rows = o.max_rows;
      lo.seed = o.seed;
      lo.model_dir = o.model_dir;
      lo.texts = o.texts;
      DEJA_ASSIGN_OR_RETURN(int64_t answer, args.Int("answer-tokens"));
      if (answer < 1 || answer >= context) {
        return InvalidArgument("--answer-tokens must be in [1, --context)");
      }
      lo.answer_tokens = static_cast<int32_t>(answer);
      const std::string label = args.Str("label");
      if (label != "logit" && label != "logprob") {
        return InvalidArgument("--label must be logit or logprob");
      }
      lo.label = label == "logit" ? worker::locret::RetainingLabel::kLogit
                                  : worker::locret::RetainingLabel::kLogProb;
      DEJA_ASSIGN_OR_RETURN(
          worker::locret::CollectSummary ls,
          worker::locret::CollectRetaining(*m.model, docs, lo, args.Str("out"), progress));
      std::printf(
          "collect --locret: %lld rows per layer from %lld of %lld windows in %.1f s -> %s\n",
          static_cast<long long>(ls.rows), static_cast<long long>(ls.windows),
          static_cast<long long>(ls.windows_total), ls.seconds, args.Str("out").c_str());
      return Status::Ok();
    }
    DEJA_ASSIGN_OR_RETURN(worker::dejavu::CollectSummary sum,
                          worker::dejavu::Collect(*m.model, docs, o, args.Str("out"), progress));
    std::printf("collect: %lld rows per layer from %lld of %lld windows in %.1f s -> %s\n",
                static_cast<long long>(sum.rows), static_cast<long long>(sum.windows),
                static_cast<long long>(sum.windows_total), sum.seconds, args.Str("out").c_str());
    for (size_t l = 0; l < sum.mlp_active_fraction.size(); ++l) {
      std::printf("collect: layer %zu: %.1f%% of MLP neurons active\n", l,
                  100.0 * sum.mlp_active_fraction[l]);
    }
    return Status::Ok();
  };
  if (Status s = run(); !s.ok()) return Fail("collect", s);
  return 0;
}

}  // namespace deja::cli
