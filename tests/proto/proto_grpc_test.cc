// The generated C++ code of deja.v1 and grpc.health.v1: field presence where the API relies on
// it, the services' method sets, and real calls over loopback to a canned server with grpc's
// built-in health service and reflection (what the coordinator uses from Debian's grpc++).
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "deja/v1/text_generation.grpc.pb.h"
#include "deja/v1/worker.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/proto/fake_text_generation.h"

namespace deja {
namespace {

using deja::v1::GenerateRequest;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

const google::protobuf::ServiceDescriptor* Service(const google::protobuf::Descriptor* message,
                                                   const std::string& name) {
  return message->file()->FindServiceByName(name);
}

std::set<std::string> MethodNames(const google::protobuf::ServiceDescriptor* service) {
  std::set<std::string> names;
  for (int i = 0; i < service->method_count(); ++i) names.insert(service->method(i)->name());
  return names;
}

TEST(ProtoTest, OptionalFieldsTrackPresenceAcrossTheWire) {
  GenerateRequest req;
  req.set_text("Hello");
  req.mutable_sampling()->set_temperature(0.0f);  // explicit 0 differs from unset
  req.mutable_stopping()->set_max_new_tokens(16);
  req.mutable_cache()->set_kind(deja::v1::CachePolicy::KIND_H2O);
  req.mutable_cache()->set_heavy_ratio(0.1f);
  GenerateRequest back;
  ASSERT_TRUE(back.ParseFromString(req.SerializeAsString()));
  EXPECT_EQ(back.input_case(), GenerateRequest::kText);
  EXPECT_TRUE(back.sampling().has_temperature());
  EXPECT_FLOAT_EQ(back.sampling().temperature(), 0.0f);
  EXPECT_FALSE(back.sampling().has_top_p());
  EXPECT_FALSE(back.sampling().has_seed());
  EXPECT_FALSE(back.has_request_id());
  EXPECT_FALSE(back.cache().has_recent_ratio());
  EXPECT_EQ(back.cache().kind(), deja::v1::CachePolicy::KIND_H2O);
  // Unset enums mean "server default".
  EXPECT_EQ(GenerateRequest().cache().kind(), deja::v1::CachePolicy::KIND_UNSPECIFIED);
  EXPECT_EQ(GenerateRequest().sparsity().mode(), deja::v1::Sparsity::MODE_UNSPECIFIED);
  // Token ids replace the text in the oneof.
  back.mutable_token_ids()->add_ids(2);
  EXPECT_EQ(back.input_case(), GenerateRequest::kTokenIds);
  EXPECT_FALSE(back.has_text());
}

TEST(ProtoTest, ServicesHaveTheDesignedMethods) {
  EXPECT_EQ(
      MethodNames(Service(GenerateRequest::descriptor(), "TextGeneration")),
      (std::set<std::string>{"Generate", "GenerateStream", "Tokenize", "GetModelInfo", "Cancel"}));
  EXPECT_TRUE(Service(GenerateRequest::descriptor(), "TextGeneration")
                  ->FindMethodByName("GenerateStream")
                  ->server_streaming());
  EXPECT_EQ(MethodNames(Service(deja::v1::StepRequest::descriptor(), "Worker")),
            (std::set<std::string>{"Step", "GetStatus"}));
  const auto* step =
      Service(deja::v1::StepRequest::descriptor(), "Worker")->FindMethodByName("Step");
  EXPECT_TRUE(step->client_streaming() && step->server_streaming());
  EXPECT_EQ(MethodNames(Service(deja::v1::StepRequest::descriptor(), "Rendezvous")),
            (std::set<std::string>{"Register", "Set", "Get", "Wait"}));
  EXPECT_EQ(deja::v1::FinishReason_descriptor()->value_count(), 6);
}

TEST(ProtoTest, StepMessagesRoundTrip) {
  deja::v1::StepRequest step;
  step.set_step_id(7);
  auto* work = step.add_sequences();
  work->set_seq_id(42);
  work->add_tokens(2);
  work->add_tokens(31414);
  work->mutable_config()->mutable_cache()->set_kind(deja::v1::WorkerCachePolicy::KIND_H2O);
  work->mutable_config()->mutable_cache()->set_heavy_tokens(10);
  work->set_sample(true);
  step.add_release_seq_ids(41);
  deja::v1::StepRequest back;
  ASSERT_TRUE(back.ParseFromString(step.SerializeAsString()));
  EXPECT_EQ(back.sequences(0).tokens_size(), 2);
  EXPECT_EQ(back.sequences(0).config().cache().heavy_tokens(), 10u);
  EXPECT_EQ(back.release_seq_ids(0), 41u);
}

class LiveServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.ok()) << "fake server did not start";
    channel_ = grpc::CreateChannel(server_.target(), grpc::InsecureChannelCredentials());
  }
  static void SetDeadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }

  test_util::FakeServer server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(LiveServerTest, UnaryAndStreamingCalls) {
  auto stub = deja::v1::TextGeneration::NewStub(channel_);
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    GenerateRequest req;
    req.set_text("hi");
    deja::v1::GenerateResponse resp;
    ASSERT_TRUE(stub->Generate(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.text(), "echo: hi");
    EXPECT_EQ(resp.finish_reason(), deja::v1::FINISH_REASON_LENGTH);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    deja::v1::GenerateResponse resp;
    const grpc::Status s = stub->Generate(&ctx, GenerateRequest(), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("input"), std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    auto reader = stub->GenerateStream(&ctx, GenerateRequest());
    deja::v1::GenerateStreamResponse msg;
    std::string text;
    int finished = 0;
    while (reader->Read(&msg)) {
      text += msg.text_delta();
      finished += msg.finished();
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(text, "echo: stream");
    EXPECT_EQ(finished, 1);
    EXPECT_EQ(msg.finish_reason(), deja::v1::FINISH_REASON_EOS);
  }
}

TEST_F(LiveServerTest, HealthServiceFollowsServingStatus) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  auto check = [&](const std::string& service, HealthCheckResponse* resp) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    HealthCheckRequest req;
    req.set_service(service);
    return health->Check(&ctx, req, resp);
  };
  HealthCheckResponse resp;
  ASSERT_TRUE(check("", &resp).ok());
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);
  // Readiness is a per-service status the coordinator sets.
  const std::string name = deja::v1::TextGeneration::service_full_name();
  server_.server()->GetHealthCheckService()->SetServingStatus(name, false);
  ASSERT_TRUE(check(name, &resp).ok());
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
  server_.server()->GetHealthCheckService()->SetServingStatus(name, true);
  ASSERT_TRUE(check(name, &resp).ok());
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);
  EXPECT_EQ(check("no.such.Service", &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Waits for one completion-queue event and returns whether it succeeded.
bool Next(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  return cq->Next(&tag, &ok) && ok;
}

TEST_F(LiveServerTest, ReflectionListsTheService) {
  // ServerReflectionRequest{list_services: ""} is field 7, length 0: bytes 0x3a 0x00. No
  // reflection stubs ship in Debian, so the call is made with the generic stub and raw bytes.
  grpc::GenericStub stub(channel_);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  grpc::CompletionQueue cq;
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  call->StartCall(nullptr);
  ASSERT_TRUE(Next(&cq));
  grpc::Slice request(std::string("\x3a\x00", 2));
  call->Write(grpc::ByteBuffer(&request, 1), nullptr);
  ASSERT_TRUE(Next(&cq));
  call->WritesDone(nullptr);
  ASSERT_TRUE(Next(&cq));
  grpc::ByteBuffer reply;
  call->Read(&reply, nullptr);
  ASSERT_TRUE(Next(&cq));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_NE(bytes.find("deja.v1.TextGeneration"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
  grpc::Status status;
  call->Finish(&status, nullptr);
  ASSERT_TRUE(Next(&cq));
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace deja
