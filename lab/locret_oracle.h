// An upper-bound study for Locret, not a serving policy: scores every token of a window by the
// attention that the window's scored queries actually give it in a dense run, so a locret
// evaluation keeps what a retaining head that knew the future would keep (`deja ppl
// --locret-oracle`; docs/performance.md#locret).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "worker/model/model.h"

namespace deja::worker::locret {

// kMax: a token's largest log attention probability over the queries (the training label's
// measure, over every later query); kSum: the log of its summed attention probability (the
// attention mass evicting it takes from those queries, H2O's measure with hindsight).
enum class OracleKind { kMax, kSum };

// One head's scores for positions j < n from its queries and keys (rows of `stride` floats, the
// head's head_dim values at `offset`): over the queries i in [max(from, j), n), with p_ij =
// softmax_j'(q_i . k_j' / sqrt(head_dim)) over j' <= i, max_i log p_ij (kMax) or log sum_i p_ij
// (kSum). Every j has at least its own query when j >= from; from must be in [0, n).
void OracleScores(const float* q, const float* k, int64_t stride, int64_t offset, int32_t n,
                  int32_t from, int32_t head_dim, OracleKind kind, float* scores);

// Runs a window densely and hands its oracle scores to the model as the retaining-score override
// (Model::SetRetainingOverride); the destructor restores the retaining heads. One process, host
// backends.
class OracleScorer {
 public:
  // skip_first: the first positions are never kept by score (their score is the lowest; the
  // stabilisers still keep them while they are recent).
  OracleScorer(model::Model& model, OracleKind kind, int32_t skip_first);
  ~OracleScorer();
  OracleScorer(const OracleScorer&) = delete;
  OracleScorer& operator=(const OracleScorer&) = delete;

  // `tokens` are the positions the evaluation writes (BOS first); the queries scored are those at
  // positions >= from. Replaces the previous window's scores.
  Status Prepare(const std::vector<int32_t>& tokens, int32_t from);

  // The last window's table, [layer][position][head].
  const std::vector<float>& table() const { return table_; }

 private:
  model::Model& model_;
  OracleKind kind_;
  int32_t skip_first_;
  std::vector<float> table_;
};

}  // namespace deja::worker::locret
