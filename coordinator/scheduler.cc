#include "coordinator/scheduler.h"

#include <glog/logging.h>

#include <algorithm>
#include <unordered_map>

#include "worker/kv/policy_table.h"

namespace deja::coordinator {

uint64_t Scheduler::Bytes(int64_t positions) const {
  uint64_t p = static_cast<uint64_t>(std::max<int64_t>(0, positions));
  if (const uint64_t bt = capacity_.block_tokens; bt > 0) p = (p + bt - 1) / bt * bt;
  return p * capacity_.bytes_per_token;
}

bool Scheduler::Grows(const Request& r) const {
  return capacity_.block_tokens > 0 && !r.params().BoundedCache();
}

uint64_t Scheduler::NeedBytes(const Request& r) const {
  return Grows(r) ? Bytes(r.prefill_tokens()) : MaxBytes(r);
}

uint64_t Scheduler::MaxBytes(const Request& r) const {
  return Bytes(r.params().ReservedPositions());
}

uint64_t Scheduler::Headroom() const {
  if (capacity_.block_tokens == 0) return 0;
  uint64_t n = 0;
  for (const auto& r : running_) n += Grows(*r) && reserved_.count(r->seq_id()) ? 1 : 0;
  for (const auto& r : waiting_) n += Grows(*r) && reserved_.count(r->seq_id()) ? 1 : 0;
  return n * Bytes(capacity_.block_tokens);
}

void Scheduler::SetKvCapacity(const KvCapacity& capacity) {
  capacity_ = capacity;
  prefix_.reset();
  pending_prefix_ops_.clear();
  prefix_restart_.clear();
  if (!capacity.prefix_cache || capacity.block_tokens == 0 || capacity.bytes_per_token == 0) return;
  const uint64_t block = Bytes(capacity.block_tokens);
  PrefixIndexOptions o;
  o.block_tokens = static_cast<int32_t>(capacity.block_tokens);
  // The memory tier lives in the KV pool, in what running sequences leave free (FitPrefixMemory).
  prefix_memory_blocks_ =
      static_cast<int64_t>(std::min(options_.prefix_memory_bytes, capacity.total_bytes) / block);
  o.memory_blocks = prefix_memory_blocks_;
  o.host_blocks = static_cast<int64_t>(options_.prefix_host_bytes / block);
  o.disk_blocks =
      capacity.prefix_disk ? static_cast<int64_t>(options_.prefix_disk_bytes / block) : 0;
  if (o.memory_blocks == 0) return;  // every block enters through memory
  prefix_ = std::make_unique<PrefixIndex>(o);
  UpdatePrefixBlocks();
  LOG(INFO) << "scheduler: prefix cache of up to " << o.memory_blocks << " memory, "
            << o.host_blocks << " host and " << o.disk_blocks << " disk blocks of "
            << o.block_tokens << " positions (" << block << " bytes per rank each)";
}

uint64_t Scheduler::PrefixBytes() const {
  if (prefix_ == nullptr) return 0;
  return static_cast<uint64_t>(prefix_->blocks(PrefixTier::kMemory)) *
         Bytes(capacity_.block_tokens);
}

void Scheduler::FitPrefixMemory(uint64_t more) {
  if (prefix_ == nullptr) return;
  const uint64_t block = Bytes(capacity_.block_tokens);
  const uint64_t used = reserved_bytes_ + more + Headroom();
  const int64_t room = used >= capacity_.total_bytes
                           ? 0
                           : static_cast<int64_t>((capacity_.total_bytes - used) / block);
  std::vector<PrefixOp> ops;
  prefix_->SetMemoryBlocks(std::min(prefix_memory_blocks_, room), &ops);
  AppendOps(ops);
  UpdatePrefixBlocks();
}

Status Scheduler::NeverFits(const Request& r, uint64_t need) const {
  return ResourceExhausted("the request needs " + std::to_string(need) +
                           " bytes of KV memory per rank (prompt + max_new_tokens = " +
                           std::to_string(r.params().ReservedPositions()) +
                           " positions), more than the workers' " +
                           std::to_string(capacity_.total_bytes));
}

Status Scheduler::Admit(std::shared_ptr<Request> request, std::string* reject_reason) {
  if (by_id_.count(request->id())) {
    *reject_reason = "already_exists";
    return Status(StatusCode::kAlreadyExists,
                  "request_id '" + request->id() + "' is already running");
  }
  if (static_cast<int32_t>(waiting_.size()) >= options_.max_waiting) {
    *reject_reason = "queue_full";
    return ResourceExhausted("the queue is full (" + std::to_string(waiting_.size()) +
                             " requests waiting); retry later");
  }
  const uint64_t need = NeedBytes(*request);
  if (capacity_.bytes_per_token > 0 && MaxBytes(*request) > capacity_.total_bytes) {
    *reject_reason = "kv_full";
    return NeverFits(*request, MaxBytes(*request));
  }
  // Reserved now when it fits (and, when requests wait for KV, none is queued unreserved ahead
  // of it: first come, first served); else it waits for KV (wait_for_kv: Plan reserves it when
  // enough is free) or is refused.
  // Cached prefix blocks in memory give way to a request (they move down a tier).
  FitPrefixMemory(need);
  const bool fits = capacity_.bytes_per_token == 0 ||
                    reserved_bytes_ + need + Headroom() + PrefixBytes() <= capacity_.total_bytes;
  // Requests without a reservation wait ahead (queued by wait_for_kv, or preempted).
  const bool queued_for_kv = std::any_of(waiting_.begin(), waiting_.end(), [&](const auto& w) {
    return reserved_.count(w->seq_id()) == 0;
  });
  if (fits && !queued_for_kv) {
    reserved_[request->seq_id()] = need;
    reserved_bytes_ += need;
  } else if (!options_.wait_for_kv) {
    *reject_reason = "kv_full";
    return ResourceExhausted("KV memory is full: " + std::to_string(need) + " bytes needed, " +
                             std::to_string(capacity_.total_bytes - reserved_bytes_) +
                             " free per rank; retry later");
  }
  by_id_[request->id()] = request;
  waiting_.push_back(std::move(request));
  return Status::Ok();
}

bool Scheduler::Cancel(const std::string& id, CancelKind kind) {
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second->done()) return false;
  it->second->RequestCancel(kind);
  return true;
}

