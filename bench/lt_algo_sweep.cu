// lt_algo_sweep: every cuBLASLt configuration of one FP8 GEMM, timed, beside the heuristic's choices.
//
// libte's tuner (core/backends/cuda/lt_gemm.cpp) times the heuristic's candidates. This asks whether
// the rest of cuBLASLt's space (algorithm ids x tiles x stages x cluster shapes x CTA swizzle) holds
// anything faster for the benchmark shapes, per-tensor and block-scaled.
//
// Built as te_bench_lt_sweep in CUDA builds (no libte needed; alone: nvcc -O2 -std=c++17 -arch=sm_90
// bench/lt_algo_sweep.cu -lcublasLt -o te_bench_lt_sweep).
// Run: te_bench_lt_sweep MODE M N K [max_timed]
//   MODE: tensor (per-tensor scales), block (A 1x128, B 128x128: a Linear's fprop / dgrad),
//         wgrad (1x128 x 1x128). M, N, K in libte's naming: D[M, N] = A[M, K] . B[N, K]^T.
// Prints the heuristic's candidates and the ten fastest configurations (median of 5 runs, CUDA
// events), each as TFLOP/s and the ratio to heuristic #0 measured in the same run.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "cuda_exit_checks.h"

// Random E4M3 codes without NaN (0x7f / 0xff), magnitudes up to 2^4: the GEMM works on real values.
__global__ void fill_codes(uint8_t *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    uint8_t c = uint8_t(h & 0x5f) | uint8_t((h >> 8) & 0x80);  // exponent field <= 0xb of 0xf
    p[i] = c;
  }
}

__global__ void fill_scales(float *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = (uint32_t(i) + 1u) * 2246822519u ^ seed;
    h ^= h >> 16;
    p[i] = 0.5f + float(h & 0xffff) / 65536.0f;
  }
}

struct Config {
  int algo_id = 0, tile = 0, stages = 0, cluster = 0, swizzle = 0, custom = 0;
  cublasLtMatmulAlgo_t algo{};
  float ms = -1.0f;
};

struct Gemm {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  void *a = nullptr, *b = nullptr, *d = nullptr, *ws = nullptr;
  size_t ws_bytes = size_t(64) << 20;
  cudaStream_t stream = nullptr;
  cudaEvent_t ev[6];

  bool run(const cublasLtMatmulAlgo_t *algo) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, algo, ws, ws_bytes, stream) ==
           CUBLAS_STATUS_SUCCESS;
  }
  // Median of 5 timed runs after one warm-up; < 0 when the configuration failed to run.
  float time(const cublasLtMatmulAlgo_t *algo) {
    if (!run(algo)) return -1.0f;
    for (int r = 0; r < 5; ++r) {
      CK(cudaEventRecord(ev[r], stream));
      if (!run(algo)) return -1.0f;
    }
    CK(cudaEventRecord(ev[5], stream));
    if (cudaEventSynchronize(ev[5]) != cudaSuccess || cudaGetLastError() != cudaSuccess) return -1.0f;
    float ms[5];
    for (int r = 0; r < 5; ++r) CK(cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]));
    std::sort(ms, ms + 5);
    return ms[2];
  }
};

