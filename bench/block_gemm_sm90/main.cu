// te_bench_block_gemm_sm90: the sm_90a block-scaled GEMM of block_gemm.h, checked against an fp64
// reference on the GPU and timed beside cuBLASLt's block-scaled kernel in the same process.
//
// Run: te_bench_block_gemm_sm90 [check | bench | grid]   (no argument: check, then bench)
//   check: M x N x K cases (all four FP8 pairs, BF16 / F16 / F32 output, bias, ragged edges),
//          every output (or a 20000-200000 sample of a large one) against fp64 sums of the decoded
//          codes times their scales. Tolerance: the output's rounding (2^-8 BF16, 2^-11 F16,
//          1e-6 F32) of |ref| plus 2^-11 of sum |terms| (Hopper's FP8 tensor cores add with
//          fewer bits than fp32 inside a 128-deep block). Exit status 1 on any failure.
//   bench: five shapes, 3 x (median of 10 CUDA-event timings) each, libte beside cuBLASLt
//          (heuristic #0, fp32 accumulation, BF16 output), random codes in [-4, 4] and scales
//          in [0.5, 1.5) (never zeros).
//   grid:  16384 x 14336 x 4096 with 132, 100, 66, 33 CTAs: per-SM rate apart from L2 pressure.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "block_gemm.h"
using namespace block_gemm_sm90;
static size_t dtype_size(DType t) { return t == DType::F32 ? 4 : (t == DType::F16 || t == DType::BF16) ? 2 : 1; }
#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)
#define LK(x)                                   \
  do {                                          \
    cublasStatus_t s_ = (x);                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) {          \
      fprintf(stderr, "%s: %d\n", #x, int(s_)); \
      exit(1);                                  \
    }                                           \
  } while (0)
__device__ uint32_t hash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352d;
  x ^= x >> 15;
  x *= 0x846ca68b;
  x ^= x >> 16;
  return x;
}
__global__ void fill_fp8(uint8_t* p, size_t n, uint32_t seed, bool e5) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = hash(uint32_t(i) * 2654435761u ^ seed);
    float u = (h & 0xFFFFFF) / 16777216.0f * 2.f - 1.f;
    float v = u * 4.0f;
    p[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5 ? __NV_E5M2 : __NV_E4M3);
  }
}
__global__ void fill_scales(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = hash(uint32_t(i) ^ seed);
    p[i] = 0.5f + (h & 0xFFFF) / 65536.0f;
  }
}
__global__ void fill_f32(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = hash(uint32_t(i) ^ seed);
    p[i] = (h & 0xFFFF) / 65536.0f - 0.5f;
  }
}
__device__ float dec(uint8_t c, bool e5) {
  __nv_fp8_storage_t s = c;
  __half_raw h = __nv_cvt_fp8_to_halfraw(s, e5 ? __NV_E5M2 : __NV_E4M3);
  return __half2float(__half(h));
}
// samples: index list (row*n+col); out err metric
__global__ void reference(const uint8_t* a, const uint8_t* b, bool a5, bool b5, const float* sa, const float* sb,
                          const float* bias, int m, int n, int k, const long long* idx, int ns, double* ref,
                          double* absref) {
  int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= ns) return;
  long long id = idx[s];
  int i = id / n, j = id % n;
  int kb_n = (k + 127) / 128;
  double acc = 0, aa = 0;
  for (int kb = 0; kb < kb_n; ++kb) {
    double part = 0, pa = 0;
    for (int kk = kb * 128; kk < min(k, kb * 128 + 128); ++kk) {
      double x = dec(a[(size_t)i * k + kk], a5) * (double)dec(b[(size_t)j * k + kk], b5);
      part += x;
      pa += fabs(x);
    }
    double sc = (double)sa[(size_t)i * kb_n + kb] * sb[(size_t)(j / 128) * kb_n + kb];
    acc += part * sc;
    aa += pa * sc;
  }
  if (bias) {
    acc += bias[j];
    aa += fabs(bias[j]);
  }
  ref[s] = acc;
  absref[s] = aa;
}
float to_f(const void* d, DType t, size_t i) {
  if (t == DType::F32) return ((const float*)d)[i];
  uint16_t h = ((const uint16_t*)d)[i];
  if (t == DType::BF16) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}
