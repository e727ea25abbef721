// The OpenAI wire format: request bodies to deja.v1 requests (defaults, every parameter, choices
// per prompt, refusals naming the parameter), engine errors to OpenAI error objects, responses
// and chunks, and the chat template.
#include "coordinator/openai_api.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "coordinator_test_util.h"

namespace deja::coordinator::openai {
namespace {

using nlohmann::json;

class OpenAiApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = test::LoadTokenizer();
    ASSERT_NE(tokenizer_, nullptr);
  }
  StatusOr<Call> Parse(const json& body, Endpoint e = Endpoint::kCompletions) {
    return ParseCall(e, body.dump(), "opt-mini", template_, *tokenizer_);
  }
  // The parameter a refused body names.
  std::string ParamOf(const json& body, Endpoint e = Endpoint::kCompletions) {
    StatusOr<Call> c = Parse(body, e);
    if (c.ok()) return "(accepted)";
    return ErrorFor(c.status(), e).param;
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  ChatTemplate template_;
};

TEST_F(OpenAiApiTest, CompletionDefaultsFollowOpenAi) {
  StatusOr<Call> c = Parse({{"model", "opt-mini"}, {"prompt", "Hello"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->requests.size(), 1u);
  const v1::GenerateRequest& r = c->requests[0];
  EXPECT_EQ(r.text(), "Hello");
  EXPECT_EQ(r.stopping().max_new_tokens(), 16);  // OpenAI's completions default
  EXPECT_TRUE(r.sampling().do_sample());         // temperature 1 samples
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 1.0f);
  EXPECT_FALSE(r.sampling().has_seed());
  EXPECT_FALSE(c->stream);
  EXPECT_FALSE(c->logprobs);
  // The model may be left out; another model is NOT_FOUND.
  EXPECT_TRUE(Parse({{"prompt", "Hello"}}).ok());
  StatusOr<Call> other = Parse({{"model", "gpt-4"}, {"prompt", "Hello"}});
  ASSERT_FALSE(other.ok());
  const ApiError e = ErrorFor(other.status(), Endpoint::kCompletions);
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_EQ(e.param, "model");
}

TEST_F(OpenAiApiTest, EveryParameterReachesTheRequest) {
  StatusOr<Call> c = Parse({{"prompt", "Hi"},
                            {"max_tokens", 7},
                            {"temperature", 0},
                            {"top_p", 0.5},
                            {"seed", 11},
                            {"stop", {"a", "bc"}},
                            {"logprobs", 3},
                            {"presence_penalty", 0.25},
                            {"frequency_penalty", -0.5},
                            {"logit_bias", {{"50", 3}, {"7", -100}}},
                            {"user", "u1"},
                            {"stream", true},
                            {"stream_options", {{"include_usage", true}}},
                            {"top_k", 9},
                            {"repetition_penalty", 1.2},
                            {"ignore_eos", true},
                            {"stop_token_ids", {5, 6}},
                            {"time_limit_ms", 1000},
                            {"request_id", "r-1"},
                            {"cache", {{"kind", "KIND_H2O"}, {"heavy_ratio", 0.2}}},
                            {"sparsity", {{"mode", "MODE_OFF"}}},
                            {"prefix_cache", {{"mode", "MODE_OFF"}}},
                            {"cache_salt", "tenant"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const v1::GenerateRequest& r = c->requests[0];
  EXPECT_EQ(r.stopping().max_new_tokens(), 7);
  EXPECT_FALSE(r.sampling().do_sample());  // temperature 0: greedy
  EXPECT_FLOAT_EQ(r.sampling().top_p(), 0.5f);
  EXPECT_EQ(r.sampling().seed(), 11u);
  ASSERT_EQ(r.stopping().stop_sequences_size(), 2);
  EXPECT_EQ(r.stopping().stop_sequences(1), "bc");
  EXPECT_TRUE(r.response().logprobs());
  EXPECT_EQ(r.response().top_n_tokens(), 3u);
  EXPECT_FLOAT_EQ(r.sampling().presence_penalty(), 0.25f);
  EXPECT_FLOAT_EQ(r.sampling().frequency_penalty(), -0.5f);
  EXPECT_FLOAT_EQ(r.sampling().logit_bias().at(50), 3.f);
  EXPECT_FLOAT_EQ(r.sampling().logit_bias().at(7), -100.f);
  EXPECT_EQ(r.sampling().top_k(), 9);
  EXPECT_FLOAT_EQ(r.sampling().repetition_penalty(), 1.2f);
  EXPECT_TRUE(r.stopping().ignore_eos());
  EXPECT_EQ(r.stopping().stop_token_ids_size(), 2);
  EXPECT_EQ(r.stopping().time_limit_ms(), 1000u);
  EXPECT_EQ(r.request_id(), "r-1");
  EXPECT_EQ(r.cache().kind(), v1::CachePolicy::KIND_H2O);
  EXPECT_FLOAT_EQ(r.cache().heavy_ratio(), 0.2f);
  EXPECT_EQ(r.sparsity().mode(), v1::Sparsity::MODE_OFF);
  EXPECT_EQ(r.prefix_cache().mode(), v1::PrefixCache::MODE_OFF);
  EXPECT_EQ(r.cache_salt(), "tenant");
  EXPECT_TRUE(c->stream);
  EXPECT_TRUE(c->include_usage);
}

TEST_F(OpenAiApiTest, PromptsAndChoices) {
  // Prompt-major: two prompts x n = 2, seeds stepping per choice, ids suffixed.
  StatusOr<Call> c = Parse({{"prompt", {"one", "two"}}, {"n", 2}, {"seed", 5},
                            {"request_id", "x"}, {"echo", true}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->requests.size(), 4u);
  EXPECT_EQ(c->requests[1].text(), "one");
  EXPECT_EQ(c->requests[2].text(), "two");
  EXPECT_EQ(c->requests[0].sampling().seed(), 5u);
  EXPECT_EQ(c->requests[1].sampling().seed(), 6u);
  EXPECT_EQ(c->requests[3].request_id(), "x-3");
  EXPECT_EQ(c->echo[2], "two");
  // Token ids, one list or several; used as given.
  c = Parse({{"prompt", {2, 100, 200}}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->requests[0].token_ids().ids_size(), 3);
  c = Parse({{"prompt", {{2, 100}, {2, 7, 8}}}, {"echo", true}});
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->requests.size(), 2u);
  EXPECT_EQ(c->requests[1].token_ids().ids(2), 8);
  EXPECT_EQ(c->echo[0], tokenizer_->Decode(std::vector<int32_t>{2, 100}, false));
}

TEST_F(OpenAiApiTest, RefusalsNameTheParameter) {
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"temperature", 3}}), "temperature");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"temperature", "hot"}}), "temperature");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"max_tokens", 0}}), "max_tokens");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"max_tokens", 1.5}}), "max_tokens");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"n", 0}}), "n");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"logprobs", 6}}), "logprobs");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"logit_bias", {{"abc", 1}}}}), "logit_bias");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"stop", 5}}), "stop");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"seed", "s"}}), "seed");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"echo", true}, {"logprobs", 1}}), "echo");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"suffix", "tail"}}), "suffix");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"best_of", 3}}), "best_of");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"cache", {{"kind", "KIND_NOPE"}}}}), "cache");
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"frobnicate", 1}}), "frobnicate");
  EXPECT_EQ(ParamOf({{"prompt", {1, "a"}}}), "prompt");
  EXPECT_EQ(ParamOf({{"prompt", json::array()}}), "prompt");
  EXPECT_EQ(ParamOf(json::object()), "prompt");
  EXPECT_EQ(ParamOf({{"prompt", {"a", "b"}}, {"n", 40}}), "n");
  // Chat-only and completions-only parameters.
  EXPECT_EQ(ParamOf({{"prompt", "x"}, {"messages", json::array()}}), "messages");
  EXPECT_EQ(ParamOf({{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"echo", true}},
                    Endpoint::kChat),
            "echo");
  EXPECT_EQ(ParamOf({{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"top_logprobs", 2}},
                    Endpoint::kChat),
            "top_logprobs");
  EXPECT_EQ(ParamOf({{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"tools", {{{"type", "function"}}}}},
                    Endpoint::kChat),
            "tools");
  EXPECT_EQ(ParamOf({{"messages", {{{"role", "bot"}, {"content", "hi"}}}}}, Endpoint::kChat),
            "messages[0].role");
  // Not JSON at all.
  StatusOr<Call> c = ParseCall(Endpoint::kCompletions, "{oops", "opt-mini", template_, *tokenizer_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(ErrorFor(c.status(), Endpoint::kCompletions).http_status, 400);
}

