#include "worker/model/opt_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/int4.h"
#include "common/thread_pool.h"
#include "kernels/ops.h"
#include "predictors/retaining_heads.h"
#include "worker/comm/staged_communicator.h"
#include "worker/model/opt_model_internal.h"
#include "worker/model/weight_upload.h"

namespace deja::worker::model {

using opt_internal::kLayerNormEps;
using opt_internal::Rows;

namespace {

using opt_internal::kPositionOffset;

int64_t ViewBytes(const TensorView& v) { return v.data ? static_cast<int64_t>(v.bytes()) : 0; }

// With an int8 matrix's scales (one per row) or an int4 matrix's (one per group).
int64_t LinearBytes(const LinearWeights& l) {
  int64_t scales = l.w.scale != nullptr ? l.w.rows() * int64_t{sizeof(float)} : 0;
  if (l.w.dtype == DType::kI4) {
    scales = Int4Scales(l.w.rows(), l.w.cols(), l.w.scale_group) * int64_t{sizeof(float)};
  }
  return ViewBytes(l.w) + scales + ViewBytes(l.bias);
}

}  // namespace

StatusOr<std::unique_ptr<OptModel>> OptModel::Load(const std::string& dir,
                                                   kernels::Backend* backend,
                                                   std::unique_ptr<comm::Communicator> comm,
                                                   const LoadOptions& options) {
  std::unique_ptr<OptModel> m(new OptModel());
  m->backend_ = backend;
  m->comm_ = comm ? std::move(comm) : comm::MakeSoloCommunicator();
  DEJA_ASSIGN_OR_RETURN(m->config_, LoadOptConfig(dir));
  DEJA_ASSIGN_OR_RETURN(m->ckpt_, OpenCheckpoint(dir));
  DEJA_ASSIGN_OR_RETURN(OptTensorNames names, ResolveOptTensorNames(*m->ckpt_, m->config_));
  DEJA_RETURN_IF_ERROR(CheckOptTensorShapes(*m->ckpt_, m->config_, names));
  m->on_device_ = !backend->device().is_host();
  ShardSpec shard{m->comm_->rank(), m->comm_->world_size()};
  // On a device, row-parallel slices are copied straight from the mapping to the device.
  shard.copy_columns = !m->on_device_;
  DEJA_ASSIGN_OR_RETURN(m->w_, LoadOptWeights(*m->ckpt_, m->config_, names, shard));
  if (!backend->Supports(kernels::OpId::kAttention, options.kv_dtype)) {
    return InvalidArgument(std::string("backend ") + backend->name() + " has no attention over a " +
                           DTypeName(options.kv_dtype) + " KV cache");
  }
  m->kv_dtype_ = options.kv_dtype;
  m->sparsity_factory_ = options.sparsity;
  m->kv_attention_.Init({static_cast<int32_t>(m->config_.num_hidden_layers),
                         static_cast<int32_t>(m->w_.local_heads),
                         static_cast<int32_t>(m->config_.head_dim())},
                        backend, m->on_device_);
  m->kv_attention_.set_batched_decode(options.batched_decode_attention);
  m->decode_graphs_ = options.decode_graphs && options.batched_decode_attention;
  m->graph_replay_ = options.decode_graph_replay;
  if (m->on_device_) {
    DEJA_RETURN_IF_ERROR(m->LoadToDevice(options));
  } else {
    if (options.weight_dtype.has_value()) {
      DEJA_RETURN_IF_ERROR(ConvertMatrices(&m->w_, *options.weight_dtype, backend->pool(),
                                           {options.int4_group, options.int4_max_error}));
      if (*options.weight_dtype == DType::kI4) {
        LOG(INFO) << "int4: " << m->w_.int4_matrices << " layer matrices int4 (groups of "
                  << options.int4_group << "), " << m->w_.int4_fallbacks << " kept int8";
      }
    }
    if (options.kv_paged) {
      if (options.kv_memory_bytes <= 0) {
        return InvalidArgument("a paged KV cache needs a KV memory size (--kv-memory-mb)");
      }
      DEJA_RETURN_IF_ERROR(m->CreateKvPool(options.kv_memory_bytes, options.kv_block_slots));
    }
  }
  // int4 matrices are tiled already; the int8 ones beside them tile as int8 does.
  DType matrices = m->w_.layers.empty() ? DType::kF32 : m->w_.layers[0].fc1.w.dtype;
  if (matrices == DType::kI4) matrices = DType::kI8;
  // A token's rows are the same bits whatever else its step holds (other sequences, where its
  // prompt was split, a prefix-cache hit). On the CPU always: attention per query (each query's
  // bits those of its own call; it costs prefill the GEMM path, about 6% of its attention at
  // 512 tokens) and batch-invariant kernels (f16 and f32 row-major weights, the sparse MLP's
  // transposed gathers and the retaining heads no longer choose a kernel by the row count). Any
  // last-bit difference would otherwise grow: bf16, int8 and int4 weights round or quantize
  // every activation, an int8 cache every key and value, and a sampled token or an eviction can
  // fall either side of a boundary. Devices keep the attention per query where a rounding step
  // follows (int4 and int8 weights, an int8 cache).
  const bool quantizes = m->weight_dtype() == DType::kI4 || m->weight_dtype() == DType::kI8 ||
                         m->kv_dtype_ == DType::kI8;
  m->kv_attention_.set_per_query(!m->on_device_ || quantizes);
  if (!m->on_device_ || m->kv_dtype_ == DType::kI8) backend->set_batch_invariant(true);
  if (!m->on_device_ && backend->PrefersTiled(matrices)) {
    TileMatrices(&m->w_);
  }

  int64_t bytes = 0;
  for (const OptLayerWeights& l : m->w_.layers) {
    bytes += LinearBytes(l.q) + LinearBytes(l.k) + LinearBytes(l.v) + LinearBytes(l.out) +
             LinearBytes(l.fc1) + LinearBytes(l.fc2);
    bytes += ViewBytes(l.attn_ln.gamma) * 2 + ViewBytes(l.ffn_ln.gamma) * 2;
  }
  bytes +=
      LinearBytes(m->w_.lm_head) + LinearBytes(m->w_.project_in) + LinearBytes(m->w_.project_out);
  m->weight_bytes_ = bytes;
  // Page the rank's weights in now, so the first request does not pay for the page faults.
  if (!m->on_device_) {
    for (const OptLayerWeights& l : m->w_.layers) {
      for (const LinearWeights* lw : {&l.q, &l.k, &l.v, &l.out, &l.fc1, &l.fc2}) {
        Checkpoint::Prefetch(lw->w);
      }
    }
    Checkpoint::Prefetch(m->w_.lm_head.w);
  }
  LOG(INFO) << "loaded " << dir << " rank " << shard.rank << "/" << shard.world << ": "
            << m->config_.num_hidden_layers << " layers, " << bytes / (1 << 20) << " MiB of "
            << DTypeName(m->weight_dtype()) << " weights on this rank";
  return m;
}

OptModel::~OptModel() = default;

// The device path: weights streamed to the device, then a KV block pool from what memory is left.
Status OptModel::LoadToDevice(const LoadOptions& options) {
  kernels::Backend& be = *backend_;
  if (w_.int4_matrices > 0) {
    return InvalidArgument("this checkpoint holds int4 matrices (deja quantize --bits 4), and "
                           "int4 runs on the CPU only; serve it on the CPU, or quantize to int8 "
                           "for " + be.device().ToString());
  }
  if (!comm_->device_memory()) {
    // Gloo or in-process: collectives through host buffers (NCCL takes device memory itself).
    comm_ = comm::MakeStagedCommunicator(backend_, std::move(comm_));
  }
  // f32: widened at upload, so the GEMMs run in f32 (exact comparisons with the CPU; twice
  // f16's memory and bandwidth).
  if (options.weight_dtype.has_value() && *options.weight_dtype != DType::kBF16 &&
      *options.weight_dtype != DType::kI8 && *options.weight_dtype != DType::kF32) {
    return InvalidArgument(std::string("weights can be converted to bf16, int8 or f32 only on ") +
                           be.device().ToString() + ", not " + DTypeName(*options.weight_dtype) +
                           (*options.weight_dtype == DType::kI4 ? " (int4 runs on the CPU)" : ""));
  }
  UploadOptions up;
  up.matrix_dtype = options.weight_dtype;
  up.staging_bytes = options.staging_bytes;
  DEJA_RETURN_IF_ERROR(UploadWeights(&w_, *ckpt_, be, up, nullptr));
  ckpt_.reset();  // every tensor is on the device now: unmap the files

  int64_t bytes = options.kv_memory_bytes;
  if (bytes <= 0) {
    if (!(options.kv_memory_fraction > 0.f && options.kv_memory_fraction < 1.f)) {
      return InvalidArgument("kv memory fraction must be in (0, 1), not " +
                             std::to_string(options.kv_memory_fraction));
    }
    size_t free_bytes = 0, total_bytes = 0;
    DEJA_RETURN_IF_ERROR(be.MemoryInfo(&free_bytes, &total_bytes));
    bytes = static_cast<int64_t>(static_cast<double>(free_bytes) * options.kv_memory_fraction);
  }
  return CreateKvPool(bytes, options.kv_block_slots);
}

Status OptModel::CreateKvPool(int64_t bytes, int32_t block_slots) {
  const kv::KvGeometry g = kv_geometry();
  if (block_slots <= 0) return InvalidArgument("kv block size must be positive");
  const int64_t block_bytes = kv::KvBlockPool::BlockBytes(g, block_slots);
  const int64_t blocks = bytes / block_bytes;
  if (blocks < 1) {
    return ResourceExhausted("a KV pool of " + std::to_string(bytes >> 20) +
                             " MiB holds no block of " + std::to_string(block_bytes) + " bytes");
  }
  DEJA_ASSIGN_OR_RETURN(kv_pool_, kv::KvBlockPool::Create(backend_, g, block_slots, blocks));
  DEJA_RETURN_IF_ERROR(kv_attention_.set_pool(
      kv_pool_, on_device_ && decode_graphs_ && backend_->SupportsGraphs() &&
                    comm_->world_size() == 1 && blocks > 1));
  LOG(INFO) << "KV pool on " << backend_->device().ToString() << ": " << blocks << " blocks of "
            << block_slots << " slots, " << (blocks * block_bytes >> 20) << " MiB ("
            << blocks * block_slots << " tokens per head)";
  return Status::Ok();
}

StatusOr<Tensor> OptModel::Alloc(DType dtype, Shape shape) const {
  if (!on_device_) return Tensor::Empty(dtype, shape);
  ++alloc_epoch_;  // captured graphs may point at what this replaces
  return backend_->Allocate(dtype, shape);
}

Status OptModel::EnableSparsity(const SparsityOptions& options) {
  if (!sparsity_factory_) {
    return FailedPrecondition("this model was loaded without a sparsity runtime "
                              "(LoadOptions::sparsity; LoadModel plugs Deja Vu in)");
  }
  if (w_.int4_matrices > 0) {
    return FailedPrecondition("Deja Vu gathers rows and columns of bf16, int8 or float matrices, "
                              "not int4: load with --dtype int8 for sparsity");
  }
  if (!on_device_) UntileMatrices(&w_);
  StatusOr<std::unique_ptr<BlockSparsity>> rt =
      sparsity_factory_(options, config_, w_, *backend_, comm_->rank(), comm_->world_size());
  if (!rt.ok() && on_device_ && rt.status().code() == StatusCode::kResourceExhausted) {
    // The transposed out_proj/fc2 copies come after the KV pool took its share.
    return rt.status().WithContext("the Deja Vu copies of out_proj and fc2 do not fit on " +
                                   backend_->device().ToString() +
                                   " beside the KV pool; lower --kv-memory-fraction");
  }
  DEJA_ASSIGN_OR_RETURN(sparse_, std::move(rt));
  heads_plan_ = std::make_unique<BlockPlan>();
  mlp_plan_ = std::make_unique<BlockPlan>();
  return Status::Ok();
}

bool OptModel::sparsity_enabled() const { return sparse_ != nullptr; }

Status OptModel::SetPrefixImportance(const prefix::ImportanceOptions& options) {
  return kv_attention_.SetPrefixImportance(options);
}

Model::ImportanceStats OptModel::TakeImportanceStats() {
  return kv_attention_.TakeImportanceStats();
}

Status OptModel::EnableRetaining(const std::string& path) {
  DEJA_ASSIGN_OR_RETURN(
      predictors::RetainingHeads r,
      predictors::LoadRetainingHeads(path, static_cast<int32_t>(config_.num_hidden_layers),
                                     static_cast<int32_t>(config_.num_attention_heads),
                                     static_cast<int32_t>(config_.head_dim()), comm_->rank(),
                                     comm_->world_size()));
  DEJA_RETURN_IF_ERROR(kv_attention_.EnableRetaining(r));
  retain_q_ = Tensor();
  LOG(INFO) << "retaining heads " << path << ": hidden " << r.hidden << ", heads " << r.first_head
            << ".." << r.first_head + r.heads - 1 << " on this rank";
  return Status::Ok();
}

Status OptModel::SetRetainingOverride(std::vector<float> scores, int32_t positions) {
  return kv_attention_.SetRetainingOverride(std::move(scores), positions);
}

kv::KvGeometry OptModel::kv_geometry() const {
  return {static_cast<int32_t>(config_.num_hidden_layers), static_cast<int32_t>(w_.local_heads),
          static_cast<int32_t>(config_.head_dim()), kv_dtype_};
}

StatusOr<std::unique_ptr<kv::SequenceKv>> OptModel::NewSequence(int32_t max_tokens) const {
  return NewSequence(max_tokens, kv::CachePolicyConfig{}, max_tokens, max_tokens);
}

StatusOr<std::unique_ptr<kv::SequenceKv>> OptModel::NewSequence(int32_t max_tokens,
                                                                const kv::CachePolicyConfig& policy,
                                                                int32_t prompt_tokens,
                                                                int32_t max_chunk) const {
  if (max_tokens > config_.max_position_embeddings) {
    return OutOfRange("sequence of " + std::to_string(max_tokens) +
                      " tokens exceeds the model's position limit of " +
                      std::to_string(config_.max_position_embeddings));
  }
  DEJA_ASSIGN_OR_RETURN(std::unique_ptr<kv::EvictionPolicy> p,
                        kv::MakeEvictionPolicy(policy, prompt_tokens));
  int32_t capacity = max_tokens;
  if (p->budget() > 0) capacity = std::min(max_tokens, p->budget() + std::max(1, max_chunk));
  DEJA_ASSIGN_OR_RETURN(const int32_t every, kv_attention_.EvictEvery(*p, max_chunk));
  DEJA_ASSIGN_OR_RETURN(std::unique_ptr<kv::SequenceKv> kv,
                        kv::SequenceKv::Create(kv_geometry(), capacity, std::move(p), kv_pool_));
  kv->SetEvictionBoundaries(prompt_tokens, every);
  return kv;
}

Status OptModel::EnsureWorkspace(int64_t rows) {
  if (rows <= ws_rows_) return Status::Ok();
  const int64_t d = config_.hidden_size, p = config_.word_embed_proj_dim;
  const int64_t local = w_.local_heads * config_.head_dim();
  DEJA_ASSIGN_OR_RETURN(h_, Alloc(DType::kF32, {rows, d}));
  DEJA_ASSIGN_OR_RETURN(a_, Alloc(DType::kF32, {rows, d}));
  DEJA_ASSIGN_OR_RETURN(o_, Alloc(DType::kF32, {rows, d}));
  DEJA_ASSIGN_OR_RETURN(q_, Alloc(DType::kF32, {rows, local}));
  DEJA_ASSIGN_OR_RETURN(k_, Alloc(DType::kF32, {rows, local}));
  DEJA_ASSIGN_OR_RETURN(v_, Alloc(DType::kF32, {rows, local}));
  DEJA_ASSIGN_OR_RETURN(ctx_, Alloc(DType::kF32, {rows, local}));
  const bool stacked = std::any_of(w_.layers.begin(), w_.layers.end(), [](const auto& l) {
    return l.qkv.w.data != nullptr;  // q, k and v stacked (tiled weights)
  });
  if (stacked) {
    DEJA_ASSIGN_OR_RETURN(qkv_, Alloc(DType::kF32, {rows, 3 * local}));
  }
  DEJA_ASSIGN_OR_RETURN(u_, Alloc(DType::kF32, {rows, w_.local_ffn}));
  DEJA_ASSIGN_OR_RETURN(emb_, Alloc(DType::kF32, {rows, std::max(p, d)}));
  ws_rows_ = rows;
  retain_q_ = Tensor();  // grown with the rest when next needed
  return Status::Ok();
}

Status OptModel::Forward(const std::vector<SequenceStep>& batch, StepResult* result) {
  int64_t rows = 0;
  for (const SequenceStep& s : batch) {
    if (s.kv == nullptr || s.tokens == nullptr || s.n <= 0) {
      return InvalidArgument("every sequence of a step needs a cache and at least one token");
    }
    if (s.kv->length() + s.n > config_.max_position_embeddings) {
      return OutOfRange("sequence would reach " + std::to_string(s.kv->length() + s.n) +
                        " tokens, past the model's position limit of " +
                        std::to_string(config_.max_position_embeddings));
    }
    for (int32_t i = 0; i < s.n; ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= config_.vocab_size) {
        return InvalidArgument("token id " + std::to_string(s.tokens[i]) +
                               " is outside the vocabulary [0, " +
                               std::to_string(config_.vocab_size) + ")");
      }
    }
    rows += s.n;
  }
  if (rows == 0) return InvalidArgument("empty step");
  if (on_device_ && observer_ != nullptr) {
    return FailedPrecondition("layer observers (deja-lab collect) read host memory; run on the CPU");
  }
  DEJA_RETURN_IF_ERROR(EnsureWorkspace(rows));
  ids_.clear();
  tok_pos_.clear();
  pos_rows_.clear();
  for (const SequenceStep& s : batch) {
    for (int32_t i = 0; i < s.n; ++i) {
      ids_.push_back(s.tokens[i]);
      tok_pos_.push_back(s.kv->length() + i);
      pos_rows_.push_back(s.kv->length() + i + kPositionOffset);
    }
  }
  for (const SequenceStep& s : batch) DEJA_RETURN_IF_ERROR(s.kv->AppendPositions(s.n));
  if (GraphableStep(batch)) {
    DEJA_ASSIGN_OR_RETURN(const bool done, ForwardGraph(batch, result));
    if (done) return comm_->CheckHealth();
  }

