// The TextGeneration handlers in-process over the engine and a fake worker group: unary and
// streaming calls, Cancel, client cancellation and deadlines (the sequence leaves the batch),
// errors passed through, Tokenize and GetModelInfo, and bearer-token refusals.
#include "coordinator/grpc_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <grpcpp/generic/generic_stub.h>

#include <future>

#include "coordinator/wire_check.h"
#include "coordinator_test_util.h"

namespace deja::coordinator {
namespace {

using std::chrono::milliseconds;

class GrpcServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = test::LoadTokenizer();
    ASSERT_NE(tokenizer_, nullptr);
    metrics_ = std::make_unique<CoordinatorMetrics>(&registry_, ModelInfoLabels{"m", "f16", 2});
    StatusOr<std::vector<int32_t>> script = tokenizer_->Encode(" one two three four five", false);
    ASSERT_TRUE(script.ok());
    client_ = std::make_unique<test::FakeEngineClient>(*script);
    client_->SetDelay(milliseconds(2));
    EngineOptions o;
    o.limits.vocab_size = 8192;
    o.limits.max_positions = 1024;
    o.limits.default_max_new_tokens = 5;
    o.limits.default_cache.set_kind(v1::CachePolicy::KIND_FULL);
    engine_ = std::make_unique<Engine>(o, tokenizer_.get(), client_.get(), metrics_.get());
    v1::ModelInfo info;
    info.set_model_name("fake");
    info.set_tensor_parallel_size(2);
    service_ = std::make_unique<TextGenerationService>(engine_.get(), info);
    grpc::ServerBuilder b;
    int& port = port_;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::TextGeneration::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                            grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
    engine_.reset();
    EXPECT_EQ(client_->protocol_error(), "");
  }
  bool WaitNoSequences() {
    for (int i = 0; i < 500; ++i) {
      if (client_->live_sequences() == 0) return true;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return false;
  }
  static void Deadline(grpc::ClientContext* ctx, milliseconds ms = milliseconds(10000)) {
    ctx->set_deadline(std::chrono::system_clock::now() + ms);
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  metrics::Registry registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<test::FakeEngineClient> client_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<TextGenerationService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::TextGeneration::Stub> stub_;
  int port_ = 0;

  // `bytes` sent as the request of `method`, whatever they are; the call's status.
  grpc::Status RawUnary(const std::string& method, const std::string& bytes) {
    grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                               grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    Deadline(&ctx);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, "/deja.v1.TextGeneration/" + method, grpc::StubOptions(), &request,
                   &response, [&](grpc::Status s) { done.set_value(s); });
    return done.get_future().get();
  }
};

// Bytes that are not the method's message are INVALID_ARGUMENT on every method, never a status
// naming nothing; well-formed ones still work.
TEST_F(GrpcServiceTest, MalformedBytesAreInvalidArgumentOnEveryMethod) {
  const std::string junk("\xff\xff\xff\xff", 4);
  for (const char* method : {"Generate", "Tokenize", "GetModelInfo", "Cancel"}) {
    grpc::Status s = RawUnary(method, junk);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": "
                                                                  << s.error_message();
  }
  // CancelRequest{request_id: "\xff"}: a string that is not UTF-8, named.
  grpc::Status s = RawUnary("Cancel", std::string("\x0a\x01\xff", 3));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("request_id"), std::string::npos) << s.error_message();
  EXPECT_TRUE(RawUnary("GetModelInfo", "").ok());
  // An empty message is a message (every field unset), refused by name, not taken for a call
  // that ended before its request arrived.
  s = RawUnary("Generate", "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(RawUnary("Cancel", std::string("\x0a\x01x", 3)).ok());
}

TEST_F(GrpcServiceTest, GenerateAndStream) {
  v1::GenerateRequest req;
  req.set_text("Hi");
  req.mutable_response()->set_logprobs(true);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::GenerateResponse resp;
  ASSERT_TRUE(stub_->Generate(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.text(), " one two three four five");
  EXPECT_EQ(resp.generated_tokens(), 5u);
  EXPECT_EQ(resp.tokens_size(), 5);
  EXPECT_EQ(resp.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_FALSE(resp.request_id().empty());

  grpc::ClientContext sctx;
  Deadline(&sctx);
  auto reader = stub_->GenerateStream(&sctx, req);
  v1::GenerateStreamResponse msg;
  std::string text;
  int messages = 0;
  bool finished = false;
  while (reader->Read(&msg)) {
    EXPECT_FALSE(finished) << "a message after the final one";
    text += msg.text_delta();
    finished = msg.finished();
    ++messages;
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(finished);
  EXPECT_EQ(msg.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(msg.generated_tokens(), 5u);
  EXPECT_EQ(text, " one two three four five");
  EXPECT_GE(messages, 5);
}

TEST_F(GrpcServiceTest, ErrorsPassThrough) {
  v1::GenerateRequest req;
  req.set_text("Hi");
  req.mutable_sampling()->set_top_k(-1);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::GenerateResponse resp;
  grpc::Status s = stub_->Generate(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("sampling.top_k", 0), 0u);

  client_->SetReady(false, 0);
  grpc::ClientContext sctx;
  Deadline(&sctx);
  req.mutable_sampling()->clear_top_k();
  auto reader = stub_->GenerateStream(&sctx, req);
  v1::GenerateStreamResponse msg;
  EXPECT_FALSE(reader->Read(&msg));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

// With tokens, every method refuses a call without an accepted one: UNAUTHENTICATED, counted
// as a rejection, and no step reaches the workers. An accepted token is served as before.
TEST_F(GrpcServiceTest, BearerTokenIsCheckedBeforeAnythingElse) {
  const BearerAuth auth({"good-token"});
  v1::ModelInfo info;
  info.set_model_name("fake");
  TextGenerationService service(engine_.get(), info, &auth);
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::TextGeneration::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  const auto context = [](const std::string& authorization) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    Deadline(ctx.get());
    if (!authorization.empty()) ctx->AddMetadata("authorization", authorization);
    return ctx;
  };
  v1::GenerateRequest req;
  req.set_text("Hi");
  int refused = 0;
  for (const std::string& a : {std::string(), std::string("Bearer bad"),
                               std::string("Basic good-token"), std::string("good-token")}) {
    SCOPED_TRACE(a);
    v1::GenerateResponse resp;
    EXPECT_EQ(stub->Generate(context(a).get(), req, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    auto sctx = context(a);
    auto reader = stub->GenerateStream(sctx.get(), req);
    v1::GenerateStreamResponse msg;
    EXPECT_FALSE(reader->Read(&msg));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    v1::TokenizeRequest treq;
    v1::TokenizeResponse tresp;
    EXPECT_EQ(stub->Tokenize(context(a).get(), treq, &tresp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ModelInfo mresp;
    EXPECT_EQ(stub->GetModelInfo(context(a).get(), v1::GetModelInfoRequest(), &mresp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::CancelResponse cresp;
    EXPECT_EQ(stub->Cancel(context(a).get(), v1::CancelRequest(), &cresp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    refused += 5;
  }
  EXPECT_TRUE(client_->steps().empty());
  EXPECT_NE(
      registry_.Serialize().find(
          "deja_coordinator_rejections_total{protocol=\"grpc\",reason=\"unauthenticated\"} " +
                                 std::to_string(refused) + "\n"),
      std::string::npos)
      << registry_.Serialize();
  v1::GenerateResponse resp;
  grpc::Status s = stub->Generate(context("Bearer good-token").get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.text(), " one two three four five");
  server->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
}

TEST_F(GrpcServiceTest, CancelRpcEndsStreamAndUnary) {
  v1::GenerateRequest req;
  req.set_text("Hi");
  req.set_request_id("s1");
  req.mutable_stopping()->set_max_new_tokens(500);
  grpc::ClientContext sctx;
  Deadline(&sctx);
  auto reader = stub_->GenerateStream(&sctx, req);
  v1::GenerateStreamResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  grpc::ClientContext cctx;
  Deadline(&cctx);
  v1::CancelRequest creq;
  creq.set_request_id("s1");
  v1::CancelResponse cresp;
  ASSERT_TRUE(stub_->Cancel(&cctx, creq, &cresp).ok());
  EXPECT_TRUE(cresp.found());
  while (reader->Read(&msg)) {
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(msg.finished());
  EXPECT_EQ(msg.finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_TRUE(WaitNoSequences());

  // A unary call cancelled by id ends with status CANCELLED.
  req.set_request_id("u1");
  std::thread canceller([&] {
    for (int i = 0; i < 200; ++i) {
      grpc::ClientContext c;
      Deadline(&c);
      v1::CancelRequest cr;
      cr.set_request_id("u1");
      v1::CancelResponse r;
      if (stub_->Cancel(&c, cr, &r).ok() && r.found()) return;
      std::this_thread::sleep_for(milliseconds(5));
    }
  });
  grpc::ClientContext uctx;
  Deadline(&uctx);
  v1::GenerateResponse uresp;
  grpc::Status s = stub_->Generate(&uctx, req, &uresp);
  canceller.join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
}

TEST_F(GrpcServiceTest, ClientCancellationAndDeadlineFreeTheSequence) {
  v1::GenerateRequest req;
  req.set_text("Hi");
  req.mutable_stopping()->set_max_new_tokens(900);
  {
    grpc::ClientContext sctx;
    Deadline(&sctx);
    auto reader = stub_->GenerateStream(&sctx, req);
    v1::GenerateStreamResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    EXPECT_EQ(client_->live_sequences(), 1u);
    sctx.TryCancel();
    while (reader->Read(&msg)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(WaitNoSequences());

  grpc::ClientContext dctx;
  Deadline(&dctx, milliseconds(100));
  v1::GenerateResponse resp;
  EXPECT_EQ(stub_->Generate(&dctx, req, &resp).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitNoSequences());
}

// Calls the client cancels at once, or whose deadline passes before they are read, are not
// refusals of bad input: rejections_total{reason="invalid_argument"} stays 0.
TEST_F(GrpcServiceTest, CancelledCallsAreNotCountedAsInvalid) {
  v1::GenerateRequest req;
  req.set_text("Hi");
  req.mutable_stopping()->set_max_new_tokens(3);
  grpc::CompletionQueue cq;
  constexpr int kCalls = 300;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateStreamResponse>>> readers;
  std::vector<grpc::Status> statuses(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    if (i % 2 == 1) contexts.back()->set_deadline(std::chrono::system_clock::now());
    readers.push_back(stub_->AsyncGenerateStream(contexts.back().get(), req, &cq,
                                                 reinterpret_cast<void*>(2 * i)));
    if (i % 2 == 0) contexts.back()->TryCancel();
    readers.back()->Finish(&statuses[i], reinterpret_cast<void*>(2 * i + 1));
  }
  int finished = 0;
  void* tag;
  bool ok;
  while (finished < kCalls && cq.Next(&tag, &ok)) {
    if (reinterpret_cast<intptr_t>(tag) % 2 == 1) ++finished;
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  for (const grpc::Status& s : statuses) {
    EXPECT_NE(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  // The series exists from the start at zero; no cancelled call may have counted.
  const std::string text = registry_.Serialize();
  EXPECT_NE(text.find("rejections_total{protocol=\"grpc\",reason=\"invalid_argument\"} 0\n"),
            std::string::npos)
      << text.substr(text.find("rejections_total"), 300);
}

TEST_F(GrpcServiceTest, TokenizeAndModelInfo) {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::TokenizeRequest req;
  req.set_text("one two");
  req.set_add_bos(true);
  v1::TokenizeResponse resp;
  ASSERT_TRUE(stub_->Tokenize(&ctx, req, &resp).ok());
  ASSERT_GE(resp.ids_size(), 3);
  EXPECT_EQ(resp.ids(0), 2);
  EXPECT_EQ(resp.tokens_size(), resp.ids_size());

  grpc::ClientContext bctx;
  Deadline(&bctx);
  req.set_text("\xff");
  EXPECT_EQ(stub_->Tokenize(&bctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext ictx;
  Deadline(&ictx);
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&ictx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model_name(), "fake");
  EXPECT_EQ(info.tensor_parallel_size(), 2u);
}

}  // namespace
}  // namespace deja::coordinator

namespace deja::coordinator {
namespace {

// A serialized request whose placeholder string `marker` is replaced by bytes that are not
// UTF-8 (same length, so the framing stays valid).
std::string Corrupt(const google::protobuf::MessageLite& m, const std::string& marker) {
  std::string wire = m.SerializeAsString();
  const size_t at = wire.find(marker);
  EXPECT_NE(at, std::string::npos);
  wire[at] = '\xff';
  return wire;
}

TEST(WireCheckTest, NamesTheFieldThatIsNotUtf8) {
  v1::GenerateRequest r;
  r.set_request_id("rid-QQQ");
  r.set_text("hello TTT");
  r.mutable_stopping()->add_stop_sequences("fine");
  r.mutable_stopping()->add_stop_sequences("SSS");
  r.mutable_sparsity()->set_schedule("KKK");
  r.set_cache_salt("tenant-CCC");
  EXPECT_TRUE(CheckGenerateRequestUtf8(r.SerializeAsString()).ok());
  const std::pair<const char*, const char*> cases[] = {{"QQQ", "request_id "},
                                                       {"TTT", "text "},
                                                       {"SSS", "stopping.stop_sequences[1] "},
                                                       {"KKK", "sparsity.schedule "},
                                                       {"CCC", "cache_salt "}};
  for (const auto& [marker, field] : cases) {
    Status s = CheckGenerateRequestUtf8(Corrupt(r, marker));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << marker;
    EXPECT_EQ(s.message().rfind(field, 0), 0u) << s.message();
  }
  v1::TokenizeRequest t;
  t.set_text("abc ZZZ");
  EXPECT_TRUE(CheckTokenizeRequestUtf8(t.SerializeAsString()).ok());
  EXPECT_EQ(CheckTokenizeRequestUtf8(Corrupt(t, "ZZZ")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckGenerateRequestUtf8(std::string("\x12\x05\x61", 3)).code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace deja::coordinator
