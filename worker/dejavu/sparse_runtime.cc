#include "worker/dejavu/sparse_runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "common/thread_pool.h"
#include "kernels/ops.h"
#include "worker/dejavu/top_k.h"
#include "worker/kv/kv_cache.h"

namespace deja::worker::dejavu {
namespace {

// [rows, cols] -> [cols, rows], any 1-, 2- or 4-byte dtype.
Tensor Transpose(const TensorView& w) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  Tensor t = Tensor::Empty(w.dtype, {cols, rows});
  const size_t es = DTypeSize(w.dtype);
  const char* src = static_cast<const char*>(w.data);
  char* dst = static_cast<char*>(t.data());
  constexpr int64_t kBlock = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      for (int64_t r = r0; r < std::min(rows, r0 + kBlock); ++r) {
        for (int64_t c = c0; c < std::min(cols, c0 + kBlock); ++c) {
          std::memcpy(dst + (c * rows + r) * es, src + (r * cols + c) * es, es);
        }
      }
    }
  }
  return t;
}

bool ValidFraction(float f) { return f >= 0.0f && f <= 1.0f; }

}  // namespace

AsyncRunner::AsyncRunner() : thread_([this] { Loop(); }) {}

AsyncRunner::~AsyncRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void AsyncRunner::Post(std::function<void()> job) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
  job_ = std::move(job);
  busy_ = true;
  lock.unlock();
  cv_.notify_all();
}

void AsyncRunner::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
}

void AsyncRunner::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || busy_; });
    if (busy_) {
      std::function<void()> job = std::move(job_);
      lock.unlock();
      job();
      lock.lock();
      busy_ = false;
      cv_.notify_all();
      continue;
    }
    if (stop_) return;
  }
}

model::SparsityFactory SparseRuntime::Factory() {
  return [](const model::SparsityOptions& options, const OptConfig& config,
            const model::OptWeights& weights, kernels::Backend& backend, int rank,
            int world) -> StatusOr<std::unique_ptr<model::BlockSparsity>> {
    DEJA_ASSIGN_OR_RETURN(std::unique_ptr<SparseRuntime> rt,
                          Create(options, config, weights, backend, rank, world));
    return std::unique_ptr<model::BlockSparsity>(std::move(rt));
  };
}

