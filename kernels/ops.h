// The ops callers use: free functions that validate every argument (returning InvalidArgument
// naming the offending one), check that the backend supports the (op, weight dtype) pair and
// dispatch through the backend's op table. Backend table entries assume validated arguments.
//
// Conventions shared by all backends:
//  - every view (and the KvView) is in the memory of the backend's device(), else
//    InvalidArgument names the argument and both devices; the TopK outputs are raw pointers into
//    that memory; the index arrays (ids, q_pos, head_ids, rows) are host pointers (backend.h);
//  - activations are f32, contiguous, row-major; weights are f32, f16 or bf16, and the matrices
//    of Embedding, Linear and the gathers may be int8 with TensorView::scale (one per row; per
//    column of GatherLinearT's transposed weight, the output channels it was quantized by);
//  - outputs must not overlap inputs, except where noted (in-place LayerNorm and LogSoftmax);
//  - an op with zero rows is a no-op that returns Ok.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/op_table.h"

namespace deja::kernels {

// out[i, :] = table[ids[i], :] (+= when accumulate). table [vocab, dim]; out f32 [n, dim]; every
// id must be in [0, vocab).
Status Embedding(Backend& backend, TensorView table, const int32_t* ids, int64_t n, bool accumulate,
                 TensorView out);
// The same with the ids in the backend's memory (i32 [n] on its device), which nothing reads on
// the host: the caller guarantees every id is in [0, vocab). Its staging-free form is what a
// captured op graph needs (kernels/backend.h BeginCapture).
Status EmbeddingDeviceIds(Backend& backend, TensorView table, TensorView ids, bool accumulate,
                          TensorView out);

// Row-wise LayerNorm of x [rows, dim]; gamma and beta [dim] in one weight dtype; eps > 0.
// out may be x itself (same data pointer).
Status LayerNorm(Backend& backend, TensorView x, TensorView gamma, TensorView beta, float eps,
                 TensorView out);

// out [M, N] = act(x [M, K] · w [N, K]ᵀ + bias [N]) (+ previous out when accumulate; the
// activation applies before the accumulation). bias may be empty (data == nullptr) and may have
// any float dtype.
Status Linear(Backend& backend, TensorView x, TensorView w, TensorView bias, Activation act,
              bool accumulate, TensorView out);

// Causal attention of each query token over the slots of a KvView whose position is in
// [0, q_pos[t]], with logits scale * (q . k) (scale finite). A query that sees no slot gets a
// zero output row. q_pos values must be >= 0.
Status Attention(Backend& backend, const AttentionArgs& args);

// out[m, :] += x[m, :] + bias[:] over equal shapes of x and out; bias [cols] in any float dtype
// or empty (data == nullptr).
Status Add(Backend& backend, TensorView x, TensorView bias, TensorView out);

// out[m, :] = log_softmax(x[m, :]); out may be x itself.
Status LogSoftmax(Backend& backend, TensorView x, TensorView out);

// The k (1 <= k <= cols) largest values of each row of x [rows, cols] into values/indices
// [rows, k], descending, ties to the lower index, NaN ranked below every number.
Status TopK(Backend& backend, TensorView x, int32_t k, float* values, int32_t* indices);

// Gather-GEMV: out [M, n_rows] = act(x [M, K] · w[rows]ᵀ + bias[rows]) (+ previous out when
// accumulate; the activation applies before the accumulation). Every rows[j] in [0, R) for
// w [R, K]; rows may repeat; n_rows >= 1; bias [R] or empty.
Status GatherLinear(Backend& backend, TensorView x, TensorView w, TensorView bias,
                    const int32_t* rows, int64_t n_rows, Activation act, bool accumulate,
                    TensorView out);

// Gather-transposed-GEMV: out [M, N] = x [M, n_rows] · wt[rows] (+ previous out when
// accumulate), wt [R, N] the transposed weight. Every rows[j] in [0, R); n_rows >= 1.
Status GatherLinearT(Backend& backend, TensorView x, TensorView wt, const int32_t* rows,
                     int64_t n_rows, bool accumulate, TensorView out);

// Writes n tokens' keys and values into a cache (KvWriteFn in op_table.h): slots [heads, n] in
// [0, kv.used), positions [n] >= 0, host arrays; k, v f32 [n, heads * head_dim]; scores f32
// [n, heads] in the backend's memory, or null (zero scores).
Status KvWrite(Backend& backend, const KvView& kv, int32_t heads, int32_t head_dim,
               const int32_t* slots, const int32_t* positions, int32_t n, TensorView k,
               TensorView v, const float* scores = nullptr);

// Locret retaining-head scores of n tokens (RetainArgs in op_table.h): n >= 0, heads, head_dim
// and hidden positive, row_stride >= heads * head_dim, every pointer in the backend's memory.
Status RetainScores(Backend& backend, const RetainArgs& args);

// Frees each head's `args.excess` lowest-ranked candidate slots (KvEvictFn in op_table.h);
// victims [heads, excess] int32 in the backend's memory (may be null when excess is 0).
Status KvEvict(Backend& backend, const KvView& kv, int32_t heads, const KvEvictArgs& args,
               int32_t* victims);

// A decode step of many sequences over one layer of a paged pool (DecodeAttentionFn in
// op_table.h): each sequence's new key and value written, then its one-token attention.
Status DecodeAttention(Backend& backend, const DecodeAttentionArgs& args);

// A decode step's evictions over one layer of a paged pool, every sequence's KvEvict arguments
// read from device memory (DecodeEvictFn in op_table.h).
Status DecodeEvict(Backend& backend, const DecodeEvictArgs& args);

// dst = src between float dtypes (round to nearest even), equal element counts.
Status Convert(Backend& backend, TensorView src, TensorView dst);

// Zeroes, in place, the unit_width-wide column groups of x [rows, cols] whose keep entry (host
// [rows, cols / unit_width]) is 0 (MaskUnitsFn in op_table.h).
Status MaskUnits(Backend& backend, TensorView x, const uint8_t* keep, int32_t unit_width);

}  // namespace deja::kernels
