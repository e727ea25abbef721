// The validating op wrappers: every bad argument is rejected with InvalidArgument naming it, and
// never reaches a backend (which would read out of bounds), memory on another device included;
// and the host backends' memory API.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace deja::kernels {
namespace {

::testing::AssertionResult RejectsArg(const Status& s, const std::string& arg) {
  if (s.code() != StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure()
           << "want InvalidArgument about '" << arg << "', got " << s.ToString();
  }
  if (s.message().find("'" + arg + "'") == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message does not name '" << arg << "': " << s.message();
  }
  return ::testing::AssertionSuccess();
}

// A view says which memory it is in; a backend refuses any other, naming the op, the argument
// and both devices, before anything reads it. A host backend is given a view marked cuda:0 (its
// pointer is host memory; the check must stop the call by the mark alone).
::testing::AssertionResult RefusesDevice(const Status& s, const std::string& op,
                                         const std::string& arg) {
  const std::string want = op + ": argument '" + arg + "' is in cuda:0 memory but backend ";
  if (s.code() != StatusCode::kInvalidArgument || s.message().find(want) != 0 ||
      s.message().find("takes tensors in host memory") == std::string::npos) {
    return ::testing::AssertionFailure() << "want \"" << want << "... takes tensors in host "
                                         << "memory\", got " << s.ToString();
  }
  return ::testing::AssertionSuccess();
}

class OpsValidationTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> b_ = MakeCpuBackend(1);
  Tensor x_ = Tensor::Zeros(DType::kF32, {2, 8});
  Tensor out_ = Tensor::Zeros(DType::kF32, {2, 4});
  Tensor w_ = Tensor::Zeros(DType::kF16, {4, 8});
  Tensor bias_ = Tensor::Zeros(DType::kF16, {4});
};

TEST_F(OpsValidationTest, LinearAcceptsGoodArguments) {
  EXPECT_TRUE(
      Linear(*b_, x_.view(), w_.view(), bias_.view(), Activation::kRelu, false, out_.view()).ok());
  EXPECT_TRUE(
      Linear(*b_, x_.view(), w_.view(), TensorView{}, Activation::kNone, true, out_.view()).ok());
}

TEST_F(OpsValidationTest, LinearRejectsBadArguments) {
  auto lin = [&](TensorView x, TensorView w, TensorView bias, TensorView out) {
    return Linear(*b_, x, w, bias, Activation::kNone, false, out);
  };
  TensorView x = x_.view(), w = w_.view(), bias = bias_.view(), out = out_.view();
  TensorView bad = x;
  bad.dtype = DType::kF16;
  EXPECT_TRUE(RejectsArg(lin(bad, w, bias, out), "x"));
  bad = x;
  bad.data = nullptr;
  EXPECT_TRUE(RejectsArg(lin(bad, w, bias, out), "x"));
  bad = x;
  bad.shape = Shape{2, 7};
  EXPECT_TRUE(RejectsArg(lin(bad, w, bias, out), "x"));
  bad = w;
  bad.dtype = DType::kI32;
  EXPECT_TRUE(RejectsArg(lin(x, bad, bias, out), "w"));
  bad = w;
  bad.shape = Shape{32};
  EXPECT_TRUE(RejectsArg(lin(x, bad, bias, out), "w"));
  bad = bias;
  bad.shape = Shape{5};
  EXPECT_TRUE(RejectsArg(lin(x, w, bad, out), "bias"));
  bad = out;
  bad.shape = Shape{2, 5};
  EXPECT_TRUE(RejectsArg(lin(x, w, bias, bad), "out"));
  bad = out;
  bad.shape = Shape{1, 4};
  EXPECT_TRUE(RejectsArg(lin(x, w, bias, bad), "out"));
  // out aliasing x.
  TensorView alias{x_.data(), DType::kF32, Shape{2, 4}};
  EXPECT_TRUE(RejectsArg(lin(x, w, bias, alias), "out"));
  EXPECT_TRUE(RejectsArg(Linear(*b_, x, w, bias, static_cast<Activation>(9), false, out), "act"));
}

