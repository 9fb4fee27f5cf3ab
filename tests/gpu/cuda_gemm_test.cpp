// The CUDA backend's GEMMs (core/backends/cuda/lt_gemm.cpp) against an fp64 reference computed here on
// the host from the operands' bytes (FP8 codes decoded exactly and multiplied by their scale_inv,
// per tensor or per block), and against the CPU backend's gemm.
//
// Tolerances. For an output element, let S = sum_k |a_ik b_kj| (dequantized, fp64) + |old D| +
// |bias|: every rounding inside the GEMM is bounded relative to S, so the bound is
//   |got - ref| <= eps_acc * S + eps_out * R  (+ GELU terms, below)
//  - eps_out: twice the half-ulp relative rounding of the stored dtype (BF16 2^-8, F16 2^-10,
//    F32 2^-22). R = |ref| for a plain product; with accumulate or bias R = |ref| + S, because
//    cuBLASLt's epilogue rounds the intermediate (product + C) to D's dtype before it adds the
//    bias (seen on the H200: BF16 x BF16 -> BF16 with C and bias was 4 ulps off an exact result).
//  - eps_acc, fp32 accumulation (high precision, the fp32 fallback of block scaling): 2^-16.
//    cuBLASLt accumulates in fp32 along K in tiles; the worst case of a recursive sum is
//    k * 2^-24 * S, i.e. 2^-14 S for k = 1024, but rounding errors of random-sign data add
//    like a random walk (~ sqrt(k) * 2^-24 S, about 2^-19 S at k = 1024), so 2^-16 is a bound
//    with margin (the data here is exact in fp32 for high precision anyway).
//  - eps_acc, FP8 on tensor cores with the split accumulator (and block scaling): 2^-10.
//    Hopper's FP8 MMA adds products into an accumulator that keeps about 14 significant bits
//    (DeepSeek-V3 report, sec. 3.3.2); cuBLASLt promotes that partial sum to fp32 only every few
//    MMAs along K (every 128-element block with block scaling), so each promotion interval
//    carries ~2^-14..2^-12 S of error: measured up to 2^-11.5 S on the H200 (block-scaled,
//    F32 output, k = 384..1024); 2^-10 keeps a 3x margin.
//  - eps_acc, fast accumulation (FP8, split_accumulator = 0, per-tensor): 2^-8. The fast mode
//    never promotes, so the reduced-precision error compounds over all of K (~2^-14 per MMA
//    step, k / 32 steps); 2^-8 S covers k <= 1024 with margin. A wrong block scale or scale
//    layout errs by O(S / #blocks) (>= 2^-3 S here), far above every bound used.
//  - GELU: the reference applies GELU to the fp64 pre-activation; GELU's slope is below 1.13,
//    so the pre-activation's error passes through scaled by 1.13, plus 2^-10 |pre| for the
//    difference between cuBLASLt's GELU approximation and TE's tanh form used by libte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_support.h"
#include "numerics/numerics.h"

#if TE_HAVE_CUDA_BACKEND
#include <cuda_runtime.h>
#endif

namespace te::gpu_test {
namespace {

// A host matrix in its storage format (bytes), row-major.
struct HostMatrix {
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;
  ScalingMode scaling = ScalingMode::PerTensor;
  std::vector<float> scale_inv;  // FP8 only, laid out as te.h's te_scaling_mode says

