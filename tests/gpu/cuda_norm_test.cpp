// LayerNorm / RMSNorm on the CUDA backend against the CPU reference, through the Backend interface.
// Forward: bit for bit (mu, rsigma, y, the FP8 codes of out and out_t, scale_inv, amax), since
// numerics/norm.h fixes every fp32 operation. Backward: dx within a few ulps of the CPU's (the
// row sums have the same order, so in practice identical), dgamma / dbeta within the rounding
// budget of their column sums (accumulated in another order), and two GPU runs bit-identical.
// TE_GPU_TEST_QUICK=1 leaves out the largest shapes (for runs under compute-sanitizer).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_support.h"
#include "numerics/numerics.h"

namespace te::gpu_test {
namespace {

constexpr Device kCpu{DeviceType::CPU, 0};
constexpr Device kGpu{DeviceType::CUDA, 0};

bool quick() {
  const char *q = std::getenv("TE_GPU_TEST_QUICK");
  return q != nullptr && q[0] == '1';
}

const DType kInTypes[] = {DType::F32, DType::BF16, DType::F16};
const int64_t kRows[] = {1, 3, 16, 257, 2048};
const int64_t kHidden[] = {1, 64, 100, 768, 4096, 14336};

// Values with a row-dependent offset and spread (LayerNorm's mean matters), exactly
// representable in dtype t.
std::vector<float> row_values(int64_t rows, int64_t cols, uint32_t seed, DType t) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float offset = 4.0f * normal(rng), spread = std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4);
    for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = offset + spread * normal(rng);
  }
  std::vector<uint8_t> b(dtype_size(t));
  for (auto &x : v) {
    store_from_float(b.data(), t, 0, x);
    x = load_as_float(b.data(), t, 0);
  }
  return v;
}

std::vector<uint8_t> to_bytes(const std::vector<float> &v, DType t) {
  std::vector<uint8_t> b(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) store_from_float(b.data(), t, static_cast<int64_t>(i), v[i]);
  return b;
}

template <class T>
std::vector<uint8_t> raw(const std::vector<T> &v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The same host data on both backends.
struct Twin {
  Twin(Backend &cpu, Backend &gpu, const std::vector<uint8_t> &host) : c(cpu, host), g(gpu, host) {}
  Twin(Backend &cpu, Backend &gpu, size_t bytes) : c(cpu, bytes), g(gpu, bytes) {}
  void *on(int b) const { return b == 0 ? c.get() : g.get(); }
  float *floats(int b) const { return static_cast<float *>(on(b)); }
  DeviceBuffer c, g;
};

// First differing element of two buffers of elem-byte elements, or "". For float dtypes
// (elem_t F32 / F16 / BF16) two NaNs count as equal (NaN payloads are not part of the contract).
std::string first_diff(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b, size_t elem, DType elem_t) {
  if (a.size() != b.size()) return "size " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); i += elem) {
    if (std::memcmp(&a[i], &b[i], elem) == 0) continue;
    if (elem_t == DType::F32 || elem_t == DType::F16 || elem_t == DType::BF16) {
      if (std::isnan(load_as_float(&a[i], elem_t, 0)) && std::isnan(load_as_float(&b[i], elem_t, 0))) continue;
    }
    uint32_t x = 0, y = 0;
    std::memcpy(&x, &a[i], elem);
    std::memcpy(&y, &b[i], elem);
    char text[160];
    std::snprintf(text, sizeof text, "element %zu: cpu 0x%x gpu 0x%x (of %zu)", i / elem, x, y, a.size() / elem);
    return text;
  }
  return "";
}

#define EXPECT_SAME(twin, elem, elem_t, what)                                                            \
  do {                                                                                                   \
    const std::string d_ = first_diff((twin).c.read<uint8_t>(), (twin).g.read<uint8_t>(), (elem), (elem_t)); \
    EXPECT_EQ(d_, "") << what;                                                                          \
  } while (0)

struct FwdCase {
  NormKind kind;
  bool zero_centered;
  DType in;
  DType fmt, fmt_t;  // FP8 formats of out and out_t
  bool y, stats, out, out_t, amax, beta;
  int x_offset = 0;  // elements: a nonzero offset makes x unaligned (the generic kernels)
  bool specials = false;
};

