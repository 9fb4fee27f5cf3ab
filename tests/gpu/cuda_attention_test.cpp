// Attention (forward + backward) and RoPE on the CUDA backend's own kernels (TE_ATTENTION_IMPL=
// kernel, so cuDNN never runs here) against the CPU reference, through the Backend interface.
//
// Tolerances (numerics/attention.h: both compute the same fp32 formulas in a different order):
//  - LSE (fp32): 1e-5 relative + 1e-5 absolute; the dots' order changes S by a few fp32 ulps.
//  - O, dQ, dK, dV in BF16 / F16: the fp32 results differ by rounding only, so the stored values
//    differ by at most an ulp or two of the output dtype; the bound is 4 ulps of the tensor's max
//    |value| (sums over many terms cancel, so an element's error follows the terms' size, not its
//    own). F32 outputs: 2e-5 of the max |value|.
//  - FP8: P (and dS) are rounded to E4M3 (E5M2); an fp32 difference of one ulp can move a value
//    lying at a rounding tie by one FP8 step (2^-3 of it for E4M3, 2^-2 for E5M2), so the bound
//    is 1/16 of the tensor's max |value| (one element of one row moving a step) on top of the
//    above; in practice almost every element agrees to the BF16 ulp.
// Backward inputs (O, LSE) are the CPU forward's on both backends, so that the backward is
// compared on its own. Two GPU backward runs are bitwise identical (no float atomics).
// RoPE: bit for bit (numerics/attention.h fixes every operation).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
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

TensorView view3(void *data, DType t, Device dev, int64_t a, int64_t b, int64_t c) {
  TensorView v = make_view(data, t, dev, a * b, c);
  v.ndim = 3;
  v.shape[0] = a, v.shape[1] = b, v.shape[2] = c;
  return v;
}

