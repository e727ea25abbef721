// The argument checks the validating ops (ops.cc, ops_kv.cc) share: each returns
// InvalidArgument naming the op and the argument (Unimplemented for a dtype the backend lacks).
// Internal to kernels/.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/backend.h"
#include "kernels/op_table.h"

namespace deja::kernels::check {

Status Bad(const char* op, const char* arg, const std::string& why);
bool IsFloat(DType t);
// Every dimension positive (zero rows allowed for the leading one) and a data pointer whenever
// there are elements; rank within [min_rank, max_rank].
Status CheckView(const char* op, const char* arg, const TensorView& v, int min_rank, int max_rank);
// An f32 row-major activation of rank 1 or 2.
Status CheckActivation(const char* op, const char* arg, const TensorView& v);
// A weight: row-major, or kTiled16 (a 2-D bf16 or int8 matrix) where `backend` reads it for op
// `id`. Matrices (rank 2) may be int8 with their scales; vectors (biases, LayerNorm) are floats.
Status CheckWeight(const char* op, const char* arg, const TensorView& v, int rank,
                   const Backend* backend = nullptr, OpId id = OpId::kCount);
// `out` shares no byte with `in`.
Status CheckNoOverlap(const char* op, const char* out_arg, const TensorView& out,
                      const char* in_arg, const TensorView& in);
// Memory `backend` cannot reach is refused before anything reads it. A view without data (an
// absent bias) is in no memory.
Status CheckDevice(const Backend& backend, const Device& want, const char* op, const char* arg,
                   const void* data, const Device& d);
struct NamedView {
  const char* name;
  const TensorView& view;
};
Status CheckDevices(const Backend& backend, const char* op, std::initializer_list<NamedView> args);
// The backend implements `op` over `dtype` and fills its slot (fn).
Status CheckSupport(Backend& backend, OpId op, DType dtype, const void* fn);
std::string Dims(int64_t r, int64_t c);
// A KvView's pointers, sizes and layout (contiguous, or paged where the backend reads pages); a
// contiguous cache must not overlap `out` when given.
Status CheckKvLayout(const Backend& backend, const char* op, const KvView& kv, int64_t head_dim,
                     int64_t heads, const TensorView* out);
// n_rows >= 1 and every rows[j] in [0, limit).
Status CheckRowIds(const char* op, const int32_t* rows, int64_t n_rows, int64_t limit,
                   const char* limit_name);

}  // namespace deja::kernels::check
