// The OpenAI-compatible API's wire format: a /v1/completions or /v1/chat/completions body as
// deja.v1 GenerateRequests (one per prompt and choice), and the results and stream chunks back
// as the OpenAI objects. Plain functions over JSON, no I/O (coordinator/openai_service.h serves
// them). Validation beyond the JSON shapes is the engine's (coordinator/validation.h), whose
// messages ErrorFor() translates to the OpenAI parameter they name.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tokenizer.h"
#include "coordinator/chat_template.h"
#include "deja/v1/text_generation.pb.h"

namespace deja::coordinator::openai {

enum class Endpoint { kCompletions, kChat };

// A parsed call: requests[i] is choice i, prompt i / n.
struct Call {
  Endpoint endpoint = Endpoint::kCompletions;
  bool stream = false;
  bool include_usage = false;
  // Completions: `logprobs` was given (its top count is each request's top_n_tokens). Chat:
  // `logprobs: true`.
  bool logprobs = false;
  int32_t n = 1;
  std::vector<v1::GenerateRequest> requests;
  // Per request: text the choice starts with (`echo`: the prompt), "" for none.
  std::vector<std::string> echo;
};

// The completions parameters deja serves; the chat ones; deja's own (named as in deja.v1).
// A body with any other key is refused, naming it.
StatusOr<Call> ParseCall(Endpoint endpoint, std::string_view body, const std::string& model,
                         const ChatTemplate& chat_template, const Tokenizer& tokenizer);

// An error as the OpenAI API reports it.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;   // invalid_request_error, authentication_error, ...
  std::string param;  // the request parameter at fault; "" for none
  std::string code;   // model_not_found, invalid_api_key, ...; "" for none
};
// The error of a failed status: 400 (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE), 401,
// 404, 409 (ALREADY_EXISTS), 429 (RESOURCE_EXHAUSTED), 503 (UNAVAILABLE), 504, else 500. An
// engine message naming a deja.v1 field ("stopping.max_new_tokens must ...") names the
// endpoint's parameter instead ("max_tokens must ...").
ApiError ErrorFor(const Status& status, Endpoint endpoint);
// {"error": {"message", "type", "param", "code"}}
std::string ErrorBody(const ApiError& error);
// Characters (Unicode code points) of UTF-8 text: the unit of completions' text_offset, which
// counts each token's text (as vLLM's), the echoed prompt first.
size_t CodePoints(std::string_view s);
// The request body as a JSON object; INVALID_ARGUMENT saying where it fails to parse
// ("... parse error at line 1, column 5: syntax error ...") or what it is instead.
StatusOr<nlohmann::json> ParseJsonObject(std::string_view text);
// JSON text of `j`; bytes that are not UTF-8 in its strings become U+FFFD (never an exception).
std::string Dump(const nlohmann::json& j);
std::string Dump(const nlohmann::ordered_json& j);

// What one choice produced so far.
struct ChoiceResult {
  std::string text;               // whole text (non-streaming), echo included
  std::vector<v1::Token> tokens;  // when logprobs were asked for
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  uint32_t prompt_tokens = 0;
  uint32_t generated_tokens = 0;
  uint32_t cached_prompt_tokens = 0;
  bool finished = false;
};

// Identity of a response: "cmpl-..." / "chatcmpl-...", its creation time, the model.
struct ResponseHead {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// "stop", "length" or "abort" (cancelled by a Cancel call).
std::string FinishReasonName(v1::FinishReason reason);

// The whole response of a call whose choices all finished.
nlohmann::ordered_json CompletionResponse(const Call& call, const ResponseHead& head,
                                  const std::vector<ChoiceResult>& choices,
                                  const Tokenizer& tokenizer);
// One stream chunk of choice `index`: `text` (and the tokens behind it), and its finish reason
// when `finish` is set. `first`: the choice's first chunk (chat: it carries the role).
nlohmann::ordered_json StreamChunk(const Call& call, const ResponseHead& head, int index,
                           const std::string& text, const std::vector<v1::Token>& tokens,
                           bool first, v1::FinishReason finish, const Tokenizer& tokenizer,
                           size_t text_offset);
// The last chunk under stream_options.include_usage: no choices, the usage of all of them.
nlohmann::ordered_json UsageChunk(const Call& call, const ResponseHead& head,
                          const std::vector<ChoiceResult>& choices);

}  // namespace deja::coordinator::openai
