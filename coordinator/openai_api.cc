#include "coordinator/openai_api.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <limits>
#include <set>

#include "common/utf8.h"

namespace deja::coordinator::openai {
namespace {

using json = nlohmann::json;
// Responses keep their keys in insertion order (top_logprobs most likely first), as OpenAI's do.
using ojson = nlohmann::ordered_json;

// The words of ParseCall's refusals of a parameter the endpoint does not have or serve.
constexpr const char* kUnknown = " is not a parameter this server knows";
constexpr const char* kUnsupported = " is not supported by this server";

// The most choices one call may ask for (prompts x n).
constexpr int64_t kMaxChoices = 64;

Status Bad(const std::string& param, const std::string& what) {
  return InvalidArgument(param + " " + what);
}

// The key's value; null when absent or JSON null (both mean "not given").
const json* Get(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

StatusOr<double> Number(const json& v, const char* key) {
  if (!v.is_number()) return Bad(key, "must be a number");
  return v.get<double>();
}

StatusOr<int64_t> Integer(const json& v, const char* key, int64_t lo, int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!v.is_number_integer()) return Bad(key, "must be an integer in " + range);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Bad(key, "must be in " + range + ", got " + v.dump());
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return Bad(key, "must be in " + range + ", got " + std::to_string(x));
  return x;
}

StatusOr<bool> Boolean(const json& v, const char* key) {
  if (!v.is_boolean()) return Bad(key, "must be true or false");
  return v.get<bool>();
}

StatusOr<std::string> String(const json& v, const char* key) {
  if (!v.is_string()) return Bad(key, "must be a string");
  return v.get<std::string>();
}

// A deja.v1 message from its JSON form (proto3 JSON: field names as in the .proto or
// lowerCamelCase, enum values by name).
template <typename Message>
Status ProtoField(const json& v, const char* key, Message* out) {
  if (!v.is_object()) return Bad(key, "must be an object (deja.v1." + Message().GetTypeName() + ")");
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto s = google::protobuf::util::JsonStringToMessage(v.dump(), out, options);
  if (!s.ok()) {
    return Bad(key, "is not a valid " + out->GetTypeName() + ": " + std::string(s.message()));
  }
  return Status::Ok();
}

const std::set<std::string>& KnownKeys(Endpoint e) {
  static const std::set<std::string> common = {
      // OpenAI's, both endpoints.
      "model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
      "frequency_penalty", "logit_bias", "user", "stream", "stream_options", "logprobs",
      // deja's own, named as in deja.v1.
      "request_id", "top_k", "repetition_penalty", "ignore_eos", "stop_token_ids",
      "time_limit_ms", "cache", "sparsity", "prefix_cache", "cache_salt"};
  static const std::set<std::string> completions = [] {
    std::set<std::string> k = common;
    k.insert({"prompt", "echo", "suffix", "best_of"});
    return k;
  }();
  static const std::set<std::string> chat = [] {
    std::set<std::string> k = common;
    k.insert({"messages", "top_logprobs", "max_completion_tokens", "add_generation_prompt",
              "tools", "tool_choice", "functions", "function_call", "response_format",
              "parallel_tool_calls"});
    return k;
  }();
  return e == Endpoint::kChat ? chat : completions;
}

// Parameters OpenAI defines that this server does not serve (given with a value that asks for
// something).
Status Unsupported(const json& body, Endpoint e) {
  if (e == Endpoint::kCompletions) {
    if (const json* s = Get(body, "suffix"); s != nullptr && !(s->is_string() && s->empty())) {
      return Bad("suffix", std::string(kUnsupported + 1) + " (OPT has no fill-in-the-middle)");
    }
    return Status::Ok();
  }
  for (const char* key : {"tools", "functions", "function_call", "parallel_tool_calls"}) {
    if (Get(body, key) != nullptr) {
      return Bad(key, std::string(kUnsupported + 1) + " (the model has no tool calling)");
    }
  }
  if (const json* t = Get(body, "tool_choice"); t != nullptr && *t != "none") {
    return Bad("tool_choice", std::string(kUnsupported + 1) + " (only \"none\")");
  }
  if (const json* f = Get(body, "response_format");
      f != nullptr && !(f->is_object() && f->contains("type") && (*f)["type"] == "text")) {
    return Bad("response_format", std::string(kUnsupported + 1) + " (only {\"type\": \"text\"})");
  }
  return Status::Ok();
}

// Sampling, stopping and response options shared by every choice of the call.
Status ParseOptions(const json& body, Endpoint e, const ChatTemplate& chat_template,
                    v1::GenerateRequest* base, Call* call) {
  v1::SamplingParams* s = base->mutable_sampling();
  v1::StoppingCriteria* stop = base->mutable_stopping();
  // OpenAI's default temperature is 1 (sampling); 0 is greedy.
  double temperature = 1.0;
  if (const json* v = Get(body, "temperature")) {
    DEJA_ASSIGN_OR_RETURN(temperature, Number(*v, "temperature"));
    if (temperature < 0 || temperature > 2) {
      return Bad("temperature", "must be in [0, 2], got " + v->dump());
    }
  }
  s->set_do_sample(temperature > 0);
  if (temperature > 0) s->set_temperature(static_cast<float>(temperature));
  if (const json* v = Get(body, "top_p")) {
    DEJA_ASSIGN_OR_RETURN(double p, Number(*v, "top_p"));
    s->set_top_p(static_cast<float>(p));
  }
  if (const json* v = Get(body, "top_k")) {
    // vLLM's -1 (no limit) is deja's 0.
    DEJA_ASSIGN_OR_RETURN(int64_t k, Integer(*v, "top_k", -1, std::numeric_limits<int32_t>::max()));
    s->set_top_k(static_cast<int32_t>(std::max<int64_t>(k, 0)));
  }
  if (const json* v = Get(body, "repetition_penalty")) {
    DEJA_ASSIGN_OR_RETURN(double p, Number(*v, "repetition_penalty"));
    s->set_repetition_penalty(static_cast<float>(p));
  }
  if (const json* v = Get(body, "presence_penalty")) {
    DEJA_ASSIGN_OR_RETURN(double p, Number(*v, "presence_penalty"));
    s->set_presence_penalty(static_cast<float>(p));
  }
  if (const json* v = Get(body, "frequency_penalty")) {
    DEJA_ASSIGN_OR_RETURN(double p, Number(*v, "frequency_penalty"));
    s->set_frequency_penalty(static_cast<float>(p));
  }
  if (const json* v = Get(body, "logit_bias")) {
    if (!v->is_object()) return Bad("logit_bias", "must be an object of token id to bias");
    for (const auto& [key, bias] : v->items()) {
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return Bad("logit_bias", "keys must be token ids, got \"" + key + "\"");
      }
      DEJA_ASSIGN_OR_RETURN(double b, Number(bias, "logit_bias"));
      (*s->mutable_logit_bias())[static_cast<int32_t>(id)] = static_cast<float>(b);
    }
  }
  if (const json* v = Get(body, "seed")) {
    if (!v->is_number_integer()) return Bad("seed", "must be an integer");
    s->set_seed(v->is_number_unsigned() ? v->get<uint64_t>()
                                        : static_cast<uint64_t>(v->get<int64_t>()));
  }