TEST_F(OpsValidationTest, EmbeddingRejectsBadArguments) {
  Tensor table = Tensor::Zeros(DType::kBF16, {10, 8});
  Tensor out = Tensor::Zeros(DType::kF32, {2, 8});
  std::vector<int32_t> ids = {1, 9};
  EXPECT_TRUE(Embedding(*b_, table.view(), ids.data(), 2, false, out.view()).ok());
  std::vector<int32_t> bad_ids = {1, 10};
  EXPECT_TRUE(
      RejectsArg(Embedding(*b_, table.view(), bad_ids.data(), 2, false, out.view()), "ids"));
  bad_ids = {-1, 0};
  EXPECT_TRUE(
      RejectsArg(Embedding(*b_, table.view(), bad_ids.data(), 2, false, out.view()), "ids"));
  EXPECT_TRUE(RejectsArg(Embedding(*b_, table.view(), nullptr, 2, false, out.view()), "ids"));
  EXPECT_TRUE(RejectsArg(Embedding(*b_, table.view(), ids.data(), 3, false, out.view()), "out"));
  EXPECT_TRUE(RejectsArg(Embedding(*b_, table.view(), ids.data(), -1, false, out.view()), "n"));
  TensorView bad_table = table.view();
  bad_table.shape = Shape{80};
  EXPECT_TRUE(RejectsArg(Embedding(*b_, bad_table, ids.data(), 2, false, out.view()), "table"));
}

TEST_F(OpsValidationTest, LayerNormRejectsBadArguments) {
  Tensor g = Tensor::Zeros(DType::kF32, {8}), beta = Tensor::Zeros(DType::kF32, {8});
  Tensor y = Tensor::Zeros(DType::kF32, {2, 8});
  EXPECT_TRUE(LayerNorm(*b_, x_.view(), g.view(), beta.view(), 1e-5f, y.view()).ok());
  EXPECT_TRUE(LayerNorm(*b_, x_.view(), g.view(), beta.view(), 1e-5f, x_.view()).ok());
  Tensor g7 = Tensor::Zeros(DType::kF32, {7});
  EXPECT_TRUE(
      RejectsArg(LayerNorm(*b_, x_.view(), g7.view(), beta.view(), 1e-5f, y.view()), "gamma"));
  Tensor beta16 = Tensor::Zeros(DType::kF16, {8});
  EXPECT_TRUE(
      RejectsArg(LayerNorm(*b_, x_.view(), g.view(), beta16.view(), 1e-5f, y.view()), "beta"));
  EXPECT_TRUE(RejectsArg(LayerNorm(*b_, x_.view(), g.view(), beta.view(), 0.f, y.view()), "eps"));
  EXPECT_TRUE(
      RejectsArg(LayerNorm(*b_, x_.view(), g.view(), beta.view(), 1e-5f, out_.view()), "out"));
  // Partial overlap (not the exact in-place case).
  Tensor big = Tensor::Zeros(DType::kF32, {3, 8});
  TensorView in{big.data(), DType::kF32, Shape{2, 8}};
  TensorView overlap{big.as<float>() + 1, DType::kF32, Shape{2, 8}};
  EXPECT_TRUE(RejectsArg(LayerNorm(*b_, in, g.view(), beta.view(), 1e-5f, overlap), "out"));
}

TEST_F(OpsValidationTest, AttentionRejectsBadArguments) {
  const int32_t heads = 2, d = 4, cap = 3;
  Tensor q = Tensor::Zeros(DType::kF32, {1, heads * d});
  Tensor o = Tensor::Zeros(DType::kF32, {1, heads * d});
  std::vector<float> k(heads * cap * d), v(heads * cap * d);
  std::vector<int32_t> slot_pos(heads * cap, 0);
  int32_t q_pos = 0;
  AttentionArgs good;
  good.q = q.view();
  good.q_pos = &q_pos;
  good.kv = {k.data(), v.data(), slot_pos.data(), cap, cap, nullptr};
  good.heads = heads;
  good.head_dim = d;
  good.out = o.view();
  EXPECT_TRUE(Attention(*b_, good).ok());
  auto expect_bad = [&](auto mutate, const char* arg) {
    AttentionArgs a = good;
    mutate(a);
    EXPECT_TRUE(RejectsArg(Attention(*b_, a), arg));
  };
  expect_bad([](AttentionArgs& a) { a.heads = 0; }, "heads");
  expect_bad([](AttentionArgs& a) { a.head_dim = 3; }, "q");
  expect_bad([](AttentionArgs& a) { a.kv.used = 4; }, "kv.used");
  expect_bad([](AttentionArgs& a) { a.kv.used = -1; }, "kv.used");
  expect_bad([](AttentionArgs& a) { a.kv.capacity = 0; }, "kv.capacity");
  expect_bad([](AttentionArgs& a) { a.kv.k = nullptr; }, "kv.k");
  expect_bad([](AttentionArgs& a) { a.kv.v = nullptr; }, "kv.v");
  expect_bad([](AttentionArgs& a) { a.kv.slot_pos = nullptr; }, "kv.slot_pos");
  expect_bad([](AttentionArgs& a) { a.q_pos = nullptr; }, "q_pos");
  expect_bad([](AttentionArgs& a) { a.scale = std::numeric_limits<float>::infinity(); }, "scale");
  expect_bad([&](AttentionArgs& a) { a.out = q.view(); }, "out");
  int32_t negative = -1;
  expect_bad([&](AttentionArgs& a) { a.q_pos = &negative; }, "q_pos");
  // Queries and cache in another device's memory than the backend's.
  AttentionArgs a = good;
  a.kv.device = Device::Cuda(0);
  EXPECT_TRUE(RefusesDevice(Attention(*b_, a), "attention", "kv"));
  a = good;
  a.q.device = Device::Cuda(0);
  EXPECT_TRUE(RefusesDevice(Attention(*b_, a), "attention", "q"));
}