std::vector<uint8_t> to_bytes(const std::vector<float> &v, DType t) {
  std::vector<uint8_t> b(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) store_from_float(b.data(), t, static_cast<int64_t>(i), v[i]);
  return b;
}
std::vector<float> from_bytes(const std::vector<uint8_t> &b, DType t) {
  std::vector<float> v(b.size() / dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_float(b.data(), t, static_cast<int64_t>(i));
  return v;
}
template <class T>
std::vector<uint8_t> raw(const std::vector<T> &v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

struct Twin {
  Twin(Backend &cpu, Backend &gpu, const std::vector<uint8_t> &host) : c(cpu, host), g(gpu, host) {}
  Twin(Backend &cpu, Backend &gpu, size_t bytes) : c(cpu, bytes), g(gpu, bytes) {}
  void *on(int b) const { return b == 0 ? c.get() : g.get(); }
  float *floats(int b) const { return static_cast<float *>(on(b)); }
  DeviceBuffer c, g;
};

// ---- one problem's dims, offsets and FP8 scales ---------------------------------------------------
struct HostProblem {
  AttentionDims d;
  std::vector<int32_t> cu_q, cu_kv;
  bool fp8 = false;
  float qsi = 1, ksi = 1, vsi = 1, s_scale = 1, s_scale_inv = 1, dosi = 1, dp_scale = 1, dp_scale_inv = 1;
  DType do8t = DType::E4M3;
};

// ---- the comparison ---------------------------------------------------------------------------
struct Case {
  DType dt = DType::BF16;  // q/k/v (high precision) and o
  bool fp8 = false;
  DType do8t = DType::E4M3;
  int64_t heads = 8, kv_heads = 2, D = 64;
  AttnMask mask = AttnMask::Causal;
  std::vector<int32_t> lens_q, lens_kv;  // varlen when non-empty
  int64_t batch = 2, seq_q = 37, seq_kv = 37;
  bool backward = true;
};

std::string describe(const Case &c) {
  std::string s = std::string(c.fp8 ? "fp8(" : "") + dtype_name(c.dt) + (c.fp8 ? std::string(",dO ") + dtype_name(c.do8t) + ")" : "") +
                  " h" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " d" + std::to_string(c.D) + " mask" +
                  std::to_string(static_cast<int>(c.mask));
  if (c.lens_q.empty()) {
    s += " b" + std::to_string(c.batch) + " sq" + std::to_string(c.seq_q) + " skv" + std::to_string(c.seq_kv);
  } else {
    s += " varlen q{";
    for (auto l : c.lens_q) s += std::to_string(l) + ",";
    s += "} kv{";
    for (auto l : c.lens_kv) s += std::to_string(l) + ",";
    s += "}";
  }
  return s;
}

float ulp_rel(DType t) { return t == DType::BF16 ? 0x1p-8f : t == DType::F16 ? 0x1p-11f : 1e-5f; }

// max |a - b| <= tol_rel * max |a| (+ a tiny absolute floor).
void expect_close(const std::vector<float> &a, const std::vector<float> &b, float tol_rel, const std::string &what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  float mx = 0;
  for (float x : a) mx = std::max(mx, std::fabs(x));
  const float tol = tol_rel * mx + 1e-6f;
  size_t bad = 0, first = 0;
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float e = std::fabs(a[i] - b[i]);
    if (!(e <= tol)) {
      if (bad++ == 0) first = i;
    }
    if (e > worst || std::isnan(e)) worst = e;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() << " beyond " << tol << " (max|ref| " << mx
                     << "), worst " << worst << ", first at " << first << ": ref " << a[first] << " gpu " << b[first];
}

void expect_lse_close(const std::vector<float> &a, const std::vector<float> &b, const std::string &what) {
  ASSERT_EQ(a.size(), b.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ok = (std::isinf(a[i]) && a[i] == b[i]) || std::fabs(a[i] - b[i]) <= 1e-5f + 1e-5f * std::fabs(a[i]);
    if (!ok && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << " LSE: first at " << first << ": ref " << a[first] << " gpu " << b[first];
}

// Quantizes values to FP8 codes with `scale`; returns the codes' values (unscaled).
std::vector<float> quantize(const std::vector<float> &x, float scale, DType t, std::vector<uint8_t> *codes) {
  codes->resize(x.size());
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    (*codes)[i] = float_to_fp8(x[i] * scale, t);
    out[i] = fp8_to_float((*codes)[i], t);
  }
  return out;
}

void run_case(Backend &cpu, Backend &gpu, const Case &c, uint32_t seed) {
  const std::string what = describe(c);
  SCOPED_TRACE(what);
  HostProblem P;
  AttentionDims &d = P.d;
  d.heads = c.heads, d.kv_heads = c.kv_heads, d.head_dim = c.D, d.mask = c.mask;
  d.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  if (c.lens_q.empty()) {
    d.batch = c.batch, d.max_seq_q = c.seq_q, d.max_seq_kv = c.seq_kv;
    d.tokens_q = c.batch * c.seq_q, d.tokens_kv = c.batch * c.seq_kv;
  } else {
    d.batch = static_cast<int64_t>(c.lens_q.size());
    P.cu_q.assign(1, 0), P.cu_kv.assign(1, 0);
    for (size_t b = 0; b < c.lens_q.size(); ++b) {
      P.cu_q.push_back(P.cu_q.back() + c.lens_q[b]);
      P.cu_kv.push_back(P.cu_kv.back() + c.lens_kv[b]);
      d.max_seq_q = std::max<int64_t>(d.max_seq_q, c.lens_q[b]);
      d.max_seq_kv = std::max<int64_t>(d.max_seq_kv, c.lens_kv[b]);
    }
    d.max_seq_q += 3;  // a bound, not the exact maximum
    d.tokens_q = P.cu_q.back(), d.tokens_kv = P.cu_kv.back();
  }
  const int64_t D = c.D, nq = d.tokens_q * c.heads * D, nkv = d.tokens_kv * c.kv_heads * D;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto gen = [&](int64_t n, float sd) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto &e : x) e = sd * normal(rng);
    return x;
  };
  // Values exactly representable in the dtype; q a bit larger so that softmax is not flat.
  std::vector<float> q = gen(nq, 1.5f), k = gen(nkv, 1.0f), v = gen(nkv, 1.0f), dO = gen(nq, 1.0f);
  const DType od = c.dt;
  for (auto *x : {&q, &k, &v, &dO}) *x = from_bytes(to_bytes(*x, od), od);
  std::vector<uint8_t> qb, kb, vb, dob8;
  if (c.fp8) {
    P.fp8 = true;
    P.qsi = 1.0f / 64, P.ksi = 1.0f / 128, P.vsi = 1.0f / 100;
    P.s_scale = 256.0f, P.s_scale_inv = 1.0f / 256;
    P.dosi = 1.0f / 64;
    P.dp_scale = c.do8t == DType::E4M3 ? 2048.0f : 8192.0f, P.dp_scale_inv = 1.0f / P.dp_scale;
    P.do8t = c.do8t;
    quantize(q, 64.0f, DType::E4M3, &qb);
    quantize(k, 128.0f, DType::E4M3, &kb);
    quantize(v, 100.0f, DType::E4M3, &vb);
  } else {
    qb = to_bytes(q, od), kb = to_bytes(k, od), vb = to_bytes(v, od);
  }
  if (c.fp8) quantize(dO, 64.0f, c.do8t, &dob8);
  const DType in_t = c.fp8 ? DType::E4M3 : od;
  const size_t es = dtype_size(od);
  Twin tq(cpu, gpu, qb), tk(cpu, gpu, kb), tv(cpu, gpu, vb);
  Twin to(cpu, gpu, static_cast<size_t>(nq) * es), tlse(cpu, gpu, static_cast<size_t>(d.tokens_q * c.heads) * 4);
  Twin cuq(cpu, gpu, raw(P.cu_q.empty() ? std::vector<int32_t>{0} : P.cu_q)),
      cukv(cpu, gpu, raw(P.cu_kv.empty() ? std::vector<int32_t>{0} : P.cu_kv));
  auto sc = [&](float x) { return raw(std::vector<float>{x}); };
  Twin qsi(cpu, gpu, sc(P.qsi)), ksi(cpu, gpu, sc(P.ksi)), vsi(cpu, gpu, sc(P.vsi)), ss(cpu, gpu, sc(P.s_scale)),
      ssi(cpu, gpu, sc(P.s_scale_inv)), samax(cpu, gpu, sc(0.0f)), dosi(cpu, gpu, sc(P.dosi)),
      dps(cpu, gpu, sc(P.dp_scale)), dpsi(cpu, gpu, sc(P.dp_scale_inv)), dpamax(cpu, gpu, sc(0.0f));
  auto dims_on = [&](int b) {
    AttentionDims x = d;
    if (!P.cu_q.empty()) {
      x.cu_seqlens_q = static_cast<const int32_t *>(cuq.on(b));
      x.cu_seqlens_kv = static_cast<const int32_t *>(cukv.on(b));
    }
    return x;
  };
  auto qkv = [&](int b, const Twin &t, int64_t tokens, int64_t h, const Twin &si) {
    TensorView x = view3(t.on(b), in_t, b == 0 ? kCpu : kGpu, tokens, h, D);
    if (c.fp8) x.scale_inv = si.floats(b);
    return x;
  };
  for (int b = 0; b < 2; ++b) {
    AttentionForwardArgs a;
    a.dims = dims_on(b);
    a.q = qkv(b, tq, d.tokens_q, c.heads, qsi);
    a.k = qkv(b, tk, d.tokens_kv, c.kv_heads, ksi);
    a.v = qkv(b, tv, d.tokens_kv, c.kv_heads, vsi);
    a.o = view3(to.on(b), od, b == 0 ? kCpu : kGpu, d.tokens_q, c.heads, D);
    a.lse = tlse.floats(b);
    if (c.fp8) a.s_scale = ss.floats(b), a.s_scale_inv = ssi.floats(b), a.s_amax = samax.floats(b);
    (b == 0 ? cpu : gpu).attention_forward(a);
  }
  gpu.synchronize();
  const std::vector<float> o_ref = from_bytes(to.c.read<uint8_t>(), od), lse_ref = tlse.c.read<float>();
  const std::vector<float> o_gpu = from_bytes(to.g.read<uint8_t>(), od);
  const float tol_o = 4 * ulp_rel(od) + (c.fp8 ? 1.0f / 16 : 0.0f);
  expect_close(o_ref, o_gpu, tol_o, what + " O");
  expect_lse_close(lse_ref, tlse.g.read<float>(), what);
  if (c.fp8) {
    const float a = samax.c.read<float>()[0], g = samax.g.read<float>()[0];
    EXPECT_NEAR(a, g, 1e-6f) << what << " s_amax";
    EXPECT_GT(g, 0.0f) << what << " s_amax";
  }
  if (!c.backward) return;

  // Backward, from the reference's O and LSE on both sides.
  gpu.copy_from_host(to.g.get(), to_bytes(o_ref, od).data(), static_cast<size_t>(nq) * es);
  gpu.copy_from_host(tlse.g.get(), lse_ref.data(), lse_ref.size() * 4);
  Twin tdo(cpu, gpu, to_bytes(dO, od)), tdo8(cpu, gpu, c.fp8 ? dob8 : std::vector<uint8_t>(1));
  Twin tdq(cpu, gpu, static_cast<size_t>(nq) * es), tdk(cpu, gpu, static_cast<size_t>(nkv) * es),
      tdv(cpu, gpu, static_cast<size_t>(nkv) * es);
  std::vector<std::vector<uint8_t>> first;
  for (int run = 0; run < 3; ++run) {  // CPU, GPU, GPU again
    const int b = run == 0 ? 0 : 1;
    AttentionBackwardArgs a;
    a.dims = dims_on(b);
    const Device dev = b == 0 ? kCpu : kGpu;
    a.q = qkv(b, tq, d.tokens_q, c.heads, qsi);
    a.k = qkv(b, tk, d.tokens_kv, c.kv_heads, ksi);
    a.v = qkv(b, tv, d.tokens_kv, c.kv_heads, vsi);
    a.o = view3(to.on(b), od, dev, d.tokens_q, c.heads, D);
    a.d_o = view3(tdo.on(b), od, dev, d.tokens_q, c.heads, D);
    a.lse = tlse.floats(b);
    if (c.fp8) {
      a.d_o8 = view3(tdo8.on(b), c.do8t, dev, d.tokens_q, c.heads, D);
      a.d_o8.scale_inv = dosi.floats(b);
      a.s_scale = ss.floats(b), a.s_scale_inv = ssi.floats(b);
      a.dp_scale = dps.floats(b), a.dp_scale_inv = dpsi.floats(b), a.dp_amax = dpamax.floats(b);
    }
    a.dq = view3(tdq.on(b), od, dev, d.tokens_q, c.heads, D);
    a.dk = view3(tdk.on(b), od, dev, d.tokens_kv, c.kv_heads, D);
    a.dv = view3(tdv.on(b), od, dev, d.tokens_kv, c.kv_heads, D);
    (b == 0 ? cpu : gpu).attention_backward(a);
    if (run == 1) {
      gpu.synchronize();
      first = {tdq.g.read<uint8_t>(), tdk.g.read<uint8_t>(), tdv.g.read<uint8_t>()};
    }
  }
  gpu.synchronize();
  const std::vector<float> dq_ref = from_bytes(tdq.c.read<uint8_t>(), od), dk_ref = from_bytes(tdk.c.read<uint8_t>(), od),
                           dv_ref = from_bytes(tdv.c.read<uint8_t>(), od);
  const float amax_ref = dpamax.c.read<float>()[0];
  const float tol_g = 4 * ulp_rel(od) + (c.fp8 ? 1.0f / 16 : 0.0f);
  expect_close(dq_ref, from_bytes(tdq.g.read<uint8_t>(), od), tol_g, what + " dQ");
  expect_close(dk_ref, from_bytes(tdk.g.read<uint8_t>(), od), tol_g, what + " dK");
  expect_close(dv_ref, from_bytes(tdv.g.read<uint8_t>(), od), tol_g, what + " dV");
  EXPECT_TRUE(first[0] == tdq.g.read<uint8_t>() && first[1] == tdk.g.read<uint8_t>() && first[2] == tdv.g.read<uint8_t>())
      << what << ": two GPU backward runs differ";
  if (c.fp8) {
    const float g = dpamax.g.read<float>()[0];
    EXPECT_NEAR(amax_ref, g, 1e-4f * amax_ref) << what << " dp_amax";
    // dp_amax_only: the same amax, no gradient written.
    Twin amax2(cpu, gpu, sc(0.0f));
    Twin guard(cpu, gpu, to_bytes(std::vector<float>(static_cast<size_t>(nq), 7.0f), od));
    AttentionBackwardArgs a;
    a.dims = dims_on(1);
    a.q = qkv(1, tq, d.tokens_q, c.heads, qsi);
    a.k = qkv(1, tk, d.tokens_kv, c.kv_heads, ksi);
    a.v = qkv(1, tv, d.tokens_kv, c.kv_heads, vsi);
    a.o = view3(to.g.get(), od, kGpu, d.tokens_q, c.heads, D);
    a.d_o = view3(tdo.g.get(), od, kGpu, d.tokens_q, c.heads, D);
    a.lse = tlse.floats(1);
    a.d_o8 = view3(tdo8.g.get(), c.do8t, kGpu, d.tokens_q, c.heads, D);
    a.d_o8.scale_inv = dosi.floats(1);
    a.s_scale = ss.floats(1), a.s_scale_inv = ssi.floats(1);
    a.dp_amax = amax2.floats(1);
    a.dp_amax_only = true;
    a.dq = view3(guard.g.get(), od, kGpu, d.tokens_q, c.heads, D);
    gpu.attention_backward(a);
    gpu.synchronize();
    EXPECT_EQ(amax2.g.read<float>()[0], g) << what << " dp_amax_only";
    EXPECT_TRUE(guard.g.read<uint8_t>() == to_bytes(std::vector<float>(static_cast<size_t>(nq), 7.0f), od))
        << what << " dp_amax_only wrote a gradient";
  }
}

class CudaAttention : public GpuTest {
 protected:
  void SetUp() override {
    setenv("TE_ATTENTION_IMPL", "kernel", 1);
    GpuTest::SetUp();
  }
};

const AttnMask kMasks[] = {AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight};

TEST_F(CudaAttention, FixedLengthAgainstCpu) {
  uint32_t seed = 1;
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    for (int64_t D : {64, 128, 40}) {
      for (AttnMask m : kMasks) {
        Case c;
        c.dt = dt, c.D = D, c.mask = m;
        c.batch = 2, c.seq_q = 37, c.seq_kv = 37;
        run_case(*cpu, *gpu, c, seed++);
        c.seq_q = 21, c.seq_kv = 50;  // sq < skv: bottom-right differs from top-left
        run_case(*cpu, *gpu, c, seed++);
        c.seq_q = 45, c.seq_kv = 19;  // sq > skv: bottom-right rows with no key
        run_case(*cpu, *gpu, c, seed++);
      }
    }
  }
}

