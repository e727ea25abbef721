// `deja train-retaining`: trains the Locret retaining heads from retaining-head training data
// (predictors/retaining_trainer.h) and writes the safetensors + JSON.
#include <cstdio>

#include "cli/args.h"
#include "lab/cli/commands.h"
#include "predictors/retaining_trainer.h"

namespace deja::cli {

int RunTrainRetaining(int argc, char** argv, int first) {
  Args args("train-retaining",
            "Train the Locret retaining heads (one MLP per layer and head scoring [q, k, v]) "
            "from retaining-head training data.");
  args.Flag("data", "directory of retaining-head training data (meta.json, layer_<L>.safetensors)",
            "", true)
      .Flag("out", "heads file (<stem>.safetensors; <stem>.json is written beside it)", "", true)
      .Flag("hidden", "hidden units of each head's MLP", "64")
      .Flag("alpha", "weight of the neighbour term (pred_i - pred_{i-1})^2", "0.0025")
      .Flag("lr", "AdamW learning rate", "1e-3")
      .Flag("weight-decay", "AdamW decoupled weight decay (on W1 and w2)", "0.01")
      .Flag("epochs", "epochs at most", "10")
      .Flag("patience", "early stop after this many epochs without a better validation loss", "2")
      .Flag("batch", "minibatch rows (made of whole runs)", "256")
      .Flag("run", "rows per run of consecutive tokens the batches are made of", "32")
      .Flag("threads", "heads trained concurrently (the result does not depend on it)", "2")
      .Flag("seed", "split, initialisation and batch order seed", "0")
      .Flag("max-rows", "use only the first N rows of each layer (0: all)", "0");
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("train-retaining", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> Status {
    predictors::RetainingTrainOptions o;
    DEJA_ASSIGN_OR_RETURN(int64_t hidden, args.Int("hidden"));
    DEJA_ASSIGN_OR_RETURN(double alpha, args.Double("alpha"));
    DEJA_ASSIGN_OR_RETURN(double lr, args.Double("lr"));
    DEJA_ASSIGN_OR_RETURN(double wd, args.Double("weight-decay"));
    DEJA_ASSIGN_OR_RETURN(int64_t epochs, args.Int("epochs"));
    DEJA_ASSIGN_OR_RETURN(int64_t patience, args.Int("patience"));
    DEJA_ASSIGN_OR_RETURN(int64_t batch, args.Int("batch"));
    DEJA_ASSIGN_OR_RETURN(int64_t run_rows, args.Int("run"));
    DEJA_ASSIGN_OR_RETURN(int64_t threads, args.Int("threads"));
    DEJA_ASSIGN_OR_RETURN(int64_t seed, args.Int("seed"));
    DEJA_ASSIGN_OR_RETURN(int64_t max_rows, args.Int("max-rows"));
    if (hidden < 1 || hidden > 65536) return InvalidArgument("--hidden must be in [1, 65536]");
    if (!(alpha >= 0 && alpha < 1e6)) return InvalidArgument("--alpha must be >= 0");
    if (!(lr > 0 && lr < 1e6)) return InvalidArgument("--lr must be > 0");
    if (!(wd >= 0 && wd < 1e6)) return InvalidArgument("--weight-decay must be >= 0");
    if (epochs < 1 || epochs > 10000) return InvalidArgument("--epochs must be in [1, 10000]");
    if (patience < 1 || patience > 10000) return InvalidArgument("--patience must be >= 1");
    if (batch < 1 || batch > (1 << 20)) return InvalidArgument("--batch must be in [1, 2^20]");
    if (run_rows < 1 || run_rows > (1 << 20)) return InvalidArgument("--run must be in [1, 2^20]");
    if (threads < 1 || threads > 1024) return InvalidArgument("--threads must be in [1, 1024]");
    if (seed < 0) return InvalidArgument("--seed must be >= 0");
    if (max_rows < 0) return InvalidArgument("--max-rows must be >= 0");
    o.hidden = static_cast<int32_t>(hidden);
    o.alpha = static_cast<float>(alpha);
    o.lr = static_cast<float>(lr);
    o.weight_decay = static_cast<float>(wd);
    o.epochs = static_cast<int32_t>(epochs);
    o.patience = static_cast<int32_t>(patience);
    o.batch = static_cast<int32_t>(batch);
    o.run = static_cast<int32_t>(run_rows);
    o.threads = static_cast<int32_t>(threads);
    o.seed = static_cast<uint64_t>(seed);
    o.max_rows = max_rows;
    // Progress goes to stderr, so stdout carries only the result line.
    auto log = [](const std::string& line) {
      std::fprintf(stderr, "%s\n", line.c_str());
      std::fflush(stderr);
    };
    DEJA_RETURN_IF_ERROR(
        predictors::TrainRetainingHeads(args.Str("data"), args.Str("out"), o, log));
    std::printf("train-retaining: wrote %s and %s\n", args.Str("out").c_str(),
                predictors::RetainingMetaPathFor(args.Str("out")).c_str());
    return Status::Ok();
  };
  if (Status s = run(); !s.ok()) return Fail("train-retaining", s);
  return 0;
}

}  // namespace deja::cli
