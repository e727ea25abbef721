// The reference definitions of the KV-cache and conversion ops, shared with the CPU backend (whose
// host caches write through worker/kv/kv_cache.cc and use these ops only on demand) and with the
// tests' simulated device (tests/common/guarded_backend.h).
#pragma once

#include "kernels/op_table.h"

namespace deja::kernels::ref {

Status KvWrite(Backend&, const KvView& kv, int32_t heads, int32_t head_dim, const int32_t* slots,
               const int32_t* positions, int32_t n, TensorView k, TensorView v);
Status KvEvict(Backend&, const KvView& kv, int32_t heads, const KvEvictArgs& args,
               int32_t* victims);
Status Convert(Backend&, TensorView src, TensorView dst);
Status MaskUnits(Backend&, TensorView x, const uint8_t* keep, int32_t unit_width);

}  // namespace deja::kernels::ref