TEST_F(CudaAttention, VariableLengthAgainstCpu) {
  uint32_t seed = 100;
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    for (int64_t D : {64, 128, 72}) {
      for (AttnMask m : kMasks) {
        Case c;
        c.dt = dt, c.D = D, c.mask = m;
        c.lens_q = {1, 17, 0, 33, 64};
        c.lens_kv = {1, 17, 0, 33, 64};
        run_case(*cpu, *gpu, c, seed++);
        c.lens_kv = {5, 3, 9, 70, 0};
        run_case(*cpu, *gpu, c, seed++);
      }
    }
  }
}

TEST_F(CudaAttention, HeadShapesAgainstCpu) {
  uint32_t seed = 200;
  for (int64_t D : {8, 256}) {
    Case c;
    c.D = D, c.mask = AttnMask::Causal, c.seq_q = c.seq_kv = 33;
    run_case(*cpu, *gpu, c, seed++);
  }
  for (auto hk : {std::pair<int64_t, int64_t>{4, 4}, {6, 1}}) {  // MHA and MQA
    Case c;
    c.heads = hk.first, c.kv_heads = hk.second, c.D = 128;
    run_case(*cpu, *gpu, c, seed++);
  }
}

// Longer sequences (several tiles of the tensor-core paths, which cover BF16 / F16 at d 64 / 128).
TEST_F(CudaAttention, LongerSequencesAgainstCpu) {
  uint32_t seed = 300;
  for (DType dt : {DType::BF16, DType::F16}) {
    for (int64_t D : {64, 128}) {
      for (AttnMask m : kMasks) {
        Case c;
        c.dt = dt, c.D = D, c.mask = m, c.heads = 4, c.kv_heads = 2, c.batch = 2, c.seq_q = 300, c.seq_kv = 300;
        run_case(*cpu, *gpu, c, seed++);
        c.seq_q = 130, c.seq_kv = 257;
        c.batch = 1;
        run_case(*cpu, *gpu, c, seed++);
      }
    }
    Case c;
    c.dt = dt, c.D = 128, c.mask = AttnMask::Causal, c.heads = 4, c.kv_heads = 1;
    c.lens_q = {200, 1, 0, 129, 64};
    c.lens_kv = c.lens_q;
    run_case(*cpu, *gpu, c, seed++);
  }
}