TEST_F(OpsValidationTest, AttentionRejectsBadHeadIds) {
  // Head-sparse: 2 selected heads of a 3-head cache.
  const int32_t cache_heads = 3, heads = 2, d = 4, cap = 3;
  Tensor q = Tensor::Zeros(DType::kF32, {1, heads * d});
  Tensor o = Tensor::Zeros(DType::kF32, {1, heads * d});
  std::vector<float> k(cache_heads * cap * d), v(cache_heads * cap * d);
  std::vector<float> score(cache_heads * cap);
  std::vector<int32_t> slot_pos(cache_heads * cap, 0);
  std::vector<int32_t> head_ids = {2, 0};
  int32_t q_pos = 0;
  AttentionArgs good;
  good.q = q.view();
  good.q_pos = &q_pos;
  good.kv = {k.data(), v.data(), slot_pos.data(), cap, cap, score.data()};
  good.heads = heads;
  good.head_dim = d;
  good.out = o.view();
  good.head_ids = head_ids.data();
  good.cache_heads = cache_heads;
  EXPECT_TRUE(Attention(*b_, good).ok());
  auto expect_bad = [&](auto mutate, const char* arg) {
    AttentionArgs a = good;
    mutate(a);
    EXPECT_TRUE(RejectsArg(Attention(*b_, a), arg));
  };
  std::vector<int32_t> out_of_range = {3, 0}, negative = {0, -1}, twice = {1, 1};
  expect_bad([&](AttentionArgs& a) { a.head_ids = out_of_range.data(); }, "head_ids");
  expect_bad([&](AttentionArgs& a) { a.head_ids = negative.data(); }, "head_ids");
  expect_bad([&](AttentionArgs& a) { a.head_ids = twice.data(); }, "head_ids");
  expect_bad([](AttentionArgs& a) { a.cache_heads = 0; }, "cache_heads");
  expect_bad([](AttentionArgs& a) { a.cache_heads = 2; }, "head_ids");  // id 2 out of range now
  // q and out are as wide as the selected heads, not the cache's.
  Tensor wide = Tensor::Zeros(DType::kF32, {1, cache_heads * d});
  expect_bad([&](AttentionArgs& a) { a.q = wide.view(); }, "q");
  expect_bad([&](AttentionArgs& a) { a.out = wide.view(); }, "out");
  // Without head_ids, cache_heads must be 0 or heads.
  expect_bad(
      [](AttentionArgs& a) {
        a.head_ids = nullptr;
        a.cache_heads = 3;
      },
      "cache_heads");
}

