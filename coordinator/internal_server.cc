#include "coordinator/internal_server.h"

#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/server_builder.h>

namespace deja::coordinator {
namespace {

// Server reflection registers itself as a plugin of every ServerBuilder of the process once the
// public server enabled it; this option drops the plugins of the one builder it is given to.
class WithoutPlugins final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->clear();
  }
};

}  // namespace

StatusOr<InternalServer> StartInternalServer(const std::string& host, int port,
                                             RendezvousService* rendezvous,
                                             std::shared_ptr<grpc::ServerCredentials> credentials) {
  InternalServer out;
  grpc::ServerBuilder builder;
  const std::string address = host + ":" + std::to_string(port);
  builder.AddListeningPort(address, std::move(credentials), &out.port);
  // A port another process holds is an error, not a shared listener.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetOption(std::make_unique<WithoutPlugins>());
  // The default health service is process-wide too; a null one disables it here.
  builder.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
  builder.RegisterService(rendezvous);
  out.server = builder.BuildAndStart();
  if (!out.server || out.port == 0) {
    return Unavailable("cannot listen on the internal address " + address +
                       " (in use, or not an address of this host)");
  }
  return out;
}

}  // namespace deja::coordinator
