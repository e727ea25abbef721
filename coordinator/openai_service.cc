#include "coordinator/openai_service.h"

#include <glog/logging.h>

#include <chrono>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "common/utf8.h"
#include "coordinator/openai_api.h"

namespace deja::coordinator {
namespace {

using json = nlohmann::json;
using openai::Endpoint;

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A JSON reply: nlohmann::json, or ordered_json for a completion (its keys in insertion order).
template <typename J>
http::Response JsonReply(int status, const J& body) {
  http::Response r;
  r.status = status;
  r.content_type = "application/json";
  r.body = openai::Dump(body);
  return r;
}
http::Response Json(int status, const json& body) { return JsonReply(status, body); }

http::Response Error(const Status& status, Endpoint endpoint = Endpoint::kCompletions) {
  const openai::ApiError e = openai::ErrorFor(status, endpoint);
  http::Response r;
  r.status = e.http_status;
  r.content_type = "application/json";
  r.body = openai::ErrorBody(e);
  return r;
}

template <typename J>
std::string Event(const J& data) { return "data: " + openai::Dump(data) + "\n\n"; }

// One completions or chat call: its choices' requests in the engine, their output gathered into
// one response or streamed as chunks. Output that arrives before every choice was admitted waits
// (a later choice refused fails the call before anything was sent).
class HttpCall : public std::enable_shared_from_this<HttpCall> {
 public:
  HttpCall(Engine* engine, openai::Call call, openai::ResponseHead head,
           std::shared_ptr<http::Responder> reply)
      : engine_(engine),
        call_(std::move(call)),
        head_(std::move(head)),
        reply_(std::move(reply)),
        results_(call_.requests.size()),
        streamed_(call_.requests.size(), 0) {}

  void Start() {
    std::vector<std::shared_ptr<Request>> admitted;
    for (size_t i = 0; i < call_.requests.size(); ++i) {
      auto sink = std::make_shared<ChoiceSink>(shared_from_this(), static_cast<int>(i));
      StatusOr<std::shared_ptr<Request>> r =
          engine_->Submit(call_.requests[i], std::nullopt, sink, Protocol::kOpenAi);
      if (!r.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          done_ = true;
        }
        for (const auto& a : admitted) engine_->ClientGone(a);
        reply_->Send(Error(r.status(), call_.endpoint));
        return;
      }
      admitted.push_back(std::move(*r));
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (done_) {
      // An error arrived meanwhile (and was answered), or the client left; the others leave.
      lock.unlock();
      for (const auto& a : admitted) engine_->ClientGone(a);
      return;
    }
    requests_ = std::move(admitted);
    if (head_.id.empty()) head_.id = Prefix() + requests_.front()->id();
    started_ = true;
    if (call_.stream) reply_->StartStream(200, "text/event-stream");
    for (auto& [index, message] : early_) Process(index, std::move(message));
    early_.clear();
  }

  void OnMessage(int index, v1::GenerateStreamResponse message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    if (!started_) {
      early_.emplace_back(index, std::move(message));
      return;
    }
    Process(index, std::move(message));
  }

  void OnError(int index, const Status& status) {
    std::vector<std::shared_ptr<Request>> others;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      done_ = true;
      others.swap(requests_);
      if (started_ && call_.stream) {
        // The stream has begun (status 200): the error is its last event.
        reply_->Write(Event(json::parse(openai::ErrorBody(openai::ErrorFor(status,
                                                                          call_.endpoint)))));
        reply_->End();
      } else {
        reply_->Send(Error(status, call_.endpoint));
      }
    }
    LOG(INFO) << "openai call " << head_.id << ": choice " << index << " failed: "
              << status.ToString();
    for (const auto& r : others) engine_->ClientGone(r);
  }

  void ClientGone() {
    std::vector<std::shared_ptr<Request>> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      all.swap(requests_);
    }
    for (const auto& r : all) engine_->ClientGone(r);
  }

 private:
  class ChoiceSink final : public RequestSink {
   public:
    ChoiceSink(std::shared_ptr<HttpCall> call, int index) : call_(std::move(call)), index_(index) {}
    void OnMessage(v1::GenerateStreamResponse message) override {
      call_->OnMessage(index_, std::move(message));
    }
    void OnError(const Status& status) override { call_->OnError(index_, status); }

   private:
    std::shared_ptr<HttpCall> call_;
    int index_;
  };

