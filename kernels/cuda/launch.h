// Host-side launchers of the CUDA kernels (defined in the .cu files). Each enqueues its kernel(s)
// on `stream` and returns the launch error (cudaGetLastError). All pointers are device pointers;
// arguments are already validated by kernels/ops.cc. Internal to kernels/cuda/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace deja::kernels::cuda {

// elementwise.cu

// out[i, :] = table[ids[i], :] (* scale[ids[i]] for int8) (+= when accumulate); table [*, dim]
// in `dtype`; scale null unless int8.
cudaError_t LaunchEmbedding(const void* table, DType dtype, const float* scale, const int32_t* ids,
                            int64_t n, int64_t dim, bool accumulate, float* out,
                            cudaStream_t stream);
// out[r, c] += x[r, c] + bias[c]; bias in `bias_dtype` or null.
cudaError_t LaunchAdd(const float* x, const void* bias, DType bias_dtype, int64_t rows,
                      int64_t cols, float* out, cudaStream_t stream);
// The Linear epilogue: v = src[r, c] + bias[c] (bias may be null), v = max(v, 0) when relu,
// out[r, c] = v (+ out[r, c] when accumulate). src may equal out when !accumulate.
cudaError_t LaunchBiasAct(const float* src, const void* bias, DType bias_dtype, int64_t rows,
                          int64_t cols, bool relu, bool accumulate, float* out,
                          cudaStream_t stream);
// out[i] = x[i] rounded to nearest-even in `dtype` (kF16 or kBF16).
cudaError_t LaunchConvertF32(const float* x, int64_t n, DType dtype, void* out,
                             cudaStream_t stream);
// dst[i] = src[i] between f32, f16 and bf16, rounded to nearest even as the host does
// (common/dtype.h FloatToHalf / FloatToBF16, NaNs included).
cudaError_t LaunchConvert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                          cudaStream_t stream);
// x[r, c] = 0 where keep[r * (cols / unit_width) + c / unit_width] == 0 (keep on the device).
cudaError_t LaunchMaskUnits(float* x, int64_t rows, int64_t cols, const uint8_t* keep,
                            int32_t unit_width, cudaStream_t stream);

// rowwise.cu: one thread block per row, f32 reductions.

// out may equal x.
cudaError_t LaunchLayerNorm(const float* x, const void* gamma, const void* beta, DType dtype,
                            int64_t rows, int64_t dim, float eps, float* out, cudaStream_t stream);
// out may equal x.
cudaError_t LaunchLogSoftmax(const float* x, int64_t rows, int64_t cols, float* out,
                             cudaStream_t stream);
// k <= 512: rounds of bitonic sorts over chunks of 2048 columns (each chunk keeps its best k)
// until one chunk is left, about log(cols) / log(2048 / k) rounds; the first round's winners go
// to `scratch` (TopKScratchBytes, 0 where one round suffices). Larger k: k rounds of a block-wide
// arg-max below the previous pick, O(k * cols) per row.
size_t TopKScratchBytes(int64_t rows, int64_t cols, int32_t k);
cudaError_t LaunchTopK(const float* x, int64_t rows, int64_t cols, int32_t k, float* values,
                       int32_t* indices, void* scratch, cudaStream_t stream);

// gather.cu: the Deja Vu gathers (semantics of GatherLinearFn / GatherLinearTFn in
// kernels/op_table.h; rows is a device array, or null for every row in order: Linear over int8
// weights). scale: an int8 weight's scales (per row of w, per column of wt), else null.

// linear_i4.cu

// out = x . w^T for int4 w (common/int4.h: tiled, `group` K per scale, `scale` the tiled group
// scales) with x [m_rows, k_dim] f32, as ref::Linear for int4, then bias (in `bias_dtype`, or
// null), ReLU when relu, += out when accumulate. `scratch`: LinearI4ScratchBytes(m_rows, k_dim)
// device bytes for x quantized to int8 and its row scales.
size_t LinearI4ScratchBytes(int64_t m_rows, int64_t k_dim);
cudaError_t LaunchLinearI4(const float* x, int64_t m_rows, int64_t k_dim, const void* w,
                           const float* scale, int32_t group, int64_t n_dim, const void* bias,
                           DType bias_dtype, bool relu, bool accumulate, void* scratch,
                           float* out, cudaStream_t stream);

