// Metric types, families, the registry, and the text exposition format 0.0.4.
#include "metrics/registry.h"

#include <glog/logging.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <utility>

namespace deja::metrics {

void Counter::Increment(double amount) {
  if (!(amount >= 0.0)) return;  // also rejects NaN
  value_.fetch_add(amount, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    CHECK(std::isfinite(bounds_[i])) << "histogram bound " << i << " is not finite";
    CHECK(i == 0 || bounds_[i - 1] < bounds_[i]) << "histogram bounds must strictly increase";
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  // First bound >= value: buckets are "less than or equal".
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot snap;
  snap.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    snap.cumulative[i] = running;
  }
  snap.count = running;
  snap.sum = sum_.load(std::memory_order_relaxed);
  return snap;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  CHECK(start > 0 && factor > 1 && count >= 1) << "bad exponential buckets";
  std::vector<double> bounds(count);
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds[i] = b;
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  CHECK(width > 0 && count >= 1) << "bad linear buckets";
  std::vector<double> bounds(count);
  for (int i = 0; i < count; ++i) bounds[i] = start + width * i;
  return bounds;
}

// ---- text format helpers ----

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Integral values print without an exponent up to 2^53, the range where they are exact.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    auto res = std::to_chars(buf, buf + sizeof(buf), static_cast<int64_t>(value));
    return std::string(buf, res.ptr);
  }
  auto res = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, res.ptr);
}

bool IsValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool IsValidLabelName(const std::string& name) {
  if (name.empty() || name.rfind("__", 0) == 0) return false;  // "__" prefix is reserved
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// ---- families ----

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {
  CHECK(IsValidMetricName(name_)) << "invalid metric name '" << name_ << "'";
  std::set<std::string> seen;
  for (const auto& l : label_names_) {
    CHECK(IsValidLabelName(l)) << name_ << ": invalid label name '" << l << "'";
    CHECK(seen.insert(l).second) << name_ << ": duplicate label name '" << l << "'";
    CHECK(!(type_ == MetricType::kHistogram && l == "le"))
        << name_ << ": 'le' is reserved for histogram buckets";
  }
}

std::vector<std::string> FamilyBase::ValuesInOrder(const Labels& labels) const {
  CHECK_EQ(labels.size(), label_names_.size())
      << name_ << ": expected " << label_names_.size() << " labels";
  std::vector<std::string> values;
  values.reserve(label_names_.size());
  for (const auto& l : label_names_) {
    auto it = labels.find(l);
    CHECK(it != labels.end()) << name_ << ": missing label '" << l << "'";
    values.push_back(it->second);
  }
  return values;
}

std::string FamilyBase::LabelText(const std::vector<std::string>& values, const char* extra_name,
                                  const std::string& extra_value) const {
  if (values.empty() && extra_name == nullptr) return "";
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += label_names_[i] + "=\"" + EscapeLabelValue(values[i]) + '"';
  }
  if (extra_name != nullptr) {
    if (!values.empty()) out += ',';
    out += std::string(extra_name) + "=\"" + EscapeLabelValue(extra_value) + '"';
  }
  out += '}';
  return out;
}

void FamilyBase::Render(std::string* out) const {
  static constexpr const char* kTypeNames[] = {"counter", "gauge", "histogram"};
  *out += "# HELP " + name_ + ' ' + EscapeHelp(help_) + '\n';
  *out += "# TYPE " + name_ + ' ' + kTypeNames[static_cast<int>(type_)] + '\n';
  RenderChildren(out);
}

template <typename T>
Family<T>::Family(RegistryKey, std::string name, std::string help, MetricType type,
                  std::vector<std::string> label_names, std::vector<double> bounds)
    : FamilyBase(std::move(name), std::move(help), type, std::move(label_names)),
      bounds_(std::move(bounds)) {}

template <typename T>
T& Family<T>::Add(const Labels& labels) {
  std::vector<std::string> values = ValuesInOrder(labels);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = children_.find(values);
  if (it == children_.end()) {
    std::unique_ptr<T> child;
    if constexpr (std::is_same_v<T, Histogram>) {
      child = std::make_unique<Histogram>(bounds_);
    } else {
      child = std::make_unique<T>();
    }
    it = children_.emplace(std::move(values), std::move(child)).first;
  }
  return *it->second;
}

template <typename T>
void Family<T>::RenderChildren(std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const Histogram::Snapshot snap = child->Collect();
      for (size_t i = 0; i <= bounds_.size(); ++i) {
        const std::string le = i < bounds_.size() ? FormatValue(bounds_[i]) : "+Inf";
        *out += name_ + "_bucket" + LabelText(values, "le", le) + ' ' +
                std::to_string(snap.cumulative[i]) + '\n';
      }
      const std::string labels = LabelText(values);
      *out += name_ + "_sum" + labels + ' ' + FormatValue(snap.sum) + '\n';
      *out += name_ + "_count" + labels + ' ' + std::to_string(snap.count) + '\n';
    } else {
      *out += name_ + LabelText(values) + ' ' + FormatValue(child->Value()) + '\n';
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- registry ----

void Registry::CheckNewName(const std::string& name) const {
  for (const auto& f : families_) {
    CHECK(f->name() != name) << "metric family '" << name << "' registered twice";
  }
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  CHECK(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0)
      << "counter '" << name << "' must end in _total";
  std::lock_guard<std::mutex> lock(mu_);
  CheckNewName(name);
  auto family = std::make_unique<Family<Counter>>(RegistryKey(), name, help, MetricType::kCounter,
                                                  std::move(label_names));
  auto& ref = *family;
  families_.push_back(std::move(family));
  return ref;
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckNewName(name);
  auto family = std::make_unique<Family<Gauge>>(RegistryKey(), name, help, MetricType::kGauge,
                                                std::move(label_names));
  auto& ref = *family;
  families_.push_back(std::move(family));
  return ref;
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> bounds) {
  // Validates the bounds now rather than at the first Add.
  Histogram check(bounds);
  std::lock_guard<std::mutex> lock(mu_);
  CheckNewName(name);
  auto family = std::make_unique<Family<Histogram>>(
      RegistryKey(), name, help, MetricType::kHistogram, std::move(label_names), std::move(bounds));
  auto& ref = *family;
  families_.push_back(std::move(family));
  return ref;
}

std::string Registry::Serialize() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : families_) f->Render(&out);
  return out;
}

}  // namespace deja::metrics
