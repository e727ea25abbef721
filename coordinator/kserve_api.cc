#include "coordinator/kserve_api.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "common/utf8.h"

namespace deja::coordinator::kserve {
namespace {

using Tensor = inference::ModelInferRequest::InferInputTensor;

Status Bad(const std::string& name, const std::string& what) {
  return InvalidArgument(name + " " + what);
}

// The bytes per element of a fixed-size datatype; 0 for BYTES and unknown types.
size_t ElementBytes(const std::string& t) {
  if (t == "BOOL" || t == "INT8" || t == "UINT8") return 1;
  if (t == "INT16" || t == "UINT16" || t == "FP16" || t == "BF16") return 2;
  if (t == "INT32" || t == "UINT32" || t == "FP32") return 4;
  if (t == "INT64" || t == "UINT64" || t == "FP64") return 8;
  return 0;
}

template <typename T>
T Load(const std::string& raw, size_t i) {
  T v;
  std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
  return v;
}

// A tensor's elements as numbers (raw or typed contents), for the numeric and BOOL types.
StatusOr<std::vector<double>> Numbers(const Tensor& t, const std::string* raw) {
  const std::string& type = t.datatype();
  std::vector<double> out;
  if (raw != nullptr) {
    const size_t size = ElementBytes(type);
    if (size == 0 || type == "FP16" || type == "BF16") {
      return Bad(t.name(), "must be a number or BOOL tensor, not " + type);
    }
    if (raw->size() % size != 0) return Bad(t.name(), "has a raw size that is not whole elements");
    const size_t n = raw->size() / size;
    for (size_t i = 0; i < n; ++i) {
      if (type == "BOOL" || type == "UINT8") out.push_back(Load<uint8_t>(*raw, i));
      else if (type == "INT8") out.push_back(Load<int8_t>(*raw, i));
      else if (type == "INT16") out.push_back(Load<int16_t>(*raw, i));
      else if (type == "UINT16") out.push_back(Load<uint16_t>(*raw, i));
      else if (type == "INT32") out.push_back(Load<int32_t>(*raw, i));
      else if (type == "UINT32") out.push_back(Load<uint32_t>(*raw, i));
      else if (type == "INT64") out.push_back(static_cast<double>(Load<int64_t>(*raw, i)));
      else if (type == "UINT64") out.push_back(static_cast<double>(Load<uint64_t>(*raw, i)));
      else if (type == "FP32") out.push_back(Load<float>(*raw, i));
      else out.push_back(Load<double>(*raw, i));
    }
    return out;
  }
  const auto& c = t.contents();
  for (bool b : c.bool_contents()) out.push_back(b);
  for (int32_t x : c.int_contents()) out.push_back(x);
  for (int64_t x : c.int64_contents()) out.push_back(static_cast<double>(x));
  for (uint32_t x : c.uint_contents()) out.push_back(x);
  for (uint64_t x : c.uint64_contents()) out.push_back(static_cast<double>(x));
  for (float x : c.fp32_contents()) out.push_back(x);
  for (double x : c.fp64_contents()) out.push_back(x);
  return out;
}

// A BYTES tensor's elements.
StatusOr<std::vector<std::string>> Strings(const Tensor& t, const std::string* raw) {
  if (t.datatype() != "BYTES") return Bad(t.name(), "must be a BYTES tensor, not " + t.datatype());
  std::vector<std::string> out;
  if (raw == nullptr) {
    for (const std::string& b : t.contents().bytes_contents()) out.push_back(b);
    return out;
  }
  for (size_t at = 0; at < raw->size();) {
    if (raw->size() - at < 4) return Bad(t.name(), "has a truncated raw BYTES element");
    const uint32_t len = Load<uint32_t>(raw->substr(at, 4), 0);
    at += 4;
    if (raw->size() - at < len) return Bad(t.name(), "has a truncated raw BYTES element");
    out.push_back(raw->substr(at, len));
    at += len;
  }
  return out;
}

// The one value of a scalar input or parameter.
struct Scalars {
  std::map<std::string, double> numbers;
  std::map<std::string, bool> flags;
};

const std::set<std::string>& NumberNames() {
  static const std::set<std::string> names = {
      "max_tokens",       "temperature",       "top_p", "top_k", "seed", "repetition_penalty",
      "presence_penalty", "frequency_penalty"};
  return names;
}
const std::set<std::string>& FlagNames() {
  static const std::set<std::string> names = {"ignore_eos", "stream", "exclude_input_in_output",
                                              "return_num_input_tokens",
                                              "return_num_output_tokens"};
  return names;
}

Status AddParameter(const std::string& name, const inference::InferParameter& p, Scalars* s) {
  using P = inference::InferParameter;
  if (FlagNames().count(name) != 0) {
    if (p.parameter_choice_case() != P::kBoolParam) return Bad(name, "must be a bool parameter");
    s->flags[name] = p.bool_param();
    return Status::Ok();
  }
  if (NumberNames().count(name) == 0) {
    // Triton's own request parameters, accepted and ignored where they change nothing here.
    if (name.rfind("triton_", 0) == 0 || name == "priority" || name == "timeout") {
      return Status::Ok();
    }
    return Bad(name, "is not a parameter this model takes");
  }
  switch (p.parameter_choice_case()) {
    case P::kInt64Param:
      s->numbers[name] = static_cast<double>(p.int64_param());
      break;
    case P::kUint64Param:
      s->numbers[name] = static_cast<double>(p.uint64_param());
      break;
    case P::kDoubleParam:
      s->numbers[name] = p.double_param();
      break;
    default:
      return Bad(name, "must be a number parameter");
  }
  return Status::Ok();
}

bool IsInteger(double x) { return std::isfinite(x) && x == std::floor(x); }

// A tensor's shape must count the elements it holds (no -1, as in Triton's requests).
Status CheckShape(const Tensor& t, size_t elements) {
  uint64_t count = 1;
  std::string dims;
  for (int64_t d : t.shape()) {
    dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    if (d < 0) return Bad(t.name(), "has a negative dimension in its shape [" + dims + "]");
    count = count > std::numeric_limits<uint32_t>::max() ? count : count * static_cast<uint64_t>(d);
  }
  if (count != elements) {
    return Bad(t.name(), "has shape [" + dims + "] but holds " + std::to_string(elements) +
                             " element" + (elements == 1 ? "" : "s"));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Infer> ParseInfer(const inference::ModelInferRequest& request, const std::string& model) {
  if (request.model_name() != model) {
    return NotFound("model '" + request.model_name() + "' is not served here; this server serves '" +
                    model + "'");
  }
  if (!request.model_version().empty() && request.model_version() != "1") {
    return NotFound("model '" + model + "' has version 1 only, not '" + request.model_version() +
                    "'");
  }
  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size()) {
    return InvalidArgument("raw_input_contents must have one entry per input (" +
                           std::to_string(request.inputs_size()) + "), got " +
                           std::to_string(request.raw_input_contents_size()));
  }
  Infer out;
  Scalars s;
  for (const auto& [name, p] : request.parameters()) {
    if (name == "triton_enable_empty_final_response") {
      out.empty_final_response = p.bool_param();
      continue;
    }
    DEJA_RETURN_IF_ERROR(AddParameter(name, p, &s));
  }
  std::optional<std::string> text;
  std::vector<std::string> stop;
  std::set<std::string> inputs;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const Tensor& t = request.inputs(i);
    const std::string* r = raw ? &request.raw_input_contents(i) : nullptr;
    if (!inputs.insert(t.name()).second) return Bad(t.name(), "is given twice");
    if (request.parameters().count(t.name()) != 0) {
      return Bad(t.name(), "is given both as an input and as a parameter");
    }
    if (t.name() == "text_input" || t.name() == "stop") {
      DEJA_ASSIGN_OR_RETURN(std::vector<std::string> v, Strings(t, r));
      DEJA_RETURN_IF_ERROR(CheckShape(t, v.size()));
      if (t.name() == "stop") {
        stop = std::move(v);
        continue;
      }
      if (v.size() != 1) {
        return Bad("text_input", "must hold one element (one prompt), got " +
                                     std::to_string(v.size()));
      }
      text = std::move(v[0]);
      continue;
    }
    const bool flag = FlagNames().count(t.name()) != 0;
    if (!flag && NumberNames().count(t.name()) == 0) {
      return Bad(t.name(), "is not an input this model takes (see ModelMetadata)");
    }
    DEJA_ASSIGN_OR_RETURN(std::vector<double> v, Numbers(t, r));
    DEJA_RETURN_IF_ERROR(CheckShape(t, v.size()));
    if (v.size() != 1) {
      return Bad(t.name(), "must hold one element, got " + std::to_string(v.size()));
    }
    if (flag) {
      s.flags[t.name()] = v[0] != 0;
    } else {
      s.numbers[t.name()] = v[0];
    }
  }
  if (!text) return Bad("text_input", "is required (a BYTES tensor holding the prompt)");
  if (FindInvalidUtf8(*text) != kUtf8Valid) return Bad("text_input", "is not valid UTF-8");
  out.prompt = *text;
  v1::GenerateRequest& g = out.request;
  g.set_text(*text);
  if (!request.id().empty()) g.set_request_id(request.id());
  const auto number = [&](const char* name) -> std::optional<double> {
    auto it = s.numbers.find(name);
    return it == s.numbers.end() ? std::nullopt : std::optional<double>(it->second);
  };
  const double temperature = number("temperature").value_or(1.0);
  g.mutable_sampling()->set_do_sample(temperature > 0);
  g.mutable_sampling()->set_temperature(static_cast<float>(temperature));
  if (auto v = number("top_p")) g.mutable_sampling()->set_top_p(static_cast<float>(*v));
  if (auto v = number("repetition_penalty")) {
    g.mutable_sampling()->set_repetition_penalty(static_cast<float>(*v));
  }
  if (auto v = number("presence_penalty")) {
    g.mutable_sampling()->set_presence_penalty(static_cast<float>(*v));
  }
  if (auto v = number("frequency_penalty")) {
    g.mutable_sampling()->set_frequency_penalty(static_cast<float>(*v));
  }
  if (auto v = number("top_k")) {
    if (!IsInteger(*v) || *v < -1 || *v > std::numeric_limits<int32_t>::max()) {
      return Bad("top_k", "must be an integer >= -1");
    }
    g.mutable_sampling()->set_top_k(static_cast<int32_t>(std::max(0.0, *v)));
  }
  if (auto v = number("seed")) {
    if (!IsInteger(*v) || *v < 0) return Bad("seed", "must be an integer >= 0");
    g.mutable_sampling()->set_seed(static_cast<uint64_t>(*v));
  }
  if (auto v = number("max_tokens")) {
    if (!IsInteger(*v) || *v < 1 || *v > std::numeric_limits<int32_t>::max()) {
      return Bad("max_tokens", "must be an integer >= 1");
    }
    g.mutable_stopping()->set_max_new_tokens(static_cast<int32_t>(*v));
  }
  for (std::string& x : stop) g.mutable_stopping()->add_stop_sequences(std::move(x));
  const auto flag = [&](const char* name) {
    auto it = s.flags.find(name);
    return it != s.flags.end() && it->second;
  };
  g.mutable_stopping()->set_ignore_eos(flag("ignore_eos"));
  out.stream = flag("stream");
  out.exclude_input = flag("exclude_input_in_output");
  out.num_input_tokens = flag("return_num_input_tokens");
  out.num_output_tokens = flag("return_num_output_tokens");
  for (const auto& o : request.outputs()) {
    if (o.name() != "text_output" && o.name() != "num_input_tokens" &&
        o.name() != "num_output_tokens") {
      return Bad(o.name(), "is not an output this model gives (text_output, num_input_tokens, "
                           "num_output_tokens)");
    }
    out.outputs.push_back(o.name());
  }
  return out;
}

std::string RawBytes(const std::vector<std::string>& elements) {
  std::string out;
  for (const std::string& e : elements) {
    const uint32_t len = static_cast<uint32_t>(e.size());
    char b[4];
    std::memcpy(b, &len, 4);
    out.append(b, 4);
    out += e;
  }
  return out;
}

inference::ModelInferResponse MakeResponse(const inference::ModelInferRequest& request,
                                           const Infer& infer, const std::string& text,
                                           uint32_t input_tokens, uint32_t output_tokens,
                                           bool final) {
  inference::ModelInferResponse r;
  r.set_model_name(request.model_name());
  r.set_model_version("1");
  r.set_id(request.id());
  (*r.mutable_parameters())["triton_final_response"].set_bool_param(final);
  const auto wanted = [&](const std::string& name) {
    if (infer.outputs.empty()) return true;
    for (const std::string& o : infer.outputs) {
      if (o == name) return true;
    }
    return false;
  };
  const auto add_u32 = [&](const char* name, uint32_t v) {
    auto* o = r.add_outputs();
    o->set_name(name);
    o->set_datatype("UINT32");
    o->add_shape(1);
    std::string raw(4, '\0');
    std::memcpy(raw.data(), &v, 4);
    r.add_raw_output_contents(raw);
  };
  if (wanted("text_output")) {
    auto* o = r.add_outputs();
    o->set_name("text_output");
    o->set_datatype("BYTES");
    o->add_shape(1);
    r.add_raw_output_contents(RawBytes({text}));
  }
  if (infer.num_input_tokens && wanted("num_input_tokens")) add_u32("num_input_tokens", input_tokens);
  if (infer.num_output_tokens && wanted("num_output_tokens")) {
    add_u32("num_output_tokens", output_tokens);
  }
  return r;
}

inference::ModelMetadataResponse Metadata(const std::string& model) {
  inference::ModelMetadataResponse m;
  m.set_name(model);
  m.add_versions("1");
  m.set_platform("deja");
  const auto add = [](auto* list, const char* name, const char* type, int64_t dim) {
    auto* t = list->Add();
    t->set_name(name);
    t->set_datatype(type);
    t->add_shape(dim);
  };
  add(m.mutable_inputs(), "text_input", "BYTES", 1);
  add(m.mutable_inputs(), "max_tokens", "INT32", 1);
  for (const char* f : {"temperature", "top_p", "repetition_penalty", "presence_penalty",
                        "frequency_penalty"}) {
    add(m.mutable_inputs(), f, "FP32", 1);
  }
  add(m.mutable_inputs(), "top_k", "INT32", 1);
  add(m.mutable_inputs(), "seed", "UINT64", 1);
  add(m.mutable_inputs(), "stop", "BYTES", -1);
  for (const std::string& f : FlagNames()) add(m.mutable_inputs(), f.c_str(), "BOOL", 1);
  add(m.mutable_outputs(), "text_output", "BYTES", 1);
  add(m.mutable_outputs(), "num_input_tokens", "UINT32", 1);
  add(m.mutable_outputs(), "num_output_tokens", "UINT32", 1);
  return m;
}

}  // namespace deja::coordinator::kserve