  size_t size() const { return bytes.size(); }
  double code(int64_t i) const {
    if (is_fp8(dtype)) return fp8_to_float(bytes[i], dtype);
    return load_as_float(bytes.data(), dtype, i);
  }
  double scale(int64_t r, int64_t c) const {
    if (!is_fp8(dtype)) return 1.0;
    const int64_t cb = (cols + 127) / 128;
    switch (scaling) {
      case ScalingMode::PerTensor: return scale_inv[0];
      case ScalingMode::Block1x128: return scale_inv[r * cb + c / 128];
      case ScalingMode::Block128x128: return scale_inv[(r / 128) * cb + c / 128];
    }
    return 1.0;
  }
  // The dequantized value, exactly (fp64).
  double at(int64_t r, int64_t c) const { return code(r * cols + c) * scale(r, c); }
};

// FP8 codes with random sign and mantissa and exponents within 2^-3 .. 2^3 (no NaN, no inf).
HostMatrix random_fp8(std::mt19937 &rng, DType t, int64_t rows, int64_t cols) {
  HostMatrix h;
  h.dtype = t, h.rows = rows, h.cols = cols;
  h.bytes.resize(static_cast<size_t>(rows * cols));
  const int bias = t == DType::E4M3 ? 7 : 15, mbits = t == DType::E4M3 ? 3 : 2;
  std::uniform_int_distribution<int> e(bias - 3, bias + 3), m(0, (1 << mbits) - 1), s(0, 1);
  for (auto &b : h.bytes) b = static_cast<uint8_t>(s(rng) << 7 | e(rng) << mbits | m(rng));
  h.scale_inv = {1.0f};
  return h;
}

// High-precision values j/32, |j| <= 64: exact in F32, F16 and BF16, and their products and sums
// stay exact in fp32 for these sizes.
HostMatrix random_hp(std::mt19937 &rng, DType t, int64_t rows, int64_t cols) {
  HostMatrix h;
  h.dtype = t, h.rows = rows, h.cols = cols;
  h.bytes.resize(static_cast<size_t>(rows * cols) * dtype_size(t));
  std::uniform_int_distribution<int> j(-64, 64);
  for (int64_t i = 0; i < rows * cols; ++i) store_from_float(h.bytes.data(), t, i, j(rng) / 32.0f);
  return h;
}

// Block scales: varied, not powers of two, so that every scale's position matters.
void set_block_scales(std::mt19937 &rng, HostMatrix &h, ScalingMode mode) {
  h.scaling = mode;
  h.scale_inv.resize(static_cast<size_t>(scale_inv_count(mode, h.rows, h.cols)));
  std::uniform_int_distribution<int> e(-3, 3), f(8, 15);
  for (auto &s : h.scale_inv) s = std::ldexp(f(rng) / 8.0f, e(rng));
}

double eps_out(DType t) {
  switch (t) {
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::F16: return std::ldexp(1.0, -10);
    default: return std::ldexp(1.0, -22);
  }
}

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

struct Case {
  int64_t m = 16, n = 16, k = 16;
  DType a = DType::E4M3, b = DType::E4M3, d = DType::BF16;
  bool transa = false, transb = true;
  ScalingMode sa = ScalingMode::PerTensor, sb = ScalingMode::PerTensor;
  float scale_a = 0.375f, scale_b = 1.25f;  // per-tensor scale_inv
  Epilogue epilogue = Epilogue::None;
  DType bias = DType::BF16;
  bool aux = false;
  DType aux_dtype = DType::BF16;
  bool accumulate = false;
  bool split = true;  // split_accumulator
  uint32_t seed = 1;

