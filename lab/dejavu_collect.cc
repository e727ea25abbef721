// `deja collect`: runs windows densely with a LayerObserver that turns the block inputs and
// activations into predictor rows, then writes them per layer.
#include "lab/dejavu_collect.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "common/dtype.h"
#include "predictors/predictor_data.h"
#include "lab/collection.h"

namespace deja::worker::dejavu {

using predictors::BlockData;
using predictors::HeadTopCount;
using predictors::kDataFormat;
using predictors::WriteLayerData;
namespace {

using Clock = std::chrono::steady_clock;

float At(const TensorView& v, int64_t i) {
  return v.dtype == DType::kF32 ? v.as<float>()[i] : LoadAsFloat(v.data, v.dtype, i);
}

// Records one window's tensors per layer: xa, xm (f16) and the two label sets (bit-packed).
class Recorder : public model::LayerObserver {
 public:
  explicit Recorder(const OptConfig& c)
      : d_(c.hidden_size),
        ffn_(c.ffn_dim),
        heads_(c.num_attention_heads),
        head_dim_(c.head_dim()),
        top_(HeadTopCount(static_cast<int32_t>(heads_))),
        xa_(c.num_hidden_layers),
        xm_(c.num_hidden_layers),
        mlp_y_(c.num_hidden_layers),
        head_y_(c.num_hidden_layers) {}

  void OnAttention(int32_t l, const TensorView& xa, const TensorView& heads_out) override {
    if (!Check(l, xa, d_, "xa") || !Check(l, heads_out, heads_ * head_dim_, "heads_out")) return;
    ToHalf(xa, &xa_[l]);
    const int64_t rows = xa.rows(), hb = (heads_ + 7) / 8;
    head_y_[l].assign(rows * hb, 0);
    std::vector<double> norm(heads_);
    std::vector<int32_t> order(heads_);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < heads_; ++h) {
        double s = 0;
        for (int64_t j = 0; j < head_dim_; ++j) {
          const double v = At(heads_out, (r * heads_ + h) * head_dim_ + j);
          s += v * v;
        }
        norm[h] = s;
      }
      std::iota(order.begin(), order.end(), 0);
      // Largest norms first; ties to the lower head index.
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return norm[a] > norm[b]; });
      for (int32_t i = 0; i < top_; ++i) head_y_[l][r * hb + order[i] / 8] |= 1 << (order[i] % 8);
    }
  }

  void OnMlp(int32_t l, const TensorView& xm, const TensorView& act) override {
    if (!Check(l, xm, d_, "xm") || !Check(l, act, ffn_, "act")) return;
    ToHalf(xm, &xm_[l]);
    const int64_t rows = act.rows(), fb = (ffn_ + 7) / 8;
    mlp_y_[l].assign(rows * fb, 0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < ffn_; ++j) {
        if (At(act, r * ffn_ + j) > 0.0f) {
          mlp_y_[l][r * fb + j / 8] |= 1 << (j % 8);
        }
      }
    }
  }

  const Status& status() const { return status_; }
  // Appends the first `take` rows of the last window to the per-layer accumulators.
  void Append(int64_t take, std::vector<BlockData>* mlp, std::vector<BlockData>* heads) {
    for (size_t l = 0; l < xa_.size(); ++l) {
      AppendRows(xa_[l], mlp_y_[l], take, &(*mlp)[l]);
      if (l > 0) AppendRows(xm_[l - 1], head_y_[l], take, &(*heads)[l]);
    }
  }

 private:
  bool Check(int32_t l, const TensorView& v, int64_t cols, const char* what) {
    if (!status_.ok()) return false;
    if (l < 0 || l >= static_cast<int32_t>(xa_.size()) || v.cols() != cols) {
      status_ = Internal(std::string("collect: unexpected ") + what + " of layer " +
                         std::to_string(l) + " with shape " + v.shape.ToString());
      return false;
    }
    return true;
  }
  static void ToHalf(const TensorView& v, std::vector<uint16_t>* out) {
    out->resize(v.numel());
    for (int64_t i = 0; i < v.numel(); ++i) (*out)[i] = FloatToHalf(At(v, i));
  }
  static void AppendRows(const std::vector<uint16_t>& x, const std::vector<uint8_t>& y,
                         int64_t take, BlockData* b) {
    b->x.insert(b->x.end(), x.begin(), x.begin() + take * b->dim);
    b->y.insert(b->y.end(), y.begin(), y.begin() + take * b->label_bytes());
    b->rows += take;
  }

  int64_t d_, ffn_, heads_, head_dim_;
  int32_t top_;
  std::vector<std::vector<uint16_t>> xa_, xm_;
  std::vector<std::vector<uint8_t>> mlp_y_, head_y_;
  Status status_;
};

struct Window {
  size_t doc;
  int64_t begin, end;
};

}  // namespace

