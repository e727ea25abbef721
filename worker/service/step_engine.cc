#include "worker/service/step_engine.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <unordered_set>

#include "worker/comm/timed_communicator.h"
#include "worker/kv/policy_table.h"
#include "worker/rules/request_rules.h"

namespace deja::worker::service {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string Seq(uint64_t id) { return "seq_id " + std::to_string(id) + ": "; }

// The one top-k schedule a worker has: the predictors' own (or the oracle fraction).
constexpr const char* kDefaultSchedule = "default";

void LogSoftmax(const float* x, int32_t n, float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const float lse = mx + static_cast<float>(std::log(sum));
  for (int32_t i = 0; i < n; ++i) out[i] = x[i] - lse;
}

comm::CollectiveStats Stats(const comm::Communicator& c) {
  return comm::StatsOf(c).value_or(comm::CollectiveStats{});
}

}  // namespace

StatusOr<std::unique_ptr<StepEngine>> StepEngine::Create(
    model::Model* model, uint64_t kv_budget_bytes, std::unique_ptr<prefix::PrefixStore> prefix) {
  if (prefix != nullptr && model->kv_pool() == nullptr) {
    return FailedPrecondition("a prefix cache needs paged KV memory (--kv-paging on)");
  }
  // A cache's size is linear in its capacity, with no fixed part (on a device, in whole pool
  // blocks: Model::KvReserveBytes).
  return std::unique_ptr<StepEngine>(
      new StepEngine(model, kv_budget_bytes, model->kv_geometry().SlotBytes(), std::move(prefix)));
}

StepEngine::StepEngine(model::Model* model, uint64_t kv_budget_bytes, uint64_t bytes_per_token,
                       std::unique_ptr<prefix::PrefixStore> prefix)
    : model_(model),
      budget_(kv_budget_bytes),
      bytes_per_token_(bytes_per_token),
      paged_(model->kv_block_slots() > 0),
      prefix_(std::move(prefix)) {
  vocab_ = static_cast<int32_t>(model_->config().vocab_size);
  rank_ = model_->comm().rank();
  PublishUsage();
}

Status StepEngine::WarmUp() {
  DEJA_ASSIGN_OR_RETURN(std::unique_ptr<kv::SequenceKv> kv, model_->NewSequence(1));
  const int32_t bos = static_cast<int32_t>(model_->config().bos_token_id);
  return model_->Forward({{kv.get(), &bos, 1, false}}, &step_);
}

