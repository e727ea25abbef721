// The coordinator's internal listener (docs/serving.md#the-internal-plane): deja.v1.Rendezvous
// alone, on its own address, never on the public API port. No server reflection and no health
// service there, so it tells a stranger nothing about what it serves.
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "coordinator/rendezvous_service.h"

namespace deja::coordinator {

struct InternalServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// Listens on host:port (port 0: any free one) with `credentials`; UNAVAILABLE naming the address
// when it cannot.
StatusOr<InternalServer> StartInternalServer(const std::string& host, int port,
                                             RendezvousService* rendezvous,
                                             std::shared_ptr<grpc::ServerCredentials> credentials);

}  // namespace deja::coordinator
