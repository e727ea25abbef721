// The weights one tensor-parallel rank holds of an OPT checkpoint. Column-parallel matrices
// (q/k/v, fc1, the vocab slice of the lm head) are row ranges of the HF [out, in] layout, so
// they are views straight into the mmapped checkpoint; row-parallel ones (out_proj, fc2) are
// column ranges and are copied for world > 1. Embeddings and LayerNorms are replicated.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/opt_config.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"

namespace deja {
class ThreadPool;
}

namespace deja::worker::model {

struct ShardSpec {
  int rank = 0;
  int world = 1;
  // Row-parallel slices (columns of the checkpoint's matrices) copied to host memory at load;
  // false leaves them as ColumnSlice sources for UploadWeights, which copies them to a device
  // without a host copy of the rank's weights.
  bool copy_columns = true;
};

// Columns [begin, end) of a matrix in the checkpoint, not yet copied.
struct ColumnSlice {
  TensorView full;  // [out, in], in the mapping
  int64_t begin = 0, end = 0;
  bool pending() const { return full.data != nullptr; }
};

struct LinearWeights {
  TensorView w;     // [out, in] (this rank's part); data is null while `columns` is pending
  TensorView bias;  // [out] or empty; for row-parallel layers the full bias (added once)
  Tensor owned;     // backing storage when w is a copied column slice
  ColumnSlice columns;  // the source of w when the slice was left uncopied (ShardSpec)
};

struct NormWeights {
  TensorView gamma, beta;  // empty when absent
  bool present() const { return gamma.data != nullptr; }
};

struct OptLayerWeights {
  NormWeights attn_ln, ffn_ln;
  LinearWeights q, k, v, out, fc1, fc2;
  // q, k and v stacked in one kTiled16 matrix [3 * local, hidden] (TileMatrices, when each has a
  // multiple of 16 rows; q, k and v are then row slices of it): decode computes the three in one
  // Linear. Empty otherwise.
  LinearWeights qkv;
};

struct OptWeights {
  TensorView embed_tokens;     // [vocab, word_embed_proj_dim], replicated
  TensorView embed_positions;  // [max_positions + 2, hidden], replicated
  LinearWeights project_in;    // [hidden, proj] or empty
  LinearWeights project_out;   // [proj, hidden] or empty
  NormWeights final_ln;
  std::vector<OptLayerWeights> layers;
  LinearWeights lm_head;  // this rank's vocab rows [vocab_end - vocab_begin, proj]
  int64_t vocab_begin = 0, vocab_end = 0;
  int64_t local_heads = 0, local_ffn = 0;
  // Layer matrices ConvertMatrices made int4, and those int4 left int8 (their error too high).
  int32_t int4_matrices = 0, int4_fallbacks = 0;
  std::vector<Tensor> converted;  // backing storage of matrices converted at load
};

// The [begin, end) part of rank `rank` when `total` is split over `world` ranks as evenly as
// possible (earlier ranks take the remainder).
void ShardRange(int64_t total, int rank, int world, int64_t* begin, int64_t* end);

// Whether the float elements (f32, f16, bf16) of rows [0, rows) x columns [c0, c1) of v are all
// finite (no NaN or Inf bit pattern: exponent all ones); other dtypes pass.
bool AllFinite(const TensorView& v, int64_t c0, int64_t c1);

// Fails with InvalidArgument when heads or ffn are not divisible by the world size. A NaN or Inf
// in a float this rank keeps is DATA_LOSS naming the tensor (host loads; UploadWeights checks a
// device load's chunks).
StatusOr<OptWeights> LoadOptWeights(const Checkpoint& ckpt, const OptConfig& config,
                                    const OptTensorNames& names, const ShardSpec& shard);

// Converts every matrix this rank holds (the Linear weights, the lm head and the two embedding
// tables) to `dtype` in memory it owns (a tied lm head stays a slice of the converted embedding
// table); biases and LayerNorms keep their dtype. Matrices already in `dtype` are left as they
// are. bf16 (converting f16/f32 to it cannot overflow) or int8: each matrix quantized per output
// row (common/quantize.h, split over `pool` when given), the position embeddings kept as they
// are; a NaN or infinite weight is InvalidArgument naming the matrix. Matrices of an int8
// checkpoint (deja quantize; loaded with their scales) stay int8 under either.
// int4: the layers' Linear matrices in groups of int4.group K (common/int4.h), each one whose
// relative error exceeds int4.max_error (or whose K the group does not divide) int8 instead, and
// the embedding table, lm head and projections int8.
struct Int4Options {
  int32_t group = 128;
  double max_error = 0.15;
};
Status ConvertMatrices(OptWeights* w, DType dtype, ThreadPool* pool = nullptr,
                       const Int4Options& int4 = {});

// Lays the layers' bf16 or int8 matrices (q, k, v, out, fc1, fc2) out in Layout::kTiled16, for a
// backend that reads them fastest so (Backend::PrefersTiled); each tiled copy replaces the
// row-major storage it came from when the weights own it. Also the embedding table and the lm head
// (a tied head stays a slice of the table: tiled together when the rank's vocab rows start on a
// tile). Other dtypes stay row-major.
void TileMatrices(OptWeights* w);
// q, out, fc1 and fc2 back to row-major: the sparse runtime gathers rows of q and fc1 and
// transposes out and fc2 (k and v, always computed whole, stay tiled); q, k and v are no longer
// run as one stacked Linear then.
void UntileMatrices(OptWeights* w);

}  // namespace deja::worker::model