Status StepEngine::PlanNew(const deja::v1::SequenceWork& w, Planned* p, uint64_t* new_bytes) {
  const uint64_t id = w.seq_id();
  if (seqs_.count(id)) {
    return Status(StatusCode::kAlreadyExists, Seq(id) + "start_position 0 but the sequence exists");
  }
  if (!w.has_config()) return InvalidArgument(Seq(id) + "config must be set with start_position 0");
  const deja::v1::SequenceConfig& c = w.config();
  StatusOr<kv::CachePolicyKind> kind = kv::FromProto(c.cache().kind(), "config.cache.kind");
  if (!kind.ok()) return InvalidArgument(Seq(id) + kind.status().message());
  // Budgets that reach the sequence's length keep every token: the full cache, exactly (and no
  // int32 budget arithmetic on wrapped values).
  const uint64_t budget = static_cast<uint64_t>(c.cache().heavy_tokens()) + c.cache().recent_tokens();
  if (budget >= static_cast<uint64_t>(c.prompt_tokens()) + c.max_new_tokens()) {
    *kind = kv::CachePolicyKind::kFull;
  }
  p->cache.kind = *kind;
  const kv::CachePolicyRow& policy_row = kv::CachePolicyOf(*kind);
  if (policy_row.bounded) {
    p->cache.heavy_tokens =
        policy_row.heavy_hitters ? static_cast<int32_t>(c.cache().heavy_tokens()) : 0;
    p->cache.recent_tokens = static_cast<int32_t>(c.cache().recent_tokens());
  }
  // A rule's refusal, told for this sequence.
  auto refuse = [&](const Status& s) { return Status(s.code(), Seq(id) + s.message()); };
  if (const float decay = c.cache().score_decay(); decay != 0.f) {
    // Checked against the kind asked for: an H2O budget reaching the length runs as FULL,
    // which has no scores to decay.
    const kv::CachePolicyRow* asked = kv::FindCachePolicy(c.cache().kind());
    if (asked == nullptr) return InvalidArgument(Seq(id) + "config.cache.kind is not a kind");
    if (Status s = rules::CheckScoreDecayKind(*asked, "config.cache.score_decay"); !s.ok()) {
      return refuse(s);
    }
    if (Status s = rules::CheckScoreDecayRange(decay, "config.cache.score_decay"); !s.ok()) {
      return refuse(s);
    }
    if (policy_row.decays) p->cache.h2o_decay = decay;
  }
  if (Status v = p->cache.Validate(); !v.ok()) {
    return InvalidArgument(Seq(id) + "config.cache: " + v.message());
  }
  if (c.sparse()) {
    if (!model_->sparsity_enabled()) {
      return FailedPrecondition(Seq(id) +
                                "config.sparse: sparsity is not available on this worker (start "
                                "it with --predictors or --sparsity-oracle)");
    }
    if (!c.sparsity_schedule().empty() && c.sparsity_schedule() != kDefaultSchedule) {
      return InvalidArgument(Seq(id) + "config.sparsity_schedule: unknown schedule '" +
                             c.sparsity_schedule() + "' (this worker has only \"" +
                             kDefaultSchedule + "\")");
    }
  }
  if (Status s = rules::CheckTopN(c.top_n(), "config.top_n"); !s.ok()) return refuse(s);
  int64_t prefix_tokens = 0;
  if (c.prefix_blocks_size() > 0) {
    if (prefix_ == nullptr) {
      return FailedPrecondition(Seq(id) +
                                "config.prefix_blocks: this worker keeps no prefix cache");
    }
    if (c.prefix_important()) {
      if (Status s = rules::CheckPrefixImportant(policy_row, "config.prefix_important"); !s.ok()) {
        return refuse(s);
      }
    }
    if (Status s = rules::CheckPrefixRead(policy_row, "config.prefix_blocks"); !s.ok()) {
      return refuse(s);
    }
    prefix_tokens = static_cast<int64_t>(c.prefix_blocks_size()) * prefix_->block_tokens();
  }
  if (w.start_position() != prefix_tokens) {
    return InvalidArgument(Seq(id) + "start_position " + std::to_string(w.start_position()) +
                           " but config.prefix_blocks hold " + std::to_string(prefix_tokens) +
                           " tokens");
  }
  if (c.prompt_tokens() < prefix_tokens + w.tokens_size()) {
    return InvalidArgument(Seq(id) + "config.prompt_tokens " + std::to_string(c.prompt_tokens()) +
                           " is less than the prefix and the first chunk's " +
                           std::to_string(prefix_tokens + w.tokens_size()) + " tokens");
  }
  const int64_t max_tokens = static_cast<int64_t>(c.prompt_tokens()) + c.max_new_tokens();
  if (Status s = rules::CheckPositions(c.prompt_tokens(), c.max_new_tokens(),
                                       model_->config().max_position_embeddings, "config");
      !s.ok()) {
    return refuse(s);
  }
  // A bounded policy holds its budget plus at most one prompt's worth of chunk while
  // prefilling, then shrinks to budget + 1 (see Commit).
  int64_t capacity = max_tokens;
  if (policy_row.bounded) {
    auto policy = kv::MakeEvictionPolicy(p->cache, static_cast<int32_t>(c.prompt_tokens()));
    if (!policy.ok())
      return InvalidArgument(Seq(id) + "config.cache: " + policy.status().message());
    capacity = std::min<int64_t>(max_tokens,
                                 (*policy)->budget() + std::max<int64_t>(1, c.prompt_tokens()));
    // Locret prefills in chunks of at most chunk_tokens and evicts after each: its cache holds
    // budget + chunk_tokens from the first token.
    if (policy_row.retaining_heads) {
      if (c.cache().chunk_tokens() == 0) {
        return InvalidArgument(Seq(id) + "config.cache.chunk_tokens must be >= 1 for LOCRET");
      }
      if (Status s = rules::CheckRetainingHeads(policy_row, model_->retaining_enabled(),
                                                "config.cache.kind");
          !s.ok()) {
        return refuse(s);
      }
      // A chunk never holds more than the prompt (decode steps carry one token).
      const int64_t chunk =
          std::min<int64_t>(c.cache().chunk_tokens(), std::max<int64_t>(1, c.prompt_tokens()));
      capacity = std::min<int64_t>(max_tokens, (*policy)->budget() + chunk);
    }
  }
  sampling::SamplingParams sp;
  const deja::v1::WorkerSampling& s = c.sampling();
  sp.do_sample = s.do_sample();
  sp.temperature = s.do_sample() ? s.temperature() : 1.0f;
  sp.top_k = s.top_k();
  sp.top_p = s.top_p() == 0.f ? 1.f : s.top_p();
  sp.repetition_penalty = s.repetition_penalty() == 0.f ? 1.f : s.repetition_penalty();
  sp.seed = s.seed();
  sp.top_n = static_cast<int32_t>(c.top_n());
  sp.presence_penalty = s.presence_penalty();
  sp.frequency_penalty = s.frequency_penalty();
  sp.output_start = s.output_start();
  for (const auto& [token, bias] : s.logit_bias()) sp.logit_bias.emplace_back(token, bias);
  // A map's order is unspecified; the sum of biases does not depend on it, but keep it fixed.
  std::sort(sp.logit_bias.begin(), sp.logit_bias.end());
  if (Status v = sp.Validate(); !v.ok())
    return InvalidArgument(Seq(id) + "config.sampling." + v.message());
  // A paged cache takes pool blocks as it grows (checked per step in PlanOne), so nothing is
  // reserved for its maximum.
  const uint64_t bytes = paged_ ? 0 : model_->KvReserveBytes(static_cast<int32_t>(capacity));
  if (!paged_ && reserved_bytes_ + *new_bytes + bytes > budget_) {
    return ResourceExhausted(Seq(id) + "needs " + std::to_string(bytes) + " KV bytes, " +
                             std::to_string(budget_ - reserved_bytes_ - *new_bytes) +
                             " of the budget are free");
  }
  *new_bytes += bytes;
  p->fresh = std::make_unique<Sequence>();
  p->fresh->top_n = c.top_n();
  p->fresh->sparse = c.sparse();
  p->fresh->prompt_tokens = static_cast<int32_t>(c.prompt_tokens());
  p->fresh->max_tokens = static_cast<int32_t>(max_tokens);
  if (rank_ == 0) p->fresh->sampler = std::make_unique<sampling::Sampler>(sp);
  p->capacity = static_cast<int32_t>(capacity);
  return Status::Ok();
}