template <class T>
static std::vector<T> cap_list(const cublasLtMatmulAlgo_t &algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0)
    return {};
  std::vector<T> v(bytes / sizeof(T));
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, v.data(), bytes, &bytes) != CUBLAS_STATUS_SUCCESS) return {};
  return v;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s tensor|block|wgrad M N K [max_timed]\n", argv[0]);
    return 2;
  }
  const char *mode = argv[1];
  const int64_t M = std::atoll(argv[2]), N = std::atoll(argv[3]), K = std::atoll(argv[4]);
  const int max_timed = argc > 5 ? std::atoi(argv[5]) : 4000;
  const bool tensor = !std::strcmp(mode, "tensor"), block = !std::strcmp(mode, "block"),
             wgrad = !std::strcmp(mode, "wgrad");
  if (!(tensor || block || wgrad) || M <= 0 || N <= 0 || K <= 0 || K % 128) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  Gemm g;
  LK(cublasLtCreate(&g.lt));
  CK(cudaStreamCreate(&g.stream));
  for (auto &e : g.ev) CK(cudaEventCreate(&e));
  CK(cudaMalloc(&g.a, size_t(N) * K));  // cuBLASLt's A = libte's B [N, K]
  CK(cudaMalloc(&g.b, size_t(M) * K));  // cuBLASLt's B = libte's A [M, K]
  CK(cudaMalloc(&g.d, size_t(M) * N * 2));
  CK(cudaMalloc(&g.ws, g.ws_bytes));
  fill_codes<<<1024, 256, 0, g.stream>>>(static_cast<uint8_t *>(g.a), size_t(N) * K, 1u);
  fill_codes<<<1024, 256, 0, g.stream>>>(static_cast<uint8_t *>(g.b), size_t(M) * K, 2u);
  // Scales: generous arrays (every layout cuBLASLt may read for these modes fits), values in [0.5, 1.5).
  const size_t scale_floats = (size_t(std::max(M, N)) + 128) * (size_t(K) / 128 + 4) + 1024;
  float *sa = nullptr, *sb = nullptr;
  CK(cudaMalloc(&sa, scale_floats * 4));
  CK(cudaMalloc(&sb, scale_floats * 4));
  fill_scales<<<1024, 256, 0, g.stream>>>(sa, scale_floats, 3u);
  fill_scales<<<1024, 256, 0, g.stream>>>(sb, scale_floats, 4u);
  CK(cudaGetLastError());

  LK(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
  LK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
  // Block-scaled modes run with the fp32 accumulation that libte asks for (no fast accumulation).
  const int8_t fast = tensor ? 1 : 0;
  LK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  LK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
  LK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  if (!tensor) {
    const cublasLtMatmulMatrixScale_t a_mode =
        block ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    LK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
    LK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
  }
  LK(cublasLtMatrixLayoutCreate(&g.la, CUDA_R_8F_E4M3, K, N, K));
  LK(cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_8F_E4M3, K, M, K));
  LK(cublasLtMatrixLayoutCreate(&g.ld, CUDA_R_16BF, N, M, N));

  const double flops = 2.0 * double(M) * double(N) * double(K);
  auto tflops = [&](float ms) { return flops / (double(ms) * 1e-3) / 1e12; };

  // The heuristic's list, as libte asks for it (its #0 is what an untuned libte runs).
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g.ws_bytes,
                                          sizeof(g.ws_bytes)));
  cublasLtMatmulHeuristicResult_t heur[64];
  int found = 0;
  LK(cublasLtMatmulAlgoGetHeuristic(g.lt, g.desc, g.la, g.lb, g.ld, g.ld, pref, 64, heur, &found));
  if (found == 0) {
    std::printf("no heuristic result\n");
    return 1;
  }
  std::printf("%s M=%lld N=%lld K=%lld: %d heuristic candidates\n", mode, (long long)M, (long long)N, (long long)K,
              found);
  auto describe = [](const cublasLtMatmulAlgo_t &algo, char *buf, size_t n) {
    int id = 0;
    uint32_t tile = 0, stages = 0, swz = 0, custom = 0;
    uint16_t cluster = 0, inner = 0;
    int32_t splitk = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner, sizeof inner, &w);
    std::snprintf(buf, n, "id=%d tile=%u stages=%u cluster=%u inner=%u swizzle=%u custom=%u splitk=%d", id, tile,
                  stages, cluster, inner, swz, custom, splitk);
  };
  char buf[160];
  float h0 = -1.0f;
  for (int i = 0; i < found; ++i) {
    if (heur[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const float ms = g.time(&heur[i].algo);
    if (i == 0) h0 = ms;
    describe(heur[i].algo, buf, sizeof buf);
    std::printf("  heuristic #%d %s: %.4f ms %.0f TFLOP/s\n", i, buf, ms, ms > 0 ? tflops(ms) : 0.0);
  }
  // The same #0 again at the end of the sweep gives the run's drift.

  // The whole space: every algorithm id of these types, every tile / stages it lists, the cluster
  // shapes a Hopper kernel may take, CTA swizzle where supported; kept when cublasLtMatmulAlgoCheck
  // accepts it.
  int ids[256];
  int n_ids = 0;
  LK(cublasLtMatmulAlgoGetIds(g.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF,
                              CUDA_R_16BF, 256, ids, &n_ids));
  const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x4x1};
  std::vector<Config> configs;
  long checked = 0;
  for (int ii = 0; ii < n_ids; ++ii) {
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(g.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF,
                               CUDA_R_16BF, ids[ii], &base) != CUBLAS_STATUS_SUCCESS)
      continue;
    std::vector<uint32_t> tiles = cap_list<uint32_t>(base, CUBLASLT_ALGO_CAP_TILE_IDS);
    std::vector<uint32_t> stages = cap_list<uint32_t>(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
    if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
    if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
    int32_t swz_support = 0, custom_max = 0;
    size_t w;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_support,
                                      sizeof swz_support, &w);
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof custom_max,
                                      &w);
    custom_max = std::min(custom_max, 15);
    int accepted = 0;
    for (uint32_t t : tiles)
      for (uint32_t s : stages)
        for (uint16_t c : clusters)
          for (uint32_t z = 0; z <= uint32_t(swz_support ? 1 : 0); ++z)
            for (uint32_t cu = 0; cu <= uint32_t(custom_max); ++cu) {
              cublasLtMatmulAlgo_t algo = base;
              if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &t, sizeof t) ||
                  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &s, sizeof s) ||
                  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c, sizeof c) ||
                  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &z, sizeof z) ||
                  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &cu, sizeof cu))
                continue;
              ++checked;
              cublasLtMatmulHeuristicResult_t r{};
              if (cublasLtMatmulAlgoCheck(g.lt, g.desc, g.la, g.lb, g.ld, g.ld, &algo, &r) != CUBLAS_STATUS_SUCCESS)
                continue;
              if (r.workspaceSize > g.ws_bytes) continue;
              Config cf;
              cf.algo_id = ids[ii];
              cf.tile = int(t);
              cf.stages = int(s);
              cf.cluster = c;
              cf.swizzle = int(z);
              cf.custom = int(cu);
              cf.algo = algo;
              configs.push_back(cf);
              ++accepted;
            }
    std::printf("  algo id %d: %zu tiles, %zu stages, swizzle %d, custom<=%d: %d accepted\n", ids[ii], tiles.size(),
                stages.size(), swz_support, custom_max, accepted);
  }
  std::printf("%d algorithm ids, %ld configurations checked, %zu accepted; timing up to %d\n", n_ids, checked,
              configs.size(), max_timed);
  std::fflush(stdout);
  const int n_time = std::min<int>(int(configs.size()), max_timed);
  // Timed in a shuffled order (a fixed stride through the list) so that a time limit samples every id.
  const double budget_s = 90.0;
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  CK(cudaEventRecord(t0, g.stream));
  size_t stride = 7919;
  while (configs.size() > 1 && std::gcd(stride, configs.size()) != 1) ++stride;
  int timed = 0;
  for (int j = 0; j < n_time; ++j) {
    Config &c = configs[configs.empty() ? 0 : (size_t(j) * stride) % configs.size()];
    c.ms = g.time(&c.algo);
    ++timed;
    if ((j & 15) == 15) {
      float el = 0;
      CK(cudaEventRecord(t1, g.stream));
      CK(cudaEventSynchronize(t1));
      CK(cudaEventElapsedTime(&el, t0, t1));
      if (el > budget_s * 1e3) break;
    }
  }
  std::printf("timed %d configurations\n", timed);
  std::vector<Config> ok;
  for (const Config &c : configs)
    if (c.ms > 0) ok.push_back(c);
  std::sort(ok.begin(), ok.end(), [](const Config &x, const Config &y) { return x.ms < y.ms; });
  const float h0_end = g.time(&heur[0].algo);
  std::printf("heuristic #0: %.4f ms at the start, %.4f ms at the end (%.0f / %.0f TFLOP/s)\n", h0, h0_end,
              tflops(h0), tflops(h0_end));
  const float ref = std::min(h0, h0_end);
  for (size_t i = 0; i < ok.size() && i < 10; ++i) {
    describe(ok[i].algo, buf, sizeof buf);
    // Time the best again: a config that won by noise loses here.
    const float again = g.time(&ok[i].algo);
    std::printf("  #%zu %s: %.4f ms (again %.4f) %.0f TFLOP/s, %.3fx heuristic #0's speed\n", i, buf, ok[i].ms, again,
                tflops(std::max(ok[i].ms, again)), double(ref) / double(std::max(ok[i].ms, again)));
  }
  std::printf("RESULT %s %lld %lld %lld heur0 %.0f best %.0f (%zu timed ok)\n", mode, (long long)M, (long long)N,
              (long long)K, tflops(ref), ok.empty() ? 0.0 : tflops(ok[0].ms), ok.size());
  return 0;
}