void Scheduler::Sweep(Clock::time_point now) {
  // Copies: Remove() edits the containers.
  for (const auto& r : std::vector<std::shared_ptr<Request>>(running_)) {
    if (r->CheckExpiry(now)) Remove(r, false);
  }
  for (const auto& r : std::vector<std::shared_ptr<Request>>(waiting_.begin(), waiting_.end())) {
    if (r->CheckExpiry(now)) Remove(r, false);
  }
}

StepPlan Scheduler::Plan(Clock::time_point now) {
  Sweep(now);
  if (capacity_.block_tokens > 0 && capacity_.bytes_per_token > 0) GrowReservations();
  StepPlan plan;
  plan.start = now;
  for (const auto& r : running_) {
    if (!r->prefill_done()) continue;
    v1::SequenceWork* w = plan.step.add_sequences();
    w->set_seq_id(r->seq_id());
    w->add_tokens(r->last_token());
    w->set_start_position(static_cast<uint32_t>(r->next_position()));
    w->set_sample(true);
    plan.work.push_back({r, 0, true});
    plan.tokens += 1;
  }
  int32_t budget = options_.max_prefill_tokens;
  for (const auto& r : running_) {
    if (budget <= 0) break;
    if (!r->prefill_done()) AddPrefill(r, &budget, &plan);
  }
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < options_.max_batch_sequences) {
    // A head queued for KV (wait_for_kv) is reserved once enough is free; nothing overtakes it,
    // so a long request is not starved by short ones.
    const bool reserved = reserved_.count(waiting_.front()->seq_id()) != 0;
    const uint64_t need = reserved ? 0 : NeedBytes(*waiting_.front());
    if (!reserved && capacity_.bytes_per_token > 0 &&
        MaxBytes(*waiting_.front()) > capacity_.total_bytes) {
      // Admitted under a larger worker group (the capacity shrank with a new epoch).
      std::shared_ptr<Request> r = waiting_.front();
      r->Fail(NeverFits(*r, MaxBytes(*r)), now);
      Remove(r, false);
      continue;
    }
    if (!reserved) FitPrefixMemory(need);
    if (!reserved && capacity_.bytes_per_token > 0 &&
        reserved_bytes_ + need + Headroom() + PrefixBytes() > capacity_.total_bytes) {
      break;
    }
    std::shared_ptr<Request> r = std::move(waiting_.front());
    waiting_.pop_front();
    if (!reserved) {
      reserved_[r->seq_id()] = need;
      reserved_bytes_ += need;
    }
    running_.push_back(r);
    AddPrefill(r, &budget, &plan);
  }
  for (uint64_t id : pending_release_) plan.step.add_release_seq_ids(id);
  pending_release_.clear();
  FitPrefixMemory(0);  // what the step leaves free, for this step's loads and later inserts
  // Earlier steps' operations (inserts of finished prompts, drops of lost blocks) first, then
  // this plan's loads; the workers run them all before the releases and the work.
  for (v1::PrefixOp& op : pending_prefix_ops_) *plan.step.add_prefix_ops() = std::move(op);
  pending_prefix_ops_.clear();
  prefix_restart_.clear();
  return plan;
}