  std::string name() const {
    char buf[256];
    snprintf(buf, sizeof buf, "%lldx%lldx%lld %sx%s->%s ta=%d tb=%d scaling=%d/%d epi=%d bias=%s aux=%d(%s) acc=%d split=%d",
             (long long)m, (long long)n, (long long)k, dtype_name(a), dtype_name(b), dtype_name(d), transa, transb,
             int(sa), int(sb), int(epilogue), dtype_name(bias), aux, dtype_name(aux_dtype), accumulate, split);
    return buf;
  }
};

class CudaGemmTest : public GpuTest {
 protected:
  // Runs `c` on the GPU and on the CPU, checks both against the fp64 reference.
  void check(const Case &c, Backend *gpu_be = nullptr, bool fp32_path = false) {
    SCOPED_TRACE(c.name());
    Backend &g = gpu_be ? *gpu_be : *gpu;
    std::mt19937 rng(c.seed);
    const bool fp8 = is_fp8(c.a);
    const int64_t ar = c.transa ? c.k : c.m, ac = c.transa ? c.m : c.k;
    const int64_t br = c.transb ? c.n : c.k, bc = c.transb ? c.k : c.n;
    HostMatrix A = fp8 ? random_fp8(rng, c.a, ar, ac) : random_hp(rng, c.a, ar, ac);
    HostMatrix B = fp8 ? random_fp8(rng, c.b, br, bc) : random_hp(rng, c.b, br, bc);
    if (fp8) {
      if (c.sa == ScalingMode::PerTensor) A.scale_inv = {c.scale_a}; else set_block_scales(rng, A, c.sa);
      if (c.sb == ScalingMode::PerTensor) B.scale_inv = {c.scale_b}; else set_block_scales(rng, B, c.sb);
    }
    const HostMatrix D0 = random_hp(rng, c.d, c.m, c.n);
    const HostMatrix bias = random_hp(rng, c.bias, 1, c.n);
    const bool has_bias = c.epilogue == Epilogue::Bias || c.epilogue == Epilogue::BiasGelu;
    const bool has_gelu = c.epilogue == Epilogue::Gelu || c.epilogue == Epilogue::BiasGelu;
    const bool aux = has_gelu && c.aux;
    const HostMatrix aux0 = random_hp(rng, c.aux_dtype, c.m, c.n);

    // ---- GPU ----
    const Device dev = g.device();
    DeviceBuffer dA(g, A.bytes), dB(g, B.bytes), dD(g, c.accumulate ? D0.bytes : std::vector<uint8_t>(D0.size(), 0));
    DeviceBuffer dsa(g, A.scale_inv), dsb(g, B.scale_inv), dbias(g, bias.bytes), daux(g, aux0.bytes);
    GemmArgs args;
    args.a = make_view(dA.get(), c.a, dev, ar, ac);
    args.b = make_view(dB.get(), c.b, dev, br, bc);
    args.d = make_view(dD.get(), c.d, dev, c.m, c.n);
    if (fp8) {
      args.a.scale_inv = dsa.floats(), args.a.scaling = c.sa;
      args.b.scale_inv = dsb.floats(), args.b.scaling = c.sb;
    }
    args.transa = c.transa, args.transb = c.transb;
    args.epilogue = c.epilogue;
    if (has_bias) args.bias = make_view(dbias.get(), c.bias, dev, 1, c.n), args.bias.ndim = 1, args.bias.shape[0] = c.n;
    if (aux) args.gelu_input = make_view(daux.get(), c.aux_dtype, dev, c.m, c.n);
    args.accumulate = c.accumulate;
    args.split_accumulator = c.split;
    g.gemm(args);
    const std::vector<uint8_t> got_d = dD.read<uint8_t>(), got_aux = daux.read<uint8_t>();

    // ---- CPU ----
    std::vector<uint8_t> hA = A.bytes, hB = B.bytes, hD = c.accumulate ? D0.bytes : std::vector<uint8_t>(D0.size(), 0);
    std::vector<uint8_t> hbias = bias.bytes, haux = aux0.bytes;
    std::vector<float> hsa = A.scale_inv, hsb = B.scale_inv;
    const Device cpu_dev = cpu->device();
    GemmArgs cargs = args;
    cargs.a = make_view(hA.data(), c.a, cpu_dev, ar, ac);
    cargs.b = make_view(hB.data(), c.b, cpu_dev, br, bc);
    cargs.d = make_view(hD.data(), c.d, cpu_dev, c.m, c.n);
    if (fp8) {
      cargs.a.scale_inv = hsa.data(), cargs.a.scaling = c.sa;
      cargs.b.scale_inv = hsb.data(), cargs.b.scaling = c.sb;
    }
    if (has_bias) cargs.bias = make_view(hbias.data(), c.bias, cpu_dev, 1, c.n), cargs.bias.ndim = 1, cargs.bias.shape[0] = c.n;
    if (aux) cargs.gelu_input = make_view(haux.data(), c.aux_dtype, cpu_dev, c.m, c.n);
    cpu->gemm(cargs);

    // ---- fp64 reference and comparison ----
    const bool per_tensor = c.sa == ScalingMode::PerTensor && c.sb == ScalingMode::PerTensor;
    const double eps_acc = !fp8 || fp32_path ? std::ldexp(1.0, -16)
                           : per_tensor && !c.split ? std::ldexp(1.0, -8)
                                                    : std::ldexp(1.0, -10);
    std::vector<double> arow(static_cast<size_t>(c.k)), brow(static_cast<size_t>(c.k));
    int reported = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t kk = 0; kk < c.k; ++kk) arow[kk] = c.transa ? A.at(kk, i) : A.at(i, kk);
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0, abs_sum = 0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const double p = arow[kk] * (c.transb ? B.at(j, kk) : B.at(kk, j));
          sum += p, abs_sum += std::fabs(p);
        }
        const int64_t idx = i * c.n + j;
        if (c.accumulate) sum += D0.code(idx), abs_sum += std::fabs(D0.code(idx));
        if (has_bias) sum += bias.code(j), abs_sum += std::fabs(bias.code(j));
        const double pre = sum, pre_tol = eps_acc * abs_sum;
        const double ref = has_gelu ? gelu(pre) : pre;
        const double rounded = std::fabs(ref) + (c.accumulate || has_bias ? abs_sum : 0.0);
        double tol = eps_out(c.d) * rounded + 1e-30;
        tol += has_gelu ? 1.13 * pre_tol + std::ldexp(std::fabs(pre), -10) : pre_tol;
        const double got = load_as_float(got_d.data(), c.d, idx);
        const double cpu_got = load_as_float(hD.data(), c.d, idx);
        // GPU vs CPU: both within tol of the reference, so within 2 tol of each other.
        const bool ok = std::fabs(got - ref) <= tol && std::fabs(cpu_got - got) <= 2 * tol;
        bool aux_ok = true;
        double aux_got = 0, aux_cpu = 0, aux_tol = 0;
        if (aux) {
          aux_got = load_as_float(got_aux.data(), c.aux_dtype, idx);
          aux_cpu = load_as_float(haux.data(), c.aux_dtype, idx);
          aux_tol = pre_tol + eps_out(c.aux_dtype) * (std::fabs(pre) + (c.accumulate || has_bias ? abs_sum : 0.0)) + 1e-30;
          aux_ok = std::fabs(aux_got - pre) <= aux_tol && std::fabs(aux_cpu - aux_got) <= 2 * aux_tol;
        }
        if (!ok || !aux_ok) {
          ++bad;
          if (reported++ < 5)
            ADD_FAILURE() << "D[" << i << "," << j << "]: gpu " << got << " cpu " << cpu_got << " ref " << ref
                          << " tol " << tol << (aux ? " | aux gpu " : "") << (aux ? std::to_string(aux_got) : "")
                          << (aux ? " cpu " + std::to_string(aux_cpu) + " ref " + std::to_string(pre) : "");
        }
      }
    }
    EXPECT_EQ(bad, 0) << "elements out of tolerance";
  }
};

