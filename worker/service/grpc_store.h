// GrpcStore: comm::KeyValueStore over the coordinator's deja.v1.Rendezvous service, so Gloo's
// rendezvous (and NCCL's unique id) goes through the coordinator with no shared filesystem.
#pragma once

#include <grpcpp/channel.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "deja/v1/worker.grpc.pb.h"
#include "worker/comm/key_value_store.h"

namespace deja::worker::service {

class GrpcStore final : public comm::KeyValueStore {
 public:
  // `rpc_timeout` bounds Set; Get and Wait get their own timeout plus this much for the RPC.
  // `group_secret` goes with every call (the coordinator refuses calls without it).
  explicit GrpcStore(std::shared_ptr<grpc::Channel> channel,
                     std::chrono::milliseconds rpc_timeout = std::chrono::seconds(10),
                     std::string group_secret = "");

  Status Set(const std::string& key, std::string_view value) override;
  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::unique_ptr<deja::v1::Rendezvous::Stub> stub_;
  std::chrono::milliseconds rpc_timeout_;
  std::string group_secret_;
};

}  // namespace deja::worker::service
