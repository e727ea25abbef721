#include "cli/common_flags.h"

#include <fstream>
#include <sstream>

namespace deja::cli {

void AddModelFlags(Args& args) {
  args.Flag("model", "model directory (HF OPT checkpoint: config.json, safetensors, tokenizer)",
            "", true)
      .Flag("threads", "CPU threads (0 = one per core)", "0");
}

void AddSamplingFlags(Args& args) {
  args.Bool("do-sample", "sample instead of greedy decoding")
      .Flag("temperature", "sampling temperature (> 0 with --do-sample)", "1.0")
      .Flag("top-k", "keep the k most likely tokens (0 = off)", "0")
      .Flag("top-p", "nucleus sampling mass in (0, 1]", "1.0")
      .Flag("repetition-penalty", "CTRL-style penalty (> 0; 1 = off)", "1.0")
      .Flag("seed", "sampling seed", "0")
      .Flag("top-n", "alternatives reported per token (0..20)", "0");
}

StatusOr<worker::SamplingParams> SamplingFromFlags(const Args& args) {
  worker::SamplingParams p;
  p.do_sample = args.On("do-sample");
  DEJA_ASSIGN_OR_RETURN(double t, args.Double("temperature"));
  DEJA_ASSIGN_OR_RETURN(int64_t k, args.Int("top-k"));
  DEJA_ASSIGN_OR_RETURN(double tp, args.Double("top-p"));
  DEJA_ASSIGN_OR_RETURN(double rp, args.Double("repetition-penalty"));
  DEJA_ASSIGN_OR_RETURN(int64_t seed, args.Int("seed"));
  DEJA_ASSIGN_OR_RETURN(int64_t n, args.Int("top-n"));
  p.temperature = static_cast<float>(t);
  p.top_k = static_cast<int32_t>(k);
  p.top_p = static_cast<float>(tp);
  p.repetition_penalty = static_cast<float>(rp);
  p.seed = static_cast<uint64_t>(seed);
  p.top_n = static_cast<int32_t>(n);
  DEJA_RETURN_IF_ERROR(p.Validate());
  return p;
}

StatusOr<LoadedModel> LoadModelFromFlags(const Args& args) {
  LoadedModel m;
  DEJA_ASSIGN_OR_RETURN(int64_t threads, args.Int("threads"));
  m.backend = kernels::MakeCpuBackend(static_cast<int>(threads));
  DEJA_ASSIGN_OR_RETURN(m.model, worker::OptModel::Load(args.Str("model"), m.backend.get()));
  return m;
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace deja::cli
