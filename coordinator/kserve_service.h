// KServe v2 (Open Inference Protocol) on the gRPC port beside deja.v1: inference.
// GRPCInferenceService with ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
// ModelInfer and ModelStreamInfer (Triton's streaming extension), over the same Engine. The
// tensors are those of Triton's LLM backends (coordinator/kserve_api.h), so tritonclient and
// tools built on it work unchanged. Errors are gRPC statuses (on a stream, the response's
// error_message, and the stream goes on); bearer tokens as deja.v1's.
#pragma once

#include <string>

#include "coordinator/engine.h"
#include "coordinator/security.h"
#include "inference/grpc_service.grpc.pb.h"

namespace deja::coordinator {

class KServeService final : public inference::GRPCInferenceService::CallbackService {
 public:
  // `engine` and `auth` (null: no token needed) outlive the service.
  KServeService(Engine* engine, std::string model, const BearerAuth* auth)
      : engine_(engine), model_(std::move(model)), auth_(auth) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest* request,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest* request,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override;
  grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* context) override;

 private:
  // OK without a token file, else the call's bearer token checked (a refusal is counted).
  Status Authenticate(const grpc::CallbackServerContext* context);
  // NOT_FOUND unless `name` and `version` ("" or "1") are the served model's.
  Status CheckModel(const std::string& name, const std::string& version) const;

  Engine* engine_;
  const std::string model_;
  const BearerAuth* auth_;
};

}  // namespace deja::coordinator
