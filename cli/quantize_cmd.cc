// `deja quantize`: writes a weight-only int8 copy of an OPT checkpoint (worker/model/
// quantize_checkpoint.h) that every command loads as int8 without quantizing at start-up.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "common/thread_pool.h"
#include "worker/model/quantize_checkpoint.h"

namespace deja::cli {

int RunQuantize(int argc, char** argv, int first) {
  Args args("quantize",
            "Write an int8 copy of --model into --out: the Linear and embedding matrices "
            "quantized per output row (symmetric, one f32 scale per row), everything else as "
            "it was. Serve it like any checkpoint; it loads as int8 on the CPU backend.");
  args.Flag("model", "model directory (HF OPT checkpoint)", "", true)
      .Flag("out", "directory to write (created; must not hold a model.safetensors)", "", true)
      .Flag("threads", "CPU threads (0 = one per core)", "0");
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("quantize", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> Status {
    DEJA_ASSIGN_OR_RETURN(int64_t threads, args.Int("threads"));
    if (threads < 0 || threads > 1024) return InvalidArgument("--threads must be in [0, 1024]");
    ThreadPool pool(static_cast<int>(threads));
    DEJA_ASSIGN_OR_RETURN(
        worker::model::QuantizeReport r,
        worker::model::QuantizeCheckpoint(args.Str("model"), args.Str("out"), &pool));
    std::printf("%lld matrices quantized, %lld tensors copied: %.1f MiB -> %.1f MiB in %s\n",
                static_cast<long long>(r.matrices), static_cast<long long>(r.copied),
                r.bytes_in / 1048576.0, r.bytes_out / 1048576.0, args.Str("out").c_str());
    return Status::Ok();
  };
  if (Status s = run(); !s.ok()) return Fail("quantize", s);
  return 0;
}

}  // namespace deja::cli
