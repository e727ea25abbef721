#include "coordinator/kserve_service.h"

#include <glog/logging.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "coordinator/kserve_api.h"
#include "proto/grpc_status.h"

namespace deja::coordinator {
namespace {

using StreamReactor =
    grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>;

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const Status& s) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(proto::ToGrpc(s));
  return reactor;
}

// The text of a whole response: the prompt first unless exclude_input_in_output.
std::string WholeText(const kserve::Infer& infer, const std::string& generated) {
  return infer.exclude_input ? generated : infer.prompt + generated;
}

// ModelInfer: one request, its output gathered into one response.
class InferCall final : public grpc::ServerUnaryReactor {
 public:
  InferCall(Engine* engine, const inference::ModelInferRequest& request, kserve::Infer infer,
            inference::ModelInferResponse* out)
      : engine_(engine), request_(request), infer_(std::move(infer)), out_(out),
        sink_(std::make_shared<Sink>(this)) {
    StatusOr<std::shared_ptr<Request>> r =
        engine->Submit(infer_.request, std::nullopt, sink_, Protocol::kKServe);
    std::lock_guard<std::mutex> lock(mu_);
    if (!r.ok()) {
      finished_ = true;
      Finish(proto::ToGrpc(r.status()));
      return;
    }
    admitted_ = std::move(*r);
  }

  void Deliver(const v1::GenerateStreamResponse& m) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    text_ += m.text_delta();
    if (!m.finished()) return;
    finished_ = true;
    if (m.finish_reason() == v1::FINISH_REASON_CANCELLED) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the request was cancelled"));
      return;
    }
    *out_ = kserve::MakeResponse(request_, infer_, WholeText(infer_, text_), m.prompt_tokens(),
                                 m.generated_tokens(), /*final=*/true);
    Finish(grpc::Status::OK);
  }
  void Fail(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    Finish(proto::ToGrpc(s));
  }
  void OnCancel() override {
    std::shared_ptr<Request> r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      r = admitted_;
    }
    if (r) engine_->ClientGone(r);
  }
  void OnDone() override {
    sink_->Detach();
    delete this;
  }

 private:
  class Sink final : public RequestSink {
   public:
    explicit Sink(InferCall* call) : call_(call) {}
    void OnMessage(v1::GenerateStreamResponse m) override {
      std::lock_guard<std::mutex> lock(mu_);
      if (call_ != nullptr) call_->Deliver(m);
    }
    void OnError(const Status& s) override {
      std::lock_guard<std::mutex> lock(mu_);
      if (call_ != nullptr) call_->Fail(s);
    }
    void Detach() {
      std::lock_guard<std::mutex> lock(mu_);
      call_ = nullptr;
    }

   private:
    std::mutex mu_;
    InferCall* call_;
  };

  Engine* engine_;
  const inference::ModelInferRequest request_;
  const kserve::Infer infer_;
  inference::ModelInferResponse* out_;
  std::shared_ptr<Sink> sink_;
  std::mutex mu_;
  std::shared_ptr<Request> admitted_;
  std::string text_;
  bool finished_ = false;
};

// ModelStreamInfer: requests read one after another, each generating on its own; their
// responses are written in the order they come, one write in flight. The call ends once the
// client has sent its last request and every request has answered.
class StreamInferCall final : public StreamReactor {
 public:
  StreamInferCall(Engine* engine, std::string model) : engine_(engine), model_(std::move(model)),
        link_(std::make_shared<Link>()) {
    link_->call = this;
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> lock(link_->mu);
    if (!ok) {
      reads_done_ = true;
      MaybeFinish();
      return;
    }
    const inference::ModelInferRequest request = std::move(incoming_);
    incoming_.Clear();
    StatusOr<kserve::Infer> infer = kserve::ParseInfer(request, model_);
    if (!infer.ok()) {
      engine_->RejectInvalid(infer.status(), Protocol::kKServe);
      QueueError(request.id(), infer.status());
    } else {
      const int slot = next_slot_++;
      Slot& s = slots_[slot];
      s.request = request;
      s.infer = std::move(*infer);
      const v1::GenerateRequest generate = s.infer.request;
      auto sink = std::make_shared<Sink>(link_, slot);
      // Submit without the lock: its refusals come back here, its output through the sink.
      lock.unlock();
      StatusOr<std::shared_ptr<Request>> r =
          engine_->Submit(generate, std::nullopt, sink, Protocol::kKServe);
      lock.lock();
      if (!r.ok()) {
        QueueError(request.id(), r.status());
        slots_.erase(slot);
      } else if (auto it = slots_.find(slot); it != slots_.end()) {
        it->second.admitted = std::move(*r);
      }
    }
    StartRead(&incoming_);
  }

