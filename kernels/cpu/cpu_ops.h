// The CPU backend's op-table entries (internal to kernels/cpu). Arguments arrive validated by
// kernels/ops.cc; each entry splits its work over the backend's thread pool.
#pragma once

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/op_table.h"

namespace deja {
class ThreadPool;
}

namespace deja::kernels::cpu {

struct LinearEpilogue;

Status CpuLinear(Backend& backend, TensorView x, TensorView w, TensorView bias, Activation act,
                 bool accumulate, TensorView out);
Status CpuAttention(Backend& backend, const AttentionArgs& args);
Status CpuKvEvict(Backend& backend, const KvView& kv, int32_t heads, const KvEvictArgs& args,
                  int32_t* victims);
Status CpuGatherLinear(Backend& backend, TensorView x, TensorView w, TensorView bias,
                       const int32_t* rows, int64_t n_rows, Activation act, bool accumulate,
                       TensorView out);
Status CpuRetainScores(Backend& backend, const RetainArgs& args);
Status CpuGatherLinearT(Backend& backend, TensorView x, TensorView wt, const int32_t* rows,
                        int64_t n_rows, bool accumulate, TensorView out);

// Linear over int4 weights (common/int4.h; kernels/cpu/linear_i4.cc): x quantized per row, on
// AVX512-VNNI where enabled (VnniEnabled()), else the portable loop.
Status LinearI4(ThreadPool* pool, const TensorView& x, const TensorView& w,
                const LinearEpilogue& epilogue, float* out);
// Its quantization of one row x [K]: q = x * (127 / max |x|) rounded to nearest even, the sums of
// q per `group` (K a multiple of it) and the scale (max |x| / 127). AVX-512 where VnniEnabled(),
// else element by element; the same bits either way.
float QuantizeRowS8(const float* x, int64_t k_dim, int64_t group, int8_t* q, int32_t* sums);

// M at and below which Linear (and the gathers) use the weight-streaming kernel rather than
// OpenBLAS.
constexpr int64_t kLinearSmallMMax = 32;

}  // namespace deja::kernels::cpu