TEST_F(OpenAiApiTest, EngineErrorsBecomeOpenAiErrors) {
  struct Case {
    Status status;
    Endpoint endpoint;
    int http;
    std::string param;
    std::string message_start;
  } cases[] = {
      {InvalidArgument("stopping.max_new_tokens must be in [1, 2000], got 5000"),
       Endpoint::kCompletions, 400, "max_tokens", "max_tokens must be in [1, 2000]"},
      {InvalidArgument("sampling.top_p must be in (0, 1], got 1.5"), Endpoint::kChat, 400,
       "top_p", "top_p must"},
      {InvalidArgument("response.top_n_tokens must be in [0, 5], got 9"), Endpoint::kChat, 400,
       "top_logprobs", "top_logprobs must"},
      {InvalidArgument("response.top_n_tokens must be in [0, 5], got 9"),
       Endpoint::kCompletions, 400, "logprobs", "logprobs must"},
      {InvalidArgument("input is empty: set a non-empty text"), Endpoint::kCompletions, 400,
       "prompt", "prompt is empty"},
      {InvalidArgument("token_ids.ids[3] must be in [0, 50272), got -1"), Endpoint::kCompletions,
       400, "prompt", "prompt[3] must"},
      {InvalidArgument("input has 3000 tokens"), Endpoint::kChat, 400, "messages", "messages has"},
      {InvalidArgument("stopping.stop_sequences[1] is empty"), Endpoint::kChat, 400, "stop",
       "stop[1] is empty"},
      {InvalidArgument("cache.heavy_tokens and cache.heavy_ratio are mutually exclusive"),
       Endpoint::kCompletions, 400, "cache.heavy_tokens", "cache.heavy_tokens and"},
      {FailedPrecondition("sparsity.mode: MODE_ON needs predictors"), Endpoint::kCompletions, 400,
       "sparsity.mode", "sparsity.mode:"},
      {ResourceExhausted("the queue is full"), Endpoint::kCompletions, 429, "", "the queue"},
      {Unavailable("the server is draining"), Endpoint::kCompletions, 503, "", "the server"},
      {Status(StatusCode::kUnauthenticated, "no token"), Endpoint::kChat, 401, "", "no token"},
      {Status(StatusCode::kAlreadyExists, "request_id 'a' is running"), Endpoint::kChat, 409,
       "request_id", "request_id"},
      {Internal("boom"), Endpoint::kChat, 500, "", "boom"},
  };
  for (const Case& c : cases) {
    const ApiError e = ErrorFor(c.status, c.endpoint);
    EXPECT_EQ(e.http_status, c.http) << c.status.message();
    EXPECT_EQ(e.param, c.param) << c.status.message();
    EXPECT_EQ(e.message.rfind(c.message_start, 0), 0u) << e.message;
    const json body = json::parse(ErrorBody(e));
    EXPECT_EQ(body["error"]["message"], e.message);
    EXPECT_TRUE(body["error"].contains("type") && body["error"].contains("code"));
    EXPECT_EQ(body["error"]["param"].is_null(), c.param.empty());
  }
}

