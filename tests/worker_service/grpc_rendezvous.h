// RendezvousService hosted in a gRPC server on a free loopback port: the coordinator's side of
// rendezvous (its internal listener), as the tests need it.
#pragma once

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <memory>
#include <string>

#include "coordinator/rendezvous_service.h"

namespace deja::test_util {

class GrpcRendezvous {
 public:
  explicit GrpcRendezvous(uint32_t world, std::string group_secret = "",
                          coordinator::RendezvousLimits limits = {})
      : service_(world, std::move(group_secret), limits) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
  }
  ~GrpcRendezvous() {
    service_.Shutdown();
    server_->Shutdown();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::shared_ptr<grpc::Channel> Channel() const {
    return grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  }
  coordinator::RendezvousService& service() { return service_; }

 private:
  coordinator::RendezvousService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace deja::test_util
