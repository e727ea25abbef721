// Important-token loading (IMPRESS; docs/architecture.md#prefix-cache): when a sequence starts
// from a cached prefix, each layer keeps only the prefix tokens that the sequence's new tokens
// attend to. Three probe heads per layer score the prefix tokens (the attention probabilities
// the new queries give each, summed over the queries) and each takes its top k of the n prefix
// tokens. Heads of one layer tend to agree on which tokens matter, so when the probe heads'
// sets agree (mean pairwise Jaccard similarity >= t = j^alpha, j = (k/n) / (2 - k/n) being the
// similarity two random k-of-n sets have on average), every head of the layer keeps the set of
// the probe head that agrees most with the others; otherwise (a fallback) the layer keeps the
// whole prefix. The first `dense_layers` layers always keep the whole prefix.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/op_table.h"

namespace deja::worker::prefix {

struct ImportanceOptions {
  // k / n: the fraction of the prefix each layer keeps.
  float kept_fraction = 0.5f;
  float alpha = 0.6f;
  // This rank's heads that probe (each rank probes with its own: heads of a layer agree).
  std::vector<int32_t> probe_heads = {0, 1, 2};
  // The first layers keep the whole prefix. Measured on opt-mini
  // (docs/studies/prefix-importance-quality.md): layer 0's probe heads often agree while its
  // other heads attend elsewhere, and choosing in layer 0 too cost +12.0% perplexity on
  // war_and_peace and +3.7% on tinyshakespeare at 50% kept; loading it whole costs 1/layers of
  // the savings.
  int32_t dense_layers = 1;
  // Block files keep their tokens in importance order, rewritten in the background from the
  // choices loads make (PrefixStore); false keeps them in position order (to compare).
  bool reorder_files = true;
  Status Validate(int32_t heads) const;
};

// j^alpha with j = f / (2 - f), f the kept fraction.
double JaccardThreshold(double kept_fraction, double alpha);
// |a ∩ b| / |a ∪ b| of two sorted sets (1 when both are empty).
double Jaccard(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

struct LayerChoice {
  bool fallback = false;
  double mean_jaccard = 0;
  std::vector<int32_t> kept;  // prefix positions, sorted (all of them on a fallback)
};

// The choice for one layer of a host cache `kv` whose slots [0, prefix) hold positions
// [0, prefix) (a cached prefix), for the new queries q ([n, heads * head_dim] rows, row stride
// q_stride, f32 on the host) of that layer. `scale` as the attention's.
StatusOr<LayerChoice> ChooseImportant(const kernels::KvView& kv, int32_t prefix, const float* q,
                                      int64_t q_stride, int32_t n, int32_t heads, int32_t head_dim,
                                      float scale, const ImportanceOptions& o);

// Empties (position -1) the prefix slots not in `kept` for every head of the layer `kv`.
void KeepOnly(const kernels::KvView& kv, int32_t prefix, int32_t heads,
              const std::vector<int32_t>& kept);

}  // namespace deja::worker::prefix
