#include "worker/model/quantize_checkpoint.h"

#include <glog/logging.h>

#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "common/opt_config.h"
#include "common/int4.h"
#include "common/quantize.h"
#include "common/safetensors.h"

namespace deja::worker::model {

std::string ScaleTensorName(const std::string& name) { return name + ".scale"; }

StatusOr<QuantizeReport> QuantizeCheckpoint(const std::string& model_dir,
                                            const std::string& out_dir, ThreadPool* pool,
                                            const QuantizeOptions& options) {
  namespace fs = std::filesystem;
  if (options.bits != 8 && options.bits != 4) {
    return InvalidArgument("bits must be 8 or 4, not " + std::to_string(options.bits));
  }
  if (options.bits == 4 && (options.group <= 0 || options.group % 8 != 0)) {
    return InvalidArgument("the int4 group must be a positive multiple of 8, not " +
                           std::to_string(options.group));
  }
  if (options.bits == 4 && !(options.max_error >= 0)) {
    return InvalidArgument("the int4 max error must be >= 0");
  }
  DEJA_ASSIGN_OR_RETURN(OptConfig config, LoadOptConfig(model_dir));
  DEJA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, OpenCheckpoint(model_dir));
  DEJA_ASSIGN_OR_RETURN(OptTensorNames names, ResolveOptTensorNames(*ckpt, config));
  DEJA_RETURN_IF_ERROR(CheckOptTensorShapes(*ckpt, config, names));
  std::error_code ec;
  if (fs::exists(fs::path(out_dir) / "model.safetensors", ec)) {
    return Status(StatusCode::kAlreadyExists, out_dir + " already holds a model.safetensors");
  }
  if (fs::exists(out_dir, ec) && fs::equivalent(out_dir, model_dir, ec)) {
    return InvalidArgument("--out must differ from --model");
  }

  std::set<std::string> matrices = {names.embed_tokens, names.lm_head}, layer_matrices;
  if (!names.project_in.empty()) matrices.insert({names.project_in, names.project_out});
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const OptLayerNames n = names.Layer(l);
    layer_matrices.insert(
        {n.q_weight, n.k_weight, n.v_weight, n.out_weight, n.fc1_weight, n.fc2_weight});
  }
  matrices.insert(layer_matrices.begin(), layer_matrices.end());
  QuantizeReport report;
  std::vector<Tensor> written;  // backs the views of `out`
  std::vector<std::pair<std::string, TensorView>> out;
  for (const std::string& name : ckpt->names()) {
    const TensorInfo* t = ckpt->Find(name);
    report.bytes_in += static_cast<int64_t>(t->bytes);
    if (t->dtype == DType::kI8 || t->dtype == DType::kU8 ||
        (name.size() > 6 && name.ends_with(".scale"))) {
      return InvalidArgument(model_dir + " is already quantized (tensor '" + name + "')");
    }
    if (matrices.count(name) == 0) {
      out.emplace_back(name, t->view());
      ++report.copied;
      continue;
    }
    ++report.matrices;
    if (options.bits == 4 && layer_matrices.count(name) > 0) {
      if (t->shape[1] % options.group == 0) {
        DEJA_ASSIGN_OR_RETURN(Int4Matrix q,
                              QuantizeInt4(t->view(), options.group, name.c_str(), pool));
        if (q.relative_error <= options.max_error) {
          Int4Rows rows = Int4ToRows(q);
          out.emplace_back(name, rows.packed.view());
          out.emplace_back(ScaleTensorName(name), rows.scale.view());
          written.push_back(std::move(rows.packed));
          written.push_back(std::move(rows.scale));
          ++report.int4;
          continue;
        }
        LOG(INFO) << name << ": int4 relative error " << q.relative_error << " > "
                  << options.max_error << ", written int8";
      } else {
        LOG(INFO) << name << ": " << t->shape[1] << " columns are not whole int4 groups of "
                  << options.group << ", written int8";
      }
      ++report.int4_fallbacks;
    }
    DEJA_ASSIGN_OR_RETURN(QuantizedMatrix q, QuantizeRowsInt8(t->view(), name.c_str(), pool));
    out.emplace_back(name, q.q.view());
    out.emplace_back(ScaleTensorName(name), q.scale.view());
    written.push_back(std::move(q.q));
    written.push_back(std::move(q.scale));
  }
  for (const auto& [name, view] : out) report.bytes_out += static_cast<int64_t>(view.bytes());

  fs::create_directories(out_dir, ec);
  if (ec) return InvalidArgument("cannot create " + out_dir + ": " + ec.message());
  // The tokenizer, configs, model card and predictors; not the source's weight files.
  std::set<fs::path> weight_files;
  for (const std::string& f : ckpt->files()) weight_files.insert(fs::weakly_canonical(f));
  for (const fs::directory_entry& e : fs::directory_iterator(model_dir, ec)) {
    if (!e.is_regular_file()) continue;
    const std::string file = e.path().filename().string();
    if (weight_files.count(fs::weakly_canonical(e.path())) > 0 ||
        file == "model.safetensors.index.json") {
      continue;
    }
    fs::copy_file(e.path(), fs::path(out_dir) / file, fs::copy_options::overwrite_existing, ec);
    if (ec) return InvalidArgument("cannot copy " + e.path().string() + ": " + ec.message());
  }
  if (ec) return InvalidArgument("cannot list " + model_dir + ": " + ec.message());
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"deja_quantization",
       options.bits == 8
           ? std::string("int8 weight-only, symmetric, per output row")
           : "int4 weight-only layer matrices (U8 nibble pairs, low nibble first, value + 8), "
             "groups of " + std::to_string(options.group) +
                 " columns with one f32 scale each; the rest int8 per output row"}};
  DEJA_RETURN_IF_ERROR(
      WriteSafetensors((fs::path(out_dir) / "model.safetensors").string(), out, metadata));
  LOG(INFO) << "quantized " << report.matrices << " matrices of " << model_dir << " into "
            << out_dir << ": " << (report.bytes_in >> 20) << " MiB -> " << (report.bytes_out >> 20)
            << " MiB";
  return report;
}

}  // namespace deja::worker::model
