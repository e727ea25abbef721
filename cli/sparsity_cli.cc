#include "cli/sparsity_cli.h"

#include <string>

#include "common/enum_table.h"

namespace deja::cli {
namespace {

using PredictorThread = worker::model::SparsityOptions::PredictorThread;

// --async-predictors: where the predictors run.
struct PredictorThreadRow {
  const char* name;
  const char* help;
  PredictorThread thread;
};
const PredictorThreadRow kPredictorThreads[] = {
    {"on", "on their own thread", PredictorThread::kOwnThread},
    {"off", "inline on the forward thread", PredictorThread::kInline},
    {"auto", "on their own thread only when a core is left free by the model's threads",
     PredictorThread::kAuto},
};

StatusOr<float> Fraction(const Args& args, const char* name, bool allow_zero) {
  DEJA_ASSIGN_OR_RETURN(double v, args.Double(name));
  if (!(v <= 1.0) || v < 0.0 || (!allow_zero && v == 0.0)) {
    return InvalidArgument(std::string("--") + name + " must be in " +
                           (allow_zero ? "[0, 1]" : "(0, 1]"));
  }
  return static_cast<float>(v);
}

}  // namespace

void AddSparsityRunFlags(Args& args) {
  args.Flag("predictors", "Deja Vu predictor safetensors (its .json beside it): run sparse")
      .Flag("sparsity-oracle",
            "speed runs without predictors: keep this fraction of heads and neurons, chosen "
            "pseudo-randomly per token, in every layer")
      .Flag("mlp-fraction",
            "override the schedule: fraction of MLP neurons kept in its sparse blocks (0 = "
            "schedule; with --dense-layers given, in every block past those layers)",
            "0")
      .Flag("head-fraction",
            "override the schedule: fraction of heads kept in its head-sparse blocks (0 = "
            "schedule; with --dense-layers given, in every block past those layers and layer 0)",
            "0")
      .Flag("dense-layers",
            "override the schedule: first layers kept dense; blocks the schedule keeps dense "
            "then follow the fractions too (-1 = schedule)",
            "-1")
      .Flag("dense-fallback", "batched decode runs a block dense above this union fraction", "0.8")
      .Flag("selection-groups",
            "top-k within this many unit groups (a multiple of the ranks; 0 = one per rank)", "0")
      .Flag("async-predictors", "where the predictors run: " + RowsHelp(kPredictorThreads),
            FindRow(kPredictorThreads, &PredictorThreadRow::thread,
                    worker::model::SparsityOptions().predictor_thread)
                ->name);
}

StatusOr<std::optional<worker::model::SparsityOptions>> SparsityRunOptions(const Args& args) {
  const bool oracle = args.Has("sparsity-oracle");
  if (!args.Has("predictors") && !oracle) return std::optional<worker::model::SparsityOptions>();
  if (args.Has("predictors") && oracle) {
    return InvalidArgument("--predictors and --sparsity-oracle are mutually exclusive");
  }
  worker::model::SparsityOptions o;
  o.predictors = args.Str("predictors");
  if (oracle) {
    DEJA_ASSIGN_OR_RETURN(o.oracle_fraction, Fraction(args, "sparsity-oracle", false));
  }
  DEJA_ASSIGN_OR_RETURN(o.mlp_fraction, Fraction(args, "mlp-fraction", true));
  DEJA_ASSIGN_OR_RETURN(o.head_fraction, Fraction(args, "head-fraction", true));
  DEJA_ASSIGN_OR_RETURN(o.dense_fallback, Fraction(args, "dense-fallback", false));
  DEJA_ASSIGN_OR_RETURN(int64_t dense_layers, args.Int("dense-layers"));
  if (dense_layers < -1 || dense_layers > 4096) {
    return InvalidArgument("--dense-layers must be -1 or a layer count");
  }
  o.dense_layers = static_cast<int32_t>(dense_layers);
  DEJA_ASSIGN_OR_RETURN(int64_t groups, args.Int("selection-groups"));
  if (groups < 0 || groups > 4096) return InvalidArgument("--selection-groups must be >= 0");
  o.selection_groups = static_cast<int32_t>(groups);
  DEJA_ASSIGN_OR_RETURN(
      const PredictorThreadRow* where,
      ParseRow(kPredictorThreads, args.Str("async-predictors"), "--async-predictors"));
  o.predictor_thread = where->thread;
  return std::optional<worker::model::SparsityOptions>(o);
}

}  // namespace deja::cli