  std::string Prefix() const { return call_.endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-"; }

  // Under mu_, after Start.
  void Process(int index, v1::GenerateStreamResponse m) {
    openai::ChoiceResult& c = results_[index];
    std::vector<v1::Token> tokens(m.tokens().begin(), m.tokens().end());
    if (m.finished()) {
      c.finished = true;
      c.finish = m.finish_reason();
      c.prompt_tokens = m.prompt_tokens();
      c.generated_tokens = m.generated_tokens();
      c.cached_prompt_tokens = m.cached_prompt_tokens();
      ++finished_;
    }
    if (call_.stream) {
      const bool first = !first_sent_.count(index);
      std::string text = m.text_delta();
      if (first) text = call_.echo[index] + text;
      if (first || !text.empty() || !tokens.empty() || m.finished()) {
        first_sent_.insert(index);
        // Log-probability offsets count the characters of the choice's tokens (the echo first).
        const size_t offset = openai::CodePoints(call_.echo[index]) + streamed_[index];
        reply_->Write(Event(openai::StreamChunk(call_, head_, index, text, tokens, first,
                                                m.finished() ? c.finish
                                                             : v1::FINISH_REASON_UNSPECIFIED,
                                                engine_->tokenizer(), offset)));
      }
      for (const v1::Token& t : tokens) streamed_[index] += openai::CodePoints(t.text());
    } else {
      if (c.text.empty() && !call_.echo[index].empty()) c.text = call_.echo[index];
      c.text += m.text_delta();
      for (v1::Token& t : tokens) c.tokens.push_back(std::move(t));
    }
    if (finished_ < static_cast<int>(results_.size())) return;
    done_ = true;
    requests_.clear();
    if (call_.stream) {
      if (call_.include_usage) reply_->Write(Event(openai::UsageChunk(call_, head_, results_)));
      reply_->Write("data: [DONE]\n\n");
      reply_->End();
    } else {
      reply_->Send(JsonReply(200, openai::CompletionResponse(call_, head_, results_,
                                                             engine_->tokenizer())));
    }
  }

  Engine* engine_;
  const openai::Call call_;
  openai::ResponseHead head_;
  std::shared_ptr<http::Responder> reply_;

  std::mutex mu_;
  bool started_ = false;
  bool done_ = false;
  std::vector<std::pair<int, v1::GenerateStreamResponse>> early_;
  // Until the call is done (then cleared: the requests hold the sinks that hold this call).
  std::vector<std::shared_ptr<Request>> requests_;
  std::vector<openai::ChoiceResult> results_;
  std::vector<size_t> streamed_;  // characters of each choice's tokens streamed so far
  std::set<int> first_sent_;
  int finished_ = 0;
};

StatusOr<json> JsonBody(const http::Request& request) {
  return openai::ParseJsonObject(request.body);
}

}  // namespace

http::Response OpenAiService::Refusal(int status, const std::string& message) {
  openai::ApiError e;
  e.http_status = status;
  e.message = message;
  e.type = "invalid_request_error";
  http::Response r;
  r.status = status;
  r.content_type = "application/json";
  r.body = openai::ErrorBody(e);
  return r;
}

OpenAiService::OpenAiService(Engine* engine, OpenAiOptions options)
    : engine_(engine), options_(std::move(options)), created_(UnixNow()) {}

void OpenAiService::Handle(const http::Request& request, std::shared_ptr<http::Responder> reply) {
  // A JSON type error the parsing missed must fail the request, never the server.
  try {
    Route(request, reply);
  } catch (const std::exception& e) {
    LOG(ERROR) << "openai: " << request.method << " " << request.path << ": " << e.what();
    reply->Send(Error(Internal(std::string("the request could not be handled: ") + e.what())));
  }
}

void OpenAiService::Route(const http::Request& request, std::shared_ptr<http::Responder> reply) {
  const std::string& path = request.path;
  if (path == "/health") {
    // Kubernetes probes: no token, 200 while ready for traffic.
    if (engine_->Ready()) {
      reply->Send(Json(200, json::object()));
    } else {
      reply->Send(Error(Unavailable(engine_->draining() ? "the server is draining"
                                                        : "no worker group is ready")));
    }
    return;
  }
  if (options_.auth != nullptr && !options_.auth->Allows(request.Header("authorization"))) {
    const Status s(StatusCode::kUnauthenticated,
                   "a valid bearer token is required (Authorization: Bearer <token>)");
    engine_->RejectInvalid(s, Protocol::kOpenAi);
    reply->Send(Error(s));
    return;
  }
  const bool post = request.method == "POST";
  const bool get = request.method == "GET" || request.method == "HEAD";
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!post) return reply->Send(Refusal(405, path + " takes POST, not " + request.method));
    return Generate(request, std::move(reply), path == "/v1/chat/completions");
  }
  if (path == "/tokenize" || path == "/detokenize") {
    if (!post) return reply->Send(Refusal(405, path + " takes POST, not " + request.method));
    return reply->Send(path == "/tokenize" ? Tokenize(request) : Detokenize(request));
  }
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    if (!get) return reply->Send(Refusal(405, path + " takes GET, not " + request.method));
    return reply->Send(Models(path));
  }
  reply->Send(Error(NotFound("no route for " + request.method + " " + path +
                             " (this server has /v1/completions, /v1/chat/completions, "
                             "/v1/models, /tokenize, /detokenize, /health)")));
}

