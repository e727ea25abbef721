#include "worker/model/kv_attention.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/thread_pool.h"
#include "kernels/ops.h"
#include "worker/kv/policy_table.h"

namespace deja::worker::model {
namespace {

// Whether a sequence's new tokens are scored by the retaining heads (its policy's row says so).
bool ScoredByRetainingHeads(const kv::SequenceKv& kv) {
  return kv::CachePolicyOf(kv.policy().kind()).retaining_heads;
}

}  // namespace

void KvAttention::Init(const Geometry& g, kernels::Backend* backend, bool on_device) {
  g_ = g;
  backend_ = backend;
  on_device_ = on_device;
}

StatusOr<Tensor> KvAttention::Alloc(DType dtype, Shape shape) const {
  if (!on_device_) return Tensor::Empty(dtype, shape);
  return backend_->Allocate(dtype, shape);
}

Status KvAttention::EnableRetaining(const predictors::RetainingHeads& r) {
  if (r.heads != g_.heads) {
    return Internal("retaining heads: " + std::to_string(r.heads) +
                    " heads loaded, this rank has " + std::to_string(g_.heads));
  }
  auto upload = [&](const std::vector<float>& host, Tensor* t) -> Status {
    DEJA_ASSIGN_OR_RETURN(*t, Alloc(DType::kF32, {static_cast<int64_t>(host.size())}));
    if (!on_device_) {
      std::copy(host.begin(), host.end(), t->as<float>());
      return Status::Ok();
    }
    return backend_->CopyHostToDevice(t->data(), host.data(), host.size() * sizeof(float));
  };
  std::vector<RetainLayer> layers(static_cast<size_t>(r.layers));
  for (int32_t l = 0; l < r.layers; ++l) {
    DEJA_RETURN_IF_ERROR(upload(r.w1[l], &layers[l].w1));
    DEJA_RETURN_IF_ERROR(upload(r.b1[l], &layers[l].b1));
    DEJA_RETURN_IF_ERROR(upload(r.w2[l], &layers[l].w2));
    DEJA_RETURN_IF_ERROR(upload(r.b2[l], &layers[l].b2));
  }
  retain_ = std::move(layers);
  retain_hidden_ = r.hidden;
  retain_scores_ = Tensor();
  retain_rows_ = 0;
  return Status::Ok();
}

Status KvAttention::SetPrefixImportance(const prefix::ImportanceOptions& options) {
  DEJA_RETURN_IF_ERROR(options.Validate(g_.heads));
  importance_ = options;
  return Status::Ok();
}

Model::ImportanceStats KvAttention::TakeImportanceStats() {
  Model::ImportanceStats out = std::move(importance_stats_);
  importance_stats_ = Model::ImportanceStats();
  return out;
}

StatusOr<int32_t> KvAttention::EvictEvery(const kv::EvictionPolicy& policy,
                                          int32_t max_chunk) const {
  if (!kv::CachePolicyOf(policy.kind()).retaining_heads) return 0;
  if (retain_.empty()) {
    return FailedPrecondition(
        "the locret cache policy needs retaining heads; none are loaded (--retaining-heads)");
  }
  return std::max(1, max_chunk);
}

bool KvAttention::NeedsFullQuery(const std::vector<SequenceStep>& batch) const {
  return !retain_.empty() && std::any_of(batch.begin(), batch.end(), [](const SequenceStep& s) {
    return ScoredByRetainingHeads(*s.kv);
  });
}

Status KvAttention::Run(int32_t l, const std::vector<SequenceStep>& batch, const int64_t* seq_row,
                        const int32_t* tok_pos, int64_t rows, const Qkv& qkv,
                        const TensorView& ctx) {
  kernels::Backend& be = *backend_;
  const int32_t heads = g_.heads, hd = g_.head_dim;
  const bool gather = qkv.head_ids != nullptr;
  const int32_t n_heads = gather ? qkv.n_heads : heads;
  const int64_t width = static_cast<int64_t>(n_heads) * hd;
  // 1. Score: each retaining-head sequence's new tokens, from every head's q, k and v.
  const bool scored = NeedsFullQuery(batch);
  if (scored) {
    if (retain_rows_ < rows) {
      DEJA_ASSIGN_OR_RETURN(retain_scores_, Alloc(DType::kF32, {rows, heads}));
      retain_rows_ = rows;
    }
    const float* rq = qkv.q;
    if (gather || qkv.q_stride != qkv.kv_stride) {
      if (qkv.full_q == nullptr) return Internal("kv attention: retaining heads without full q");
      if (qkv.kv_stride != static_cast<int64_t>(heads) * hd) {
        return Internal("locret: strided k/v beside a separate q");
      }
      rq = qkv.full_q;
    }
    DEJA_RETURN_IF_ERROR(
        RetainScores(l, batch, seq_row, tok_pos, rq, qkv.k, qkv.v, qkv.kv_stride));
  }
  // 2. Pre-attend: the important part of a pending prefix.
  if (std::any_of(batch.begin(), batch.end(),
                  [&](const SequenceStep& s) { return s.kv->important_pending(l); })) {
    DEJA_RETURN_IF_ERROR(
        ChooseImportantPrefix(l, batch, seq_row, qkv.q, qkv.q_stride, !gather));
  }
  // 3. Each sequence: its cache write, attention and eviction (heads are rank-local: no
  // communication); on a device, a decode step's writes and attentions in one call.
  if (l == 0 && !graph_step_) {
    DEJA_ASSIGN_OR_RETURN(decode_step_, PrepareDecode(batch, seq_row, tok_pos, DecodeShape{}));
    if (decode_step_) ++batched_steps_;
  }
  if (decode_step_ && !gather && !scored) return RunDecode(l, batch, qkv, ctx);
  bool all_decode = true;
  for (const SequenceStep& s : batch) all_decode = all_decode && s.n == 1;
  auto attend = [&](size_t i) -> Status {
    const SequenceStep& s = batch[i];
    const int64_t row = seq_row[i];
    const float* scores = scored && ScoredByRetainingHeads(*s.kv)
                              ? retain_scores_.as<float>() + row * heads
                              : nullptr;
    // Strided rows (the stacked Linear's) only in decode steps: one row per sequence.
    DEJA_RETURN_IF_ERROR(s.kv->WriteLayer(l, s.n, qkv.k + row * qkv.kv_stride,
                                          qkv.v + row * qkv.kv_stride, scores));
    kernels::AttentionArgs args;
    args.per_query = per_query_;
    args.q = TensorView{const_cast<float*>(qkv.q) + row * qkv.q_stride, DType::kF32,
                        Shape{s.n, width}};
    args.q.device = ctx.device;
    args.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    args.q_pos = tok_pos + row;
    args.kv = s.kv->View(l);
    args.heads = n_heads;
    args.head_dim = hd;
    args.out = ctx.RowSlice(row, row + s.n);
    if (gather) {
      args.head_ids = qkv.head_ids;
      args.cache_heads = heads;
    }
    if (qkv.keep != nullptr) args.keep = qkv.keep + row * n_heads;
    DEJA_RETURN_IF_ERROR(kernels::Attention(be, args));
    return s.kv->EvictLayer(l);
  };
  if (all_decode && batch.size() > 1 && be.pool() != nullptr) {
    // A decode step on a backend whose ops run on host threads (it has a pool): one pool job over
    // the sequences (each attention then runs on its thread) instead of one job per sequence. Batch
    // 16 on the 1.3B shape makes 384 attention calls per step; each hand-off costs more than a
    // one-token attention over a few hundred slots.
    std::vector<Status> status(batch.size());
    be.pool()->ParallelFor(static_cast<int64_t>(batch.size()), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) status[i] = attend(static_cast<size_t>(i));
    });
    for (const Status& st : status) DEJA_RETURN_IF_ERROR(st);
  } else {
    for (size_t i = 0; i < batch.size(); ++i) DEJA_RETURN_IF_ERROR(attend(i));
  }
  return Status::Ok();
}

