// `deja generate`: one prompt, generated in this process, streamed to stdout as it is decoded.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/sparsity_cli.h"
#include "common/tokenizer.h"
#include "worker/kv/policy_table.h"
#include "worker/model/generation.h"

namespace deja::cli {

int RunGenerate(int argc, char** argv, int first) {
  Args args("generate", "Generate a continuation of --prompt with the model in this process.");
  AddModelFlags(args);
  AddSamplingFlags(args);
  AddSparsityRunFlags(args);
  AddCachePolicyFlags(args, std::nullopt);
  AddRetainingFlag(args);
  args.Flag("prefill-chunk",
            "prompt tokens per prefill step [default: 512; 64 with --kv-policy locret, whose "
            "cache holds at most its budget plus one chunk]")
      .Flag("prompt", "prompt text (UTF-8)", "", true)
      .Flag("max-new-tokens", "tokens to generate", "32")
      .Bool("ignore-eos", "keep generating after the end-of-sequence token")
      .Bool("json", "print one JSON object (token_ids, text, ...) as the last line");
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("generate", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;

  auto run = [&]() -> Status {
    worker::model::GenerationOptions opt;
    DEJA_ASSIGN_OR_RETURN(opt.sampling, SamplingFromFlags(args));
    DEJA_ASSIGN_OR_RETURN(int64_t max_new, args.Int("max-new-tokens"));
    if (max_new < 0) return InvalidArgument("--max-new-tokens must be >= 0");
    opt.max_new_tokens = static_cast<int32_t>(max_new);
    opt.stop_at_eos = !args.On("ignore-eos");
    DEJA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(args.Str("model")));
    DEJA_ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
                          tok->Encode(args.Str("prompt"), /*add_bos=*/true));
    DEJA_ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromFlags(args));
    DEJA_ASSIGN_OR_RETURN(std::optional<worker::model::SparsityOptions> sparsity,
                          SparsityRunOptions(args));
    if (sparsity) {
      DEJA_RETURN_IF_ERROR(m.model->EnableSparsity(*sparsity));
      opt.sparse = true;
    }
    if (args.Has("kv-policy")) {
      DEJA_ASSIGN_OR_RETURN(opt.cache, CachePolicyFromFlags(args));
    }
    DEJA_RETURN_IF_ERROR(EnableRetainingFromFlags(args, opt.cache, *m.model));
    // A policy scored by retaining heads evicts after each prefill chunk: smaller chunks.
    opt.prefill_chunk = worker::kv::CachePolicyOf(opt.cache.kind).retaining_heads ? 64 : 512;
    if (args.Has("prefill-chunk")) {
      DEJA_ASSIGN_OR_RETURN(int64_t chunk, args.Int("prefill-chunk"));
      if (chunk < 1 || chunk > (1 << 20)) return InvalidArgument("--prefill-chunk must be >= 1");
      opt.prefill_chunk = static_cast<int32_t>(chunk);
    }
    const bool json = args.On("json");
    IncrementalDecoder decoder(*tok, /*skip_special=*/true);
    std::string text;
    auto on_token = [&](const worker::sampling::TokenChoice& c) {
      std::string piece = decoder.Add(c.id);
      text += piece;
      if (!json) {
        std::fputs(piece.c_str(), stdout);
        std::fflush(stdout);
      }
    };
    DEJA_ASSIGN_OR_RETURN(worker::model::GenerationResult r,
                          worker::model::Generate(*m.model, prompt, opt, on_token));
    std::string tail = decoder.Flush();
    text += tail;
    if (!json) {
      std::printf("%s\n", tail.c_str());
      return Status::Ok();
    }
    nlohmann::json j;
    j["prompt_tokens"] = prompt.size();
    j["token_ids"] = nlohmann::json::array();
    j["logprobs"] = nlohmann::json::array();
    for (const worker::sampling::TokenChoice& c : r.tokens) {
      j["token_ids"].push_back(c.id);
      j["logprobs"].push_back(c.logprob);
      if (!c.top.empty()) {
        nlohmann::json top = nlohmann::json::array();
        for (auto [id, lp] : c.top) top.push_back({{"id", id}, {"logprob", lp}});
        j["top_tokens"].push_back(top);
      }
    }
    j["text"] = text;
    j["finish_reason"] = r.finish_reason;
    j["prefill_seconds"] = r.prefill_seconds;
    j["decode_seconds"] = r.decode_seconds;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return Status::Ok();
  };
  if (Status s = run(); !s.ok()) return Fail("generate", s);
  return 0;
}

}  // namespace deja::cli
