#include "coordinator/grpc_service.h"

#include <glog/logging.h>

#include <deque>
#include <mutex>

#include "common/utf8.h"
#include "coordinator/wire_check.h"
#include "proto/grpc_status.h"

namespace deja::coordinator {
namespace {

// The gRPC deadline on the steady clock; none when the client set none.
std::optional<Clock::time_point> SteadyDeadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  const auto now = std::chrono::system_clock::now();
  if (deadline > now + std::chrono::hours(24 * 365)) return std::nullopt;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(deadline - now);
}

// Receives a request's output for a call object that may go away first (OnDone): the call
// detaches, and output arriving later is dropped.
template <typename Call>
class CallSink final : public RequestSink {
 public:
  explicit CallSink(Call* call) : call_(call) {}
  void OnMessage(v1::GenerateStreamResponse message) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (call_ != nullptr) call_->Deliver(std::move(message));
  }
  void OnError(const Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (call_ != nullptr) call_->Abort(proto::ToGrpc(status));
  }
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    call_ = nullptr;
  }

 private:
  std::mutex mu_;
  Call* call_;
};

// Generate: collects the stream's messages into one response.
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(Engine* engine, grpc::CallbackServerContext* context,
            const v1::GenerateRequest& request, grpc::ByteBuffer* response)
      : engine_(engine), out_(response), sink_(std::make_shared<CallSink<UnaryCall>>(this)) {
    StatusOr<std::shared_ptr<Request>> r = engine->Submit(request, SteadyDeadline(context), sink_);
    std::lock_guard<std::mutex> lock(mu_);
    if (!r.ok()) {
      finished_ = true;
      Finish(proto::ToGrpc(r.status()));
      return;
    }
    request_ = std::move(*r);
  }

  void Deliver(v1::GenerateStreamResponse message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    response_.set_request_id(message.request_id());
    response_.mutable_text()->append(message.text_delta());
    for (v1::Token& token : *message.mutable_tokens()) *response_.add_tokens() = std::move(token);
    if (!message.finished()) return;
    finished_ = true;
    if (message.finish_reason() == v1::FINISH_REASON_CANCELLED) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "request " + message.request_id() + " was cancelled by a Cancel call"));
      return;
    }
    response_.set_prompt_tokens(message.prompt_tokens());
    response_.set_cached_prompt_tokens(message.cached_prompt_tokens());
    response_.set_generated_tokens(message.generated_tokens());
    response_.set_finish_reason(message.finish_reason());
    *response_.mutable_timings() = message.timings();
    SerializeTo(response_, out_);
    Finish(grpc::Status::OK);
  }

  void Abort(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  void OnCancel() override {
    std::shared_ptr<Request> r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      r = request_;
    }
    if (r) engine_->ClientGone(r);
  }

  void OnDone() override {
    sink_->Detach();
    delete this;
  }

 private:
  Engine* engine_;
  v1::GenerateResponse response_;
  grpc::ByteBuffer* out_;
  std::shared_ptr<CallSink<UnaryCall>> sink_;
  std::mutex mu_;
  std::shared_ptr<Request> request_;
  bool finished_ = false;
};

// GenerateStream: one write in flight at a time; later messages queue behind it.
class StreamCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  StreamCall(Engine* engine, grpc::CallbackServerContext* context,
             const v1::GenerateRequest& request)
      : engine_(engine), sink_(std::make_shared<CallSink<StreamCall>>(this)) {
    StatusOr<std::shared_ptr<Request>> r = engine->Submit(request, SteadyDeadline(context), sink_);
    std::lock_guard<std::mutex> lock(mu_);
    if (!r.ok()) {
      finished_ = true;
      Finish(proto::ToGrpc(r.status()));
      return;
    }
    request_ = std::move(*r);
  }

  void Deliver(v1::GenerateStreamResponse message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || error_) return;
    queue_.push_back(std::move(message));
    if (!writing_) WriteNext();
  }

  void Abort(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || error_) return;
    error_ = status;
    queue_.clear();
    if (!writing_) WriteNext();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      // The stream broke; the client is gone.
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      if (request_) engine_->ClientGone(request_);
      return;
    }
    WriteNext();
  }

  void OnCancel() override {
    std::shared_ptr<Request> r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      r = request_;
    }
    if (r) engine_->ClientGone(r);
  }

  void OnDone() override {
    sink_->Detach();
    delete this;
  }

 private:
  // Under mu_, with no write in flight.
  void WriteNext() {
    if (finished_) return;
    if (!queue_.empty()) {
      const bool last = queue_.front().finished();
      SerializeTo(queue_.front(), &current_);
      queue_.pop_front();
      if (last) {
        finished_ = true;
        StartWriteAndFinish(&current_, grpc::WriteOptions(), grpc::Status::OK);
      } else {
        writing_ = true;
        StartWrite(&current_);
      }
      return;
    }
    if (error_) {
      finished_ = true;
      Finish(*error_);
    }
  }

  Engine* engine_;
  std::shared_ptr<CallSink<StreamCall>> sink_;
  std::mutex mu_;
  std::shared_ptr<Request> request_;
  std::deque<v1::GenerateStreamResponse> queue_;
  grpc::ByteBuffer current_;  // the message being written
  std::optional<grpc::Status> error_;
  bool writing_ = false;
  bool finished_ = false;
};