  const int64_t d = config_.hidden_size, p = config_.word_embed_proj_dim;
  kernels::Backend& be = *backend_;
  TensorView h = Rows(h_, rows, d);
  if (w_.project_in.w.data != nullptr) {
    TensorView e = Rows(emb_, rows, p);
    DEJA_RETURN_IF_ERROR(kernels::Embedding(be, w_.embed_tokens, ids_.data(), rows, false, e));
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, e, w_.project_in.w, {}, kernels::Activation::kNone, false, h));
  } else {
    DEJA_RETURN_IF_ERROR(kernels::Embedding(be, w_.embed_tokens, ids_.data(), rows, false, h));
  }
  DEJA_RETURN_IF_ERROR(kernels::Embedding(be, w_.embed_positions, pos_rows_.data(), rows, true, h));

  step_sparse_ = sparse_ != nullptr && sparse_->BeginStep(batch, rows);
  for (int32_t l = 0; l < config_.num_hidden_layers; ++l) {
    DEJA_RETURN_IF_ERROR(Layer(l, batch, rows));
  }
  result->active_head_fraction = step_sparse_ ? sparse_->head_fraction() : 1.0f;
  result->active_neuron_fraction = step_sparse_ ? sparse_->neuron_fraction() : 1.0f;
  result->predictor_seconds = step_sparse_ ? sparse_->predictor_seconds() : 0.0;
  DEJA_RETURN_IF_ERROR(Logits(batch, rows, result));
  // A device communicator's collectives ran after their calls returned: a peer that died or hung
  // during the step surfaces here (the results read back are then garbage).
  return comm_->CheckHealth();
}