StatusOr<std::unique_ptr<SparseRuntime>> SparseRuntime::Create(
    const model::SparsityOptions& options, const OptConfig& config,
    const model::OptWeights& weights, kernels::Backend& backend, int rank, int world) {
  const bool oracle = options.oracle_fraction > 0.0f;
  if (oracle == !options.predictors.empty()) {
    return InvalidArgument(
        "sparsity: set exactly one of predictors (a predictor file) and oracle_fraction");
  }
  if (!(options.oracle_fraction <= 1.0f)) {
    return InvalidArgument("sparsity: oracle_fraction must be in (0, 1]");
  }
  if (!ValidFraction(options.mlp_fraction) || !ValidFraction(options.head_fraction)) {
    return InvalidArgument("sparsity: mlp_fraction and head_fraction must be in [0, 1]");
  }
  if (!(options.dense_fallback > 0.0f && options.dense_fallback <= 1.0f)) {
    return InvalidArgument("sparsity: dense_fallback must be in (0, 1]");
  }
  if (options.dense_layers > config.num_hidden_layers) {
    return InvalidArgument("sparsity: dense_layers " + std::to_string(options.dense_layers) +
                           " exceeds the model's " + std::to_string(config.num_hidden_layers) +
                           " layers");
  }
  std::unique_ptr<SparseRuntime> rt(new SparseRuntime());
  rt->on_device_ = !backend.device().is_host();
  rt->options_ = options;
  rt->config_ = config;
  rt->rank_ = rank;
  rt->world_ = world;
  rt->local_heads_ = weights.local_heads;
  rt->local_ffn_ = weights.local_ffn;
  rt->head_dim_ = config.head_dim();
  if (options.selection_groups > 0) {
    if (options.selection_groups % world != 0) {
      return InvalidArgument("sparsity: selection_groups " +
                             std::to_string(options.selection_groups) +
                             " is not a multiple of the world size " + std::to_string(world));
    }
    rt->groups_ = options.selection_groups / world;
    if (rt->local_heads_ % rt->groups_ != 0 || rt->local_ffn_ % rt->groups_ != 0) {
      return InvalidArgument("sparsity: selection_groups must divide the heads and ffn units");
    }
  }
  if (!oracle) {
    DEJA_ASSIGN_OR_RETURN(rt->set_,
                          predictors::LoadPredictors(options.predictors, config, rank, world));
    rt->have_predictors_ = true;
    if (rt->on_device_) {
      for (predictors::LayerPredictors& lp : rt->set_.layers) {
        for (Tensor* t : {&lp.mlp_fc1, &lp.mlp_fc2, &lp.head_fc1, &lp.head_fc2}) {
          if (t->data() == nullptr) continue;
          DEJA_ASSIGN_OR_RETURN(*t, backend.ToBackend(*t));
        }
      }
    }
  }
  using PredictorThread = model::SparsityOptions::PredictorThread;
  if (rt->on_device_ && rt->have_predictors_ &&
      options.predictor_thread != PredictorThread::kInline) {
    // A second stream of the device (where the backend has one): the predictors overlap the
    // block they predict for and are joined when Finish reads their ids back.
    rt->predictor_backend_ = backend.MakeSideBackend();
    if (rt->predictor_backend_ != nullptr) rt->model_backend_ = &backend;
  }
  const int pool_threads = backend.pool() != nullptr ? backend.pool()->num_threads() : 1;
  rt->async_ =
      !rt->on_device_ && (options.predictor_thread == PredictorThread::kOwnThread ||
                          (options.predictor_thread == PredictorThread::kAuto &&
                           static_cast<int>(std::thread::hardware_concurrency()) > pool_threads));
  if (rt->async_) rt->predictor_backend_ = backend.MakeSideBackend();
  if (rt->predictor_backend_ != nullptr) {
    rt->backend_ = rt->predictor_backend_.get();  // overlapped with the block it predicts for
  } else {
    rt->async_ = false;
    rt->backend_ = &backend;  // inline: the model's backend (all its threads)
  }

  // The schedule: whole-model top-k per block, then this rank's share per selection group.
  const int32_t layers = static_cast<int32_t>(config.num_hidden_layers);
  const int64_t total_groups = static_cast<int64_t>(world) * rt->groups_;
  auto local_k = [&](int64_t total_k, int64_t local_units) -> int32_t {
    if (total_k <= 0) return 0;
    const int64_t per_group = local_units / rt->groups_;
    const int64_t k = std::min<int64_t>(per_group, (total_k + total_groups - 1) / total_groups);
    // Everything selected: dense, unless the fallback lets the sparse kernels run on all units
    // (dense_fallback 1: tests compare that path with the dense one).
    if (k >= per_group && rt->options_.dense_fallback < 1.0f) return 0;
    return static_cast<int32_t>(std::max<int64_t>(1, k) * rt->groups_);
  };
  rt->mlp_k_.assign(layers, 0);
  rt->head_k_.assign(layers, 0);
  for (int32_t l = 0; l < layers; ++l) {
    int64_t mlp_total = 0, head_total = 0;
    const bool dense_layer = options.dense_layers >= 0 && l < options.dense_layers;
    if (oracle) {
      const float mlp_keep =
          options.mlp_fraction > 0 ? options.mlp_fraction : options.oracle_fraction;
      const float head_keep =
          options.head_fraction > 0 ? options.head_fraction : options.oracle_fraction;
      mlp_total = std::lround(mlp_keep * config.ffn_dim);
      head_total = std::lround(head_keep * config.num_attention_heads);
    } else {
      const predictors::LayerSchedule& s = rt->set_.meta.layers[l];
      const predictors::LayerPredictors& p = rt->set_.layers[l];
      if (p.mlp_fc1.data() != nullptr) {
        mlp_total = options.mlp_fraction > 0 ? std::lround(options.mlp_fraction * config.ffn_dim)
                                             : s.mlp.top_k;
        if (options.dense_layers < 0 && s.mlp.top_k == 0) mlp_total = 0;
      }
      if (p.head_fc1.data() != nullptr) {
        head_total = options.head_fraction > 0
                         ? std::lround(options.head_fraction * config.num_attention_heads)
                         : s.heads.top_k;
        if (options.dense_layers < 0 && s.heads.top_k == 0) head_total = 0;
      }
    }
    if (dense_layer) mlp_total = head_total = 0;
    if (l == 0) head_total = 0;  // nothing before layer 0 predicts its heads
    rt->mlp_k_[l] = local_k(mlp_total, rt->local_ffn_);
    rt->head_k_[l] = local_k(head_total, rt->local_heads_);
  }
  rt->fc2_t_.resize(layers);
  rt->out_t_.resize(layers);
  rt->fc2_scale_.assign(layers, nullptr);
  rt->out_scale_.assign(layers, nullptr);
  // On a device: transposed on the host, one matrix at a time, and moved back.
  auto transposed = [&](const TensorView& w) -> StatusOr<Tensor> {
    if (!rt->on_device_) return Transpose(w);
    DEJA_ASSIGN_OR_RETURN(Tensor host, backend.ToHost(w));
    return backend.ToBackend(Transpose(host.view()));
  };
  for (int32_t l = 0; l < layers; ++l) {
    if (rt->mlp_k_[l] > 0) {
      DEJA_ASSIGN_OR_RETURN(rt->fc2_t_[l], transposed(weights.layers[l].fc2.w));
      rt->fc2_scale_[l] = weights.layers[l].fc2.w.scale;
    }
    if (rt->head_k_[l] > 0) {
      DEJA_ASSIGN_OR_RETURN(rt->out_t_[l], transposed(weights.layers[l].out.w));
      rt->out_scale_[l] = weights.layers[l].out.w.scale;
    }
  }
  return rt;
}