  // max_tokens: completions default to 16 as OpenAI's; chat to the server's default.
  const json* max_tokens = Get(body, "max_tokens");
  const char* max_key = "max_tokens";
  if (e == Endpoint::kChat && Get(body, "max_completion_tokens") != nullptr) {
    max_tokens = Get(body, "max_completion_tokens");
    max_key = "max_completion_tokens";
  }
  if (max_tokens != nullptr) {
    DEJA_ASSIGN_OR_RETURN(int64_t m,
                          Integer(*max_tokens, max_key, 1, std::numeric_limits<int32_t>::max()));
    stop->set_max_new_tokens(static_cast<int32_t>(m));
  } else if (e == Endpoint::kCompletions) {
    stop->set_max_new_tokens(16);
  }
  if (const json* v = Get(body, "stop")) {
    if (v->is_string()) {
      stop->add_stop_sequences(v->get<std::string>());
    } else if (v->is_array()) {
      for (const json& x : *v) {
        if (!x.is_string()) return Bad("stop", "must be a string or a list of strings");
        stop->add_stop_sequences(x.get<std::string>());
      }
    } else {
      return Bad("stop", "must be a string or a list of strings");
    }
  } else if (e == Endpoint::kChat) {
    for (const std::string& x : chat_template.stop) stop->add_stop_sequences(x);
  }
  if (const json* v = Get(body, "stop_token_ids")) {
    if (!v->is_array()) return Bad("stop_token_ids", "must be a list of token ids");
    for (const json& x : *v) {
      DEJA_ASSIGN_OR_RETURN(int64_t id, Integer(x, "stop_token_ids", 0,
                                                 std::numeric_limits<int32_t>::max()));
      stop->add_stop_token_ids(static_cast<int32_t>(id));
    }
  }
  if (const json* v = Get(body, "ignore_eos")) {
    DEJA_ASSIGN_OR_RETURN(bool b, Boolean(*v, "ignore_eos"));
    stop->set_ignore_eos(b);
  }
  if (const json* v = Get(body, "time_limit_ms")) {
    DEJA_ASSIGN_OR_RETURN(int64_t t, Integer(*v, "time_limit_ms", 0,
                                             std::numeric_limits<uint32_t>::max()));
    stop->set_time_limit_ms(static_cast<uint32_t>(t));
  }

