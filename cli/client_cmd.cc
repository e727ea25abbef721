// `deja client`: a command-line client of deja.v1.TextGeneration (and grpc.health.v1) for
// trying a server: generate, stream, tokenize, info, cancel, health.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <sstream>

#include "cli/args.h"
#include "cli/api_bench.h"
#include "cli/client_bench.h"
#include "cli/client_soak.h"
#include "cli/commands.h"
#include "cli/security_flags.h"
#include "common/enum_table.h"
#include "coordinator/sparsity_mode.h"
#include "deja/v1/text_generation.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/grpc_status.h"
#include "worker/kv/policy_table.h"

namespace deja::cli {
namespace {

using proto::FromGrpc;

constexpr const char* kActions = "generate, stream, tokenize, info, cancel, health, bench or soak";

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

StatusOr<v1::GenerateRequest> RequestFromFlags(const Args& args) {
  v1::GenerateRequest r;
  if (!args.Has("prompt")) return InvalidArgument("--prompt is required");
  r.set_text(args.Str("prompt"));
  if (args.Has("request-id")) r.set_request_id(args.Str("request-id"));
  v1::SamplingParams* s = r.mutable_sampling();
  if (args.On("do-sample")) s->set_do_sample(true);
  if (args.Has("temperature")) {
    DEJA_ASSIGN_OR_RETURN(double v, args.Double("temperature"));
    s->set_temperature(static_cast<float>(v));
  }
  if (args.Has("top-k")) {
    DEJA_ASSIGN_OR_RETURN(int64_t v, args.Int("top-k"));
    s->set_top_k(static_cast<int32_t>(v));
  }
  if (args.Has("top-p")) {
    DEJA_ASSIGN_OR_RETURN(double v, args.Double("top-p"));
    s->set_top_p(static_cast<float>(v));
  }
  if (args.Has("repetition-penalty")) {
    DEJA_ASSIGN_OR_RETURN(double v, args.Double("repetition-penalty"));
    s->set_repetition_penalty(static_cast<float>(v));
  }
  if (args.Has("seed")) {
    DEJA_ASSIGN_OR_RETURN(int64_t v, args.Int("seed"));
    s->set_seed(static_cast<uint64_t>(v));
  }
  v1::StoppingCriteria* st = r.mutable_stopping();
  if (args.Has("max-new-tokens")) {
    DEJA_ASSIGN_OR_RETURN(int64_t v, args.Int("max-new-tokens"));
    st->set_max_new_tokens(static_cast<int32_t>(v));
  }
  if (args.Has("stop")) st->add_stop_sequences(args.Str("stop"));
  if (args.On("ignore-eos")) st->set_ignore_eos(true);
  if (args.Has("time-limit-ms")) {
    DEJA_ASSIGN_OR_RETURN(int64_t v, args.Int("time-limit-ms"));
    st->set_time_limit_ms(static_cast<uint32_t>(v));
  }
  if (args.Has("top-n")) {
    DEJA_ASSIGN_OR_RETURN(int64_t v, args.Int("top-n"));
    r.mutable_response()->set_top_n_tokens(static_cast<uint32_t>(v));
  }
  if (args.On("logprobs")) r.mutable_response()->set_logprobs(true);
  if (args.Has("sparsity")) {
    DEJA_ASSIGN_OR_RETURN(const bool on,
                          coordinator::ParseSparsity(args.Str("sparsity"), "--sparsity"));
    r.mutable_sparsity()->set_mode(coordinator::SparsityToProto(on));
  }
  if (args.Has("sparsity-schedule")) {
    r.mutable_sparsity()->set_schedule(args.Str("sparsity-schedule"));
  }
  if (args.Has("cache-salt")) r.set_cache_salt(args.Str("cache-salt"));
  if (args.Has("prefix-cache")) {
    const std::string v = args.Str("prefix-cache");
    if (v != "on" && v != "off") {
      return InvalidArgument("--prefix-cache must be on or off, not '" + v + "'");
    }
    r.mutable_prefix_cache()->set_mode(v == "on" ? v1::PrefixCache::MODE_ON
                                                 : v1::PrefixCache::MODE_OFF);
  }
  // The cache policy's fields go as given; the server checks them (and fills in the rest).
  v1::CachePolicy* c = r.mutable_cache();
  if (args.Has("kv-policy")) {
    DEJA_ASSIGN_OR_RETURN(const worker::kv::CachePolicyKind kind,
                          worker::kv::ParseCachePolicy(args.Str("kv-policy"), "--kv-policy"));
    c->set_kind(worker::kv::ToApiProto(kind));
  }
  for (const char* flag : {"heavy-ratio", "recent-ratio"}) {
    if (!args.Has(flag)) continue;
    DEJA_ASSIGN_OR_RETURN(double v, args.Double(flag));
    if (flag[0] == 'h') {
      c->set_heavy_ratio(static_cast<float>(v));
    } else {
      c->set_recent_ratio(static_cast<float>(v));
    }
  }
  for (const char* flag : {"heavy-tokens", "recent-tokens"}) {
    if (!args.Has(flag)) continue;
    DEJA_ASSIGN_OR_RETURN(int64_t v, args.Int(flag));
    if (v < 0 || v > (int64_t{1} << 30)) {
      return InvalidArgument(std::string("--") + flag + " must be in [0, 2^30]");
    }
    if (flag[0] == 'h') {
      c->set_heavy_tokens(static_cast<uint32_t>(v));
    } else {
      c->set_recent_tokens(static_cast<uint32_t>(v));
    }
  }
  if (args.Has("h2o-decay")) {
    DEJA_ASSIGN_OR_RETURN(double v, args.Double("h2o-decay"));
    c->set_score_decay(static_cast<float>(v));
  }
  return r;
}

void SetDeadline(const Args& args, grpc::ClientContext* ctx) {
  StatusOr<int64_t> ms = args.Int("timeout-ms");
  if (ms.ok() && *ms > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(*ms));
  }
}

Status Run(const std::string& action, const Args& args) {
  DEJA_ASSIGN_OR_RETURN(const ClientConnection connection,
                        ConnectFromFlags(args, args.Str("target")));
  const std::shared_ptr<grpc::Channel>& channel = connection.channel;
  auto stub = v1::TextGeneration::NewStub(channel);
  const bool json = args.On("json");
  grpc::ClientContext ctx;
  SetDeadline(args, &ctx);
  connection.Authorize(&ctx);
  if (action == "generate") {
    DEJA_ASSIGN_OR_RETURN(v1::GenerateRequest req, RequestFromFlags(args));
    v1::GenerateResponse resp;
    DEJA_RETURN_IF_ERROR(FromGrpc(stub->Generate(&ctx, req, &resp)));
    if (json) {
      std::printf("%s\n", Json(resp).c_str());
    } else {
      std::printf("%s\n", resp.text().c_str());
      std::fprintf(stderr, "[%s: %u prompt + %u generated tokens, %.1f ms]\n",
                   v1::FinishReason_Name(resp.finish_reason()).c_str(), resp.prompt_tokens(),
                   resp.generated_tokens(), resp.timings().total_ms());
    }
    return Status::Ok();
  }
  if (action == "stream") {
    DEJA_ASSIGN_OR_RETURN(v1::GenerateRequest req, RequestFromFlags(args));
    auto reader = stub->GenerateStream(&ctx, req);
    v1::GenerateStreamResponse msg;
    while (reader->Read(&msg)) {
      if (json) {
        std::printf("%s\n", Json(msg).c_str());
      } else {
        std::fputs(msg.text_delta().c_str(), stdout);
        if (msg.finished()) {
          std::fprintf(stderr,
                       "\n[%s: %u prompt (%u cached) + %u generated tokens, first token %.1f ms, "
                       "total %.1f ms]\n",
                       v1::FinishReason_Name(msg.finish_reason()).c_str(), msg.prompt_tokens(),
                       msg.cached_prompt_tokens(), msg.generated_tokens(),
                       msg.timings().time_to_first_token_ms(), msg.timings().total_ms());
        }
      }
      std::fflush(stdout);
    }
    return FromGrpc(reader->Finish());
  }
  if (action == "tokenize") {
    v1::TokenizeRequest req;
    req.set_text(args.Str("prompt"));
    req.set_add_bos(args.On("add-bos"));
    v1::TokenizeResponse resp;
    DEJA_RETURN_IF_ERROR(FromGrpc(stub->Tokenize(&ctx, req, &resp)));
    if (json) {
      std::printf("%s\n", Json(resp).c_str());
    } else {
      for (int i = 0; i < resp.ids_size(); ++i) {
        std::printf("%d\t%s\n", resp.ids(i), resp.tokens(i).c_str());
      }
    }
    return Status::Ok();
  }
  if (action == "info") {
    v1::ModelInfo info;
    DEJA_RETURN_IF_ERROR(FromGrpc(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info)));
    std::printf("%s\n", Json(info).c_str());
    return Status::Ok();
  }
  if (action == "cancel") {
    v1::CancelRequest req;
    req.set_request_id(args.Str("request-id"));
    v1::CancelResponse resp;
    DEJA_RETURN_IF_ERROR(FromGrpc(stub->Cancel(&ctx, req, &resp)));
    std::printf("%s\n", json ? Json(resp).c_str() : (resp.found() ? "cancelled" : "not found"));
    return Status::Ok();
  }
  if (action == "health") {
    auto health = grpc::health::v1::Health::NewStub(channel);
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(args.Str("service"));
    grpc::health::v1::HealthCheckResponse resp;
    DEJA_RETURN_IF_ERROR(FromGrpc(health->Check(&ctx, req, &resp)));
    std::printf("%s\n",
                grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()).c_str());
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING
               ? Status::Ok()
               : Unavailable("not serving");
  }
  if (action == "bench") {
    std::vector<int> levels;
    std::stringstream list(args.Has("streams") ? args.Str("streams") : "1,8,32");
    for (std::string item; std::getline(list, item, ',');) {
      const int n = std::atoi(item.c_str());
      if (n < 1) return InvalidArgument("--streams must list positive counts, got '" + item + "'");
      levels.push_back(n);
    }
    int64_t max_new = 64;
    if (args.Has("max-new-tokens")) {
      DEJA_ASSIGN_OR_RETURN(max_new, args.Int("max-new-tokens"));
    }
    if (max_new < 1) return InvalidArgument("--max-new-tokens must be >= 1");
    int64_t stop_after = 0;
    if (args.Has("stop-after")) {
      DEJA_ASSIGN_OR_RETURN(stop_after, args.Int("stop-after"));
    }
    if (stop_after < 0) return InvalidArgument("--stop-after must be >= 0");
    if (args.Has("http-target")) {
      DEJA_ASSIGN_OR_RETURN(int64_t rounds, args.Int("rounds"));
      if (rounds < 1) return InvalidArgument("--rounds must be >= 1");
      return RunApiBench(connection, args.Str("http-target"), levels, static_cast<int>(max_new),
                         args.Has("prompt") ? args.Str("prompt") : "And God said",
                         static_cast<int>(rounds));
    }
    return RunClientBench(connection, args.Str("metrics-target"), levels, static_cast<int>(max_new),
                          args.Has("prompt") ? args.Str("prompt") : "And God said",
                          static_cast<int>(stop_after));
  }
  if (action == "soak") {
    SoakOptions o;
    int64_t streams = 200;
    if (args.Has("streams")) {
      DEJA_ASSIGN_OR_RETURN(streams, args.Int("streams"));
    }
    DEJA_ASSIGN_OR_RETURN(o.seconds, args.Double("seconds"));
    DEJA_ASSIGN_OR_RETURN(o.cancel_fraction, args.Double("cancel-fraction"));
    DEJA_ASSIGN_OR_RETURN(o.check_fraction, args.Double("check-fraction"));
    if (streams < 1 || streams > 10000) return InvalidArgument("--streams must be in [1, 10000]");
    if (!(o.cancel_fraction >= 0 && o.cancel_fraction <= 1) ||
        !(o.check_fraction >= 0 && o.check_fraction <= 1)) {
      return InvalidArgument("--cancel-fraction and --check-fraction must be in [0, 1]");
    }
    o.streams = static_cast<int>(streams);
    if (args.Has("max-new-tokens")) {
      DEJA_ASSIGN_OR_RETURN(int64_t max_new, args.Int("max-new-tokens"));
      if (max_new < 1) return InvalidArgument("--max-new-tokens must be >= 1");
      o.max_new_tokens = static_cast<int>(max_new);
    }
    if (args.Has("seed")) {
      DEJA_ASSIGN_OR_RETURN(int64_t seed, args.Int("seed"));
      o.seed = static_cast<uint64_t>(seed);
    }
    o.prompt_file = args.Str("prompt-file");
    return RunClientSoak(connection, o);
  }
  return InvalidArgument("unknown action '" + action + "': use " + kActions);
}

}  // namespace

