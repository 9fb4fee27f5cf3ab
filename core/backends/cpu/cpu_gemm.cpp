// GEMM on the CPU: operands become fp32 matrices (FP8 codes decoded exactly, block-scaled
// operands dequantized per block), OpenBLAS sgemm accumulates in fp32, and the epilogue runs
// in float before the single rounding into D's dtype.
#include <cblas.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "backends/cpu/cpu_activation_math.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_convert.h"

// OpenBLAS's own (the prototype is also in its cblas.h, but not in every other cblas.h).
extern "C" void openblas_set_num_threads(int num_threads);

namespace te {

namespace {

// OpenBLAS's thread count. Its default is one thread per core, and its idle threads spin for a
// while after each call. libte's CPU GEMMs are small (the CPU backend is the reference: tests,
// examples, a CPU fallback), and in a Python program NumPy's own OpenBLAS pool runs beside
// libte's: two pools of spinning threads on the same cores. Measured on 2 cores, libte's
// OpenBLAS at its default vs one thread (NumPy's at its default): examples/python/train_mlp.py
// 13-37 s vs 5.2 s on a quiet machine, 36-38 s vs 20-24 s beside other builds;
// examples/c/train_mlp.c 3.4 s either way when quiet, 5.2-7.8 s vs 3.8-5.1 s beside other
// builds; even a 1024^3 sgemm took 31 ms with 2 threads vs 21-25 ms with one there. So the
// process's first CPU GEMM sets OpenBLAS to one thread, unless the user chose otherwise:
//   TE_CPU_THREADS=N   N threads (N >= 1); TE_CPU_THREADS=0 leaves OpenBLAS as it is;
//   OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS set (and no TE_CPU_THREADS):
//                      OpenBLAS already read them at load time; libte leaves them in force.
// openblas_set_num_threads is process-global: it also changes the thread count of the program's
// own calls into this OpenBLAS (not NumPy's, which bundles its own copy). That is why it happens
// once (a program that sets its own count after libte's first GEMM keeps it) and why the
// environment wins.
void init_blas_threads() {
  static std::once_flag once;
  std::call_once(once, [] {
    int threads = 1;
    const char *te = std::getenv("TE_CPU_THREADS");
    if (te != nullptr && *te != '\0') {
      char *end = nullptr;
      errno = 0;
      const long n = std::strtol(te, &end, 10);
      if (errno != 0 || *end != '\0' || n < 0 || n > 4096) return;  // not a count: leave OpenBLAS alone
      threads = static_cast<int>(n);
    } else {
      for (const char *var : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"}) {
        const char *v = std::getenv(var);
        if (v != nullptr && *v != '\0') return;
      }
    }
    if (threads > 0) openblas_set_num_threads(threads);
  });
}

// One GEMM operand as a row-major fp32 matrix in its stored layout. F32 operands are used in
// place; everything else is converted into a scratch buffer from the backend's cache.
struct FloatOperand {
  Buffer storage;
  const float *data = nullptr;
};

}  // namespace

namespace {

FloatOperand to_float_operand(CpuBackend *be, const TensorView &t, float *alpha) {
  FloatOperand op;
  if (t.dtype == DType::F32) {
    op.data = static_cast<const float *>(t.data);
    return op;
  }
  const int64_t n = t.numel();
  op.storage = Buffer(be, static_cast<size_t>(n) * sizeof(float));
  op.data = op.storage.floats();
  if (is_fp8(t.dtype) && t.scaling != ScalingMode::PerTensor) {
    // Block scales differ along K, so they cannot factor out of the sum: dequantize first.
    be->dequantize(t, make_view(op.storage.get(), DType::F32, t.device, t.rows(), t.cols()));
    return op;
  }
  // Raw codes decode exactly; a per-tensor scale_inv factors out of the sum into alpha.
  cpu::load_floats(t.data, t.dtype, 0, n, op.storage.floats());
  if (is_fp8(t.dtype)) *alpha *= t.scale_inv[0];
  return op;
}

bool has_bias(const GemmArgs &g) { return g.epilogue == Epilogue::Bias || g.epilogue == Epilogue::BiasGelu; }
// The product lands in D itself when D is F32 and nothing older must be read back from it.
bool product_in_d(const GemmArgs &g) { return g.d.dtype == DType::F32 && !g.accumulate; }

}  // namespace

// Exactly the blocks gemm() takes, in the order it takes them.
void CpuBackend::plan_gemm(const GemmArgs &g, ScratchPlan *plan) const {
  const int64_t m = g.d.rows(), n = g.d.cols();
  if (m == 0 || n == 0) return;
  for (const TensorView *t : {&g.a, &g.b}) {
    if (t->dtype == DType::F32) continue;
    plan->add(static_cast<size_t>(t->numel()) * sizeof(float));
    if (is_fp8(t->dtype) && t->scaling != ScalingMode::PerTensor) plan_dequantize(*t, plan);
  }
  if (!product_in_d(g)) plan->add(static_cast<size_t>(m * n) * sizeof(float));
  if (has_bias(g)) plan->add(static_cast<size_t>(n) * sizeof(float));
  if (g.accumulate) plan->add(static_cast<size_t>(n) * sizeof(float));
}

void CpuBackend::gemm(const GemmArgs &g) {
  const int64_t m = g.d.rows(), n = g.d.cols();
  const int64_t k = g.transa ? g.a.rows() : g.a.cols();
  if (m == 0 || n == 0) return;

  float alpha = 1.0f;
  const FloatOperand a = to_float_operand(this, g.a, &alpha);
  const FloatOperand b = to_float_operand(this, g.b, &alpha);

  const bool in_d = product_in_d(g);
  Buffer product_storage;
  if (!in_d) product_storage = Buffer(this, static_cast<size_t>(m * n) * sizeof(float));
  float *c = in_d ? static_cast<float *>(g.d.data) : product_storage.floats();
  // Every block before D is first written: a failed allocation leaves D as it was.
  const bool bias_epilogue = has_bias(g);
  Buffer bias_storage, old_d_storage;
  if (bias_epilogue) bias_storage = Buffer(this, static_cast<size_t>(n) * sizeof(float));
  if (g.accumulate) old_d_storage = Buffer(this, static_cast<size_t>(n) * sizeof(float));

  if (k == 0) {
    std::fill(c, c + m * n, 0.0f);
  } else {
    init_blas_threads();
    cblas_sgemm(CblasRowMajor, g.transa ? CblasTrans : CblasNoTrans,
                g.transb ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a.data, static_cast<int>(g.a.cols()), b.data,
                static_cast<int>(g.b.cols()), 0.0f, c, static_cast<int>(n));
  }

  const bool has_gelu = g.epilogue == Epilogue::Gelu || g.epilogue == Epilogue::BiasGelu;
  const bool store_gelu_input = has_gelu && g.gelu_input.data != nullptr;
  if (!bias_epilogue && !has_gelu && !g.accumulate && in_d) return;

  if (bias_epilogue) cpu::load_floats(g.bias.data, g.bias.dtype, 0, n, bias_storage.floats());
  const float *bias = bias_storage.floats();
  float *old_d = old_d_storage.floats();

  // cuBLASLt's order, so both backends agree: D = gelu(alpha*AB [+ D_old] [+ bias]).
  for (int64_t i = 0; i < m; ++i) {
    float *row = c + i * n;
    if (g.accumulate) {
      cpu::load_floats(g.d.data, g.d.dtype, i * n, n, old_d);
      for (int64_t j = 0; j < n; ++j) row[j] += old_d[j];
    }
    if (bias_epilogue) {
      for (int64_t j = 0; j < n; ++j) row[j] += bias[j];
    }
    if (store_gelu_input) cpu::store_floats(row, n, g.gelu_input.data, g.gelu_input.dtype, i * n);
    if (has_gelu) {
      for (int64_t j = 0; j < n; ++j) row[j] = cpu::gelu(row[j]);
    }
    if (!in_d) cpu::store_floats(row, n, g.d.data, g.d.dtype, i * n);
  }
}

}  // namespace te
