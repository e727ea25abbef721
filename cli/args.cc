#include "cli/args.h"

#include <cerrno>
#include <cstdlib>

#include "cli/log_setup.h"

namespace deja::cli {

Args& Args::Flag(const std::string& name, const std::string& help, const std::string& def,
                 bool required) {
  order_.push_back(name);
  specs_[name] = Spec{help, def, required, false};
  return *this;
}

Args& Args::Bool(const std::string& name, const std::string& help) {
  order_.push_back(name);
  specs_[name] = Spec{help, "", false, true};
  return *this;
}

Status Args::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      return Status::Ok();
    }
    if (a.rfind("--", 0) != 0) return InvalidArgument("unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end()) {
      return InvalidArgument("unknown flag --" + name + " for '" + command_ + "' (see --help)");
    }
    if (it->second.boolean) {
      values_[name] = has_value ? value : "true";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return InvalidArgument("flag --" + name + " needs a value");
      value = argv[++i];
    }
    values_[name] = value;
  }
  for (const auto& [name, spec] : specs_) {
    if (spec.required && !values_.count(name)) {
      return InvalidArgument("missing required flag --" + name + " (see --help)");
    }
  }
  return Status::Ok();
}

std::string Args::Help() const {
  std::string s = std::string("usage: ") + ProgramName() + " " + command_ + " [flags]\n" + summary_ + "\n\nflags:\n";
  for (const std::string& name : order_) {
    const Spec& spec = specs_.at(name);
    s += "  --" + name + (spec.boolean ? "" : " VALUE") + "\n      " + spec.help;
    if (spec.required) s += " (required)";
    if (!spec.def.empty()) s += " [default: " + spec.def + "]";
    s += "\n";
  }
  return s;
}

bool Args::Has(const std::string& name) const {
  return values_.count(name) || !specs_.at(name).def.empty();
}

std::string Args::Str(const std::string& name) const {
  auto it = values_.find(name);
  return it != values_.end() ? it->second : specs_.at(name).def;
}

StatusOr<int64_t> Args::Int(const std::string& name) const {
  std::string v = Str(name);
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0) {
    return InvalidArgument("--" + name + " must be an integer, got '" + v + "'");
  }
  return static_cast<int64_t>(x);
}

StatusOr<double> Args::Double(const std::string& name) const {
  std::string v = Str(name);
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno != 0) {
    return InvalidArgument("--" + name + " must be a number, got '" + v + "'");
  }
  return x;
}

bool Args::On(const std::string& name) const {
  auto it = values_.find(name);
  return it != values_.end() && it->second != "false" && it->second != "0";
}

}  // namespace deja::cli