// A stream refused before it started.
class FailedStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  void OnDone() override { delete this; }
};

// A generation call's request, parsed. A call the client cancelled, or whose deadline passed,
// before its message arrived has no message at all (not even an empty one): CANCELLED, and not
// counted as a rejection, since no input was refused. Bad bytes are INVALID_ARGUMENT, counted.
StatusOr<v1::GenerateRequest> ParseGenerate(const grpc::ByteBuffer& request, Engine* engine) {
  if (!request.Valid())
    return Status(StatusCode::kCancelled, "the call ended before its request arrived");
  StatusOr<v1::GenerateRequest> parsed = ParseGenerateRequest(request);
  if (!parsed.ok()) engine->RejectInvalid(parsed.status());
  return parsed;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* FailStream(const Status& status) {
  auto* reactor = new FailedStream();
  reactor->Finish(proto::ToGrpc(status));
  return reactor;
}

grpc::ServerUnaryReactor* FailUnary(grpc::CallbackServerContext* context, const Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(proto::ToGrpc(status));
  return reactor;
}

}  // namespace

Status TextGenerationService::Authenticate(const grpc::CallbackServerContext* context) {
  if (auth_ == nullptr) return Status::Ok();
  Status s = auth_->Check(context->client_metadata());
  if (!s.ok()) {
    engine_->RejectInvalid(s);
    VLOG(1) << "refused a call from " << context->peer() << ": " << s.message();
  }
  return s;
}

grpc::ServerUnaryReactor* TextGenerationService::Generate(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  if (Status s = Authenticate(context); !s.ok()) return FailUnary(context, s);
  StatusOr<v1::GenerateRequest> parsed = ParseGenerate(*request, engine_);
  if (!parsed.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(proto::ToGrpc(parsed.status()));
    return reactor;
  }
  return new UnaryCall(engine_, context, *parsed, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TextGenerationService::GenerateStream(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  if (Status s = Authenticate(context); !s.ok()) return FailStream(s);
  StatusOr<v1::GenerateRequest> parsed = ParseGenerate(*request, engine_);
  if (!parsed.ok()) {
    auto* reactor = new FailedStream();
    reactor->Finish(proto::ToGrpc(parsed.status()));
    return reactor;
  }
  return new StreamCall(engine_, context, *parsed);
}

grpc::ServerUnaryReactor* TextGenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  if (Status s = Authenticate(context); !s.ok()) return FailUnary(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  StatusOr<v1::TokenizeRequest> parsed = ParseTokenizeRequest(*request);
  if (!parsed.ok()) {
    reactor->Finish(proto::ToGrpc(parsed.status()));
    return reactor;
  }
  const Tokenizer& tokenizer = engine_->tokenizer();
  StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(parsed->text(), parsed->add_bos());
  if (!ids.ok()) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "text: " + ids.status().message()));
    return reactor;
  }
  v1::TokenizeResponse out;
  for (int32_t id : *ids) {
    out.add_ids(id);
    out.add_tokens(Utf8Lossy(tokenizer.TokenBytes(id)));
  }
  SerializeTo(out, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* TextGenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer* request,
                                                              grpc::ByteBuffer* response) {
  if (Status s = Authenticate(context); !s.ok()) return FailUnary(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (StatusOr<v1::GetModelInfoRequest> parsed = ParseGetModelInfoRequest(*request);
      !parsed.ok()) {
    reactor->Finish(proto::ToGrpc(parsed.status()));
    return reactor;
  }
  v1::ModelInfo out = info_;
  // Sparsity is what the (last) connected worker group reports.
  const GroupState group = engine_->group();
  const ModelLimits limits = engine_->LimitsFor(group);
  out.set_sparsity_available(limits.sparsity_available);
  out.set_locret_available(limits.locret_available);
  out.set_prefix_cache_available(limits.prefix_cache_available);
  out.set_prefix_cache_block_tokens(limits.prefix_cache_block_tokens);
  out.set_prefix_cache_default(limits.prefix_cache_default);
  out.set_prefix_cache_salt_required(limits.prefix_cache_salt_required);
  // The dtypes the (last) connected group reported: what --dtype/--kv-dtype resolved to.
  if (!group.weight_dtype.empty()) out.set_dtype(group.weight_dtype);
  if (!group.kv_dtype.empty()) out.set_kv_dtype(group.kv_dtype);
  for (const std::string& s : limits.sparsity_schedules) out.add_sparsity_schedules(s);
  SerializeTo(out, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* TextGenerationService::Cancel(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  if (Status s = Authenticate(context); !s.ok()) return FailUnary(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  StatusOr<v1::CancelRequest> parsed = ParseCancelRequest(*request);
  if (!parsed.ok()) {
    reactor->Finish(proto::ToGrpc(parsed.status()));
    return reactor;
  }
  v1::CancelResponse out;
  out.set_found(engine_->Cancel(parsed->request_id()));
  VLOG(1) << "Cancel " << parsed->request_id() << ": found " << out.found();
  SerializeTo(out, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace deja::coordinator
