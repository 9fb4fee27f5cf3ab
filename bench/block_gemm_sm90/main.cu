// te_bench_block_gemm_sm90: the sm_90a block-scaled GEMM of block_gemm.h, checked against an fp64
// reference on the GPU and timed beside cuBLASLt's block-scaled kernel in the same process.
//
// Run: te_bench_block_gemm_sm90 [check | bench | grid | profile]   (no argument: check, then bench)
// Two kernels: the per-CTA one and the 2-CTA cluster one (B multicast to a pair of row blocks).
//   check: M x N x K cases (all four FP8 pairs, BF16 / F16 / F32 output, bias, ragged edges, odd
//          numbers of row blocks: the cluster's idle half), both kernels, each checked on
//          every output (or a 20000-200000 sample of a large one) against fp64 sums of the decoded
//          codes times their scales. Tolerance: the output's rounding (2^-8 BF16, 2^-11 F16,
//          1e-6 F32) of |ref| plus 2^-11 of sum |terms| (Hopper's FP8 tensor cores add with
//          fewer bits than fp32 inside a 128-deep block). Exit status 1 on any failure.
//   bench: five shapes, 3 x (median of 10 CUDA-event timings) each of cuBLASLt (heuristic #0,
//          fp32 accumulation, BF16 output) and the two kernels, alternating, random codes in
//          [-4, 4] and scales in [0.5, 1.5) (never zeros).
//   grid:  16384 x 14336 x 4096 with 132, 100, 66, 33 CTAs: the per-SM rate apart from L2 load.
//   profile: one launch each of cuBLASLt and the two kernels on 16384 x 14336 x 4096 (for ncu).
// On a device other than sm_90 it prints SKIPPED and exits 0.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../cuda_exit_checks.h"
#include "block_gemm.h"

using namespace block_gemm_sm90;

namespace {

int g_sms = 0;  // CTAs the kernel may use (the device's SM count, or fewer in `grid`)

size_t dtype_size(DType t) { return t == DType::F32 ? 4 : (t == DType::F16 || t == DType::BF16) ? 2 : 1; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- inputs ----------------------------------------------------------------------------------

__device__ uint32_t hash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352d;
  x ^= x >> 15;
  x *= 0x846ca68b;
  x ^= x >> 16;
  return x;
}

// FP8 codes of values uniform in [-4, 4].
__global__ void fill_fp8(uint8_t *p, size_t n, uint32_t seed, bool e5m2) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = (hash(uint32_t(i) * 2654435761u ^ seed) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
    p[i] = __nv_cvt_float_to_fp8(4.0f * u, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
  }
}

// lo + [0, span) in 2^-16 steps.
__global__ void fill_floats(float *p, size_t n, uint32_t seed, float lo, float span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = lo + span * ((hash(uint32_t(i) ^ seed) & 0xFFFF) / 65536.0f);
}

struct Case {
  int64_t m, n, k;
  DType a = DType::E4M3, b = DType::E4M3, d = DType::BF16;
  bool bias = false;
};

// One case's device buffers, filled: A and B codes, their scales in libte's layouts (B's rows
// padded to a multiple of 4 blocks and one row more, so that cuBLASLt's 128x128 layout fits
// too), an optional fp32 bias and the output (0xFF bytes: NaN until written).
struct Operands {
  uint8_t *a = nullptr, *b = nullptr;
  float *a_scale = nullptr, *b_scale = nullptr, *bias = nullptr;
  void *d = nullptr;
  size_t d_bytes = 0;

  explicit Operands(const Case &c) {
    const int64_t kb = ceil_div(c.k, 128);
    const size_t a_scales = size_t(c.m * kb), b_scales = size_t((ceil_div(c.n, 128) + 1) * (ceil_div(kb, 4) * 4 + 4));
    d_bytes = size_t(c.m * c.n) * dtype_size(c.d);
    CK(cudaMalloc(&a, size_t(c.m * c.k)));
    CK(cudaMalloc(&b, size_t(c.n * c.k)));
    CK(cudaMalloc(&a_scale, a_scales * 4));
    CK(cudaMalloc(&b_scale, b_scales * 4));
    CK(cudaMalloc(&d, d_bytes));
    CK(cudaMemset(d, 0xFF, d_bytes));
    fill_fp8<<<1024, 256>>>(a, size_t(c.m * c.k), 1, c.a == DType::E5M2);
    CK(cudaGetLastError());
    fill_fp8<<<1024, 256>>>(b, size_t(c.n * c.k), 2, c.b == DType::E5M2);
    CK(cudaGetLastError());
    fill_floats<<<256, 256>>>(a_scale, a_scales, 3, 0.5f, 1.0f);
    CK(cudaGetLastError());
    fill_floats<<<256, 256>>>(b_scale, b_scales, 4, 0.5f, 1.0f);
    CK(cudaGetLastError());
    if (c.bias) {
      CK(cudaMalloc(&bias, size_t(c.n) * 4));
      fill_floats<<<64, 256>>>(bias, size_t(c.n), 5, -0.5f, 1.0f);
      CK(cudaGetLastError());
    }
  }
  ~Operands() {
    for (void *p : {(void *)a, (void *)b, (void *)a_scale, (void *)b_scale, (void *)bias, d}) cudaFree(p);
  }
  Operands(const Operands &) = delete;
  Operands &operator=(const Operands &) = delete;

