// deja's metric families over prometheus-cpp's registry, metrics and text serializer.
#include "metrics/registry.h"

#include <glog/logging.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

namespace deja::metrics {
namespace {

void CheckBounds(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    CHECK(std::isfinite(bounds[i])) << "histogram bound " << i << " is not finite";
    CHECK(i == 0 || bounds[i - 1] < bounds[i]) << "histogram bounds must strictly increase";
  }
}

}  // namespace

void Counter::Increment(double amount) {
  if (!(amount >= 0.0)) return;  // also rejects NaN
  impl_->Increment(amount);
}

double Counter::Value() const { return impl_->Value(); }

void Gauge::Set(double value) { impl_->Set(value); }
void Gauge::Increment(double amount) { impl_->Increment(amount); }
void Gauge::Decrement(double amount) { impl_->Decrement(amount); }
double Gauge::Value() const { return impl_->Value(); }

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  CheckBounds(bounds_);
  owned_ = std::make_unique<prometheus::Histogram>(bounds_);
  impl_ = owned_.get();
}

Histogram::Histogram(prometheus::Histogram* impl, std::vector<double> bounds)
    : bounds_(std::move(bounds)), impl_(impl) {}

Histogram::~Histogram() = default;

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  impl_->Observe(value);
}

Histogram::Snapshot Histogram::Collect() const {
  const prometheus::ClientMetric m = impl_->Collect();
  Snapshot snap;
  for (const auto& b : m.histogram.bucket) snap.cumulative.push_back(b.cumulative_count);
  snap.count = m.histogram.sample_count;
  snap.sum = m.histogram.sample_sum;
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

template <typename T>
Family<T>::Family(RegistryKey, Impl* impl, std::string name, std::vector<std::string> label_names,
                  std::vector<double> bounds)
    : impl_(impl),
      name_(std::move(name)),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)) {}

template <typename T>
T& Family<T>::Add(const Labels& labels) {
  CHECK_EQ(labels.size(), label_names_.size())
      << name_ << ": expected " << label_names_.size() << " labels";
  for (const auto& l : label_names_) {
    CHECK(labels.count(l) == 1) << name_ << ": missing label '" << l << "'";
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = children_.find(labels);
  if (it != children_.end()) return *it->second;
  std::unique_ptr<T> child;
  if constexpr (std::is_same_v<T, Histogram>) {
    child = std::make_unique<Histogram>(&impl_->Add(labels, bounds_), bounds_);
  } else {
    child = std::make_unique<T>(&impl_->Add(labels));
  }
  return *children_.emplace(labels, std::move(child)).first->second;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- registry ----

Registry::Registry() : impl_(std::make_unique<prometheus::Registry>()) {}
Registry::~Registry() = default;

void Registry::CheckNewFamily(const std::string& name, const std::string& help,
                              const std::vector<std::string>& label_names) {
  CHECK(IsValidMetricName(name)) << "invalid metric name '" << name << "'";
  // prometheus-cpp writes HELP as it is: a newline or backslash would break the format.
  CHECK(help.find_first_of("\n\\") == std::string::npos)
      << name << ": HELP text with a newline or backslash";
  CHECK(std::find(names_.begin(), names_.end(), name) == names_.end())
      << "metric family '" << name << "' registered twice";
  std::set<std::string> seen;
  for (const auto& l : label_names) {
    CHECK(IsValidLabelName(l)) << name << ": invalid label name '" << l << "'";
    CHECK(seen.insert(l).second) << name << ": duplicate label name '" << l << "'";
  }
  names_.push_back(name);
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  CHECK(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0)
      << "counter '" << name << "' must end in _total";
  std::lock_guard<std::mutex> lock(mu_);
  CheckNewFamily(name, help, label_names);
  auto& impl = prometheus::BuildCounter().Name(name).Help(help).Register(*impl_);
  counters_.push_back(
      std::make_unique<Family<Counter>>(RegistryKey(), &impl, name, std::move(label_names)));
  return *counters_.back();
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckNewFamily(name, help, label_names);
  auto& impl = prometheus::BuildGauge().Name(name).Help(help).Register(*impl_);
  gauges_.push_back(
      std::make_unique<Family<Gauge>>(RegistryKey(), &impl, name, std::move(label_names)));
  return *gauges_.back();
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> bounds) {
  CheckBounds(bounds);
  for (const auto& l : label_names) {
    CHECK(l != "le") << name << ": 'le' is reserved for histogram buckets";
  }
  std::lock_guard<std::mutex> lock(mu_);
  CheckNewFamily(name, help, label_names);
  auto& impl = prometheus::BuildHistogram().Name(name).Help(help).Register(*impl_);
  histograms_.push_back(std::make_unique<Family<Histogram>>(
      RegistryKey(), &impl, name, std::move(label_names), std::move(bounds)));
  return *histograms_.back();
}

std::string Registry::Serialize() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prometheus::TextSerializer().Serialize(impl_->Collect());
}

}  // namespace deja::metrics
