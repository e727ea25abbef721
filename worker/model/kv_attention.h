// The attention of one layer over the step's KV caches, behind one seam. The model computes each
// row's q, k and v (dense, stacked or Deja Vu-gathered) and hands them here; KvAttention runs what
// each sequence's cache policy asks for around attention, reading the policy's row
// (worker/kv/policy_table.h), never its kind:
//   1. score: a policy scored by retaining heads (Locret) gets its new tokens' scores from this
//      rank's retaining heads, written into the cache with the tokens;
//   2. pre-attend: a sequence with a pending important prefix (the prefix cache's lazy tiers)
//      keeps, per layer, the prefix tokens its new queries choose;
//   3. write, attend, evict: each sequence's cache write, its attention and its policy's
//      eviction.
// OptModel calls Run once per layer and names no policy.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "predictors/retaining_heads.h"
#include "worker/kv/eviction_policy.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/model.h"
#include "worker/prefix/importance.h"

namespace deja::worker::model {

class KvAttention {
 public:
  struct Geometry {
    int32_t layers = 0;
    int32_t heads = 0;  // this rank's
    int32_t head_dim = 0;
  };
  // The q, k and v rows of a step: row r of q at q + r * q_stride, of k and v at ... * kv_stride.
  struct Qkv {
    const float* q = nullptr;
    const float* k = nullptr;
    const float* v = nullptr;
    int64_t q_stride = 0, kv_stride = 0;
    // Every head's q ([rows, heads * head_dim], contiguous) where q above holds only some heads
    // or is strided: what the retaining heads read (NeedsFullQuery says when it is needed).
    const float* full_q = nullptr;
    // A Deja Vu gather step: q and the context hold only these cache heads (ascending).
    const int32_t* head_ids = nullptr;
    int32_t n_heads = 0;  // with head_ids; otherwise every head
    // Deja Vu's per-row selection, [rows, n_heads] (AttentionArgs::keep), or null.
    const uint8_t* keep = nullptr;
  };

  ~KvAttention();
  void Init(const Geometry& g, kernels::Backend* backend, bool on_device);
  // The device's KV pool; with `graphs`, the block graph steps' padding sequences write is taken
  // from it now (before anyone counts its free blocks).
  Status set_pool(std::shared_ptr<kv::KvBlockPool> pool, bool graphs);
  // Device decode steps as one DecodeAttention call per layer over every sequence (the
  // default), or one KvWrite and Attention per sequence (off: the path it is compared with).
  void set_batched_decode(bool on) { batched_decode_ = on; }
  // AttentionArgs::per_query for every call (set by the model on the CPU, and on a device where a
  // rounding step follows: OptModel::Load).
  void set_per_query(bool on) { per_query_ = on; }
  // Decode steps that took the batched path since the model was loaded (one per Forward).
  int64_t batched_decode_steps() const { return batched_steps_; }

  // A decode step as a captured op graph runs it (OptModel's graph steps): the batched path's
  // metadata for every layer, uploaded now in one copy, with the sequences padded to `padded`
  // (a padding sequence writes slot 0 of each head of a pool block of its own and attends over
  // it alone: it changes nothing any sequence reads), the block tables padded to a power of two
  // and max_used at their bound, and `extra` (the model's token ids and position rows) at the
  // front of the same buffer (graph_extra()), and each layer's evictions planned (the caches'
  // accounting done now) for one DecodeEvict per layer. false, with nothing changed: the step
  // cannot run so (not the batched path, or no pad block). true: the step must run (its
  // evictions are accounted). Layers' Run then use it until EndGraphStep.
  StatusOr<bool> PrepareGraphStep(const std::vector<SequenceStep>& batch, const int32_t* tok_pos,
                                  int32_t padded, const std::vector<int32_t>& extra);
  const int32_t* graph_extra() const { return decode_dev_.as<int32_t>(); }
  int32_t graph_max_blocks() const { return decode_max_blocks_; }
  void EndGraphStep() { graph_step_ = false; }
  // Changes whenever a buffer the graph steps' ops point at is reallocated.
  uint64_t buffers_epoch() const { return buffers_epoch_; }

  // Locret's retaining heads (this rank's heads), uploaded to the backend's memory.
  Status EnableRetaining(const predictors::RetainingHeads& heads);
  bool retaining_enabled() const { return !retain_.empty(); }
  // Fixed scores [layers, positions, heads] instead of the heads' (host backends; studies).
  Status SetRetainingOverride(std::vector<float> scores, int32_t positions);
  Status SetPrefixImportance(const prefix::ImportanceOptions& options);
  Model::ImportanceStats TakeImportanceStats();

