// `deja quantize`: writes a weight-only int8 or int4 copy of an OPT checkpoint (worker/model/
// quantize_checkpoint.h) that every command loads as it is, without quantizing at start-up.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "common/thread_pool.h"
#include "worker/model/quantize_checkpoint.h"

namespace deja::cli {

int RunQuantize(int argc, char** argv, int first) {
  Args args("quantize",
            "Write a quantized copy of --model into --out: with --bits 8 (the default) the Linear "
            "and embedding matrices int8 per output row (symmetric, one f32 scale per row); with "
            "--bits 4 the layers' matrices int4 in groups of --group columns (one f32 scale per "
            "group), each one whose relative error exceeds --max-error int8 instead, and the "
            "embeddings and lm head int8, as --dtype int4 makes them at load. Everything else as "
            "it was. Serve it like any checkpoint (int4 on the CPU backend only).");
  args.Flag("model", "model directory (HF OPT checkpoint)", "", true)
      .Flag("out", "directory to write (created; must not hold a model.safetensors)", "", true)
      .Flag("bits", "8 or 4", "8")
      .Flag("group", "int4: columns per scale, a positive multiple of 8", "128")
      .Flag("max-error", "int4: the relative error above which a matrix is written int8",
            "0.15")
      .Flag("threads", "CPU threads (0 = one per core)", "0");
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("quantize", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> Status {
    DEJA_ASSIGN_OR_RETURN(int64_t threads, args.Int("threads"));
    if (threads < 0 || threads > 1024) return InvalidArgument("--threads must be in [0, 1024]");
    DEJA_ASSIGN_OR_RETURN(int64_t bits, args.Int("bits"));
    DEJA_ASSIGN_OR_RETURN(int64_t group, args.Int("group"));
    DEJA_ASSIGN_OR_RETURN(double max_error, args.Double("max-error"));
    if (bits != 8 && bits != 4) return InvalidArgument("--bits must be 8 or 4");
    if (group <= 0 || group % 8 != 0 || group > (1 << 20)) {
      return InvalidArgument("--group must be a positive multiple of 8");
    }
    if (!(max_error >= 0)) return InvalidArgument("--max-error must be >= 0");
    worker::model::QuantizeOptions options;
    options.bits = static_cast<int32_t>(bits);
    options.group = static_cast<int32_t>(group);
    options.max_error = max_error;
    ThreadPool pool(static_cast<int>(threads));
    DEJA_ASSIGN_OR_RETURN(
        worker::model::QuantizeReport r,
        worker::model::QuantizeCheckpoint(args.Str("model"), args.Str("out"), &pool, options));
    std::printf("%lld matrices quantized", static_cast<long long>(r.matrices));
    if (bits == 4) {
      std::printf(" (%lld int4 in groups of %lld, %lld left int8 by error or group)",
                  static_cast<long long>(r.int4), static_cast<long long>(group),
                  static_cast<long long>(r.int4_fallbacks));
    }
    std::printf(", %lld tensors copied: %.1f MiB -> %.1f MiB in %s\n",
                static_cast<long long>(r.copied), r.bytes_in / 1048576.0, r.bytes_out / 1048576.0,
                args.Str("out").c_str());
    return Status::Ok();
  };
  if (Status s = run(); !s.ok()) return Fail("quantize", s);
  return 0;
}

}  // namespace deja::cli
