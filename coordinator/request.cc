#include "coordinator/request.h"

#include <glog/logging.h>

#include <algorithm>
#include <iomanip>

#include "common/utf8.h"

namespace deja::coordinator {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

Request::Request(std::string id, uint64_t seq_id, ResolvedRequest params,
                 const Tokenizer* tokenizer, CoordinatorMetrics* metrics, Clock::time_point arrival,
                 std::optional<Clock::time_point> deadline, std::shared_ptr<RequestSink> sink)
    : id_(std::move(id)),
      seq_id_(seq_id),
      params_(std::move(params)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      arrival_(arrival),
      deadline_(deadline),
      sink_(std::move(sink)),
      text_(*tokenizer, params_.stop_sequences),
      last_token_time_(arrival) {}

void Request::RequestCancel(CancelKind kind) {
  int expected = static_cast<int>(CancelKind::kNone);
  cancel_.compare_exchange_strong(expected, static_cast<int>(kind));
}

void Request::OnPrefillChunk(int32_t tokens, Clock::time_point step_start) {
  if (!first_step_) {
    first_step_ = step_start;
    metrics_->queue_seconds.Observe(Seconds(step_start - arrival_));
  }
  prefilled_ = std::min(prefilled_ + tokens, prefill_tokens());
  on_workers_ = true;
}

void Request::StartAfterPrefix(int32_t tokens) {
  prefilled_ = started_at_ = std::min(tokens, prefill_tokens());
  if (preemptions_ == 0) cached_prompt_tokens_ = std::min(prefilled_, prompt_tokens());
}

void Request::Preempt(uint64_t new_seq_id) {
  seq_id_ = new_seq_id;
  prefilled_ = started_at_ = 0;
  on_workers_ = false;
  prefix_ = PrefixState();
  recompute_ = std::max(0, generated() - 1);
  ++preemptions_;
  metrics_->preemptions.Increment();
}

void Request::OnToken(const v1::SequenceResult& result, Clock::time_point now) {
  if (done_) return;
  const int32_t id = result.token_id();
  generated_.push_back(id);
  metrics_->generated_tokens.Increment();
  if (!first_token_) {
    first_token_ = now;
    metrics_->time_to_first_token_seconds.Observe(Seconds(now - arrival_));
  } else {
    metrics_->inter_token_seconds.Observe(Seconds(now - last_token_time_));
  }
  last_token_time_ = now;

  v1::GenerateStreamResponse message;
  message.set_request_id(id_);
  AddToken(result, &message);
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  bool text_stopped = false;
  const auto& stops = params_.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
    reason = v1::FINISH_REASON_STOP_SEQUENCE;  // counted, its text not returned
  } else if (!params_.ignore_eos && id == tokenizer_->eos_id()) {
    reason = v1::FINISH_REASON_EOS;
  } else {
    TextStream::Piece piece = text_.Add(id);
    message.set_text_delta(std::move(piece.text));
    if (piece.stopped) {
      reason = v1::FINISH_REASON_STOP_SEQUENCE;
      text_stopped = true;
    }
  }
  if (reason == v1::FINISH_REASON_UNSPECIFIED && generated() >= params_.max_new_tokens) {
    reason = v1::FINISH_REASON_LENGTH;
  }
  if (reason == v1::FINISH_REASON_UNSPECIFIED) {
    if (!message.text_delta().empty() || message.tokens_size() > 0) {
      sink_->OnMessage(std::move(message));
    }
    return;
  }
  if (!text_stopped) {
    TextStream::Piece tail = text_.Finish();
    message.mutable_text_delta()->append(tail.text);
    if (tail.stopped) reason = v1::FINISH_REASON_STOP_SEQUENCE;
  }
  FillFinal(reason, now, &message);
  done_ = true;
  sink_->OnMessage(std::move(message));
  Record("OK", reason, now);
}

bool Request::CheckExpiry(Clock::time_point now) {
  if (done_) return true;
  // A passed deadline first: gRPC cancels the call when it passes, which also looks like the
  // client going away.
  if (deadline_ && now >= *deadline_) {
    Fail(Status(StatusCode::kDeadlineExceeded, "request " + id_ + ": the gRPC deadline passed"),
         now);
    return true;
  }
  switch (cancel_kind()) {
    case CancelKind::kByRequest:
      Finish(v1::FINISH_REASON_CANCELLED, now);
      return true;
    case CancelKind::kClientGone:
      Fail(Status(StatusCode::kCancelled, "request " + id_ + ": the client went away"), now);
      return true;
    case CancelKind::kNone:
      break;
  }
  if (params_.time_limit_ms > 0 &&
      now - arrival_ >= std::chrono::milliseconds(params_.time_limit_ms)) {
    Finish(v1::FINISH_REASON_TIME_LIMIT, now);
    return true;
  }
  return false;
}

void Request::Finish(v1::FinishReason reason, Clock::time_point now) {
  if (done_) return;
  v1::GenerateStreamResponse message;
  message.set_request_id(id_);
  // Held-back text that no stop sequence completed belongs to the output.
  message.set_text_delta(text_.Finish().text);
  FillFinal(reason, now, &message);
  done_ = true;
  sink_->OnMessage(std::move(message));
  Record("OK", reason, now);
}

void Request::Fail(const Status& status, Clock::time_point now) {
  if (done_) return;
  done_ = true;
  sink_->OnError(status);
  Record(StatusCodeName(status.code()), v1::FINISH_REASON_UNSPECIFIED, now);
}

void Request::AddToken(const v1::SequenceResult& result, v1::GenerateStreamResponse* message) {
  if (!params_.return_tokens) return;
  v1::Token* token = message->add_tokens();
  token->set_id(result.token_id());
  token->set_text(Utf8Lossy(tokenizer_->TokenBytes(result.token_id())));
  if (params_.logprobs) token->set_logprob(result.logprob());
  const int n = std::min<int>(result.top_size(), static_cast<int>(params_.top_n));
  for (int i = 0; i < n; ++i) {
    v1::TopToken* top = token->add_top();
    top->set_id(result.top(i).id());
    top->set_text(Utf8Lossy(tokenizer_->TokenBytes(result.top(i).id())));
    top->set_logprob(result.top(i).logprob());
  }
}

void Request::FillFinal(v1::FinishReason reason, Clock::time_point now,
                        v1::GenerateStreamResponse* message) {
  message->set_finished(true);
  message->set_finish_reason(reason);
  message->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens()));
  message->set_cached_prompt_tokens(static_cast<uint32_t>(cached_prompt_tokens_));
  message->set_generated_tokens(static_cast<uint32_t>(generated()));
  v1::Timings* t = message->mutable_timings();
  t->set_queue_ms(Ms(first_step_.value_or(now)));
  t->set_time_to_first_token_ms(first_token_ ? Ms(*first_token_) : 0.0);
  t->set_total_ms(Ms(now));
}

void Request::Record(const std::string& code, v1::FinishReason reason, Clock::time_point now) {
  metrics_->RequestFinished(code, reason, ProtocolLabel(params_.protocol));
  metrics_->request_seconds.Observe(Seconds(now - arrival_));
  // The access log: one line per finished request, key=value fields.
  LOG(INFO) << "request " << id_ << ": finished code=" << code
            << " finish_reason=" << FinishReasonLabel(reason)
            << " prompt_tokens=" << prompt_tokens() << " generated_tokens=" << generated()
            << std::fixed << std::setprecision(1)
            << " ttft_ms=" << (first_token_ ? Ms(*first_token_) : -1.0) << " total_ms=" << Ms(now);
}

double Request::Ms(Clock::time_point t) const {
  return std::chrono::duration<double, std::milli>(t - arrival_).count();
}

}  // namespace deja::coordinator