SparseRuntime::~SparseRuntime() { runner_.Wait(); }

bool SparseRuntime::BeginStep(const std::vector<model::SequenceStep>& batch, int64_t rows) {
  runner_.Wait();
  rows_ = rows;
  row_sparse_.assign(rows, 0);
  row_heads_sparse_.assign(rows, 0);
  bool any = false;
  all_sparse_decode_ = true;
  all_sparse_decode_heads_ = true;
  int64_t row = 0;
  for (const model::SequenceStep& s : batch) {
    any |= s.sparse;
    const bool heads_sparse =
        s.sparse && !(s.kv != nullptr && s.kv->policy().accumulates_scores());
    all_sparse_decode_ &= s.sparse && s.n == 1;
    all_sparse_decode_heads_ &= heads_sparse && s.n == 1;
    std::fill(row_sparse_.begin() + row, row_sparse_.begin() + row + s.n, s.sparse ? 1 : 0);
    std::fill(row_heads_sparse_.begin() + row, row_heads_sparse_.begin() + row + s.n,
              heads_sparse ? 1 : 0);
    row += s.n;
  }
  ++step_;
  predictor_seconds_ = 0;
  head_sum_ = neuron_sum_ = 0;
  head_blocks_ = neuron_blocks_ = 0;
  mlp_pred_.pending = head_pred_.pending = false;
  return any;
}

void SparseRuntime::StartMlp(int32_t layer, const TensorView& xa) { Start(Kind::kMlp, layer, xa); }

void SparseRuntime::StartHeads(int32_t layer, const TensorView& xm) {
  Start(Kind::kHeads, layer, xm);
}

Status SparseRuntime::FinishMlp(int32_t layer, BlockPlan* plan) {
  return Finish(Kind::kMlp, layer, plan);
}

Status SparseRuntime::FinishHeads(int32_t layer, BlockPlan* plan) {
  return Finish(Kind::kHeads, layer, plan);
}