TEST_F(CudaAttention, Fp8AgainstCpu) {
  uint32_t seed = 400;
  for (DType do8t : {DType::E4M3, DType::E5M2}) {
    for (int64_t D : {64, 128}) {
      for (AttnMask m : kMasks) {
        Case c;
        c.fp8 = true, c.dt = DType::BF16, c.do8t = do8t, c.D = D, c.mask = m;
        c.seq_q = 37, c.seq_kv = 70;
        run_case(*cpu, *gpu, c, seed++);
        c.lens_q = {1, 17, 0, 33, 64};
        c.lens_kv = {1, 17, 0, 33, 64};
        run_case(*cpu, *gpu, c, seed++);
      }
    }
  }
}

// The tensor-core FP8 backward (head_dim 64 / 128) over several key and query tiles: GQA 4,
// causal masks, F16 and BF16 gradients, fixed and variable lengths.
TEST_F(CudaAttention, Fp8LongerAgainstCpu) {
  uint32_t seed = 500;
  for (DType do8t : {DType::E4M3, DType::E5M2}) {
    for (int64_t D : {128, 64}) {
      for (AttnMask m : {AttnMask::Causal, AttnMask::CausalBottomRight, AttnMask::None}) {
        Case c;
        c.fp8 = true, c.dt = D == 64 ? DType::F16 : DType::BF16, c.do8t = do8t, c.D = D, c.mask = m;
        c.heads = 8, c.kv_heads = 2, c.batch = 2, c.seq_q = 203, c.seq_kv = 261;
        run_case(*cpu, *gpu, c, seed++);
        if (m == AttnMask::None) continue;
        c.lens_q = {150, 7, 260};
        c.lens_kv = {150, 140, 260};
        run_case(*cpu, *gpu, c, seed++);
      }
    }
  }
}