  // Log-probabilities: completions' `logprobs` is the top count; chat's a flag with
  // top_logprobs beside it.
  v1::ResponseOptions* r = base->mutable_response();
  if (e == Endpoint::kCompletions) {
    if (const json* v = Get(body, "logprobs")) {
      DEJA_ASSIGN_OR_RETURN(int64_t k, Integer(*v, "logprobs", 0, 5));
      call->logprobs = true;
      r->set_logprobs(true);
      r->set_top_n_tokens(static_cast<uint32_t>(k));
    }
  } else {
    if (const json* v = Get(body, "logprobs")) {
      DEJA_ASSIGN_OR_RETURN(call->logprobs, Boolean(*v, "logprobs"));
      r->set_logprobs(call->logprobs);
    }
    if (const json* v = Get(body, "top_logprobs")) {
      if (!call->logprobs) return Bad("top_logprobs", "needs logprobs: true");
      DEJA_ASSIGN_OR_RETURN(int64_t k, Integer(*v, "top_logprobs", 0, 20));
      r->set_top_n_tokens(static_cast<uint32_t>(k));
    }
  }

  // deja's own.
  if (const json* v = Get(body, "cache")) {
    DEJA_RETURN_IF_ERROR(ProtoField(*v, "cache", base->mutable_cache()));
  }
  if (const json* v = Get(body, "sparsity")) {
    DEJA_RETURN_IF_ERROR(ProtoField(*v, "sparsity", base->mutable_sparsity()));
  }
  if (const json* v = Get(body, "prefix_cache")) {
    DEJA_RETURN_IF_ERROR(ProtoField(*v, "prefix_cache", base->mutable_prefix_cache()));
  }
  if (const json* v = Get(body, "cache_salt")) {
    DEJA_ASSIGN_OR_RETURN(std::string salt, String(*v, "cache_salt"));
    base->set_cache_salt(salt);
  }
  if (const json* v = Get(body, "request_id")) {
    DEJA_ASSIGN_OR_RETURN(std::string id, String(*v, "request_id"));
    base->set_request_id(id);
  }
  if (const json* v = Get(body, "user"); v != nullptr && !v->is_string()) {
    return Bad("user", "must be a string");
  }
  return Status::Ok();
}

// One prompt: text (the server prepends BOS) or token ids (used as given).
struct Prompt {
  bool tokens = false;
  std::string text;
  std::vector<int32_t> ids;
};

StatusOr<std::vector<Prompt>> ParsePrompts(const json& body) {
  const json* p = Get(body, "prompt");
  if (p == nullptr) return Bad("prompt", "is required");
  auto ids_of = [](const json& list, std::vector<int32_t>* out) -> Status {
    for (const json& x : list) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
          x.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Bad("prompt", "token ids must be integers >= 0");
      }
      out->push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    return Status::Ok();
  };
  std::vector<Prompt> out;
  if (p->is_string()) {
    out.push_back({false, p->get<std::string>(), {}});
    return out;
  }
  if (!p->is_array() || p->empty()) {
    return Bad("prompt", "must be a string, a list of strings, or a list of token id lists");
  }
  if ((*p)[0].is_number()) {
    Prompt one{true, "", {}};
    DEJA_RETURN_IF_ERROR(ids_of(*p, &one.ids));
    out.push_back(std::move(one));
    return out;
  }
  for (const json& x : *p) {
    if (x.is_string()) {
      out.push_back({false, x.get<std::string>(), {}});
    } else if (x.is_array()) {
      Prompt one{true, "", {}};
      DEJA_RETURN_IF_ERROR(ids_of(x, &one.ids));
      out.push_back(std::move(one));
    } else {
      return Bad("prompt", "must be a string, a list of strings, or a list of token id lists");
    }
  }
  return out;
}