std::string describe(const FwdCase &k, int64_t rows, int64_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols) + (k.kind == NormKind::LayerNorm ? " layernorm" : " rmsnorm") +
         (k.zero_centered ? " zc" : "") + " " + dtype_name(k.in) + " y=" + std::to_string(k.y) +
         " stats=" + std::to_string(k.stats) + " out=" + (k.out ? dtype_name(k.fmt) : "-") +
         " out_t=" + (k.out_t ? dtype_name(k.fmt_t) : "-") + " amax=" + std::to_string(k.amax) +
         " beta=" + std::to_string(k.beta) + " x_offset=" + std::to_string(k.x_offset) +
         (k.specials ? " specials" : "");
}

// Runs one forward on both backends and compares every output byte for byte.
void check_forward(Backend &cpu, Backend &gpu, const FwdCase &k, int64_t rows, int64_t cols, uint32_t seed) {
  const size_t n = static_cast<size_t>(rows * cols), esize = dtype_size(k.in);
  std::vector<float> xv = row_values(rows, cols, seed, k.in);
  if (k.specials && n > 2) {  // an infinity, a NaN and a huge value in three rows (or the same)
    xv[n / 3] = INFINITY;
    xv[n / 2] = NAN;
    xv[n - 1] = k.in == DType::F32 ? 1e30f : 60000.0f;
  }
  std::vector<float> xpad(static_cast<size_t>(k.x_offset), 0.0f);
  xpad.insert(xpad.end(), xv.begin(), xv.end());
  std::mt19937 rng(seed ^ 0x9E3779B9u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> gv(static_cast<size_t>(cols)), bv(static_cast<size_t>(cols));
  for (auto &g : gv) g = (k.zero_centered ? 0.0f : 1.0f) + 0.25f * normal(rng);
  for (auto &b : bv) b = 0.5f * normal(rng);
  const float scales[] = {1.0f, 0.37f, 24.0f, 200.0f, 3.5e-3f};
  Twin x(cpu, gpu, to_bytes(xpad, k.in)), gamma(cpu, gpu, to_bytes(gv, k.in)), beta(cpu, gpu, to_bytes(bv, k.in));
  Twin scale(cpu, gpu, raw(std::vector<float>{scales[seed % 5]})), amax(cpu, gpu, raw(std::vector<float>{0.25f}));
  Twin y(cpu, gpu, n * esize), mu(cpu, gpu, static_cast<size_t>(rows) * 4), rs(cpu, gpu, static_cast<size_t>(rows) * 4);
  Twin out(cpu, gpu, n), out_t(cpu, gpu, n), si(cpu, gpu, 4), si_t(cpu, gpu, 4);
  for (int b = 0; b < 2; ++b) {
    Backend &be = b == 0 ? cpu : gpu;
    const Device dev = b == 0 ? kCpu : kGpu;
    NormForwardArgs a;
    a.kind = k.kind;
    a.eps = 1e-5f;
    a.zero_centered_gamma = k.zero_centered;
    a.x = make_view(static_cast<char *>(x.on(b)) + k.x_offset * esize, k.in, dev, rows, cols);
    a.gamma = make_view(gamma.on(b), k.in, dev, 1, cols);
    a.gamma.ndim = 1;
    a.gamma.shape[0] = cols;
    if (k.beta) {
      a.beta = make_view(beta.on(b), k.in, dev, 1, cols);
      a.beta.ndim = 1;
      a.beta.shape[0] = cols;
    }
    if (k.y) a.y = make_view(y.on(b), k.in, dev, rows, cols);
    if (k.stats) {
      a.mu = mu.floats(b);
      a.rsigma = rs.floats(b);
    }
    TensorView ov = make_view(out.on(b), k.fmt, dev, rows, cols), otv = make_view(out_t.on(b), k.fmt_t, dev, cols, rows);
    ov.scale_inv = si.floats(b);
    otv.scale_inv = si_t.floats(b);
    if (k.out || k.out_t) a.scale = scale.floats(b);
    if (k.out) a.out = &ov;
    if (k.out_t) a.out_t = &otv;
    if (k.amax) a.amax_accum = amax.floats(b);
    be.norm_forward(a);
  }
  const std::string what = describe(k, rows, cols);
  EXPECT_SAME(mu, 4, DType::F32, what << " mu");
  EXPECT_SAME(rs, 4, DType::F32, what << " rsigma");
  EXPECT_SAME(y, esize, k.in, what << " y");
  EXPECT_SAME(out, 1, DType::E4M3, what << " out");
  EXPECT_SAME(out_t, 1, DType::E4M3, what << " out_t");
  EXPECT_SAME(si, 4, DType::F32, what << " out scale_inv");
  EXPECT_SAME(si_t, 4, DType::F32, what << " out_t scale_inv");
  EXPECT_SAME(amax, 4, DType::F32, what << " amax");
}

class CudaNorm : public GpuTest {};

// Every output at once over the whole grid of kinds, zero-centring, dtypes, formats and shapes.
TEST_F(CudaNorm, ForwardBitIdenticalToCpu) {
  uint32_t seed = 1;
  for (int64_t rows : kRows) {
    for (int64_t cols : kHidden) {
      const bool big = rows * cols > (1 << 20);
      if (big && quick()) continue;
      for (int kind_i = 0; kind_i < 2; ++kind_i) {
        const NormKind kind = kind_i == 0 ? NormKind::LayerNorm : NormKind::RMSNorm;
        for (int in_i = 0; in_i < 3; ++in_i) {
          for (int combo = 0; combo < 4; ++combo) {  // zero-centring x format
            // The largest shapes: one combination per kind and dtype, a different one each time.
            if (big && combo != (3 * kind_i + in_i) % 4) continue;
            const bool zc = combo & 1;
            const DType fmt = combo & 2 ? DType::E5M2 : DType::E4M3;
            FwdCase k{kind, zc, kInTypes[in_i], fmt, fmt, true, true, true, true, true, kind == NormKind::LayerNorm};
            check_forward(*cpu, *gpu, k, rows, cols, seed++);
          }
        }
      }
    }
  }
}

// Output subsets (the kernels' specialisations), beta with RMSNorm and none with LayerNorm,
// mixed FP8 formats, unaligned input (the generic kernels), NaN / infinity in the input.
TEST_F(CudaNorm, ForwardOutputSubsetsAndPaths) {
  struct Shape {
    int64_t rows, cols;
  };
  // 8192, 5000, 6144, 16384: code tiles of fewer than 32 rows, out_t written by transpose_codes
  // ({160, 6144}: a full and a partial row of 128-row tiles with 16-byte vectors).
  const Shape shapes[] = {{1, 8}, {5, 256}, {16, 264}, {33, 1024}, {31, 1032}, {64, 2048}, {17, 8192}, {40, 5000},
                          {160, 6144}, {3, 65536}, {18, 65536}, {48, 16384}};
  uint32_t seed = 5000;
  for (Shape s : shapes) {
    for (DType in : kInTypes) {
      for (int variant = 0; variant < 9; ++variant) {
        const NormKind kind = variant % 2 ? NormKind::RMSNorm : NormKind::LayerNorm;
        FwdCase k{kind, variant % 3 == 0, in, DType::E4M3, DType::E4M3, true, true, true, true, true, variant % 4 != 1};
        switch (variant) {
          case 0: k.y = k.stats = false; break;                 // FP8 only, with amax
          case 1: k.out = k.out_t = false; break;               // y + stats only
          case 2: k.out = false; k.fmt_t = DType::E5M2; break;  // out_t only
          case 3: k.out_t = false; k.fmt = DType::E5M2; k.amax = false; break;
          case 4: k.fmt_t = DType::E5M2; break;                 // mixed formats (generic kernel)
          case 5: k.x_offset = 1; break;                        // unaligned x (generic kernel)
          case 6: k.specials = true; break;
          case 7: k.y = false; k.stats = false; k.amax = false; k.out = false; break;
          default: k.x_offset = 8; k.fmt = k.fmt_t = DType::E5M2; break;  // aligned again after 16 bytes
        }
        check_forward(*cpu, *gpu, k, s.rows, s.cols, seed++);
      }
    }
  }
}

// ---- backward ----------------------------------------------------------------------------------

// dx: within 2 ulps of the dtype (relative to the row's largest |dx|) of the CPU's.
::testing::AssertionResult dx_close(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b, DType t, int64_t rows,
                                    int64_t cols, int64_t *identical) {
  const double ulp = t == DType::F32 ? std::ldexp(1.0, -23) : t == DType::BF16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  int64_t same = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double row_max = 0;
    for (int64_t c = 0; c < cols; ++c) row_max = std::max(row_max, std::fabs(double(load_as_float(a.data(), t, r * cols + c))));
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const float x = load_as_float(a.data(), t, i), y = load_as_float(b.data(), t, i);
      if (std::memcmp(&a[i * dtype_size(t)], &b[i * dtype_size(t)], dtype_size(t)) == 0) {
        ++same;
        continue;
      }
      if (!(std::fabs(double(x) - double(y)) <= 2 * ulp * (std::fabs(double(x)) + 1e-3 * row_max) + 1e-30))
        return ::testing::AssertionFailure() << "dx(" << r << "," << c << "): cpu " << x << " gpu " << y;
    }
  }
  *identical = same;
  return ::testing::AssertionSuccess();
}