// Offsets out of range (negative, decreasing, past the tokens, longer than max_seq): the kernels
// clamp them, so the call computes something and never reads or writes out of bounds (run under
// compute-sanitizer to see the accesses; here: no error, and the outputs outside the tensors'
// padding are untouched).
TEST_F(CudaAttention, BadOffsetsAreClamped) {
  for (DType dt : {DType::BF16, DType::F32}) {
    for (int64_t D : {64, 128}) {
      const int64_t tq = 40, tkv = 24, H = 4, KV = 2;
      const std::vector<int32_t> cuq = {0, 30, -7, 500, 12}, cukv = {3, -100, 24, 1000000, 2};
      DeviceBuffer q(*gpu, to_bytes(std::vector<float>(tq * H * D, 0.5f), dt)),
          k(*gpu, to_bytes(std::vector<float>(tkv * KV * D, 0.25f), dt)), v(*gpu, to_bytes(std::vector<float>(tkv * KV * D, 1.0f), dt)),
          o(*gpu, tq * H * D * dtype_size(dt)), lse(*gpu, tq * H * 4), dO(*gpu, to_bytes(std::vector<float>(tq * H * D, 1.0f), dt)),
          dq(*gpu, tq * H * D * dtype_size(dt)), dk(*gpu, tkv * KV * D * dtype_size(dt)), dv(*gpu, tkv * KV * D * dtype_size(dt)),
          cq(*gpu, raw(cuq)), ck(*gpu, raw(cukv));
      for (AttnMask m : kMasks) {
        AttentionDims d;
        d.batch = 4, d.heads = H, d.kv_heads = KV, d.head_dim = D, d.tokens_q = tq, d.tokens_kv = tkv;
        d.max_seq_q = 16, d.max_seq_kv = 16, d.mask = m, d.softmax_scale = 0.125f;
        d.cu_seqlens_q = static_cast<const int32_t *>(cq.get());
        d.cu_seqlens_kv = static_cast<const int32_t *>(ck.get());
        AttentionForwardArgs f;
        f.dims = d;
        f.q = view3(q.get(), dt, kGpu, tq, H, D);
        f.k = view3(k.get(), dt, kGpu, tkv, KV, D);
        f.v = view3(v.get(), dt, kGpu, tkv, KV, D);
        f.o = view3(o.get(), dt, kGpu, tq, H, D);
        f.lse = lse.floats();
        EXPECT_NO_THROW(gpu->attention_forward(f));
        AttentionBackwardArgs b;
        b.dims = d, b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.lse = f.lse;
        b.d_o = view3(dO.get(), dt, kGpu, tq, H, D);
        b.dq = view3(dq.get(), dt, kGpu, tq, H, D);
        b.dk = view3(dk.get(), dt, kGpu, tkv, KV, D);
        b.dv = view3(dv.get(), dt, kGpu, tkv, KV, D);
        EXPECT_NO_THROW(gpu->attention_backward(b));
        EXPECT_NO_THROW(gpu->synchronize());
        // Every row of O is either a sequence's output (values in [0, 1] for v = 1: exactly 1 or 0)
        // or zero.
        for (float x : from_bytes(o.read<uint8_t>(), dt)) EXPECT_TRUE(x == 0.0f || std::fabs(x - 1.0f) < 1e-2f) << x;
      }
    }
  }
}

