// The op table: one function pointer per op. Activations are always f32 [rows, cols] row-major;
// weights ("w", "table", "gamma", biases) are in their checkpoint dtype (f32, f16 or bf16),
// given by the view's dtype, or int8 matrices ("w", "wt", "table") with TensorView::scale. Every op
// has a reference implementation (kernels/reference/). Linear and the gathers over bf16 and int8
// weights multiply x rounded to bf16 (nearest even) and add the products in f32, as a bf16 GEMM
// does (kernels/cpu/bf16_dot.h), an int8 row's scale multiplying its sum; f16 and f32 weights
// multiply x. One exception: the CPU backend's Linear over tiled int8 weights quantizes every row
// of x to int8 where the CPU has AVX512-VNNI, at every row count (kernels/cpu/i8_vnni.h; the
// reference for it is ref::LinearI8QuantizedX).
#pragma once

#include <cstdint>
#include <cstring>

#include "common/device.h"
#include "common/status.h"
#include "common/tensor.h"

namespace deja::kernels {

class Backend;

// The ops, each listed once: X(id, table member, function type, the dtypes a backend
// implementing the whole table supports it for). It generates OpId, OpName (the member's name),
// the OpTable slots, SupportedByFullBackend and the simulated device's trampolines
// (tests/common/sim_device.cc). Dtype sets: the weight dtypes (f32, f16, bf16, int8), and int4
// too for Linear (common/int4.h: reference, CPU and simulated device; not CUDA); the float
// dtypes (f32, f16, bf16); the KV cache's (f32, f16, int8: common/kv_row.h; not CUDA); f32 alone. Attention, KvWrite, KvEvict and
// DecodeAttention are keyed by the KV cache's dtype, Convert by the destination's.
#define DEJA_KERNEL_OPS(X)                                                  \
  X(kEmbedding, embedding, EmbeddingFn, kWeightDTypes)                      \
  X(kLayerNorm, layer_norm, LayerNormFn, kFloatDTypes)                      \
  X(kLinear, linear, LinearFn, kLinearDTypes)                               \
  X(kAttention, attention, AttentionFn, kKvDTypes)                          \
  X(kAdd, add, AddFn, kFloatDTypes)                                         \
  X(kLogSoftmax, log_softmax, LogSoftmaxFn, kF32Only)                       \
  X(kTopK, top_k, TopKFn, kF32Only)                                         \
  X(kGatherLinear, gather_linear, GatherLinearFn, kWeightDTypes)            \
  X(kGatherLinearT, gather_linear_t, GatherLinearTFn, kWeightDTypes)        \
  X(kKvWrite, kv_write, KvWriteFn, kKvDTypes)                               \
  X(kKvEvict, kv_evict, KvEvictFn, kKvDTypes)                               \
  X(kConvert, convert, ConvertFn, kFloatDTypes)                             \
  X(kMaskUnits, mask_units, MaskUnitsFn, kF32Only)                          \
  X(kRetainScores, retain_scores, RetainScoresFn, kF32Only)                \
  X(kDecodeAttention, decode_attention, DecodeAttentionFn, kKvDTypes)                \
  X(kDecodeEvict, decode_evict, DecodeEvictFn, kKvDTypes)

enum class OpId {
#define DEJA_OP_ID(id, member, fn, dtypes) id,
  DEJA_KERNEL_OPS(DEJA_OP_ID)
#undef DEJA_OP_ID
  kCount,
};

const char* OpName(OpId op);

// The (op, dtype) pairs a backend implementing the whole table supports (the list's dtype sets).
bool SupportedByFullBackend(OpId op, DType dtype);

enum class Activation { kNone, kRelu };

// One sequence's cache of one layer, for the heads this rank holds. Slot-mapped: slot s of head
// h holds the key/value of position slot_pos[h * capacity + s] (-1 = empty). Keys and values are
// rows of `dtype` (f32; f16, half the bytes; int8 with a scale per row, a quarter: common/kv_row.h
// KvRowBytes), laid out [head][slot][row]. Policies (full, window, h2o) decide which slots hold what; attention
// only reads slots whose position is <= the query's position (and >= 0).
struct KvView {
  void* k = nullptr;
  void* v = nullptr;
  const int32_t* slot_pos = nullptr;
  int32_t capacity = 0;  // slots per head
  int32_t used = 0;      // slots [0, used) may be occupied (others are not read)
  // When non-null, attention adds each softmax probability it computes into
  // score[h * capacity + s] (H2O heavy-hitter accumulation).
  float* score = nullptr;
  DType dtype = DType::kF32;  // of k and v
  // Where k, v, slot_pos and score are (last, so existing aggregate initialisations stay host).
  Device device = Device::Host();
  // Paged caches (a device's KV pool, worker/kv/kv_pool.h): when non-null, slot s of head h is
  // element KvSlotIndex(view, h, s) of slot_pos and score (and that row of k and v), in block
  // blocks[s / block_slots] of block_slots slots per head; k, v, slot_pos and score point at the
  // pool's first block, offset to this layer. `blocks` is in the view's device memory and covers
  // slots [0, used). nullptr: one contiguous [head][capacity] region as above.
  const int32_t* blocks = nullptr;
  int32_t block_slots = 0;
  int64_t block_stride = 0;  // slots from one block to the next (all heads of all layers)
};

// Where slot s of head h is, in slots (elements of slot_pos and score; KV rows of k, v).
inline int64_t KvSlotIndex(const KvView& kv, int64_t h, int64_t s) {
  if (kv.blocks == nullptr) return h * kv.capacity + s;
  return kv.blocks[s / kv.block_slots] * kv.block_stride + h * kv.block_slots + s % kv.block_slots;
}

// How KvEvict ranks a head's candidate slots (lowest goes first; the position breaks ties, older
// first): `h2o` by accumulated score, its mean-score variant by score / (length - position),
// `window` by position alone.
enum class KvRank { kScore, kMeanScore, kPosition };

struct KvEvictArgs {
  KvRank rank = KvRank::kScore;
  int32_t excess = 0;         // slots each head gives up (>= 1; 0 with decay != 1: decay only)
  int32_t oldest_recent = 0;  // candidates hold positions < oldest_recent (never the recent ones)
  int32_t length = 0;         // the sequence's length (kMeanScore's age)
  // In (0, 1]: before ranking, every occupied slot's score among [0, kv.used), recent ones
  // included, is multiplied by it (h2o's decayed scores: a token ranks by its recent attention).
  float decay = 1.0f;
};

struct AttentionArgs {
  TensorView q;                // f32 [tokens, heads * head_dim]
  float scale = 1.0f;          // logits = scale * (q . k); OPT uses head_dim^-0.5
  const int32_t* q_pos = nullptr;  // position of each query token
  KvView kv;
  int32_t heads = 0;
  int32_t head_dim = 0;
  TensorView out;              // f32 [tokens, heads * head_dim]
  // Head-sparse attention (Deja Vu): when non-null, q and out hold only `heads` selected heads,
  // compactly, and selected head i reads cache head head_ids[i] (of cache_heads in the KvView;
  // H2O scores are updated only for those). nullptr: heads == the cache's heads, in order.
  const int32_t* head_ids = nullptr;
  int32_t cache_heads = 0;     // heads in kv (required when head_ids is set)
  // Each query's output computed as if it were the call's only query, bit for bit: no blocking
  // across the call's queries (the CPU backend's GEMM path for prefill-sized calls sums in an
  // order that depends on the call's shape). A model whose Linears quantize activations sets it:
  // there a last-bit difference in one token's attention can move a quantization step.
  bool per_query = false;
  // Deja Vu at batch > 1: when non-null, a host array [tokens, heads]; where
  // keep[t * heads + h] == 0, (token t, head h) is not attended: its out is zero, and its
  // slots are neither read nor scored (a batch's rows attend only their own heads, not the
  // union's). Device backends may attend and then zero it (the same result).
  const uint8_t* keep = nullptr;
};

// out[i, :] = table[ids[i], :] (accumulate: out += table[ids[i]]). ids is a host array, or in the
// backend's device memory when ids_on_device (host backends read it either way).
using EmbeddingFn = Status (*)(Backend&, TensorView table, const int32_t* ids, bool ids_on_device,
                               int64_t n, bool accumulate, TensorView out);
// out = (x - mean) / sqrt(var + eps) * gamma + beta, per row.
using LayerNormFn = Status (*)(Backend&, TensorView x, TensorView gamma, TensorView beta,
                               float eps, TensorView out);
// out[m, n] = act(sum_k x[m, k] * w[n, k] + bias[n]) (+ out[m, n] when accumulate).
// w is [N, K] as stored by HF Linear; bias may be empty (data == nullptr).
using LinearFn = Status (*)(Backend&, TensorView x, TensorView w, TensorView bias,
                            Activation act, bool accumulate, TensorView out);
// Causal attention over a slot-mapped cache (prefill and decode alike).
using AttentionFn = Status (*)(Backend&, const AttentionArgs& args);
// out[m, :] += x[m, :] + bias[:] (x, out f32 of one shape; bias in weight dtype, may be empty).
// The residual add after a row-parallel projection: the bias is added once, after the
// all-reduce.
using AddFn = Status (*)(Backend&, TensorView x, TensorView bias, TensorView out);
// out[m, :] = log_softmax(x[m, :]).
using LogSoftmaxFn = Status (*)(Backend&, TensorView x, TensorView out);
// The k largest values of each row of x (descending; ties to the lower index).
using TopKFn = Status (*)(Backend&, TensorView x, int32_t k, float* values, int32_t* indices);
// Gather-GEMV (Deja Vu fc1 over the selected neurons, Q over the selected heads' rows):
// out[m, j] = act(sum_k x[m, k] * w[rows[j], k] + bias[rows[j]]) (+ out[m, j] when accumulate),
// j in [0, n_rows). w [R, K] as HF stores it; out f32 [M, n_rows] (compact).
using GatherLinearFn = Status (*)(Backend&, TensorView x, TensorView w, TensorView bias,
                                  const int32_t* rows, int64_t n_rows, Activation act,
                                  bool accumulate, TensorView out);
// Gather-transposed-GEMV (Deja Vu fc2 over the selected neurons, out-projection over the
// selected heads): out[m, n] = sum_j x[m, j] * wt[rows[j], n] (+ out[m, n] when accumulate).
// x f32 [M, n_rows] (compact, column j belongs to row rows[j] of wt); wt [R, N] is the weight
// stored transposed (W2ᵀ [ffn, d]); out f32 [M, N].
using GatherLinearTFn = Status (*)(Backend&, TensorView x, TensorView wt, const int32_t* rows,
                                   int64_t n_rows, bool accumulate, TensorView out);

// Writes n new tokens into a cache: for head h and token i, slot slots[h * n + i] gets key
// k[i, h * head_dim:...] and value v[...] (rounded to kv.dtype), position positions[i], and
// (when kv.score is set) the score scores[i * heads + h], or zero when scores is null. k, v f32
// [n, heads * head_dim] and scores f32 [n, heads] in device memory; slots and positions are
// host arrays (validated, copied by device backends).
using KvWriteFn = Status (*)(Backend&, const KvView& kv, int32_t heads, int32_t head_dim,
                             const int32_t* slots, const int32_t* positions, int32_t n,
                             TensorView k, TensorView v, const float* scores);
// Per head: the scores of the occupied slots among [0, kv.used) are multiplied by args.decay (when
// it is not 1); then the `excess` lowest-ranked occupied slots whose position is below
// args.oldest_recent (KvRank) are freed (position -1, score 0) and written, lowest first, to
// victims[h * excess + j] (device memory, int32; -1 where a head has fewer candidates; null when
// excess is 0).
using KvEvictFn = Status (*)(Backend&, const KvView& kv, int32_t heads, const KvEvictArgs& args,
                             int32_t* victims);
// dst = src converted element by element between float dtypes (f32, f16, bf16: round to nearest
// even), equal element counts, both in device memory.
using ConvertFn = Status (*)(Backend&, TensorView src, TensorView dst);
// In place: x f32 [rows, units * unit_width]; the unit_width columns of unit u in row r are set to
// zero where keep[r * units + u] == 0 (keep: a host array, copied by device backends). Deja Vu's
// masked blocks: each row keeps only its own selection of heads or neurons.
using MaskUnitsFn = Status (*)(Backend&, TensorView x, const uint8_t* keep, int32_t unit_width);

// Locret retaining heads (docs/architecture.md#locret): one small MLP per head scores each new
// token's future importance from that head's [q, k, v]:
//   out[i, h] = sum_j w2[h, j] * relu(sum_c w1[h, j, c] * x_h[c] + b1[h, j]) + b2[h],
// x_h = [q[i, h*head_dim ...], k[i, ...], v[i, ...]] (3 * head_dim floats; q as projected, not
// scaled). Rows of q, k and v are row_stride floats apart (the stacked projection's rows).
struct RetainArgs {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t row_stride = 0;  // floats from one row of q (k, v) to the next; >= heads * head_dim
  int32_t n = 0, heads = 0, head_dim = 0, hidden = 0;
  const float* w1 = nullptr;       // [heads, hidden, 3 * head_dim]
  const float* b1 = nullptr;       // [heads, hidden]
  const float* w2 = nullptr;       // [heads, hidden]
  const float* b2 = nullptr;       // [heads]
  float* out = nullptr;            // [n, heads]
  Device device = Device::Host();  // where every pointer above is
};
using RetainScoresFn = Status (*)(Backend&, const RetainArgs& args);

// A decode step of many sequences over one layer of one paged KV pool, in one call: each
// sequence has one new token, and everything that changes from step to step (positions, slots,
// lengths, block tables, which sequences keep scores) is read from device memory, so a step's
// launches are the same whatever its sequences are (what a CUDA graph replays). For sequence i
// (row i of q, k, v and out) and each cache head h:
//   1. write: the key k[i, h] and value v[i, h] (rounded to kv.dtype) go into logical slot
//      slots[i * heads + h] of sequence i's cache with position q_pos[i], and score 0 where
//      flags[i] has kDecodeKeepsScore;
//   2. attend: row i attends over its slots [0, used[i]) whose position is in [0, q_pos[i]],
//      exactly as Attention does for a one-token call, adding each probability into the slot's
//      score where flags[i] has kDecodeAddsScore.
// Logical slot s of sequence i, head h is element
//   blocks[i * max_blocks + s / kv.block_slots] * kv.block_stride + h * kv.block_slots
//   + s % kv.block_slots
// of kv.slot_pos and kv.score (the row of that index for kv.k and kv.v): KvSlotIndex with sequence i's
// row of the block table. kv gives the pool's layer base pointers, dtype, block_slots and
// block_stride; its blocks, capacity and used are not read (kv.score: the pool's score base, or
// null when no sequence keeps scores). The metadata arrays are in device memory and not read by
// the validation (as a KvView's block table): the caller builds them from its validated host
// state. Every sequence of the call holds whole heads (no head subsets).
inline constexpr int32_t kDecodeKeepsScore = 1;
inline constexpr int32_t kDecodeAddsScore = 2;
struct DecodeAttentionArgs {
  const float* q = nullptr;  // row i at q + i * q_stride: heads * head_dim floats
  int64_t q_stride = 0;
  const float* k = nullptr;  // the new keys and values, row i at k + i * kv_stride
  const float* v = nullptr;
  int64_t kv_stride = 0;
  float* out = nullptr;  // [seqs, heads * head_dim], contiguous
  float scale = 1.0f;
  KvView kv;
  int32_t seqs = 0, heads = 0, head_dim = 0;
  const int32_t* q_pos = nullptr;   // [seqs]
  const int32_t* used = nullptr;    // [seqs]
  const int32_t* slots = nullptr;   // [seqs, heads]
  const int32_t* flags = nullptr;   // [seqs]
  const int32_t* blocks = nullptr;  // [seqs, max_blocks]
  int32_t max_blocks = 0;
  // At least every used[i] and at most max_blocks * block_slots (a host bound: the CUDA launch
  // sizes its slot splits and score grid by it).
  int32_t max_used = 0;
  Device device = Device::Host();  // where q, k, v, out and the metadata are
};
using DecodeAttentionFn = Status (*)(Backend&, const DecodeAttentionArgs& args);

// A decode step's evictions over one layer of a paged pool, in one call, with every argument
// that changes from step to step read from device memory: for sequence i, the int32 row
// params[i * kDecodeEvictParams ...] holds a KvEvictArgs (rank as KvRank, excess, oldest_recent,
// length, decay as float bits) and the device address of its victims array (two int32 words, low
// first); sequence i's cache is as in DecodeAttentionArgs (its row of `blocks`, slots [0, used[i])).
// Each sequence is then exactly KvEvict over its cache with those arguments; a sequence with
// excess 0 and decay 1 is left alone. kv.score is the pool's score base (null when no sequence
// ranks by score or decays).
inline constexpr int32_t kDecodeEvictParams = 7;
struct DecodeEvictArgs {
  KvView kv;
  int32_t seqs = 0, heads = 0;
  const int32_t* used = nullptr;    // [seqs]
  const int32_t* blocks = nullptr;  // [seqs, max_blocks]
  int32_t max_blocks = 0;
  const int32_t* params = nullptr;  // [seqs, kDecodeEvictParams]
  Device device = Device::Host();   // where the metadata is
};
using DecodeEvictFn = Status (*)(Backend&, const DecodeEvictArgs& args);
// Writes one sequence's params row for DecodeEvict (kDecodeEvictParams int32s at `row`).
inline void PackDecodeEvict(const KvEvictArgs& e, const int32_t* victims, int32_t* row) {
  const uint64_t address = reinterpret_cast<uintptr_t>(victims);
  row[0] = static_cast<int32_t>(e.rank);
  row[1] = e.excess;
  row[2] = e.oldest_recent;
  row[3] = e.length;
  std::memcpy(&row[4], &e.decay, sizeof(float));
  row[5] = static_cast<int32_t>(static_cast<uint32_t>(address));
  row[6] = static_cast<int32_t>(static_cast<uint32_t>(address >> 32));
}

struct OpTable {
#define DEJA_OP_SLOT(id, member, fn, dtypes) fn member = nullptr;
  DEJA_KERNEL_OPS(DEJA_OP_SLOT)
#undef DEJA_OP_SLOT
};

// Whether the table has a function for `op`. A device backend supports what it fills:
// SupportedByFullBackend(op, dtype) && HasSlot(table, op).
bool HasSlot(const OpTable& table, OpId op);

}  // namespace deja::kernels
