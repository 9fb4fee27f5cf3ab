// Scale pointers that are only 4-byte aligned (two scales packed in one buffer, as a caller may
// well do) must work: cuBLASLt itself rejects them, so the backend realigns them.
#include <cmath>
#include <random>

#include "gpu/gpu_test_support.h"
#include "numerics/numerics.h"

namespace te::gpu_test {
namespace {

TEST_F(GpuTest, CudaGemmPackedScalePointers) {
  const int64_t m = 32, n = 48, k = 64;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint8_t> a(m * k), b(n * k);
  for (auto &c : a) c = float_to_e4m3(dist(rng));
  for (auto &c : b) c = float_to_e4m3(dist(rng));
  const std::vector<float> scales = {0.5f, 0.25f};  // A's at offset 0, B's at offset 4 bytes

  auto run = [&](Backend &be) {
    DeviceBuffer da(be, a), db(be, b), ds(be, scales), dd(be, static_cast<size_t>(m * n) * sizeof(float));
    GemmArgs g;
    g.a = make_view(da.get(), DType::E4M3, be.device(), m, k);
    g.b = make_view(db.get(), DType::E4M3, be.device(), n, k);
    g.a.scale_inv = ds.floats();
    g.b.scale_inv = ds.floats() + 1;
    g.transb = true;
    g.split_accumulator = true;
    g.d = make_view(dd.get(), DType::F32, be.device(), m, n);
    be.gemm(g);
    return dd.read<float>();
  };
  std::vector<float> want = run(*cpu), got = run(*gpu);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // Split accumulation on Hopper: partial sums in reduced precision between fp32 promotions.
    EXPECT_NEAR(got[i], want[i], 1e-3 * (std::fabs(want[i]) + 1.0)) << i;
  }
}

}  // namespace
}  // namespace te::gpu_test