const DType kFp8Pairs[][2] = {{DType::E4M3, DType::E4M3}, {DType::E4M3, DType::E5M2}, {DType::E5M2, DType::E4M3}};
const DType kOutputs[] = {DType::BF16, DType::F16, DType::F32};

TEST_F(CudaGemmTest, Fp8PerTensorDtypesOutputsAccumulationModes) {
  uint32_t seed = 10;
  for (auto &p : kFp8Pairs)
    for (DType d : kOutputs)
      for (bool split : {true, false}) {
        Case c;
        c.m = 48, c.n = 80, c.k = 32;
        c.a = p[0], c.b = p[1], c.d = d, c.split = split, c.seed = seed++;
        check(c);
        c.m = c.n = c.k = 16;
        check(c);
      }
}

TEST_F(CudaGemmTest, Fp8LargeFastAndSplit) {
  for (bool split : {true, false}) {
    Case c;
    c.m = 256, c.n = 512, c.k = 1024, c.split = split, c.seed = 3;
    check(c);
  }
}

TEST_F(CudaGemmTest, Fp8ScaleInvIsPerCall) {
  // Same shape twice: the second call reuses the cached plan with new scale pointers.
  Case c;
  c.m = 64, c.n = 32, c.k = 48;
  check(c);
  c.scale_a = 2.5f, c.scale_b = 0.0625f, c.seed = 7;
  check(c);
  c.scale_a = 1.0f, c.scale_b = 1.0f, c.seed = 8;
  check(c);
}

TEST_F(CudaGemmTest, Fp8BiasEpilogue) {
  // Bias in the dtype cuBLASLt reads (direct route) and in others (fp32 epilogue route).
  const DType pairs[][2] = {{DType::BF16, DType::BF16}, {DType::F16, DType::F16}, {DType::F32, DType::BF16},
                            {DType::F32, DType::F32},   {DType::BF16, DType::F32}, {DType::F16, DType::BF16}};
  uint32_t seed = 30;
  for (auto &p : pairs) {
    Case c;
    c.m = 48, c.n = 80, c.k = 64, c.d = p[0], c.bias = p[1], c.epilogue = Epilogue::Bias, c.seed = seed++;
    check(c);
    c.split = false;
    check(c);
  }
}

