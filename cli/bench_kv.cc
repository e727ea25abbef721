// `deja bench kv`: how many sequences of --seq-len tokens fit in a fixed KV memory limit under a
// cache policy, and the decode tokens/s of that many sequences decoding together.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/common_flags.h"

namespace deja::cli {

int RunBenchKv(int argc, char** argv, int first) {
  Args args("bench kv", "Concurrent sequences in a KV memory limit, and their decode speed.");
  AddModelFlags(args);
  AddCachePolicyFlags(args, worker::kv::CachePolicyKind::kFull);
  args.Flag("kv-memory-mb", "KV memory limit", "256")
      .Flag("seq-len", "tokens per sequence (prompt + generated)", "1024")
      .Flag("prompt-tokens", "prompt tokens per sequence", "256")
      .Flag("decode-steps", "timed decode steps", "16")
      .Bool("json", "print one JSON object as the last line");
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("bench kv", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> StatusOr<nlohmann::json> {
    DEJA_ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromFlags(args));
    DEJA_ASSIGN_OR_RETURN(worker::kv::CachePolicyConfig cache, CachePolicyFromFlags(args));
    DEJA_ASSIGN_OR_RETURN(int64_t mb, args.Int("kv-memory-mb"));
    DEJA_ASSIGN_OR_RETURN(int64_t seq_len, args.Int("seq-len"));
    DEJA_ASSIGN_OR_RETURN(int64_t prompt, args.Int("prompt-tokens"));
    DEJA_ASSIGN_OR_RETURN(int64_t steps, args.Int("decode-steps"));
    if (prompt < 1 || prompt + steps > seq_len || mb <= 0) {
      return InvalidArgument(
          "need 1 <= --prompt-tokens, --prompt-tokens + --decode-steps <= "
          "--seq-len and --kv-memory-mb > 0");
    }
    worker::model::Model& model = *m.model;
    // Steady-state bytes per sequence: what the policy keeps after its prefill.
    DEJA_ASSIGN_OR_RETURN(
        auto probe, model.NewSequence(static_cast<int32_t>(seq_len), cache,
                                      static_cast<int32_t>(prompt), static_cast<int32_t>(prompt)));
    const int32_t budget = probe->policy().budget();
    const int64_t slots = budget > 0 ? std::min<int64_t>(budget + 1, seq_len) : seq_len;
    const size_t per_seq = model.kv_geometry().SlotBytes() * slots;
    const int64_t fit = static_cast<int64_t>((mb << 20) / per_seq);
    if (fit < 1) return ResourceExhausted("not even one sequence fits in --kv-memory-mb");
    std::mt19937 rng(3);
    std::uniform_int_distribution<int32_t> tok(4,
                                               static_cast<int32_t>(model.config().vocab_size) - 1);
    std::vector<std::unique_ptr<worker::kv::SequenceKv>> seqs;
    std::vector<std::vector<int32_t>> ids(fit);
    worker::model::StepResult out;
    size_t total_bytes = 0;
    for (int64_t i = 0; i < fit; ++i) {
      DEJA_ASSIGN_OR_RETURN(
          auto kv, model.NewSequence(static_cast<int32_t>(seq_len), cache,
                                     static_cast<int32_t>(prompt), static_cast<int32_t>(prompt)));
      ids[i].resize(prompt + steps);
      for (int32_t& t : ids[i]) t = tok(rng);
      ids[i][0] = static_cast<int32_t>(model.config().bos_token_id);
      DEJA_RETURN_IF_ERROR(
          model.Forward({{kv.get(), ids[i].data(), (int32_t)prompt, false}}, &out));
      if (budget > 0 && budget + 1 < kv->capacity()) DEJA_RETURN_IF_ERROR(kv->Resize(budget + 1));
      total_bytes += kv->bytes();
      seqs.push_back(std::move(kv));
    }
    std::vector<worker::model::SequenceStep> batch(fit);
    std::vector<double> times;
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t i = 0; i < fit; ++i) batch[i] = {seqs[i].get(), &ids[i][prompt + s], 1, false};
      auto t0 = std::chrono::steady_clock::now();
      DEJA_RETURN_IF_ERROR(model.Forward(batch, &out));
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double step_s = times[times.size() / 2];
    nlohmann::json j;
    j["model"] = args.Str("model");
    j["kv_policy"] = args.Str("kv-policy");
    j["budget_slots_per_head"] = budget;
    j["kv_memory_mb"] = mb;
    j["seq_len"] = seq_len;
    j["kv_bytes_per_sequence"] = per_seq;
    j["sequences_that_fit"] = fit;
    j["kv_bytes_allocated"] = total_bytes;
    j["decode_ms_per_step"] = step_s * 1e3;
    j["decode_tokens_per_s"] = fit / step_s;
    return j;
  };
  StatusOr<nlohmann::json> j = run();
  if (!j.ok()) return Fail("bench kv", j.status());
  std::printf("%s\n", args.On("json") ? j->dump().c_str() : j->dump(2).c_str());
  return 0;
}

}  // namespace deja::cli
