// te_linear on a CUDA context against the same layer on the CPU reference, for the three
// recipes: two training steps each (so delayed scaling runs with updated scales), then y, dx,
// dW, db compared within GEMM tolerance and every scaling state compared bit for bit (the
// amaxes, scales and histories are computed by bit-identical kernels on identical inputs).
#include <cmath>
#include <cstring>
#include <random>

#include "gpu/gpu_test_support.h"
#include "context/context.h"
#include "modules/linear/linear.h"

namespace te::gpu_test {
namespace {

constexpr int64_t kTokens = 64, kIn = 256, kOut = 144;

struct Result {
  std::vector<float> y, dx, dw, db, states;
};

Result run(Device device, RecipeKind kind, const std::vector<float> &x, const std::vector<float> &w,
           const std::vector<float> &b, const std::vector<float> &dy) {
  Context ctx(device);
  Backend &be = ctx.backend();
  LinearOptions o;
  o.in_features = kIn;
  o.out_features = kOut;
  o.activation_dtype = DType::F32;
  Linear lin(ctx, o);
  RecipeOptions ro = RecipeOptions::defaults(kind);
  ro.amax_history_len = 8;
  RecipeRef recipe = RecipeRef::adopt(Recipe::create(ro));
  DeviceBuffer dx_(be, x), dw_(be, w), db_(be, b), ddy(be, dy);
  DeviceBuffer dy_out(be, kTokens * kOut * sizeof(float)), ddx(be, kTokens * kIn * sizeof(float));
  DeviceBuffer ddw(be, kOut * kIn * sizeof(float)), ddb(be, kOut * sizeof(float));
  auto view = [&](const DeviceBuffer &buf, int64_t r, int64_t c) {
    return make_view(buf.get(), DType::F32, device, r, c);
  };
  TensorView bias = view(db_, 1, kOut), dbias = view(ddb, 1, kOut);
  bias.ndim = dbias.ndim = 1;
  bias.shape[0] = dbias.shape[0] = kOut;
  for (int step = 0; step < 2; ++step) {
    uint64_t t = ctx.autocast().begin(true, false, recipe.get(), nullptr);
    LinearBackwardCtx *bwd = linear_pool(ctx).acquire_backward_ctx(ctx);
    LinearForwardArgs fa;
    fa.input = view(dx_, kTokens, kIn);
    fa.weight = view(dw_, kOut, kIn);
    fa.bias = bias;
    linear_forward_compute(ctx, lin, fa, view(dy_out, kTokens, kOut), bwd->saved, nullptr, nullptr);
    ctx.autocast().end(t);
    LinearBackwardArgs ba;
    ba.dy = view(ddy, kTokens, kOut);
    ba.dx = view(ddx, kTokens, kIn);
    ba.dw = view(ddw, kOut, kIn);
    ba.db = dbias;
    linear_backward(ctx, *bwd, ba);
    linear_pool(ctx).release(bwd);
  }
  Result r{dy_out.read<float>(), ddx.read<float>(), ddw.read<float>(), ddb.read<float>(), {}};
  for (TensorRole role : {TensorRole::Input, TensorRole::Weight, TensorRole::GradOutput}) {
    const ScalingState &st = lin.core()->state(role);
    std::vector<float> h(static_cast<size_t>(st.history_len()));
    float s = 0, si = 0;
    st.read(be, &s, &si, h.data(), st.history_len());
    r.states.push_back(s);
    r.states.push_back(si);
    r.states.insert(r.states.end(), h.begin(), h.end());
  }
  return r;
}

// |got - want| within a GEMM's accumulation-order bound: relative to the row's scale.
void expect_close(const std::vector<float> &got, const std::vector<float> &want, const char *what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 2e-3 * scale + 1e-6) << what << " [" << i << "]";
}

class CudaLinear : public GpuTest, public ::testing::WithParamInterface<RecipeKind> {};

TEST_P(CudaLinear, MatchesCpuReference) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(kTokens * kIn), w(kOut * kIn), b(kOut), dy(kTokens * kOut);
  for (float &v : x) v = dist(rng);
  for (float &v : w) v = 0.05f * dist(rng);
  for (float &v : b) v = 0.1f * dist(rng);
  for (float &v : dy) v = 0.01f * dist(rng);
  Result cpu_r = run(Device{DeviceType::CPU, 0}, GetParam(), x, w, b, dy);
  Result gpu_r = run(Device{DeviceType::CUDA, 0}, GetParam(), x, w, b, dy);
  expect_close(gpu_r.y, cpu_r.y, "y");
  expect_close(gpu_r.dx, cpu_r.dx, "dx");
  expect_close(gpu_r.dw, cpu_r.dw, "dw");
  expect_close(gpu_r.db, cpu_r.db, "db");
  ASSERT_EQ(gpu_r.states.size(), cpu_r.states.size());
  EXPECT_EQ(std::memcmp(gpu_r.states.data(), cpu_r.states.data(), gpu_r.states.size() * sizeof(float)), 0)
      << "scaling states differ between the CUDA and CPU backends";
}

INSTANTIATE_TEST_SUITE_P(Recipes, CudaLinear,
                         ::testing::Values(RecipeKind::Delayed, RecipeKind::Current, RecipeKind::Block));

}  // namespace
}  // namespace te::gpu_test
