#include "coordinator/chat_template.h"

#include <fstream>
#include <sstream>

namespace deja::coordinator {
namespace {

constexpr const char* kContent = "{content}";

std::string Fill(const std::string& pattern, const std::string& content) {
  std::string out;
  size_t from = 0;
  for (size_t at; (at = pattern.find(kContent, from)) != std::string::npos;) {
    out.append(pattern, from, at - from);
    out += content;
    from = at + std::char_traits<char>::length(kContent);
  }
  out.append(pattern, from, std::string::npos);
  return out;
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::FromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgument(where + " must hold a JSON object");
  ChatTemplate t;
  for (auto& [key, value] : j.items()) {
    std::string* field = key == "system"              ? &t.system
                         : key == "user"              ? &t.user
                         : key == "assistant"         ? &t.assistant
                         : key == "generation_prompt" ? &t.generation_prompt
                                                      : nullptr;
    if (field != nullptr) {
      if (!value.is_string()) return InvalidArgument(where + ": \"" + key + "\" must be a string");
      *field = value.get<std::string>();
      if (key != "generation_prompt" && field->find(kContent) == std::string::npos) {
        return InvalidArgument(where + ": \"" + key + "\" must contain {content}");
      }
    } else if (key == "stop") {
      if (!value.is_array()) return InvalidArgument(where + ": \"stop\" must be a list of strings");
      t.stop.clear();
      for (const auto& s : value) {
        if (!s.is_string() || s.get<std::string>().empty()) {
          return InvalidArgument(where + ": \"stop\" must be a list of non-empty strings");
        }
        t.stop.push_back(s.get<std::string>());
      }
    } else {
      return InvalidArgument(where + ": unknown key \"" + key +
                             "\" (system, user, assistant, generation_prompt, stop)");
    }
  }
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument("--chat-template: cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("--chat-template: " + path + " is not valid JSON");
  return FromJson(j, "--chat-template " + path);
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& messages,
                                           bool add_generation_prompt) const {
  if (!messages.is_array() || messages.empty()) {
    return InvalidArgument("messages must be a non-empty list of {\"role\", \"content\"} objects");
  }
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return InvalidArgument(at + " must be an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return InvalidArgument(at + ".role must be system, user or assistant");
    }
    const std::string r = role->get<std::string>();
    const std::string* pattern = r == "system" || r == "developer" ? &system
                                 : r == "user"                     ? &user
                                 : r == "assistant"                ? &assistant
                                                                   : nullptr;
    if (pattern == nullptr) {
      return InvalidArgument(at + ".role must be system, user or assistant, got '" + r + "'");
    }
    std::string content;
    const auto c = m.find("content");
    if (c == m.end() || c->is_null()) {
      if (r != "assistant") return InvalidArgument(at + ".content is missing");
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t k = 0; k < c->size(); ++k) {
        const nlohmann::json& part = (*c)[k];
        const std::string pat = at + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
            !part.contains("text") || !part["text"].is_string()) {
          return InvalidArgument(pat + " must be a {\"type\": \"text\", \"text\": ...} part: "
                                 "this model reads text only");
        }
        content += part["text"].get<std::string>();
      }
    } else {
      return InvalidArgument(at + ".content must be a string or a list of text parts");
    }
    prompt += Fill(*pattern, content);
  }
  if (add_generation_prompt) prompt += generation_prompt;
  return prompt;
}

}  // namespace deja::coordinator