struct BwdOut {
  std::vector<uint8_t> dx, dgamma, dbeta;
};

TEST_F(CudaNorm, BackwardCloseToCpuAndDeterministic) {
  uint32_t seed = 9000;
  int64_t total = 0, identical_total = 0;
  for (int64_t rows : kRows) {
    for (int64_t cols : kHidden) {
      const bool big = rows * cols > (1 << 20);
      if (big && quick()) continue;
      for (int kind_i = 0; kind_i < 2; ++kind_i) {
        const NormKind kind = kind_i == 0 ? NormKind::LayerNorm : NormKind::RMSNorm;
        for (int in_i = 0; in_i < 3; ++in_i) {
          const DType in = kInTypes[in_i];
          // The largest shapes: one dtype per kind (a different one per shape), everything wanted.
          if (big && in_i != (kind_i + static_cast<int>(cols % 3)) % 3) continue;
          for (int want = 0; want < 3; ++want) {  // 0: all, 1: dx only, 2: dgamma / dbeta only
            if (want != 0 && (big || cols == 1)) continue;
            const bool zc = (seed % 2) == 1;
            const size_t n = static_cast<size_t>(rows * cols), esize = dtype_size(in);
            std::vector<float> xv = row_values(rows, cols, seed, in), dyv = row_values(rows, cols, seed + 1, in);
            std::mt19937 rng(seed);
            std::normal_distribution<float> normal(0.0f, 1.0f);
            std::vector<float> gv(static_cast<size_t>(cols));
            for (auto &g : gv) g = (zc ? 0.0f : 1.0f) + 0.25f * normal(rng);
            // The statistics from the CPU forward, used by both backwards.
            std::vector<float> mu(static_cast<size_t>(rows)), rs(static_cast<size_t>(rows));
            {
              DeviceBuffer xc(*cpu, to_bytes(xv, in)), gc(*cpu, to_bytes(gv, in)), m(*cpu, mu), r(*cpu, rs);
              NormForwardArgs a;
              a.kind = kind;
              a.zero_centered_gamma = zc;
              a.x = make_view(xc.get(), in, kCpu, rows, cols);
              a.gamma = make_view(gc.get(), in, kCpu, 1, cols);
              a.mu = m.floats();
              a.rsigma = r.floats();
              cpu->norm_forward(a);
              mu = m.read<float>();
              rs = r.read<float>();
            }
            Twin x(*cpu, *gpu, to_bytes(xv, in)), dy(*cpu, *gpu, to_bytes(dyv, in)), gamma(*cpu, *gpu, to_bytes(gv, in));
            Twin tmu(*cpu, *gpu, raw(mu)), trs(*cpu, *gpu, raw(rs));
            Twin dx(*cpu, *gpu, n * esize), dg(*cpu, *gpu, static_cast<size_t>(cols) * esize), db(*cpu, *gpu, static_cast<size_t>(cols) * esize);
            BwdOut first;
            for (int run = 0; run < 3; ++run) {  // CPU, GPU, GPU again (into cleared outputs)
              const int b = run == 0 ? 0 : 1;
              if (run == 2) {
                const std::vector<uint8_t> junk(n * esize, 0xA5);
                if (want != 2) gpu->copy_from_host(dx.g.get(), junk.data(), n * esize);
                if (want != 1) gpu->copy_from_host(dg.g.get(), junk.data(), static_cast<size_t>(cols) * esize);
                if (want != 1 && kind == NormKind::LayerNorm)
                  gpu->copy_from_host(db.g.get(), junk.data(), static_cast<size_t>(cols) * esize);
              }
              Backend &be = b == 0 ? *cpu : *gpu;
              const Device dev = b == 0 ? kCpu : kGpu;
              NormBackwardArgs a;
              a.kind = kind;
              a.zero_centered_gamma = zc;
              a.dy = make_view(dy.on(b), in, dev, rows, cols);
              a.x = make_view(x.on(b), in, dev, rows, cols);
              a.gamma = make_view(gamma.on(b), in, dev, 1, cols);
              a.mu = kind == NormKind::LayerNorm ? tmu.floats(b) : nullptr;
              a.rsigma = trs.floats(b);
              if (want != 2) a.dx = make_view(dx.on(b), in, dev, rows, cols);
              if (want != 1) {
                a.dgamma = make_view(dg.on(b), in, dev, 1, cols);
                if (kind == NormKind::LayerNorm) a.dbeta = make_view(db.on(b), in, dev, 1, cols);
              }
              ScratchPlan plan;
              be.plan_norm_backward(a, &plan);
              be.reserve(plan);
              be.norm_backward(a);
              if (run == 1) first = BwdOut{dx.g.read<uint8_t>(), dg.g.read<uint8_t>(), db.g.read<uint8_t>()};
            }
            const std::string what = std::to_string(rows) + "x" + std::to_string(cols) +
                                     (kind == NormKind::LayerNorm ? " layernorm " : " rmsnorm ") + dtype_name(in) +
                                     (zc ? " zc" : "") + " want=" + std::to_string(want);
            EXPECT_EQ(first.dx, dx.g.read<uint8_t>()) << what << ": dx differs between two GPU runs";
            EXPECT_EQ(first.dgamma, dg.g.read<uint8_t>()) << what << ": dgamma differs between two GPU runs";
            EXPECT_EQ(first.dbeta, db.g.read<uint8_t>()) << what << ": dbeta differs between two GPU runs";
            if (want != 2) {
              int64_t identical = 0;
              EXPECT_TRUE(dx_close(dx.c.read<uint8_t>(), dx.g.read<uint8_t>(), in, rows, cols, &identical)) << what;
              total += static_cast<int64_t>(n);
              identical_total += identical;
            }
            if (want != 1) {
              // Column sums in another order: within the fp32 rounding budget of sum |term|, plus
              // the output dtype's rounding.
              const std::vector<uint8_t> gc = dg.c.read<uint8_t>(), gg = dg.g.read<uint8_t>();
              const std::vector<uint8_t> bc = db.c.read<uint8_t>(), bg = db.g.read<uint8_t>();
              const double out_ulp = in == DType::F32 ? 0 : in == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
              int bad = 0;
              for (int64_t c = 0; c < cols && bad < 5; ++c) {
                double mag_g = 0, mag_b = 0;
                for (int64_t r = 0; r < rows; ++r) {
                  const double xh = kind == NormKind::LayerNorm ? (xv[r * cols + c] - mu[r]) * rs[r] : xv[r * cols + c] * rs[r];
                  mag_g += std::fabs(dyv[r * cols + c] * xh);
                  mag_b += std::fabs(dyv[r * cols + c]);
                }
                const double eps32 = std::ldexp(1.0, -24) * (rows + 4);
                const float g_c = load_as_float(gc.data(), in, c), g_g = load_as_float(gg.data(), in, c);
                if (!(std::fabs(double(g_c) - g_g) <= 2 * eps32 * mag_g + 2 * out_ulp * std::fabs(double(g_c)) + 1e-30) && bad++ < 5)
                  ADD_FAILURE() << what << " dgamma[" << c << "]: cpu " << g_c << " gpu " << g_g << " (sum |terms| " << mag_g << ")";
                if (kind == NormKind::LayerNorm) {
                  const float b_c = load_as_float(bc.data(), in, c), b_g = load_as_float(bg.data(), in, c);
                  if (!(std::fabs(double(b_c) - b_g) <= 2 * eps32 * mag_b + 2 * out_ulp * std::fabs(double(b_c)) + 1e-30) && bad++ < 5)
                    ADD_FAILURE() << what << " dbeta[" << c << "]: cpu " << b_c << " gpu " << b_g << " (sum |terms| " << mag_b << ")";
                }
              }
            }
            ++seed;
          }
        }
      }
    }
  }
  std::printf("[norm backward] dx bit-identical to the CPU in %lld of %lld elements\n",
              static_cast<long long>(identical_total), static_cast<long long>(total));
}