Status OptModel::Layer(int32_t l, const std::vector<SequenceStep>& batch, int64_t rows) {
  const OptLayerWeights& lw = w_.layers[l];
  const bool pre_ln = config_.do_layer_norm_before;
  const int64_t d = config_.hidden_size;
  kernels::Backend& be = *backend_;
  TensorView h = Rows(h_, rows, d), a = Rows(a_, rows, d), o = Rows(o_, rows, d);
  const BlockPlan* heads = nullptr;
  const BlockPlan* mlp = nullptr;

  // Attention block. Deja Vu: the heads of this layer were predicted during the previous
  // layer's MLP; the MLP of this layer is predicted from this block's input meanwhile.
  if (step_sparse_) {
    DEJA_RETURN_IF_ERROR(sparse_->FinishHeads(l, heads_plan_.get()));
    heads = heads_plan_.get();
    sparse_->StartMlp(l, h);
  }
  TensorView attn_in = h;
  if (pre_ln) {
    DEJA_RETURN_IF_ERROR(
        kernels::LayerNorm(be, h, lw.attn_ln.gamma, lw.attn_ln.beta, kLayerNormEps, a));
    attn_in = a;
  }
  DEJA_RETURN_IF_ERROR(AttentionBlock(l, batch, rows, attn_in, heads));
  DEJA_RETURN_IF_ERROR(comm_->AllReduceSum(o.as<float>(), o.numel()));  // all-reduce 1 of 2
  DEJA_RETURN_IF_ERROR(kernels::Add(be, o, lw.out.bias, h));
  if (!pre_ln) {
    DEJA_RETURN_IF_ERROR(
        kernels::LayerNorm(be, h, lw.attn_ln.gamma, lw.attn_ln.beta, kLayerNormEps, h));
  }

  // MLP block; the next layer's heads are predicted from its input meanwhile.
  if (step_sparse_) {
    DEJA_RETURN_IF_ERROR(sparse_->FinishMlp(l, mlp_plan_.get()));
    mlp = mlp_plan_.get();
    sparse_->StartHeads(l + 1, h);
  }
  TensorView mlp_in = h;
  if (pre_ln) {
    DEJA_RETURN_IF_ERROR(
        kernels::LayerNorm(be, h, lw.ffn_ln.gamma, lw.ffn_ln.beta, kLayerNormEps, a));
    mlp_in = a;
  }
  DEJA_RETURN_IF_ERROR(MlpBlock(l, rows, mlp_in, mlp));
  DEJA_RETURN_IF_ERROR(comm_->AllReduceSum(o.as<float>(), o.numel()));  // all-reduce 2 of 2
  DEJA_RETURN_IF_ERROR(kernels::Add(be, o, lw.fc2.bias, h));
  if (!pre_ln) {
    DEJA_RETURN_IF_ERROR(
        kernels::LayerNorm(be, h, lw.ffn_ln.gamma, lw.ffn_ln.beta, kLayerNormEps, h));
  }
  return Status::Ok();
}