  // Under link_->mu.
  void Deliver(int slot, const v1::GenerateStreamResponse& m) {
    auto it = slots_.find(slot);
    if (it == slots_.end()) return;
    Slot& s = it->second;
    s.text += m.text_delta();
    if (s.infer.stream && (m.finished() || !m.text_delta().empty())) {
      // The last response always goes out (it carries triton_final_response).
      inference::ModelStreamInferResponse out;
      *out.mutable_infer_response() =
          kserve::MakeResponse(s.request, s.infer, m.text_delta(), m.prompt_tokens(),
                               m.generated_tokens(), m.finished());
      Queue(std::move(out));
    }
    if (!m.finished()) return;
    if (!s.infer.stream) {
      inference::ModelStreamInferResponse out;
      *out.mutable_infer_response() =
          kserve::MakeResponse(s.request, s.infer, WholeText(s.infer, s.text), m.prompt_tokens(),
                               m.generated_tokens(), /*final=*/true);
      Queue(std::move(out));
    }
    slots_.erase(it);
    MaybeFinish();
  }
  void Fail(int slot, const Status& status) {
    auto it = slots_.find(slot);
    if (it == slots_.end()) return;
    QueueError(it->second.request.id(), status);
    slots_.erase(it);
    MaybeFinish();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(link_->mu);
    writing_ = false;
    out_.pop_front();
    if (!ok) {
      broken_ = true;  // the client is gone; OnCancel follows
      return;
    }
    WriteNext();
  }

  void OnCancel() override {
    std::vector<std::shared_ptr<Request>> all;
    {
      std::lock_guard<std::mutex> lock(link_->mu);
      for (auto& [slot, s] : slots_) {
        if (s.admitted) all.push_back(s.admitted);
      }
      slots_.clear();
      broken_ = true;
    }
    for (const auto& r : all) engine_->ClientGone(r);
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(link_->mu);
      link_->call = nullptr;
    }
    delete this;
  }

 private:
  // What the sinks reach the call through; the call leaves it at OnDone.
  struct Link {
    std::mutex mu;
    StreamInferCall* call = nullptr;
  };
  class Sink final : public RequestSink {
   public:
    Sink(std::shared_ptr<Link> link, int slot) : link_(std::move(link)), slot_(slot) {}
    void OnMessage(v1::GenerateStreamResponse m) override {
      std::lock_guard<std::mutex> lock(link_->mu);
      if (link_->call != nullptr) link_->call->Deliver(slot_, m);
    }
    void OnError(const Status& s) override {
      std::lock_guard<std::mutex> lock(link_->mu);
      if (link_->call != nullptr) link_->call->Fail(slot_, s);
    }

   private:
    std::shared_ptr<Link> link_;
    int slot_;
  };
  struct Slot {
    inference::ModelInferRequest request;
    kserve::Infer infer;
    std::shared_ptr<Request> admitted;
    std::string text;
  };

  // Under link_->mu.
  void QueueError(const std::string& id, const Status& status) {
    inference::ModelStreamInferResponse out;
    out.set_error_message(std::string(StatusCodeName(status.code())) + ": " + status.message());
    out.mutable_infer_response()->set_id(id);
    out.mutable_infer_response()->set_model_name(model_);
    Queue(std::move(out));
  }
  void Queue(inference::ModelStreamInferResponse r) {
    if (broken_ || finished_) return;
    out_.push_back(std::move(r));
    if (!writing_) WriteNext();
  }
  void WriteNext() {
    if (!writing_ && !out_.empty() && !broken_) {
      writing_ = true;
      StartWrite(&out_.front());
      return;
    }
    MaybeFinish();
  }
  void MaybeFinish() {
    if (finished_ || !reads_done_ || !slots_.empty() || writing_ || !out_.empty()) return;
    finished_ = true;
    Finish(grpc::Status::OK);
  }

  Engine* engine_;
  const std::string model_;
  std::shared_ptr<Link> link_;
  inference::ModelInferRequest incoming_;
  std::map<int, Slot> slots_;
  int next_slot_ = 0;
  std::deque<inference::ModelStreamInferResponse> out_;  // front: being written
  bool writing_ = false;
  bool reads_done_ = false;
  bool broken_ = false;
  bool finished_ = false;
};

