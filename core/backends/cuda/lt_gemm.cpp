// LtGemm (lt_gemm.h): every GEMM of the CUDA backend.
//
// Routes, chosen once per plan key and cached with the plan:
//  - small: GEMMs of at most kSmallGemmMacs multiply-adds with no GELU run on small_gemm
//    (small_gemm.cu), one launch without cuBLASLt, whose host work would cost more than the
//    product (TE_CUDA_SMALL_GEMM=0 sends them to cuBLASLt too, for testing);
//  - direct: one cublasLtMatmul does the product, the scales, + old D, the bias and the GELU;
//  - split: cuBLASLt writes the fp32 product to scratch and gemm_epilogue (lt_gemm_fallback.cu)
//    finishes in fp32 in the same order. Taken where cuBLASLt cannot do the epilogue exactly (a
//    bias of another dtype than the one cuBLASLt reads, which it would round: FP8 GEMMs read a
//    BF16 bias for F32 output; a pre-GELU output of another dtype than D; GELU on block-scaled
//    operands, which cuBLASLt's block-scaling kernels do not offer) or has no algorithm for it.
//  - block-scaled FP8 (A 1x128, B 1x128 or 128x128): cuBLASLt's VEC128_32F / BLK128x128_32F
//    scale modes (cuBLASLt 12.9+), with the scale arrays rearranged into its layouts; where it
//    has no algorithm (or TE_CUDA_BLOCK_GEMM=fallback is set, for testing), the operands are
//    dequantized per block to fp32 and multiplied by an fp32 GEMM.
//
// Algorithm choice, once per plan key (the plan's first call) and never again:
//  - the heuristic is asked for up to kMaxCandidates algorithms. A GEMM of >= 2^33 flops (the
//    ~1 ms class, where the heuristic's top-1 can be some percent off the best) is timed: each
//    candidate runs once to warm up, then kTimedRuns rounds run every candidate once in turn,
//    each run between cudaEvents (one host sync for the whole search); the lowest median wins if
//    it is 2% below #0's (ties and failed candidates: the earlier one). Smaller GEMMs, GEMMs
//    whose m or k varies from call to call (GemmArgs::shape_varies: a mixture of experts' token
//    counts, for which a search would sync the host on most steps), and every key first seen
//    while the stream is capturing a graph, take the heuristic's #0 untimed. TE_GEMM_TUNE=0
//    turns timing off; TE_GEMM_TUNE_LOG=1 prints one stderr line per timed key (each
//    candidate's median, the choice). Both are read when the LtGemm is made.
//  - the timing runs write D (and the pre-GELU output) to scratch of the same dtypes, zeroed
//    first so that beta = 1 reads zeros; the caller's A, B, scales and bias are only read.
//    Scratch comes from the backend's pool (256-byte aligned, so at least the key's alignment
//    class, for which the candidates were filtered). No scratch (OutOfMemory): heuristic #0.
//  - the choice is stored in the plan, which lives as long as the LtGemm: eager calls and graphs
//    captured before or after all run the same algorithm, so results stay bit-identical. The
//    cached path does nothing new (no lookup, allocation or sync beyond the plan's).
#include "backends/cuda/lt_gemm.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/lt_api.h"
#include "backends/cuda/lt_gemm_kernels.h"
#include "base/check.h"

namespace te::cuda {

namespace {

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::E4M3: return CUDA_R_8F_E4M3;
    case DType::E5M2: return CUDA_R_8F_E5M2;
    case DType::I32: break;  // never a GEMM operand (te_gemm refuses it)
  }
  return CUDA_R_32F;
}

