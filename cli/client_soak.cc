// `deja client soak`: `streams` GenerateStream calls at once, each replaced by a new one when it
// ends, for `seconds`. Every call draws its own settings: greedy or sampled (temperature, top-k
// up to beyond the vocabulary, top-p down to near 0, repetition penalty, seed), a cache policy
// (full, window or H2O with token or ratio budgets), max_new_tokens, sometimes a stop sequence;
// a fraction is cancelled by the client after a random number of messages.
//
// Invariants checked on every stream: one request_id throughout; exactly one finished message,
// the last; the tokens received add up to generated_tokens, within max_new_tokens; a stream
// ends OK, or CANCELLED when the client cancelled it. A fraction of the finished streams is
// replayed as a unary Generate with the same settings and seed: the same token ids and the same
// text (the concatenated deltas), so nothing was lost, duplicated or taken from another stream.
#include "cli/client_soak.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "deja/v1/text_generation.grpc.pb.h"

namespace deja::cli {
namespace {

using Clock = std::chrono::steady_clock;

const std::vector<std::string> kPrompts = {
    "And God said",        "In the beginning", "The LORD is my shepherd",
    "And it came to pass", "Blessed are the",  "Then said Jesus unto them"};

struct Tally {
  std::mutex mu;
  int64_t started = 0, finished = 0, cancelled = 0, tokens = 0, replayed = 0;
  std::map<std::string, int64_t> failures;  // "<reason>" -> count
  std::vector<std::string> examples;        // the first few failures, in words

  void Fail(const std::string& reason, const std::string& detail) {
    std::lock_guard<std::mutex> lock(mu);
    ++failures[reason];
    if (examples.size() < 10) examples.push_back(reason + ": " + detail);
  }
};

v1::GenerateRequest RandomRequest(std::mt19937_64& rng, const SoakOptions& o,
                                  const std::vector<std::string>& prompts) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  v1::GenerateRequest r;
  r.set_text(prompts[rng() % prompts.size()]);
  v1::StoppingCriteria* stop = r.mutable_stopping();
  stop->set_max_new_tokens(1 + static_cast<int32_t>(rng() % std::max(1, o.max_new_tokens)));
  stop->set_ignore_eos(u(rng) < 0.5);
  if (u(rng) < 0.2) stop->add_stop_sequences(u(rng) < 0.5 ? "," : " the");
  r.mutable_response()->set_return_tokens(true);
  r.mutable_response()->set_logprobs(u(rng) < 0.3);
  v1::SamplingParams* s = r.mutable_sampling();
  s->set_seed(rng());
  if (u(rng) < 0.6) {
    s->set_do_sample(true);
    const float temperatures[] = {1e-6f, 0.3f, 0.7f, 1.0f, 1.5f};
    s->set_temperature(temperatures[rng() % 5]);
    const int32_t top_k[] = {0, 1, 5, 50, 1 << 30};
    s->set_top_k(top_k[rng() % 5]);
    const float top_p[] = {1.f, 0.95f, 0.5f, 1e-6f};
    s->set_top_p(top_p[rng() % 4]);
  }
  if (u(rng) < 0.2) s->set_repetition_penalty(u(rng) < 0.5 ? 1.2f : 0.9f);
  v1::CachePolicy* c = r.mutable_cache();
  switch (rng() % 4) {
    case 0:
      c->set_kind(v1::CachePolicy::KIND_FULL);
      break;
    case 1:
      c->set_kind(v1::CachePolicy::KIND_WINDOW);
      c->set_recent_tokens(4 + static_cast<uint32_t>(rng() % 32));
      break;
    case 2:
      c->set_kind(v1::CachePolicy::KIND_H2O);
      c->set_heavy_tokens(2 + static_cast<uint32_t>(rng() % 16));
      c->set_recent_tokens(2 + static_cast<uint32_t>(rng() % 16));
      break;
    default:
      c->set_kind(v1::CachePolicy::KIND_H2O);
      c->set_heavy_ratio(0.2f);
      c->set_recent_ratio(0.2f);
      break;
  }
  return r;
}

void Prepare(grpc::ClientContext* ctx, const ClientConnection& connection) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  connection.Authorize(ctx);
}