// The deja.v1 field a validation message starts with, as this endpoint's parameter.
std::string ParamOf(const std::string& field, Endpoint e) {
  const bool chat = e == Endpoint::kChat;
  static const std::pair<const char*, const char*> kRenamed[] = {
      {"stopping.max_new_tokens", "max_tokens"},
      {"stopping.stop_sequences", "stop"},
      {"stopping.stop_token_ids", "stop_token_ids"},
      {"stopping.time_limit_ms", "time_limit_ms"},
  };
  if (field == "input" || field == "text" || field.rfind("token_ids", 0) == 0) {
    return chat ? "messages" : "prompt";
  }
  if (field == "response.top_n_tokens") return chat ? "top_logprobs" : "logprobs";
  if (field.rfind("sampling.", 0) == 0) return field.substr(9);
  for (const auto& [from, to] : kRenamed) {
    if (field.rfind(from, 0) == 0) return to;
  }
  return field;
}

// A SAX consumer that only keeps the parser's first error (its position and reason).
struct ErrorOnly {
  std::string error;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool key(std::string&) { return true; }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." without the tag.
    const std::string what = e.what();
    const size_t tag = what.find("] ");
    error = tag == std::string::npos ? what : what.substr(tag + 2);
    return false;
  }
};

}  // namespace

StatusOr<json> ParseJsonObject(std::string_view text) {
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    ErrorOnly sax;
    json::sax_parse(text, &sax);
    return InvalidArgument("the request body is not valid JSON: " +
                           (sax.error.empty() ? std::string("it does not parse") : sax.error));
  }
  if (!body.is_object()) {
    return InvalidArgument(std::string("the request body must be a JSON object, not ") +
                           body.type_name());
  }
  return body;
}