int32_t lt_scale_mode(ScalingMode s) {
  switch (s) {
    case ScalingMode::Block1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case ScalingMode::Block128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}

// Largest power of two (up to 256) dividing the address: cuBLASLt's algorithms are chosen for
// a minimum operand alignment, so the alignment class is part of the plan key.
uint16_t alignment(const void *p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint16_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

bool has_bias(Epilogue e) { return e == Epilogue::Bias || e == Epilogue::BiasGelu; }
bool has_gelu(Epilogue e) { return e == Epilogue::Gelu || e == Epilogue::BiasGelu; }

// The bias dtype cuBLASLt reads for a GEMM of `in` operands into `out`: D's dtype, except FP8
// GEMMs into F32, which read BF16 (cublasLtMatmul's FP8 type table).
DType lt_bias_dtype(DType in, DType out) {
  if (is_fp8(in) && out == DType::F32) return DType::BF16;
  return out;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// GEMMs of at most this many multiply-adds (128 x 128 x 128) run on small_gemm: at that size the
// device needs a few microseconds, less than cublasLtMatmul's host work.
constexpr double kSmallGemmMacs = 2097152.0;

// Algorithm choice (see the header comment).
constexpr int kMaxCandidates = 16;  // heuristic results asked for
constexpr int kTimedRuns = 5;       // per candidate, after one warm-up run
constexpr float kSwitchGain = 0.98f;  // another candidate wins only if its median is 2% below #0's
constexpr double kTuneMinFlops = 8589934592.0;  // 2^33: 2 m n k below this keeps heuristic #0

// An environment switch read once: unset or empty -> `unset`, "0" -> false, anything else -> true.
bool env_switch(const char *name, bool unset) {
  const char *e = std::getenv(name);
  if (!e || !e[0]) return unset;
  return std::strcmp(e, "0") != 0;
}

// The cudaEvents between a search's timed runs (each run starts at one and ends at the next),
// destroyed whatever happens.
struct TimingEvents {
  std::array<cudaEvent_t, kTimedRuns * kMaxCandidates + 1> e{};
  void create(int n) {
    for (int i = 0; i < n; ++i) TE_CUDA_CHECK(cudaEventCreate(&e[static_cast<size_t>(i)]));
  }
  ~TimingEvents() {
    for (auto x : e)
      if (x) cudaEventDestroy(x);
  }
};

// Lets this thread make the timing's calls (cudaEventSynchronize, ...) while another thread
// captures a graph in global mode: they touch only this (non-capturing) stream and scratch.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode &) = delete;
  RelaxedCaptureMode &operator=(const RelaxedCaptureMode &) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

struct PlanKey {
  int64_t m = 0, n = 0, k = 0;
  DType a = DType::F32, b = DType::F32, d = DType::F32;  // as cuBLASLt sees them
  DType bias = DType::F32, aux = DType::F32;
  ScalingMode sa = ScalingMode::PerTensor, sb = ScalingMode::PerTensor;
  Epilogue epilogue = Epilogue::None;
  bool aux_out = false, transa = false, transb = false, accumulate = false, fast_accum = false;
  bool split = false;  // product to fp32 scratch, epilogue by gemm_epilogue
  uint16_t align_a = 0, align_b = 0, align_d = 0;

  bool operator==(const PlanKey &o) const {
    return m == o.m && n == o.n && k == o.k && a == o.a && b == o.b && d == o.d && bias == o.bias && aux == o.aux &&
           sa == o.sa && sb == o.sb && epilogue == o.epilogue && aux_out == o.aux_out && transa == o.transa &&
           transb == o.transb && accumulate == o.accumulate && fast_accum == o.fast_accum && split == o.split &&
           align_a == o.align_a && align_b == o.align_b && align_d == o.align_d;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey &k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(uint64_t(k.m));
    mix(uint64_t(k.n));
    mix(uint64_t(k.k));
    mix(uint64_t(k.a) | uint64_t(k.b) << 4 | uint64_t(k.d) << 8 | uint64_t(k.bias) << 12 | uint64_t(k.aux) << 16 |
        uint64_t(k.sa) << 20 | uint64_t(k.sb) << 24 | uint64_t(k.epilogue) << 28);
    mix(uint64_t(k.aux_out) | uint64_t(k.transa) << 1 | uint64_t(k.transb) << 2 | uint64_t(k.accumulate) << 3 |
        uint64_t(k.fast_accum) << 4 | uint64_t(k.split) << 5);
    mix(uint64_t(k.align_a) | uint64_t(k.align_b) << 16 | uint64_t(k.align_d) << 32);
    return static_cast<size_t>(h);
  }
};

// A cached matmul: descriptor, layouts (C shares D's) and the heuristic's algorithm. A plan
// for which cuBLASLt has no algorithm is cached too (supported = false), so that the heuristic
// is never asked about the same key twice.
struct Plan {
  bool supported = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The per-call pointers of one matmul. a/b are libte's operands (cuBLASLt's B and A).
struct Pointers {
  const void *a = nullptr, *b = nullptr;
  const float *a_scale = nullptr, *b_scale = nullptr;
  void *d = nullptr;
  const void *bias = nullptr;
  void *aux = nullptr;
};

}  // namespace

struct LtGemm::Impl {
  LtApi api;
  cublasLtHandle_t handle = nullptr;
  bool block_modes = false;     // this cuBLASLt has VEC128_32F / BLK128x128_32F
  bool force_fallback = false;  // TE_CUDA_BLOCK_GEMM=fallback
  bool tune = true;             // TE_GEMM_TUNE != 0: time the candidates of large GEMMs
  bool tune_log = false;        // TE_GEMM_TUNE_LOG=1: one stderr line per timed key
  bool small = true;            // TE_CUDA_SMALL_GEMM != 0: small GEMMs by small_gemm, not cuBLASLt
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans;

  ~Impl() {
    for (auto &kv : plans) destroy(kv.second);
    if (handle) api.destroy(handle);
  }

  void destroy(Plan &p) {
    if (p.desc) api.matmul_desc_destroy(p.desc);
    if (p.a) api.matrix_layout_destroy(p.a);
    if (p.b) api.matrix_layout_destroy(p.b);
    if (p.d) api.matrix_layout_destroy(p.d);
    p = Plan{};
  }

  template <class T>
  void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T &value) {
    api.check(api.matmul_desc_set_attribute(desc, attr, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
  }

  void set_pointers(const PlanKey &key, cublasLtMatmulDesc_t desc, const Pointers &p) {
    if (is_fp8(key.a)) {
      // cuBLASLt's A is libte's B.
      set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void *>(p.b_scale));
      set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void *>(p.a_scale));
    }
    if (!key.split && has_bias(key.epilogue)) set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    if (!key.split && key.aux_out) set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void *>(p.aux));
  }

  // Whether a new plan's candidates are timed: tuning on, several candidates, a large GEMM, a
  // clean CUDA error state (a pending error is the caller's to see) and a stream that is not
  // capturing (a key first seen in capture keeps heuristic #0 for good).
  bool should_tune(const PlanKey &key, int candidates, bool may_tune, cudaStream_t stream) const {
    if (!tune || !may_tune || candidates < 2) return false;
    if (2.0 * double(key.m) * double(key.n) * double(key.k) < kTuneMinFlops) return false;
    if (cudaPeekAtLastError() != cudaSuccess) return false;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
      // The legacy stream while another stream captures: not timed. The query's error is ours.
      (void)cudaGetLastError();
      return false;
    }
    return capture == cudaStreamCaptureStatusNone;
  }

  // Times each candidate into scratch outputs and returns the index of the fastest (0 when none
  // ran or no scratch could be had). One host sync for the search; the caller's D is not touched.
  int choose_algo(const PlanKey &key, Plan &p, const cublasLtMatmulHeuristicResult_t *cand, int count,
                  const Pointers &ptrs, Backend &be, void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    RelaxedCaptureMode relaxed;
    const size_t elements = static_cast<size_t>(key.m) * static_cast<size_t>(key.n);
    const size_t d_bytes = elements * dtype_size(key.d);
    const bool aux = !key.split && key.aux_out;
    Buffer d, aux_out;
    try {
      d = Buffer(&be, d_bytes);
      if (aux) aux_out = Buffer(&be, elements * dtype_size(key.aux));
    } catch (const Error &e) {
      if (e.status() != Status::OutOfMemory) throw;
      (void)cudaGetLastError();  // the failed allocation's error (not sticky)
      return 0;
    }
    TE_CUDA_CHECK(cudaMemsetAsync(d.get(), 0, d_bytes, stream));
    Pointers scratch = ptrs;
    scratch.d = d.get();
    scratch.aux = aux ? aux_out.get() : nullptr;
    set_pointers(key, p.desc, scratch);  // matmul() sets the caller's pointers again at each call
    TimingEvents ev;
    ev.create(count * kTimedRuns + 1);

    const float alpha = 1.0f, beta = key.accumulate ? 1.0f : 0.0f;
    auto run = [&](int i) {
      bool ok = api.matmul(handle, p.desc, &alpha, scratch.b, p.a, scratch.a, p.b, &beta, scratch.d, p.d, scratch.d,
                           p.d, &cand[i].algo, workspace, workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
      // A launch error of this candidate's kernel (not sticky) fails the candidate only; a sticky
      // one fails the next CUDA call below.
      if (cudaGetLastError() != cudaSuccess) ok = false;
      return ok;
    };
    // Every candidate warms up, then each round runs every candidate once, in turn: a drift of
    // the clocks during the search (power, temperature) falls on all candidates alike, not on the
    // later ones as when each candidate ran all its runs back to back.
    std::array<bool, kMaxCandidates> live{};
    for (int i = 0; i < count; ++i) live[i] = cand[i].state == CUBLAS_STATUS_SUCCESS && run(i);
    std::array<std::array<int, kMaxCandidates>, kTimedRuns> start{};  // event index of each timed run
    int events = 0;
    for (int r = 0; r < kTimedRuns; ++r) {
      for (int i = 0; i < count; ++i) {
        if (!live[i]) continue;
        TE_CUDA_CHECK(cudaEventRecord(ev.e[events], stream));
        if (!run(i)) {
          live[i] = false;  // its event is recorded again by the next run
          continue;
        }
        start[r][i] = events++;
      }
    }
    TE_CUDA_CHECK(cudaEventRecord(ev.e[events], stream));
    TE_CUDA_CHECK(cudaEventSynchronize(ev.e[events]));
    std::array<float, kMaxCandidates> median;
    median.fill(-1.0f);  // < 0: failed
    for (int i = 0; i < count; ++i) {
      if (!live[i]) continue;
      std::array<float, kTimedRuns> ms{};
      for (int r = 0; r < kTimedRuns; ++r)
        TE_CUDA_CHECK(cudaEventElapsedTime(&ms[r], ev.e[start[r][i]], ev.e[start[r][i] + 1]));
      std::sort(ms.begin(), ms.end());
      median[i] = ms[kTimedRuns / 2];
    }
    int best = -1;
    for (int i = 0; i < count; ++i)
      if (median[i] >= 0.0f && (best < 0 || median[i] < median[best])) best = i;  // ties: the earlier
    // Leave the heuristic's choice only for a clear gain: timing noise alone then rarely makes two
    // runs of one program choose differently (and so round differently).
    if (best < 0 || (median[0] >= 0.0f && median[best] > kSwitchGain * median[0])) best = 0;
    if (tune_log) log_choice(key, median.data(), count, best);
    return best;
  }

  // Off the hot path (plan creation, TE_GEMM_TUNE_LOG=1 only).
  static void log_choice(const PlanKey &key, const float *median, int count, int best) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "te: gemm tune m=%lld n=%lld k=%lld %sx%s->%s", static_cast<long long>(key.m),
                  static_cast<long long>(key.n), static_cast<long long>(key.k), dtype_name(key.a), dtype_name(key.b),
                  dtype_name(key.d));
    std::string line = buf;
    std::snprintf(buf, sizeof buf, " fast_accum=%d accumulate=%d epilogue=%d split=%d scaling=%d/%d ms:",
                  int(key.fast_accum), int(key.accumulate), int(key.epilogue), int(key.split), int(key.sa),
                  int(key.sb));
    line += buf;
    for (int i = 0; i < count; ++i) {
      if (median[i] >= 0.0f)
        std::snprintf(buf, sizeof buf, " #%d %.4f", i, double(median[i]));
      else
        std::snprintf(buf, sizeof buf, " #%d failed", i);
      line += buf;
    }
    if (median[0] > 0.0f && median[best] >= 0.0f)
      std::snprintf(buf, sizeof buf, " -> #%d (%.3fx #0's speed)", best, double(median[0] / median[best]));
    else
      std::snprintf(buf, sizeof buf, " -> #%d", best);
    line += buf;
    std::fprintf(stderr, "%s\n", line.c_str());
  }

  Plan make_plan(const PlanKey &key, const Pointers &ptrs, bool may_tune, Backend &be, void *workspace,
                 size_t workspace_bytes, cudaStream_t stream) {
    Plan p;
    try {
      api.check(api.matmul_desc_create(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
      const cublasOperation_t ta = key.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t tb = key.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
      set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
      set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
      if (is_fp8(key.a)) {
        set(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(key.fast_accum ? 1 : 0));
        if (key.sa != ScalingMode::PerTensor || key.sb != ScalingMode::PerTensor) {
          set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_scale_mode(key.sb));
          set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_scale_mode(key.sa));
        }
      }
      cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
      if (!key.split) {
        switch (key.epilogue) {
          case Epilogue::None: break;
          case Epilogue::Bias: epi = CUBLASLT_EPILOGUE_BIAS; break;
          case Epilogue::Gelu: epi = key.aux_out ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU; break;
          case Epilogue::BiasGelu:
            epi = key.aux_out ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
            break;
        }
        if (has_bias(key.epilogue)) set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(lt_type(key.bias)));
        if (key.aux_out) {
          set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(key.n));
          if (is_fp8(key.a))
            set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, static_cast<int32_t>(lt_type(key.aux)));
        }
      }
      set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
      set_pointers(key, p.desc, ptrs);

      // Column-major view: cuBLASLt's A is libte's B ([k, n], or [n, k] when transb), its B is
      // libte's A ([m, k], or [k, m] when transa); each row-major [r, c] is column-major [c, r].
      const int64_t b_rows = key.transb ? key.n : key.k, b_cols = key.transb ? key.k : key.n;
      const int64_t a_rows = key.transa ? key.k : key.m, a_cols = key.transa ? key.m : key.k;
      api.check(api.matrix_layout_create(&p.a, lt_type(key.b), b_cols, b_rows, b_cols), "cublasLtMatrixLayoutCreate");
      api.check(api.matrix_layout_create(&p.b, lt_type(key.a), a_cols, a_rows, a_cols), "cublasLtMatrixLayoutCreate");
      api.check(api.matrix_layout_create(&p.d, lt_type(key.d), key.n, key.m, key.n), "cublasLtMatrixLayoutCreate");

      cublasLtMatmulPreference_t pref = nullptr;
      api.check(api.matmul_preference_create(&pref), "cublasLtMatmulPreferenceCreate");
      std::array<cublasLtMatmulHeuristicResult_t, kMaxCandidates> results{};
      int found = 0;
      cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
      auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto &v) {
        if (st == CUBLAS_STATUS_SUCCESS) st = api.matmul_preference_set_attribute(pref, attr, &v, sizeof(v));
      };
      set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_bytes));
      set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(key.align_b));
      set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(key.align_a));
      set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(key.align_d));
      set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(key.align_d));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = api.matmul_algo_get_heuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, kMaxCandidates, results.data(),
                                           &found);
      api.matmul_preference_destroy(pref);
      if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) {
        destroy(p);  // supported stays false
        return p;
      }
      api.check(st, "cublasLtMatmulAlgoGetHeuristic");
      found = std::min(found, kMaxCandidates);
      int chosen = 0;
      if (should_tune(key, found, may_tune, stream))
        chosen = choose_algo(key, p, results.data(), found, ptrs, be, workspace, workspace_bytes, stream);
      p.algo = results[chosen].algo;
      p.supported = true;
      return p;
    } catch (...) {
      destroy(p);
      throw;
    }
  }

  Plan &plan(const PlanKey &key, const Pointers &ptrs, bool may_tune, Backend &be, void *workspace,
             size_t workspace_bytes, cudaStream_t stream) {
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan p = make_plan(key, ptrs, may_tune, be, workspace, workspace_bytes, stream);
    return plans.emplace(key, p).first->second;
  }

  void matmul(const PlanKey &key, Plan &p, const Pointers &ptrs, bool accumulate, void *workspace,
              size_t workspace_bytes, cudaStream_t stream) {
    set_pointers(key, p.desc, ptrs);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    // libte's B is cuBLASLt's A; C is D (read only when beta = 1).
    api.check(api.matmul(handle, p.desc, &alpha, ptrs.b, p.a, ptrs.a, p.b, &beta, ptrs.d, p.d, ptrs.d, p.d, &p.algo,
                         workspace, workspace_bytes, stream),
              "cublasLtMatmul");
  }

  // Runs D = epilogue(op(a) op(b)) for operands as cuBLASLt will see them (FP8 with scales, or
  // high precision). Returns false when cuBLASLt has no algorithm for either route.
  bool execute(Backend &be, const GemmArgs &g, const TensorView &a, const TensorView &b, const float *a_scale,
               const float *b_scale, bool allow_direct, void *workspace, size_t workspace_bytes,
               cudaStream_t stream) {
    const int64_t m = g.d.rows(), n = g.d.cols(), k = g.transa ? g.a.rows() : g.a.cols();
    const bool fp8 = is_fp8(a.dtype);
    PlanKey key;
    key.m = m, key.n = n, key.k = k;
    key.a = a.dtype, key.b = b.dtype;
    key.sa = fp8 ? a.scaling : ScalingMode::PerTensor;
    key.sb = fp8 ? b.scaling : ScalingMode::PerTensor;
    key.transa = g.transa, key.transb = g.transb;
    const bool block = key.sa != ScalingMode::PerTensor || key.sb != ScalingMode::PerTensor;
    // Block scaling promotes every 128-deep partial sum to fp32 anyway: no fast mode there.
    key.fast_accum = fp8 && !block && !g.split_accumulator;
    key.align_a = alignment(a.data), key.align_b = alignment(b.data);

    Pointers ptrs;
    ptrs.a = a.data, ptrs.b = b.data, ptrs.a_scale = a_scale, ptrs.b_scale = b_scale;

    const bool bias = has_bias(g.epilogue), gelu = has_gelu(g.epilogue);
    const bool aux_out = gelu && g.gelu_input.data != nullptr;
    if (allow_direct && (!bias || g.bias.dtype == lt_bias_dtype(a.dtype, g.d.dtype)) &&
        (!aux_out || g.gelu_input.dtype == g.d.dtype) && !(block && gelu)) {
      PlanKey direct = key;
      direct.d = g.d.dtype;
      direct.epilogue = g.epilogue;
      direct.bias = bias ? g.bias.dtype : DType::F32;
      direct.aux_out = aux_out;
      direct.aux = aux_out ? g.gelu_input.dtype : DType::F32;
      direct.accumulate = g.accumulate;
      direct.align_d = alignment(g.d.data);
      Pointers p = ptrs;
      p.d = g.d.data;
      p.bias = bias ? g.bias.data : nullptr;
      p.aux = aux_out ? g.gelu_input.data : nullptr;
      Plan &plan_direct = plan(direct, p, !g.shape_varies, be, workspace, workspace_bytes, stream);
      if (plan_direct.supported) {
        matmul(direct, plan_direct, p, g.accumulate, workspace, workspace_bytes, stream);
        return true;
      }
    }

    Buffer product(&be, static_cast<size_t>(m * n) * sizeof(float));
    PlanKey split = key;
    split.d = DType::F32;
    split.split = true;
    split.align_d = alignment(product.get());
    Pointers p = ptrs;
    p.d = product.get();
    Plan &plan_split = plan(split, p, !g.shape_varies, be, workspace, workspace_bytes, stream);
    if (!plan_split.supported) return false;
    matmul(split, plan_split, p, false, workspace, workspace_bytes, stream);
    finish(g, product.floats(), stream);
    return true;
  }

  // The split route's epilogue: D = gelu?(product + old D + bias) in fp32.
  static void finish(const GemmArgs &g, const float *product, cudaStream_t stream) {
    EpilogueArgs e;
    e.product = product;
    e.m = g.d.rows(), e.n = g.d.cols();
    e.d = g.d.data, e.d_dtype = g.d.dtype;
    e.accumulate = g.accumulate;
    if (has_bias(g.epilogue)) e.bias = g.bias.data, e.bias_dtype = g.bias.dtype;
    if (has_gelu(g.epilogue) && g.gelu_input.data) e.gelu_input = g.gelu_input.data, e.gelu_input_dtype = g.gelu_input.dtype;
    e.gelu = has_gelu(g.epilogue);
    gemm_epilogue(e, stream);
  }

  void run_block_scaled(Backend &be, const GemmArgs &g, void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    const int64_t m = g.d.rows(), n = g.d.cols(), k = g.a.cols();  // FP8: transa = 0, transb = 1
    const bool native = block_modes && !force_fallback && g.a.scaling == ScalingMode::Block1x128 &&
                        (g.b.scaling == ScalingMode::Block1x128 || g.b.scaling == ScalingMode::Block128x128);
    if (native) {
      // Scales in cuBLASLt's layouts: 1x128 outer-dimension-major, 128x128 rows 16-byte aligned.
      const int64_t cb = ceil_div(k, 128);
      Buffer a_scales, b_scales;
      const float *a_scale = g.a.scale_inv, *b_scale = g.b.scale_inv;
      if (cb > 1) {
        a_scales = Buffer(&be, static_cast<size_t>(m * cb) * sizeof(float));
        transpose_scales(g.a.scale_inv, a_scales.floats(), m, cb, stream);
        a_scale = a_scales.floats();
      }
      if (g.b.scaling == ScalingMode::Block1x128) {
        if (cb > 1) {
          b_scales = Buffer(&be, static_cast<size_t>(n * cb) * sizeof(float));
          transpose_scales(g.b.scale_inv, b_scales.floats(), n, cb, stream);
          b_scale = b_scales.floats();
        }
      } else {
        const int64_t rb = ceil_div(n, 128), ld = ceil_div(cb, 4) * 4;
        if (ld != cb) {
          b_scales = Buffer(&be, static_cast<size_t>(rb * ld) * sizeof(float));
          pad_scales(g.b.scale_inv, b_scales.floats(), rb, cb, ld, stream);
          b_scale = b_scales.floats();
        }
      }
      if (execute(be, g, g.a, g.b, a_scale, b_scale, true, workspace, workspace_bytes, stream)) return;
    }
    // Fallback: exact per-block dequantization to fp32, then an fp32 GEMM (no TF32).
    Buffer a32(&be, static_cast<size_t>(m * k) * sizeof(float)), b32(&be, static_cast<size_t>(n * k) * sizeof(float));
    dequantize_to_f32(g.a, a32.floats(), stream);
    dequantize_to_f32(g.b, b32.floats(), stream);
    const TensorView a = make_view(a32.get(), DType::F32, g.a.device, m, k);
    const TensorView b = make_view(b32.get(), DType::F32, g.b.device, n, k);
    if (!execute(be, g, a, b, nullptr, nullptr, true, workspace, workspace_bytes, stream))
      fail(Status::Unsupported, "GEMM: cuBLASLt has no fp32 algorithm for the block-scaled fallback (m=%lld n=%lld k=%lld)",
           static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
  }
};

