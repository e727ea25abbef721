#include "common/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "common/dtype_table.h"
#include "common/enum_table.h"

namespace deja {
namespace {

using nlohmann::json;

// The format's own limit; also bounds the memory a hostile header can make the parser use.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string Quote(std::string_view s) {
  // Appending (rather than "'" + std::string) avoids a GCC 12 -Wrestrict false positive.
  std::string out;
  out.reserve(s.size() + 2);
  out.append(1, '\'').append(s).append(1, '\'');
  return out;
}

// Parses JSON without exceptions and rejects duplicate object keys, which nlohmann would
// otherwise resolve silently by keeping the last one (hiding a duplicated tensor name).
StatusOr<json> ParseJsonStrict(std::string_view text, const std::string& file) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool duplicate_top_level = false;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty() && parsed.is_string()) {
      if (!open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
        duplicate_top_level = open_objects.size() == 1;
      }
    }
    return true;
  };
  json value;
  try {
    value = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  } catch (const json::exception& e) {
    return DataLoss(file + ": invalid JSON header: " + e.what());
  }
  if (value.is_discarded()) return DataLoss(file + ": invalid or truncated JSON header");
  if (!duplicate.empty()) {
    return DataLoss(file + (duplicate_top_level ? ": duplicate tensor " : ": duplicate key ") +
                    Quote(duplicate) + " in header");
  }
  return value;
}

// The dtype a checkpoint spells `s`; InvalidArgument listing those a checkpoint may hold.
StatusOr<DType> ParseSafetensorsDType(const std::string& s, const std::string& file,
                                      const std::string& name) {
  std::vector<std::string> supported;
  for (const DTypeRow& row : DTypeTable()) {
    if (!row.in_checkpoints) continue;
    if (s == row.safetensors) return row.dtype;
    supported.emplace_back(row.safetensors);
  }
  return InvalidArgument(file + ": tensor " + Quote(name) + " has dtype " + Quote(s) +
                         "; supported: " + OneOf(supported));
}

// One header entry, checked against a data section of `data_size` bytes.
struct Entry {
  TensorInfo info;
  uint64_t begin = 0;
  uint64_t end = 0;
};

StatusOr<Entry> ParseEntry(const std::string& file, const std::string& name, const json& e,
                           uint64_t data_size) {
  const std::string where = file + ": tensor " + Quote(name);
  if (!e.is_object()) return DataLoss(where + ": header entry is not an object");
  auto dtype_it = e.find("dtype");
  if (dtype_it == e.end() || !dtype_it->is_string()) {
    return DataLoss(where + ": missing or non-string 'dtype'");
  }
  auto shape_it = e.find("shape");
  if (shape_it == e.end() || !shape_it->is_array()) {
    return DataLoss(where + ": missing or non-array 'shape'");
  }
  auto off_it = e.find("data_offsets");
  if (off_it == e.end() || !off_it->is_array() || off_it->size() != 2 ||
      !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
    return DataLoss(where + ": missing 'data_offsets' or not two non-negative integers");
  }
  Entry out;
  out.info.name = name;
  out.info.file = file;
  DEJA_ASSIGN_OR_RETURN(out.info.dtype,
                        ParseSafetensorsDType(dtype_it->get<std::string>(), file, name));

  if (shape_it->size() > out.info.shape.dims.size()) {
    return InvalidArgument(where + ": rank " + std::to_string(shape_it->size()) +
                           " exceeds the supported 4");
  }
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : *shape_it) {
    if (!d.is_number_unsigned()) return DataLoss(where + ": shape entries must be integers >= 0");
    const uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
    if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / v) overflow = true;
    if (!overflow) numel *= v;
    out.info.shape.dims[out.info.shape.rank++] = static_cast<int64_t>(v);
  }
  // A zero dimension makes the tensor empty however large the others are.
  if (numel == 0) overflow = false;
  const uint64_t esize = DTypeSize(out.info.dtype);
  if (overflow || numel > std::numeric_limits<uint64_t>::max() / esize) {
    return DataLoss(where + ": shape " + out.info.shape.ToString() + " overflows");
  }
  out.begin = (*off_it)[0].get<uint64_t>();
  out.end = (*off_it)[1].get<uint64_t>();
  if (out.end < out.begin) {
    return DataLoss(where + ": data_offsets end " + std::to_string(out.end) + " < begin " +
                    std::to_string(out.begin));
  }
  if (out.end > data_size) {
    return DataLoss(where + ": data_offsets [" + std::to_string(out.begin) + ", " +
                    std::to_string(out.end) + ") exceed the data section of " +
                    std::to_string(data_size) + " bytes");
  }
  if (out.end - out.begin != numel * esize) {
    return DataLoss(where + ": " + std::to_string(out.end - out.begin) + " bytes for shape " +
                    out.info.shape.ToString() + " of " + SafetensorsDTypeName(out.info.dtype) +
                    " (expected " + std::to_string(numel * esize) + ")");
  }
  out.info.bytes = static_cast<size_t>(out.end - out.begin);
  return out;
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