StatusOr<bool> KvAttention::PrepareGraphStep(const std::vector<SequenceStep>& batch,
                                             const int32_t* tok_pos, int32_t padded,
                                             const std::vector<int32_t>& extra) {
  graph_step_ = false;
  if (batch.empty() || padded < static_cast<int32_t>(batch.size()) || pool_ == nullptr) {
    return false;
  }
  for (const SequenceStep& s : batch) {
    if (s.kv->pool() != pool_.get()) return false;
  }
  if (padded > static_cast<int32_t>(batch.size()) && pad_block_ < 0) return false;
  if (graph_rows_.size() < batch.size()) {
    graph_rows_.resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) graph_rows_[i] = static_cast<int64_t>(i);
  }
  DecodeShape shape;
  shape.padded = padded;
  shape.extra = &extra;
  DEJA_ASSIGN_OR_RETURN(bool ok, PrepareDecode(batch, graph_rows_.data(), tok_pos, shape));
  if (!ok) return false;
  decode_step_ = graph_step_ = true;
  ++batched_steps_;
  return true;
}

Status KvAttention::set_pool(std::shared_ptr<kv::KvBlockPool> pool, bool graphs) {
  pool_ = std::move(pool);
  if (!graphs || pool_ == nullptr || pad_block_ >= 0) return Status::Ok();
  std::vector<int32_t> taken;
  DEJA_RETURN_IF_ERROR(pool_->Take(1, &taken));
  pad_block_ = taken[0];
  return Status::Ok();
}