LtGemm::LtGemm(int device) : impl_(std::make_unique<Impl>()) {
  (void)device;  // the backend makes `device` current around every call, this one included
  impl_->api.check(impl_->api.create(&impl_->handle), "cublasLtCreate");
  impl_->block_modes = impl_->api.get_version() >= 120900;
  const char *mode = std::getenv("TE_CUDA_BLOCK_GEMM");
  impl_->force_fallback = mode != nullptr && std::strcmp(mode, "fallback") == 0;
  impl_->tune = env_switch("TE_GEMM_TUNE", true);
  impl_->tune_log = env_switch("TE_GEMM_TUNE_LOG", false);
  impl_->small = env_switch("TE_CUDA_SMALL_GEMM", true);
}

LtGemm::~LtGemm() = default;

namespace {

// What LtGemm runs at all (the CPU backend's rules are wider): throws Unsupported otherwise.
void check_supported(const GemmArgs &g) {
  const int64_t m = g.d.rows(), n = g.d.cols(), k = g.transa ? g.a.rows() : g.a.cols();
  if (!is_high_precision(g.d.dtype))
    fail(Status::Unsupported, "GEMM: output dtype %s not supported (F32, F16 or BF16)", dtype_name(g.d.dtype));
  if (is_fp8(g.a.dtype) || is_fp8(g.b.dtype)) {
    if (!is_fp8(g.a.dtype) || !is_fp8(g.b.dtype))
      fail(Status::Unsupported, "GEMM: FP8 operands must both be FP8, got A %s and B %s", dtype_name(g.a.dtype),
           dtype_name(g.b.dtype));
    if (g.transa || !g.transb)
      fail(Status::Unsupported, "GEMM: FP8 needs transa = 0 and transb = 1 (both operands K-major), got %d and %d",
           int(g.transa), int(g.transb));
    if (m % 16 || n % 16 || k % 16)
      fail(Status::Unsupported, "GEMM: FP8 needs m, n, k multiples of 16, got m=%lld n=%lld k=%lld",
           static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
    if (g.a.dtype == DType::E5M2 && g.b.dtype == DType::E5M2)
      fail(Status::Unsupported, "GEMM: E5M2 x E5M2 is not supported by FP8 tensor cores");
  } else if (g.a.dtype != g.b.dtype || !is_high_precision(g.a.dtype)) {
    fail(Status::Unsupported, "GEMM: operands must be both FP8 or of one high-precision dtype, got A %s and B %s",
         dtype_name(g.a.dtype), dtype_name(g.b.dtype));
  }
}

bool is_empty(const GemmArgs &g) { return g.d.rows() == 0 || g.d.cols() == 0; }

}  // namespace

// A (checked, non-empty) GEMM small_gemm takes: *s filled, true.
bool LtGemm::small(const GemmArgs &g, SmallGemmArgs *s) const {
  const int64_t m = g.d.rows(), n = g.d.cols(), k = g.transa ? g.a.rows() : g.a.cols();
  if (!impl_->small || k == 0 || static_cast<double>(m) * n * k > kSmallGemmMacs ||
      (g.epilogue != Epilogue::None && g.epilogue != Epilogue::Bias))
    return false;
  *s = SmallGemmArgs();
  s->a = g.a.data, s->b = g.b.data, s->a_dtype = g.a.dtype, s->b_dtype = g.b.dtype;
  s->transa = g.transa, s->transb = g.transb;
  s->m = m, s->n = n, s->k = k;
  if (is_fp8(g.a.dtype)) {
    s->a_scale = g.a.scale_inv, s->b_scale = g.b.scale_inv;
    s->a_mode = g.a.scaling, s->b_mode = g.b.scaling;
  }
  s->d = g.d.data, s->d_dtype = g.d.dtype, s->accumulate = g.accumulate;
  if (g.epilogue == Epilogue::Bias) s->bias = g.bias.data, s->bias_dtype = g.bias.dtype;
  return true;
}

void LtGemm::run_many(Backend &be, const GemmArgs *gs, int count, void *workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  for (int i = 0; i < count; ++i)
    if (!is_empty(gs[i])) check_supported(gs[i]);  // all checked before any runs
  SmallGemmArgs batch[kMaxSmallGemms];
  int n = 0;
  for (int i = 0; i < count; ++i) {
    if (is_empty(gs[i])) continue;
    if (!small(gs[i], &batch[n])) {
      run_checked(be, gs[i], workspace, workspace_bytes, stream);
      continue;
    }
    if (++n == kMaxSmallGemms) small_gemm(batch, n, stream), n = 0;
  }
  if (n) small_gemm(batch, n, stream);
}

void LtGemm::run(Backend &be, const GemmArgs &g, void *workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (is_empty(g)) return;
  check_supported(g);
  run_checked(be, g, workspace, workspace_bytes, stream);
}

void LtGemm::run_checked(Backend &be, const GemmArgs &g, void *workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  const int64_t m = g.d.rows(), n = g.d.cols();
  const int64_t k = g.transa ? g.a.rows() : g.a.cols();
  const bool fp8 = is_fp8(g.a.dtype);
  if (k == 0) {  // D = epilogue(0 (+ old D))
    Buffer zeros(&be, static_cast<size_t>(m * n) * sizeof(float));
    TE_CUDA_CHECK(cudaMemsetAsync(zeros.get(), 0, static_cast<size_t>(m * n) * sizeof(float), stream));
    Impl::finish(g, zeros.floats(), stream);
    return;
  }
  SmallGemmArgs s;
  if (small(g, &s)) {
    small_gemm(&s, 1, stream);
    return;
  }
  if (fp8 && (g.a.scaling != ScalingMode::PerTensor || g.b.scaling != ScalingMode::PerTensor)) {
    impl_->run_block_scaled(be, g, workspace, workspace_bytes, stream);
    return;
  }
  // cuBLASLt rejects (NOT_SUPPORTED at matmul time) scale pointers that are not 16-byte
  // aligned, such as two scales packed side by side: such a scale is copied to aligned scratch.
  const float *a_scale = fp8 ? g.a.scale_inv : nullptr, *b_scale = fp8 ? g.b.scale_inv : nullptr;
  Buffer aligned_scales;
  auto misaligned = [](const float *p) { return p && reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  if (misaligned(a_scale) || misaligned(b_scale)) {
    aligned_scales = Buffer(&be, 32);
    float *slots = aligned_scales.floats();  // [0]: A's scale, [4]: B's (16 bytes apart)
    if (misaligned(a_scale)) {
      be.copy(slots, a_scale, sizeof(float));
      a_scale = slots;
    }
    if (misaligned(b_scale)) {
      be.copy(slots + 4, b_scale, sizeof(float));
      b_scale = slots + 4;
    }
  }
  if (!impl_->execute(be, g, g.a, g.b, a_scale, b_scale, true, workspace, workspace_bytes, stream))
    fail(Status::Unsupported, "GEMM: cuBLASLt has no algorithm for A %s x B %s -> D %s (m=%lld n=%lld k=%lld)",
         dtype_name(g.a.dtype), dtype_name(g.b.dtype), dtype_name(g.d.dtype), static_cast<long long>(m),
         static_cast<long long>(n), static_cast<long long>(k));
}

}  // namespace te::cuda