float SparseRuntime::head_fraction() const {
  return head_blocks_ == 0 ? 1.0f : static_cast<float>(head_sum_ / head_blocks_);
}

float SparseRuntime::neuron_fraction() const {
  return neuron_blocks_ == 0 ? 1.0f : static_cast<float>(neuron_sum_ / neuron_blocks_);
}

void SparseRuntime::Start(Kind kind, int32_t layer, const TensorView& x) {
  Prediction& p = kind == Kind::kMlp ? mlp_pred_ : head_pred_;
  p.pending = false;
  p.ran = false;
  if (layer >= config_.num_hidden_layers) return;
  const int32_t k = kind == Kind::kMlp ? mlp_k_[layer] : head_k_[layer];
  if (k == 0) return;
  const int64_t rows = rows_, d = x.cols();
  p.pending = true;
  p.ids_on_device = false;
  if (on_device_) {
    // Enqueued now, from the block's input as it is now (the block then updates it): on the
    // model's stream, or on the side stream after a copy of the input made on the model's.
    const auto t0 = std::chrono::steady_clock::now();
    TensorView input = x;
    input.shape = Shape{rows, d};
    p.status = Status::Ok();
    if (model_backend_ != nullptr && have_predictors_) {
      if (p.input.empty() || p.input.shape()[0] < rows) {
        StatusOr<Tensor> t = model_backend_->Allocate(DType::kF32, {rows, d});
        p.status = t.status();
        if (t.ok()) p.input = std::move(*t);
      }
      if (p.status.ok()) {
        TensorView copy = p.input.view();
        copy.shape = Shape{rows, d};
        p.status = kernels::Convert(*model_backend_, input, copy);
        if (p.status.ok()) p.status = model_backend_->OrderBefore(*backend_);
        input = copy;
      }
    }
    if (p.status.ok()) p.status = Predict(kind, layer, rows, input, p);
    p.ran = true;
    predictor_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  if (p.input.empty() || p.input.shape()[0] < rows) {
    p.input = Tensor::Empty(DType::kF32, {rows, d});
  }
  std::memcpy(p.input.data(), x.data, static_cast<size_t>(rows * d) * sizeof(float));
  auto job = [this, kind, layer, rows, &p] {
    const auto t0 = std::chrono::steady_clock::now();
    const TensorView input{p.input.data(), DType::kF32, Shape{rows, p.input.shape()[1]}};
    p.status = Predict(kind, layer, rows, input, p);
    p.ran = true;
    predictor_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (async_) {
    runner_.Post(std::move(job));
  } else {
    job();
  }
}

StatusOr<Tensor> SparseRuntime::Alloc(DType dtype, Shape shape) const {
  if (!on_device_) return Tensor::Empty(dtype, shape);
  return backend_->Allocate(dtype, shape);
}

Status SparseRuntime::Predict(Kind kind, int32_t layer, int64_t rows, const TensorView& input,
                              Prediction& p) {
  const int64_t units = kind == Kind::kMlp ? local_ffn_ : local_heads_;
  const int32_t k = kind == Kind::kMlp ? mlp_k_[layer] : head_k_[layer];
  const int32_t k_group = k / groups_;
  const int64_t group_units = units / groups_;
  p.selected.resize(static_cast<size_t>(rows) * k);
  if (!have_predictors_) {
    // Oracle: pseudo-random scores from a hash of (step, layer, block, row, global unit), so a
    // unit's score does not depend on how the units are split over ranks.
    if (p.scores.empty() || p.scores.shape()[0] < rows || p.scores.shape()[1] != units) {
      p.scores = Tensor::Empty(DType::kF32, {rows, units});
    }
    float* sc = p.scores.as<float>();
    const uint64_t base = (step_ * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(layer) << 40) ^
                          (kind == Kind::kMlp ? 0x5bd1e995ull : 0ull);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t u = 0; u < units; ++u) {
        uint64_t x =
            base ^ (static_cast<uint64_t>(r) << 24) ^ static_cast<uint64_t>(rank_ * units + u);
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        x *= 0xc4ceb9fe1a85ec53ull;
        x ^= x >> 33;
        sc[r * units + u] = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
      }
    }
  } else {
    const predictors::LayerPredictors& lp = set_.layers[layer];
    const Tensor& fc1 = kind == Kind::kMlp ? lp.mlp_fc1 : lp.head_fc1;
    const Tensor& fc2 = kind == Kind::kMlp ? lp.mlp_fc2 : lp.head_fc2;
    const int64_t r_dim = fc1.shape()[0], d = fc1.shape()[1];
    if (p.hidden.empty() || p.hidden.shape()[0] < rows || p.hidden.shape()[1] != r_dim) {
      DEJA_ASSIGN_OR_RETURN(p.hidden, Alloc(DType::kF32, {rows, r_dim}));
    }
    if (p.scores.empty() || p.scores.shape()[0] < rows || p.scores.shape()[1] != units) {
      DEJA_ASSIGN_OR_RETURN(p.scores, Alloc(DType::kF32, {rows, units}));
    }
    TensorView in = input;
    in.shape = Shape{rows, d};
    TensorView hidden = p.hidden.view(), scores = p.scores.view();
    hidden.shape = Shape{rows, r_dim};
    scores.shape = Shape{rows, units};
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(*backend_, in, fc1.view(), {}, kernels::Activation::kNone, false, hidden));
    DEJA_RETURN_IF_ERROR(kernels::Linear(*backend_, hidden, fc2.view(), {},
                                         kernels::Activation::kNone, false, scores));
    if (on_device_) {
      // Each (row, group) is a contiguous run of group_units scores: TopK over them on the
      // device; only the ids come back.
      const int64_t runs = rows * groups_;
      if (p.top_ids.empty() || p.top_ids.numel() < runs * k_group) {
        DEJA_ASSIGN_OR_RETURN(p.top_values, Alloc(DType::kF32, {runs * k_group}));
        DEJA_ASSIGN_OR_RETURN(p.top_ids, Alloc(DType::kI32, {runs * k_group}));
      }
      TensorView grouped = scores;
      grouped.shape = Shape{runs, group_units};
      DEJA_RETURN_IF_ERROR(kernels::TopK(*backend_, grouped, k_group, p.top_values.as<float>(),
                                         p.top_ids.as<int32_t>()));
      p.ids_on_device = true;  // Finish reads them back (the join)
      return Status::Ok();
    }
  }
  const float* s = p.scores.as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    if (!row_sparse_[r]) continue;
    for (int32_t g = 0; g < groups_; ++g) {
      int32_t* out = p.selected.data() + r * k + g * k_group;
      SelectTopKUnits(s + r * units + g * group_units, group_units, k_group, out);
      for (int32_t i = 0; i < k_group; ++i) out[i] += static_cast<int32_t>(g * group_units);
    }
  }
  return Status::Ok();
}