// Speed of the benchmark shape (run with --gtest_also_run_disabled_tests): causal, batch 4,
// 32 heads, 8 kv heads, head_dim 128, BF16; TE_ATTN_BENCH_SEQ picks the length (4096).
TEST_F(CudaAttention, DISABLED_Benchmark) {
  const char *e = std::getenv("TE_ATTN_BENCH_SEQ");
  const int64_t S = e ? std::atoll(e) : 4096, B = 4, H = 32, KV = 8, D = 128;
  AttentionDims d;
  d.batch = B, d.heads = H, d.kv_heads = KV, d.head_dim = D, d.tokens_q = d.tokens_kv = B * S;
  d.max_seq_q = d.max_seq_kv = S, d.mask = AttnMask::Causal, d.softmax_scale = 1.0f / std::sqrt(128.0f);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto gen = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto &v : x) v = normal(rng);
    return to_bytes(x, DType::BF16);
  };
  const int64_t nq = B * S * H * D, nkv = B * S * KV * D;
  DeviceBuffer q(*gpu, gen(nq)), k(*gpu, gen(nkv)), v(*gpu, gen(nkv)), o(*gpu, nq * 2), lse(*gpu, B * S * H * 4),
      dO(*gpu, gen(nq)), dq(*gpu, nq * 2), dk(*gpu, nkv * 2), dv(*gpu, nkv * 2);
  AttentionForwardArgs f;
  f.dims = d;
  f.q = view3(q.get(), DType::BF16, kGpu, B * S, H, D);
  f.k = view3(k.get(), DType::BF16, kGpu, B * S, KV, D);
  f.v = view3(v.get(), DType::BF16, kGpu, B * S, KV, D);
  f.o = view3(o.get(), DType::BF16, kGpu, B * S, H, D);
  f.lse = lse.floats();
  AttentionBackwardArgs bw;
  bw.dims = d, bw.q = f.q, bw.k = f.k, bw.v = f.v, bw.o = f.o, bw.lse = f.lse;
  bw.d_o = view3(dO.get(), DType::BF16, kGpu, B * S, H, D);
  bw.dq = view3(dq.get(), DType::BF16, kGpu, B * S, H, D);
  bw.dk = view3(dk.get(), DType::BF16, kGpu, B * S, KV, D);
  bw.dv = view3(dv.get(), DType::BF16, kGpu, B * S, KV, D);
  const double flops = 0.5 * 4.0 * B * H * static_cast<double>(S) * S * D;
  auto time_it = [&](bool backward) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    const int iters = 10;
    for (int w = 0; w < 2; ++w) {
      gpu->attention_forward(f);
      if (backward) gpu->attention_backward(bw);
    }
    gpu->synchronize();
    cudaEventRecord(a, nullptr);
    for (int i = 0; i < iters; ++i) {
      gpu->attention_forward(f);
      if (backward) gpu->attention_backward(bw);
    }
    gpu->synchronize();
    cudaEventRecord(b, nullptr);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms / iters;
  };
  const float fwd_ms = time_it(false), all_ms = time_it(true);
  {  // FP8 forward (E4M3 q / k / v codes of the same values, BF16 o)
    auto q8v = [&](const DeviceBuffer &src, int64_t n) {
      std::vector<float> x = from_bytes(src.read<uint8_t>(), DType::BF16);
      std::vector<uint8_t> c(static_cast<size_t>(n));
      for (size_t i = 0; i < c.size(); ++i) c[i] = float_to_e4m3(x[i] * 64.0f);
      return c;
    };
    DeviceBuffer q8(*gpu, q8v(q, nq)), k8(*gpu, q8v(k, nkv)), v8(*gpu, q8v(v, nkv));
    DeviceBuffer si(*gpu, raw(std::vector<float>{1.0f / 64})), ss(*gpu, raw(std::vector<float>{448.0f})),
        ssi(*gpu, raw(std::vector<float>{1.0f / 448})), am(*gpu, raw(std::vector<float>{0.0f}));
    AttentionForwardArgs f8 = f;
    f8.q = view3(q8.get(), DType::E4M3, kGpu, B * S, H, D);
    f8.k = view3(k8.get(), DType::E4M3, kGpu, B * S, KV, D);
    f8.v = view3(v8.get(), DType::E4M3, kGpu, B * S, KV, D);
    f8.q.scale_inv = f8.k.scale_inv = f8.v.scale_inv = si.floats();
    f8.s_scale = ss.floats(), f8.s_scale_inv = ssi.floats(), f8.s_amax = am.floats();
    for (int w = 0; w < 2; ++w) gpu->attention_forward(f8);
    gpu->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) gpu->attention_forward(f8);
    gpu->synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 10;
    std::printf("attention bench fp8 forward (e4m3 q/k/v, bf16 o): %.3f ms %.1f TFLOP/s\n", ms, flops / ms * 1e-9);
    // FP8 backward (e4m3 dO8 of the same dO values, bf16 gradients), explicit scales; and the
    // dp_amax_only pass that current scaling runs first.
    DeviceBuffer do8(*gpu, q8v(dO, nq)), dps(*gpu, raw(std::vector<float>{4096.0f})),
        dpsi(*gpu, raw(std::vector<float>{1.0f / 4096})), dpam(*gpu, raw(std::vector<float>{0.0f}));
    gpu->attention_forward(f8);
    AttentionBackwardArgs b8 = bw;
    b8.q = f8.q, b8.k = f8.k, b8.v = f8.v;
    b8.d_o8 = view3(do8.get(), DType::E4M3, kGpu, B * S, H, D);
    b8.d_o8.scale_inv = si.floats();
    b8.s_scale = ss.floats(), b8.s_scale_inv = ssi.floats();
    b8.dp_scale = dps.floats(), b8.dp_scale_inv = dpsi.floats(), b8.dp_amax = dpam.floats();
    AttentionBackwardArgs a8 = b8;
    a8.dp_amax_only = true;
    a8.dq = a8.dk = a8.dv = TensorView{};
    for (const AttentionBackwardArgs *bp : {&b8, &a8}) {
      for (int w = 0; w < 2; ++w) gpu->attention_backward(*bp);
      gpu->synchronize();
      const auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < 10; ++i) gpu->attention_backward(*bp);
      gpu->synchronize();
      const double bms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count() / 10;
      std::printf("attention bench fp8 backward%s (e4m3 q/k/v/dO8, bf16 grads): %.3f ms %.1f TFLOP/s\n",
                  bp == &a8 ? " dp_amax_only" : "", bms, 2.5 * flops / bms * 1e-9);
    }
  }
  std::printf("attention bench causal b%lld s%lld h%lld kv%lld d%lld bf16: fwd %.3f ms %.1f TFLOP/s; fwd+bwd %.3f ms %.1f TFLOP/s (bwd %.3f ms %.1f TFLOP/s)\n",
              (long long)B, (long long)S, (long long)H, (long long)KV, (long long)D, fwd_ms, flops / fwd_ms * 1e-9, all_ms,
              3.5 * flops / all_ms * 1e-9, all_ms - fwd_ms, 2.5 * flops / (all_ms - fwd_ms) * 1e-9);
}

