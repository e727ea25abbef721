// Fuzzes request validation from arbitrary bytes, on the path the TextGeneration handlers take:
// the bytes as a gRPC ByteBuffer through ParseGenerateRequest (wire check for UTF-8, then the
// protobuf parse), then ResolveRequest against opt-mini's limits and tokenizer, twice (a server
// without predictors and the full-cache default; one with predictors, sparsity on by default and
// an H2O default). The same bytes also go through Tokenize's, Cancel's and GetModelInfo's parsers.
// What the coordinator resolves is then started on a worker the way the scheduler starts it (the
// first prefill chunk with the resolved config) on a model with opt-mini's vocabulary and
// positions.
//
// Invariants:
// - Refusals are INVALID_ARGUMENT (FAILED_PRECONDITION for sparsity without predictors) with a
//   message; the wire check never refuses a message protobuf parses whose strings are UTF-8.
// - A resolved request is complete and inside the limits: a prompt of 1 to max_positions - 1
//   in-vocabulary ids (BOS first for text), 1 <= max_new_tokens <= the room left, sampling values
//   in range, at most 4 stop sequences and 16 stop ids, top_n <= 5, a known cache kind whose
//   bounded budgets (recent >= 1) stay below the sequence's length, sparsity only with predictors.
// - A worker accepts it, and reserves exactly the KV positions the coordinator accounts for it.
// - On a worker whose KV is a block pool (--kv-paging on), the whole request runs: its prompt in
//   chunks split as the scheduler splits them (never across a locret chunk), then decode steps;
//   every step accepts it (a decayed H2O cache within its budget once failed the step).
// - Tokenize encodes whatever text parses (it is UTF-8) into in-vocabulary ids.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cmath>
#include <memory>
#include <string>

#include "common/enum_table.h"
#include "common/tokenizer.h"
#include "common/utf8.h"
#include "coordinator/validation.h"
#include "coordinator/wire_check.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tiny_model.h"
#include "worker/kv/policy_table.h"
#include "worker/service/step_engine.h"