bool FileExists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace

const char* SafetensorsDTypeName(DType dtype) { return DTypeOf(dtype).safetensors; }

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::OpenFile(const std::string& path) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->source_ = path;
  DEJA_RETURN_IF_ERROR(ckpt->AddFile(path));
  ckpt->Finish();
  return ckpt;
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::OpenDir(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return NotFound("checkpoint directory " + dir + " does not exist or is not a directory");
  }
  const std::string single = JoinPath(dir, kSingleFile);
  if (FileExists(single)) {
    DEJA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, OpenFile(single));
    ckpt->source_ = dir;
    LOG(INFO) << "checkpoint " << dir << ": " << ckpt->names_.size() << " tensors, "
              << ckpt->total_bytes_ / (1 << 20) << " MiB";
    return ckpt;
  }
  const std::string index = JoinPath(dir, kIndexFile);
  if (!FileExists(index)) {
    return NotFound("checkpoint directory " + dir + " has neither " + kSingleFile + " nor " +
                    kIndexFile);
  }
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->source_ = dir;
  DEJA_RETURN_IF_ERROR(ckpt->OpenIndex(dir, index));
  ckpt->Finish();
  LOG(INFO) << "checkpoint " << dir << ": " << ckpt->names_.size() << " tensors, "
            << ckpt->total_bytes_ / (1 << 20) << " MiB in " << ckpt->mappings_.size() << " shards";
  return ckpt;
}

Status Checkpoint::AddFile(const std::string& path) {
  DEJA_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const uint8_t* base = file.data();
  const uint64_t size = file.size();
  if (size < 8) {
    return DataLoss(path + ": " + std::to_string(size) + " bytes is too small for a header");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian
  if (header_len > size - 8) {
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " is larger than the file (" + std::to_string(size) + " bytes)");
  }
  if (header_len > kMaxHeaderBytes) {
    return DataLoss(path + ": header length " + std::to_string(header_len) + " exceeds 100 MiB");
  }
  std::string_view text(reinterpret_cast<const char*>(base) + 8, header_len);
  DEJA_ASSIGN_OR_RETURN(json header, ParseJsonStrict(text, path));
  if (!header.is_object()) return DataLoss(path + ": header is not a JSON object");

  const uint8_t* data_section = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return DataLoss(path + ": __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return DataLoss(path + ": __metadata__ value " + Quote(m.key()) + " is not a string");
        }
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    DEJA_ASSIGN_OR_RETURN(Entry entry, ParseEntry(path, it.key(), *it, data_size));
    entry.info.data = data_section + entry.begin;
    entries.push_back(std::move(entry));
  }

  // Empty tensors occupy no bytes and so cannot overlap anything.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return DataLoss(path + ": tensors " + Quote(by_offset[i - 1]->info.name) + " and " +
                      Quote(by_offset[i]->info.name) + " overlap");
    }
  }

  for (Entry& e : entries) {
    auto existing = tensors_.find(e.info.name);
    if (existing != tensors_.end()) {
      return DataLoss("duplicate tensor " + Quote(e.info.name) + " in " + existing->second.file +
                      " and " + path);
    }
    std::string name = e.info.name;
    tensors_.emplace(std::move(name), std::move(e.info));
  }
  // Moving a MappedFile keeps its address range, so the pointers above stay valid.
  mappings_.push_back(std::move(file));
  return Status::Ok();
}