bool Scheduler::UsesPrefix(const Request& r) const {
  const worker::kv::CachePolicyRow* row =
      worker::kv::FindCachePolicy(r.params().config.cache().kind());
  return prefix_ != nullptr && r.params().prefix_cache && row != nullptr &&
         row->reads_prefix_cache;
}

bool Scheduler::PreparePrefix(const std::shared_ptr<Request>& r) {
  if (!UsesPrefix(*r)) return true;
  Request::PrefixState& ps = r->prefix();
  if (ps.looked_up) {
    // The step that loaded the blocks completed; those a rank lost were dropped from ps.blocks.
    ps.loading = false;
  } else {
    ps.looked_up = true;
    // At least the last token is computed: its logits give the first new token.
    const int32_t n = r->prefill_tokens() - 1;
    std::vector<int32_t> tokens(static_cast<size_t>(std::max(0, n)));
    for (int32_t i = 0; i < n; ++i) tokens[i] = r->prefill_token(i);
    PrefixMatch m = prefix_->Lookup(r->params().prefix_key, tokens.data(), n);
    // Important-token loading reads a prefix partly on host or disk where it is, into the
    // sequence's own blocks; otherwise the blocks come into the memory tier, which a sequence
    // shares: at most as many as it has room for.
    const bool important = options_.prefix_important && !r->params().BoundedCache() &&
                           std::any_of(m.tiers.begin(), m.tiers.end(),
                                       [](PrefixTier t) { return t != PrefixTier::kMemory; });
    const size_t most = static_cast<size_t>(prefix_->options().memory_blocks);
    if (!important && m.blocks.size() > most) {
      m.blocks.resize(most);
      m.tiers.resize(most);
    }
    std::vector<PrefixOp> ops;
    int32_t held = 0;
    if (important) {
      held = static_cast<int32_t>(m.blocks.size());
    } else if (!m.blocks.empty()) {
      held = prefix_->Promote(m.blocks, &ops);
    }
    AppendOps(ops);
    if (held == 0) {
      ++prefix_stats_.misses;
      return true;
    }
    ps.blocks.assign(m.blocks.begin(), m.blocks.begin() + held);
    prefix_->Pin(ps.blocks);
    prefix_->Touch(ps.blocks);
    const PrefixTier slowest = *std::max_element(m.tiers.begin(), m.tiers.begin() + held);
    ++prefix_stats_.hits[static_cast<int>(slowest)];
    prefix_stats_.hit_tokens += static_cast<uint64_t>(held) * prefix_->options().block_tokens;
    ps.important = important;
    prefix_stats_.important_requests += important ? 1 : 0;
    ps.loading = !important && slowest != PrefixTier::kMemory;
    UpdatePrefixBlocks();
    if (ps.loading) return false;  // starts once the loads of this step landed on every rank
  }
  if (!ps.blocks.empty()) {
    r->StartAfterPrefix(static_cast<int32_t>(ps.blocks.size()) * prefix_->options().block_tokens);
  }
  return true;
}

void Scheduler::AppendOps(const std::vector<PrefixOp>& ops) {
  for (const PrefixOp& op : ops) {
    v1::PrefixOp& out = pending_prefix_ops_.emplace_back();
    out.set_block_id(op.block_id);
    switch (op.kind) {
      case PrefixOp::Kind::kToHost:
        out.set_kind(v1::PrefixOp::KIND_TO_HOST);
        break;
      case PrefixOp::Kind::kToDisk:
        out.set_kind(v1::PrefixOp::KIND_TO_DISK);
        break;
      case PrefixOp::Kind::kToMemory:
        out.set_kind(v1::PrefixOp::KIND_TO_MEMORY);
        break;
      case PrefixOp::Kind::kDrop:
        out.set_kind(v1::PrefixOp::KIND_DROP);
        break;
    }
  }
}