// A stream refused before it started.
class RefusedStream final : public StreamReactor {
 public:
  explicit RefusedStream(const Status& s) { Finish(proto::ToGrpc(s)); }
  void OnDone() override { delete this; }
};

}  // namespace

Status KServeService::Authenticate(const grpc::CallbackServerContext* context) {
  if (auth_ == nullptr) return Status::Ok();
  Status s = auth_->Check(context->client_metadata());
  if (!s.ok()) engine_->RejectInvalid(s, Protocol::kKServe);
  return s;
}

Status KServeService::CheckModel(const std::string& name, const std::string& version) const {
  if (name != model_) {
    return NotFound("model '" + name + "' is not served here; this server serves '" + model_ +
                    "'");
  }
  if (!version.empty() && version != "1") {
    return NotFound("model '" + name + "' has version 1 only, not '" + version + "'");
  }
  return Status::Ok();
}

grpc::ServerUnaryReactor* KServeService::ServerLive(grpc::CallbackServerContext* context,
                                                    const inference::ServerLiveRequest*,
                                                    inference::ServerLiveResponse* response) {
  if (Status s = Authenticate(context); !s.ok()) return Done(context, s);
  response->set_live(true);
  return Done(context, Status::Ok());
}

grpc::ServerUnaryReactor* KServeService::ServerReady(grpc::CallbackServerContext* context,
                                                     const inference::ServerReadyRequest*,
                                                     inference::ServerReadyResponse* response) {
  if (Status s = Authenticate(context); !s.ok()) return Done(context, s);
  response->set_ready(engine_->Ready());
  return Done(context, Status::Ok());
}

grpc::ServerUnaryReactor* KServeService::ModelReady(grpc::CallbackServerContext* context,
                                                    const inference::ModelReadyRequest* request,
                                                    inference::ModelReadyResponse* response) {
  if (Status s = Authenticate(context); !s.ok()) return Done(context, s);
  if (Status s = CheckModel(request->name(), request->version()); !s.ok()) {
    return Done(context, s);
  }
  response->set_ready(engine_->Ready());
  return Done(context, Status::Ok());
}

grpc::ServerUnaryReactor* KServeService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  if (Status s = Authenticate(context); !s.ok()) return Done(context, s);
  response->set_name("deja");
  response->set_version(DEJA_VERSION);
  return Done(context, Status::Ok());
}

grpc::ServerUnaryReactor* KServeService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  if (Status s = Authenticate(context); !s.ok()) return Done(context, s);
  if (Status s = CheckModel(request->name(), request->version()); !s.ok()) {
    return Done(context, s);
  }
  *response = kserve::Metadata(model_);
  return Done(context, Status::Ok());
}

grpc::ServerUnaryReactor* KServeService::ModelInfer(grpc::CallbackServerContext* context,
                                                    const inference::ModelInferRequest* request,
                                                    inference::ModelInferResponse* response) {
  if (Status s = Authenticate(context); !s.ok()) return Done(context, s);
  StatusOr<kserve::Infer> infer = kserve::ParseInfer(*request, model_);
  if (infer.ok() && infer->stream) {
    infer = InvalidArgument("stream true needs ModelStreamInfer");
  }
  if (!infer.ok()) {
    engine_->RejectInvalid(infer.status(), Protocol::kKServe);
    return Done(context, infer.status());
  }
  return new InferCall(engine_, *request, std::move(*infer), response);
}

StreamReactor* KServeService::ModelStreamInfer(grpc::CallbackServerContext* context) {
  if (Status s = Authenticate(context); !s.ok()) return new RefusedStream(s);
  return new StreamInferCall(engine_, model_);
}

}  // namespace deja::coordinator