// One stream from start to end; its checks recorded in `tally`.
void OneStream(v1::TextGeneration::Stub& stub, const ClientConnection& connection,
               const SoakOptions& o, std::mt19937_64& rng, const std::vector<std::string>& prompts,
               Tally* tally) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const v1::GenerateRequest req = RandomRequest(rng, o, prompts);
  const bool cancel = u(rng) < o.cancel_fraction;
  const int cancel_after = 1 + static_cast<int>(rng() % 8);
  const bool replay = !cancel && u(rng) < o.check_fraction;
  {
    std::lock_guard<std::mutex> lock(tally->mu);
    ++tally->started;
  }
  grpc::ClientContext ctx;
  Prepare(&ctx, connection);
  auto reader = stub.GenerateStream(&ctx, req);
  v1::GenerateStreamResponse msg;
  std::string id, text;
  std::vector<int32_t> ids;
  int messages = 0, finished = 0;
  bool finished_last = false, cancelled = false;
  uint32_t generated = 0;
  while (reader->Read(&msg)) {
    ++messages;
    if (messages == 1) id = msg.request_id();
    if (msg.request_id() != id) tally->Fail("request_id_changed", id + " -> " + msg.request_id());
    text += msg.text_delta();
    for (const v1::Token& t : msg.tokens()) ids.push_back(t.id());
    finished_last = msg.finished();
    if (msg.finished()) {
      ++finished;
      generated = msg.generated_tokens();
    }
    if (cancel && !cancelled && messages >= cancel_after) {
      ctx.TryCancel();
      cancelled = true;
    }
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) {
    if (cancelled && status.error_code() == grpc::StatusCode::CANCELLED) {
      std::lock_guard<std::mutex> lock(tally->mu);
      ++tally->cancelled;
      tally->tokens += static_cast<int64_t>(ids.size());
      return;
    }
    tally->Fail("status_" + std::to_string(status.error_code()), status.error_message());
    return;
  }
  if (finished != 1 || !finished_last) {
    tally->Fail("finished_messages", id + ": " + std::to_string(finished) + " finished messages");
  }
  if (ids.size() != generated) {
    tally->Fail("tokens_lost_or_duplicated", id + ": " + std::to_string(ids.size()) +
                                                 " tokens received, generated_tokens " +
                                                 std::to_string(generated));
  }
  if (static_cast<int32_t>(generated) > req.stopping().max_new_tokens()) {
    tally->Fail("over_max_new_tokens", id);
  }
  {
    std::lock_guard<std::mutex> lock(tally->mu);
    ++tally->finished;
    tally->tokens += static_cast<int64_t>(ids.size());
  }
  if (!replay) return;
  grpc::ClientContext uctx;
  Prepare(&uctx, connection);
  v1::GenerateResponse resp;
  const grpc::Status us = stub.Generate(&uctx, req, &resp);
  if (!us.ok()) {
    tally->Fail("replay_status_" + std::to_string(us.error_code()), us.error_message());
    return;
  }
  std::vector<int32_t> replay_ids;
  for (const v1::Token& t : resp.tokens()) replay_ids.push_back(t.id());
  if (replay_ids != ids || resp.text() != text) {
    tally->Fail("replay_differs", id + ": stream '" + text + "' vs unary '" + resp.text() + "'");
  }
  std::lock_guard<std::mutex> lock(tally->mu);
  ++tally->replayed;
}

}  // namespace

Status RunClientSoak(const ClientConnection& connection, const SoakOptions& o) {
  if (o.streams < 1) return InvalidArgument("--streams must be >= 1");
  if (!(o.seconds > 0)) return InvalidArgument("--seconds must be > 0");
  std::vector<std::string> prompts = kPrompts;
  if (!o.prompt_file.empty()) {
    std::ifstream in(o.prompt_file);
    if (!in) return NotFound("--prompt-file " + o.prompt_file + " cannot be read");
    prompts.clear();
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) prompts.push_back(line);
    }
    if (prompts.empty()) return InvalidArgument("--prompt-file " + o.prompt_file + " is empty");
  }
  auto stub = v1::TextGeneration::NewStub(connection.channel);
  Tally tally;
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point end =
      t0 + std::chrono::milliseconds(static_cast<int64_t>(o.seconds * 1e3));
  std::atomic<bool> stop{false};
  std::thread progress([&] {
    while (!stop.load()) {
      for (int i = 0; i < 300 && !stop.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      std::lock_guard<std::mutex> lock(tally.mu);
      int64_t failures = 0;
      for (const auto& [reason, n] : tally.failures) failures += n;
      std::fprintf(stderr,
                   "soak: %.0f s, %lld streams, %lld finished, %lld cancelled, %lld "
                   "failures\n",
                   std::chrono::duration<double>(Clock::now() - t0).count(),
                   static_cast<long long>(tally.started), static_cast<long long>(tally.finished),
                   static_cast<long long>(tally.cancelled), static_cast<long long>(failures));
    }
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < o.streams; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(o.seed * 1000003ull + static_cast<uint64_t>(i));
      while (Clock::now() < end) OneStream(*stub, connection, o, rng, prompts, &tally);
    });
  }
  for (std::thread& t : threads) t.join();
  stop = true;
  progress.join();

  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  nlohmann::json j;
  int64_t failures = 0;
  {
    std::lock_guard<std::mutex> lock(tally.mu);
    j["streams"] = o.streams;
    j["seconds"] = seconds;
    j["calls"] = tally.started;
    j["finished"] = tally.finished;
    j["cancelled"] = tally.cancelled;
    j["replayed_and_equal"] = tally.replayed;
    j["tokens"] = tally.tokens;
    j["tokens_per_second"] = static_cast<double>(tally.tokens) / std::max(seconds, 1e-9);
    for (const auto& [reason, n] : tally.failures) {
      j["failures"][reason] = n;
      failures += n;
    }
    j["failure_examples"] = tally.examples;
  }
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  if (failures > 0) {
    return Internal(std::to_string(failures) + " streams broke an invariant (see failures)");
  }
  return Status::Ok();
}

}  // namespace deja::cli