namespace deja::fuzz {
namespace {

using coordinator::ModelLimits;
using coordinator::ResolvedRequest;

// The largest prefill chunk sent to the worker here (the scheduler's is larger; the worker's
// checks of a first chunk do not depend on its length).
constexpr int32_t kChunk = 16;

// opt-mini's limits as the coordinator sets them (config.json and `deja serve`'s defaults).
ModelLimits PlainLimits() {
  ModelLimits l;
  l.vocab_size = static_cast<int32_t>(kWideOpt.vocab);
  l.max_positions = static_cast<int32_t>(kWideOpt.positions);
  l.bos_id = 2;
  l.eos_id = 2;
  l.default_max_new_tokens = 256;
  return l;
}

ModelLimits SparseLimits() {
  ModelLimits l = PlainLimits();
  l.sparsity_available = true;
  l.sparsity_default = true;
  l.sparsity_schedules = {"default"};
  l.locret_available = true;
  l.locret_chunk = kChunk;
  l.default_cache.set_kind(v1::CachePolicy::KIND_H2O);
  l.default_cache.set_heavy_ratio(0.2f);
  l.default_cache.set_recent_tokens(8);
  return l;
}

TinyModel& Worker() {
  static TinyModel m = LoadTinyModel(kWideOpt, "wide");
  return m;
}

// The same model with its KV in a block pool of two full-length sequences.
uint64_t WideBytesPerToken();
TinyModel& PagedWorker() {
  static TinyModel m = LoadTinyModel(kWideOpt, "wide_paged",
                                     static_cast<int64_t>(WideBytesPerToken() * 2 *
                                                          kWideOpt.positions));
  return m;
}

bool StringsAreUtf8(const v1::GenerateRequest& r) {
  auto ok = [](const std::string& s) { return FindInvalidUtf8(s) == kUtf8Valid; };
  bool all = ok(r.request_id()) && ok(r.text()) && ok(r.sparsity().schedule());
  for (const std::string& s : r.stopping().stop_sequences()) all = all && ok(s);
  return all;
}

void CheckResolved(const v1::GenerateRequest& req, const ResolvedRequest& r,
                   const ModelLimits& limits) {
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  FUZZ_CHECK(prompt >= 1 && prompt < limits.max_positions);
  for (int32_t id : r.prompt) FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
  FUZZ_CHECK(r.text_prompt == req.has_text());
  if (r.text_prompt) FUZZ_CHECK(r.prompt[0] == Tok().bos_id());
  FUZZ_CHECK(r.max_new_tokens >= 1 && r.max_new_tokens <= limits.max_positions - prompt);
  FUZZ_CHECK(r.request_id == req.request_id());

  const v1::WorkerSampling& s = r.config.sampling();
  FUZZ_CHECK(std::isfinite(s.temperature()) && s.temperature() >= 0.f);
  FUZZ_CHECK(!s.do_sample() || s.temperature() > 0.f);
  FUZZ_CHECK(s.top_k() >= 0 && s.top_p() > 0.f && s.top_p() <= 1.f);
  FUZZ_CHECK(std::isfinite(s.repetition_penalty()) && s.repetition_penalty() > 0.f);

  FUZZ_CHECK(r.stop_sequences.size() <= coordinator::kMaxStopSequences);
  for (const std::string& stop : r.stop_sequences) {
    FUZZ_CHECK(!stop.empty() && stop.size() <= coordinator::kMaxStopSequenceBytes &&
               FindInvalidUtf8(stop) == kUtf8Valid);
  }
  FUZZ_CHECK(r.stop_token_ids.size() <= coordinator::kMaxStopTokenIds);
  for (int32_t id : r.stop_token_ids) FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
  FUZZ_CHECK(r.top_n <= coordinator::kMaxTopNTokens && r.config.top_n() == r.top_n);
  FUZZ_CHECK(!r.logprobs || r.return_tokens);

  const v1::WorkerCachePolicy& cache = r.config.cache();
  const worker::kv::CachePolicyRow* row =
      FindRow(worker::kv::CachePolicyTable(), &worker::kv::CachePolicyRow::wire, cache.kind());
  FUZZ_CHECK(row != nullptr && row->bounded == r.BoundedCache());
  const uint64_t length = static_cast<uint64_t>(prompt) + r.max_new_tokens;
  if (row->bounded) {
    FUZZ_CHECK(cache.recent_tokens() >= 1);
    FUZZ_CHECK(row->heavy_hitters || cache.heavy_tokens() == 0);
    FUZZ_CHECK(static_cast<uint64_t>(cache.heavy_tokens()) + cache.recent_tokens() < length);
  } else {
    FUZZ_CHECK(cache.heavy_tokens() == 0 && cache.recent_tokens() == 0);
  }
  FUZZ_CHECK(r.ReservedPositions() >= 1 && static_cast<uint64_t>(r.ReservedPositions()) <= length);
  FUZZ_CHECK(r.PositionsAfterPrefill() >= 1 && r.PositionsAfterPrefill() <= r.ReservedPositions());
  FUZZ_CHECK(!r.config.sparse() || limits.sparsity_available);
  FUZZ_CHECK(r.config.prompt_tokens() == static_cast<uint32_t>(prompt));
  FUZZ_CHECK(r.config.max_new_tokens() == static_cast<uint32_t>(r.max_new_tokens));
}

uint64_t WideBytesPerToken() {
  static const uint64_t per_token = [] {
    auto e = worker::service::StepEngine::Create(Worker().model.get(), 1);
    return e.ok() ? (*e)->kv_bytes_per_token() : 0;
  }();
  return per_token;
}

// The whole request on the paged worker: prompt chunks of at most kChunk tokens (a locret one
// never crossing a multiple of its chunk_tokens, as the scheduler sends it), then up to four
// decode steps; every step must accept the sequence.
void RunOnPagedWorker(const ResolvedRequest& r) {
  TinyModel& m = PagedWorker();
  auto engine = worker::service::StepEngine::Create(
      m.model.get(), static_cast<uint64_t>(m.model->kv_pool_bytes()));
  FUZZ_CHECK_MSG(engine.ok(), engine.status().ToString());
  const int32_t prompt = static_cast<int32_t>(r.prompt.size());
  const uint32_t every = r.config.cache().kind() == v1::WorkerCachePolicy::KIND_LOCRET
                             ? r.config.cache().chunk_tokens()
                             : 0;
  int32_t done = 0;
  uint64_t step = 1;
  auto run = [&](const int32_t* tokens, int32_t n, bool first, bool sample) {
    v1::StepRequest req;
    req.set_step_id(step++);
    v1::SequenceWork* w = req.add_sequences();
    w->set_seq_id(1);
    w->mutable_tokens()->Add(tokens, tokens + n);
    w->set_start_position(static_cast<uint32_t>(done));
    if (first) *w->mutable_config() = r.config;
    w->set_sample(sample);
    v1::StepResponse resp;
    Status fatal = (*engine)->Run(req, &resp);
    FUZZ_CHECK_MSG(fatal.ok(), fatal.ToString());
    FUZZ_CHECK_MSG(resp.error_code() == 0 && resp.results_size() == 1, resp.error_message());
    FUZZ_CHECK_MSG(resp.results(0).error_code() == 0,
                   "step " + std::to_string(step - 1) + " at " + std::to_string(done) + ": " +
                       resp.results(0).error_message() + "\nconfig: " +
                       r.config.ShortDebugString());
    done += n;
    return resp.results(0).token_id();
  };
  int32_t token = -1;
  while (done < prompt) {
    int32_t n = std::min(prompt - done, kChunk);
    if (every > 0) n = std::min<int32_t>(n, static_cast<int32_t>(every - done % every));
    token = run(r.prompt.data() + done, n, done == 0, done + n == prompt);
  }
  for (int32_t i = 0; i < std::min(4, r.max_new_tokens - 1); ++i) {
    FUZZ_CHECK(token >= 0 && token < kWideOpt.vocab);
    token = run(&token, 1, false, true);
  }
}

// The first prefill chunk as the scheduler sends it; the worker must accept it and reserve what
// the coordinator accounts for.
void CheckOnWorker(const ResolvedRequest& r) {
  TinyModel& m = Worker();
  const uint64_t per_token = WideBytesPerToken();
  FUZZ_CHECK(per_token > 0);
  auto engine = worker::service::StepEngine::Create(m.model.get(), per_token * kWideOpt.positions);
  FUZZ_CHECK_MSG(engine.ok(), engine.status().ToString());
  const int32_t prompt = static_cast<int32_t>(r.prompt.size());
  const int32_t chunk = std::min(prompt, kChunk);
  v1::StepRequest req;
  req.set_step_id(1);
  v1::SequenceWork* w = req.add_sequences();
  w->set_seq_id(1);
  w->mutable_tokens()->Add(r.prompt.begin(), r.prompt.begin() + chunk);
  w->set_start_position(0);
  *w->mutable_config() = r.config;
  w->set_sample(chunk == prompt);
  v1::StepResponse resp;
  Status fatal = (*engine)->Run(req, &resp);
  FUZZ_CHECK_MSG(fatal.ok(), fatal.ToString());
  FUZZ_CHECK_MSG(resp.error_code() == 0 && resp.results_size() == 1, resp.error_message());
  FUZZ_CHECK_MSG(resp.results(0).error_code() == 0,
                 resp.results(0).error_message() + "\nconfig: " + r.config.ShortDebugString());
  const uint64_t reserved = resp.kv().total_bytes() - resp.kv().free_bytes();
  const int64_t positions = chunk == prompt ? r.PositionsAfterPrefill() : r.ReservedPositions();
  FUZZ_CHECK_MSG(reserved == per_token * static_cast<uint64_t>(positions),
                 "worker reserved " + std::to_string(reserved / per_token) +
                     " positions, the coordinator accounts " + std::to_string(positions) +
                     "; config " + r.config.ShortDebugString());
  if (chunk == prompt) {
    FUZZ_CHECK(resp.results(0).token_id() >= 0 && resp.results(0).token_id() < kWideOpt.vocab);
  }
  RunOnPagedWorker(r);
}

void CheckGenerate(const grpc::ByteBuffer& buffer, const uint8_t* data, size_t size) {
  StatusOr<v1::GenerateRequest> parsed = coordinator::ParseGenerateRequest(buffer);
  v1::GenerateRequest raw;
  const bool raw_ok = raw.ParseFromArray(data, static_cast<int>(size));
  if (!parsed.ok()) {
    FUZZ_CHECK_MSG(parsed.status().code() == StatusCode::kInvalidArgument,
                   parsed.status().ToString());
    FUZZ_CHECK(!parsed.status().message().empty());
    FUZZ_CHECK_MSG(!raw_ok || !StringsAreUtf8(raw), parsed.status().ToString());
    return;
  }
  FUZZ_CHECK(raw_ok && parsed->SerializeAsString() == raw.SerializeAsString());
  static const ModelLimits plain = PlainLimits();
  static const ModelLimits sparse = SparseLimits();
  for (const ModelLimits* limits : {&plain, &sparse}) {
    StatusOr<ResolvedRequest> r = coordinator::ResolveRequest(*parsed, *limits, Tok(), 1234);
    if (!r.ok()) {
      const StatusCode code = r.status().code();
      FUZZ_CHECK_MSG(code == StatusCode::kInvalidArgument ||
                         (code == StatusCode::kFailedPrecondition &&
                          (!limits->sparsity_available || !limits->locret_available)),
                     r.status().ToString());
      FUZZ_CHECK(!r.status().message().empty());
      continue;
    }
    CheckResolved(*parsed, *r, *limits);
    CheckOnWorker(*r);
  }
}

void CheckTokenize(const grpc::ByteBuffer& buffer) {
  StatusOr<v1::TokenizeRequest> parsed = coordinator::ParseTokenizeRequest(buffer);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
    return;
  }
  StatusOr<std::vector<int32_t>> ids = Tok().Encode(parsed->text(), parsed->add_bos());
  FUZZ_CHECK_MSG(ids.ok(), ids.status().ToString());
  for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < Tok().vocab_size());
}

}  // namespace
}  // namespace deja::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  deja::fuzz::QuietLogging();
  // protobuf logs every string field that is not UTF-8 it meets while parsing.
  google::protobuf::SetLogHandler(nullptr);
  (void)deja::fuzz::Tok();
  (void)deja::fuzz::Worker();
  (void)deja::fuzz::PagedWorker();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deja;
  grpc::Slice slice(data, size);
  const grpc::ByteBuffer buffer(&slice, 1);
  fuzz::CheckGenerate(buffer, data, size);
  fuzz::CheckTokenize(buffer);
  for (const Status& s : {coordinator::ParseCancelRequest(buffer).status(),
                          coordinator::ParseGetModelInfoRequest(buffer).status()}) {
    FUZZ_CHECK(s.ok() || s.code() == StatusCode::kInvalidArgument);
  }
  return 0;
}
