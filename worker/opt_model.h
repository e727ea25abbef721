// The OPT decoder (pre-LN, and the post-LN OPT-350m variant) as one tensor-parallel rank runs
// it: a batch of sequences, each with some new tokens (a prefill chunk or one decode token), in
// one forward pass. The two all-reduces per layer are explicit in Layer().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/opt_config.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "worker/communicator.h"
#include "worker/kv_cache.h"
#include "worker/opt_weights.h"

namespace deja::worker {

struct SequenceStep {
  SequenceKv* kv = nullptr;       // the sequence's cache; its length() is the first position
  const int32_t* tokens = nullptr;
  int32_t n = 0;                  // new tokens (>= 1)
  bool all_logits = false;        // logits for every new token, else only for the last one
  bool sparse = false;            // Deja Vu sparsity for this sequence (when predictors are set)
};

// Sees the intermediate tensors of a forward pass (`deja collect` records predictor training
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
};

struct StepResult {
  Tensor logits;                  // f32 [rows, vocab] (rank 0 after the vocab gather)
  std::vector<int32_t> row_seq;   // batch index of each logits row
  // Deja Vu: the fraction of this rank's attention heads and MLP neurons the step computed,
  // averaged over layers (1 when the step ran dense).
  float active_head_fraction = 1.0f;
  float active_neuron_fraction = 1.0f;
  // Time the predictor thread spent on this step (overlapped with the block compute).
  double predictor_seconds = 0.0;
};

// Deja Vu contextual sparsity (DESIGN.md §6.2) for OptModel::EnableSparsity.
struct SparsityOptions {
  std::string predictors;         // predictor safetensors (its .json beside it); "" = none
  // > 0 (and no predictors): oracle mode for speed runs on random-weight checkpoints, which
  // keeps this fraction of heads and neurons (pseudo-random, per token) in every sparse layer.
  float oracle_fraction = 0.0f;
  // Overrides of the predictors' schedule (or of oracle_fraction): fractions of neurons / heads
  // kept in sparse layers (0 = the schedule's top-k) and how many first layers stay dense (-1 =
  // the schedule's).
  float mlp_fraction = 0.0f;
  float head_fraction = 0.0f;
  int32_t dense_layers = -1;
  // A batched step computes the union of its sequences' active sets; above this fraction of a
  // block's units it runs that block dense.
  float dense_fallback = 0.8f;
  // Top-k is taken within this many equal groups of each block's units across the model (a
  // multiple of the world size; 0 = one group per rank, as the design's per-rank top-(k/N)).
  // Lets a single process reproduce exactly what N ranks select (tests).
  int32_t selection_groups = 0;
  // Where the predictors run: kOwnThread overlaps them with the block compute (the design);
  // kInline runs them on the forward thread with all the model's threads; kAuto takes its own
  // thread only when the machine has a core that the model's thread pool leaves free. Measured on
  // 2 cores with a 2-thread pool (OPT-1.3B shape, batch 1): own thread 53.9 ms per sparse step,
  // predictor 5.2 ms; inline 52.1 ms, predictor 3.9 ms.
  enum class PredictorThread { kAuto, kOwnThread, kInline };
  PredictorThread predictor_thread = PredictorThread::kAuto;
};

// How OptModel::Load holds the weights.
struct LoadOptions {
  // Converts the matrices to this dtype at load (ConvertMatrices; only bf16: the `--dtype bf16`
  // of the CLI). Unset: they stay in the checkpoint's dtype, as views into the mmapped file.
  std::optional<DType> weight_dtype;
  // How every sequence's KV cache stores K and V: f32, or f16 (half the bytes per cached token,
  // so twice the sequences in the same memory; attention widens in registers). `--kv-dtype`.
  DType kv_dtype = DType::kF32;
};

class SparseRuntime;
struct BlockPlan;

class OptModel {
 public:
  ~OptModel();
  // Loads this rank's shard. `comm` may be null for a single process (world 1).
  static StatusOr<std::unique_ptr<OptModel>> Load(const std::string& dir,
                                                   kernels::Backend* backend,
                                                   std::unique_ptr<Communicator> comm = nullptr,
                                                   const LoadOptions& options = {});

  const OptConfig& config() const { return config_; }
  KvGeometry kv_geometry() const;
  int64_t weight_bytes() const { return weight_bytes_; }
  DType weight_dtype() const { return w_.lm_head.w.dtype; }
  Communicator& comm() { return *comm_; }
  // Not owned; nullptr detaches. The observer must outlive the forward passes it watches.
  void set_observer(LayerObserver* observer) { observer_ = observer; }

  // Creates an empty cache for a sequence of at most `max_tokens` tokens (full policy).
  StatusOr<std::unique_ptr<SequenceKv>> NewSequence(int32_t max_tokens) const;
  // The same under a cache policy whose ratios resolve against `prompt_tokens`; bounded policies
  // get budget + `max_chunk` slots per head (the largest number of tokens one step appends).
  StatusOr<std::unique_ptr<SequenceKv>> NewSequence(int32_t max_tokens,
                                                    const CachePolicyConfig& policy,
                                                    int32_t prompt_tokens,
                                                    int32_t max_chunk) const;

  // Loads this rank's predictors (or sets up oracle mode). Sequences then opt in per step with
  // SequenceStep::sparse; without this call every step is dense.
  Status EnableSparsity(const SparsityOptions& options);
  bool sparsity_enabled() const;

  // Runs one step. Appends every step's tokens to its cache. Fails (leaving the caches of the
  // batch unspecified) on bad token ids or when a sequence would pass the position limit.
  Status Forward(const std::vector<SequenceStep>& batch, StepResult* result);

 private:
  OptModel() = default;
  Status Layer(int32_t l, const std::vector<SequenceStep>& batch, int64_t rows);
  Status Logits(const std::vector<SequenceStep>& batch, int64_t rows, StepResult* result);
  Status AttentionBlock(int32_t l, const std::vector<SequenceStep>& batch, int64_t rows,
                        const TensorView& attn_in, const BlockPlan* heads);
  Status MlpBlock(int32_t l, int64_t rows, const TensorView& mlp_in, const BlockPlan* plan);
  void EnsureWorkspace(int64_t rows);

  OptConfig config_;
  std::unique_ptr<Checkpoint> ckpt_;
  OptWeights w_;
  kernels::Backend* backend_ = nullptr;
  std::unique_ptr<Communicator> comm_;
  int64_t weight_bytes_ = 0;
  DType kv_dtype_ = DType::kF32;
  LayerObserver* observer_ = nullptr;
  std::unique_ptr<SparseRuntime> sparse_;
  bool step_sparse_ = false;  // this step has sparse rows (sparse_ plans the blocks)
  std::unique_ptr<BlockPlan> heads_plan_, mlp_plan_;
  std::vector<int32_t> sel_rows_;
  std::vector<int64_t> seq_row_;  // first row of each sequence in the step

  // Workspace, grown to the largest step seen and reused (no per-step allocation).
  int64_t ws_rows_ = 0;
  Tensor h_, a_, q_, k_, v_, ctx_, o_, u_, emb_;
  Tensor qkv_;  // [rows, 3 * local]: the stacked q, k, v Linear's output (OptLayerWeights::qkv)
  std::vector<int32_t> ids_, tok_pos_, pos_rows_;
  std::vector<float> gather_;
};

}  // namespace deja::worker