TEST_F(OpenAiApiTest, ResponsesAndChunksHaveTheOpenAiShape) {
  StatusOr<Call> c = Parse({{"prompt", {"a", "b"}}, {"logprobs", 1}, {"n", 2}});
  ASSERT_TRUE(c.ok());
  std::vector<ChoiceResult> choices(4);
  for (int i = 0; i < 4; ++i) {
    choices[i].text = "t" + std::to_string(i);
    choices[i].finish = i == 0 ? v1::FINISH_REASON_EOS : v1::FINISH_REASON_LENGTH;
    choices[i].prompt_tokens = 3;
    choices[i].generated_tokens = 2;
    choices[i].cached_prompt_tokens = 1;
    v1::Token t;
    t.set_id(100);
    t.set_text("x");
    t.set_logprob(-0.5f);
    v1::TopToken* top = t.add_top();
    top->set_id(100);
    top->set_text("x");
    top->set_logprob(-0.5f);
    choices[i].tokens = {t};
  }
  const ResponseHead head{"cmpl-1", 1700000000, "opt-mini"};
  const json r = CompletionResponse(*c, head, choices, *tokenizer_);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"].size(), 4u);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][3]["text"], "t3");
  EXPECT_EQ(r["choices"][0]["logprobs"]["token_logprobs"][0], -0.5);
  EXPECT_EQ(r["choices"][0]["logprobs"]["top_logprobs"][0]["x"], -0.5);
  // Two prompts of 3 tokens (each counted once for its n = 2 choices), 8 generated.
  EXPECT_EQ(r["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(r["usage"]["completion_tokens"], 8);
  EXPECT_EQ(r["usage"]["total_tokens"], 14);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 2);

  StatusOr<Call> chat = Parse({{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                               {"logprobs", true}, {"top_logprobs", 1}},
                              Endpoint::kChat);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  const json first = StreamChunk(*chat, head, 0, "He", choices[0].tokens, true,
                                 v1::FINISH_REASON_UNSPECIFIED, *tokenizer_, 0);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "He");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(first["choices"][0]["logprobs"]["content"][0]["bytes"],
            json::array({static_cast<int>(
                static_cast<unsigned char>(tokenizer_->TokenBytes(100)[0]))}));
  const json last = StreamChunk(*chat, head, 0, "", {}, false, v1::FINISH_REASON_LENGTH,
                                *tokenizer_, 2);
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  const json usage = UsageChunk(*chat, head, {choices[0]});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
}

TEST_F(OpenAiApiTest, ABodyThatIsNotAJsonObjectSaysWhereOrWhatItIs) {
  const std::pair<std::string, std::string> cases[] = {
      {"{\"prompt\": x}", "not valid JSON: parse error at line 1, column 12"},
      {"{\"prompt\": \"a", "not valid JSON: parse error at line 1, column 14: syntax error while parsing value - invalid string: missing closing quote"},
      {"{\"prompt\": \"\xff\"}", "ill-formed UTF-8"},
      {"[1, 2]", "must be a JSON object, not array"},
      {"", "not valid JSON"},
  };
  for (const auto& [body, want] : cases) {
    StatusOr<nlohmann::json> j = ParseJsonObject(body);
    ASSERT_FALSE(j.ok()) << body;
    EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(j.status().message().find(want), std::string::npos) << j.status().message();
  }
  EXPECT_TRUE(ParseJsonObject("{\"prompt\": \"a\"}").ok());
}

TEST_F(OpenAiApiTest, CompletionLogprobsListTheLikeliestFirstAndTheChosenToken) {
  // top_logprobs in the order the engine ranked them (not by key), the chosen token added when
  // it is not among them, and text_offset in characters of the tokens' texts, the echo first.
  StatusOr<Call> c = Parse({{"prompt", "hi"}, {"logprobs", 2}});
  ASSERT_TRUE(c.ok());
  std::vector<ChoiceResult> choices(1);
  const char* texts[] = {"\xc3\xa9t\xc3\xa9", "x"};  // "été": 5 bytes, 3 characters
  for (const char* text : texts) {
    v1::Token t;
    t.set_id(100);
    t.set_text(text);
    t.set_logprob(-3.f);
    for (auto [name, lp] : {std::pair{"zz", -0.1f}, std::pair{"aa", -2.f}}) {
      v1::TopToken* top = t.add_top();
      top->set_id(101);
      top->set_text(name);
      top->set_logprob(lp);
    }
    choices[0].tokens.push_back(t);
  }
  const ResponseHead head{"cmpl-1", 1700000000, "opt-mini"};
  const nlohmann::ordered_json r = CompletionResponse(*c, head, choices, *tokenizer_);
  const auto& lp = r["choices"][0]["logprobs"];
  std::vector<std::string> keys;
  for (const auto& [k, v] : lp["top_logprobs"][0].items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"zz", "aa", "\xc3\xa9t\xc3\xa9"}));
  EXPECT_EQ(lp["top_logprobs"][1]["x"], -3.0);
  EXPECT_EQ(lp["text_offset"], nlohmann::ordered_json::array({0, 3}));
  // A stream's chunk carries the offset it is given (the characters streamed before it).
  const nlohmann::ordered_json chunk = StreamChunk(*c, head, 0, "x", {choices[0].tokens[1]},
                                                   false, v1::FINISH_REASON_UNSPECIFIED,
                                                   *tokenizer_, 3);
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["text_offset"], nlohmann::ordered_json::array({3}));
  EXPECT_EQ(CodePoints("\xc3\xa9t\xc3\xa9"), 3u);
}