cudaError_t LaunchGatherLinear(const float* x, int64_t m_rows, int64_t k_dim, const void* w,
                               DType w_dtype, const float* scale, const void* bias,
                               DType bias_dtype, const int32_t* rows, int64_t n_rows, bool relu,
                               bool accumulate, float* out, cudaStream_t stream);
// How gather_linear_t splits the selected rows across blocks (splits 1: no split, no scratch).
// The split never depends on m_rows, so each row of x is summed in one order at any batch size;
// rows of x go through m_chunk at a time.
struct GatherTSplit {
  int64_t splits = 1;
  int64_t rows_per_split = 0;
  int64_t m_chunk = 0;       // rows of x per launch pair
  size_t scratch_bytes = 0;  // the partial sums of one chunk, [splits][m_chunk][n_dim] f32
};
GatherTSplit PlanGatherLinearT(int64_t m_rows, int64_t n_dim, int64_t n_rows, int sm_count);
cudaError_t LaunchGatherLinearT(const float* x, int64_t m_rows, const void* wt, DType w_dtype,
                                const float* scale, int64_t n_dim, const int32_t* rows,
                                int64_t n_rows, bool accumulate, float* out,
                                const GatherTSplit& plan, void* scratch, cudaStream_t stream);

// Where slot s of cache head h is, in slots: the formula of KvSlotIndex (kernels/op_table.h).
// blocks is a device array (paged) or null (contiguous [head][capacity]).
struct KvSlots {
  const int32_t* blocks = nullptr;
  int32_t capacity = 0;
  int32_t block_slots = 0;
  int64_t block_stride = 0;
};

// attention.cu: flash-decoding over the slots, split along the slots when (token, head) pairs
// alone would not fill the device.

// The largest head_dim the attention kernels keep in registers (32 floats per lane).
constexpr int32_t kAttentionMaxHeadDim = 1024;

struct AttentionLaunch {
  const float* q = nullptr;        // [tokens, heads * head_dim]
  const int32_t* q_pos = nullptr;  // [tokens], device
  const void* k = nullptr;         // kv_dtype rows of head_dim, at KvSlots indices
  const void* v = nullptr;
  DType kv_dtype = DType::kF32;  // kF32 or kF16
  const int32_t* slot_pos = nullptr;
  float* score = nullptr;  // or null
  KvSlots slots;
  float* out = nullptr;  // [tokens, heads * head_dim]
  // Head-sparse: head h of q/out reads cache head head_ids[h] (device, [heads]); null: head h.
  const int32_t* head_ids = nullptr;
  float scale = 1.f;
  int32_t tokens = 0, heads = 0, head_dim = 0, used = 0;
  // Floats from one row of q to the next; 0: heads * head_dim.
  int64_t q_stride = 0;
  // A decode step over many caches (DecodeAttention), when seq_used is set: token t is sequence
  // t, which reads its own seq_used[t] slots through row t of seq_blocks (seq_blocks_stride ints
  // apart; slots.blocks is not read) and adds scores only where seq_flags[t] has
  // kDecodeAddsScoreFlag; `used` is then a bound on every seq_used[t] (the plan's). Device arrays.
  const int32_t* seq_used = nullptr;
  const int32_t* seq_blocks = nullptr;
  int64_t seq_blocks_stride = 0;
  const int32_t* seq_flags = nullptr;
};

// DecodeAttentionArgs' flags (kDecodeKeepsScore, kDecodeAddsScore in kernels/op_table.h, whose
// header the .cu files cannot include).
constexpr int32_t kDecodeKeepsScoreFlag = 1;
constexpr int32_t kDecodeAddsScoreFlag = 2;

// How a launch splits the slots: `splits` ranges of `split_slots` slots per (token, head).
struct AttentionPlan {
  int32_t splits = 1;
  int32_t split_slots = 0;
};

// Device scratch of one launch (AttentionScratchBytes of it, carved by LaunchAttention).
AttentionPlan PlanAttention(const AttentionLaunch& a, int sm_count);
size_t AttentionScratchBytes(const AttentionLaunch& a, const AttentionPlan& plan);
// Enqueues the split kernel, the combine kernel when split, and the H2O score kernel when
// a.score is set. `scratch` is 256-byte aligned device memory of AttentionScratchBytes.
cudaError_t LaunchAttention(const AttentionLaunch& a, const AttentionPlan& plan, void* scratch,
                            cudaStream_t stream);

