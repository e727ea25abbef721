#include "worker/service/grpc_store.h"

#include <grpcpp/client_context.h>

#include <algorithm>

#include "proto/grpc_status.h"
#include "proto/internal_plane.h"

namespace deja::worker::service {
namespace {

void SetDeadline(grpc::ClientContext& ctx, std::chrono::milliseconds d) {
  ctx.set_deadline(std::chrono::system_clock::now() + d);
}

// The server enforces the store's timeout; the RPC deadline adds a margin for the network. A
// non-positive timeout waits as long as the server allows (RendezvousLimits::max_wait), so the
// deadline is then a day.
std::chrono::milliseconds RpcBound(std::chrono::milliseconds timeout,
                                   std::chrono::milliseconds extra) {
  if (timeout.count() <= 0) return std::chrono::hours(24);
  return timeout + extra;
}

}  // namespace

GrpcStore::GrpcStore(std::shared_ptr<grpc::Channel> channel, std::chrono::milliseconds rpc_timeout,
                     std::string group_secret)
    : stub_(deja::v1::Rendezvous::NewStub(std::move(channel))),
      rpc_timeout_(rpc_timeout),
      group_secret_(std::move(group_secret)) {}

Status GrpcStore::Set(const std::string& key, std::string_view value) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, rpc_timeout_);
  proto::AttachGroupSecret(&ctx, group_secret_);
  deja::v1::SetRequest req;
  req.set_key(key);
  req.set_value(std::string(value));
  deja::v1::SetResponse resp;
  return proto::FromGrpc(stub_->Set(&ctx, req, &resp)).WithContext("rendezvous Set " + key);
}

StatusOr<std::string> GrpcStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, RpcBound(timeout, rpc_timeout_));
  proto::AttachGroupSecret(&ctx, group_secret_);
  deja::v1::GetRequest req;
  req.set_key(key);
  req.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(timeout.count(), 0)));
  deja::v1::GetResponse resp;
  DEJA_RETURN_IF_ERROR(
      proto::FromGrpc(stub_->Get(&ctx, req, &resp)).WithContext("rendezvous Get"));
  return std::move(*resp.mutable_value());
}

Status GrpcStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, RpcBound(timeout, rpc_timeout_));
  proto::AttachGroupSecret(&ctx, group_secret_);
  deja::v1::WaitRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  req.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(timeout.count(), 0)));
  deja::v1::WaitResponse resp;
  return proto::FromGrpc(stub_->Wait(&ctx, req, &resp)).WithContext("rendezvous Wait");
}

}  // namespace deja::worker::service