Status StepEngine::PlanOne(const deja::v1::SequenceWork& w,
                           const std::unordered_set<uint64_t>& earlier, Planned* p,
                           uint64_t* new_bytes) {
  const uint64_t id = w.seq_id();
  if (earlier.count(id)) return InvalidArgument(Seq(id) + "appears twice in the step");
  if (w.tokens_size() == 0) return InvalidArgument(Seq(id) + "tokens must not be empty");
  for (int32_t t : w.tokens()) {
    if (t < 0 || t >= vocab_) {
      return InvalidArgument(Seq(id) + "token id " + std::to_string(t) +
                             " is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
    }
  }
  if (w.start_position() == 0 || w.has_config()) {
    uint64_t bytes = *new_bytes;
    DEJA_RETURN_IF_ERROR(PlanNew(w, p, &bytes));
    if (static_cast<int64_t>(w.start_position()) + w.tokens_size() > p->capacity) {
      return OutOfRange(Seq(id) + std::to_string(w.start_position() + w.tokens_size()) +
                        " tokens exceed the sequence's KV capacity of " +
                        std::to_string(p->capacity));
    }
    // Allocated only once every check passed, so a refusal leaves nothing behind.
    DEJA_ASSIGN_OR_RETURN(
        p->fresh->kv,
        model_->NewSequence(p->fresh->max_tokens, p->cache, p->fresh->prompt_tokens,
                            kv::CachePolicyOf(p->cache.kind).retaining_heads
                                ? std::min(static_cast<int32_t>(w.config().cache().chunk_tokens()),
                                           std::max(1, p->fresh->prompt_tokens))
                                : std::max(1, p->fresh->prompt_tokens)));
    p->seq = p->fresh.get();
    if (w.config().prefix_blocks_size() > 0) DEJA_RETURN_IF_ERROR(SeedPrefix(w, p->seq));
    *new_bytes = bytes;
    return CheckPoolRoom(id, w.tokens_size(), p->seq, new_bytes);
  }
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFound(Seq(id) + "unknown sequence");
  if (w.has_config()) return InvalidArgument(Seq(id) + "config is only sent with start_position 0");
  Sequence* seq = it->second.get();
  const int32_t len = seq->kv->length();
  if (w.start_position() != static_cast<uint32_t>(len)) {
    return FailedPrecondition(Seq(id) + "start_position " + std::to_string(w.start_position()) +
                              " but the worker holds " + std::to_string(len) + " tokens");
  }
  if (static_cast<int64_t>(len) + w.tokens_size() > seq->max_tokens) {
    return OutOfRange(Seq(id) + std::to_string(len + w.tokens_size()) +
                      " tokens exceed the sequence's declared length of " +
                      std::to_string(seq->max_tokens) + " (prompt_tokens + max_new_tokens)");
  }
  // A bounded cache holds budget + 1 slots once its prompt is in: one token per step.
  if (w.tokens_size() > seq->kv->free_slots()) {
    return OutOfRange(Seq(id) + std::to_string(w.tokens_size()) + " tokens exceed the " +
                      std::to_string(seq->kv->free_slots()) +
                      " free slots of the sequence's KV cache");
  }
  p->seq = seq;
  return CheckPoolRoom(id, w.tokens_size(), seq, new_bytes);
}

Status StepEngine::SeedPrefix(const deja::v1::SequenceWork& w, Sequence* seq) {
  const std::vector<uint64_t> ids(w.config().prefix_blocks().begin(),
                                  w.config().prefix_blocks().end());
  if (w.config().prefix_important()) {
    if (Status st = prefix_->SeedLazy(ids, seq->kv.get(), &seq->history); !st.ok()) {
      return Status(st.code(), Seq(w.seq_id()) + "config.prefix_blocks: " + st.message());
    }
    return Status::Ok();
  }
  std::vector<int32_t> blocks;
  if (Status st = prefix_->MemoryBlocks(ids, &blocks, &seq->history); !st.ok()) {
    return Status(st.code(), Seq(w.seq_id()) + "config.prefix_blocks: " + st.message());
  }
  // Sharers of a full cache never write each other's slots; a bounded one rewrites in place.
  const bool share = !kv::CachePolicyOf(seq->kv->policy().kind()).bounded;
  if (Status st = seq->kv->SeedPrefix(blocks, share); !st.ok()) {
    return Status(st.code(), Seq(w.seq_id()) + "config.prefix_blocks: " + st.message());
  }
  return Status::Ok();
}

Status StepEngine::PrefixOp(const deja::v1::PrefixOp& op, prefix::PrefixIo* io) {
  if (prefix_ == nullptr)
    return FailedPrecondition("prefix_ops: this worker keeps no prefix cache");
  const uint64_t id = op.block_id();
  switch (op.kind()) {
    case deja::v1::PrefixOp::KIND_INSERT: {
      auto it = seqs_.find(op.seq_id());
      if (it == seqs_.end()) return NotFound(Seq(op.seq_id()) + "unknown sequence");
      const Sequence& seq = *it->second;
      const int64_t bt = prefix_->block_tokens();
      const int64_t first = static_cast<int64_t>(op.block_index()) * bt;
      if (kv::CachePolicyOf(seq.kv->policy().kind()).bounded) {
        return FailedPrecondition(Seq(op.seq_id()) + "only a full cache's blocks are cached");
      }
      if (first + bt > seq.kv->length() || first + bt > static_cast<int64_t>(seq.history.size())) {
        return OutOfRange(Seq(op.seq_id()) + "block " + std::to_string(op.block_index()) +
                          " is not complete");
      }
      return prefix_->Insert(
          id, seq.kv->pool_block(static_cast<int32_t>(op.block_index())),
          std::vector<int32_t>(seq.history.begin() + first, seq.history.begin() + first + bt));
    }
    case deja::v1::PrefixOp::KIND_TO_HOST:
      return prefix_->ToHost(id);
    case deja::v1::PrefixOp::KIND_TO_DISK:
      return prefix_->ToDisk(id);
    case deja::v1::PrefixOp::KIND_TO_MEMORY:
      return prefix_->ToMemory(id, io);
    case deja::v1::PrefixOp::KIND_DROP:
      prefix_->Drop(id);
      return Status::Ok();
    default:
      return InvalidArgument("prefix_ops: unknown kind " + std::to_string(op.kind()));
  }
}

void StepEngine::ReportLazyLoads(deja::v1::StepResponse* resp) {
  const prefix::LazyCounters lazy = prefix_->TakeLazy();
  const model::Model::ImportanceStats stats = model_->TakeImportanceStats();
  deja::v1::PrefixIo* out = resp->mutable_prefix_io();
  out->set_host_bytes_read(out->host_bytes_read() + static_cast<uint64_t>(lazy.host_bytes));
  out->set_disk_bytes_read(out->disk_bytes_read() + static_cast<uint64_t>(lazy.disk_bytes));
  out->set_load_seconds(out->load_seconds() + lazy.seconds);
  int64_t chosen = 0, fallbacks = 0;
  for (int64_t c : stats.chosen) chosen += c;
  for (int64_t f : stats.fallbacks) fallbacks += f;
  out->set_important_layers(static_cast<uint64_t>(chosen));
  out->set_fallback_layers(static_cast<uint64_t>(fallbacks));
  const int64_t reordered = prefix_->reordered_files();
  out->set_reordered_files(static_cast<uint64_t>(reordered - reordered_reported_));
  reordered_reported_ = reordered;
  for (const auto& [id, counts] : lazy.chosen) {
    if (counts.second <= 0) continue;
    deja::v1::BlockImportance* b = out->add_block_importance();
    b->set_block_id(id);
    b->set_important_fraction(static_cast<double>(counts.first) / counts.second);
  }
  for (uint64_t id : lazy.failed) resp->add_prefix_failed(id);
  if (!lazy.failed.empty()) {
    out->set_memory_blocks(static_cast<uint64_t>(prefix_->memory_blocks()));
    out->set_host_blocks(static_cast<uint64_t>(prefix_->host_blocks()));
    out->set_disk_blocks(
        static_cast<uint64_t>(prefix_->size() - prefix_->memory_blocks() - prefix_->host_blocks()));
  }
}

void StepEngine::RunPrefixOp(const deja::v1::PrefixOp& op, prefix::PrefixIo* io,
                             deja::v1::StepResponse* resp) {
  Status st = PrefixOp(op, io);
  if (st.ok()) return;
  // The block is forgotten here, and the coordinator forgets it for the group: a prefix that
  // cannot be produced is recomputed, never served.
  LOG(WARNING) << "rank " << rank_ << ": prefix block " << op.block_id() << ": " << st.ToString();
  if (prefix_ != nullptr) prefix_->Drop(op.block_id());
  resp->add_prefix_failed(op.block_id());
}

Status StepEngine::CheckPoolRoom(uint64_t id, int32_t n, Sequence* seq, uint64_t* new_bytes) {
  if (!paged_) return Status::Ok();
  StatusOr<int64_t> need = seq->kv->BytesToAppend(n);
  if (!need.ok()) return Status(need.status().code(), Seq(id) + need.status().message());
  const int64_t free_bytes =
      std::max<int64_t>(0, model_->kv_pool_free_bytes() - static_cast<int64_t>(*new_bytes));
  if (*need > free_bytes) {
    return ResourceExhausted(Seq(id) + std::to_string(n) + " tokens need " + std::to_string(*need) +
                             " more KV bytes; the pool has " + std::to_string(free_bytes) +
                             " free");
  }
  *new_bytes += static_cast<uint64_t>(*need);
  return Status::Ok();
}

std::vector<StepEngine::Planned> StepEngine::Plan(const deja::v1::StepRequest& req) {
  std::vector<Planned> plan(static_cast<size_t>(req.sequences_size()));
  std::unordered_set<uint64_t> seen;
  uint64_t new_bytes = 0;
  for (int i = 0; i < req.sequences_size(); ++i) {
    const deja::v1::SequenceWork& w = req.sequences(i);
    Planned& p = plan[static_cast<size_t>(i)];
    p.work = &w;
    p.refused = PlanOne(w, seen, &p, &new_bytes);
    seen.insert(w.seq_id());
    if (!p.refused.ok()) {
      p.seq = nullptr;
      p.fresh.reset();
    }
  }
  return plan;
}

Status StepEngine::Run(const deja::v1::StepRequest& req, deja::v1::StepResponse* resp) {
  const Clock::time_point t0 = Clock::now();
  resp->set_step_id(req.step_id());
  resp->set_rank(static_cast<uint32_t>(rank_));
  if (req.prefix_ops_size() > 0 || prefix_ != nullptr) {
    prefix::PrefixIo io;
    for (const deja::v1::PrefixOp& op : req.prefix_ops()) RunPrefixOp(op, &io, resp);
    deja::v1::PrefixIo* out = resp->mutable_prefix_io();
    out->set_host_bytes_read(static_cast<uint64_t>(io.host_bytes));
    out->set_disk_bytes_read(static_cast<uint64_t>(io.disk_bytes));
    out->set_load_seconds(io.seconds);
    if (prefix_ != nullptr) {
      out->set_memory_blocks(static_cast<uint64_t>(prefix_->memory_blocks()));
      out->set_host_blocks(static_cast<uint64_t>(prefix_->host_blocks()));
      out->set_disk_blocks(static_cast<uint64_t>(prefix_->size() - prefix_->memory_blocks() -
                                                 prefix_->host_blocks()));
    }
  }
  for (uint64_t id : req.release_seq_ids()) Release(id);

  std::vector<Planned> plan = Plan(req);
  std::vector<deja::v1::SequenceResult> results(plan.size());
  std::vector<size_t> run;  // indices into plan of the sequences in the forward batch
  for (size_t i = 0; i < plan.size(); ++i) {
    deja::v1::SequenceResult& r = results[i];
    r.set_seq_id(plan[i].work->seq_id());
    r.set_token_id(-1);
    if (plan[i].refused.ok()) {
      run.push_back(i);
      continue;
    }
    r.set_error_code(static_cast<int32_t>(plan[i].refused.code()));
    r.set_error_message(plan[i].refused.message());
    VLOG(1) << "rank " << rank_ << " step " << req.step_id() << ": " << plan[i].refused.ToString();
  }
  Status fatal;
  if (!run.empty()) {
    std::vector<model::SequenceStep> batch;
    uint32_t sparse_sequences = 0;
    for (size_t i : run) {
      const Planned& p = plan[i];
      // On a device the logits stay there unless all of them are wanted or the sampler needs
      // the whole row (the top candidates decide greedy and small top-k choices).
      const bool full = p.work->want_all_logits() ||
                        (p.work->sample() && p.seq->sampler != nullptr &&
                         !p.seq->sampler->CanChooseFromTop(model::kDeviceTopCandidates));
      batch.push_back({p.seq->kv.get(), p.work->tokens().data(), p.work->tokens_size(),
                       p.work->want_all_logits(), p.seq->sparse, full});
      sparse_sequences += p.seq->sparse ? 1 : 0;
    }
    const comm::CollectiveStats before = Stats(model_->comm());
    const model::Model::GraphStats graphs_before = model_->graph_stats();
    const Clock::time_point tf = Clock::now();
    Status s = model_->Forward(batch, &step_);
    const model::Model::GraphStats graphs_after = model_->graph_stats();
    resp->mutable_timings()->set_graph_captured(graphs_after.captures > graphs_before.captures);
    resp->mutable_timings()->set_graph_replayed(graphs_after.replays > graphs_before.replays &&
                                                graphs_after.captures == graphs_before.captures);
    const double forward = Since(tf);
    const comm::CollectiveStats after = Stats(model_->comm());
    const double ar = after.all_reduce_seconds - before.all_reduce_seconds;
    resp->mutable_timings()->set_allreduce_seconds(ar);
    resp->mutable_timings()->set_allreduce_calls(
        static_cast<uint32_t>(after.all_reduce_calls - before.all_reduce_calls));
    resp->mutable_timings()->set_compute_seconds(std::max(0.0, forward - ar));
    resp->mutable_timings()->set_predictor_seconds(step_.predictor_seconds);
    if (!s.ok()) {
      // Every input was checked above, so this is a failed collective: the caches of the batch
      // and the group's lockstep are lost.
      fatal = s.WithContext("rank " + std::to_string(rank_) + " forward failed");
      resp->set_error_code(static_cast<int32_t>(s.code()));
      resp->set_error_message(fatal.message());
      resp->set_fatal(true);
      LOG(ERROR) << fatal.ToString();
    } else {
      deja::v1::StepSparsity* sp = resp->mutable_sparsity();
      sp->set_active_head_fraction(step_.active_head_fraction);
      sp->set_active_neuron_fraction(step_.active_neuron_fraction);
      sp->set_sparse_sequences(sparse_sequences);
      sp->set_dense_sequences(static_cast<uint32_t>(run.size()) - sparse_sequences);
      for (size_t i : run) {
        Planned& p = plan[i];
        p.seq->history.insert(p.seq->history.end(), p.work->tokens().begin(),
                              p.work->tokens().end());
        if (p.fresh) {
          reserved_bytes_ += p.fresh->kv->bytes();
          seqs_[p.work->seq_id()] = std::move(p.fresh);
        }
        ShrinkAfterPrefill(p.seq);
      }
      if (prefix_ != nullptr) ReportLazyLoads(resp);
      if (rank_ == 0) {
        const Clock::time_point ts = Clock::now();
        Sample(plan, run, &results);
        resp->mutable_timings()->set_sample_seconds(Since(ts));
      }
    }
  }
  // Rank 0 answers every sequence; the others only the ones they refused.
  for (size_t i = 0; i < results.size(); ++i) {
    if (rank_ == 0 || results[i].error_code() != 0) *resp->add_results() = std::move(results[i]);
  }
  PublishUsage();
  *resp->mutable_kv() = Usage();
  resp->mutable_timings()->set_total_seconds(Since(t0));
  VLOG(1) << "rank " << rank_ << " step " << req.step_id() << ": " << run.size() << " of "
          << plan.size() << " sequences ran, " << req.release_seq_ids_size() << " released, "
          << resp->timings().total_seconds() * 1e3 << " ms";
  return fatal;
}

void StepEngine::Sample(const std::vector<Planned>& plan, const std::vector<size_t>& run,
                        std::vector<deja::v1::SequenceResult>* results) {
  const float* logits = step_.logits.as<float>();
  // Logits rows in batch order; each sequence's rows are contiguous, its last row last.
  size_t row = 0;
  for (size_t b = 0; b < run.size(); ++b) {
    const Planned& p = plan[run[b]];
    size_t first = row;
    while (row < step_.row_seq.size() && step_.row_seq[row] == static_cast<int32_t>(b)) ++row;
    deja::v1::SequenceResult* r = &(*results)[run[b]];
    if (p.work->want_all_logits()) {
      logprob_row_.resize(vocab_);
      for (size_t i = first; i < row; ++i) {
        LogSoftmax(logits + i * vocab_, vocab_, logprob_row_.data());
        r->mutable_all_logprobs()->Add(logprob_row_.begin(), logprob_row_.end());
      }
    }
    if (p.work->sample() && row > first) {
      const int32_t k = step_.top_k;
      StatusOr<sampling::TokenChoice> chosen =
          k > 0 && p.seq->sampler->CanChooseFromTop(k)
              ? p.seq->sampler->ChooseFromTop(step_.top_logprobs.data() + (row - 1) * k,
                                              step_.top_ids.data() + (row - 1) * k, k)
              : p.seq->sampler->Choose(logits + (row - 1) * vocab_, vocab_, p.seq->history);
      if (!chosen.ok()) {
        // This sequence's numerics failed; the others' rows are their own.
        r->set_error_code(static_cast<int32_t>(chosen.status().code()));
        r->set_error_message(Seq(p.work->seq_id()) + chosen.status().message());
        LOG(WARNING) << "rank " << rank_ << ": " << r->error_message();
        continue;
      }
      const sampling::TokenChoice& c = *chosen;
      r->set_token_id(c.id);
      r->set_logprob(c.logprob);
      for (const auto& [id, lp] : c.top) {
        deja::v1::TopLogprob* t = r->add_top();
        t->set_id(id);
        t->set_logprob(lp);
      }
    }
  }
}

void StepEngine::ShrinkAfterPrefill(Sequence* seq) {
  kv::SequenceKv& kv = *seq->kv;
  const int32_t budget = kv.policy().budget();
  if (budget == 0 || kv.length() < seq->prompt_tokens || kv.capacity() <= budget + 1) return;
  const size_t before = kv.bytes();
  if (Status s = kv.Resize(budget + 1); !s.ok()) {
    LOG(WARNING) << "rank " << rank_ << ": keeping the prefill-sized cache: " << s.ToString();
    return;
  }
  reserved_bytes_ -= before;
  reserved_bytes_ += kv.bytes();
}

void StepEngine::Release(uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  reserved_bytes_ -= it->second->kv->bytes();
  evicted_released_ += static_cast<uint64_t>(it->second->kv->evictions());
  seqs_.erase(it);
  VLOG(1) << "rank " << rank_ << ": released seq_id " << seq_id;
}

void StepEngine::ReleaseAll() {
  if (!seqs_.empty())
    LOG(INFO) << "rank " << rank_ << ": releasing " << seqs_.size() << " sequences";
  for (const auto& [id, s] : seqs_) evicted_released_ += static_cast<uint64_t>(s->kv->evictions());
  seqs_.clear();
  reserved_bytes_ = 0;
  PublishUsage();
}

void StepEngine::PublishUsage() {
  // Both counted per (layer, head) slot, the unit eviction works in.
  uint64_t cached = 0, evicted = evicted_released_;
  for (const auto& [id, s] : seqs_) {
    cached += static_cast<uint64_t>(s->kv->cached_slots());
    evicted += static_cast<uint64_t>(s->kv->evictions());
  }
  std::lock_guard<std::mutex> lock(usage_mu_);
  usage_.set_total_bytes(budget_);
  if (paged_) {
    usage_.set_free_bytes(static_cast<uint64_t>(model_->kv_pool_free_bytes()));
  } else {
    usage_.set_free_bytes(budget_ > reserved_bytes_ ? budget_ - reserved_bytes_ : 0);
  }
  usage_.set_cached_tokens(cached);
  usage_.set_evicted_tokens_total(evicted);
  usage_.set_sequences(static_cast<uint32_t>(seqs_.size()));
}

deja::v1::KvUsage StepEngine::Usage() const {
  std::lock_guard<std::mutex> lock(usage_mu_);
  return usage_;
}

}  // namespace deja::worker::service