TEST_F(CudaGemmTest, Fp8GeluAndGeluAux) {
  uint32_t seed = 40;
  for (DType d : kOutputs)
    for (Epilogue e : {Epilogue::Gelu, Epilogue::BiasGelu})
      for (bool aux : {false, true}) {
        Case c;
        c.m = 32, c.n = 64, c.k = 96, c.d = d, c.epilogue = e, c.aux = aux, c.aux_dtype = d;
        c.bias = d == DType::F16 ? DType::F16 : DType::BF16;
        c.seed = seed++;
        check(c);
      }
  Case c;  // pre-GELU output in another dtype than D: the fp32 epilogue route
  c.m = 32, c.n = 64, c.k = 96, c.d = DType::BF16, c.epilogue = Epilogue::BiasGelu, c.aux = true;
  c.aux_dtype = DType::F32, c.seed = 49;
  check(c);
}

TEST_F(CudaGemmTest, Fp8Accumulate) {
  uint32_t seed = 50;
  for (DType d : kOutputs)
    for (Epilogue e : {Epilogue::None, Epilogue::Bias, Epilogue::BiasGelu}) {
      Case c;
      c.m = 48, c.n = 80, c.k = 32, c.d = d, c.epilogue = e, c.accumulate = true, c.aux = true, c.aux_dtype = d;
      c.bias = d == DType::F16 ? DType::F16 : DType::BF16;
      c.seed = seed++;
      check(c);
    }
  Case c;
  c.m = 256, c.n = 512, c.k = 1024, c.d = DType::F32, c.accumulate = true, c.split = false, c.seed = 59;
  check(c);
}

void block_cases(const std::function<void(const Case &)> &run) {
  struct Shape { int64_t m, n, k; };
  // k = 32: one K block; 384: three (padded 128x128 rows); 1024: eight; n = 160, m = 144: partial tiles.
  const Shape shapes[] = {{48, 80, 32}, {144, 160, 384}, {256, 512, 1024}};
  uint32_t seed = 60;
  for (const Shape &s : shapes)
    for (ScalingMode sb : {ScalingMode::Block1x128, ScalingMode::Block128x128}) {
      Case c;
      c.m = s.m, c.n = s.n, c.k = s.k, c.sa = ScalingMode::Block1x128, c.sb = sb, c.seed = seed++;
      run(c);
      c.d = DType::F32, c.epilogue = Epilogue::Bias, c.bias = DType::F32, c.seed = seed++;
      run(c);
      c.d = DType::BF16, c.bias = DType::BF16, c.accumulate = true, c.seed = seed++;
      run(c);
      c.epilogue = Epilogue::BiasGelu, c.aux = true, c.accumulate = false, c.seed = seed++;
      run(c);
      c.epilogue = Epilogue::None, c.aux = false, c.split = false, c.seed = seed++;  // fast accum is ignored here
      run(c);
    }
  Case c;  // E4M3 x E5M2 and a mixed per-tensor / block pair
  c.m = 144, c.n = 160, c.k = 384, c.b = DType::E5M2, c.sa = ScalingMode::Block1x128;
  c.sb = ScalingMode::Block128x128, c.seed = 90;
  run(c);
  c.b = DType::E4M3, c.sb = ScalingMode::PerTensor, c.seed = 91;
  run(c);
}

TEST_F(CudaGemmTest, Fp8BlockScaled) {
  block_cases([this](const Case &c) { check(c); });
}

TEST_F(CudaGemmTest, Fp8BlockScaledFallback) {
  // The dequantize-to-fp32 route, forced (TE_CUDA_BLOCK_GEMM is read when a backend is made).
  setenv("TE_CUDA_BLOCK_GEMM", "fallback", 1);
  std::unique_ptr<Backend> fallback = make_cuda_backend(0);
  unsetenv("TE_CUDA_BLOCK_GEMM");
  block_cases([&](const Case &c) { check(c, fallback.get(), true); });
}

