// Flags and set-up shared by the subcommands that load a model in this process.
#pragma once

#include <memory>
#include <string>

#include "cli/args.h"
#include "kernels/backend.h"
#include "worker/eviction_policy.h"
#include "worker/opt_model.h"
#include "worker/sampler.h"

namespace deja::cli {

void AddModelFlags(Args& args);
void AddSamplingFlags(Args& args);
StatusOr<worker::SamplingParams> SamplingFromFlags(const Args& args);

// --kv-policy (default `default_kind`, "" = unset), --heavy/recent-ratio, --heavy/recent-tokens.
void AddCachePolicyFlags(Args& args, const std::string& default_kind);
StatusOr<worker::CachePolicyConfig> CachePolicyFromFlags(const Args& args);

struct LoadedModel {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<worker::OptModel> model;
};
StatusOr<LoadedModel> LoadModelFromFlags(const Args& args);

// Reads a whole file; NotFound naming it.
StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace deja::cli