void Scheduler::CachePrompt(const Request& r) {
  // A sequence that read only important tokens holds an approximation: never cached.
  if (!UsesPrefix(r) || r.params().BoundedCache() || capacity_.block_tokens == 0 ||
      r.prefix().important) {
    return;
  }
  const int32_t n = r.prefill_tokens();
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) tokens[i] = r.prefill_token(i);
  std::vector<PrefixOp> ops;
  std::vector<size_t> created_at;
  const auto added = prefix_->Insert(r.params().prefix_key, tokens.data(), n, &ops, &created_at);
  // Each INSERT goes where the index created its block: later ops may move it down a tier.
  size_t done = 0;
  for (size_t k = 0; k <= added.size(); ++k) {
    const size_t upto = k < added.size() ? created_at[k] : ops.size();
    AppendOps(std::vector<PrefixOp>(ops.begin() + static_cast<std::ptrdiff_t>(done),
                                    ops.begin() + static_cast<std::ptrdiff_t>(upto)));
    done = upto;
    if (k == added.size()) break;
    v1::PrefixOp& op = pending_prefix_ops_.emplace_back();
    op.set_kind(v1::PrefixOp::KIND_INSERT);
    op.set_block_id(added[k].second);
    op.set_seq_id(r.seq_id());
    op.set_block_index(static_cast<uint32_t>(added[k].first));
  }
  UpdatePrefixBlocks();
}

void Scheduler::ApplyPrefixFailures(const std::vector<v1::StepResponse>& responses) {
  for (const v1::StepResponse& response : responses) {
    prefix_stats_.host_bytes += response.prefix_io().host_bytes_read();
    prefix_stats_.disk_bytes += response.prefix_io().disk_bytes_read();
    prefix_stats_.important_layers += response.prefix_io().important_layers();
    prefix_stats_.fallback_layers += response.prefix_io().fallback_layers();
    prefix_stats_.reordered_files += response.prefix_io().reordered_files();
  }
  if (prefix_ == nullptr) return;
  // Important-token loading measured the share of important tokens of the blocks it read: the
  // index scores them by it (the mean over ranks: each chooses with its own heads).
  std::unordered_map<uint64_t, std::pair<double, int>> importance;
  for (const v1::StepResponse& response : responses) {
    for (const v1::BlockImportance& b : response.prefix_io().block_importance()) {
      auto& [sum, ranks] = importance[b.block_id()];
      sum += b.important_fraction();
      ++ranks;
    }
  }
  for (const auto& [id, m] : importance) prefix_->SetImportance(id, m.first / m.second);
  bool lost = false;
  for (const v1::StepResponse& response : responses) {
    for (uint64_t id : response.prefix_failed()) {
      if (!prefix_->TierOf(id).has_value()) continue;  // another rank reported it first
      std::vector<PrefixOp> ops;
      prefix_->Lost(id, &ops);
      AppendOps(ops);
      ++prefix_stats_.lost_blocks;
      lost = true;
    }
  }
  if (!lost) return;
  // Sequences waiting for lost blocks start after the blocks that landed (recomputing the rest);
  // one that read a lost block's important tokens this step is recomputed.
  for (const auto& r : running_) {
    std::vector<uint64_t>& blocks = r->prefix().blocks;
    auto gone = std::find_if(blocks.begin(), blocks.end(),
                             [&](uint64_t id) { return !prefix_->TierOf(id).has_value(); });
    if (gone != blocks.end() && r->prefix().important) prefix_restart_.insert(r->seq_id());
    blocks.erase(gone, blocks.end());
  }
  UpdatePrefixBlocks();
}

void Scheduler::ReleasePrefix(Request& r) {
  if (prefix_ != nullptr && !r.prefix().blocks.empty()) prefix_->Unpin(r.prefix().blocks);
  r.prefix() = Request::PrefixState();
}

void Scheduler::UpdatePrefixBlocks() {
  for (PrefixTier t : {PrefixTier::kMemory, PrefixTier::kHost, PrefixTier::kDisk}) {
    prefix_stats_.blocks[static_cast<int>(t)] = prefix_ != nullptr ? prefix_->blocks(t) : 0;
  }
}

