// Helpers the OPT model's source files share (opt_model.cc: loading and the layers;
// opt_model_logits.cc: the final LayerNorm, the LM head and the logits gather; opt_model_graph.cc:
// decode steps as captured op graphs).
#pragma once

#include <cstdint>

#include "common/tensor.h"

namespace deja::worker::model::opt_internal {

inline constexpr float kLayerNormEps = 1e-5f;
inline constexpr int32_t kPositionOffset = 2;  // OPT's learned positions start at row 2

// The first `rows` x `cols` of a workspace tensor.
inline TensorView Rows(const Tensor& t, int64_t rows, int64_t cols) {
  TensorView v = t.view();
  v.shape = Shape{rows, cols};
  return v;
}

}  // namespace deja::worker::model::opt_internal