TEST_F(OpsValidationTest, GatherLinearRejectsBadArguments) {
  // w_ [4, 8] f16, x_ [2, 8]; 3 selected rows.
  std::vector<int32_t> rows = {3, 0, 3};
  Tensor out = Tensor::Zeros(DType::kF32, {2, 3});
  auto gl = [&](TensorView x, TensorView w, TensorView bias, const int32_t* r, int64_t n,
                TensorView o) {
    return GatherLinear(*b_, x, w, bias, r, n, Activation::kRelu, false, o);
  };
  TensorView x = x_.view(), w = w_.view(), bias = bias_.view(), o = out.view();
  EXPECT_TRUE(gl(x, w, bias, rows.data(), 3, o).ok());
  EXPECT_TRUE(gl(x, w, TensorView{}, rows.data(), 3, o).ok());
  // Zero rows of x: a no-op.
  TensorView x0{x_.data(), DType::kF32, Shape{0, 8}}, o0{out.data(), DType::kF32, Shape{0, 3}};
  EXPECT_TRUE(gl(x0, w, bias, rows.data(), 3, o0).ok());

  std::vector<int32_t> bad_rows = {0, 4, 1};
  EXPECT_TRUE(RejectsArg(gl(x, w, bias, bad_rows.data(), 3, o), "rows"));
  bad_rows = {0, 1, -1};
  EXPECT_TRUE(RejectsArg(gl(x, w, bias, bad_rows.data(), 3, o), "rows"));
  EXPECT_TRUE(RejectsArg(gl(x, w, bias, nullptr, 3, o), "rows"));
  EXPECT_TRUE(RejectsArg(gl(x, w, bias, rows.data(), 0, o), "n_rows"));
  EXPECT_TRUE(RejectsArg(gl(x, w, bias, rows.data(), 2, o), "out"));
  TensorView bad = x;
  bad.shape = Shape{2, 7};
  EXPECT_TRUE(RejectsArg(gl(bad, w, bias, rows.data(), 3, o), "x"));
  bad = x;
  bad.dtype = DType::kF16;
  EXPECT_TRUE(RejectsArg(gl(bad, w, bias, rows.data(), 3, o), "x"));
  bad = w;
  bad.dtype = DType::kI32;
  EXPECT_TRUE(RejectsArg(gl(x, bad, bias, rows.data(), 3, o), "w"));
  bad = w;
  bad.shape = Shape{32};
  EXPECT_TRUE(RejectsArg(gl(x, bad, bias, rows.data(), 3, o), "w"));
  Tensor bias3 = Tensor::Zeros(DType::kF16, {3});  // n_rows elements, not R
  EXPECT_TRUE(RejectsArg(gl(x, w, bias3.view(), rows.data(), 3, o), "bias"));
  bad = o;
  bad.shape = Shape{1, 3};
  EXPECT_TRUE(RejectsArg(gl(x, w, bias, rows.data(), 3, bad), "out"));
  TensorView alias{x_.data(), DType::kF32, Shape{2, 3}};
  EXPECT_TRUE(RejectsArg(gl(x, w, bias, rows.data(), 3, alias), "out"));
  EXPECT_TRUE(RejectsArg(
      GatherLinear(*b_, x, w, bias, rows.data(), 3, static_cast<Activation>(9), false, o), "act"));
}

TEST_F(OpsValidationTest, GatherLinearTRejectsBadArguments) {
  // wt [6, 4] bf16 (R = 6, N = 4); x [2, 3] for 3 selected rows; out [2, 4].
  Tensor wt = Tensor::Zeros(DType::kBF16, {6, 4});
  Tensor x = Tensor::Zeros(DType::kF32, {2, 3});
  std::vector<int32_t> rows = {5, 1, 5};
  auto glt = [&](TensorView xv, TensorView w, const int32_t* r, int64_t n, TensorView o) {
    return GatherLinearT(*b_, xv, w, r, n, true, o);
  };
  TensorView xv = x.view(), w = wt.view(), o = out_.view();
  EXPECT_TRUE(glt(xv, w, rows.data(), 3, o).ok());
  TensorView x0{x.data(), DType::kF32, Shape{0, 3}}, o0{out_.data(), DType::kF32, Shape{0, 4}};
  EXPECT_TRUE(glt(x0, w, rows.data(), 3, o0).ok());

  std::vector<int32_t> bad_rows = {6, 0, 0};
  EXPECT_TRUE(RejectsArg(glt(xv, w, bad_rows.data(), 3, o), "rows"));
  bad_rows = {0, -3, 0};
  EXPECT_TRUE(RejectsArg(glt(xv, w, bad_rows.data(), 3, o), "rows"));
  EXPECT_TRUE(RejectsArg(glt(xv, w, nullptr, 3, o), "rows"));
  EXPECT_TRUE(RejectsArg(glt(xv, w, rows.data(), 0, o), "n_rows"));
  EXPECT_TRUE(RejectsArg(glt(xv, w, rows.data(), 2, o), "x"));  // x has 3 columns
  TensorView bad = w;
  bad.dtype = DType::kI32;
  EXPECT_TRUE(RejectsArg(glt(xv, bad, rows.data(), 3, o), "wt"));
  bad = w;
  bad.shape = Shape{24};
  EXPECT_TRUE(RejectsArg(glt(xv, bad, rows.data(), 3, o), "wt"));
  bad = o;
  bad.shape = Shape{2, 5};
  EXPECT_TRUE(RejectsArg(glt(xv, w, rows.data(), 3, bad), "out"));
  bad = o;
  bad.shape = Shape{1, 4};
  EXPECT_TRUE(RejectsArg(glt(xv, w, rows.data(), 3, bad), "out"));
  bad = xv;
  bad.dtype = DType::kBF16;
  EXPECT_TRUE(RejectsArg(glt(bad, w, rows.data(), 3, o), "x"));
  TensorView alias{x.data(), DType::kF32, Shape{1, 4}};
  TensorView x1{x.data(), DType::kF32, Shape{1, 3}};
  EXPECT_TRUE(RejectsArg(glt(x1, w, rows.data(), 3, alias), "out"));
}

