// A small flag parser for the deja subcommands: --name VALUE or --name=VALUE, boolean flags,
// typed accessors with errors naming the flag, and generated --help text.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace deja::cli {

class Args {
 public:
  Args(std::string command, std::string summary)
      : command_(std::move(command)), summary_(std::move(summary)) {}

  // Declares a flag. `def` empty and `required` false means optional with no default.
  Args& Flag(const std::string& name, const std::string& help, const std::string& def = "",
             bool required = false);
  Args& Bool(const std::string& name, const std::string& help);

  // Parses argv[first..]; InvalidArgument on unknown flags or missing values/required flags.
  Status Parse(int argc, char** argv, int first);
  bool help() const { return help_; }
  std::string Help() const;

  bool Has(const std::string& name) const;
  std::string Str(const std::string& name) const;
  StatusOr<int64_t> Int(const std::string& name) const;
  StatusOr<double> Double(const std::string& name) const;
  bool On(const std::string& name) const;

 private:
  struct Spec {
    std::string help, def;
    bool required = false, boolean = false;
  };
  std::string command_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

}  // namespace deja::cli
