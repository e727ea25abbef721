// ChatTemplate: how /v1/chat/completions turns a list of messages into one prompt. OPT was not
// trained on chat and ships no template, so deja has a documented default and takes another
// from `deja serve --chat-template FILE`: a JSON object whose "system", "user" and "assistant"
// strings each hold `{content}` where the message's text goes, "generation_prompt" (appended
// when the reply is to follow) and "stop" (stop sequences for requests that give none):
//
//   {"system": "{content}\n\n", "user": "User: {content}\n",
//    "assistant": "Assistant: {content}\n", "generation_prompt": "Assistant:",
//    "stop": ["\nUser:"]}
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace deja::coordinator {

struct ChatTemplate {
  std::string system = "{content}\n\n";
  std::string user = "User: {content}\n";
  std::string assistant = "Assistant: {content}\n";
  std::string generation_prompt = "Assistant:";
  std::vector<std::string> stop = {"\nUser:"};

  // The file's template; INVALID_ARGUMENT naming the file and the key for a bad one.
  static StatusOr<ChatTemplate> Load(const std::string& path);
  // From a parsed object (Load's work, and tests').
  static StatusOr<ChatTemplate> FromJson(const nlohmann::json& j, const std::string& where);

  // The prompt of `messages` (the OpenAI form: [{"role", "content"}, ...], content a string or
  // a list of {"type": "text", "text"} parts). INVALID_ARGUMENT naming `messages[i].<field>`.
  StatusOr<std::string> Render(const nlohmann::json& messages, bool add_generation_prompt) const;
};

}  // namespace deja::coordinator
