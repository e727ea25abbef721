// The reference definitions of the KV-cache and conversion ops, shared with the CPU backend (whose
// host caches write through worker/kv/kv_cache.cc and use these ops only on demand) and with the
// tests' simulated device (tests/common/guarded_backend.h); and of int8 Linear with x quantized,
// the CPU's prefill path that the tests compare against.
#pragma once

#include "kernels/op_table.h"

namespace deja::kernels::ref {

Status KvWrite(Backend&, const KvView& kv, int32_t heads, int32_t head_dim, const int32_t* slots,
               const int32_t* positions, int32_t n, TensorView k, TensorView v,
               const float* scores);
// Plain loops in double (the definition in op_table.h).
Status RetainScores(Backend&, const RetainArgs& args);
Status KvEvict(Backend&, const KvView& kv, int32_t heads, const KvEvictArgs& args,
               int32_t* victims);
Status Convert(Backend&, TensorView src, TensorView dst);
Status MaskUnits(Backend&, TensorView x, const uint8_t* keep, int32_t unit_width);
// Each sequence's KvWrite, then its one-token attention (the definition in op_table.h).
Status DecodeAttention(Backend&, const DecodeAttentionArgs& args);
Status DecodeEvict(Backend&, const DecodeEvictArgs& args);

// Linear over int8 weights w (TensorView::scale) with x quantized per row to int8 as the CPU's
// prefill path does (kernels/cpu/i8_vnni.h): per row amax = max |x|, levels = 255 for a row
// without negative values, else 127, inv = levels / amax and q = x * inv (f32) rounded to nearest
// even, scale amax / levels; out = (sum q * w) * scale * w.scale[n] + bias, then ReLU and
// accumulation as Linear. Exact integer sums, the rest in double.
Status LinearI8QuantizedX(TensorView x, TensorView w, TensorView bias, Activation act,
                          bool accumulate, TensorView out);

}  // namespace deja::kernels::ref