Status Checkpoint::OpenIndex(const std::string& dir, const std::string& index_path) {
  DEJA_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(index_path));
  std::string_view text(reinterpret_cast<const char*>(file.data()), file.size());
  DEJA_ASSIGN_OR_RETURN(json index, ParseJsonStrict(text, index_path));
  if (!index.is_object()) return DataLoss(index_path + ": not a JSON object");
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return DataLoss(index_path + ": missing or non-object 'weight_map'");
  }
  // Shard -> first tensor mapped to it (named in errors); std::map opens shards in a stable order.
  std::map<std::string, std::string> shards;
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    if (!it->is_string()) {
      return DataLoss(index_path + ": weight_map entry for tensor " + Quote(it.key()) +
                      " is not a string");
    }
    const std::string shard = it->get<std::string>();
    // Shards live next to the index; a path would let a checkpoint point anywhere on disk.
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      return InvalidArgument(index_path + ": tensor " + Quote(it.key()) + " maps to " +
                             Quote(shard) + ", which is not a plain file name");
    }
    shards.emplace(shard, it.key());
  }
  for (const auto& [shard, first_tensor] : shards) {
    const std::string path = JoinPath(dir, shard);
    if (!FileExists(path)) {
      return NotFound(index_path + ": shard " + Quote(shard) + " (holding tensor " +
                      Quote(first_tensor) + ") does not exist");
    }
    DEJA_RETURN_IF_ERROR(AddFile(path));
  }
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    const std::string path = JoinPath(dir, it->get<std::string>());
    const TensorInfo* info = Find(it.key());
    if (info == nullptr || info->file != path) {
      return NotFound(index_path + ": tensor " + Quote(it.key()) + " is absent from its shard " +
                      path + (info ? " (found in " + info->file + ")" : ""));
    }
  }
  return Status::Ok();
}

void Checkpoint::Finish() {
  names_.clear();
  total_bytes_ = 0;
  for (const auto& [name, info] : tensors_) {
    names_.push_back(name);
    total_bytes_ += info.bytes;
  }
  std::sort(names_.begin(), names_.end());
}

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

StatusOr<TensorView> Checkpoint::Get(std::string_view name, const Shape& expected) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return NotFound("tensor " + Quote(name) + " not found in checkpoint " + source_);
  }
  if (!(info->shape == expected)) {
    return InvalidArgument("tensor " + Quote(name) + " in " + info->file + " has shape " +
                           info->shape.ToString() + ", expected " + expected.ToString());
  }
  return info->view();
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  for (const MappedFile& m : mappings_) out.push_back(m.path());
  return out;
}

Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, TensorView>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the caller's order, which is also the order of the data.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, view] : tensors) {
    if (name.empty() || name == "__metadata__") {
      return InvalidArgument(path + ": invalid tensor name " + Quote(name));
    }
    if (!seen.insert(name).second) {
      return InvalidArgument(path + ": duplicate tensor " + Quote(name));
    }
    if (!DTypeOf(view.dtype).in_checkpoints) {
      return InvalidArgument(path + ": tensor " + Quote(name) + " has unsupported dtype " +
                             DTypeName(view.dtype));
    }
    std::vector<int64_t> dims;
    for (int i = 0; i < view.shape.rank; ++i) {
      if (view.shape[i] < 0) {
        return InvalidArgument(path + ": tensor " + Quote(name) + " has a negative dimension");
      }
      dims.push_back(view.shape[i]);
    }
    if (view.data == nullptr && view.bytes() > 0) {
      return InvalidArgument(path + ": tensor " + Quote(name) + " has no data");
    }
    header[name] = {{"dtype", SafetensorsDTypeName(view.dtype)},
                    {"shape", dims},
                    {"data_offsets", {offset, offset + view.bytes()}}};
    offset += view.bytes();
  }
  std::string text = header.dump();
  // Padding with spaces (valid JSON whitespace) aligns the data section to 8 bytes.
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Internal("cannot create " + tmp + ": " + std::strerror(errno));
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, view] : tensors) {
      out.write(static_cast<const char*>(view.data), static_cast<std::streamsize>(view.bytes()));
    }
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return Internal("cannot write " + tmp + ": " + std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Internal("cannot rename " + tmp + " to " + path + ": " + std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace deja

namespace deja {

void Checkpoint::Release(const TensorView& view) const {
  const auto* p = static_cast<const uint8_t*>(view.data);
  for (const MappedFile& m : mappings_) {
    if (p >= m.data() && p + view.bytes() <= m.data() + m.size()) {
      ReleaseFileMemory(p, view.bytes());
      return;
    }
  }
}

}  // namespace deja
