#include "coordinator/scheduler.h"

#include <glog/logging.h>

#include <algorithm>
#include <unordered_map>

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
  const bool fits = capacity_.bytes_per_token == 0 ||
                    reserved_bytes_ + need + Headroom() <= capacity_.total_bytes;
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
    if (!reserved && capacity_.bytes_per_token > 0 &&
        reserved_bytes_ + need + Headroom() > capacity_.total_bytes) {
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
  return plan;
}

void Scheduler::AddPrefill(const std::shared_ptr<Request>& r, int32_t* budget, StepPlan* plan) {
  const int32_t start = r->prefilled();
  const int32_t total = r->prefill_tokens();
  int32_t chunk = std::min(total - start, *budget);
  // A locret sequence's cache holds its budget plus one chunk of chunk_tokens (the worker
  // reserved that much): its prompt goes in chunks no larger.
  const v1::WorkerCachePolicy& cache = r->params().config.cache();
  if (cache.kind() == v1::WorkerCachePolicy::KIND_LOCRET && cache.chunk_tokens() > 0) {
    chunk = std::min(chunk, static_cast<int32_t>(cache.chunk_tokens()));
  }
  if (chunk <= 0) return;
  *budget -= chunk;
  const bool sample = start + chunk == total && r->prefill_samples();
  v1::SequenceWork* w = plan->step.add_sequences();
  w->set_seq_id(r->seq_id());
  w->mutable_tokens()->Reserve(chunk);
  for (int32_t i = start; i < start + chunk; ++i) w->add_tokens(r->prefill_token(i));
  w->set_start_position(static_cast<uint32_t>(start));
  if (start == 0) {
    v1::SequenceConfig* c = w->mutable_config();
    *c = r->params().config;
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
    while (reserved_bytes_ + (need - reserved_[r->seq_id()]) > capacity_.total_bytes) {
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

void Scheduler::Preempt(const std::shared_ptr<Request>& r) {
  auto res = reserved_.find(r->seq_id());
  if (res != reserved_.end()) {
    reserved_bytes_ -= res->second;
    reserved_.erase(res);
  }
  if (r->on_workers()) pending_release_.push_back(r->seq_id());
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
    if (work.prompt_tokens > 0) {
      r->OnPrefillChunk(work.prompt_tokens, plan.start);
      if (r->prefill_done()) ShrinkReservation(*r);
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
}

}  // namespace deja::coordinator