TEST_F(OpsValidationTest, AddLogSoftmaxTopKRejectBadArguments) {
  Tensor y = Tensor::Zeros(DType::kF32, {2, 8});
  Tensor bias = Tensor::Zeros(DType::kBF16, {8});
  EXPECT_TRUE(Add(*b_, x_.view(), bias.view(), y.view()).ok());
  EXPECT_TRUE(RejectsArg(Add(*b_, x_.view(), TensorView{}, out_.view()), "out"));
  EXPECT_TRUE(RejectsArg(Add(*b_, x_.view(), TensorView{}, x_.view()), "out"));
  Tensor bias7 = Tensor::Zeros(DType::kF32, {7});
  EXPECT_TRUE(RejectsArg(Add(*b_, x_.view(), bias7.view(), y.view()), "bias"));

  EXPECT_TRUE(LogSoftmax(*b_, x_.view(), x_.view()).ok());
  EXPECT_TRUE(RejectsArg(LogSoftmax(*b_, x_.view(), out_.view()), "out"));
  TensorView half = x_.view();
  half.dtype = DType::kF16;
  EXPECT_TRUE(RejectsArg(LogSoftmax(*b_, half, y.view()), "x"));

  float vals[16];
  int32_t idx[16];
  EXPECT_TRUE(TopK(*b_, x_.view(), 8, vals, idx).ok());
  EXPECT_TRUE(RejectsArg(TopK(*b_, x_.view(), 0, vals, idx), "k"));
  EXPECT_TRUE(RejectsArg(TopK(*b_, x_.view(), 9, vals, idx), "k"));
  EXPECT_TRUE(RejectsArg(TopK(*b_, x_.view(), 2, nullptr, idx), "values"));
  EXPECT_TRUE(RejectsArg(TopK(*b_, x_.view(), 2, vals, nullptr), "indices"));
}