TEST_F(OpenAiApiTest, ChatTemplateRendersAndLoads) {
  const json messages = {{{"role", "system"}, {"content", "Be brief."}},
                         {{"role", "user"}, {"content", "Hi"}},
                         {{"role", "assistant"}, {"content", "Hello."}},
                         {{"role", "user"},
                          {"content", {{{"type", "text"}, {"text", "Who "}},
                                       {{"type", "text"}, {"text", "are you?"}}}}}};
  StatusOr<std::string> p = template_.Render(messages, true);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, "Be brief.\n\nUser: Hi\nAssistant: Hello.\nUser: Who are you?\nAssistant:");
  // The chat request gets the prompt and the template's stop sequences.
  StatusOr<Call> c = Parse({{"messages", messages}}, Endpoint::kChat);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->requests[0].text(), *p);
  ASSERT_EQ(c->requests[0].stopping().stop_sequences_size(), 1);
  EXPECT_EQ(c->requests[0].stopping().stop_sequences(0), "\nUser:");
  EXPECT_FALSE(c->requests[0].stopping().has_max_new_tokens());  // the server's default
  // An image part, a missing content and a file template.
  EXPECT_FALSE(template_.Render({{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}, true)
                   .ok());
  EXPECT_FALSE(template_.Render({{{"role", "user"}}}, true).ok());
  const auto dir = std::filesystem::temp_directory_path() / "deja_chat_template_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "t.json") << R"({"user": "<u>{content}</u>", "assistant": "<a>{content}</a>",
      "generation_prompt": "<a>", "stop": ["</a>"]})";
  StatusOr<ChatTemplate> t = ChatTemplate::Load((dir / "t.json").string());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t->Render({{{"role", "user"}, {"content", "x"}}}, true), "<u>x</u><a>");
  std::ofstream(dir / "bad.json") << R"({"user": "no placeholder"})";
  StatusOr<ChatTemplate> bad = ChatTemplate::Load((dir / "bad.json").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("{content}"), std::string::npos);
  EXPECT_FALSE(ChatTemplate::Load((dir / "missing.json").string()).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deja::coordinator::openai
