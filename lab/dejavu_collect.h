// `deja collect`: a dense run of the model over tokenized text that records the Deja Vu
// predictor training rows (docs/architecture.md#deja-vu-lookahead, format in
// predictors/predictor_data.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model/model.h"

namespace deja::worker::dejavu {

struct CollectOptions {
  int32_t context = 512;           // window length in tokens, BOS included
  int64_t max_rows = 400000;       // per layer
  uint64_t seed = 0;               // order in which the windows are run
  std::string model_dir;           // recorded in meta.json
  std::vector<std::string> texts;  // recorded in meta.json
};

struct CollectSummary {
  int64_t rows = 0;  // per layer
  int64_t windows = 0, windows_total = 0;
  int64_t tokens_total = 0;                 // tokens of all documents (BOS excluded)
  std::vector<double> mlp_active_fraction;  // per layer
  double seconds = 0;
};

// `documents` are tokenized texts (no BOS); each is cut into windows of context - 1 tokens with
// a BOS in front, like `deja ppl`. The windows run in a seeded random order until max_rows
// rows per layer are recorded (the last window partly), so a text larger than the cap
// contributes a uniform sample of its windows. Writes `out_dir` (created if needed).
StatusOr<CollectSummary> Collect(model::Model& model,
                                 const std::vector<std::vector<int32_t>>& documents,
                                 const CollectOptions& options, const std::string& out_dir,
                                 const std::function<void(const std::string&)>& progress);

}  // namespace deja::worker::dejavu