KvAttention::~KvAttention() {
  if (pad_block_ >= 0 && pool_ != nullptr) pool_->Give({pad_block_});
}

StatusOr<bool> KvAttention::PrepareDecode(const std::vector<SequenceStep>& batch,
                                          const int64_t* seq_row, const int32_t* tok_pos,
                                          const DecodeShape& shape) {
  if (!batched_decode_ || !on_device_ || batch.empty() || NeedsFullQuery(batch)) {
    return false;
  }
  const kv::KvBlockPool* pool = batch[0].kv->pool();
  if (pool == nullptr || pool->block_slots() <= 0) return false;
  const DType kv_dtype = batch[0].kv->geometry().kv_dtype;
  if (!backend_->Supports(kernels::OpId::kDecodeAttention, kv_dtype)) return false;
  const int32_t real = static_cast<int32_t>(batch.size());
  const int32_t seqs = std::max(real, shape.padded);
  int32_t max_blocks = 1, max_used = 0;
  for (int32_t i = 0; i < real; ++i) {
    const kv::SequenceKv& kv = *batch[i].kv;
    if (batch[i].n != 1 || seq_row[i] != i || kv.pool() != pool || kv.appended() != 1 ||
        kv.important_pending(0) || tok_pos[i] != kv.length() - 1) {
      return false;
    }
    max_blocks = std::max(max_blocks, static_cast<int32_t>(kv.blocks().size()));
    for (int32_t l = 0; l < g_.layers; ++l) max_used = std::max(max_used, kv.used(l));
  }
  if (shape.padded > 0) {
    // A graph's arguments: the block tables padded to a power of two and max_used at its bound,
    // so steps replay one capture until a sequence outgrows it.
    int32_t bucket = 1;
    while (bucket < max_blocks) bucket *= 2;
    max_blocks = bucket;
    max_used = max_blocks * pool->block_slots();
  }
  const int64_t heads = g_.heads;
  const int64_t base = shape.extra != nullptr ? static_cast<int64_t>(shape.extra->size()) : 0;
  // Graph steps: each layer's evictions too (DecodeEvict's params, planned below).
  const int64_t evict_words = shape.padded > 0 ? kernels::kDecodeEvictParams : 0;
  const int64_t per_layer = seqs * (1 + heads + evict_words);
  const int64_t head = 2 * static_cast<int64_t>(seqs) + static_cast<int64_t>(seqs) * max_blocks;
  const int64_t total = base + head + g_.layers * per_layer;
  if (total > decode_capacity_) {
    const int64_t grown = std::max(total, 2 * decode_capacity_);
    DEJA_ASSIGN_OR_RETURN(decode_host_,
                          backend_->AllocatePinned(static_cast<size_t>(grown) * sizeof(int32_t)));
    DEJA_ASSIGN_OR_RETURN(decode_dev_, backend_->Allocate(DType::kI32, {grown}));
    decode_capacity_ = grown;
    ++buffers_epoch_;
  }
  int32_t* all = static_cast<int32_t*>(decode_host_.data());
  if (base > 0) std::copy(shape.extra->begin(), shape.extra->end(), all);
  int32_t* m = all + base;
  int32_t* q_pos = m;
  int32_t* flags = m + seqs;
  int32_t* blocks = m + 2 * seqs;
  // Padding sequences (a graph's bucket): position 0, no scores, every block the pad block; they
  // write slot 0 of each head there and attend over it alone.
  for (int32_t i = real; i < seqs; ++i) {
    q_pos[i] = 0;
    flags[i] = 0;
    std::fill_n(blocks + static_cast<int64_t>(i) * max_blocks, max_blocks, pad_block_);
  }
  for (int32_t i = 0; i < real; ++i) {
    const kv::SequenceKv& kv = *batch[i].kv;
    q_pos[i] = tok_pos[i];
    flags[i] = (kv.policy().needs_scores() ? kernels::kDecodeKeepsScore : 0) |
               (kv.policy().accumulates_scores() ? kernels::kDecodeAddsScore : 0);
    const std::vector<int32_t>& table = kv.blocks();
    int32_t* row = blocks + static_cast<int64_t>(i) * max_blocks;
    std::copy(table.begin(), table.end(), row);
    // Past the table: a block the kernels never reach (slots below used[i] only), but a real one.
    std::fill(row + table.size(), row + max_blocks, table.empty() ? 0 : table[0]);
  }
  for (int32_t l = 0; l < g_.layers; ++l) {
    int32_t* used = m + head + l * per_layer;
    int32_t* slots = used + seqs;
    for (int32_t i = 0; i < real; ++i) {
      const kv::SequenceKv& kv = *batch[i].kv;
      used[i] = kv.used(l);
      std::copy_n(kv.appended_slots(l), heads, slots + i * heads);
    }
    std::fill(used + real, used + seqs, 1);
    std::fill(slots + real * heads, slots + seqs * heads, 0);
    if (evict_words == 0) continue;
    // The evictions' accounting happens here, so nothing may refuse the step after this loop.
    int32_t* params = slots + seqs * heads;
    for (int32_t i = 0; i < seqs; ++i) {
      kernels::KvEvictArgs e;  // excess 0, decay 1: left alone
      int32_t* victims = nullptr;
      if (i < real) batch[i].kv->PlanEviction(l, &e, &victims);
      kernels::PackDecodeEvict(e, victims, params + static_cast<int64_t>(i) * evict_words);
    }
  }
  DEJA_RETURN_IF_ERROR(backend_->CopyHostToDevice(decode_dev_.data(), all,
                                                  static_cast<size_t>(total) * sizeof(int32_t)));
  decode_base_ = base;
  decode_seqs_ = seqs;
  decode_max_blocks_ = max_blocks;
  decode_max_used_ = max_used;
  return true;
}

