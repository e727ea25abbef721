// The deja-lab binary: what trains and studies deja's methods, kept out of the serving binary.
// It uses the model through its public interfaces (worker/model/model.h, LayerObserver).
#include <glog/logging.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "cli/log_setup.h"
#include "lab/cli/commands.h"

namespace {

constexpr const char* kUsage =
    "usage: deja-lab <command> [flags]\n"
    "commands:\n"
    "  collect    record Deja Vu predictor (or, --locret, retaining-head) training rows from a\n"
    "             dense run over text\n"
    "  train-predictors  train the Deja Vu predictors from `collect` output\n"
    "  train-retaining   train the Locret retaining heads (KV cache token scores)\n"
    "  ppl        perplexity of a text file (dense, sparse, or under a KV cache policy)\n"
    "  prefix-eval  quality of important-token loading from a cached prefix\n"
    "Every command takes --help, and --log-dir DIR (log files there too) and -v N (verbose).\n";

}  // namespace

int main(int argc, char** argv) {
  argc = deja::cli::SetUpLogging(argc, argv);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "collect") return deja::cli::RunCollect(argc, argv, 2);
  if (cmd == "train-predictors") return deja::cli::RunTrainPredictors(argc, argv, 2);
  if (cmd == "train-retaining") return deja::cli::RunTrainRetaining(argc, argv, 2);
  if (cmd == "ppl") return deja::cli::RunPerplexity(argc, argv, 2);
  if (cmd == "prefix-eval") return deja::cli::RunPrefixEval(argc, argv, 2);
  std::fprintf(stderr, "deja-lab: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
