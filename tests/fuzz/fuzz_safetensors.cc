// Fuzzes the safetensors reader with arbitrary bytes as model.safetensors, and what a loader does
// next with a checkpoint that opened: the OPT tensor names and shapes for the tiny config, and,
// when they match, LoadModel and one forward step.
//
// Invariants: a file that does not open is DATA_LOSS or INVALID_ARGUMENT naming the file; a file
// that opens describes exactly its header (every tensor's dtype, shape and bytes, its data the
// bytes its data_offsets name inside the file, no two tensors overlapping, the metadata); writing
// its tensors back with WriteSafetensors gives a file that reads back the same; a model that
// loads from it runs a forward step.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/dtype_table.h"
#include "common/opt_config.h"
#include "common/safetensors.h"
#include "kernels/backend.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tiny_opt.h"
#include "worker/model/model.h"

namespace deja::fuzz {
namespace {

using nlohmann::json;

// The file the input is written to: a memfd, so no disk I/O per execution.
const std::string& InputPath() {
  static const std::string path = [] {
    const int fd = ::memfd_create("model.safetensors", 0);
    if (fd < 0) Fail("memfd_create", __FILE__, __LINE__, "");
    return "/proc/self/fd/" + std::to_string(fd);
  }();
  return path;
}

void WriteInput(const uint8_t* data, size_t size) {
  const int fd = std::stoi(InputPath().substr(std::strlen("/proc/self/fd/")));
  FUZZ_CHECK(::ftruncate(fd, 0) == 0);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    FUZZ_CHECK(n > 0);
    done += static_cast<size_t>(n);
  }
}

// The opened checkpoint against an independent reading of the same bytes.
void CheckOpened(const Checkpoint& ckpt, const uint8_t* data, size_t size) {
  FUZZ_CHECK(size >= 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  FUZZ_CHECK(header_len <= size - 8);
  const uint8_t* section = data + 8 + header_len;
  const uint64_t section_size = size - 8 - header_len;
  const json header = json::parse(data + 8, section, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(header.is_object());

  size_t expected_tensors = 0;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() != "__metadata__") ++expected_tensors;
  }
  FUZZ_CHECK(ckpt.names().size() == expected_tensors);
  FUZZ_CHECK(std::is_sorted(ckpt.names().begin(), ckpt.names().end()));
  FUZZ_CHECK(std::adjacent_find(ckpt.names().begin(), ckpt.names().end()) == ckpt.names().end());

  std::vector<std::pair<const char*, size_t>> ranges;
  size_t total = 0;
  for (const std::string& name : ckpt.names()) {
    const TensorInfo* info = ckpt.Find(name);
    FUZZ_CHECK(info != nullptr && info->name == name);
    FUZZ_CHECK(DTypeOf(info->dtype).in_checkpoints);
    const json& entry = header.at(name);
    FUZZ_CHECK(entry.at("dtype").get<std::string>() == SafetensorsDTypeName(info->dtype));
    const json& dims = entry.at("shape");
    FUZZ_CHECK(static_cast<size_t>(info->shape.rank) == dims.size() && info->shape.rank <= 4);
    for (int i = 0; i < info->shape.rank; ++i) {
      FUZZ_CHECK(info->shape[i] >= 0 && static_cast<uint64_t>(info->shape[i]) ==
                                            dims[static_cast<size_t>(i)].get<uint64_t>());
    }
    FUZZ_CHECK(info->bytes == static_cast<size_t>(info->shape.numel()) * DTypeSize(info->dtype));
    const uint64_t begin = entry.at("data_offsets")[0].get<uint64_t>();
    const uint64_t end = entry.at("data_offsets")[1].get<uint64_t>();
    FUZZ_CHECK(begin <= end && end <= section_size && end - begin == info->bytes);
    // Reading the whole view also proves it lies inside the mapping.
    FUZZ_CHECK(info->bytes == 0 || std::memcmp(info->data, section + begin, info->bytes) == 0);
    StatusOr<TensorView> view = ckpt.Get(name, info->shape);
    FUZZ_CHECK(view.ok() && view->data == info->data);
    Shape other = info->shape;
    other.dims[0] += 1;
    if (other.rank == 0) other.rank = 1;
    FUZZ_CHECK(ckpt.Get(name, other).status().code() == StatusCode::kInvalidArgument);
    if (info->bytes > 0) ranges.emplace_back(static_cast<const char*>(info->data), info->bytes);
    total += info->bytes;
  }
  FUZZ_CHECK(ckpt.Bytes() == total);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    FUZZ_CHECK(ranges[i - 1].first + ranges[i - 1].second <= ranges[i].first);
  }
  const auto meta = header.find("__metadata__");
  FUZZ_CHECK(ckpt.metadata().size() == (meta == header.end() ? 0 : meta->size()));
  for (const auto& [key, value] : ckpt.metadata()) {
    FUZZ_CHECK(meta->at(key).get<std::string>() == value);
  }
}