TEST_F(OpsValidationTest, ViewsOnAnotherDeviceAreRefusedByName) {
  auto on_cuda = [](TensorView v) {
    v.device = Device::Cuda(0);
    return v;
  };
  TensorView x = x_.view(), w = w_.view(), bias = bias_.view(), out = out_.view();
  Status s = Linear(*b_, on_cuda(x), w, bias, Activation::kNone, false, out);
  EXPECT_TRUE(RefusesDevice(s, "linear", "x")) << s.ToString();
  EXPECT_TRUE(RefusesDevice(Linear(*b_, x, on_cuda(w), bias, Activation::kNone, false, out),
                            "linear", "w"));
  EXPECT_TRUE(RefusesDevice(Linear(*b_, x, w, on_cuda(bias), Activation::kNone, false, out),
                            "linear", "bias"));
  EXPECT_TRUE(RefusesDevice(Linear(*b_, x, w, bias, Activation::kNone, false, on_cuda(out)),
                            "linear", "out"));
  // An absent bias is in no memory.
  EXPECT_TRUE(Linear(*b_, x, w, on_cuda(TensorView{}), Activation::kNone, false, out).ok());

  const int32_t rows[2] = {0, 3};
  Tensor out2 = Tensor::Zeros(DType::kF32, {2, 2});
  EXPECT_TRUE(RefusesDevice(GatherLinear(*b_, x, on_cuda(w), TensorView{}, rows, 2,
                                         Activation::kNone, false, out2.view()),
                            "gather_linear", "w"));
  Tensor xt = Tensor::Zeros(DType::kF32, {2, 2}), out8 = Tensor::Zeros(DType::kF32, {2, 8});
  Tensor wt = Tensor::Zeros(DType::kF16, {4, 8});
  EXPECT_TRUE(
      RefusesDevice(GatherLinearT(*b_, xt.view(), wt.view(), rows, 2, false, on_cuda(out8.view())),
                    "gather_linear_t", "out"));
  Tensor table = Tensor::Zeros(DType::kF32, {4, 8});
  EXPECT_TRUE(RefusesDevice(Embedding(*b_, on_cuda(table.view()), rows, 2, false, x_.view()),
                            "embedding", "table"));
  Tensor gamma = Tensor::Zeros(DType::kF32, {8});
  EXPECT_TRUE(RefusesDevice(
      LayerNorm(*b_, x_.view(), gamma.view(), on_cuda(gamma.view()), 1e-5f, x_.view()),
      "layer_norm", "beta"));
  Tensor y = Tensor::Zeros(DType::kF32, {2, 8});
  EXPECT_TRUE(RefusesDevice(Add(*b_, on_cuda(x_.view()), TensorView{}, y.view()), "add", "x"));
  EXPECT_TRUE(RefusesDevice(LogSoftmax(*b_, x_.view(), on_cuda(y.view())), "log_softmax", "out"));
  float vals[16];
  int32_t idx[16];
  EXPECT_TRUE(RefusesDevice(TopK(*b_, on_cuda(x_.view()), 2, vals, idx), "top_k", "x"));
}

// Allocate, the raw copies and the whole-tensor copies round-trip on the host backends, whose
// memory is the host's.
TEST(BackendMemory, HostBackendsRoundTrip) {
  for (auto& b : {MakeReferenceBackend(), MakeCpuBackend(1)}) {
    SCOPED_TRACE(b->name());
    EXPECT_EQ(b->device(), Device::Host());
    EXPECT_EQ(b->device().ToString(), "host");
    auto t = b->Allocate(DType::kBF16, Shape{3, 5});
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->device(), Device::Host());
    EXPECT_EQ(t->view().device, Device::Host());
    EXPECT_EQ(t->shape(), (Shape{3, 5}));
    EXPECT_EQ(t->dtype(), DType::kBF16);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % 64, 0u);

    Tensor host = Tensor::Empty(DType::kF32, {4, 3});
    for (int i = 0; i < 12; ++i) host.as<float>()[i] = 0.5f * i - 2.f;
    auto on = b->ToBackend(host);
    ASSERT_TRUE(on.ok()) << on.status().ToString();
    EXPECT_NE(on->data(), host.data());
    EXPECT_EQ(on->shape(), host.shape());
    auto back = b->ToHost(on->view());
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(std::memcmp(back->data(), host.data(), host.bytes()), 0);

    std::vector<float> raw(12, -1.f);
    ASSERT_TRUE(b->CopyHostToDevice(on->data(), raw.data(), 12 * sizeof(float)).ok());
    std::vector<float> again(12, 0.f);
    ASSERT_TRUE(b->CopyDeviceToHost(again.data(), on->data(), 12 * sizeof(float)).ok());
    EXPECT_EQ(again, raw);
    EXPECT_TRUE(b->Synchronize().ok());

    // Empty tensors copy too; tiled views and memory on another device are refused by name.
    auto none = b->ToBackend(Tensor::Empty(DType::kF32, {0, 7}));
    ASSERT_TRUE(none.ok()) << none.status().ToString();
    EXPECT_EQ(none->numel(), 0);
    TensorView tiled;
    Tensor tiles = Tile16(Tensor::Zeros(DType::kBF16, {16, 4}).view(), &tiled);
    EXPECT_EQ(b->ToBackend(tiled).status().code(), StatusCode::kInvalidArgument);
    TensorView elsewhere = host.view();
    elsewhere.device = Device::Cuda(0);
    auto refused = b->ToHost(elsewhere);
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("cuda:0"), std::string::npos);
    EXPECT_EQ(b->ToBackend(elsewhere).status().code(), StatusCode::kInvalidArgument);
  }
}

// A tensor owning memory through a backend's free function releases it with that function.
int adopted_frees = 0;
void CountingFree(void* p) {
  ++adopted_frees;
  std::free(p);
}

