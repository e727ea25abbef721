// The deja binary: one entry point, subcommands in their own files.
#include <glog/logging.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"
#include "cli/log_setup.h"

namespace {

constexpr const char* kUsage =
    "usage: deja <command> [flags]\n"
    "commands:\n"
    "  generate   one-shot generation in this process\n"
    "  bench      benchmarks (bench decode)\n"
    "  worker     one tensor-parallel rank serving a coordinator\n"
    "  serve      coordinator plus N supervised workers on this host (gRPC API)\n"
    "  coordinator  the coordinator alone (workers started separately)\n"
    "  client     call a server: generate, stream, tokenize, info, cancel, health\n"
    "  quantize   write a weight-only int8 copy of a checkpoint\n"
    "Every command takes --help, and --log-dir DIR (log files there too) and -v N (verbose).\n"
    "Training and studies (collect, train-predictors, train-retaining, ppl, prefix-eval) are\n"
    "deja-lab's commands.\n";

// Commands that live in deja-lab.
bool IsLabCommand(const std::string& cmd) {
  for (const char* c : {"collect", "train-predictors", "train-retaining", "ppl", "prefix-eval"}) {
    if (cmd == c) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  argc = deja::cli::SetUpLogging(argc, argv);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  if (cmd == "generate") return deja::cli::RunGenerate(argc, argv, 2);
  if (cmd == "bench") return deja::cli::RunBench(argc, argv, 2);
  if (cmd == "worker") return deja::cli::RunWorker(argc, argv, 2);
  if (cmd == "serve") return deja::cli::RunServe(argc, argv, 2);
  if (cmd == "coordinator") return deja::cli::RunCoordinator(argc, argv, 2);
  if (cmd == "client") return deja::cli::RunClient(argc, argv, 2);
  if (cmd == "quantize") return deja::cli::RunQuantize(argc, argv, 2);
  if (IsLabCommand(cmd)) {
    std::fprintf(stderr, "deja: '%s' is a deja-lab command: deja-lab %s --help\n", cmd.c_str(),
                 cmd.c_str());
    return 2;
  }
  std::fprintf(stderr, "deja: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