// kv_cache.cu: the KV-cache writes (semantics of KvWriteFn / KvEvictFn in kernels/op_table.h).

struct KvWriteLaunch {
  KvSlots slots;
  void* k = nullptr;  // the cache, `dtype` (kF32 or kF16)
  void* v = nullptr;
  DType dtype = DType::kF32;
  int32_t* slot_pos = nullptr;
  float* score = nullptr;              // or null
  const float* src_score = nullptr;    // [n, heads] written into score, or null (zeros)
  const int32_t* dst_slots = nullptr;  // [heads, n], device
  const int32_t* positions = nullptr;  // [n], device
  const float* src_k = nullptr;        // [n, heads * head_dim]
  const float* src_v = nullptr;
  int32_t heads = 0, head_dim = 0, n = 0;
};
cudaError_t LaunchKvWrite(const KvWriteLaunch& a, cudaStream_t stream);

// A decode step's writes (DecodeAttentionArgs in kernels/op_table.h): sequence i's key and value
// rows (src_stride floats apart) into logical slots dst_slots[i * heads + h] through row i of
// `blocks`, position positions[i], score 0 where flags[i] has kDecodeKeepsScoreFlag.
struct DecodeKvWriteLaunch {
  KvSlots slots;  // block_slots and block_stride; blocks from `blocks` below
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kF32;
  int32_t* slot_pos = nullptr;
  float* score = nullptr;  // or null
  const float* src_k = nullptr;
  const float* src_v = nullptr;
  int64_t src_stride = 0;
  const int32_t* dst_slots = nullptr;  // [seqs, heads]
  const int32_t* positions = nullptr;  // [seqs]
  const int32_t* flags = nullptr;      // [seqs]
  const int32_t* blocks = nullptr;     // [seqs, blocks_stride]
  int64_t blocks_stride = 0;
  int32_t seqs = 0, heads = 0, head_dim = 0;
};
cudaError_t LaunchDecodeKvWrite(const DecodeKvWriteLaunch& a, cudaStream_t stream);

// Locret retaining heads (RetainArgs in kernels/op_table.h): out[i, h] = w2_h . relu(W1_h x + b1_h)
// + b2_h with x = [q, k, v] of head h for token i (rows row_stride floats apart).
struct RetainLaunch {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t row_stride = 0;
  int32_t n = 0, heads = 0, head_dim = 0, hidden = 0;
  const float* w1 = nullptr;  // [heads, hidden, 3 * head_dim]
  const float* b1 = nullptr;  // [heads, hidden]
  const float* w2 = nullptr;  // [heads, hidden]
  const float* b2 = nullptr;  // [heads]
  float* out = nullptr;       // [n, heads]
};
cudaError_t LaunchRetainScores(const RetainLaunch& a, cudaStream_t stream);

// KvRank, without the op table's header (which needs C++20) in the .cu files.
enum class EvictRank : int32_t { kScore, kMeanScore, kPosition };

struct KvEvictLaunch {
  KvSlots slots;
  int32_t* slot_pos = nullptr;
  float* score = nullptr;  // null only with kPosition
  int32_t heads = 0, used = 0;
  EvictRank rank = EvictRank::kScore;
  int32_t excess = 0, oldest_recent = 0, length = 0;
  float decay = 1.f;           // multiplies every occupied slot's score first (1: none)
  int32_t* victims = nullptr;  // [heads, excess]
};
cudaError_t LaunchKvEvict(const KvEvictLaunch& a, cudaStream_t stream);

// A decode step's evictions (DecodeEvictArgs in kernels/op_table.h): one block per (head,
// sequence), each reading its sequence's KvEvict arguments and victims address from `params`.
struct DecodeEvictLaunch {
  KvSlots slots;  // the pool's layout; blocks is replaced by each sequence's row
  int32_t* slot_pos = nullptr;
  float* score = nullptr;
  int32_t seqs = 0, heads = 0;
  const int32_t* used = nullptr;    // [seqs]
  const int32_t* blocks = nullptr;  // [seqs, max_blocks]
  int32_t max_blocks = 0;
  const int32_t* params = nullptr;  // [seqs, 7]: rank, excess, oldest_recent, length, decay bits,
                                    // victims address (low, high)
};
cudaError_t LaunchDecodeEvict(const DecodeEvictLaunch& a, cudaStream_t stream);

}  // namespace deja::kernels::cuda
