// Request: one generation request from admission to its last message. Owns what the client
// will see (text deltas through TextStream, tokens with log-probabilities, finish reason,
// counts, timings) and decides when generation ends (stop token ids, EOS, stop sequences,
// max_new_tokens, time limit, gRPC deadline, cancellation). The scheduler drives it on the
// engine thread; only RequestCancel() may be called from other threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer.h"
#include "coordinator/metrics.h"
#include "coordinator/text_stream.h"
#include "coordinator/validation.h"
#include "deja/v1/text_generation.pb.h"
#include "deja/v1/worker.pb.h"

namespace deja::coordinator {

using Clock = std::chrono::steady_clock;

// Where a request's output goes (the gRPC handlers). Calls come from the engine thread, in
// order, and must not block. After a message with finished = true, or OnError, none follow.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void OnMessage(v1::GenerateStreamResponse message) = 0;
  virtual void OnError(const Status& status) = 0;
};

enum class CancelKind : int {
  kNone = 0,
  // Cancel RPC: ends normally with FINISH_REASON_CANCELLED.
  kByRequest = 1,
  // The client went away: ends with status CANCELLED.
  kClientGone = 2,
};

class Request {
 public:
  Request(std::string id, uint64_t seq_id, ResolvedRequest params, const Tokenizer* tokenizer,
          CoordinatorMetrics* metrics, Clock::time_point arrival,
          std::optional<Clock::time_point> deadline, std::shared_ptr<RequestSink> sink);

  const std::string& id() const { return id_; }
  uint64_t seq_id() const { return seq_id_; }
  const ResolvedRequest& params() const { return params_; }
  int32_t prompt_tokens() const { return static_cast<int32_t>(params_.prompt.size()); }

  // Any thread. The first kind asked for wins.
  void RequestCancel(CancelKind kind);
  CancelKind cancel_kind() const { return static_cast<CancelKind>(cancel_.load()); }

  // --- Engine thread only. ---
  // Tokens the workers must hold before the next decode token: the prompt, and after a
  // preemption also the tokens generated before it but the last (which the next decode feeds).
  int32_t prefill_tokens() const { return prompt_tokens() + recompute_; }
  // Token i of that stream.
  int32_t prefill_token(int32_t i) const {
    return i < prompt_tokens() ? params_.prompt[i] : generated_[i - prompt_tokens()];
  }
  // Prefill progress: tokens of prefill_tokens() the workers hold.
  int32_t prefilled() const { return prefilled_; }
  bool prefill_done() const { return prefilled_ == prefill_tokens(); }
  // The prefill's last chunk samples the first new token (false when a preempted sequence
  // recomputes: its next token is already known).
  bool prefill_samples() const { return generated_.empty(); }
  // The workers dropped this sequence's KV (KV memory ran out): it continues as `new_seq_id`,
  // recomputing prefill_tokens() before it decodes again. The client sees no difference.
  void Preempt(uint64_t new_seq_id);
  int32_t preemptions() const { return preemptions_; }
  // The workers hold KV state for this sequence (a step with it completed).
  bool on_workers() const { return on_workers_; }
  int32_t generated() const { return static_cast<int32_t>(generated_.size()); }
  // Prefix cache (engine thread): the cached blocks this sequence starts from (pinned in the
  // scheduler's index while it holds them), whether it looked them up already, and whether their
  // loads into the workers' memory are still in flight (it starts the step after they land).
  struct PrefixState {
    bool looked_up = false;
    bool loading = false;
    // The blocks are read where they are, important tokens only (SchedulerOptions::
    // prefix_important).
    bool important = false;
    std::vector<uint64_t> blocks;
  };
  PrefixState& prefix() { return prefix_; }
  const PrefixState& prefix() const { return prefix_; }
  // The workers start the sequence from a cached prefix of `tokens` prompt tokens.
  void StartAfterPrefix(int32_t tokens);
  int32_t cached_prompt_tokens() const { return cached_prompt_tokens_; }
  // The first chunk carries the sequence's config (nothing of it reached the workers yet).
  bool starts() const { return !on_workers_ && prefilled_ == started_at_; }
  // The token to feed in the next decode step and its position.
  int32_t last_token() const { return generated_.back(); }
  int32_t next_position() const { return prompt_tokens() + generated() - 1; }
  bool done() const { return done_; }

  // A step that carried `tokens` prompt tokens of this request completed.
  void OnPrefillChunk(int32_t tokens, Clock::time_point step_start);
  // The step that carried this request's work sampled `result`. May end the request.
  void OnToken(const v1::SequenceResult& result, Clock::time_point now);
  // Ends the request if it was cancelled, its gRPC deadline passed or its time limit did.
  // Returns true when it ended (now or before).
  bool CheckExpiry(Clock::time_point now);
  // Normal end: the final message with the finish reason, counts and timings.
  void Finish(v1::FinishReason reason, Clock::time_point now);
  // Ends with an error status (nothing more is sent).
  void Fail(const Status& status, Clock::time_point now);

 private:
  void AddToken(const v1::SequenceResult& result, v1::GenerateStreamResponse* message);
  void FillFinal(v1::FinishReason reason, Clock::time_point now,
                 v1::GenerateStreamResponse* message);
  void Record(const std::string& code, v1::FinishReason reason, Clock::time_point now);
  double Ms(Clock::time_point t) const;

  const std::string id_;
  uint64_t seq_id_;
  const ResolvedRequest params_;
  const Tokenizer* tokenizer_;
  CoordinatorMetrics* metrics_;
  const Clock::time_point arrival_;
  const std::optional<Clock::time_point> deadline_;
  std::shared_ptr<RequestSink> sink_;
  std::atomic<int> cancel_{0};

  TextStream text_;
  int32_t prefilled_ = 0;
  int32_t recompute_ = 0;  // generated tokens re-prefilled after a preemption
  int32_t started_at_ = 0;  // prefill position of the first chunk: after the cached prefix
  int32_t cached_prompt_tokens_ = 0;
  PrefixState prefix_;
  int32_t preemptions_ = 0;
  bool on_workers_ = false;
  bool done_ = false;
  std::vector<int32_t> generated_;
  std::optional<Clock::time_point> first_step_;
  std::optional<Clock::time_point> first_token_;
  Clock::time_point last_token_time_;
};

}  // namespace deja::coordinator
