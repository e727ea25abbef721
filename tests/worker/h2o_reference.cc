#include "tests/worker/h2o_reference.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/ops.h"

namespace deja::worker {

StatusOr<std::unique_ptr<ReferenceH2O>> ReferenceH2O::Load(
    const std::string& dir, int32_t heavy, int32_t recent,
    const predictors::RetainingHeads* retain) {
  std::unique_ptr<ReferenceH2O> r(new ReferenceH2O());
  r->heavy_ = heavy;
  r->recent_ = recent;
  r->retain_ = retain;
  DEJA_ASSIGN_OR_RETURN(r->config_, LoadOptConfig(dir));
  DEJA_ASSIGN_OR_RETURN(r->ckpt_, OpenCheckpoint(dir));
  DEJA_ASSIGN_OR_RETURN(OptTensorNames names, ResolveOptTensorNames(*r->ckpt_, r->config_));
  DEJA_ASSIGN_OR_RETURN(r->w_,
                        model::LoadOptWeights(*r->ckpt_, r->config_, names, model::ShardSpec{}));
  r->backend_ = kernels::MakeReferenceBackend();
  r->cache_.resize(r->config_.num_hidden_layers * r->config_.num_attention_heads);
  return r;
}

void ReferenceH2O::Evict(std::vector<Entry>& head, int32_t length) {
  if (heavy_ < 0) return;
  while (static_cast<int32_t>(head.size()) > heavy_ + recent_) {
    auto victim = head.end();
    for (auto it = head.begin(); it != head.end(); ++it) {
      if (it->pos >= length - recent_) continue;
      if (victim == head.end() ||
          static_cast<float>(it->score) < static_cast<float>(victim->score) ||
          (static_cast<float>(it->score) == static_cast<float>(victim->score) &&
           it->pos < victim->pos)) {
        victim = it;
      }
    }
    head.erase(victim);
  }
}

Status ReferenceH2O::Step(const std::vector<int32_t>& tokens, int32_t start,
                          std::vector<float>* logits) {
  const int64_t n = static_cast<int64_t>(tokens.size()), d = config_.hidden_size;
  const int64_t heads = config_.num_attention_heads, hd = config_.head_dim();
  const bool pre = config_.do_layer_norm_before;
  kernels::Backend& be = *backend_;
  using kernels::Activation;
  Tensor h = Tensor::Empty(DType::kF32, {n, d}), a = Tensor::Empty(DType::kF32, {n, d});
  Tensor q = Tensor::Empty(DType::kF32, {n, d}), k = Tensor::Empty(DType::kF32, {n, d});
  Tensor v = Tensor::Empty(DType::kF32, {n, d}), ctx = Tensor::Zeros(DType::kF32, {n, d});
  Tensor o = Tensor::Empty(DType::kF32, {n, d});
  Tensor u = Tensor::Empty(DType::kF32, {n, config_.ffn_dim});
  std::vector<int32_t> pos_rows(n);
  for (int64_t i = 0; i < n; ++i) pos_rows[i] = start + static_cast<int32_t>(i) + 2;
  if (w_.project_in.w.data) {
    Tensor e = Tensor::Empty(DType::kF32, {n, config_.word_embed_proj_dim});
    DEJA_RETURN_IF_ERROR(
        kernels::Embedding(be, w_.embed_tokens, tokens.data(), n, false, e.view()));
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, e.view(), w_.project_in.w, {}, Activation::kNone, false, h.view()));
  } else {
    DEJA_RETURN_IF_ERROR(
        kernels::Embedding(be, w_.embed_tokens, tokens.data(), n, false, h.view()));
  }
  DEJA_RETURN_IF_ERROR(
      kernels::Embedding(be, w_.embed_positions, pos_rows.data(), n, true, h.view()));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const model::OptLayerWeights& lw = w_.layers[l];
    TensorView in = h.view();
    if (pre) {
      DEJA_RETURN_IF_ERROR(
          kernels::LayerNorm(be, h.view(), lw.attn_ln.gamma, lw.attn_ln.beta, 1e-5f, a.view()));
      in = a.view();
    }
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, in, lw.q.w, lw.q.bias, Activation::kNone, false, q.view()));
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, in, lw.k.w, lw.k.bias, Activation::kNone, false, k.view()));
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, in, lw.v.w, lw.v.bias, Activation::kNone, false, v.view()));
    for (int64_t hh = 0; hh < heads; ++hh) {
      std::vector<Entry>& cache = cache_[l * heads + hh];
      for (int64_t i = 0; i < n; ++i) {
        Entry e;
        e.pos = start + static_cast<int32_t>(i);
        e.k.assign(k.as<float>() + i * d + hh * hd, k.as<float>() + i * d + hh * hd + hd);
        e.v.assign(v.as<float>() + i * d + hh * hd, v.as<float>() + i * d + hh * hd + hd);
        if (retain_ != nullptr) {
          std::vector<float> x(q.as<float>() + i * d + hh * hd,
                               q.as<float>() + i * d + hh * hd + hd);
          x.insert(x.end(), e.k.begin(), e.k.end());
          x.insert(x.end(), e.v.begin(), e.v.end());
          e.score = predictors::RetainingScore(*retain_, static_cast<int32_t>(l),
                                               static_cast<int32_t>(hh), x.data());
        }
        cache.push_back(std::move(e));
      }
      max_held_ = std::max(max_held_, static_cast<int32_t>(cache.size()));
      for (int64_t i = 0; i < n; ++i) {  // each query over the cached entries it may see
        const int32_t qpos = start + static_cast<int32_t>(i);
        const float* qi = q.as<float>() + i * d + hh * hd;
        std::vector<double> logit(cache.size(), -INFINITY);
        double mx = -INFINITY;
        for (size_t j = 0; j < cache.size(); ++j) {
          if (cache[j].pos > qpos) continue;
          double dot = 0;
          for (int64_t t = 0; t < hd; ++t) dot += static_cast<double>(qi[t]) * cache[j].k[t];
          logit[j] = dot * scale;
          mx = std::max(mx, logit[j]);
        }
        double z = 0;
        for (double x : logit) z += std::isinf(x) ? 0 : std::exp(x - mx);
        float* out = ctx.as<float>() + i * d + hh * hd;
        for (size_t j = 0; j < cache.size(); ++j) {
          if (std::isinf(logit[j])) continue;
          double p = std::exp(logit[j] - mx) / z;
          if (retain_ == nullptr) cache[j].score += p;
          for (int64_t t = 0; t < hd; ++t) out[t] += static_cast<float>(p * cache[j].v[t]);
        }
      }
      if (retain_ == nullptr) {
        for (Entry& e : cache) e.score *= decay_;
      }
      Evict(cache, start + static_cast<int32_t>(n));
    }
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, ctx.view(), lw.out.w, {}, Activation::kNone, false, o.view()));
    std::fill(ctx.as<float>(), ctx.as<float>() + n * d, 0.f);
    DEJA_RETURN_IF_ERROR(kernels::Add(be, o.view(), lw.out.bias, h.view()));
    if (!pre) {
      DEJA_RETURN_IF_ERROR(
          kernels::LayerNorm(be, h.view(), lw.attn_ln.gamma, lw.attn_ln.beta, 1e-5f, h.view()));
    }
    in = h.view();
    if (pre) {
      DEJA_RETURN_IF_ERROR(
          kernels::LayerNorm(be, h.view(), lw.ffn_ln.gamma, lw.ffn_ln.beta, 1e-5f, a.view()));
      in = a.view();
    }
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, in, lw.fc1.w, lw.fc1.bias, Activation::kRelu, false, u.view()));
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, u.view(), lw.fc2.w, {}, Activation::kNone, false, o.view()));
    DEJA_RETURN_IF_ERROR(kernels::Add(be, o.view(), lw.fc2.bias, h.view()));
    if (!pre) {
      DEJA_RETURN_IF_ERROR(
          kernels::LayerNorm(be, h.view(), lw.ffn_ln.gamma, lw.ffn_ln.beta, 1e-5f, h.view()));
    }
  }
  TensorView last = h.view().RowSlice(n - 1, n);
  Tensor x = Tensor::Empty(DType::kF32, {1, d});
  std::copy(last.as<float>(), last.as<float>() + d, x.as<float>());
  if (w_.final_ln.present()) {
    DEJA_RETURN_IF_ERROR(
        kernels::LayerNorm(be, x.view(), w_.final_ln.gamma, w_.final_ln.beta, 1e-5f, x.view()));
  }
  TensorView hx = x.view();
  Tensor proj;
  if (w_.project_out.w.data) {
    proj = Tensor::Empty(DType::kF32, {1, config_.word_embed_proj_dim});
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, x.view(), w_.project_out.w, {}, Activation::kNone, false, proj.view()));
    hx = proj.view();
  }
  logits->resize(config_.vocab_size);
  TensorView out{logits->data(), DType::kF32, Shape{1, config_.vocab_size}};
  return kernels::Linear(be, hx, w_.lm_head.w, {}, Activation::kNone, false, out);
}

