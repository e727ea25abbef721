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

// int4 in groups (common/int4.h): the packed values, the tiled scales, and the matrix's relative
// error sqrt(sum (q * scale - w)^2 / sum w^2), by which a model keeps int8 for a matrix int4
// would harm.
struct Int4Matrix {
  Tensor packed;  // int8 storage of Int4Bytes(rows, cols) bytes
  Tensor scale;   // f32 [Int4Scales(rows, cols, group)]
  Shape shape;    // {rows, cols}
  int32_t group = 0;
  double relative_error = 0;
  // The view kernels take: dtype kI4, layout kTiled16, the scales and the group attached.
  TensorView view() const;
};

// Quantizes the 2-D row-major host view w (f32, f16 or bf16) to int4 in groups of `group` K.
// InvalidArgument naming `what` when group is not a positive multiple of 8 dividing w's columns,
// or when w holds a NaN or an infinity.
StatusOr<Int4Matrix> QuantizeInt4(const TensorView& w, int32_t group, const char* what,
                                  ThreadPool* pool = nullptr);

// int4 as a checkpoint holds it (`deja quantize --bits 4`), independent of the kernels' tiling:
// `packed` u8 [rows, cols / 2], byte (n, j) holding element (n, 2j) in its low nibble and
// (n, 2j + 1) in its high one, each as q + 8; `scale` f32 [rows, cols / group], row-major.
struct Int4Rows {
  Tensor packed;
  Tensor scale;
};

// m in the checkpoint's form.
Int4Rows Int4ToRows(const Int4Matrix& m);

// Columns [begin, end) of the checkpoint-form int4 matrix (packed, scale) of `shape` and `group`
// in the kernels' tiled form; begin and end are multiples of group. Tiling what QuantizeInt4
// wrote gives back its bytes and scales exactly (relative_error is left 0: it is not known).
Int4Matrix TileInt4Rows(const uint8_t* packed, const float* scale, Shape shape, int32_t group,
                        int64_t begin, int64_t end);

}  // namespace deja