Status SparseRuntime::Finish(Kind kind, int32_t layer, BlockPlan* plan) {
  Prediction& p = kind == Kind::kMlp ? mlp_pred_ : head_pred_;
  const int64_t units = kind == Kind::kMlp ? local_ffn_ : local_heads_;
  const int32_t k =
      layer < config_.num_hidden_layers ? (kind == Kind::kMlp ? mlp_k_[layer] : head_k_[layer]) : 0;
  plan->mode = BlockPlan::Mode::kDense;
  plan->units.clear();
  plan->sparse_rows.clear();
  plan->active_fraction = 1.0f;
  if (p.pending) {
    runner_.Wait();
    p.pending = false;
    if (!p.ran) return Internal("sparsity: the predictor job did not run");
    DEJA_RETURN_IF_ERROR(p.status);
    if (p.ids_on_device) {
      // The join: the ids come back once the predictor's stream has produced them.
      const auto t0 = std::chrono::steady_clock::now();
      const int32_t groups = groups_, k_group = k / groups;
      const int64_t group_units = units / groups;
      DEJA_RETURN_IF_ERROR(backend_->CopyDeviceToHost(
          p.selected.data(), p.top_ids.data(), static_cast<size_t>(rows_ * k) * sizeof(int32_t)));
      for (int64_t r = 0; r < rows_; ++r) {
        for (int32_t g = 0; g < groups; ++g) {
          int32_t* out = p.selected.data() + r * k + g * k_group;
          for (int32_t i = 0; i < k_group; ++i) out[i] += static_cast<int32_t>(g * group_units);
        }
      }
      predictor_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const std::vector<uint8_t>& sparse_rows =
        kind == Kind::kMlp ? row_sparse_ : row_heads_sparse_;
    const bool all_decode = kind == Kind::kMlp ? all_sparse_decode_ : all_sparse_decode_heads_;
    // Each row's own selection, [rows, units] (a row that skips nothing keeps every unit);
    // returns how many units the rows keep in all.
    auto own_masks = [&]() {
      plan->keep.assign(static_cast<size_t>(rows_ * units), 1);
      double kept = 0;
      for (int64_t r = 0; r < rows_; ++r) {
        if (!sparse_rows[r]) {
          kept += static_cast<double>(units);
          continue;
        }
        uint8_t* row = plan->keep.data() + r * units;
        std::fill(row, row + units, 0);
        for (int32_t i = 0; i < k; ++i) row[p.selected[r * k + i]] = 1;
        kept += k;
      }
      return kept;
    };
    if (std::none_of(sparse_rows.begin(), sparse_rows.end(), [](uint8_t s) { return s != 0; })) {
      // No row skips any unit of this kind (every sparse sequence is H2O, for heads).
    } else if (all_decode) {
      // The union, ascending; union_slot_[u]: u's place in it (-1: no row selected u).
      union_slot_.assign(units, -1);
      for (int64_t r = 0; r < rows_; ++r) {
        for (int32_t i = 0; i < k; ++i) union_slot_[p.selected[r * k + i]] = 0;
      }
      for (int64_t u = 0; u < units; ++u) {
        if (union_slot_[u] < 0) continue;
        union_slot_[u] = static_cast<int32_t>(plan->units.size());
        plan->units.push_back(static_cast<int32_t>(u));
      }
      const float fraction = static_cast<float>(plan->units.size()) / static_cast<float>(units);
      plan->active_fraction = fraction;
      if (fraction <= options_.dense_fallback) {
        plan->mode = BlockPlan::Mode::kGather;
        // Several rows compute the union; each keeps only its own units.
        plan->keep.clear();
        if (rows_ > 1) {
          const int64_t n = static_cast<int64_t>(plan->units.size());
          plan->keep.assign(static_cast<size_t>(rows_ * n), 0);
          for (int64_t r = 0; r < rows_; ++r) {
            for (int32_t i = 0; i < k; ++i) {
              plan->keep[r * n + union_slot_[p.selected[r * k + i]]] = 1;
            }
          }
        }
      } else {
        // Dense kernels (cheaper than gathering nearly everything), each row masked to its own
        // selection; the reductions of the sparse rows run as the gather path's (BlockPlan).
        plan->mode = BlockPlan::Mode::kMasked;
        own_masks();
        plan->units.clear();
        plan->sparse_rows.assign(sparse_rows.begin(), sparse_rows.begin() + rows_);
      }
    } else {
      plan->mode = BlockPlan::Mode::kMasked;
      plan->active_fraction =
          static_cast<float>(own_masks() / (static_cast<double>(rows_) * units));
      plan->sparse_rows.assign(sparse_rows.begin(), sparse_rows.begin() + rows_);
    }
  }
  if (kind == Kind::kMlp) {
    neuron_sum_ += plan->active_fraction;
    ++neuron_blocks_;
  } else {
    head_sum_ += plan->active_fraction;
    ++head_blocks_;
  }
  return Status::Ok();
}

}  // namespace deja::worker::dejavu
