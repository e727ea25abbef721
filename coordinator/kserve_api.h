// KServe v2 (Open Inference Protocol) tensors as deja.v1 requests and back, with the inputs and
// outputs Triton's LLM backends use, so that clients written for them (tritonclient) work:
//
//   inputs   text_input BYTES [1] (required); max_tokens INT32/INT64; temperature, top_p,
//            repetition_penalty, presence_penalty, frequency_penalty FP32/FP64; top_k INT32/INT64;
//            seed UINT64/INT64; stop BYTES [n]; ignore_eos, stream, exclude_input_in_output,
//            return_num_input_tokens, return_num_output_tokens BOOL. Each scalar may come as a
//            request parameter of the same name instead.
//   outputs  text_output BYTES [1]; num_input_tokens, num_output_tokens UINT32 [1] when asked.
//
// As OpenAI's API: temperature 1 (sampling) by default, 0 greedy; max_tokens defaults to the
// server's default. exclude_input_in_output false (the default) puts the prompt before the text
// of a whole response; a streamed one carries the new text only.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "deja/v1/text_generation.pb.h"
#include "inference/grpc_service.pb.h"

namespace deja::coordinator::kserve {

struct Infer {
  v1::GenerateRequest request;
  std::string prompt;  // text_input
  bool stream = false;
  bool exclude_input = false;
  bool num_input_tokens = false;
  bool num_output_tokens = false;
  bool empty_final_response = false;  // triton_enable_empty_final_response
  // The outputs asked for (empty: all).
  std::vector<std::string> outputs;
};

// INVALID_ARGUMENT naming the tensor or parameter at fault; NOT_FOUND for another model or
// version than `model` (version "" or "1").
StatusOr<Infer> ParseInfer(const inference::ModelInferRequest& request, const std::string& model);

// The response with `text` (and the token counts when asked for), id and model echoed;
// `final` sets the parameter triton_final_response.
inference::ModelInferResponse MakeResponse(const inference::ModelInferRequest& request,
                                           const Infer& infer, const std::string& text,
                                           uint32_t input_tokens, uint32_t output_tokens,
                                           bool final);

// The tensors the model takes and gives (ModelMetadata).
inference::ModelMetadataResponse Metadata(const std::string& model);

// A BYTES tensor's raw form: each element as a 4-byte little-endian length, then its bytes.
std::string RawBytes(const std::vector<std::string>& elements);

}  // namespace deja::coordinator::kserve
