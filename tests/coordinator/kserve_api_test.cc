// KServe v2 tensors to deja.v1 requests and back: raw and typed inputs of each datatype,
// request parameters, the defaults, refusals naming the tensor, and the raw BYTES output.
#include "coordinator/kserve_api.h"

#include <gtest/gtest.h>

#include <cstring>

namespace deja::coordinator::kserve {
namespace {

using Request = inference::ModelInferRequest;

template <typename T>
std::string Raw(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}

// text_input and each (name, datatype, raw bytes) as raw inputs.
Request RawRequest(const std::string& prompt,
                   const std::vector<std::tuple<std::string, std::string, std::string>>& more) {
  Request r;
  r.set_model_name("opt-mini");
  r.set_id("id-1");
  auto* t = r.add_inputs();
  t->set_name("text_input");
  t->set_datatype("BYTES");
  t->add_shape(1);
  r.add_raw_input_contents(RawBytes({prompt}));
  for (const auto& [name, type, bytes] : more) {
    auto* in = r.add_inputs();
    in->set_name(name);
    in->set_datatype(type);
    in->add_shape(1);
    r.add_raw_input_contents(bytes);
  }
  return r;
}

TEST(KServeApiTest, RawInputsOfEachTypeReachTheRequest) {
  Request r = RawRequest(
      "Hello", {{"max_tokens", "INT32", Raw<int32_t>(12)},
                {"temperature", "FP32", Raw<float>(0.5f)},
                {"top_p", "FP64", Raw<double>(0.9)},
                {"top_k", "INT64", Raw<int64_t>(7)},
                {"seed", "UINT64", Raw<uint64_t>(99)},
                {"stream", "BOOL", std::string(1, '\1')},
                {"exclude_input_in_output", "BOOL", std::string(1, '\1')},
                {"stop", "BYTES", RawBytes({"\n\n", "END"})}});
  r.mutable_inputs(8)->set_shape(0, 2);  // two stop sequences
  StatusOr<Infer> in = ParseInfer(r, "opt-mini");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  const v1::GenerateRequest& g = in->request;
  EXPECT_EQ(g.text(), "Hello");
  EXPECT_EQ(g.request_id(), "id-1");
  EXPECT_EQ(g.stopping().max_new_tokens(), 12);
  EXPECT_TRUE(g.sampling().do_sample());
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 7);
  EXPECT_EQ(g.sampling().seed(), 99u);
  ASSERT_EQ(g.stopping().stop_sequences_size(), 2);
  EXPECT_EQ(g.stopping().stop_sequences(1), "END");
  EXPECT_TRUE(in->stream);
  EXPECT_TRUE(in->exclude_input);
}

TEST(KServeApiTest, TypedContentsParametersAndDefaults) {
  Request r;
  r.set_model_name("opt-mini");
  r.set_model_version("1");
  auto* t = r.add_inputs();
  t->set_name("text_input");
  t->set_datatype("BYTES");
  t->mutable_contents()->add_bytes_contents("Hi");
  auto* m = r.add_inputs();
  m->set_name("max_tokens");
  m->set_datatype("INT32");
  m->mutable_contents()->add_int_contents(5);
  (*r.mutable_parameters())["temperature"].set_double_param(0);
  (*r.mutable_parameters())["ignore_eos"].set_bool_param(true);
  (*r.mutable_parameters())["triton_enable_empty_final_response"].set_bool_param(true);
  StatusOr<Infer> in = ParseInfer(r, "opt-mini");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->request.stopping().max_new_tokens(), 5);
  EXPECT_FALSE(in->request.sampling().do_sample());  // temperature 0: greedy
  EXPECT_TRUE(in->request.stopping().ignore_eos());
  EXPECT_TRUE(in->empty_final_response);
  EXPECT_FALSE(in->stream);
  // With nothing but the prompt: sampling at temperature 1, the server's max_tokens.
  Request bare = RawRequest("Hi", {});
  in = ParseInfer(bare, "opt-mini");
  ASSERT_TRUE(in.ok());
  EXPECT_TRUE(in->request.sampling().do_sample());
  EXPECT_FALSE(in->request.stopping().has_max_new_tokens());
}