Status ReferenceH2O::Greedy(const std::vector<int32_t>& prompt, int32_t steps,
                            std::vector<int32_t>* ids, std::vector<float>* logprobs, int32_t chunk,
                            int32_t* max_held) {
  std::vector<float> logits;
  const int32_t len = static_cast<int32_t>(prompt.size());
  const int32_t step = chunk > 0 ? chunk : len;
  for (int32_t done = 0; done < len; done += step) {
    const int32_t m = std::min(step, len - done);
    DEJA_RETURN_IF_ERROR(Step(
        std::vector<int32_t>(prompt.begin() + done, prompt.begin() + done + m), done, &logits));
  }
  int32_t pos = len;
  for (int32_t s = 0; s < steps; ++s) {
    int32_t best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    double mx = logits[best], z = 0;
    for (float x : logits) z += std::exp(x - mx);
    ids->push_back(best);
    logprobs->push_back(static_cast<float>(-std::log(z)));
    if (s + 1 == steps) break;
    DEJA_RETURN_IF_ERROR(Step({best}, pos++, &logits));
  }
  if (max_held != nullptr) *max_held = max_held_;
  return Status::Ok();
}

std::vector<int32_t> RandomPrompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(4, 8191);
  std::vector<int32_t> ids = {2};
  for (int i = 1; i < n; ++i) ids.push_back(tok(rng));
  return ids;
}

}  // namespace deja::worker
