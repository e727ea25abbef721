// `deja collect --locret`: a dense run of the model over tokenized text that records the Locret
// retaining heads' training rows (docs/architecture.md#locret; format in
// predictors/retaining_data.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model/model.h"

namespace deja::worker::locret {

// What a token's label measures for one answer query, maxed over the answer queries: the
// pre-softmax logit (the paper's), or the log of the attention probability (the logit minus the
// query's log-softmax denominator).
enum class RetainingLabel { kLogit, kLogProb };

struct CollectOptions {
  int32_t context = 1024;       // window length in tokens, BOS included
  int32_t answer_tokens = 128;  // the window's last tokens: the queries the labels come from
  int64_t max_rows = 100000;    // per layer
  RetainingLabel label = RetainingLabel::kLogProb;
  uint64_t seed = 0;      // order in which the windows are run
  std::string model_dir;  // recorded in meta.json
  std::vector<std::string> texts;
};

struct CollectSummary {
  int64_t rows = 0;  // per layer
  int64_t windows = 0, windows_total = 0;
  double seconds = 0;
};

// Each document (tokenized, no BOS) is cut into windows of context - 1 tokens with a BOS in
// front, like `deja ppl`; only whole windows are used. Each window gets a context length c, seeded
// uniform in [answer_tokens, context - answer_tokens], and runs its first c + answer_tokens
// positions: positions j < c are rows. For layer L, head h and position j the input is the head's
// [q, k, v] of token j and the label is the largest pre-softmax logit (q_i . k_j /
// sqrt(head_dim)) over the answer queries i in [c, c + answer_tokens). Windows run densely in a
// seeded random order until max_rows rows per layer are recorded (the last window partly).
StatusOr<CollectSummary> CollectRetaining(model::Model& model,
                                          const std::vector<std::vector<int32_t>>& documents,
                                          const CollectOptions& options, const std::string& out_dir,
                                          const std::function<void(const std::string&)>& progress);

// The label of every position j < context_len of one head from its queries and keys (rows of
// `stride` floats, the head's head_dim values at offset `offset`): the max over i in
// [context_len, n) of scale * q_i . k_j (kLogit), or of that minus query i's log-softmax
// denominator over keys [0, i] (kLogProb). Exposed for the tests' hand computation.
void RetainingLabels(const float* q, const float* k, int64_t stride, int64_t offset, int32_t n,
                     int32_t context_len, int32_t head_dim, float* labels,
                     RetainingLabel kind = RetainingLabel::kLogit);

}  // namespace deja::worker::locret
