// The predictors' small safetensors reader and writer (see raw_safetensors.h for why it exists
// beside common/safetensors.h).
#include "predictors/raw_safetensors.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace deja::predictors {

using nlohmann::json;

struct RawSafetensorsFile::Header {
  json j;
};

Status WriteRawSafetensors(const std::string& path,
                           const std::vector<std::pair<std::string, RawTensor>>& ts) {
  json header = json::object();
  size_t offset = 0;
  for (const auto& [name, t] : ts) {
    header[name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string h = header.dump();
  // Spaces (valid JSON whitespace) align the data section to 8 bytes.
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& [name, t] : ts) {
      out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.bytes));
    }
    out.close();
    if (!out.good()) {
      std::remove(tmp.c_str());
      return Unavailable("cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Unavailable("cannot rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

RawSafetensorsFile::RawSafetensorsFile(RawSafetensorsFile&&) noexcept = default;
RawSafetensorsFile& RawSafetensorsFile::operator=(RawSafetensorsFile&&) noexcept = default;
RawSafetensorsFile::~RawSafetensorsFile() = default;

StatusOr<RawSafetensorsFile> RawSafetensorsFile::Open(const std::string& path) {
  RawSafetensorsFile f;
  f.path_ = path;
  f.in_.open(path, std::ios::binary);
  if (!f.in_) return NotFound("cannot open " + path);
  f.in_.seekg(0, std::ios::end);
  f.file_size_ = static_cast<uint64_t>(f.in_.tellg());
  f.in_.seekg(0);
  uint64_t n = 0;
  f.in_.read(reinterpret_cast<char*>(&n), 8);
  // The 100 MiB cap is the format's own; it also bounds what a hostile header can allocate.
  if (!f.in_.good() || n > (100ull << 20) || 8 + n > f.file_size_) {
    return InvalidArgument(path + ": bad safetensors header length");
  }
  std::string h(n, '\0');
  f.in_.read(h.data(), static_cast<std::streamsize>(n));
  f.header_ = std::make_unique<Header>();
  f.header_->j = json::parse(h, nullptr, /*allow_exceptions=*/false);
  if (!f.in_.good() || f.header_->j.is_discarded() || !f.header_->j.is_object()) {
    return InvalidArgument(path + ": bad safetensors header");
  }
  f.data_start_ = 8 + n;
  return f;
}

bool RawSafetensorsFile::Has(const std::string& name) const {
  return header_ != nullptr && header_->j.contains(name);
}

Status RawSafetensorsFile::Read(const std::string& name, const std::string& dtype,
                                const std::vector<int64_t>& shape, void* dst, size_t bytes) {
  const json& header = header_->j;
  const std::string where = path_ + ": tensor '" + name + "'";
  auto it = header.find(name);
  if (it == header.end()) return InvalidArgument(where + " is missing");
  const json& t = *it;
  if (!t.is_object() || !t.contains("dtype") || t["dtype"] != dtype) {
    const std::string got =
        t.is_object() && t.contains("dtype") ? " (it has " + t["dtype"].dump() + ")" : "";
    return InvalidArgument(where + " must have dtype " + dtype + got);
  }
  if (!t.contains("shape") || t["shape"] != json(shape)) {
    return InvalidArgument(where + " has shape " + (t.contains("shape") ? t["shape"].dump() : "?") +
                           ", expected " + json(shape).dump());
  }
  const json& off = t.contains("data_offsets") ? t["data_offsets"] : json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned() || off[1].get<uint64_t>() < off[0].get<uint64_t>() ||
      off[1].get<uint64_t>() - off[0].get<uint64_t>() != bytes) {
    return InvalidArgument(where + " has bad data_offsets");
  }
  if (off[1].get<uint64_t>() > file_size_ - data_start_) {
    return InvalidArgument(where +
                           " has bad data_offsets: its data ends past the end of the "
                           "file (" +
                           std::to_string(file_size_) + " bytes; truncated?)");
  }
  in_.clear();
  in_.seekg(static_cast<std::streamoff>(data_start_ + off[0].get<uint64_t>()));
  in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
  if (!in_.good()) return DataLoss(path_ + ": cannot read tensor '" + name + "'");
  return Status::Ok();
}

}  // namespace deja::predictors