StatusOr<CollectSummary> Collect(model::Model& model,
                                 const std::vector<std::vector<int32_t>>& documents,
                                 const CollectOptions& o, const std::string& out_dir,
                                 const std::function<void(const std::string&)>& progress) {
  const OptConfig& c = model.config();
  if (o.context < 2 || o.context > c.max_position_embeddings) {
    return InvalidArgument("context must be in [2, " + std::to_string(c.max_position_embeddings) +
                           "] for this model");
  }
  if (o.max_rows < 1) return InvalidArgument("max rows must be >= 1");
  if (model.comm().world_size() != 1) {
    return FailedPrecondition("collect runs the whole model in one process (world size 1)");
  }
  CollectSummary sum;
  std::vector<Window> windows;
  int64_t window_rows = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    const int64_t n = static_cast<int64_t>(documents[d].size());
    sum.tokens_total += n;
    for (int64_t b = 0; b < n; b += o.context - 1) {
      windows.push_back({d, b, std::min(n, b + o.context - 1)});
      window_rows += windows.back().end - b + 1;
    }
  }
  if (windows.empty()) return InvalidArgument("the text has no tokens");
  sum.windows_total = static_cast<int64_t>(windows.size());
  std::mt19937_64 rng(o.seed);
  std::shuffle(windows.begin(), windows.end(), rng);

  const int32_t layers = static_cast<int32_t>(c.num_hidden_layers);
  const int64_t cap = std::min(o.max_rows, window_rows);
  std::vector<BlockData> mlp(layers), heads(layers);
  for (int32_t l = 0; l < layers; ++l) {
    mlp[l].dim = heads[l].dim = c.hidden_size;
    mlp[l].units = c.ffn_dim;
    heads[l].units = c.num_attention_heads;
    mlp[l].x.reserve(cap * c.hidden_size);
    mlp[l].y.reserve(cap * mlp[l].label_bytes());
    if (l > 0) {
      heads[l].x.reserve(cap * c.hidden_size);
      heads[l].y.reserve(cap * heads[l].label_bytes());
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Unavailable("cannot create " + out_dir + ": " + ec.message());

  Recorder rec(c);
  model.set_observer(&rec);
  model::CollectProgress report(progress, "collect");
  const int32_t bos = static_cast<int32_t>(c.bos_token_id);
  std::vector<int32_t> tokens;
  model::StepResult step;
  Status st;
  for (const Window& w : windows) {
    if (sum.rows >= cap) break;
    const std::vector<int32_t>& doc = documents[w.doc];
    tokens.assign(1, bos);
    tokens.insert(tokens.end(), doc.begin() + w.begin, doc.begin() + w.end);
    st = model::ForwardWindow(model, tokens, &step);
    if (st.ok()) st = rec.status();
    if (!st.ok()) break;
    const int64_t take = std::min<int64_t>(static_cast<int64_t>(tokens.size()), cap - sum.rows);
    rec.Append(take, &mlp, &heads);
    sum.rows += take;
    ++sum.windows;
    report.Update(sum.windows, sum.windows_total, sum.rows, cap, sum.rows);
  }
  model.set_observer(nullptr);
  if (!st.ok()) return st.WithContext("collect");
  sum.seconds = report.seconds();

  nlohmann::json jl = nlohmann::json::array();
  for (int32_t l = 0; l < layers; ++l) {
    int64_t active = 0;
    for (uint8_t byte : mlp[l].y) active += __builtin_popcount(byte);
    sum.mlp_active_fraction.push_back(double(active) / (double(sum.rows) * double(c.ffn_dim)));
    DEJA_RETURN_IF_ERROR(WriteLayerData(out_dir, l, mlp[l], heads[l]));
    jl.push_back({{"layer", l}, {"mlp_active_fraction", sum.mlp_active_fraction.back()}});
  }
  nlohmann::json j = {
      {"format", kDataFormat},
      {"model", o.model_dir},
      {"texts", o.texts},
      {"hidden_size", c.hidden_size},
      {"ffn_dim", c.ffn_dim},
      {"num_heads", c.num_attention_heads},
      {"num_layers", c.num_hidden_layers},
      {"rows", sum.rows},
      {"context", o.context},
      {"max_rows", o.max_rows},
      {"seed", o.seed},
      {"tokens_total", sum.tokens_total},
      {"windows", sum.windows},
      {"windows_total", sum.windows_total},
      {"seconds", sum.seconds},
      {"head_top_count", HeadTopCount(static_cast<int32_t>(c.num_attention_heads))},
      {"labels",
       "mlp.y: relu(fc1) > 0; heads.y: head among the ceil(0.3 * heads) largest attention-output "
       "L2 norms of its token (ties to the lower index); bit-packed U8, unit j = bit j % 8 of "
       "byte j / 8"},
      {"pairing",
       "layer_L mlp.x = attention-block input of layer L; heads.x = MLP-block input of layer L-1"},
      {"layers", jl}};
  DEJA_RETURN_IF_ERROR(model::WriteJsonFile(out_dir + "/meta.json", j));
  return sum;
}

}  // namespace deja::worker::dejavu
