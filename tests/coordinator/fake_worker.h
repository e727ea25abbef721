// FakeWorker: a deja.v1.Worker gRPC service on loopback that answers Step and GetStatus like a
// rank (token 7 for every sampled sequence) and can be told to hang, to hang its heartbeats,
// to report a fatal step, or to go away, for testing the coordinator's worker group. It can
// require the group secret like a real worker (RequireSecret).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "deja/v1/worker.grpc.pb.h"
#include "proto/internal_plane.h"

namespace deja::coordinator::test {

class FakeWorker final : public v1::Worker::Service {
 public:
  FakeWorker(int rank, int world, uint64_t epoch) : rank_(rank), world_(world), epoch_(epoch) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeWorker() override { Stop(); }

  void Stop() {
    if (!server_) return;
    hang_steps = false;
    hang_status = false;
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    server_.reset();
  }
  // Before the worker is registered: from then on calls without `secret` are UNAUTHENTICATED.
  void RequireSecret(const std::string& secret) {
    auth_ = std::make_unique<proto::GroupSecretCheck>(secret, "fake rank");
  }
  uint64_t refused() const { return auth_ ? auth_->refused() : 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  uint32_t pid() const { return 1000 + static_cast<uint32_t>(rank_); }

  std::atomic<bool> warmed_up{true};
  std::atomic<bool> hang_steps{false};
  std::atomic<bool> hang_status{false};
  std::atomic<bool> fatal_next{false};
  std::atomic<int> steps{0};
  std::atomic<bool> saw_shutdown{false};

  grpc::Status Step(grpc::ServerContext* ctx,
                    grpc::ServerReaderWriter<v1::StepResponse, v1::StepRequest>* stream) override {
    if (auth_) {
      if (grpc::Status a = auth_->Check(*ctx, "Worker.Step"); !a.ok()) return a;
    }
    v1::StepRequest req;
    while (stream->Read(&req)) {
      while (hang_steps.load() && !ctx->IsCancelled()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      v1::StepResponse resp;
      resp.set_step_id(req.step_id());
      resp.set_rank(static_cast<uint32_t>(rank_));
      if (rank_ == 0) {
        for (const v1::SequenceWork& w : req.sequences()) {
          v1::SequenceResult* r = resp.add_results();
          r->set_seq_id(w.seq_id());
          r->set_token_id(w.sample() ? 7 : -1);
        }
      }
      resp.mutable_kv()->set_total_bytes(1 << 20);
      if (fatal_next.exchange(false)) {
        resp.set_fatal(true);
        resp.set_error_code(13);
        resp.set_error_message("collective failed");
      }
      ++steps;
      if (req.shutdown()) saw_shutdown = true;
      if (!stream->Write(resp)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest*,
                         v1::WorkerStatus* st) override {
    if (auth_) {
      if (grpc::Status a = auth_->Check(*ctx, "Worker.GetStatus"); !a.ok()) return a;
    }
    while (hang_status.load() && !ctx->IsCancelled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    st->set_rank(static_cast<uint32_t>(rank_));
    st->set_world_size(static_cast<uint32_t>(world_));
    st->set_loaded(true);
    st->set_warmed_up(warmed_up.load());
    st->set_pid(pid());
    st->set_group_epoch(epoch_);
    st->mutable_kv()->set_total_bytes((1 << 20) + rank_);
    st->mutable_kv()->set_free_bytes(1 << 20);
    st->set_kv_bytes_per_token(100 + rank_);
    return grpc::Status::OK;
  }

 private:
  const int rank_;
  const int world_;
  const uint64_t epoch_;
  int port_ = 0;
  std::unique_ptr<proto::GroupSecretCheck> auth_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace deja::coordinator::test