StatusOr<Call> ParseCall(Endpoint endpoint, std::string_view body_text, const std::string& model,
                         const ChatTemplate& chat_template, const Tokenizer& tokenizer) {
  DEJA_ASSIGN_OR_RETURN(const json body, ParseJsonObject(body_text));
  const std::set<std::string>& known = KnownKeys(endpoint);
  for (const auto& [key, value] : body.items()) {
    if (known.count(key) == 0) return InvalidArgument(key + kUnknown);
  }
  DEJA_RETURN_IF_ERROR(Unsupported(body, endpoint));
  if (const json* m = Get(body, "model")) {
    DEJA_ASSIGN_OR_RETURN(std::string name, String(*m, "model"));
    if (name != model) {
      return NotFound("model '" + name + "' does not exist; this server serves '" + model + "'");
    }
  }

  Call call;
  call.endpoint = endpoint;
  if (const json* v = Get(body, "stream")) {
    DEJA_ASSIGN_OR_RETURN(call.stream, Boolean(*v, "stream"));
  }
  if (const json* v = Get(body, "stream_options")) {
    if (!v->is_object()) return Bad("stream_options", "must be an object");
    if (const json* u = Get(*v, "include_usage")) {
      DEJA_ASSIGN_OR_RETURN(call.include_usage, Boolean(*u, "stream_options.include_usage"));
    }
  }
  if (const json* v = Get(body, "n")) {
    DEJA_ASSIGN_OR_RETURN(int64_t n, Integer(*v, "n", 1, kMaxChoices));
    call.n = static_cast<int32_t>(n);
  }
  if (const json* v = Get(body, "best_of")) {
    DEJA_ASSIGN_OR_RETURN(int64_t b, Integer(*v, "best_of", 1, kMaxChoices));
    if (b != call.n) return Bad("best_of", "other than n" + std::string(kUnsupported));
  }
  v1::GenerateRequest base;
  DEJA_RETURN_IF_ERROR(ParseOptions(body, endpoint, chat_template, &base, &call));

  std::vector<Prompt> prompts;
  bool echo = false;
  if (endpoint == Endpoint::kChat) {
    const json* messages = Get(body, "messages");
    if (messages == nullptr) return Bad("messages", "is required");
    bool add_generation_prompt = true;
    if (const json* v = Get(body, "add_generation_prompt")) {
      DEJA_ASSIGN_OR_RETURN(add_generation_prompt, Boolean(*v, "add_generation_prompt"));
    }
    DEJA_ASSIGN_OR_RETURN(std::string text,
                          chat_template.Render(*messages, add_generation_prompt));
    prompts.push_back({false, std::move(text), {}});
  } else {
    DEJA_ASSIGN_OR_RETURN(prompts, ParsePrompts(body));
    if (const json* v = Get(body, "echo")) {
      DEJA_ASSIGN_OR_RETURN(echo, Boolean(*v, "echo"));
    }
    if (echo && call.logprobs) {
      return Bad("echo", "with logprobs is not supported: this server does not compute the "
                         "prompt's log-probabilities");
    }
  }
  if (static_cast<int64_t>(prompts.size()) * call.n > kMaxChoices) {
    return Bad("n", "times the number of prompts must be at most " + std::to_string(kMaxChoices));
  }
  const bool many = prompts.size() * static_cast<size_t>(call.n) > 1;
  for (const Prompt& p : prompts) {
    for (int32_t i = 0; i < call.n; ++i) {
      v1::GenerateRequest r = base;
      if (p.tokens) {
        r.mutable_token_ids()->mutable_ids()->Add(p.ids.begin(), p.ids.end());
      } else {
        r.set_text(p.text);
      }
      // Choices of one prompt differ by seed; with a seed given they stay reproducible.
      if (base.sampling().has_seed() && i > 0) {
        r.mutable_sampling()->set_seed(base.sampling().seed() + static_cast<uint64_t>(i));
      }
      if (base.has_request_id() && many) {
        r.set_request_id(base.request_id() + "-" + std::to_string(call.requests.size()));
      }
      call.requests.push_back(std::move(r));
      call.echo.push_back(!echo ? std::string()
                          : p.tokens ? Utf8Lossy(tokenizer.Decode(p.ids, /*skip_special=*/false))
                                     : p.text);
    }
  }
  return call;
}

ApiError ErrorFor(const Status& status, Endpoint endpoint) {
  ApiError e;
  e.message = status.message();
  e.type = "invalid_request_error";
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
      e.http_status = 400;
      break;
    case StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case StatusCode::kPermissionDenied:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "not_found_error";
      if (e.message.rfind("model ", 0) == 0) {
        e.param = "model";
        e.code = "model_not_found";
      }
      return e;
    case StatusCode::kAlreadyExists:
      e.http_status = 409;
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    case StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "timeout";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  if (e.http_status == 400 || e.http_status == 409) {
    // The message starts with the field it names ("sampling.top_p must ...", "cache.kind: ...",
    // "messages[0].role ..."): a request parameter, or a deja.v1 field renamed to one.
    const std::string field = e.message.substr(0, e.message.find_first_of(" :"));
    const std::string base = field.substr(0, field.find('['));
    const std::string param = ParamOf(base, endpoint);
    const std::string top = param.substr(0, param.find_first_of(".["));
    // Parameters the endpoint has, and those ParseCall refused as unknown or unsupported.
    const bool named = e.message.find(kUnknown) != std::string::npos ||
                       e.message.find(kUnsupported) != std::string::npos;
    if (KnownKeys(endpoint).count(top) != 0 || named) {
      e.param = param == base ? field : param;
      if (param != base) e.message = param + e.message.substr(base.size());
    }
  }
  return e;
}

std::string ErrorBody(const ApiError& error) {
  json e = {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
  return Dump(json{{"error", e}});
}

size_t CodePoints(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}
std::string Dump(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_EOS:
    case v1::FINISH_REASON_STOP_SEQUENCE:
      return "stop";
    case v1::FINISH_REASON_CANCELLED:
      return "abort";
    default:
      return "length";
  }
}

