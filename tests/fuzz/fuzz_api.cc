// Fuzzes the two request translations of the OpenAI and KServe APIs from arbitrary bytes (seeds:
// tests/fuzz/corpus/api, written by hand: a byte for the path, then the body). The
// first byte picks the path: an OpenAI /v1/completions or /v1/chat/completions body (the rest,
// as JSON), or a serialized KServe ModelInferRequest. What translates is resolved as the engine
// resolves it (opt-mini's limits and tokenizer), and answered as a response, a stream chunk and
// an error object would be.
//
// Invariants:
// - No input crashes or throws: a refusal is a status with a message; its OpenAI error has a
//   4xx status and an error body that is JSON (a 404 only for another model).
// - A call holds 1 to 64 requests, one echo text per request; each request is a text or token
//   prompt with the call's options, and the engine resolves it or refuses it with a status.
// - Responses, stream chunks and usage chunks of a translated call render as JSON.
// - A KServe request that translates has a text prompt (UTF-8), and its response carries the
//   request's id and the final flag.
#include <google/protobuf/stubs/logging.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/tokenizer.h"
#include "common/utf8.h"
#include "coordinator/chat_template.h"
#include "coordinator/kserve_api.h"
#include "coordinator/openai_api.h"
#include "coordinator/validation.h"
#include "tests/fuzz/fuzz_util.h"

namespace deja::fuzz {
namespace {

using coordinator::ModelLimits;

ModelLimits Limits() {
  ModelLimits l;
  l.vocab_size = static_cast<int32_t>(Tok().vocab_size());
  l.max_positions = 1024;
  l.default_max_new_tokens = 256;
  return l;
}

void CheckRefusal(const Status& s, coordinator::openai::Endpoint e) {
  FUZZ_CHECK(!s.ok() && !s.message().empty());
  const coordinator::openai::ApiError err = coordinator::openai::ErrorFor(s, e);
  FUZZ_CHECK(err.http_status >= 400 && err.http_status < 500);
  FUZZ_CHECK(err.http_status != 404 || err.param == "model");
  FUZZ_CHECK(!nlohmann::json::parse(coordinator::openai::ErrorBody(err), nullptr, false)
                  .is_discarded());
}

void OpenAi(coordinator::openai::Endpoint e, std::string_view body) {
  namespace oa = coordinator::openai;
  static const coordinator::ChatTemplate chat;
  StatusOr<oa::Call> call = oa::ParseCall(e, body, "opt-mini", chat, Tok());
  if (!call.ok()) return CheckRefusal(call.status(), e);
  FUZZ_CHECK(!call->requests.empty() && call->requests.size() <= 64);
  FUZZ_CHECK(call->echo.size() == call->requests.size());
  std::vector<oa::ChoiceResult> results;
  for (const v1::GenerateRequest& r : call->requests) {
    FUZZ_CHECK(r.has_text() || r.has_token_ids());
    StatusOr<coordinator::ResolvedRequest> resolved =
        coordinator::ResolveRequest(r, Limits(), Tok(), /*random_seed=*/1);
    if (!resolved.ok()) CheckRefusal(resolved.status(), e);
    oa::ChoiceResult c;
    c.text = "x";
    v1::Token t;
    t.set_id(100);
    t.set_text("y");
    c.tokens.push_back(t);
    c.finished = true;
    results.push_back(c);
  }
  const oa::ResponseHead head{"cmpl-1", 0, "opt-mini"};
  FUZZ_CHECK(!oa::Dump(oa::CompletionResponse(*call, head, results, Tok())).empty());
  FUZZ_CHECK(!oa::Dump(oa::StreamChunk(*call, head, 0, "z", results[0].tokens, true,
                                       v1::FINISH_REASON_LENGTH, Tok(), 0))
                  .empty());
  FUZZ_CHECK(!oa::Dump(oa::UsageChunk(*call, head, results)).empty());
}

void KServe(const uint8_t* data, size_t size) {
  inference::ModelInferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  StatusOr<coordinator::kserve::Infer> infer = coordinator::kserve::ParseInfer(request, "opt-mini");
  if (!infer.ok()) {
    FUZZ_CHECK(!infer.status().message().empty());
    FUZZ_CHECK(infer.status().code() == StatusCode::kInvalidArgument ||
               infer.status().code() == StatusCode::kNotFound);
    return;
  }
  FUZZ_CHECK(infer->request.has_text() && FindInvalidUtf8(infer->request.text()) == kUtf8Valid);
  StatusOr<coordinator::ResolvedRequest> resolved =
      coordinator::ResolveRequest(infer->request, Limits(), Tok(), 1);
  if (!resolved.ok()) FUZZ_CHECK(!resolved.status().message().empty());
  const inference::ModelInferResponse r =
      coordinator::kserve::MakeResponse(request, *infer, "text", 1, 2, true);
  FUZZ_CHECK(r.id() == request.id() && r.parameters().at("triton_final_response").bool_param());
}

}  // namespace
}  // namespace deja::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  deja::fuzz::QuietLogging();
  // protobuf logs every string field that is not UTF-8 it meets while parsing.
  google::protobuf::SetLogHandler(nullptr);
  (void)deja::fuzz::Tok();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      deja::fuzz::OpenAi(deja::coordinator::openai::Endpoint::kCompletions, rest);
      break;
    case 1:
      deja::fuzz::OpenAi(deja::coordinator::openai::Endpoint::kChat, rest);
      break;
    default:
      deja::fuzz::KServe(data + 1, size - 1);
      break;
  }
  return 0;
}