void Scheduler::AddPrefill(const std::shared_ptr<Request>& r, int32_t* budget, StepPlan* plan) {
  if (r->starts() && !PreparePrefix(r)) return;
  const int32_t start = r->prefilled();
  const int32_t total = r->prefill_tokens();
  int32_t chunk = std::min(total - start, *budget);
  // A locret sequence's cache holds its budget plus one chunk of chunk_tokens (the worker
  // reserved that much) and evicts where its length is a multiple of chunk_tokens (SequenceKv::
  // SetEvictionBoundaries): a step never crosses such a boundary, so the prefill budget can
  // split a chunk but never moves where the cache evicts.
  const v1::WorkerCachePolicy& cache = r->params().config.cache();
  const worker::kv::CachePolicyRow* row = worker::kv::FindCachePolicy(cache.kind());
  if (row != nullptr && row->retaining_heads && cache.chunk_tokens() > 0) {
    const int32_t every = static_cast<int32_t>(cache.chunk_tokens());
    chunk = std::min(chunk, every - start % every);
  }
  if (chunk <= 0) return;
  *budget -= chunk;
  const bool sample = start + chunk == total && r->prefill_samples();
  v1::SequenceWork* w = plan->step.add_sequences();
  w->set_seq_id(r->seq_id());
  w->mutable_tokens()->Reserve(chunk);
  for (int32_t i = start; i < start + chunk; ++i) w->add_tokens(r->prefill_token(i));
  w->set_start_position(static_cast<uint32_t>(start));
  if (r->starts()) {
    v1::SequenceConfig* c = w->mutable_config();
    *c = r->params().config;
    for (uint64_t id : r->prefix().blocks) c->add_prefix_blocks(id);
    c->set_prefix_important(r->prefix().important);
    // A recomputing sequence's generated tokens count as prompt; its length limit stays.
    const int32_t again = total - r->prompt_tokens();
    c->set_prompt_tokens(static_cast<uint32_t>(total));
    c->set_max_new_tokens(c->max_new_tokens() - static_cast<uint32_t>(again));
  }
  w->set_sample(sample);
  plan->work.push_back({r, chunk, sample});
  plan->tokens += chunk;
}

void Scheduler::GrowReservations() {
  // Oldest first: the newest give way.
  for (const auto& r : std::vector<std::shared_ptr<Request>>(running_)) {
    if (!Grows(*r) || !r->prefill_done() || r->done()) continue;
    auto it = reserved_.find(r->seq_id());
    if (it == reserved_.end()) continue;
    // This step writes next_position.
    const uint64_t need = Bytes(r->next_position() + 1);
    if (need <= it->second) continue;
    bool preempted_self = false;
    FitPrefixMemory(need - it->second);
    while (reserved_bytes_ + (need - reserved_[r->seq_id()]) + PrefixBytes() >
           capacity_.total_bytes) {
      std::shared_ptr<Request> victim;
      for (auto v = running_.rbegin(); v != running_.rend(); ++v) {
        if (Grows(**v) && !(*v)->done() && reserved_.count((*v)->seq_id())) {
          victim = *v;
          break;
        }
      }
      if (victim == nullptr) break;  // cannot happen: r itself qualifies
      preempted_self = victim == r;
      Preempt(victim);
      if (preempted_self) break;
    }
    if (preempted_self) continue;
    uint64_t& have = reserved_[r->seq_id()];
    reserved_bytes_ += need - have;
    have = need;
  }
}

void Scheduler::Preempt(const std::shared_ptr<Request>& r, bool force_release) {
  auto res = reserved_.find(r->seq_id());
  if (res != reserved_.end()) {
    reserved_bytes_ -= res->second;
    reserved_.erase(res);
  }
  if (force_release || r->on_workers()) pending_release_.push_back(r->seq_id());
  ReleasePrefix(*r);
  const uint64_t old_id = r->seq_id();
  r->Preempt(options_.next_seq_id ? options_.next_seq_id() : own_seq_ids_++);
  ++preemptions_;
  VLOG(1) << "request " << r->id() << ": seq " << old_id << " preempted (KV memory full), "
          << "continues as seq " << r->seq_id() << " after recomputing " << r->prefill_tokens()
          << " tokens";
  running_.erase(std::find(running_.begin(), running_.end(), r));
  waiting_.push_front(r);
}

