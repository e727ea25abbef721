// The model interface: what the worker service, generation, `deja-lab collect` and the CLI need of a
// decoder that one tensor-parallel rank runs, and the registry that builds one by the checkpoint's
// `model_type`. An architecture is one file pair implementing Model (opt_model.{h,cc}) plus one
// line in model_registry.cc; its layer code keeps the two all-reduces explicit.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/opt_config.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "worker/comm/communicator.h"
#include "worker/kv/eviction_policy.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/sparsity.h"
#include "worker/prefix/importance.h"

namespace deja::worker::model {

struct SequenceStep {
  kv::SequenceKv* kv = nullptr;  // the sequence's cache; its length() is the first position
  const int32_t* tokens = nullptr;
  int32_t n = 0;            // new tokens (>= 1)
  bool all_logits = false;  // logits for every new token, else only for the last one
  bool sparse = false;      // Deja Vu sparsity for this sequence (when predictors are set)
  // Whether the caller reads this sequence's rows of StepResult::logits. On a device backend,
  // false leaves them on the device: only StepResult's top candidates of its rows come back
  // (host backends always fill the logits and no candidates).
  bool full_logits = true;
};

// Candidates a device backend returns per logits row (StepResult::top_*).
inline constexpr int32_t kDeviceTopCandidates = 64;

// Sees the intermediate tensors of a forward pass (`deja-lab collect` records predictor training
// rows with it). Called on the forward thread; the views are valid only during the call. Rows
// are the step's rows in batch order; widths are this rank's part.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // xa: the attention block's input, the pre-LayerNorm residual [rows, d] (it predicts MLP
  // `layer`); heads_out: the attention output before out_proj [rows, local_heads * head_dim].
  virtual void OnAttention(int32_t layer, const TensorView& xa, const TensorView& heads_out) = 0;
  // xm: the MLP block's input, the pre-LayerNorm residual [rows, d] (it predicts the heads of
  // layer + 1); act: relu(fc1) [rows, local_ffn].
  virtual void OnMlp(int32_t layer, const TensorView& xm, const TensorView& act) = 0;
  // q, k, v of every row for this rank's heads (q as projected, unscaled), each row
  // [heads * head_dim] floats, rows row_stride floats apart; called before the layer's attention
  // of a dense step (`deja-lab collect --locret`). No-op unless overridden.
  virtual void OnQkv(int32_t layer, const float* q, const float* k, const float* v,
                     int64_t row_stride, int64_t rows) {
    (void)layer, (void)q, (void)k, (void)v, (void)row_stride, (void)rows;
  }
};

struct StepResult {
  Tensor logits;                 // f32 [rows, vocab] (rank 0 after the vocab gather)
  std::vector<int32_t> row_seq;  // batch index of each logits row
  // Device backends: per logits row, the top_k most likely tokens under log_softmax of the row
  // (ids and log-probs, best first, ties to the lower id), computed on the device: [rows, top_k].
  // top_k is 0 on host backends (read `logits`).
  int32_t top_k = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  // Deja Vu: the fraction of this rank's attention heads and MLP neurons the step computed,
  // averaged over layers (1 when the step ran dense).
  float active_head_fraction = 1.0f;
  float active_neuron_fraction = 1.0f;
  // Time the predictor thread spent on this step (overlapped with the block compute).
  double predictor_seconds = 0.0;
};


// How LoadModel holds the weights.
struct LoadOptions {
  // Converts the matrices to this dtype at load (ConvertMatrices; only bf16: the `--dtype bf16`
  // of the CLI). Unset: they stay in the checkpoint's dtype, as views into the mmapped file.
  std::optional<DType> weight_dtype;
  // Under weight_dtype int4 (`--dtype int4`, CPU only): the group size (`--int4-group`), and the
  // relative error above which a matrix stays int8 (`--int4-max-error`).
  int32_t int4_group = 128;
  double int4_max_error = 0.15;
  // How every sequence's KV cache stores K and V: f32; f16 (half the bytes per cached token, so
  // twice the sequences in the same memory; attention widens in registers); or, on the CPU,
  // int8 with a scale per token and head (common/kv_row.h). `--kv-dtype`.
  DType kv_dtype = DType::kF32;
  // Device backends: the KV pool's size, `--kv-memory-mb` when > 0, else this fraction of the
  // device memory free after the weights (`--kv-memory-fraction`), in blocks of kv_block_slots
  // slots per (layer, head) (worker/kv/kv_pool.h).
  int64_t kv_memory_bytes = 0;
  // Host backends: the caches draw from a pool of kv_memory_bytes too (paged, as on a device: a
  // sequence holds the blocks it has used), rather than one allocation per sequence of its
  // maximum length. `deja worker --kv-paging on` (the default).
  bool kv_paged = false;
  float kv_memory_fraction = 0.8f;
  int32_t kv_block_slots = 32;
  // Device backends: a decode step's KV writes and attention as one DecodeAttention call per
  // layer over all its sequences (kernels/op_table.h), not one KvWrite and Attention each.
  bool batched_decode_attention = true;
  // Device backends that capture op graphs (CUDA): decode steps whose sequences each decode one
  // token run as one captured graph per (batch padded to a power of two, block-table width)
  // (`--cuda-graphs on`, the default; needs batched_decode_attention).
  bool decode_graphs = true;
  // false: such steps run the same program eagerly, never captured (what tests compare replays
  // with, bit for bit).
  bool decode_graph_replay = true;
  // Device backends: the pinned buffer weights stream through (worker/model/weight_upload.h).
  size_t staging_bytes = size_t{64} << 20;
  // What EnableSparsity builds (Deja Vu's runtime). LoadModel fills it when it is empty
  // (worker/model_registry.cc plugs worker/dejavu/ in); without one EnableSparsity is refused.
  SparsityFactory sparsity;
};