// ---- bandwidth (informational) ----------------------------------------------------------------

// The fused norm + cast (bf16 x -> E4M3 out + out_t, amax) against a device copy of x: both move
// 4 bytes per element (the copy reads and writes 2; the norm reads 2 and writes 1 + 1).
// A measurement, not a test (timings do not pass or fail here): disabled by default; run it with
// --gtest_also_run_disabled_tests. The numbers that count come from te_bench_gpu (bench/RESULTS.md).
TEST_F(CudaNorm, DISABLED_FusedNormCastBandwidth) {
  if (quick()) GTEST_SKIP() << "quick mode";
  for (int64_t cols : {int64_t(4096), int64_t(8192), int64_t(14336)}) {
    const int64_t rows = 16384;
    const size_t n = static_cast<size_t>(rows * cols);
    Buffer x(gpu.get(), n * 2), out(gpu.get(), n), out_t(gpu.get(), n), copy_dst(gpu.get(), n * 2);
    Buffer gamma(gpu.get(), static_cast<size_t>(cols) * 2), beta(gpu.get(), static_cast<size_t>(cols) * 2);
    Buffer stats(gpu.get(), static_cast<size_t>(rows) * 8);
    DeviceBuffer f(*gpu, raw(std::vector<float>{100.0f, 0.0f, 0.0f, 0.0f}));  // scale, amax, scale_inv x2
    {
      std::vector<float> xv = row_values(1024, cols, 77, DType::BF16);
      std::vector<uint8_t> bytes = to_bytes(xv, DType::BF16);
      for (int64_t r = 0; r < rows; r += 1024)
        gpu->copy_from_host(static_cast<char *>(x.get()) + r * cols * 2, bytes.data(), bytes.size());
      std::vector<uint8_t> g = to_bytes(std::vector<float>(static_cast<size_t>(cols), 1.0f), DType::BF16);
      gpu->copy_from_host(gamma.get(), g.data(), g.size());
      gpu->copy_from_host(beta.get(), g.data(), g.size());
    }
    TensorView ov = make_view(out.get(), DType::E4M3, kGpu, rows, cols), otv = make_view(out_t.get(), DType::E4M3, kGpu, cols, rows);
    ov.scale_inv = f.floats() + 2;
    otv.scale_inv = f.floats() + 3;
    cudaStream_t stream = static_cast<cudaStream_t>(gpu->stream());
    cudaEvent_t e0, e1;
    ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
    auto time_ms = [&](auto &&fn) {
      for (int i = 0; i < 3; ++i) fn();
      cudaEventRecord(e0, stream);
      constexpr int kIters = 20;
      for (int i = 0; i < kIters; ++i) fn();
      cudaEventRecord(e1, stream);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      return ms / kIters;
    };
    const float cp = time_ms([&] { gpu->copy(copy_dst.get(), x.get(), n * 2); });
    const double cp_gbs = 4.0 * n / (cp * 1e6);
    for (NormKind kind : {NormKind::LayerNorm, NormKind::RMSNorm}) {
      NormForwardArgs a;
      a.kind = kind;
      a.x = make_view(x.get(), DType::BF16, kGpu, rows, cols);
      a.gamma = make_view(gamma.get(), DType::BF16, kGpu, 1, cols);
      if (kind == NormKind::LayerNorm) a.beta = make_view(beta.get(), DType::BF16, kGpu, 1, cols);
      a.mu = kind == NormKind::LayerNorm ? stats.floats() : nullptr;
      a.rsigma = stats.floats() + rows;
      a.scale = f.floats();
      a.amax_accum = f.floats() + 1;
      a.out = &ov;
      a.out_t = &otv;
      const float ms = time_ms([&] { gpu->norm_forward(a); });
      const double gbs = 4.0 * n / (ms * 1e6);
      std::printf("[bandwidth] %s bf16 %lldx%lld -> e4m3 + e4m3^T + amax (+ stats): %.3f ms, %.0f GB/s; device copy of "
                  "x: %.3f ms, %.0f GB/s; ratio %.1f%%\n",
                  kind == NormKind::LayerNorm ? "layernorm" : "rmsnorm", static_cast<long long>(rows),
                  static_cast<long long>(cols), ms, gbs, cp, cp_gbs, 100.0 * gbs / cp_gbs);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
}

// A scale update carried by the backward (NormBackwardArgs::then_update): the states end bit for
// bit as the CPU's (its backward, then scale_update), and dx / dgamma / dbeta as those of the same
// backward without it. Cases: the vectorised kernel with one band (direct sums) and with many, the
// generic kernel, and the cases where no band kernel launches and the update goes on its own
// (no rows, nothing wanted, more items than a launch carries). Histories of 1, 16 and 1500
// entries (longer than a block: the roll goes in chunks).
TEST_F(CudaNorm, CarriedScaleUpdateMatchesCpu) {
  struct Case {
    const char *name;
    int64_t rows, cols;
    DType in;
    bool dx, dgamma;
    int items;
  };
  const Case cases[] = {
      {"vec one band", 16, 4096, DType::BF16, true, true, 5},   {"vec bands", 2048, 768, DType::F16, true, true, 16},
      {"vec dx only", 64, 1024, DType::BF16, true, false, 1},   {"generic", 37, 100, DType::F32, true, true, 7},
      {"no rows", 0, 256, DType::BF16, true, true, 3},          {"nothing wanted", 8, 256, DType::BF16, false, false, 2},
      {"too many items", 16, 256, DType::BF16, true, true, 17},
  };
  const int lens[] = {1, 16, 1500};
  for (const Case &k : cases) {
    for (NormKind kind : {NormKind::LayerNorm, NormKind::RMSNorm}) {
      const std::string what = std::string(k.name) + (kind == NormKind::LayerNorm ? " layernorm" : " rmsnorm");
      const size_t esize = dtype_size(k.in);
      const int64_t held = std::max<int64_t>(k.rows, 1);  // buffers of at least a row
      const std::vector<float> xv = row_values(held, k.cols, 77, k.in), dyv = row_values(held, k.cols, 78, k.in);
      const std::vector<float> gv = row_values(1, k.cols, 79, k.in);
      std::vector<float> mu(static_cast<size_t>(held)), rs(static_cast<size_t>(held));
      for (int64_t r = 0; r < held; ++r) mu[r] = 0.125f * static_cast<float>(r % 5), rs[r] = 0.5f + 0.01f * static_cast<float>(r % 7);
      // The states: history[len], scale, scale_inv each; odd items keep their amax apart.
      std::vector<int> off(static_cast<size_t>(k.items)), len(static_cast<size_t>(k.items));
      std::vector<float> host, slot_host(static_cast<size_t>(k.items));
      std::mt19937 rng(static_cast<uint32_t>(k.items * 131 + k.rows));
      for (int i = 0; i < k.items; ++i) {
        off[i] = static_cast<int>(host.size());
        len[i] = lens[i % 3];
        for (int j = 0; j < len[i]; ++j) host.push_back(std::ldexp(1.0f + (rng() % 1000) / 999.0f, int(rng() % 30) - 15));
        host.push_back(std::ldexp(1.0f, int(rng() % 8)));
        host.push_back(1.0f / host.back());
        slot_host[i] = 0.75f * host[off[i]];
      }
      Twin state(*cpu, *gpu, raw(host)), slots(*cpu, *gpu, raw(slot_host));
      Twin x(*cpu, *gpu, to_bytes(xv, k.in)), dy(*cpu, *gpu, to_bytes(dyv, k.in)), gamma(*cpu, *gpu, to_bytes(gv, k.in));
      Twin tmu(*cpu, *gpu, raw(mu)), trs(*cpu, *gpu, raw(rs));
      Twin dx(*cpu, *gpu, static_cast<size_t>(held * k.cols) * esize), dg(*cpu, *gpu, static_cast<size_t>(k.cols) * esize),
          db(*cpu, *gpu, static_cast<size_t>(k.cols) * esize);
      BwdOut plain;
      for (int run = 0; run < 3; ++run) {  // GPU without the update, CPU with it, GPU with it
        const int b = run == 1 ? 0 : 1;
        Backend &be = b == 0 ? *cpu : *gpu;
        const Device dev = b == 0 ? kCpu : kGpu;
        std::vector<ScaleUpdateItem> items(static_cast<size_t>(k.items));
        for (int i = 0; i < k.items; ++i) {
          ScaleUpdateItem &it = items[i];
          it.history = state.floats(b) + off[i];
          it.amax = i % 2 ? slots.floats(b) + i : it.history;
          it.scale = it.history + len[i];
          it.scale_inv = it.history + len[i] + 1;
          it.len = len[i];
          it.margin = static_cast<int>(i % 3);
          it.algo = i % 2 ? AmaxAlgo::MostRecent : AmaxAlgo::Max;
          it.fp8_max = i % 3 ? kE4M3Max : kE5M2Max;
        }
        NormBackwardArgs a;
        a.kind = kind;
        a.dy = make_view(dy.on(b), k.in, dev, k.rows, k.cols);
        a.x = make_view(x.on(b), k.in, dev, k.rows, k.cols);
        a.gamma = make_view(gamma.on(b), k.in, dev, 1, k.cols);
        a.mu = kind == NormKind::LayerNorm ? tmu.floats(b) : nullptr;
        a.rsigma = trs.floats(b);
        if (k.dx) a.dx = make_view(dx.on(b), k.in, dev, k.rows, k.cols);
        if (k.dgamma) {
          a.dgamma = make_view(dg.on(b), k.in, dev, 1, k.cols);
          if (kind == NormKind::LayerNorm) a.dbeta = make_view(db.on(b), k.in, dev, 1, k.cols);
        }
        if (run != 0) {
          a.then_update = items.data();
          a.then_update_count = k.items;
        }
        ScratchPlan plan;
        be.plan_norm_backward(a, &plan);
        be.reserve(plan);
        be.norm_backward(a);
        if (run == 0) {
          plain = BwdOut{dx.g.read<uint8_t>(), dg.g.read<uint8_t>(), db.g.read<uint8_t>()};
          EXPECT_EQ(state.g.read<uint8_t>(), raw(host)) << what << ": a backward without then_update changed a state";
        }
      }
      EXPECT_SAME(state, 4, DType::I32, what << ": states");  // I32: bits, NaN payloads included
      EXPECT_SAME(slots, 4, DType::I32, what << ": amax slots");
      EXPECT_NE(state.g.read<uint8_t>(), raw(host)) << what << ": no state was updated";
      EXPECT_EQ(plain.dx, dx.g.read<uint8_t>()) << what << ": dx differs with the carried update";
      EXPECT_EQ(plain.dgamma, dg.g.read<uint8_t>()) << what << ": dgamma differs with the carried update";
      EXPECT_EQ(plain.dbeta, db.g.read<uint8_t>()) << what << ": dbeta differs with the carried update";
    }
  }
}

// The forward and backward enqueue nothing that a CUDA graph cannot hold (no host sync, no
// allocation outside the stream-ordered pool): capture both, replay, compare with direct runs.
TEST_F(CudaNorm, CapturedInCudaGraph) {
  const int64_t rows = 64, cols = 4096;
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<float> xv = row_values(rows, cols, 4242, DType::BF16), dyv = row_values(rows, cols, 4243, DType::BF16);
  DeviceBuffer x(*gpu, to_bytes(xv, DType::BF16)), dy(*gpu, to_bytes(dyv, DType::BF16));
  DeviceBuffer gamma(*gpu, to_bytes(std::vector<float>(static_cast<size_t>(cols), 1.25f), DType::BF16));
  DeviceBuffer f(*gpu, raw(std::vector<float>{8.0f, 0.0f, 0.0f, 0.0f}));
  DeviceBuffer mu(*gpu, static_cast<size_t>(rows) * 4), rs(*gpu, static_cast<size_t>(rows) * 4);
  DeviceBuffer out(*gpu, n), out_t(*gpu, n), dx(*gpu, n * 2), dg(*gpu, static_cast<size_t>(cols) * 2);
  TensorView ov = make_view(out.get(), DType::E4M3, kGpu, rows, cols), otv = make_view(out_t.get(), DType::E4M3, kGpu, cols, rows);
  ov.scale_inv = f.floats() + 2;
  otv.scale_inv = f.floats() + 3;
  NormForwardArgs fa;
  fa.kind = NormKind::RMSNorm;
  fa.x = make_view(x.get(), DType::BF16, kGpu, rows, cols);
  fa.gamma = make_view(gamma.get(), DType::BF16, kGpu, 1, cols);
  fa.rsigma = rs.floats();
  fa.scale = f.floats();
  fa.amax_accum = f.floats() + 1;
  fa.out = &ov;
  fa.out_t = &otv;
  NormBackwardArgs ba;
  ba.kind = NormKind::RMSNorm;
  ba.dy = make_view(dy.get(), DType::BF16, kGpu, rows, cols);
  ba.x = fa.x;
  ba.gamma = fa.gamma;
  ba.rsigma = rs.floats();
  ba.dx = make_view(dx.get(), DType::BF16, kGpu, rows, cols);
  ba.dgamma = make_view(dg.get(), DType::BF16, kGpu, 1, cols);
  gpu->norm_forward(fa);
  gpu->norm_backward(ba);
  const auto want_out = out.read<uint8_t>(), want_out_t = out_t.read<uint8_t>(), want_dx = dx.read<uint8_t>(),
             want_dg = dg.read<uint8_t>();
  const std::vector<uint8_t> zeros(n * 2, 0);
  gpu->copy_from_host(out.get(), zeros.data(), n);
  gpu->copy_from_host(out_t.get(), zeros.data(), n);
  gpu->copy_from_host(dx.get(), zeros.data(), n * 2);
  gpu->copy_from_host(dg.get(), zeros.data(), static_cast<size_t>(cols) * 2);

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void *old_stream = gpu->stream();
  gpu->set_stream(stream);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  gpu->norm_forward(fa);
  gpu->norm_backward(ba);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  gpu->set_stream(old_stream);
  EXPECT_EQ(out.read<uint8_t>(), want_out);
  EXPECT_EQ(out_t.read<uint8_t>(), want_out_t);
  EXPECT_EQ(dx.read<uint8_t>(), want_dx);
  EXPECT_EQ(dg.read<uint8_t>(), want_dg);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace te::gpu_test