Status KvAttention::RunDecode(int32_t l, const std::vector<SequenceStep>& batch, const Qkv& qkv,
                              const TensorView& ctx) {
  const int32_t seqs = decode_seqs_;
  if (static_cast<int32_t>(batch.size()) != seqs && !graph_step_) {
    return Internal("decode attention: layer " + std::to_string(l) + " got " +
                    std::to_string(batch.size()) + " sequences, the step has " +
                    std::to_string(seqs));
  }
  const int64_t heads = g_.heads;
  const int32_t* m = decode_dev_.as<int32_t>() + decode_base_;
  const int64_t head = 2 * static_cast<int64_t>(seqs) + static_cast<int64_t>(seqs) * decode_max_blocks_;
  const int64_t evict_words = graph_step_ ? kernels::kDecodeEvictParams : 0;
  const int32_t* used = m + head + l * seqs * (1 + heads + evict_words);
  kernels::DecodeAttentionArgs a;
  a.q = qkv.q;
  a.q_stride = qkv.q_stride;
  a.k = qkv.k;
  a.v = qkv.v;
  a.kv_stride = qkv.kv_stride;
  a.out = ctx.as<float>();
  a.scale = 1.0f / std::sqrt(static_cast<float>(g_.head_dim));
  a.kv = batch[0].kv->pool()->LayerView(l);
  a.seqs = seqs;
  a.heads = g_.heads;
  a.head_dim = g_.head_dim;
  a.q_pos = m;
  a.flags = m + seqs;
  a.blocks = m + 2 * seqs;
  a.max_blocks = decode_max_blocks_;
  a.used = used;
  a.slots = used + seqs;
  a.max_used = decode_max_used_;
  a.device = ctx.device;
  DEJA_RETURN_IF_ERROR(kernels::DecodeAttention(*backend_, a));
  if (graph_step_) {
    // Planned at PrepareGraphStep: every sequence's eviction in one call.
    kernels::DecodeEvictArgs e;
    e.kv = a.kv;
    e.seqs = seqs;
    e.heads = g_.heads;
    e.used = a.used;
    e.blocks = a.blocks;
    e.max_blocks = a.max_blocks;
    e.params = a.slots + static_cast<int64_t>(seqs) * heads;
    e.device = a.device;
    return kernels::DecodeEvict(*backend_, e);
  }
  for (const SequenceStep& s : batch) DEJA_RETURN_IF_ERROR(s.kv->EvictLayer(l));
  return Status::Ok();
}

