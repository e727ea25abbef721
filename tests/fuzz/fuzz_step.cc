// Fuzzes the worker's step handling: the input is a sequence of deja.v1.StepRequest messages,
// each as a varint length then that many bytes (a short last record takes what is left), run in
// order through one StepEngine on the tiny model (64 tokens, 32 positions, oracle sparsity), so
// sequences started by one step are continued, released and refused by the next ones; then the
// same steps through a second engine whose KV is a block pool (the worker's --kv-paging on). A step
// of more than kMaxStepTokens tokens is skipped to keep an execution cheap; at most kMaxSteps run.
// The paged engine also keeps a prefix cache (memory and host tiers), so the steps' prefix
// operations and sequences started from cached blocks run there.
//
// Invariants, checked against a shadow of the sequences the engine should hold:
// - Run never fails (a single rank has no collective to lose), answers the step's id and has one
//   result per sequence, in order.
// - A refused sequence (its result's error code and a message naming it) is left as it was: a
//   new one is not created, a known one keeps its length.
// - An accepted sequence is new to the shadow when it starts, or continues a known one at its
//   length, within prompt_tokens + max_new_tokens. Its result has a sampled in-vocabulary token
//   with logprob <= 0 and ordered alternatives when asked to sample (-1 otherwise), and a
//   log-softmax row per token for all_logits.
// - The engine holds exactly the shadow's sequences after every step, and releasing them all at
//   the end (and dropping every prefix block an operation named) returns the KV budget whole,
//   with nothing cached.
#include <google/protobuf/stubs/logging.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "deja/v1/worker.pb.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tiny_model.h"
#include "worker/service/step_engine.h"

namespace deja::fuzz {
namespace {

constexpr int kMaxSteps = 16;
constexpr int kMaxStepTokens = 128;
// KV for three full-length sequences: enough for batches, small enough to run out.
constexpr int64_t kBudgetPositions = 3 * kTinyOpt.positions;

struct ShadowSeq {
  uint32_t length = 0;
  uint64_t max_tokens = 0;
};

TinyModel& Model() {
  static TinyModel m = LoadTinyModel(kTinyOpt, "tiny");
  return m;
}

uint64_t BytesPerToken() {
  static const uint64_t per_token = [] {
    auto e = worker::service::StepEngine::Create(Model().model.get(), 1);
    return e.ok() ? (*e)->kv_bytes_per_token() : 0;
  }();
  return per_token;
}

// The same model with its KV in a pool of the same budget (whole blocks of it).
TinyModel& PagedModel() {
  static TinyModel m = LoadTinyModel(kTinyOpt, "tiny_paged",
                                     static_cast<int64_t>(BytesPerToken() * kBudgetPositions));
  return m;
}

// Reads one record; false at the end of the input.
bool NextRecord(const uint8_t** data, size_t* size, std::string* out) {
  if (*size == 0) return false;
  uint64_t length = 0;
  int shift = 0;
  while (*size > 0 && shift < 35) {
    const uint8_t b = **data;
    ++*data;
    --*size;
    length |= static_cast<uint64_t>(b & 0x7F) << shift;
    shift += 7;
    if ((b & 0x80) == 0) break;
  }
  const size_t n = static_cast<size_t>(std::min<uint64_t>(length, *size));
  out->assign(reinterpret_cast<const char*>(*data), n);
  *data += n;
  *size -= n;
  return true;
}

void CheckResult(const v1::SequenceWork& w, const v1::SequenceResult& r) {
  const int64_t vocab = kTinyOpt.vocab;
  FUZZ_CHECK(r.seq_id() == w.seq_id());
  if (w.sample()) {
    FUZZ_CHECK(r.token_id() >= 0 && r.token_id() < vocab);
    FUZZ_CHECK_MSG(!std::isnan(r.logprob()) && r.logprob() <= 1e-4f, std::to_string(r.logprob()));
  } else {
    FUZZ_CHECK(r.token_id() == -1 && r.top_size() == 0);
  }
  for (int i = 0; i < r.top_size(); ++i) {
    FUZZ_CHECK(r.top(i).id() >= 0 && r.top(i).id() < vocab);
    FUZZ_CHECK(i == 0 || r.top(i - 1).logprob() >= r.top(i).logprob());
  }
  if (w.want_all_logits()) {
    FUZZ_CHECK(r.all_logprobs_size() == w.tokens_size() * vocab);
    for (int row = 0; row < w.tokens_size(); ++row) {
      double sum = 0.0;
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(r.all_logprobs(row * vocab + i));
      FUZZ_CHECK_MSG(std::abs(sum - 1.0) < 1e-3, std::to_string(sum));
    }
  } else {
    FUZZ_CHECK(r.all_logprobs_size() == 0);
  }
}

// Runs one step and checks it against (and updates) the shadow.
void RunStep(worker::service::StepEngine& engine, const v1::StepRequest& req,
             std::map<uint64_t, ShadowSeq>* shadow) {
  for (uint64_t id : req.release_seq_ids()) shadow->erase(id);
  v1::StepResponse resp;
  Status fatal = engine.Run(req, &resp);
  FUZZ_CHECK_MSG(fatal.ok(), fatal.ToString());
  FUZZ_CHECK(!resp.fatal() && resp.error_code() == 0);
  FUZZ_CHECK(resp.step_id() == req.step_id() && resp.rank() == 0);
  FUZZ_CHECK(resp.kv().free_bytes() <= resp.kv().total_bytes());
  FUZZ_CHECK(resp.results_size() == req.sequences_size());
  for (int i = 0; i < req.sequences_size(); ++i) {
    const v1::SequenceWork& w = req.sequences(i);
    const v1::SequenceResult& r = resp.results(i);
    FUZZ_CHECK(r.seq_id() == w.seq_id());
    if (r.error_code() != 0) {
      // Refused before the forward pass (INTERNAL, a failed sampling after it, needs logits
      // that are not finite, which the tiny model does not produce).
      FUZZ_CHECK_MSG(r.error_code() > 0 && r.error_code() <= 16 &&
                         r.error_code() != static_cast<int>(StatusCode::kInternal),
                     r.error_message());
      FUZZ_CHECK(r.error_message().find("seq_id " + std::to_string(w.seq_id())) !=
                 std::string::npos);
      FUZZ_CHECK(r.token_id() == -1 && r.top_size() == 0 && r.all_logprobs_size() == 0);
      continue;
    }
    for (int32_t t : w.tokens()) FUZZ_CHECK(t >= 0 && t < kTinyOpt.vocab);
    auto it = shadow->find(w.seq_id());
    if (w.start_position() == 0 || w.has_config()) {
      FUZZ_CHECK_MSG(it == shadow->end(), "restarted seq_id " + std::to_string(w.seq_id()));
      const uint64_t max_tokens =
          static_cast<uint64_t>(w.config().prompt_tokens()) + w.config().max_new_tokens();
      FUZZ_CHECK(max_tokens <= static_cast<uint64_t>(kTinyOpt.positions));
      // A sequence from cached blocks starts after them.
      FUZZ_CHECK(w.start_position() == 0 || w.config().prefix_blocks_size() > 0);
      it = shadow->emplace(w.seq_id(), ShadowSeq{w.start_position(), max_tokens}).first;
    } else {
      FUZZ_CHECK_MSG(it != shadow->end(), "continued unknown seq_id " + std::to_string(w.seq_id()));
      FUZZ_CHECK(it->second.length == w.start_position());
    }
    it->second.length += static_cast<uint32_t>(w.tokens_size());
    FUZZ_CHECK(it->second.length <= it->second.max_tokens);
    CheckResult(w, r);
  }
  FUZZ_CHECK_MSG(resp.kv().sequences() == shadow->size(), resp.kv().ShortDebugString());
}

}  // namespace
}  // namespace deja::fuzz