// ---- RoPE ---------------------------------------------------------------------------------------
class CudaRope : public GpuTest {};

TEST_F(CudaRope, BitIdenticalToCpu) {
  uint32_t seed = 7;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (int layout = 0; layout < 2; ++layout) {  // BSHD, THD
      for (int inter = 0; inter < 2; ++inter) {
        for (int inv = 0; inv < 2; ++inv) {
          for (int alias = 0; alias < 2; ++alias) {
            const int64_t heads = 3, head_dim = 40, rot_dim = inter ? 32 : 24;
            std::vector<int32_t> cu = {2, 5, 5, 22, 38};  // tokens 0, 1, 38, 39 belong to no sequence
            const int64_t tokens = 40, seq_len = 20, positions = 30;
            std::mt19937 rng(seed++);
            std::normal_distribution<float> normal(0.0f, 1.0f);
            std::uniform_real_distribution<float> uni(-100.0f, 100.0f);
            std::vector<float> x(static_cast<size_t>(tokens * heads * head_dim)), f(static_cast<size_t>(positions * rot_dim / 2));
            for (auto &e : x) e = normal(rng);
            for (auto &e : f) e = uni(rng);
            x = from_bytes(to_bytes(x, dt), dt);
            Twin tx(*cpu, *gpu, to_bytes(x, dt)), ty(*cpu, *gpu, x.size() * dtype_size(dt)), tf(*cpu, *gpu, raw(f)),
                tcu(*cpu, *gpu, raw(cu));
            RopeArgs a;
            for (int b = 0; b < 2; ++b) {
              const Device dev = b == 0 ? kCpu : kGpu;
              a.x = view3(tx.on(b), dt, dev, tokens, heads, head_dim);
              a.y = alias ? a.x : view3(ty.on(b), dt, dev, tokens, heads, head_dim);
              a.freqs = make_view(tf.on(b), DType::F32, dev, positions, rot_dim / 2);
              a.tokens = tokens, a.heads = heads, a.head_dim = head_dim, a.rot_dim = rot_dim;
              if (layout == 0) a.seq_len = seq_len;
              else a.batch = 4, a.cu_seqlens = static_cast<const int32_t *>(tcu.on(b));
              a.interleaved = inter, a.inverse = inv;
              (b == 0 ? *cpu : *gpu).rope(a);
            }
            gpu->synchronize();
            const Twin &out = alias ? tx : ty;
            const std::vector<uint8_t> ref = out.c.read<uint8_t>();
            EXPECT_TRUE(ref == out.g.read<uint8_t>())
                << dtype_name(dt) << " layout " << layout << " interleaved " << inter << " inverse " << inv << " alias "
                << alias;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace te::gpu_test