Status KvAttention::RetainScores(int32_t l, const std::vector<SequenceStep>& batch,
                                 const int64_t* seq_row, const int32_t* tok_pos, const float* q,
                                 const float* k, const float* v, int64_t stride) {
  const RetainLayer& rl = retain_[l];
  const int32_t heads = g_.heads;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceStep& s = batch[i];
    if (!ScoredByRetainingHeads(*s.kv)) continue;
    const int64_t row = seq_row[i];
    kernels::RetainArgs a;
    a.q = q + row * stride;
    a.k = k + row * stride;
    a.v = v + row * stride;
    a.row_stride = stride;
    a.n = s.n;
    a.heads = heads;
    a.head_dim = g_.head_dim;
    a.hidden = retain_hidden_;
    a.w1 = rl.w1.as<float>();
    a.b1 = rl.b1.as<float>();
    a.w2 = rl.w2.as<float>();
    a.b2 = rl.b2.as<float>();
    a.out = retain_scores_.as<float>() + row * heads;
    a.device = backend_->device();
    if (retain_override_.empty()) {
      DEJA_RETURN_IF_ERROR(kernels::RetainScores(*backend_, a));
      continue;
    }
    const float* layer =
        retain_override_.data() + static_cast<size_t>(l) * retain_override_positions_ * heads;
    for (int32_t t = 0; t < s.n; ++t) {
      const int32_t pos = tok_pos[row + t];
      if (pos < 0 || pos >= retain_override_positions_) {
        return OutOfRange("retaining-score override holds " +
                          std::to_string(retain_override_positions_) + " positions, not " +
                          std::to_string(pos));
      }
      std::copy_n(layer + static_cast<size_t>(pos) * heads, heads, a.out + t * heads);
    }
  }
  return Status::Ok();
}

