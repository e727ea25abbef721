// A canned deja.v1.TextGeneration service on a loopback port, with grpc's built-in health
// service and reflection turned on as the coordinator does, for tests of the proto, the
// generated code and the example clients. It echoes its input; it holds no model.
#pragma once

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <memory>
#include <string>

#include "deja/v1/text_generation.grpc.pb.h"

namespace deja::test_util {

class FakeTextGeneration final : public deja::v1::TextGeneration::Service {
 public:
  grpc::Status Generate(grpc::ServerContext*, const deja::v1::GenerateRequest* req,
                        deja::v1::GenerateResponse* resp) override {
    if (req->input_case() == deja::v1::GenerateRequest::INPUT_NOT_SET) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "input: set text or token_ids"};
    }
    resp->set_request_id(req->has_request_id() ? req->request_id() : "fake-1");
    resp->set_text("echo: " + req->text());
    resp->set_prompt_tokens(static_cast<uint32_t>(req->text().size()));
    resp->set_generated_tokens(2);
    resp->set_finish_reason(deja::v1::FINISH_REASON_LENGTH);
    resp->mutable_timings()->set_total_ms(1.5);
    return grpc::Status::OK;
  }

  grpc::Status GenerateStream(grpc::ServerContext*, const deja::v1::GenerateRequest* req,
                              grpc::ServerWriter<deja::v1::GenerateStreamResponse>* w) override {
    deja::v1::GenerateStreamResponse msg;
    msg.set_request_id("fake-2");
    for (const char* piece : {"echo", ": ", "stream"}) {
      msg.set_text_delta(piece);
      w->Write(msg);
    }
    msg.set_text_delta("");
    msg.set_finished(true);
    msg.set_finish_reason(deja::v1::FINISH_REASON_EOS);
    msg.set_generated_tokens(3);
    w->Write(msg);
    return grpc::Status::OK;
  }

  grpc::Status Tokenize(grpc::ServerContext*, const deja::v1::TokenizeRequest* req,
                        deja::v1::TokenizeResponse* resp) override {
    if (req->add_bos()) {
      resp->add_ids(2);
      resp->add_tokens("</s>");
    }
    for (char c : req->text()) {  // one "token" per byte
      resp->add_ids(static_cast<unsigned char>(c));
      resp->add_tokens(std::string(1, c));
    }
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext*, const deja::v1::GetModelInfoRequest*,
                            deja::v1::ModelInfo* info) override {
    info->set_model_name("fake-opt");
    info->set_vocab_size(50272);
    info->set_max_position_embeddings(2048);
    info->set_tensor_parallel_size(2);
    info->mutable_default_cache_policy()->set_kind(deja::v1::CachePolicy::KIND_FULL);
    return grpc::Status::OK;
  }

  grpc::Status Cancel(grpc::ServerContext*, const deja::v1::CancelRequest* req,
                      deja::v1::CancelResponse* resp) override {
    resp->set_found(req->request_id() == "running");
    return grpc::Status::OK;
  }
};

// Starts the fake service on 127.0.0.1 with a free port, health and reflection.
class FakeServer {
 public:
  FakeServer() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~FakeServer() {
    if (server_) server_->Shutdown();
  }

  bool ok() const { return server_ != nullptr && port_ > 0; }
  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  grpc::Server* server() { return server_.get(); }

 private:
  FakeTextGeneration service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace deja::test_util
