// The OPT decoder (pre-LN, and the post-LN OPT-350m variant) as one tensor-parallel rank runs
// it: a batch of sequences, each with some new tokens (a prefill chunk or one decode token), in
// one forward pass. The two all-reduces per layer are explicit in Layer().
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <optional>
#include <string>
#include <vector>

#include "common/opt_config.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "worker/comm/communicator.h"
#include "worker/kv/kv_cache.h"
#include "worker/kv/kv_pool.h"
#include "worker/model/kv_attention.h"
#include "worker/model/model.h"
#include "worker/model/opt_weights.h"
#include "worker/model/sparsity.h"

namespace deja::worker::model {

class OptModel final : public Model {
 public:
  ~OptModel() override;
  // Loads this rank's shard. `comm` may be null for a single process (world 1).
  static StatusOr<std::unique_ptr<OptModel>> Load(
      const std::string& dir, kernels::Backend* backend,
      std::unique_ptr<comm::Communicator> comm = nullptr, const LoadOptions& options = {});

  const OptConfig& config() const override { return config_; }
  kv::KvGeometry kv_geometry() const override;
  int64_t weight_bytes() const override { return weight_bytes_; }
  // int4 when the layers' matrices are (the lm head and embeddings stay int8 then).
  DType weight_dtype() const override {
    return w_.int4_matrices > 0 ? DType::kI4 : w_.lm_head.w.dtype;
  }
  comm::Communicator& comm() override { return *comm_; }
  uint64_t KvReserveBytes(int32_t capacity) const override {
    if (!kv_pool_) return Model::KvReserveBytes(capacity);
    const int64_t bs = kv_pool_->block_slots();
    return static_cast<uint64_t>((capacity + bs - 1) / bs * kv_pool_->block_bytes());
  }
  int64_t kv_pool_bytes() const override {
    return kv_pool_ ? kv_pool_->total_blocks() * kv_pool_->block_bytes() : 0;
  }
  int64_t kv_pool_free_bytes() const override {
    return kv_pool_ ? kv_pool_->free_blocks() * kv_pool_->block_bytes() : 0;
  }
  int32_t kv_block_slots() const override { return kv_pool_ ? kv_pool_->block_slots() : 0; }
  int64_t batched_decode_steps() const override { return kv_attention_.batched_decode_steps(); }
  std::shared_ptr<kv::KvBlockPool> kv_pool() const override { return kv_pool_; }
  void set_observer(LayerObserver* observer) override { observer_ = observer; }

  StatusOr<std::unique_ptr<kv::SequenceKv>> NewSequence(int32_t max_tokens) const override;
  StatusOr<std::unique_ptr<kv::SequenceKv>> NewSequence(int32_t max_tokens,
                                                        const kv::CachePolicyConfig& policy,
                                                        int32_t prompt_tokens,
                                                        int32_t max_chunk) const override;
  Status EnableSparsity(const SparsityOptions& options) override;
  bool sparsity_enabled() const override;
  Status EnableRetaining(const std::string& path) override;
  bool retaining_enabled() const override { return kv_attention_.retaining_enabled(); }
  Status SetRetainingOverride(std::vector<float> scores, int32_t positions) override;
  Status SetPrefixImportance(const prefix::ImportanceOptions& options) override;
  ImportanceStats TakeImportanceStats() override;
  Status Forward(const std::vector<SequenceStep>& batch, StepResult* result) override;
  GraphStats graph_stats() const override { return graph_stats_; }