  BlockGemmArgs args(const Case &c) const {
    BlockGemmArgs g;
    g.a = a;
    g.b = b;
    g.a_dtype = c.a;
    g.b_dtype = c.b;
    g.a_scale_inv = a_scale;
    g.b_scale_inv = b_scale;
    g.d = d;
    g.d_dtype = c.d;
    g.bias = bias;
    g.bias_dtype = DType::F32;
    g.m = c.m;
    g.n = c.n;
    g.k = c.k;
    return g;
  }
};

// ---- check -----------------------------------------------------------------------------------

__device__ float decode(uint8_t c, bool e5m2) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), e5m2 ? __NV_E5M2 : __NV_E4M3);
  return __half2float(__half(h));
}

// For each sampled output index (row * n + col): the fp64 result and sum |terms|.
__global__ void reference(const uint8_t *a, const uint8_t *b, bool a5, bool b5, const float *sa, const float *sb,
                          const float *bias, int64_t n, int64_t k, const int64_t *index, int count, double *ref,
                          double *abs_sum) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= count) return;
  const int64_t i = index[s] / n, j = index[s] % n, kb_n = (k + 127) / 128;
  double acc = 0, mag = 0;
  for (int64_t kb = 0; kb < kb_n; ++kb) {
    double part = 0, part_mag = 0;
    for (int64_t kk = kb * 128; kk < min(k, kb * 128 + 128); ++kk) {
      const double x = double(decode(a[i * k + kk], a5)) * double(decode(b[j * k + kk], b5));
      part += x;
      part_mag += fabs(x);
    }
    const double scale = double(sa[i * kb_n + kb]) * double(sb[(j / 128) * kb_n + kb]);
    acc += part * scale;
    mag += part_mag * scale;
  }
  if (bias) acc += bias[j], mag += fabs(bias[j]);
  ref[s] = acc;
  abs_sum[s] = mag;
}