int RunClient(int argc, char** argv, int first) {
  Args args("client <generate|stream|tokenize|info|cancel|health|bench|soak>",
            "Call a deja server's TextGeneration API (or its health service).");
  args.Flag("target", "host:port of the server", "127.0.0.1:50051")
      .Flag("prompt", "prompt text (generate, stream) or text to tokenize")
      .Flag("max-new-tokens", "tokens to generate (bench: per stream, default 64)")
      .Bool("do-sample", "sample instead of greedy decoding")
      .Flag("temperature", "sampling temperature (>= 0)")
      .Flag("top-k", "keep the k most likely tokens (0 = off)")
      .Flag("top-p", "nucleus sampling mass in (0, 1]")
      .Flag("repetition-penalty", "CTRL-style penalty (> 0)")
      .Flag("seed", "sampling seed")
      .Flag("stop", "a stop sequence")
      .Bool("ignore-eos", "keep generating after EOS")
      .Flag("time-limit-ms", "end the request after this long with FINISH_REASON_TIME_LIMIT")
      .Flag("top-n", "alternatives per token, 0..5")
      .Flag("sparsity", "Deja Vu sparsity: " + OneOf(RowNames(coordinator::SparsityModeTable())) +
                            " (unset: the server's default)")
      .Flag("sparsity-schedule", "a sparsity schedule of ModelInfo.sparsity_schedules")
      .Flag("prefix-cache", "on: reuse and fill the server's prefix cache; off: never")
      .Flag("cache-salt", "share cached prompt blocks only with requests of this salt")
      .Flag("kv-policy", "KV cache policy: " + OneOf(RowNames(worker::kv::CachePolicyTable())) +
                             " (unset: the server's default)")
      .Flag("heavy-ratio", "h2o heavy-hitter budget, a fraction of the prompt")
      .Flag("recent-ratio", "recent-token budget, a fraction of the prompt")
      .Flag("heavy-tokens", "h2o heavy-hitter budget in tokens per head")
      .Flag("recent-tokens", "recent-token budget in tokens per head")
      .Flag("h2o-decay", "h2o: decay of the accumulated scores per step, in (0, 1]")
      .Bool("logprobs", "return each token's log-probability")
      .Flag("request-id", "client request id (cancel: the id to cancel)")
      .Bool("add-bos", "tokenize: prepend BOS")
      .Flag("service", "health: service name ('' = liveness)", "")
      .Flag("timeout-ms", "gRPC deadline (0 = none)", "0")
      .Bool("json", "print responses as JSON")
      .Flag("streams",
            "bench: comma-separated concurrency levels (default 1,8,32); soak: concurrent "
            "streams (default 200)")
      .Flag("seconds", "soak: how long to run", "600")
      .Flag("stop-after",
            "bench: each stream cancels its request after this many tokens (0: never)")
      .Flag("cancel-fraction", "soak: streams the client cancels part-way", "0.1")
      .Flag("check-fraction", "soak: finished streams replayed as unary calls and compared", "0.1")
      .Flag("prompt-file", "soak: prompts, one per line (default: a few built in)", "")
      .Flag("metrics-target", "bench: host:port of the server's /metrics, for step accounting")
      .Flag("http-target",
            "bench: host:port of the server's OpenAI API; each level then runs through gRPC and "
            "HTTP alike and compares them")
      .Flag("rounds", "bench with --http-target: rounds per level, alternating the APIs", "2");
  AddClientSecurityFlags(args);
  if (first >= argc || std::string(argv[first]).rfind("--", 0) == 0) {
    if (first < argc && (std::string(argv[first]) == "--help")) {
      return std::printf("%s", args.Help().c_str()), 0;
    }
    return Fail("client", InvalidArgument(std::string("name an action: ") + kActions));
  }
  const std::string action = argv[first];
  if (Status s = args.Parse(argc, argv, first + 1); !s.ok()) return Fail("client", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  if (Status s = Run(action, args); !s.ok()) return Fail("client", s);
  return 0;
}

}  // namespace deja::cli