TEST_F(CudaGemmTest, HighPrecisionAllTransposes) {
  uint32_t seed = 100;
  struct Shape { int64_t m, n, k; };
  for (DType t : {DType::BF16, DType::F16, DType::F32})
    for (const Shape s : {Shape{16, 16, 16}, Shape{48, 80, 32}, Shape{256, 512, 1024}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          if (s.k == 1024 && (ta != tb)) continue;  // the large shape twice per dtype is enough
          Case c;
          c.a = c.b = c.d = t, c.m = s.m, c.n = s.n, c.k = s.k, c.transa = ta, c.transb = tb, c.seed = seed++;
          check(c);
        }
}

TEST_F(CudaGemmTest, HighPrecisionOutputsAndEpilogues) {
  uint32_t seed = 200;
  const DType combos[][2] = {{DType::BF16, DType::F32}, {DType::F16, DType::F32}, {DType::BF16, DType::F16},
                             {DType::F32, DType::BF16}};
  for (auto &p : combos) {
    Case c;
    c.a = c.b = p[0], c.d = p[1], c.m = 48, c.n = 80, c.k = 32, c.transb = false, c.seed = seed++;
    check(c);
  }
  for (DType t : {DType::BF16, DType::F32})
    for (Epilogue e : {Epilogue::Bias, Epilogue::Gelu, Epilogue::BiasGelu})
      for (bool acc : {false, true}) {
        Case c;
        c.a = c.b = c.d = t, c.bias = t, c.aux = true, c.aux_dtype = t, c.m = 48, c.n = 80, c.k = 32;
        c.transa = true, c.transb = false, c.epilogue = e, c.accumulate = acc, c.seed = seed++;
        check(c);
      }
}

// The shapes above are small enough for LtGemm's own small-GEMM kernel (small_gemm.cu); the same
// cases through cuBLASLt (TE_CUDA_SMALL_GEMM=0, read when a backend is made), and a few shapes on
// both sides of the size limit, partial tiles included, through the default backend.
TEST_F(CudaGemmTest, SmallShapesThroughCublasLtToo) {
  setenv("TE_CUDA_SMALL_GEMM", "0", 1);
  std::unique_ptr<Backend> lt = make_cuda_backend(0);
  unsetenv("TE_CUDA_SMALL_GEMM");
  uint32_t seed = 300;
  for (auto &p : kFp8Pairs)
    for (DType d : kOutputs) {
      Case c;
      c.m = 48, c.n = 80, c.k = 32, c.a = p[0], c.b = p[1], c.d = d, c.split = false, c.seed = seed++;
      check(c, lt.get());
      c.epilogue = Epilogue::Bias, c.bias = d == DType::F16 ? DType::F16 : DType::BF16, c.accumulate = true;
      check(c, lt.get());
    }
  block_cases([&](const Case &c) { check(c, lt.get()); });
  for (DType t : {DType::BF16, DType::F32})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Case c;
        c.a = c.b = c.d = t, c.m = 48, c.n = 80, c.k = 32, c.transa = ta, c.transb = tb, c.seed = seed++;
        check(c, lt.get());
      }
}

TEST_F(CudaGemmTest, SmallGemmLimitAndPartialTiles) {
  struct Shape { int64_t m, n, k; };
  uint32_t seed = 400;
  // 128^3 is the last small one; 144 x 128 x 128 goes to cuBLASLt. 16 x 48 x 2048: one output
  // tile, sixteen 128-deep blocks. 208 x 16 x 64: seven row tiles, the last partial.
  for (const Shape s : {Shape{128, 128, 128}, Shape{144, 128, 128}, Shape{16, 48, 2048}, Shape{208, 16, 64}}) {
    Case c;
    c.m = s.m, c.n = s.n, c.k = s.k, c.split = false, c.seed = seed++;
    check(c);
    c.sa = ScalingMode::Block1x128, c.sb = ScalingMode::Block128x128, c.seed = seed++;
    check(c);
    c.sb = ScalingMode::Block1x128, c.d = DType::F32, c.epilogue = Epilogue::Bias, c.bias = DType::F32;
    c.accumulate = true, c.seed = seed++;
    check(c);
  }
  for (const Shape s : {Shape{33, 17, 5}, Shape{1, 1, 1}, Shape{100, 70, 129}})
    for (bool ta : {false, true}) {
      Case c;  // high precision has no multiple-of-16 rule: ragged tiles everywhere
      c.a = c.b = DType::BF16, c.d = DType::F32, c.m = s.m, c.n = s.n, c.k = s.k, c.transa = ta;
      c.transb = !ta, c.epilogue = Epilogue::Bias, c.bias = DType::BF16, c.accumulate = ta, c.seed = seed++;
      check(c);
    }
}