// q, k, v, attention over each sequence's cache, and this rank's partial out-projection into
// o_. Gather plans compute q, attention and out_proj for the selected heads only; k and v are
// computed for every head (the exact rule: later tokens always see a complete cache).
Status OptModel::AttentionBlock(int32_t l, const std::vector<SequenceStep>& batch, int64_t rows,
                                const TensorView& attn_in, const BlockPlan* plan) {
  using kernels::Activation;
  const OptLayerWeights& lw = w_.layers[l];
  const int64_t d = config_.hidden_size;
  const int32_t heads = static_cast<int32_t>(w_.local_heads);
  const int32_t hd = static_cast<int32_t>(config_.head_dim());
  const int64_t local = static_cast<int64_t>(heads) * hd;
  kernels::Backend& be = *backend_;
  const BlockPlan::Mode mode = plan ? plan->mode : BlockPlan::Mode::kDense;
  const bool gather = mode == BlockPlan::Mode::kGather;
  const int32_t n_heads = gather ? static_cast<int32_t>(plan->units.size()) : heads;
  const int64_t width = static_cast<int64_t>(n_heads) * hd;
  TensorView o = Rows(o_, rows, d);
  TensorView q = Rows(q_, rows, width), k = Rows(k_, rows, local), v = Rows(v_, rows, local);
  TensorView ctx = Rows(ctx_, rows, width);

  // Sequence i's rows start at seq_row_[i].
  seq_row_.resize(batch.size() + 1);
  seq_row_[0] = 0;
  bool all_decode = true;
  for (size_t i = 0; i < batch.size(); ++i) {
    seq_row_[i + 1] = seq_row_[i] + batch[i].n;
    all_decode = all_decode && batch[i].n == 1;
  }
  // Where each row's q, k and v are: rows of q_, k_, v_, or of the stacked Linear's output
  // (one row per sequence in a decode step, so each sequence's q, k and v are contiguous).
  const float* q_rows = q.as<float>();
  const float* k_rows = k.as<float>();
  const float* v_rows = v.as<float>();
  int64_t q_stride = width, kv_stride = local;
  const bool stacked = !gather && lw.qkv.w.data != nullptr && all_decode;
  if (gather) {
    sel_rows_.clear();
    for (int32_t head : plan->units) {
      for (int32_t i = 0; i < hd; ++i) sel_rows_.push_back(head * hd + i);
    }
    DEJA_RETURN_IF_ERROR(kernels::GatherLinear(be, attn_in, lw.q.w, lw.q.bias, sel_rows_.data(),
                                               width, Activation::kNone, false, q));
  } else if (stacked) {
    TensorView qkv = Rows(qkv_, rows, 3 * local);
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, attn_in, lw.qkv.w, lw.qkv.bias, Activation::kNone, false, qkv));
    q_rows = qkv.as<float>();
    k_rows = q_rows + local;
    v_rows = q_rows + 2 * local;
    q_stride = kv_stride = 3 * local;
  } else {
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, attn_in, lw.q.w, lw.q.bias, Activation::kNone, false, q));
  }
  if (!stacked) {
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, attn_in, lw.k.w, lw.k.bias, Activation::kNone, false, k));
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, attn_in, lw.v.w, lw.v.bias, Activation::kNone, false, v));
  }
  if (observer_ != nullptr && !gather && q_stride == kv_stride) {
    observer_->OnQkv(l, q_rows, k_rows, v_rows, kv_stride, rows);
  }
  // Every head's q for the retaining heads, where q holds only some heads or is strided.
  KvAttention::Qkv qkv{q_rows, k_rows, v_rows, q_stride, kv_stride};
  if ((gather || q_stride != kv_stride) && kv_attention_.NeedsFullQuery(batch)) {
    if (retain_q_.empty()) {
      DEJA_ASSIGN_OR_RETURN(retain_q_, Alloc(DType::kF32, {ws_rows_, local}));
    }
    TensorView full_q = Rows(retain_q_, rows, local);
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, attn_in, lw.q.w, lw.q.bias, Activation::kNone, false, full_q));
    qkv.full_q = full_q.as<float>();
  }
  if (gather) {
    qkv.head_ids = plan->units.data();
    qkv.n_heads = n_heads;
  }
  // Gather and masked plans of several rows: each row attends only its own heads (it reads no
  // K and V of the union's others); MaskUnits below still zeroes them for device backends.
  if (mode != BlockPlan::Mode::kDense && !plan->keep.empty()) qkv.keep = plan->keep.data();
  DEJA_RETURN_IF_ERROR(
      kv_attention_.Run(l, batch, seq_row_.data(), tok_pos_.data(), rows, qkv, ctx));
  if (gather) {
    // Several rows: each keeps only the heads it selected (the others computed the union).
    if (!plan->keep.empty()) DEJA_RETURN_IF_ERROR(kernels::MaskUnits(be, ctx, plan->keep.data(), hd));
    return kernels::GatherLinearT(be, ctx, sparse_->out_t(l), sel_rows_.data(), width, false, o);
  }
  if (mode == BlockPlan::Mode::kMasked) {
    // Each row skips the heads its own selection left out (zero context -> no contribution).
    DEJA_RETURN_IF_ERROR(kernels::MaskUnits(be, ctx, plan->keep.data(), hd));
  }
  if (observer_ != nullptr) observer_->OnAttention(l, Rows(h_, rows, d), ctx);
  if (mode == BlockPlan::Mode::kMasked) {
    return MaskedReduce(*plan, ctx, lw.out.w, sparse_->out_t(l), o);
  }
  return kernels::Linear(be, ctx, lw.out.w, {}, Activation::kNone, false, o);
}