class Model {
 public:
  virtual ~Model() = default;

  // The decoder's description (the fields every architecture shares: vocabulary, widths, layers,
  // heads, positions, special tokens).
  virtual const OptConfig& config() const = 0;
  virtual kv::KvGeometry kv_geometry() const = 0;
  virtual int64_t weight_bytes() const = 0;
  virtual DType weight_dtype() const = 0;
  virtual comm::Communicator& comm() = 0;
  // Bytes of the KV block pool the caches draw from (worker/kv/kv_pool.h: every device, and a
  // host with LoadOptions::kv_paged); 0 when caches are allocated per sequence.
  virtual int64_t kv_pool_bytes() const { return 0; }
  // The pool's free bytes and its block size in slots (0: no pool).
  virtual int64_t kv_pool_free_bytes() const { return 0; }
  virtual int32_t kv_block_slots() const { return 0; }
  // Forward calls whose attention ran as one DecodeAttention per layer (device decode steps).
  virtual int64_t batched_decode_steps() const { return 0; }
  // Decode steps run as captured op graphs (LoadOptions::decode_graphs): graphs captured,
  // replays, graph-form steps run eagerly (each shape's first, and shapes that failed to
  // capture), and failed captures.
  struct GraphStats {
    int64_t captures = 0, replays = 0, eager = 0, capture_failures = 0;
  };
  virtual GraphStats graph_stats() const { return {}; }
  // Important-token loading for sequences whose cache has SetImportantPrefix (host backends; a
  // device keeps the whole prefix). Per layer since the last reset: layers that chose a subset,
  // layers that fell back to the whole prefix, and their summed mean Jaccard similarity.
  struct ImportanceStats {
    std::vector<int64_t> chosen, fallbacks;
    std::vector<double> jaccard_sum;
  };
  virtual Status SetPrefixImportance(const prefix::ImportanceOptions& options) {
    (void)options;
    return Unimplemented("important-token loading is not available for this model");
  }
  virtual ImportanceStats TakeImportanceStats() { return {}; }
  // That pool (the prefix cache keeps blocks in it); nullptr without one.
  virtual std::shared_ptr<kv::KvBlockPool> kv_pool() const { return nullptr; }
  // What a cache of `capacity` slots per head reserves (SequenceKv::bytes of one from
  // NewSequence): exact on the host, whole pool blocks on a device.
  virtual uint64_t KvReserveBytes(int32_t capacity) const {
    return kv_geometry().SlotBytes() * static_cast<uint64_t>(capacity);
  }
  // Not owned; nullptr detaches. The observer must outlive the forward passes it watches.
  virtual void set_observer(LayerObserver* observer) = 0;

  // Creates an empty cache for a sequence of at most `max_tokens` tokens (full policy).
  virtual StatusOr<std::unique_ptr<kv::SequenceKv>> NewSequence(int32_t max_tokens) const = 0;
  // The same under a cache policy whose ratios resolve against `prompt_tokens`; bounded policies
  // get budget + `max_chunk` slots per head (the largest number of tokens one step appends).
  virtual StatusOr<std::unique_ptr<kv::SequenceKv>> NewSequence(int32_t max_tokens,
                                                                const kv::CachePolicyConfig& policy,
                                                                int32_t prompt_tokens,
                                                                int32_t max_chunk) const = 0;

  // Loads this rank's predictors (or sets up oracle mode). Sequences then opt in per step with
  // SequenceStep::sparse; without this call every step is dense.
  virtual Status EnableSparsity(const SparsityOptions& options) = 0;
  virtual bool sparsity_enabled() const = 0;

  // Loads this rank's part of the Locret retaining heads (predictors/retaining_heads.h), which
  // the `locret` cache policy needs; NewSequence refuses that policy without them.
  virtual Status EnableRetaining(const std::string& path) = 0;
  virtual bool retaining_enabled() const = 0;
  // For analysis only (`deja-lab ppl --locret-oracle`): while `scores` is not empty, locret sequences
  // take their tokens' scores from it, [layer][position][this rank's head] for positions below
  // `positions`, instead of from the retaining heads; an empty vector restores the heads. Host
  // backends only.
  virtual Status SetRetainingOverride(std::vector<float> scores, int32_t positions) = 0;

  // Runs one step. Appends every step's tokens to its cache. Fails (leaving the caches of the
  // batch unspecified) on bad token ids or when a sequence would pass the position limit.
  virtual Status Forward(const std::vector<SequenceStep>& batch, StepResult* result) = 0;
};

// Loads this rank's shard of the model in `dir` (a checkpoint directory with config.json), built
// by the implementation registered for its `model_type` (a missing model_type reads as "opt"),
// with Deja Vu's runtime as LoadOptions::sparsity unless one is given. `comm` may be null for a
// single process (world 1). Defined in worker/model_registry.cc, above model/ and dejavu/.
StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, kernels::Backend* backend,
                                           std::unique_ptr<comm::Communicator> comm = nullptr,
                                           const LoadOptions& options = {});

// The model_type values LoadModel accepts, comma-separated (for messages and --help).
std::string RegisteredModelTypes();

}  // namespace deja::worker::model