TEST_F(CudaGemmTest, UnsupportedIsReported) {
  Case c;
  auto expect_unsupported = [&](GemmArgs args) {
    try {
      gpu->gemm(args);
      ADD_FAILURE() << "expected Unsupported";
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), Status::Unsupported) << e.what();
    }
  };
  DeviceBuffer a(*gpu, 64 * 64), b(*gpu, 64 * 64), d(*gpu, 64 * 64 * 4), s(*gpu, std::vector<float>{1.0f});
  const Device dev = gpu->device();
  GemmArgs g;
  g.a = make_view(a.get(), DType::E4M3, dev, 32, 32);
  g.b = make_view(b.get(), DType::E4M3, dev, 32, 32);
  g.d = make_view(d.get(), DType::F32, dev, 32, 32);
  g.a.scale_inv = g.b.scale_inv = s.floats();
  g.transb = true;
  GemmArgs t = g;
  t.transa = true;
  expect_unsupported(t);  // FP8 must be TN
  t = g;
  t.a.dtype = t.b.dtype = DType::E5M2;
  expect_unsupported(t);  // E5M2 x E5M2
  t = g;
  t.a = make_view(a.get(), DType::E4M3, dev, 24, 32);
  t.d = make_view(d.get(), DType::F32, dev, 24, 32);
  expect_unsupported(t);  // m not a multiple of 16
  t = g;
  t.b.dtype = DType::BF16;
  expect_unsupported(t);  // mixed FP8 / high precision
}

#if TE_HAVE_CUDA_BACKEND
// Throughput, not a check: run with --gtest_also_run_disabled_tests on the GPU machine.
TEST_F(CudaGemmTest, DISABLED_Fp8Throughput) {
  struct Shape { int64_t m, n, k; };
  for (const Shape s : {Shape{8192, 8192, 8192}, Shape{16384, 4096, 4096}})
    for (int variant = 0; variant < 3; ++variant) {  // fast, split accumulator, block-scaled
      const bool split = variant != 0, block = variant == 2;
      const Device dev = gpu->device();
      std::vector<uint8_t> ha(static_cast<size_t>(s.m * s.k)), hb(static_cast<size_t>(s.n * s.k));
      std::mt19937 rng(1);
      std::uniform_int_distribution<int> code(0, 0x77);  // finite E4M3 codes, both signs below
      for (auto &x : ha) x = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
      for (auto &x : hb) x = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
      DeviceBuffer a(*gpu, ha), b(*gpu, hb), d(*gpu, static_cast<size_t>(s.m * s.n) * 2);
      DeviceBuffer sc(*gpu, std::vector<float>{0.01f});
      DeviceBuffer sa(*gpu, std::vector<float>(static_cast<size_t>(scale_inv_count(ScalingMode::Block1x128, s.m, s.k)), 0.01f));
      DeviceBuffer sb(*gpu, std::vector<float>(static_cast<size_t>(scale_inv_count(ScalingMode::Block128x128, s.n, s.k)), 0.01f));
      GemmArgs g;
      g.a = make_view(a.get(), DType::E4M3, dev, s.m, s.k);
      g.b = make_view(b.get(), DType::E4M3, dev, s.n, s.k);
      g.d = make_view(d.get(), DType::BF16, dev, s.m, s.n);
      g.a.scale_inv = g.b.scale_inv = sc.floats();
      if (block) {
        g.a.scale_inv = sa.floats(), g.a.scaling = ScalingMode::Block1x128;
        g.b.scale_inv = sb.floats(), g.b.scaling = ScalingMode::Block128x128;
      }
      g.transb = true;
      g.split_accumulator = split;
      for (int i = 0; i < 5; ++i) gpu->gemm(g);
      gpu->synchronize();
      cudaStream_t stream = static_cast<cudaStream_t>(gpu->stream());
      std::vector<float> ms;
      for (int i = 0; i < 20; ++i) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaEventRecord(e0, stream);
        gpu->gemm(g);
        cudaEventRecord(e1, stream);
        cudaEventSynchronize(e1);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        ms.push_back(t);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
      }
      std::sort(ms.begin(), ms.end());
      const double med = 0.5 * (ms[9] + ms[10]);
      const double tflops = 2.0 * s.m * s.n * s.k / (med * 1e-3) / 1e12;
      printf("{\"gemm\":\"libte e4m3 x e4m3 -> bf16\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"fast_accum\":%d,"
             "\"scaling\":\"%s\",\"median_ms\":%.4f,\"tflops\":%.1f}\n",
             (long long)s.m, (long long)s.n, (long long)s.k, !split, block ? "1x128 x 128x128" : "per-tensor", med,
             tflops);
    }
}
#endif

}  // namespace
}  // namespace te::gpu_test
