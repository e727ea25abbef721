// OpenAiService: the OpenAI-compatible HTTP API (`deja serve --http-port`, default 8000) over the
// same Engine as deja.v1: POST /v1/completions and /v1/chat/completions (whole, or streamed as
// server-sent events: `data: {chunk}` ... `data: [DONE]`), GET /v1/models[/<id>], POST
// /tokenize and /detokenize, GET /health. Errors are OpenAI error objects with the matching
// HTTP status (coordinator/openai_api.h). A client that closes the connection before its reply
// ended leaves the batch at the next step, as a gRPC client that cancels does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "coordinator/chat_template.h"
#include "coordinator/engine.h"
#include "coordinator/security.h"
#include "http/http_server.h"

namespace deja::coordinator {

struct OpenAiOptions {
  std::string model;       // the served model's name: `model` must equal it (or be left out)
  int32_t max_model_len = 0;
  ChatTemplate chat_template;
  const BearerAuth* auth = nullptr;  // null: no token needed (GET /health never needs one)
};

class OpenAiService {
 public:
  // `engine` outlives the service.
  OpenAiService(Engine* engine, OpenAiOptions options);

  // The HTTP server's own refusals (431, 413, 400) as OpenAI error objects.
  static http::Response Refusal(int status, const std::string& message);

  // http::AsyncHandler: called on the HTTP server's thread.
  void Handle(const http::Request& request, std::shared_ptr<http::Responder> reply);

 private:
  void Route(const http::Request& request, std::shared_ptr<http::Responder> reply);
  void Generate(const http::Request& request, std::shared_ptr<http::Responder> reply, bool chat);
  http::Response Tokenize(const http::Request& request) const;
  http::Response Detokenize(const http::Request& request) const;
  http::Response Models(const std::string& path) const;

  Engine* engine_;
  OpenAiOptions options_;
  int64_t created_;  // /v1/models' "created": when the service started (Unix seconds)
};

}  // namespace deja::coordinator