namespace deja::fuzz {
namespace {

void RunAll(worker::model::Model* model, uint64_t budget, const uint8_t* data, size_t size) {
  std::unique_ptr<worker::prefix::PrefixStore> store;
  if (model->kv_pool() != nullptr) {
    store = std::make_unique<worker::prefix::PrefixStore>(model->kv_pool(), nullptr);
  }
  auto engine = worker::service::StepEngine::Create(model, budget, std::move(store));
  FUZZ_CHECK_MSG(engine.ok(), engine.status().ToString());
  std::set<uint64_t> blocks;  // every prefix block an operation named

  std::map<uint64_t, ShadowSeq> shadow;
  std::string record;
  for (int steps = 0; steps < kMaxSteps && NextRecord(&data, &size, &record);) {
    v1::StepRequest req;
    if (!req.ParseFromString(record)) continue;
    int tokens = 0;
    for (const v1::SequenceWork& w : req.sequences()) tokens += w.tokens_size();
    if (tokens > kMaxStepTokens) continue;
    for (const v1::PrefixOp& op : req.prefix_ops()) blocks.insert(op.block_id());
    RunStep(**engine, req, &shadow);
    ++steps;
  }

  v1::StepRequest release;
  release.set_step_id(1u << 31);
  for (const auto& [id, seq] : shadow) release.add_release_seq_ids(id);
  for (uint64_t id : blocks) {
    v1::PrefixOp* op = release.add_prefix_ops();
    op->set_kind(v1::PrefixOp::KIND_DROP);
    op->set_block_id(id);
  }
  v1::StepResponse resp;
  FUZZ_CHECK((*engine)->Run(release, &resp).ok() && resp.error_code() == 0);
  FUZZ_CHECK_MSG(resp.kv().free_bytes() == resp.kv().total_bytes() && resp.kv().sequences() == 0 &&
                     resp.kv().cached_tokens() == 0,
                 resp.kv().ShortDebugString());
}

}  // namespace
}  // namespace deja::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  deja::fuzz::QuietLogging();
  google::protobuf::SetLogHandler(nullptr);
  (void)deja::fuzz::Model();
  (void)deja::fuzz::PagedModel();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deja::fuzz;
  FUZZ_CHECK(BytesPerToken() > 0);
  RunAll(Model().model.get(), BytesPerToken() * kBudgetPositions, data, size);
  deja::worker::model::Model* paged = PagedModel().model.get();
  FUZZ_CHECK(paged->kv_block_slots() > 0);
  RunAll(paged, static_cast<uint64_t>(paged->kv_pool_bytes()), data, size);
  return 0;
}