// WriteSafetensors of the tensors reads back as the same tensors.
void CheckRewrite(const Checkpoint& ckpt) {
  std::vector<std::pair<std::string, TensorView>> views;
  for (const std::string& name : ckpt.names()) views.emplace_back(name, ckpt.Find(name)->view());
  const std::string path = ScratchDir() + "/rewritten.safetensors";
  Status written = WriteSafetensors(path, views, ckpt.metadata());
  // The reader accepts only names the writer accepts, except "" (an empty JSON key).
  if (!written.ok()) {
    FUZZ_CHECK_MSG(ckpt.Find("") != nullptr, written.ToString());
    return;
  }
  StatusOr<std::unique_ptr<Checkpoint>> again = Checkpoint::OpenFile(path);
  FUZZ_CHECK_MSG(again.ok(), again.status().ToString());
  FUZZ_CHECK((*again)->names() == ckpt.names() && (*again)->metadata() == ckpt.metadata());
  for (const std::string& name : ckpt.names()) {
    const TensorInfo* a = ckpt.Find(name);
    const TensorInfo* b = (*again)->Find(name);
    FUZZ_CHECK(b != nullptr && a->dtype == b->dtype && a->shape == b->shape &&
               a->bytes == b->bytes);
    FUZZ_CHECK(a->bytes == 0 || std::memcmp(a->data, b->data, a->bytes) == 0);
  }
}

// The loader's next steps for the tiny config; a checkpoint that passes them loads and runs.
void CheckAsTinyOpt(const Checkpoint& ckpt, const uint8_t* data, size_t size) {
  static const OptConfig config = [] {
    StatusOr<OptConfig> c = ParseOptConfig(TinyOptConfigJson());
    if (!c.ok()) Fail("tiny config", __FILE__, __LINE__, c.status().ToString());
    return *c;
  }();
  StatusOr<OptTensorNames> names = ResolveOptTensorNames(ckpt, config);
  if (!names.ok()) {
    const StatusCode code = names.status().code();
    FUZZ_CHECK(code == StatusCode::kNotFound || code == StatusCode::kInvalidArgument);
    return;
  }
  if (Status shapes = CheckOptTensorShapes(ckpt, config, *names); !shapes.ok()) {
    FUZZ_CHECK(shapes.code() == StatusCode::kInvalidArgument);
    return;
  }
  static const std::unique_ptr<kernels::Backend> backend = kernels::MakeCpuBackend(1);
  const std::string dir = ScratchDir() + "/model";
  static const bool made = [&dir] {
    std::filesystem::create_directories(dir);
    WriteFile(dir + "/config.json", TinyOptConfigJson());
    return true;
  }();
  (void)made;
  WriteFile(dir + "/model.safetensors",
            std::string_view(reinterpret_cast<const char*>(data), size));
  StatusOr<std::unique_ptr<worker::model::Model>> model =
      worker::model::LoadModel(dir, backend.get());
  if (!model.ok()) return;
  StatusOr<std::unique_ptr<worker::kv::SequenceKv>> kv = (*model)->NewSequence(4);
  FUZZ_CHECK_MSG(kv.ok(), kv.status().ToString());
  const int32_t tokens[3] = {2, 5, static_cast<int32_t>(kTinyOpt.vocab - 1)};
  worker::model::StepResult result;
  Status s = (*model)->Forward({{kv->get(), tokens, 3, /*all_logits=*/true}}, &result);
  FUZZ_CHECK_MSG(s.ok(), s.ToString());
  FUZZ_CHECK(result.row_seq.size() == 3 && result.logits.numel() >= 3 * kTinyOpt.vocab);
}

}  // namespace
}  // namespace deja::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  deja::fuzz::QuietLogging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deja;
  fuzz::WriteInput(data, size);
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::OpenFile(fuzz::InputPath());
  if (!ckpt.ok()) {
    const Status& s = ckpt.status();
    FUZZ_CHECK_MSG(s.code() == StatusCode::kDataLoss || s.code() == StatusCode::kInvalidArgument,
                   s.ToString());
    FUZZ_CHECK_MSG(s.message().find(fuzz::InputPath()) != std::string::npos, s.ToString());
    return 0;
  }
  fuzz::CheckOpened(**ckpt, data, size);
  fuzz::CheckRewrite(**ckpt);
  fuzz::CheckAsTinyOpt(**ckpt, data, size);
  return 0;
}