Status OptModel::MaskedReduce(const BlockPlan& plan, const TensorView& x, const TensorView& w,
                              const TensorView& wt, TensorView o) {
  kernels::Backend& be = *backend_;
  const int64_t rows = x.rows(), units = x.cols();
  const auto sparse = [&](int64_t r) {
    return r < static_cast<int64_t>(plan.sparse_rows.size()) && plan.sparse_rows[r] != 0;
  };
  bool any_dense = false;
  for (int64_t r = 0; r < rows && !any_dense; ++r) any_dense = !sparse(r);
  if (any_dense) {
    DEJA_RETURN_IF_ERROR(kernels::Linear(be, x, w, {}, kernels::Activation::kNone, false, o));
  }
  if (static_cast<int64_t>(all_units_.size()) < units) {
    all_units_.resize(static_cast<size_t>(units));
    std::iota(all_units_.begin(), all_units_.end(), 0);
  }
  // Each run of consecutive sparse rows in one call (their results overwrite the dense ones).
  for (int64_t r0 = 0; r0 < rows;) {
    if (!sparse(r0)) {
      ++r0;
      continue;
    }
    int64_t r1 = r0 + 1;
    while (r1 < rows && sparse(r1)) ++r1;
    DEJA_RETURN_IF_ERROR(kernels::GatherLinearT(be, x.RowSlice(r0, r1), wt, all_units_.data(),
                                                units, false, o.RowSlice(r0, r1)));
    r0 = r1;
  }
  return Status::Ok();
}