  // How often a new cache under `policy` evicts during its prompt: every max_chunk tokens for a
  // policy scored by retaining heads (after each chunk), 0 for the others (after the prompt).
  // FAILED_PRECONDITION for a policy that needs retaining heads when none are loaded.
  StatusOr<int32_t> EvictEvery(const kv::EvictionPolicy& policy, int32_t max_chunk) const;

  // Whether a step over `batch` needs Qkv::full_q when q is gathered or strided.
  bool NeedsFullQuery(const std::vector<SequenceStep>& batch) const;

  // Layer l over the batch: sequence i's rows start at seq_row[i]; row r's position is
  // tok_pos[r]. Writes each row's attention context into ctx (rows x (n_heads * head_dim)).
  Status Run(int32_t l, const std::vector<SequenceStep>& batch, const int64_t* seq_row,
             const int32_t* tok_pos, int64_t rows, const Qkv& qkv, const TensorView& ctx);

 private:
  Status RetainScores(int32_t l, const std::vector<SequenceStep>& batch, const int64_t* seq_row,
                      const int32_t* tok_pos, const float* q, const float* k, const float* v,
                      int64_t stride);
  Status ChooseImportantPrefix(int32_t l, const std::vector<SequenceStep>& batch,
                               const int64_t* seq_row, const float* q_rows, int64_t q_stride,
                               bool all_heads);
  StatusOr<Tensor> Alloc(DType dtype, Shape shape) const;
  // Layer 0 of a decode step: whether every sequence of `batch` can go through DecodeAttention
  // (one token each, rows in order, caches in one device pool, no retaining heads, no pending
  // prefix, every head), and if so the step's metadata for all layers, uploaded in one copy.
  struct DecodeShape {
    int32_t padded = 0;  // > 0: a graph step's (PrepareGraphStep)
    const std::vector<int32_t>* extra = nullptr;
  };
  StatusOr<bool> PrepareDecode(const std::vector<SequenceStep>& batch, const int64_t* seq_row,
                               const int32_t* tok_pos, const DecodeShape& shape);
  Status RunDecode(int32_t l, const std::vector<SequenceStep>& batch, const Qkv& qkv,
                   const TensorView& ctx);

  Geometry g_;
  kernels::Backend* backend_ = nullptr;
  bool on_device_ = false;

  // Locret retaining heads, per layer (this rank's heads; backend memory), and their scratch.
  struct RetainLayer {
    Tensor w1, b1, w2, b2;
  };
  std::vector<RetainLayer> retain_;
  int32_t retain_hidden_ = 0;
  Tensor retain_scores_;  // [rows, heads], grown to the largest step
  int64_t retain_rows_ = 0;
  std::vector<float> retain_override_;  // [layers, positions, heads]; empty: the heads
  int32_t retain_override_positions_ = 0;

  // Batched decode: the step's metadata (int32: q_pos [S], flags [S], block tables [S, MB], then
  // per layer used [S] and slots [S, heads]) in a pinned host buffer and its device copy, both
  // grown to the largest step; the step's sizes; whether this step took the path.
  bool batched_decode_ = true;
  bool per_query_ = false;
  Tensor decode_host_, decode_dev_;
  int64_t decode_capacity_ = 0;  // int32s each buffer holds
  int32_t decode_seqs_ = 0, decode_max_blocks_ = 0, decode_max_used_ = 0;
  bool decode_step_ = false;
  int64_t batched_steps_ = 0;
  // Graph steps: the extra int32s before the metadata, whether this step is one, the pool and
  // the padding sequences' block (-1: none taken yet), the reallocation count.
  int64_t decode_base_ = 0;
  bool graph_step_ = false;
  std::shared_ptr<kv::KvBlockPool> pool_;
  int32_t pad_block_ = -1;
  std::vector<int64_t> graph_rows_;  // 0, 1, 2, ...: a graph step's row of each sequence
  uint64_t buffers_epoch_ = 0;

  // Important-token loading: the options, and per-layer counts since TakeImportanceStats.
  prefix::ImportanceOptions importance_;
  Model::ImportanceStats importance_stats_;
};

}  // namespace deja::worker::model