namespace {

ojson Bytes(std::string_view s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// A choice's log-probabilities in the endpoint's form; null when none were asked for.
ojson Logprobs(const Call& call, const std::vector<v1::Token>& tokens, const Tokenizer& tokenizer,
              size_t text_offset) {
  if (!call.logprobs) return nullptr;
  if (call.endpoint == Endpoint::kChat) {
    ojson content = ojson::array();
    for (const v1::Token& t : tokens) {
      ojson top = ojson::array();
      for (const v1::TopToken& a : t.top()) {
        top.push_back({{"token", a.text()},
                       {"logprob", a.logprob()},
                       {"bytes", Bytes(tokenizer.TokenBytes(a.id()))}});
      }
      content.push_back({{"token", t.text()},
                         {"logprob", t.logprob()},
                         {"bytes", Bytes(tokenizer.TokenBytes(t.id()))},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  ojson texts = ojson::array(), lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  size_t offset = text_offset;
  for (const v1::Token& t : tokens) {
    texts.push_back(t.text());
    lps.push_back(t.logprob());
    // Most likely first (a text two tokens share keeps the likelier), then the chosen token when
    // it is not among them: up to logprobs + 1 entries, as OpenAI's.
    ojson top = ojson::object();
    for (const v1::TopToken& a : t.top()) {
      if (!top.contains(a.text())) top[a.text()] = a.logprob();
    }
    if (!top.contains(t.text())) top[t.text()] = t.logprob();
    tops.push_back(top);
    offsets.push_back(offset);
    offset += CodePoints(t.text());
  }
  return {{"tokens", texts},
          {"token_logprobs", lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

ojson Usage(const Call& call, const std::vector<ChoiceResult>& choices) {
  uint64_t prompt = 0, generated = 0, cached = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    // A prompt counts once, however many choices it has.
    if (i % static_cast<size_t>(call.n) == 0) {
      prompt += choices[i].prompt_tokens;
      cached += choices[i].cached_prompt_tokens;
    }
    generated += choices[i].generated_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", generated},
          {"total_tokens", prompt + generated},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

ojson Head(const Call& call, const ResponseHead& head, bool chunk) {
  const char* object = call.endpoint == Endpoint::kChat
                           ? (chunk ? "chat.completion.chunk" : "chat.completion")
                           : "text_completion";
  return {{"id", head.id}, {"object", object}, {"created", head.created}, {"model", head.model}};
}

}  // namespace

ojson CompletionResponse(const Call& call, const ResponseHead& head,
                        const std::vector<ChoiceResult>& choices, const Tokenizer& tokenizer) {
  ojson out = Head(call, head, /*chunk=*/false);
  ojson list = ojson::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    ojson choice = {{"index", i}};
    if (call.endpoint == Endpoint::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = Logprobs(call, c.tokens, tokenizer, CodePoints(call.echo[i]));
    choice["finish_reason"] = FinishReasonName(c.finish);
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = Usage(call, choices);
  return out;
}

ojson StreamChunk(const Call& call, const ResponseHead& head, int index, const std::string& text,
                 const std::vector<v1::Token>& tokens, bool first, v1::FinishReason finish,
                 const Tokenizer& tokenizer, size_t text_offset) {
  ojson out = Head(call, head, /*chunk=*/true);
  ojson choice = {{"index", index}};
  if (call.endpoint == Endpoint::kChat) {
    ojson delta = ojson::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = Logprobs(call, tokens, tokenizer, text_offset);
  choice["finish_reason"] =
      finish == v1::FINISH_REASON_UNSPECIFIED ? ojson(nullptr) : ojson(FinishReasonName(finish));
  out["choices"] = ojson::array({std::move(choice)});
  return out;
}

ojson UsageChunk(const Call& call, const ResponseHead& head,
                const std::vector<ChoiceResult>& choices) {
  ojson out = Head(call, head, /*chunk=*/true);
  out["choices"] = ojson::array();
  out["usage"] = Usage(call, choices);
  return out;
}

}  // namespace deja::coordinator::openai