TEST(BackendMemory, AdoptedTensorsFreeWithTheirFunction) {
  {
    Tensor t =
        Tensor::Adopt(std::malloc(64), DType::kF32, Shape{4, 4}, Device::Cuda(1), &CountingFree);
    EXPECT_EQ(t.device().ToString(), "cuda:1");
    EXPECT_EQ(t.view().device, Device::Cuda(1));
    Tensor moved = std::move(t);
    EXPECT_EQ(adopted_frees, 0);
  }
  EXPECT_EQ(adopted_frees, 1);
  Tensor host = Tensor::Zeros(DType::kF32, {2});
  EXPECT_TRUE(host.device().is_host());
}

TEST(Backends, CudaReportsWhyUnavailable) {
  auto cuda = MakeCudaBackend(0);
  if (cuda.ok()) GTEST_SKIP() << "a CUDA backend is available in this build";
  EXPECT_EQ(cuda.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(cuda.status().message().empty());
}

TEST(Backends, OpNamesAreDistinct) {
  std::set<std::string> names;
  for (int i = 0; i < static_cast<int>(OpId::kCount); ++i) {
    names.insert(OpName(static_cast<OpId>(i)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(OpId::kCount));
  EXPECT_EQ(names.count("?"), 0u);
}

// Every op of the list has a slot filled in every backend here (a backend that supports an op
// for some dtype must be able to run it), and the CPU backend starts from the reference's table.
TEST(Backends, EveryBackendFillsEveryOpItSupports) {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(MakeReferenceBackend());
  backends.push_back(MakeCpuBackend(1));
  if (auto cuda = MakeCudaBackend(0); cuda.ok()) backends.push_back(std::move(*cuda));
  for (const auto& b : backends) {
    const OpTable& t = b->ops();
#define DEJA_CHECK_SLOT(id, member, fn, dtypes)                                              \
  {                                                                                          \
    bool any = false;                                                                        \
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8})                     \
      any |= b->Supports(OpId::id, d);                                                       \
    EXPECT_TRUE(!any || t.member != nullptr) << b->name() << " supports " << #member         \
                                             << " but leaves its slot empty";                \
  }
    DEJA_KERNEL_OPS(DEJA_CHECK_SLOT)
#undef DEJA_CHECK_SLOT
  }
  EXPECT_EQ(MakeCpuBackend(1)->ops().convert, ReferenceOpTable().convert);
  EXPECT_NE(MakeCpuBackend(1)->ops().linear, ReferenceOpTable().linear);
}

// The KV-cache and conversion ops: every bad argument named, nothing written.
TEST(KvOpsValidationTest, KvWriteKvEvictAndConvertNameTheirBadArguments) {
  auto ref = MakeReferenceBackend();
  auto cpu = MakeCpuBackend(1);
  constexpr int32_t kHeads = 2, kDim = 4, kCap = 8;
  std::vector<float> k(kCap * kHeads * kDim, 0.5f), v = k, cache(kHeads * kCap * kDim, 0.f);
  std::vector<float> vcache = cache, score(kHeads * kCap, 0.f);
  std::vector<int32_t> pos(kHeads * kCap, -1), blocks = {0};
  KvView kv;
  kv.k = cache.data();
  kv.v = vcache.data();
  kv.slot_pos = pos.data();
  kv.score = score.data();
  kv.capacity = kCap;
  kv.used = kCap;
  TensorView kt{k.data(), DType::kF32, Shape{2, kHeads * kDim}};
  TensorView vt{v.data(), DType::kF32, Shape{2, kHeads * kDim}};
  std::vector<int32_t> slots = {0, 1, 2, 3}, positions = {0, 1};
  EXPECT_TRUE(KvWrite(*ref, kv, kHeads, kDim, slots.data(), positions.data(), 2, kt, vt).ok());
  std::vector<int32_t> twice = {0, 1, 3, 3}, outside = {0, 1, 2, kCap}, negative = {0, -1};
  EXPECT_TRUE(RejectsArg(KvWrite(*ref, kv, kHeads, kDim, twice.data(), positions.data(), 2, kt, vt),
                         "slots"));
  EXPECT_TRUE(RejectsArg(
      KvWrite(*ref, kv, kHeads, kDim, outside.data(), positions.data(), 2, kt, vt), "slots"));
  EXPECT_TRUE(RejectsArg(KvWrite(*ref, kv, kHeads, kDim, slots.data(), negative.data(), 2, kt, vt),
                         "positions"));
  EXPECT_TRUE(
      RejectsArg(KvWrite(*ref, kv, kHeads, kDim, slots.data(), positions.data(), 1, kt, vt), "k"));
  KvView paged = kv;  // the CPU backend and the reference read paged caches too
  paged.blocks = blocks.data();
  paged.block_slots = kCap;
  paged.block_stride = kHeads * kCap;
  EXPECT_TRUE(cpu->SupportsPagedKv());
  EXPECT_TRUE(KvWrite(*cpu, paged, kHeads, kDim, slots.data(), positions.data(), 2, kt, vt).ok());
  EXPECT_TRUE(KvWrite(*ref, paged, kHeads, kDim, slots.data(), positions.data(), 2, kt, vt).ok());

  std::vector<int32_t> victims(kHeads * 2, 7);
  KvEvictArgs args;
  args.excess = 1;
  args.oldest_recent = 1;
  args.length = 2;
  EXPECT_TRUE(KvEvict(*ref, kv, kHeads, args, victims.data()).ok());
  // Position 0, the one candidate of each head: slot 0 of head 0, slot 2 of head 1.
  EXPECT_EQ(victims[0], 0);
  EXPECT_EQ(victims[1], 2);
  EXPECT_EQ(pos[0], -1);
  EXPECT_EQ(pos[kCap + 2], -1);
  args.excess = 0;
  EXPECT_TRUE(RejectsArg(KvEvict(*ref, kv, kHeads, args, victims.data()), "excess"));
  args.excess = 1;
  args.oldest_recent = 3;
  EXPECT_TRUE(RejectsArg(KvEvict(*ref, kv, kHeads, args, victims.data()), "oldest_recent"));
  args.oldest_recent = 1;
  KvView no_score = kv;
  no_score.score = nullptr;
  EXPECT_TRUE(RejectsArg(KvEvict(*ref, no_score, kHeads, args, victims.data()), "kv.score"));
  EXPECT_TRUE(RejectsArg(KvEvict(*ref, kv, kHeads, args, nullptr), "victims"));
  for (float decay : {0.f, -0.5f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    args.decay = decay;
    EXPECT_TRUE(RejectsArg(KvEvict(*ref, kv, kHeads, args, victims.data()), "decay")) << decay;
  }
  args.decay = 0.5f;  // decay only: no victims, no score buffer refused
  args.excess = 0;
  args.rank = KvRank::kPosition;
  EXPECT_TRUE(RejectsArg(KvEvict(*ref, no_score, kHeads, args, victims.data()), "kv.score"));
  EXPECT_TRUE(KvEvict(*ref, kv, kHeads, args, victims.data()).ok());
  args.decay = 1.f;

  std::vector<uint16_t> half(8);
  TensorView src{k.data(), DType::kF32, Shape{8}}, dst{half.data(), DType::kBF16, Shape{8}};
  EXPECT_TRUE(Convert(*ref, src, dst).ok());
  EXPECT_EQ(half[0], FloatToBF16(0.5f));
  TensorView short_dst{half.data(), DType::kF16, Shape{7}};
  EXPECT_TRUE(RejectsArg(Convert(*ref, src, short_dst), "dst"));
  TensorView ints{pos.data(), DType::kI32, Shape{8}};
  EXPECT_TRUE(RejectsArg(Convert(*ref, ints, dst), "src"));

  std::vector<float> act(12, 1.0f);
  std::vector<uint8_t> keep = {1, 0, 1, 0, 0, 1};
  TensorView x{act.data(), DType::kF32, Shape{2, 6}};
  EXPECT_TRUE(RejectsArg(MaskUnits(*ref, x, keep.data(), 4), "unit_width"));
  EXPECT_TRUE(RejectsArg(MaskUnits(*ref, x, keep.data(), 0), "unit_width"));
  EXPECT_TRUE(RejectsArg(MaskUnits(*ref, x, nullptr, 2), "keep"));
  EXPECT_TRUE(RejectsArg(MaskUnits(*ref, ints, keep.data(), 1), "x"));
  EXPECT_TRUE(MaskUnits(*ref, x, keep.data(), 2).ok());
  EXPECT_EQ(act, (std::vector<float>{1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1}));
}

}  // namespace
}  // namespace deja::kernels
