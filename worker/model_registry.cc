// The architectures LoadModel can build, keyed by config.json's `model_type`, and the plug-ins
// a model is built with (Deja Vu's runtime for EnableSparsity). It sits above worker/model/ and
// worker/dejavu/, so neither includes the other's implementation. Adding an architecture is a
// file pair implementing Model and a line in kArchitectures.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "common/mmap_file.h"
#include "common/opt_config.h"
#include "worker/dejavu/sparse_runtime.h"
#include "worker/model/model.h"
#include "worker/model/opt_model.h"

namespace deja::worker::model {
namespace {

using LoadFn = StatusOr<std::unique_ptr<Model>> (*)(const std::string& dir,
                                                    kernels::Backend* backend,
                                                    std::unique_ptr<comm::Communicator> comm,
                                                    const LoadOptions& options);

template <typename M>
StatusOr<std::unique_ptr<Model>> LoadAs(const std::string& dir, kernels::Backend* backend,
                                        std::unique_ptr<comm::Communicator> comm,
                                        const LoadOptions& options) {
  DEJA_ASSIGN_OR_RETURN(std::unique_ptr<M> m, M::Load(dir, backend, std::move(comm), options));
  return std::unique_ptr<Model>(std::move(m));
}

struct Architecture {
  const char* model_type;
  LoadFn load;
};

constexpr Architecture kArchitectures[] = {
    {"opt", &LoadAs<OptModel>},
};

// config.json's model_type ("opt" when the field is absent, as in older OPT exports).
StatusOr<std::string> ReadModelType(const std::string& path) {
  const std::string file = ConfigJsonPath(path);
  DEJA_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(file));
  std::string_view text(reinterpret_cast<const char*>(mapped.data()), mapped.size());
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(file + ": invalid JSON");
  if (!j.is_object()) return InvalidArgument(file + ": not a JSON object");
  auto it = j.find("model_type");
  if (it == j.end() || it->is_null()) return std::string("opt");
  if (!it->is_string()) return InvalidArgument(file + ": field 'model_type' is not a string");
  return it->get<std::string>();
}

}  // namespace

std::string RegisteredModelTypes() {
  std::string out;
  for (const Architecture& a : kArchitectures) {
    if (!out.empty()) out += ", ";
    out += a.model_type;
  }
  return out;
}

StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, kernels::Backend* backend,
                                           std::unique_ptr<comm::Communicator> comm,
                                           const LoadOptions& options) {
  DEJA_ASSIGN_OR_RETURN(std::string type, ReadModelType(dir));
  LoadOptions with = options;
  if (!with.sparsity) with.sparsity = dejavu::SparseRuntime::Factory();
  for (const Architecture& a : kArchitectures) {
    if (type == a.model_type) return a.load(dir, backend, std::move(comm), with);
  }
  return InvalidArgument(dir + ": config field 'model_type' is '" + type + "'; this build serves " +
                         RegisteredModelTypes());
}

}  // namespace deja::worker::model