float output_at(const std::vector<uint8_t> &d, DType t, int64_t i) {
  if (t == DType::F32) {
    float f;
    memcpy(&f, d.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, d.data() + 2 * i, 2);
  if (t == DType::BF16) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}

const char *name(DType t) {
  switch (t) {
    case DType::E4M3:
      return "e4m3";
    case DType::E5M2:
      return "e5m2";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    default:
      return "f32";
  }
}

// Compares the sampled outputs `index` of `out` (one kernel's) with their fp64 references and
// sums |terms|; prints one line.
bool compare(const Case &c, const char *kernel, const std::vector<uint8_t> &out, const std::vector<int64_t> &index,
             const std::vector<double> &ref, const std::vector<double> &mag) {
  const int count = int(index.size());
  const double rounding = c.d == DType::BF16 ? 1.0 / 256 : c.d == DType::F16 ? 1.0 / 2048 : 1e-6;
  double worst = 0, worst_rel = 0;
  int64_t worst_at = 0;
  int bad = 0;
  for (int s = 0; s < count; ++s) {
    const double err = fabs(double(output_at(out, c.d, index[s])) - ref[s]);  // NaN if never written
    const double tol = rounding * fabs(ref[s]) + std::ldexp(1.0, -11) * mag[s] + 1e-30;
    if (!(err <= tol)) ++bad;
    if (!(err / tol <= worst)) worst = err / tol, worst_at = index[s];
    worst_rel = std::max(worst_rel, err / (mag[s] + 1e-30));
  }
  printf(
      "check %-7s m=%lld n=%lld k=%lld a=%s b=%s d=%s bias=%d, %d outputs: worst err/tol %.3f at (%lld, %lld), "
      "max err / sum|terms| %.2e, %d over tolerance: %s\n",
      kernel, (long long)c.m, (long long)c.n, (long long)c.k, name(c.a), name(c.b), name(c.d), int(c.bias), count,
      worst, (long long)(worst_at / c.n), (long long)(worst_at % c.n), worst_rel, bad, bad ? "FAIL" : "ok");
  return bad == 0;
}

// Checks both kernels, the per-CTA one and the cluster one, on the same operands.
bool check(const Case &c, int max_samples) {
  Operands op(c);
  BlockGemmArgs g = op.args(c);
  if (const char *why = block_gemm_unsupported(g, 9, 0)) {
    printf("check m=%lld n=%lld k=%lld: unsupported (%s) FAIL\n", (long long)c.m, (long long)c.n, (long long)c.k, why);
    return false;
  }

  // Every output, or a spread-out sample of a large one.
  const int64_t total = c.m * c.n;
  const int count = total <= max_samples ? int(total) : max_samples;
  std::vector<int64_t> index(count);
  for (int s = 0; s < count; ++s)
    index[s] = total <= max_samples ? s : int64_t((uint64_t(s) * 2654435761ull * 40503ull) % uint64_t(total));
  int64_t *d_index;
  double *d_ref, *d_mag;
  CK(cudaMalloc(&d_index, count * sizeof(int64_t)));
  CK(cudaMalloc(&d_ref, count * sizeof(double)));
  CK(cudaMalloc(&d_mag, count * sizeof(double)));
  CK(cudaMemcpy(d_index, index.data(), count * sizeof(int64_t), cudaMemcpyHostToDevice));
  reference<<<(count + 127) / 128, 128>>>(op.a, op.b, c.a == DType::E5M2, c.b == DType::E5M2, op.a_scale, op.b_scale,
                                          op.bias, c.n, c.k, d_index, count, d_ref, d_mag);
  CK(cudaGetLastError());
  std::vector<double> ref(count), mag(count);
  CK(cudaMemcpy(ref.data(), d_ref, count * sizeof(double), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(mag.data(), d_mag, count * sizeof(double), cudaMemcpyDeviceToHost));
  for (void *p : {(void *)d_index, (void *)d_ref, (void *)d_mag}) CK(cudaFree(p));

  bool ok = true;
  std::vector<uint8_t> out(op.d_bytes);
  for (const bool cluster : {false, true}) {
    g.cluster = cluster;
    CK(cudaMemset(op.d, 0xFF, op.d_bytes));  // NaN until written, again for the second kernel
    block_gemm(g, g_sms, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(out.data(), op.d, op.d_bytes, cudaMemcpyDeviceToHost));
    ok &= compare(c, cluster ? "cluster" : "per-CTA", out, index, ref, mag);
  }
  return ok;
}

// ---- bench -----------------------------------------------------------------------------------

// cuBLASLt's block-scaled GEMM of the same operands (libte's row-major D = A B^T is cuBLASLt's
// column-major D^T = B A^T: its A is our B, 128x128-scaled, its B our A, 1x128).
struct LtPeer {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  void *ws = nullptr;
  size_t ws_bytes = size_t(64) << 20;
  const Operands &op;

  LtPeer(const Case &c, const Operands &o) : op(o) {
    LK(cublasLtCreate(&lt));
    LK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
    const int8_t fast = 0;
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &op.b_scale, sizeof op.b_scale));
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &op.a_scale, sizeof op.a_scale));
    const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                      b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode));
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode));
    LK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, c.k, c.n, c.k));
    LK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, c.k, c.m, c.k));
    LK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, c.n, c.m, c.n));
    CK(cudaMalloc(&ws, ws_bytes));
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                            sizeof ws_bytes));
    LK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
  }
  ~LtPeer() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cudaFree(ws);
  }
  void run() {
    const float alpha = 1.0f, beta = 0.0f;
    LK(cublasLtMatmul(lt, desc, &alpha, op.b, la, op.a, lb, &beta, op.d, ld, op.d, ld, &heur.algo, ws, ws_bytes, 0));
  }
};

