// The CUDA backend's timed choice of cuBLASLt algorithm (core/backends/cuda/lt_gemm.cpp, "Algorithm
// choice"): a GEMM of >= 2^33 flops first seen eagerly has its heuristic candidates timed once, into
// scratch outputs, and the fastest is kept for the life of the backend.
//  - a timed FP8 GEMM is right (fp64 reference, the tolerances of cuda_gemm_test.cpp) and a second
//    call, on the cached choice, gives the same bits;
//  - with accumulate, the caller's D holds exactly old D + product after the first (timing) call:
//    the timing runs did not write it (data chosen so that every sum is exact in fp32);
//  - a GEMM first seen inside stream capture is not timed, and its graph replays and eager runs
//    give the same bits;
//  - TE_GEMM_TUNE=0, GEMMs below 2^33 flops, and GEMMs marked shape_varies, are not timed.
// Whether a key was timed is read from the TE_GEMM_TUNE_LOG=1 line on stderr.
#include "backends/backend.h"  // TE_HAVE_CUDA_BACKEND

#if TE_HAVE_CUDA_BACKEND
#include <cuda_runtime.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_support.h"
#include "numerics/numerics.h"

namespace te::gpu_test {
namespace {

// 2 m n k = 2^34 >= 2^33: timed.
constexpr int64_t kM = 2048, kN = 2048, kK = 2048;
const char kTuneLine[] = "te: gemm tune m=2048 n=2048 k=2048 ";

// Sets an environment variable for the life of the object, then restores it: LtGemm reads
// TE_GEMM_TUNE and TE_GEMM_TUNE_LOG when a backend is made.
class ScopedEnv {
 public:
  ScopedEnv(const char *name, const char *value) : name_(name) {
    const char *old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char *name_;
  bool had_ = false;
  std::string old_;
};

std::unique_ptr<Backend> make_backend(const char *tune) {
  ScopedEnv t("TE_GEMM_TUNE", tune), l("TE_GEMM_TUNE_LOG", "1");
  return make_cuda_backend(0);
}

size_t count_of(const std::string &text, const std::string &what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// E4M3 operands A [m, k] and B [n, k] (TN, libte's FP8 rule) with per-tensor scale_inv.
struct Operands {
  int64_t m = 0, n = 0, k = 0;
  std::vector<uint8_t> a, b;
  float scale_a = 1.0f, scale_b = 1.0f;
};

// Random codes with exponents 2^-3 .. 2^3 (as cuda_gemm_test.cpp's random_fp8), or, when
// `small_integers`, only +-1 and +-2: every product and every partial sum along k = 2048 is then an
// integer of magnitude <= 2^13, exact in the FP8 tensor cores' accumulator and in fp32.
Operands make_operands(uint32_t seed, int64_t m, int64_t n, int64_t k, bool small_integers) {
  std::mt19937 rng(seed);
  Operands o;
  o.m = m, o.n = n, o.k = k;
  auto fill = [&](std::vector<uint8_t> &v, int64_t count) {
    v.resize(static_cast<size_t>(count));
    std::uniform_int_distribution<int> e(7 - 3, 7 + 3), mant(0, 7), s(0, 1), one_or_two(7, 8);
    for (auto &c : v)
      c = small_integers ? static_cast<uint8_t>(s(rng) << 7 | one_or_two(rng) << 3)
                         : static_cast<uint8_t>(s(rng) << 7 | e(rng) << 3 | mant(rng));
  };
  fill(o.a, m * k);
  fill(o.b, n * k);
  if (small_integers) o.scale_a = 0.5f, o.scale_b = 2.0f;  // powers of two: the product stays exact
  else o.scale_a = 0.375f, o.scale_b = 1.25f;
  return o;
}

// The fp64 product and sum of |terms| at the checked elements: every row and every column at a
// multiple of 37 (each M and N tile of the output is met), so that the check stays cheap.
struct Reference {
  int64_t n = 0;
  std::vector<int64_t> index;      // i * n + j
  std::vector<double> sum, abs_sum;
};

Reference reference(const Operands &o) {
  std::vector<double> a(o.a.size()), b(o.b.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = fp8_to_float(o.a[i], DType::E4M3) * double(o.scale_a);
  for (size_t i = 0; i < b.size(); ++i) b[i] = fp8_to_float(o.b[i], DType::E4M3) * double(o.scale_b);
  Reference r;
  r.n = o.n;
  for (int64_t i = 0; i < o.m; ++i)
    for (int64_t j = 0; j < o.n; ++j) {
      if (i % 37 != 0 && j % 37 != 0) continue;
      const double *ar = &a[static_cast<size_t>(i * o.k)], *br = &b[static_cast<size_t>(j * o.k)];
      double s = 0, as = 0;
      for (int64_t kk = 0; kk < o.k; ++kk) {
        const double p = ar[kk] * br[kk];
        s += p, as += std::fabs(p);
      }
      r.index.push_back(i * o.n + j);
      r.sum.push_back(s);
      r.abs_sum.push_back(as);
    }
  return r;
}

// The GEMM's device buffers and arguments on one backend (allocated on its current stream).
struct DeviceGemm {
  DeviceBuffer a, b, sa, sb, d;
  GemmArgs args;

  DeviceGemm(Backend &be, const Operands &o, DType d_dtype, const std::vector<uint8_t> &d0)
      : a(be, o.a), b(be, o.b), sa(be, std::vector<float>{o.scale_a}), sb(be, std::vector<float>{o.scale_b}),
        d(be, d0) {
    const Device dev = be.device();
    args.a = make_view(a.get(), DType::E4M3, dev, o.m, o.k);
    args.b = make_view(b.get(), DType::E4M3, dev, o.n, o.k);
    args.a.scale_inv = sa.floats();
    args.b.scale_inv = sb.floats();
    args.transb = true;
    args.d = make_view(d.get(), d_dtype, dev, o.m, o.n);
    args.split_accumulator = true;
  }
};

// cuda_gemm_test.cpp's bound for an FP8 GEMM with the split accumulator into D's dtype:
// |got - ref| <= 2^-10 S + eps_out |ref|.
void expect_close(const Reference &r, const std::vector<uint8_t> &got, DType d) {
  const double eps_out = d == DType::BF16 ? std::ldexp(1.0, -8) : d == DType::F16 ? std::ldexp(1.0, -10)
                                                                                  : std::ldexp(1.0, -22);
  int64_t bad = 0;
  for (size_t e = 0; e < r.index.size(); ++e) {
    const double v = load_as_float(got.data(), d, r.index[e]);
    const double tol = std::ldexp(1.0, -10) * r.abs_sum[e] + eps_out * std::fabs(r.sum[e]) + 1e-30;
    if (!(std::fabs(v - r.sum[e]) <= tol) && bad++ < 5)
      ADD_FAILURE() << "D[" << r.index[e] / r.n << "," << r.index[e] % r.n << "]: gpu " << v << " ref " << r.sum[e]
                    << " tol " << tol;
  }
  EXPECT_EQ(bad, 0) << "elements out of tolerance";
}

// Each test makes its own backend, so that it sees its keys' first calls and the environment it sets.
class CudaGemmTuneTest : public GpuTest {};

TEST_F(CudaGemmTuneTest, TimedFp8GemmIsRightAndStable) {
  std::unique_ptr<Backend> be = make_backend("1");
  const Operands o = make_operands(11, kM, kN, kK, false);
  DeviceGemm g(*be, o, DType::BF16, std::vector<uint8_t>(static_cast<size_t>(kM * kN) * 2, 0));

  ::testing::internal::CaptureStderr();
  be->gemm(g.args);  // first call: the candidates are timed
  const std::vector<uint8_t> first = g.d.read<uint8_t>();
  be->gemm(g.args);  // the cached choice
  const std::vector<uint8_t> second = g.d.read<uint8_t>();
  const std::string log = ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(count_of(log, kTuneLine), 1u) << "expected one timing (TE_GEMM_TUNE_LOG line) for the key, stderr:\n"
                                          << log;
  expect_close(reference(o), first, DType::BF16);
  EXPECT_EQ(first, second) << "the second call (cached algorithm) differs from the first";
}

TEST_F(CudaGemmTuneTest, TimingLeavesTheCallersAccumulatorAlone) {
  std::unique_ptr<Backend> be = make_backend("1");
  const Operands o = make_operands(12, kM, kN, kK, true);
  // Old D: j / 32, |j| <= 64, so old D + one or two integer products (|.| <= 2^13) is exact in fp32.
  std::vector<float> d0(static_cast<size_t>(kM * kN));
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> j(-64, 64);
  for (float &v : d0) v = j(rng) / 32.0f;
  std::vector<uint8_t> d0_bytes(d0.size() * sizeof(float));
  std::memcpy(d0_bytes.data(), d0.data(), d0_bytes.size());
  DeviceGemm g(*be, o, DType::F32, d0_bytes);
  g.args.accumulate = true;
  const Reference r = reference(o);

  ::testing::internal::CaptureStderr();
  be->gemm(g.args);  // first call: timed into scratch, then D += product
  const std::vector<float> once = g.d.read<float>();
  be->gemm(g.args);  // the cached choice: D += product again
  const std::vector<float> twice = g.d.read<float>();
  const std::string log = ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(count_of(log, kTuneLine), 1u) << "expected one timing for the key, stderr:\n" << log;
  EXPECT_NE(log.find("accumulate=1"), std::string::npos) << log;
  int64_t bad = 0;
  for (size_t e = 0; e < r.index.size(); ++e) {
    const int64_t idx = r.index[e];
    const double want1 = double(d0[idx]) + r.sum[e], want2 = want1 + r.sum[e];
    if ((double(once[idx]) != want1 || double(twice[idx]) != want2) && bad++ < 5)
      ADD_FAILURE() << "D[" << idx / kN << "," << idx % kN << "]: old " << d0[idx] << " product " << r.sum[e]
                    << ": after one call " << once[idx] << " (want " << want1 << "), after two " << twice[idx]
                    << " (want " << want2 << ")";
  }
  EXPECT_EQ(bad, 0) << "D is not exactly old D + product: the timing runs touched it?";
}

TEST_F(CudaGemmTuneTest, GemmFirstSeenInCaptureIsUntimedAndReplaysLikeEager) {
  std::unique_ptr<Backend> be = make_backend("1");
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  be->set_stream(s);
  const Operands o = make_operands(14, kM, kN, kK, false);
  const std::vector<uint8_t> zeros(static_cast<size_t>(kM * kN) * 2, 0);
  std::vector<uint8_t> replayed, eager, replayed_again;
  std::string log;
  {
    DeviceGemm g(*be, o, DType::BF16, zeros);
    ::testing::internal::CaptureStderr();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    be->gemm(g.args);  // the key's first call: planned from heuristic #0, untimed
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    replayed = g.d.read<uint8_t>();
    be->copy_from_host(g.d.get(), zeros.data(), zeros.size());
    be->gemm(g.args);  // eager, same key: the plan made in capture
    eager = g.d.read<uint8_t>();
    be->copy_from_host(g.d.get(), zeros.data(), zeros.size());
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    replayed_again = g.d.read<uint8_t>();
    log = ::testing::internal::GetCapturedStderr();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  be.reset();
  cudaStreamDestroy(s);

  EXPECT_EQ(count_of(log, "te: gemm tune"), 0u) << "a key first seen in capture was timed, stderr:\n" << log;
  expect_close(reference(o), replayed, DType::BF16);
  EXPECT_EQ(replayed, eager) << "graph replay and eager run differ";
  EXPECT_EQ(replayed, replayed_again) << "graph replays before and after the eager run differ";
}

TEST_F(CudaGemmTuneTest, TuneOffAndSmallGemmsAreNotTimed) {
  const Operands big = make_operands(15, kM, kN, kK, false);
  {
    std::unique_ptr<Backend> be = make_backend("0");
    DeviceGemm g(*be, big, DType::BF16, std::vector<uint8_t>(static_cast<size_t>(kM * kN) * 2, 0));
    ::testing::internal::CaptureStderr();
    be->gemm(g.args);
    const std::vector<uint8_t> got = g.d.read<uint8_t>();
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(count_of(log, "te: gemm tune"), 0u) << "TE_GEMM_TUNE=0 still timed, stderr:\n" << log;
    expect_close(reference(big), got, DType::BF16);
  }
  {
    // 1024 x 1024 x 2048: 2 m n k = 2^32, below the 2^33 threshold.
    std::unique_ptr<Backend> be = make_backend("1");
    const Operands small = make_operands(16, 1024, 1024, 2048, false);
    DeviceGemm g(*be, small, DType::BF16, std::vector<uint8_t>(static_cast<size_t>(1024 * 1024) * 2, 0));
    ::testing::internal::CaptureStderr();
    be->gemm(g.args);
    (void)g.d.read<uint8_t>();
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(count_of(log, "te: gemm tune"), 0u) << "a 2^32-flop GEMM was timed, stderr:\n" << log;
  }
  {
    // A GEMM whose m or k varies from call to call (a GroupedLinear expert's token count): never
    // timed, whatever its size, and right.
    std::unique_ptr<Backend> be = make_backend("1");
    DeviceGemm g(*be, big, DType::BF16, std::vector<uint8_t>(static_cast<size_t>(kM * kN) * 2, 0));
    g.args.shape_varies = true;
    ::testing::internal::CaptureStderr();
    be->gemm(g.args);
    const std::vector<uint8_t> got = g.d.read<uint8_t>();
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(count_of(log, "te: gemm tune"), 0u) << "a shape_varies GEMM was timed, stderr:\n" << log;
    expect_close(reference(big), got, DType::BF16);
  }
}

}  // namespace
}  // namespace te::gpu_test
#endif  // TE_HAVE_CUDA_BACKEND
