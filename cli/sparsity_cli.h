// Deja Vu flags of the single-process subcommands (generate, ppl, bench decode): which
// predictors (or the speed-run oracle) and schedule overrides. The serving flags
// (--sparsity-default ...) are in common_flags.h.
#pragma once

#include <optional>

#include "cli/args.h"
#include "common/status.h"
#include "worker/model/model.h"

namespace deja::cli {

// --predictors, --sparsity-oracle, --mlp-fraction, --head-fraction, --dense-layers,
// --dense-fallback, --selection-groups.
void AddSparsityRunFlags(Args& args);
// nullopt when neither --predictors nor --sparsity-oracle is given (dense run); InvalidArgument
// naming the flag for a bad value.
StatusOr<std::optional<worker::model::SparsityOptions>> SparsityRunOptions(const Args& args);

}  // namespace deja::cli