int sms;
bool check(int64_t m, int64_t n, int64_t k, DType at, DType bt, DType dt, bool with_bias, int max_samples) {
  uint8_t *a, *b;
  float *sa, *sb, *bias = nullptr;
  void* d;
  int kb = (k + 127) / 128;
  CK(cudaMalloc(&a, m * k));
  CK(cudaMalloc(&b, n * k));
  CK(cudaMalloc(&sa, m * kb * 4));
  CK(cudaMalloc(&sb, ((n + 127) / 128) * kb * 4));
  size_t db = m * n * dtype_size(dt);
  CK(cudaMalloc(&d, db));
  CK(cudaMemset(d, 0xFF, db));
  fill_fp8<<<1024, 256>>>(a, m * k, 1, at == DType::E5M2);
  fill_fp8<<<1024, 256>>>(b, n * k, 2, bt == DType::E5M2);
  fill_scales<<<256, 256>>>(sa, m * kb, 3);
  fill_scales<<<256, 256>>>(sb, ((n + 127) / 128) * kb, 4);
  std::vector<float> hbias;
  if (with_bias) {
    CK(cudaMalloc(&bias, n * 4));
    fill_f32<<<64, 256>>>(bias, n, 5);
  }
  BlockGemmArgs g;
  g.a = a;
  g.b = b;
  g.a_dtype = at;
  g.b_dtype = bt;
  g.a_scale_inv = sa;
  g.b_scale_inv = sb;
  g.d = d;
  g.d_dtype = dt;
  g.bias = bias;
  g.bias_dtype = DType::F32;
  g.m = m;
  g.n = n;
  g.k = k;
  const char* why = block_gemm_unsupported(g, 9, 0);
  if (why) {
    printf("unsupported: %s\n", why);
    return false;
  }
  block_gemm(g, sms, 0);
  CK(cudaDeviceSynchronize());
  long long total = m * n;
  int ns = total <= max_samples ? (int)total : max_samples;
  std::vector<long long> hidx(ns);
  for (int s = 0; s < ns; ++s)
    hidx[s] = total <= max_samples
                  ? s
                  : (long long)((unsigned long long)s * 2654435761ull * 40503ull % (unsigned long long)total);
  long long* didx;
  double *ref, *absr;
  CK(cudaMalloc(&didx, ns * 8));
  CK(cudaMalloc(&ref, ns * 8));
  CK(cudaMalloc(&absr, ns * 8));
  CK(cudaMemcpy(didx, hidx.data(), ns * 8, cudaMemcpyHostToDevice));
  reference<<<(ns + 127) / 128, 128>>>(a, b, at == DType::E5M2, bt == DType::E5M2, sa, sb, bias, m, n, k, didx, ns, ref,
                                       absr);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<double> hr(ns), ha(ns);
  CK(cudaMemcpy(hr.data(), ref, ns * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ha.data(), absr, ns * 8, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> hd(db);
  CK(cudaMemcpy(hd.data(), d, db, cudaMemcpyDeviceToHost));
  double rel = dt == DType::BF16 ? 1.0 / 256 : dt == DType::F16 ? 1.0 / 2048 : 1e-6;
  double worst = 0, worst_abs = 0;
  long long wi = -1;
  int bad = 0;
  for (int s = 0; s < ns; ++s) {
    double got = to_f(hd.data(), dt, hidx[s]);
    double tol = rel * fabs(hr[s]) + ldexp(1.0, -11) * ha[s] + 1e-30;
    double ea = fabs(got - hr[s]) / (ha[s] + 1e-30);
    if (ea > worst_abs) worst_abs = ea;
    double e = fabs(got - hr[s]) / tol;
    if (!(e <= 1.0)) ++bad;
    if (!(e <= worst)) {
      worst = e;
      wi = hidx[s];
    }
  }
  printf(
      "check m=%lld n=%lld k=%lld a=%s b=%s d=%d bias=%d samples=%d: worst err/tol %.3f at (%lld,%lld) bad=%d "
      "max|err|/sum|terms| %.2e %s\n",
      (long long)m, (long long)n, (long long)k, at == DType::E5M2 ? "e5m2" : "e4m3",
      bt == DType::E5M2 ? "e5m2" : "e4m3", int(dt), int(with_bias), ns, worst, wi < 0 ? -1 : wi / n,
      wi < 0 ? -1 : wi % n, bad, worst_abs, bad ? "FAIL" : "ok");
  cudaFree(a);
  cudaFree(b);
  cudaFree(sa);
  cudaFree(sb);
  cudaFree(d);
  cudaFree(didx);
  cudaFree(ref);
  cudaFree(absr);
  if (bias) cudaFree(bias);
  return bad == 0;
}
double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
void bench(int64_t m, int64_t n, int64_t k) {
  uint8_t *a, *b;
  float *sa, *sb;
  void* d;
  int kb = (k + 127) / 128;
  size_t sf = (std::max(m, n) + 128) * (kb + 4) + 1024;
  CK(cudaMalloc(&a, m * k));
  CK(cudaMalloc(&b, n * k));
  CK(cudaMalloc(&sa, sf * 4));
  CK(cudaMalloc(&sb, sf * 4));
  CK(cudaMalloc(&d, m * n * 2));
  fill_fp8<<<1024, 256>>>(a, m * k, 1, false);
  fill_fp8<<<1024, 256>>>(b, n * k, 2, false);
  fill_scales<<<256, 256>>>(sa, sf, 3);
  fill_scales<<<256, 256>>>(sb, sf, 4);
  BlockGemmArgs g;
  g.a = a;
  g.b = b;
  g.a_scale_inv = sa;
  g.b_scale_inv = sb;
  g.d = d;
  g.d_dtype = DType::BF16;
  g.m = m;
  g.n = n;
  g.k = k;
  // cuBLASLt peer (libte's row-major TN as cuBLASLt's column-major: its A = our B)
  cublasLtHandle_t lt;
  LK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t desc;
  LK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT));
  LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN));
  int8_t fast = 0;
  LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, 1));
  LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb, sizeof sb));
  LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa));
  cublasLtMatmulMatrixScale_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                              bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am));
  LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm));
  cublasLtMatrixLayout_t la, lb, ld;
  LK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k));
  LK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k));
  LK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, m, n));
  size_t ws_bytes = 64 << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  LK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
  float alpha = 1, beta = 0;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto run_ours = [&] { block_gemm(g, sms, 0); };
  auto run_lt = [&] {
    LK(cublasLtMatmul(lt, desc, &alpha, b, la, a, lb, &beta, d, ld, d, ld, &heur.algo, ws, ws_bytes, 0));
  };
  auto time = [&](auto f) {
    for (int i = 0; i < 3; ++i) f();
    std::vector<float> t;
    for (int r = 0; r < 10; ++r) {
      CK(cudaEventRecord(e0));
      f();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms);
    }
    return median(t);
  };
  double fl = 2.0 * m * n * k;
  std::vector<double> o, l;
  for (int rep = 0; rep < 3; ++rep) {
    o.push_back(time(run_ours));
    if (found) l.push_back(time(run_lt));
  }
  for (int rep = 0; rep < 3; ++rep)
    printf(
        "bench m=%lld n=%lld k=%lld: libte sm90 %.4f ms %.0f TFLOP/s | cuBLASLt %.4f ms %.0f TFLOP/s | ratio (time) "
        "%.3f\n",
        (long long)m, (long long)n, (long long)k, o[rep], fl / o[rep] / 1e9, found ? l[rep] : 0,
        found ? fl / l[rep] / 1e9 : 0, found ? o[rep] / l[rep] : 0);
  cudaFree(a);
  cudaFree(b);
  cudaFree(sa);
  cudaFree(sb);
  cudaFree(d);
  cudaFree(ws);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (*mode && strcmp(mode, "check") && strcmp(mode, "bench") && strcmp(mode, "grid")) {
    fprintf(stderr, "usage: %s [check|bench|grid]\n", argv[0]);
    return 2;
  }
  int major = 0, minor = 0;
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  if (major != 9 || minor != 0) {
    printf("SKIPPED: device 0 is sm_%d%d; this kernel is sm_90a only\n", major, minor);
    return 0;
  }
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  bool ok = true;
  if (!strcmp(mode, "grid")) {
    for (int g : {132, 100, 66, 33}) {
      if (g > sms) continue;
      sms = g;
      printf("grid %d\n", g);
      bench(16384, 14336, 4096);
    }
    return 0;
  }
  if (strcmp(mode, "bench")) {
    const int S = 200000;
    ok &= check(128, 128, 128, DType::E4M3, DType::E4M3, DType::BF16, false, S);
    ok &= check(256, 384, 512, DType::E4M3, DType::E4M3, DType::BF16, false, S);
    ok &= check(300, 264, 400, DType::E4M3, DType::E4M3, DType::BF16, false, S);
    ok &= check(1000, 1000, 1040, DType::E4M3, DType::E4M3, DType::BF16, true, 2000000);
    ok &= check(129, 136, 144, DType::E5M2, DType::E4M3, DType::BF16, false, S);
    ok &= check(777, 520, 2064, DType::E4M3, DType::E5M2, DType::F16, true, S);
    ok &= check(513, 772, 1536, DType::E5M2, DType::E5M2, DType::F32, true, S);
    ok &= check(64, 100000, 256, DType::E4M3, DType::E4M3, DType::F32, false, S);
    ok &= check(16384, 14336, 4096, DType::E4M3, DType::E4M3, DType::BF16, false, 20000);
    ok &= check(16384, 4096, 14336, DType::E5M2, DType::E4M3, DType::BF16, false, 20000);
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
