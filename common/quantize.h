// Weight-only int8: symmetric per-row (per output channel) quantization of a float matrix. Row n
// gets scale[n] = max_k |w[n, k]| / 127 and q[n, k] = round(w[n, k] / scale[n]) in [-127, 127]
// (ties away from zero; -128 is never produced), so |q * scale - w| <= scale / 2 elementwise. An
// all-zero row gets scale 0 and zeros. Kernels read the pair through TensorView::scale.
#pragma once

#include "common/status.h"
#include "common/tensor.h"

namespace deja {

class ThreadPool;

struct QuantizedMatrix {
  Tensor q;      // int8 [rows, cols], row-major
  Tensor scale;  // f32 [rows]
  // The view kernels take: q's data with scale attached.
  TensorView view() const;
};

// Quantizes the 2-D row-major host view w (f32, f16 or bf16) row by row, split over `pool` when
// given. InvalidArgument naming `what` when w holds a NaN or an infinity (a malformed checkpoint).
StatusOr<QuantizedMatrix> QuantizeRowsInt8(const TensorView& w, const char* what,
                                           ThreadPool* pool = nullptr);

}  // namespace deja