 private:
  OptModel() = default;
  Status Layer(int32_t l, const std::vector<SequenceStep>& batch, int64_t rows);
  Status Logits(const std::vector<SequenceStep>& batch, int64_t rows, StepResult* result);
  // The final LayerNorm (into a_) and project_out (into emb_) of the rows whose logits are
  // wanted: what the LM head reads.
  StatusOr<TensorView> HeadInput(const TensorView& rows);
  Status DeviceLogits(const std::vector<SequenceStep>& batch, const TensorView& x, int64_t out_rows,
                      StepResult* result);
  Status ShardedDeviceLogits(const std::vector<SequenceStep>& batch, const TensorView& x,
                             int64_t out_rows, StepResult* result);
  Status AttentionBlock(int32_t l, const std::vector<SequenceStep>& batch, int64_t rows,
                        const TensorView& attn_in, const BlockPlan* heads);
  Status MlpBlock(int32_t l, int64_t rows, const TensorView& mlp_in, const BlockPlan* plan);
  // A masked plan's reduction (out_proj or fc2) into o: the dense Linear w for the rows that
  // skip nothing, the transposed kernel over every unit of wt for the others (BlockPlan).
  Status MaskedReduce(const BlockPlan& plan, const TensorView& x, const TensorView& w,
                      const TensorView& wt, TensorView o);
  Status EnsureWorkspace(int64_t rows);
  // Decode steps as captured op graphs (opt_model_graph.cc): whether `batch` may run as one;
  // the step run so (false: it cannot, run it eagerly); its program; what invalidates captures.
  bool GraphableStep(const std::vector<SequenceStep>& batch) const;
  StatusOr<bool> ForwardGraph(const std::vector<SequenceStep>& batch, StepResult* result);
  Status GraphStepOps(const std::vector<SequenceStep>& batch, int64_t rows);
  std::array<uint64_t, 3> GraphEpoch() const;
  // Host memory on host backends, the device's otherwise.
  StatusOr<Tensor> Alloc(DType dtype, Shape shape) const;
  Status LoadToDevice(const LoadOptions& options);
  // The KV block pool of `bytes` (whole blocks of `block_slots` slots) on backend_.
  Status CreateKvPool(int64_t bytes, int32_t block_slots);

  OptConfig config_;
  std::unique_ptr<Checkpoint> ckpt_;
  OptWeights w_;
  kernels::Backend* backend_ = nullptr;
  std::unique_ptr<comm::Communicator> comm_;
  int64_t weight_bytes_ = 0;
  DType kv_dtype_ = DType::kF32;
  LayerObserver* observer_ = nullptr;
  // Device backends: weights, workspace, KV (a block pool) and logits live in device memory; the
  // host reads back only the logits rows.
  bool on_device_ = false;
  std::shared_ptr<kv::KvBlockPool> kv_pool_;
  Tensor logits_dev_, top_dev_;  // top_dev_: [rows, 2 * kDeviceTopCandidates] values, then ids
  std::vector<int32_t> logit_rows_;
  Tensor gather_dev_;               // tensor parallelism on devices: each rank's logits block
  std::vector<float> host_gather_;  // the gathered blocks on the host
  SparsityFactory sparsity_factory_;  // LoadOptions::sparsity
  std::unique_ptr<BlockSparsity> sparse_;
  bool step_sparse_ = false;  // this step has sparse rows (sparse_ plans the blocks)
  std::unique_ptr<BlockPlan> heads_plan_, mlp_plan_;
  std::vector<int32_t> sel_rows_;
  std::vector<int32_t> all_units_;  // 0, 1, ...: MaskedReduce's rows of wt
  std::vector<int64_t> seq_row_;  // first row of each sequence in the step

  // Workspace, grown to the largest step seen and reused (no per-step allocation).
  int64_t ws_rows_ = 0;
  Tensor h_, a_, q_, k_, v_, ctx_, o_, u_, emb_;
  Tensor qkv_;  // [rows, 3 * local]: the stacked q, k, v Linear's output (OptLayerWeights::qkv)
  std::vector<int32_t> ids_, tok_pos_, pos_rows_;
  std::vector<float> gather_;

  // The attention over the KV caches: Locret's scores, the important prefix, write, attend,
  // evict (kv_attention.h).
  KvAttention kv_attention_;
  Tensor retain_q_;  // [rows, local]: every head's q when Deja Vu computed only some

  // Graph steps: on (LoadOptions::decode_graphs), captures per (padded batch, block-table width),
  // the shapes run once eagerly and those that failed to capture, the epoch they were captured
  // in (device allocations by the model and KvAttention, the backend's graph_epoch).
  using GraphKey = std::pair<int32_t, int32_t>;
  bool decode_graphs_ = false, graph_replay_ = true;
  std::map<GraphKey, std::unique_ptr<kernels::OpGraph>> graphs_;
  std::set<GraphKey> warmed_, uncapturable_;
  std::array<uint64_t, 3> graphs_epoch_{};
  mutable uint64_t alloc_epoch_ = 0;
  std::vector<int32_t> graph_extra_;
  GraphStats graph_stats_;
};

}  // namespace deja::worker::model