void Scheduler::Complete(const StepPlan& plan, const std::vector<v1::StepResponse>& responses,
                         Clock::time_point now) {
  static const v1::StepResponse kNone;
  const v1::StepResponse& rank0 = responses.empty() ? kNone : responses.front();
  ApplyPrefixFailures(responses);
  // Sequences a rank refused, with the first refusal's status.
  std::unordered_map<uint64_t, Status> refused;
  for (const v1::StepResponse& response : responses) {
    for (const v1::SequenceResult& result : response.results()) {
      if (result.error_code() == 0 || refused.count(result.seq_id())) continue;
      refused.emplace(result.seq_id(),
                      Status(static_cast<StatusCode>(result.error_code()),
                             "worker rank " + std::to_string(response.rank()) +
                                 " refused the request: " + result.error_message()));
    }
  }
  for (size_t i = 0; i < plan.work.size(); ++i) {
    const PlannedWork& work = plan.work[i];
    const std::shared_ptr<Request>& r = work.request;
    if (r->done()) continue;
    if (auto it = refused.find(r->seq_id()); it != refused.end()) {
      r->Fail(it->second, now);
      Remove(r, /*force_release=*/true);
      continue;
    }
    if (prefix_restart_.erase(r->seq_id()) > 0) {
      ++prefix_stats_.important_restarts;
      LOG(WARNING) << "request " << r->id() << ": a cached prefix block could not be read; "
                   << "recomputing its prompt";
      // Its first step created the sequence on the workers: released with the preemption.
      Preempt(r, /*force_release=*/true);
      continue;
    }
    if (work.prompt_tokens > 0) {
      r->OnPrefillChunk(work.prompt_tokens, plan.start);
      if (r->prefill_done()) {
        ShrinkReservation(*r);
        CachePrompt(*r);
      }
    }
    if (work.sample) {
      // Results come in request order; search only if a rank reordered them.
      const v1::SequenceResult* result = nullptr;
      if (i < static_cast<size_t>(rank0.results_size()) &&
          rank0.results(static_cast<int>(i)).seq_id() == r->seq_id()) {
        result = &rank0.results(static_cast<int>(i));
      } else {
        for (const v1::SequenceResult& candidate : rank0.results()) {
          if (candidate.seq_id() == r->seq_id()) result = &candidate;
        }
      }
      if (result == nullptr || result->token_id() < 0) {
        r->Fail(Internal("rank 0 returned no token for request " + r->id()), now);
      } else {
        r->OnToken(*result, now);
      }
    }
    if (r->done()) Remove(r, false);
  }
}

void Scheduler::ShrinkReservation(const Request& r) {
  auto it = reserved_.find(r.seq_id());
  if (it == reserved_.end()) return;
  const uint64_t after =
      Grows(r) ? Bytes(r.prefill_tokens()) : Bytes(r.params().PositionsAfterPrefill());
  if (after >= it->second) return;
  reserved_bytes_ -= it->second - after;
  it->second = after;
}

void Scheduler::FailStep(const StepPlan& plan, const Status& status, Clock::time_point now) {
  for (const PlannedWork& work : plan.work) {
    work.request->Fail(status, now);
    Remove(work.request, /*force_release=*/true);
  }
  for (uint64_t id : plan.step.release_seq_ids()) pending_release_.push_back(id);
}

void Scheduler::FailAll(const Status& status, Clock::time_point now) {
  for (const auto& r : running_) r->Fail(status, now);
  for (const auto& r : waiting_) r->Fail(status, now);
  running_.clear();
  waiting_.clear();
  by_id_.clear();
  reserved_.clear();
  reserved_bytes_ = 0;
  pending_release_.clear();
  // The group's blocks went with it.
  if (prefix_ != nullptr) prefix_ = std::make_unique<PrefixIndex>(prefix_->options());
  pending_prefix_ops_.clear();
  prefix_restart_.clear();
  UpdatePrefixBlocks();
}

void Scheduler::Remove(const std::shared_ptr<Request>& r, bool force_release) {
  auto it = std::find(running_.begin(), running_.end(), r);
  if (it != running_.end()) {
    running_.erase(it);
  } else {
    auto wit = std::find(waiting_.begin(), waiting_.end(), r);
    if (wit != waiting_.end()) waiting_.erase(wit);
  }
  auto id_it = by_id_.find(r->id());
  if (id_it != by_id_.end() && id_it->second == r) by_id_.erase(id_it);
  auto res = reserved_.find(r->seq_id());
  if (res != reserved_.end()) {
    reserved_bytes_ -= res->second;
    reserved_.erase(res);
  }
  if (r->on_workers() || force_release) pending_release_.push_back(r->seq_id());
  ReleasePrefix(*r);
}

}  // namespace deja::coordinator