Status KvAttention::ChooseImportantPrefix(int32_t l, const std::vector<SequenceStep>& batch,
                                          const int64_t* seq_row, const float* q_rows,
                                          int64_t q_stride, bool all_heads) {
  const int32_t layers = g_.layers;
  Model::ImportanceStats& st = importance_stats_;
  if (st.chosen.empty()) {
    st.chosen.assign(layers, 0);
    st.fallbacks.assign(layers, 0);
    st.jaccard_sum.assign(layers, 0.0);
  }
  std::vector<int32_t> every_head(static_cast<size_t>(g_.heads));
  for (int32_t h = 0; h < g_.heads; ++h) every_head[h] = h;
  for (size_t i = 0; i < batch.size(); ++i) {
    kv::SequenceKv& kv = *batch[i].kv;
    if (!kv.important_pending(l)) continue;
    kv.ImportantDone(l);
    // A prefix read from the host or disk tier (SeedLoadedPrefix) arrives layer by layer: all
    // of it where the layer keeps it whole, the probe heads' keys and then the chosen tokens
    // otherwise.
    kv::PrefixLoader* loader = kv.prefix_loader();
    auto load_all = [&]() -> Status {
      return loader != nullptr ? loader->Load(kv, l, every_head, false, nullptr) : Status::Ok();
    };
    auto done = [&]() {
      if (l + 1 == layers) kv.ReleaseLoader();
    };
    // The first layers keep the whole prefix by design; a Deja Vu gather step computed q for
    // some heads only, and a device's q is not on the host: those keep it too (fallbacks).
    const kernels::KvView view = kv.View(l);
    if (l < importance_.dense_layers) {
      DEJA_RETURN_IF_ERROR(load_all());
      done();
      continue;
    }
    if (!all_heads || !view.device.is_host()) {
      ++st.fallbacks[l];
      DEJA_RETURN_IF_ERROR(load_all());
      done();
      continue;
    }
    if (loader != nullptr) {
      DEJA_RETURN_IF_ERROR(loader->Load(kv, l, importance_.probe_heads, true, nullptr));
    }
    DEJA_ASSIGN_OR_RETURN(
        prefix::LayerChoice choice,
        prefix::ChooseImportant(view, kv.important_prefix(), q_rows + seq_row[i] * q_stride,
                                q_stride, batch[i].n, g_.heads, g_.head_dim,
                                1.0f / std::sqrt(static_cast<float>(g_.head_dim)), importance_));
    st.jaccard_sum[l] += choice.mean_jaccard;
    if (choice.fallback) {
      ++st.fallbacks[l];
      DEJA_RETURN_IF_ERROR(load_all());
    } else {
      ++st.chosen[l];
      if (loader != nullptr) {
        DEJA_RETURN_IF_ERROR(loader->Load(kv, l, every_head, false, &choice.kept));
      }
      prefix::KeepOnly(view, kv.important_prefix(), g_.heads, choice.kept);
    }
    done();
  }
  return Status::Ok();
}

Status KvAttention::SetRetainingOverride(std::vector<float> scores, int32_t positions) {
  if (!scores.empty()) {
    if (on_device_) return FailedPrecondition("retaining-score override: host backends only");
    const size_t want = static_cast<size_t>(g_.layers) *
                        static_cast<size_t>(std::max(positions, 0)) * g_.heads;
    if (positions < 1 || scores.size() != want) {
      return InvalidArgument("retaining-score override: " + std::to_string(scores.size()) +
                             " scores, want layers x positions x heads = " + std::to_string(want));
    }
  }
  retain_override_ = std::move(scores);
  retain_override_positions_ = retain_override_.empty() ? 0 : positions;
  return Status::Ok();
}

}  // namespace deja::worker::model