// fc1 with bias and ReLU, then this rank's partial fc2 into o_. Gather plans compute only the
// selected neurons (rows of W1, rows of W2ᵀ).
Status OptModel::MlpBlock(int32_t l, int64_t rows, const TensorView& mlp_in,
                          const BlockPlan* plan) {
  using kernels::Activation;
  const OptLayerWeights& lw = w_.layers[l];
  const int64_t d = config_.hidden_size;
  kernels::Backend& be = *backend_;
  TensorView o = Rows(o_, rows, d);
  const BlockPlan::Mode mode = plan ? plan->mode : BlockPlan::Mode::kDense;
  if (mode == BlockPlan::Mode::kGather) {
    const int64_t n = static_cast<int64_t>(plan->units.size());
    TensorView u = Rows(u_, rows, n);
    DEJA_RETURN_IF_ERROR(kernels::GatherLinear(be, mlp_in, lw.fc1.w, lw.fc1.bias,
                                               plan->units.data(), n, Activation::kRelu, false, u));
    // Several rows: each keeps only the neurons it selected (the others computed the union).
    if (!plan->keep.empty()) DEJA_RETURN_IF_ERROR(kernels::MaskUnits(be, u, plan->keep.data(), 1));
    return kernels::GatherLinearT(be, u, sparse_->fc2_t(l), plan->units.data(), n, false, o);
  }
  const int64_t ffn = w_.local_ffn;
  TensorView u = Rows(u_, rows, ffn);
  DEJA_RETURN_IF_ERROR(
      kernels::Linear(be, mlp_in, lw.fc1.w, lw.fc1.bias, Activation::kRelu, false, u));
  if (mode == BlockPlan::Mode::kMasked) {
    DEJA_RETURN_IF_ERROR(kernels::MaskUnits(be, u, plan->keep.data(), 1));
  }
  if (observer_ != nullptr) observer_->OnMlp(l, Rows(h_, rows, d), u);
  if (mode == BlockPlan::Mode::kMasked) {
    return MaskedReduce(*plan, u, lw.fc2.w, sparse_->fc2_t(l), o);
  }
  return kernels::Linear(be, u, lw.fc2.w, {}, Activation::kNone, false, o);
}

}  // namespace deja::worker::model
