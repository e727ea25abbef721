// Shared by the coordinator unit tests: the fixture model directory, a sink that records a
// request's output, and FakeEngineClient, an in-process stand-in for the worker group that
// "samples" from a script and checks the step protocol as a worker would.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/tokenizer.h"
#include "coordinator/engine_client.h"
#include "coordinator/request.h"

namespace deja::coordinator::test {

inline std::string ModelDir() {
  const char* src = std::getenv("DEJA_SOURCE_DIR");
  const std::filesystem::path root = src ? src : ".";
  if (std::filesystem::exists(root / "models/opt-mini/model.safetensors")) {
    return (root / "models/opt-mini").string();
  }
  return (root / "models/opt-tiny-postln").string();
}

inline std::unique_ptr<Tokenizer> LoadTokenizer() {
  StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(ModelDir());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

// Records every message and the error of one request.
class RecordingSink final : public RequestSink {
 public:
  void OnMessage(v1::GenerateStreamResponse message) override {
    std::lock_guard<std::mutex> lock(mu_);
    text_ += message.text_delta();
    messages_.push_back(std::move(message));
    if (messages_.back().finished()) done_ = true;
    cv_.notify_all();
  }
  void OnError(const Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = status;
    done_ = true;
    cv_.notify_all();
  }
  bool WaitDone(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return done_; });
  }
  bool done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  std::string text() const {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }
  Status error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  std::vector<v1::GenerateStreamResponse> messages() const {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  v1::GenerateStreamResponse last() const {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_.empty() ? v1::GenerateStreamResponse() : messages_.back();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::GenerateStreamResponse> messages_;
  std::string text_;
  Status error_;
  bool done_ = false;
};

// An in-process worker group. The n-th generated token of a sequence is token_fn(prompt, n)
// (by default script[n % script.size()]). Every step is checked like a worker checks it; the
// first violation is kept in protocol_error().
class FakeEngineClient final : public EngineClient {
 public:
  using TokenFn = std::function<int32_t(const std::vector<int32_t>& prompt, int n)>;

  explicit FakeEngineClient(std::vector<int32_t> script, int world = 2) : world_(world) {
    token_fn_ = [script](const std::vector<int32_t>&, int n) {
      return script[static_cast<size_t>(n) % script.size()];
    };
    state_.ready = true;
    state_.epoch = 1;
    state_.kv.total_bytes = 1 << 30;
    state_.kv.bytes_per_token = 1024;
  }

  int world_size() const override { return world_; }
  GroupState State() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return state_;
  }

  StatusOr<std::vector<v1::StepResponse>> Step(v1::StepRequest request) override {
    std::chrono::milliseconds delay;
    {
      std::lock_guard<std::mutex> lock(mu_);
      delay = delay_;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    std::lock_guard<std::mutex> lock(mu_);
    request.set_step_id(++step_id_);
    steps_.push_back(request);
    if (!state_.ready) return Unavailable("fake group not ready");
    if (!fail_next_.ok()) {
      Status s = fail_next_;
      fail_next_ = Status::Ok();
      state_.ready = false;
      state_.epoch = 0;
      seqs_.clear();
      return s;
    }
    std::vector<v1::StepResponse> out(world_);
    for (int r = 0; r < world_; ++r) {
      out[r].set_step_id(request.step_id());
      out[r].set_rank(r);
    }
    if (error_code_ != 0) {
      out[world_ - 1].set_error_code(error_code_);
      out[world_ - 1].set_error_message("injected");
      error_code_ = 0;
      return out;
    }
    for (uint64_t id : request.release_seq_ids()) seqs_.erase(id);
    for (const v1::SequenceWork& w : request.sequences()) {
      if (refuse_fn_ && refuse_fn_(w)) {
        // Refused as a worker refuses one sequence: every rank reports it, nothing changes.
        for (int r = 0; r < world_; ++r) {
          v1::SequenceResult* res = out[r].add_results();
          res->set_seq_id(w.seq_id());
          res->set_token_id(-1);
          res->set_error_code(static_cast<int>(StatusCode::kInvalidArgument));
          res->set_error_message("seq_id " + std::to_string(w.seq_id()) + ": injected");
        }
        continue;
      }
      Seq& s = seqs_[w.seq_id()];
      if (w.start_position() == 0) {
        if (!w.has_config()) Violation("seq " + std::to_string(w.seq_id()) + " has no config");
        s = Seq();
        s.prompt_len = static_cast<int>(w.config().prompt_tokens());
        s.top_n = w.config().top_n();
      } else if (s.prompt_len == 0) {
        Violation("seq " + std::to_string(w.seq_id()) + " continues but was never started");
      }
      if (static_cast<int>(w.start_position()) != static_cast<int>(s.tokens.size())) {
        Violation("seq " + std::to_string(w.seq_id()) + " position " +
                  std::to_string(w.start_position()) + " != " + std::to_string(s.tokens.size()));
      }
      s.tokens.insert(s.tokens.end(), w.tokens().begin(), w.tokens().end());
      v1::SequenceResult* res = out[0].add_results();
      res->set_seq_id(w.seq_id());
      res->set_token_id(-1);
      if (!w.sample()) continue;
      if (static_cast<int>(s.tokens.size()) < s.prompt_len) Violation("sampled inside prompt");
      std::vector<int32_t> prompt(s.tokens.begin(), s.tokens.begin() + s.prompt_len);
      const int n = static_cast<int>(s.tokens.size()) - s.prompt_len;
      res->set_token_id(token_fn_(prompt, n));
      res->set_logprob(-0.5f);
      for (uint32_t k = 0; k < s.top_n; ++k) {
        auto* t = res->add_top();
        t->set_id(static_cast<int32_t>(k));
        t->set_logprob(-1.0f - k);
      }
    }
    for (int r = 0; r < world_; ++r) out[r].mutable_kv()->set_sequences(seqs_.size());
    return out;
  }

  void SetTokenFn(TokenFn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    token_fn_ = std::move(fn);
  }
  // Sequences for which `fn` holds are refused by every rank (their SequenceResult carries an
  // error) and left as they were.
  void SetRefuseFn(std::function<bool(const v1::SequenceWork&)> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_fn_ = std::move(fn);
  }
  void SetReady(bool ready, uint64_t epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    state_.ready = ready;
    state_.epoch = epoch;
    if (!ready) seqs_.clear();
  }
  void SetKv(uint64_t total_bytes, uint64_t bytes_per_token) {
    std::lock_guard<std::mutex> lock(mu_);
    state_.kv.total_bytes = total_bytes;
    state_.kv.bytes_per_token = bytes_per_token;
  }
  void SetDelay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> lock(mu_);
    delay_ = d;
  }
  // The next step fails as a lost group does.
  void LoseGroupAtNextStep() {
    std::lock_guard<std::mutex> lock(mu_);
    fail_next_ = Unavailable("rank 1: Step stream closed");
  }
  // The next step reports a rank error.
  void ErrorAtNextStep(int code) {
    std::lock_guard<std::mutex> lock(mu_);
    error_code_ = code;
  }
  size_t live_sequences() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seqs_.size();
  }
  std::vector<v1::StepRequest> steps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  std::string protocol_error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return violation_;
  }

 private:
  struct Seq {
    int prompt_len = 0;
    uint32_t top_n = 0;
    std::vector<int32_t> tokens;
  };
  void Violation(const std::string& what) {
    if (violation_.empty()) violation_ = what;
  }

  const int world_;
  mutable std::mutex mu_;
  GroupState state_;
  TokenFn token_fn_;
  std::function<bool(const v1::SequenceWork&)> refuse_fn_;
  std::map<uint64_t, Seq> seqs_;
  std::vector<v1::StepRequest> steps_;
  uint64_t step_id_ = 0;
  std::chrono::milliseconds delay_{0};
  Status fail_next_;
  int error_code_ = 0;
  std::string violation_;
};

}  // namespace deja::coordinator::test
