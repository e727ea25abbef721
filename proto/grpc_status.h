// Conversions between deja's Status and grpc::Status at the service boundary. The codes are the
// same numbers (both follow google.rpc.Code), so only the types change.
#pragma once

#include <grpcpp/support/status.h>

#include "common/status.h"

namespace deja::proto {

inline grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

inline Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(s.error_code()), s.error_message());
}

}  // namespace deja::proto
