// The deja.v1.TextGeneration handlers. They only translate between the protocol and the
// Engine: no validation, scheduling or text handling lives here.
//
// Built on gRPC's callback (reactor) API rather than a thread per call: a streaming call costs
// a small object, not a blocked thread, while it waits for tokens, so concurrency is bounded by
// admission rather than by a thread pool; a client that goes away is reported at once through
// OnCancel (and leaves the batch at the next step) instead of being noticed by polling
// ServerContext::IsCancelled; and writes complete asynchronously, so a slow reader never
// blocks the engine thread that produces every request's tokens.
#pragma once

#include "coordinator/engine.h"
#include "coordinator/security.h"
#include "deja/v1/text_generation.grpc.pb.h"

namespace deja::coordinator {

// Every method takes its request as bytes (see wire_check.h): text that is not UTF-8 and bytes
// that are not the method's message must be INVALID_ARGUMENT naming what is wrong, which the
// protobuf runtime's own parse cannot give (a typed method answers malformed bytes with a
// status that names nothing).
using TextGenerationBase = v1::TextGeneration::WithRawCallbackMethod_Generate<
    v1::TextGeneration::WithRawCallbackMethod_GenerateStream<
        v1::TextGeneration::WithRawCallbackMethod_Tokenize<
            v1::TextGeneration::WithRawCallbackMethod_GetModelInfo<
                v1::TextGeneration::WithRawCallbackMethod_Cancel<v1::TextGeneration::Service>>>>>;

class TextGenerationService final : public TextGenerationBase {
 public:
  // `engine` outlives the service. `info` is returned by GetModelInfo, with its sparsity fields
  // set from what the worker group reports. With `auth` (which outlives the service), every
  // call must carry an accepted bearer token; the others get UNAUTHENTICATED, counted as a
  // rejection, and never reach the engine.
  TextGenerationService(Engine* engine, v1::ModelInfo info, const BearerAuth* auth = nullptr)
      : engine_(engine), info_(std::move(info)), auth_(auth) {}

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStream(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;

 private:
  // OK without auth_, else the token check of the call's metadata (a refusal is counted).
  Status Authenticate(const grpc::CallbackServerContext* context);

  Engine* engine_;
  const v1::ModelInfo info_;
  const BearerAuth* auth_;
};

}  // namespace deja::coordinator