void OpenAiService::Generate(const http::Request& request, std::shared_ptr<http::Responder> reply,
                             bool chat) {
  const Endpoint endpoint = chat ? Endpoint::kChat : Endpoint::kCompletions;
  StatusOr<openai::Call> call = openai::ParseCall(endpoint, request.body, options_.model,
                                                  options_.chat_template, engine_->tokenizer());
  if (!call.ok()) {
    engine_->RejectInvalid(call.status(), Protocol::kOpenAi);
    return reply->Send(Error(call.status(), endpoint));
  }
  openai::ResponseHead head;
  head.created = UnixNow();
  head.model = options_.model;
  auto c = std::make_shared<HttpCall>(engine_, std::move(*call), std::move(head), reply);
  reply->OnClientGone([weak = std::weak_ptr<HttpCall>(c)] {
    if (auto call = weak.lock()) call->ClientGone();
  });
  c->Start();
}

http::Response OpenAiService::Tokenize(const http::Request& request) const {
  StatusOr<json> body = JsonBody(request);
  if (!body.ok()) return Error(body.status());
  const Tokenizer& tokenizer = engine_->tokenizer();
  bool add_special = true;
  if (auto it = body->find("add_special_tokens"); it != body->end() && !it->is_null()) {
    if (!it->is_boolean()) return Error(InvalidArgument("add_special_tokens must be true or false"));
    add_special = it->get<bool>();
  }
  std::string text;
  if (auto it = body->find("messages"); it != body->end()) {
    StatusOr<std::string> rendered = options_.chat_template.Render(*it, true);
    if (!rendered.ok()) return Error(rendered.status(), Endpoint::kChat);
    text = *rendered;
  } else if (auto p = body->find("prompt"); p != body->end() && p->is_string()) {
    text = p->get<std::string>();
  } else {
    return Error(InvalidArgument("prompt must be a string (or give messages)"));
  }
  if (FindInvalidUtf8(text) != kUtf8Valid) return Error(InvalidArgument("prompt is not valid UTF-8"));
  StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, add_special);
  if (!ids.ok()) return Error(InvalidArgument("prompt: " + ids.status().message()));
  json tokens = json::array();
  for (int32_t id : *ids) tokens.push_back(id);
  return Json(200, {{"tokens", tokens},
                    {"count", ids->size()},
                    {"max_model_len", options_.max_model_len}});
}

http::Response OpenAiService::Detokenize(const http::Request& request) const {
  StatusOr<json> body = JsonBody(request);
  if (!body.ok()) return Error(body.status());
  auto it = body->find("tokens");
  if (it == body->end() || !it->is_array()) {
    return Error(InvalidArgument("tokens must be a list of token ids"));
  }
  const int32_t vocab = engine_->limits().vocab_size;
  std::vector<int32_t> ids;
  for (const json& x : *it) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab) {
      return Error(InvalidArgument("tokens must be token ids in [0, " + std::to_string(vocab) +
                                   ")"));
    }
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return Json(200, {{"prompt", Utf8Lossy(engine_->tokenizer().Decode(ids, false))}});
}

http::Response OpenAiService::Models(const std::string& path) const {
  const json model = {{"id", options_.model},
                      {"object", "model"},
                      {"created", created_},
                      {"owned_by", "deja"},
                      {"max_model_len", options_.max_model_len}};
  if (path == "/v1/models") return Json(200, {{"object", "list"}, {"data", json::array({model})}});
  const std::string id = path.substr(std::string("/v1/models/").size());
  if (id != options_.model) {
    return Error(NotFound("model '" + id + "' does not exist; this server serves '" +
                          options_.model + "'"));
  }
  return Json(200, model);
}

}  // namespace deja::coordinator
