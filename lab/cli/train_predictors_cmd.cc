// `deja train-predictors`: trains the Deja Vu predictors from `deja collect` output
// (predictors/trainer.h) and writes the safetensors + JSON schedule.
#include <cstdio>

#include "lab/cli/commands.h"
#include "cli/args.h"
#include "predictors/trainer.h"

namespace deja::cli {

int RunTrainPredictors(int argc, char** argv, int first) {
  Args args("train-predictors", "Train the Deja Vu predictors from `deja collect` output.");
  args.Flag("data", "directory written by `deja collect`", "", true)
      .Flag("out", "predictor file (<stem>.safetensors; <stem>.json is written beside it)", "",
            true)
      .Flag("rank", "inner dimension r of the d -> r -> units predictors", "128")
      .Flag("epochs", "epochs at most", "20")
      .Flag("batch", "minibatch rows", "1024")
      .Flag("lr", "AdamW learning rate", "1e-3")
      .Flag("weight-decay", "AdamW decoupled weight decay", "0.01")
      .Flag("target-recall", "top-k schedule: smallest k whose validation recall reaches this",
            "0.95")
      .Flag("head-target-recall", "the heads' schedule target instead (0 = --target-recall; 1 "
            "keeps as many heads as the most demanding validation row needs)", "0")
      .Flag("patience", "early stop after this many epochs without a better validation recall",
            "5")
      .Flag("stop-recall", "stop as soon as the validation recall (sigmoid > 0.5) exceeds this "
            "(> 1: never)", "0.99")
      .Flag("threads", "OpenBLAS threads", "2")
      .Flag("seed", "split and initialisation seed", "0");
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("train-predictors", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> Status {
    predictors::TrainOptions o;
    DEJA_ASSIGN_OR_RETURN(int64_t rank, args.Int("rank"));
    DEJA_ASSIGN_OR_RETURN(int64_t epochs, args.Int("epochs"));
    DEJA_ASSIGN_OR_RETURN(int64_t batch, args.Int("batch"));
    DEJA_ASSIGN_OR_RETURN(double lr, args.Double("lr"));
    DEJA_ASSIGN_OR_RETURN(double wd, args.Double("weight-decay"));
    DEJA_ASSIGN_OR_RETURN(double target, args.Double("target-recall"));
    DEJA_ASSIGN_OR_RETURN(double head_target, args.Double("head-target-recall"));
    DEJA_ASSIGN_OR_RETURN(int64_t patience, args.Int("patience"));
    DEJA_ASSIGN_OR_RETURN(double stop, args.Double("stop-recall"));
    DEJA_ASSIGN_OR_RETURN(int64_t threads, args.Int("threads"));
    DEJA_ASSIGN_OR_RETURN(int64_t seed, args.Int("seed"));
    if (rank < 1 || rank > 65536) return InvalidArgument("--rank must be in [1, 65536]");
    if (epochs < 1 || epochs > 10000) return InvalidArgument("--epochs must be in [1, 10000]");
    if (batch < 1 || batch > (1 << 20)) return InvalidArgument("--batch must be in [1, 2^20]");
    if (!(lr > 0)) return InvalidArgument("--lr must be > 0");
    if (!(wd >= 0)) return InvalidArgument("--weight-decay must be >= 0");
    if (!(target > 0 && target <= 1)) return InvalidArgument("--target-recall must be in (0, 1]");
    if (!(head_target >= 0 && head_target <= 1)) {
      return InvalidArgument("--head-target-recall must be in [0, 1]");
    }
    if (patience < 1 || patience > 10000) return InvalidArgument("--patience must be >= 1");
    if (threads < 1 || threads > 1024) return InvalidArgument("--threads must be >= 1");
    o.rank = static_cast<int32_t>(rank);
    o.epochs = static_cast<int32_t>(epochs);
    o.batch = static_cast<int32_t>(batch);
    o.lr = static_cast<float>(lr);
    o.weight_decay = static_cast<float>(wd);
    o.target_recall = static_cast<float>(target);
    o.head_target_recall = static_cast<float>(head_target);
    o.patience = static_cast<int32_t>(patience);
    o.threads = static_cast<int32_t>(threads);
    o.stop_recall = static_cast<float>(stop);
    o.seed = static_cast<uint64_t>(seed);
    auto log = [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    };
    DEJA_RETURN_IF_ERROR(predictors::TrainPredictors(args.Str("data"), args.Str("out"), o, log));
    std::printf("train-predictors: wrote %s\n", args.Str("out").c_str());
    return Status::Ok();
  };
  if (Status s = run(); !s.ok()) return Fail("train-predictors", s);
  return 0;
}

}  // namespace deja::cli