TEST(KServeApiTest, RefusalsNameTheTensor) {
  struct Case {
    Request request;
    StatusCode code;
    std::string names;
  };
  Request no_text;
  no_text.set_model_name("opt-mini");
  Request two = RawRequest("a", {});
  two.set_raw_input_contents(0, RawBytes({"a", "b"}));
  Request truncated = RawRequest("a", {});
  truncated.set_raw_input_contents(0, std::string("\x09\0\0\0ab", 6));
  Request other_model = RawRequest("a", {});
  other_model.set_model_name("gpt");
  Request other_version = RawRequest("a", {});
  other_version.set_model_version("2");
  Request missing_raw = RawRequest("a", {{"max_tokens", "INT32", Raw<int32_t>(3)}});
  missing_raw.mutable_raw_input_contents()->RemoveLast();
  Request bad_utf8 = RawRequest("\xff\xfe", {});
  // Shapes that do not count the elements held: -1, a huge dimension, two stops declared for one.
  Request minus_one = RawRequest("a", {{"max_tokens", "INT32", Raw<int32_t>(3)}});
  minus_one.mutable_inputs(1)->set_shape(0, -1);
  Request huge = RawRequest("a", {{"max_tokens", "INT32", Raw<int32_t>(3)}});
  huge.mutable_inputs(1)->set_shape(0, int64_t{1} << 62);
  Request stops = RawRequest("a", {{"stop", "BYTES", RawBytes({"x"})}});
  stops.mutable_inputs(1)->set_shape(0, 2);
  Request twice = RawRequest("a", {{"max_tokens", "INT32", Raw<int32_t>(3)},
                                   {"max_tokens", "INT32", Raw<int32_t>(4)}});
  Request both = RawRequest("a", {{"max_tokens", "INT32", Raw<int32_t>(3)}});
  (*both.mutable_parameters())["max_tokens"].set_int64_param(4);
  Case cases[] = {
      {minus_one, StatusCode::kInvalidArgument, "max_tokens has a negative dimension"},
      {huge, StatusCode::kInvalidArgument, "max_tokens has shape"},
      {stops, StatusCode::kInvalidArgument, "stop has shape [2] but holds 1 element"},
      {twice, StatusCode::kInvalidArgument, "max_tokens is given twice"},
      {both, StatusCode::kInvalidArgument, "max_tokens is given both"},
      {no_text, StatusCode::kInvalidArgument, "text_input"},
      {two, StatusCode::kInvalidArgument, "text_input"},
      {truncated, StatusCode::kInvalidArgument, "text_input"},
      {RawRequest("a", {{"max_tokens", "FP32", Raw<float>(2.5f)}}), StatusCode::kInvalidArgument,
       "max_tokens"},
      {RawRequest("a", {{"max_tokens", "INT32", Raw<int32_t>(0)}}), StatusCode::kInvalidArgument,
       "max_tokens"},
      {RawRequest("a", {{"seed", "INT64", Raw<int64_t>(-1)}}), StatusCode::kInvalidArgument,
       "seed"},
      {RawRequest("a", {{"max_tokens", "INT32", std::string(3, '\0')}}),
       StatusCode::kInvalidArgument, "max_tokens"},
      {RawRequest("a", {{"bogus", "INT32", Raw<int32_t>(1)}}), StatusCode::kInvalidArgument,
       "bogus"},
      {RawRequest("a", {{"temperature", "BYTES", RawBytes({"x"})}}), StatusCode::kInvalidArgument,
       "temperature"},
      {missing_raw, StatusCode::kInvalidArgument, "raw_input_contents"},
      {bad_utf8, StatusCode::kInvalidArgument, "text_input"},
      {other_model, StatusCode::kNotFound, "gpt"},
      {other_version, StatusCode::kNotFound, "version"},
  };
  for (const Case& c : cases) {
    StatusOr<Infer> in = ParseInfer(c.request, "opt-mini");
    ASSERT_FALSE(in.ok()) << c.names;
    EXPECT_EQ(in.status().code(), c.code) << in.status().ToString();
    EXPECT_NE(in.status().message().find(c.names), std::string::npos) << in.status().ToString();
  }
}

TEST(KServeApiTest, AScalarMayHaveShapeOneByOne) {
  // Triton's LLM clients send [1, 1] tensors.
  Request r = RawRequest("Hi", {{"max_tokens", "INT32", Raw<int32_t>(5)}});
  r.mutable_inputs(0)->add_shape(1);
  r.mutable_inputs(1)->add_shape(1);
  StatusOr<Infer> in = ParseInfer(r, "opt-mini");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->request.stopping().max_new_tokens(), 5);
}

TEST(KServeApiTest, ResponsesAreRawBytesWithTheFinalFlag) {
  const Request r = RawRequest("Hi", {{"return_num_input_tokens", "BOOL", std::string(1, '\1')},
                                      {"return_num_output_tokens", "BOOL", std::string(1, '\1')}});
  StatusOr<Infer> in = ParseInfer(r, "opt-mini");
  ASSERT_TRUE(in.ok());
  const inference::ModelInferResponse resp = MakeResponse(r, *in, "there", 3, 4, true);
  EXPECT_EQ(resp.id(), "id-1");
  EXPECT_EQ(resp.model_name(), "opt-mini");
  EXPECT_TRUE(resp.parameters().at("triton_final_response").bool_param());
  ASSERT_EQ(resp.outputs_size(), 3);
  EXPECT_EQ(resp.outputs(0).name(), "text_output");
  EXPECT_EQ(resp.raw_output_contents(0), RawBytes({"there"}));
  EXPECT_EQ(resp.raw_output_contents(1), Raw<uint32_t>(3));
  EXPECT_EQ(resp.raw_output_contents(2), Raw<uint32_t>(4));
  // Outputs asked for by name: only those.
  Request only = r;
  only.add_outputs()->set_name("num_output_tokens");
  in = ParseInfer(only, "opt-mini");
  ASSERT_TRUE(in.ok());
  const inference::ModelInferResponse one = MakeResponse(only, *in, "x", 3, 4, false);
  ASSERT_EQ(one.outputs_size(), 1);
  EXPECT_EQ(one.outputs(0).name(), "num_output_tokens");
  EXPECT_FALSE(one.parameters().at("triton_final_response").bool_param());
  only.add_outputs()->set_name("logits");
  EXPECT_EQ(ParseInfer(only, "opt-mini").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Metadata("opt-mini").inputs(0).name(), "text_input");
}

}  // namespace
}  // namespace deja::coordinator::kserve