// Median of 10 timed runs after 3 untimed ones, in ms.
template <class Run>
double time_ms(Run run) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) run();
  std::vector<float> t;
  for (int r = 0; r < 10; ++r) {
    CK(cudaEventRecord(e0));
    run();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void bench(int64_t m, int64_t n, int64_t k) {
  const Case c{m, n, k};
  Operands op(c);
  BlockGemmArgs per_cta = op.args(c);
  if (const char *why = block_gemm_unsupported(per_cta, 9, 0)) {
    printf("bench m=%lld n=%lld k=%lld: unsupported (%s)\n", (long long)m, (long long)n, (long long)k, why);
    return;
  }
  BlockGemmArgs cluster = per_cta;
  cluster.cluster = true;
  LtPeer peer(c, op);
  const double flops = 2.0 * double(m) * double(n) * double(k);
  double lt[3], ours[3], ours_cluster[3];
  for (int rep = 0; rep < 3; ++rep) {  // alternating, so that clock drift hits all three
    lt[rep] = peer.found ? time_ms([&] { peer.run(); }) : 0.0;
    ours[rep] = time_ms([&] { block_gemm(per_cta, g_sms, 0); });
    ours_cluster[rep] = time_ms([&] { block_gemm(cluster, g_sms, 0); });
  }
  CK(cudaGetLastError());
  const auto tflops = [&](double ms) { return ms > 0 ? flops / ms / 1e9 : 0.0; };
  for (int rep = 0; rep < 3; ++rep)
    printf(
        "bench m=%lld n=%lld k=%lld: cuBLASLt %.4f ms %.0f TFLOP/s | per-CTA %.4f ms %.0f TFLOP/s (%.3fx) | "
        "cluster %.4f ms %.0f TFLOP/s (%.3fx) | speed vs cuBLASLt in (), cluster / per-CTA %.3fx\n",
        (long long)m, (long long)n, (long long)k, lt[rep], tflops(lt[rep]), ours[rep], tflops(ours[rep]),
        lt[rep] / ours[rep], ours_cluster[rep], tflops(ours_cluster[rep]), lt[rep] / ours_cluster[rep],
        ours[rep] / ours_cluster[rep]);
}

// One launch of each, for a profiler.
void profile(int64_t m, int64_t n, int64_t k) {
  const Case c{m, n, k};
  Operands op(c);
  BlockGemmArgs g = op.args(c);
  LtPeer peer(c, op);
  if (peer.found) peer.run();
  block_gemm(g, g_sms, 0);
  g.cluster = true;
  block_gemm(g, g_sms, 0);
  CK(cudaDeviceSynchronize());
  printf("profile m=%lld n=%lld k=%lld: launched\n", (long long)m, (long long)n, (long long)k);
}

}  // namespace

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (argc > 2 ||
      (*mode && strcmp(mode, "check") && strcmp(mode, "bench") && strcmp(mode, "grid") && strcmp(mode, "profile"))) {
    fprintf(stderr, "usage: %s [check | bench | grid | profile]\n", argv[0]);
    return 2;
  }
  int major = 0, minor = 0;
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  if (major != 9 || minor != 0) {
    printf("SKIPPED: device 0 is sm_%d%d; this kernel is for sm_90a only\n", major, minor);
    return 0;
  }
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  if (!strcmp(mode, "grid")) {
    for (int grid : {132, 100, 66, 33}) {
      if (grid > g_sms) continue;
      g_sms = grid;
      printf("grid %d\n", grid);
      bench(16384, 14336, 4096);
    }
    return 0;
  }
  if (!strcmp(mode, "profile")) {
    profile(16384, 14336, 4096);
    return 0;
  }
  bool ok = true;
  if (strcmp(mode, "bench")) {
    const int kSamples = 200000;
    using D = DType;
    ok &= check({128, 128, 128}, kSamples);
    ok &= check({256, 384, 512}, kSamples);
    ok &= check({300, 264, 400}, kSamples);
    ok &= check({1000, 1000, 1040, D::E4M3, D::E4M3, D::BF16, true}, 2000000);
    ok &= check({129, 136, 144, D::E5M2, D::E4M3, D::BF16}, kSamples);
    ok &= check({777, 520, 2064, D::E4M3, D::E5M2, D::F16, true}, kSamples);
    ok &= check({513, 772, 1536, D::E5M2, D::E5M2, D::F32, true}, kSamples);
    ok &= check({64, 100000, 256, D::E4M3, D::E4M3, D::F32}, kSamples);
    ok &= check({16384, 14336, 4096}, 20000);
    ok &= check({16384, 4096, 14336, D::E5M2, D::E4M3, D::BF16}, 20000);
    // Odd numbers of row blocks (the cluster's last pair half idle), exact and ragged, with the
    // last column block's second half of B past n (392, 2056) or partly in (200); the last two
    // walk more pairs than there are clusters, the last with a short group of pairs.
    ok &= check({1152, 200, 640, D::E4M3, D::E4M3, D::BF16, true}, kSamples);
    ok &= check({640, 392, 1024, D::E4M3, D::E5M2, D::F32}, kSamples);
    ok &= check({16200, 2056, 512, D::E4M3, D::E4M3, D::BF16, true}, kSamples);
    ok &= check({14900, 1536, 1024, D::E5M2, D::E4M3, D::F16}, kSamples);
    printf("correctness %s\n", ok ? "PASS" : "FAIL");
  }
  if (strcmp(mode, "check")) {
    bench(16384, 14336, 4096);
    bench(16384, 4096, 14336);
    bench(8192, 8192, 8192);
    bench(4096, 4096, 4096);
    bench(2048, 7168, 2048);
  }
  return ok ? 0 : 1;
}
