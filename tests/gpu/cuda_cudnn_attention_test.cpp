// cuDNN's fused attention (backends/cuda/cudnn_sdpa.cpp) against the CPU reference, through the
// Backend interface, with TE_ATTENTION_IMPL=cudnn so that a call cuDNN cannot run fails instead of
// silently taking libte's own kernels. Covers BF16 and F16, fixed lengths (BSHD) and THD,
// masks None / Causal / CausalBottomRight, GQA, head_dim 64 and 128, forward and backward.
// Tolerances: cuDNN rounds P to the input dtype before P V and dS before dS K / dS^T Q (the CPU
// keeps them in fp32), so outputs agree within a few units of the dtype's last place relative to
// the tensor's magnitude: |gpu - cpu| <= tol * (max|cpu| + |cpu|), tol = 2^-6 (BF16) or 2^-8 (F16);
// LSE within 1e-3 absolute (fp32 statistics); rows that see no key: O = 0, LSE = -inf exactly.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cudnn_sdpa.h"
#include "gpu/gpu_test_support.h"
#include "numerics/numerics.h"

namespace te::gpu_test {
namespace {

constexpr Device kCpu{DeviceType::CPU, 0};
constexpr Device kGpu{DeviceType::CUDA, 0};

// Skips where libcudnn cannot be loaded (the dispatch then always runs libte's kernels).
class CudnnAttentionTest : public GpuTest {
 protected:
  void SetUp() override {
    const char *prev = std::getenv("TE_ATTENTION_IMPL");
    had_prev_ = prev != nullptr;
    if (prev) prev_ = prev;
    setenv("TE_ATTENTION_IMPL", "cudnn", 1);
    GpuTest::SetUp();
    if (IsSkipped()) return;
    std::string why;
    if (!cuda::CudnnSdpa::create(0, &why)) GTEST_SKIP() << "cuDNN unavailable: " << (why.empty() ? "?" : why);
  }
  void TearDown() override {
    if (had_prev_) setenv("TE_ATTENTION_IMPL", prev_.c_str(), 1);
    else unsetenv("TE_ATTENTION_IMPL");
  }
  bool had_prev_ = false;
  std::string prev_;
};

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
std::vector<float> randn(size_t n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> v(n);
  for (auto &x : v) x = normal(rng);
  return v;
}

struct Case {
  DType dt = DType::BF16;
  AttnMask mask = AttnMask::None;
  int64_t batch = 2, heads = 8, kv_heads = 2, head_dim = 64;
  int64_t sq = 128, skv = 128;         // fixed lengths, or the max lengths for THD
  std::vector<int32_t> lens_q, lens_kv;  // THD when not empty
  std::string name() const {
    std::string s = std::string(dtype_name(dt)) + " mask=" + std::to_string(static_cast<int>(mask)) + " b=" +
                    std::to_string(batch) + " h=" + std::to_string(heads) + "/" + std::to_string(kv_heads) +
                    " d=" + std::to_string(head_dim) + " sq=" + std::to_string(sq) + " skv=" + std::to_string(skv);
    if (!lens_q.empty()) {
      s += " thd q=[";
      for (auto l : lens_q) s += std::to_string(l) + ",";
      s += "] kv=[";
      for (auto l : lens_kv) s += std::to_string(l) + ",";
      s += "]";
    }
    return s;
  }
};

struct Cmp {
  double max_err = 0, max_ref = 0;
  int64_t bad = 0, first_bad = -1;
};

Cmp compare(const std::vector<float> &ref, const std::vector<float> &got, double tol) {
  Cmp c;
  for (float r : ref)
    if (std::isfinite(r)) c.max_ref = std::max(c.max_ref, (double)std::fabs(r));
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], g = got[i];
    if (std::isinf(r) || std::isinf(g) || std::isnan(g)) {
      if (!(r == g)) {
        if (c.first_bad < 0) c.first_bad = (int64_t)i;
        ++c.bad;
      }
      continue;
    }
    const double e = std::fabs(g - r);
    c.max_err = std::max(c.max_err, e);
    if (e > tol * (c.max_ref + std::fabs(r)) + 1e-6) {
      if (c.first_bad < 0) c.first_bad = (int64_t)i;
      ++c.bad;
    }
  }
  return c;
}

#define EXPECT_CLOSE(ref, got, tol, what)                                                                         \
  do {                                                                                                            \
    const Cmp c_ = compare((ref), (got), (tol));                                                                  \
    EXPECT_EQ(c_.bad, 0) << k.name() << " " << what << ": " << c_.bad << " bad of " << (ref).size() << ", first " \
                         << c_.first_bad << " (cpu " << (c_.first_bad >= 0 ? (ref)[c_.first_bad] : 0.f) << " gpu " \
                         << (c_.first_bad >= 0 ? (got)[c_.first_bad] : 0.f) << "), max err " << c_.max_err        \
                         << " max |ref| " << c_.max_ref;                                                          \
  } while (0)

bool declined(int i, const std::exception &e, bool allow_decline, const Case &k) {
  if (i != 1 || !allow_decline || std::string(e.what()).find("cannot run this call") == std::string::npos) return false;
  std::printf("[ note ] %s: cuDNN declines: %s\n", k.name().c_str(), e.what());
  return true;
}

void run_case(Backend &cpu, Backend &gpu, const Case &k, uint32_t seed, bool allow_decline = false) {
  const bool thd = !k.lens_q.empty();
  std::vector<int32_t> cu_q(1, 0), cu_kv(1, 0);
  int64_t tq, tkv;
  if (thd) {
    for (auto l : k.lens_q) cu_q.push_back(cu_q.back() + l);
    for (auto l : k.lens_kv) cu_kv.push_back(cu_kv.back() + l);
    tq = cu_q.back();
    tkv = cu_kv.back();
  } else {
    tq = k.batch * k.sq;
    tkv = k.batch * k.skv;
  }
  const int64_t qc = k.heads * k.head_dim, kc = k.kv_heads * k.head_dim;
  const size_t es = dtype_size(k.dt);
  const std::vector<uint8_t> qb = to_bytes(randn(tq * qc, seed, 1.0f), k.dt);
  const std::vector<uint8_t> kb = to_bytes(randn(tkv * kc, seed + 1, 1.0f), k.dt);
  const std::vector<uint8_t> vb = to_bytes(randn(tkv * kc, seed + 2, 1.0f), k.dt);
  const std::vector<uint8_t> dob = to_bytes(randn(tq * qc, seed + 3, 1.0f), k.dt);
  const double tol = k.dt == DType::BF16 ? 1.0 / 64 : 1.0 / 256;

  Backend *be[2] = {&cpu, &gpu};
  const Device dev[2] = {kCpu, kGpu};
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  auto buf = [&](int i, const std::vector<uint8_t> &host) {
    keep.push_back(std::make_unique<DeviceBuffer>(*be[i], host));
    return keep.back()->get();
  };
  auto zeros = [&](int i, size_t bytes) {
    keep.push_back(std::make_unique<DeviceBuffer>(*be[i], bytes));
    return keep.back().get();
  };
  std::vector<uint8_t> cuqb(cu_q.size() * 4), cukb(cu_kv.size() * 4);
  std::memcpy(cuqb.data(), cu_q.data(), cuqb.size());
  std::memcpy(cukb.data(), cu_kv.data(), cukb.size());

  // Forward on both.
  std::vector<float> o_out[2], lse_out[2];
  std::vector<uint8_t> o_cpu_bytes;
  for (int i = 0; i < 2; ++i) {
    AttentionForwardArgs a;
    a.dims.batch = k.batch;
    a.dims.heads = k.heads;
    a.dims.kv_heads = k.kv_heads;
    a.dims.head_dim = k.head_dim;
    a.dims.tokens_q = tq;
    a.dims.tokens_kv = tkv;
    a.dims.max_seq_q = k.sq;
    a.dims.max_seq_kv = k.skv;
    a.dims.mask = k.mask;
    a.dims.softmax_scale = 1.0f / std::sqrt(static_cast<float>(k.head_dim));
    if (thd) {
      a.dims.cu_seqlens_q = static_cast<const int32_t *>(buf(i, cuqb));
      a.dims.cu_seqlens_kv = static_cast<const int32_t *>(buf(i, cukb));
    }
    a.q = make_view(buf(i, qb), k.dt, dev[i], tq, qc);
    a.k = make_view(buf(i, kb), k.dt, dev[i], tkv, kc);
    a.v = make_view(buf(i, vb), k.dt, dev[i], tkv, kc);
    DeviceBuffer *o = zeros(i, tq * qc * es), *lse = zeros(i, tq * k.heads * 4);
    a.o = make_view(o->get(), k.dt, dev[i], tq, qc);
    a.lse = lse->floats();
    try {
      be[i]->attention_forward(a);
    } catch (const std::exception &e) {
      if (declined(i, e, allow_decline, k)) return;
      ADD_FAILURE() << k.name() << (i ? " gpu" : " cpu") << " forward threw: " << e.what();
      return;
    }
    be[i]->synchronize();
    o_out[i] = from_bytes(o->read<uint8_t>(), k.dt);
    lse_out[i] = lse->read<float>();
    if (i == 0) o_cpu_bytes = o->read<uint8_t>();
  }
  EXPECT_CLOSE(o_out[0], o_out[1], tol, "O");
  {
    const Cmp c = compare(lse_out[0], lse_out[1], 0.0);
    int64_t bad = 0;
    for (size_t j = 0; j < lse_out[0].size(); ++j) {
      const float r = lse_out[0][j], g = lse_out[1][j];
      if (std::isinf(r) ? r != g : !(std::fabs(r - g) <= 1e-3f + 1e-4f * std::fabs(r))) ++bad;
    }
    EXPECT_EQ(bad, 0) << k.name() << " LSE: " << bad << " bad, first " << c.first_bad << " (cpu "
                      << (c.first_bad >= 0 ? lse_out[0][c.first_bad] : 0.f) << " gpu "
                      << (c.first_bad >= 0 ? lse_out[1][c.first_bad] : 0.f) << ")";
  }

  // Backward on both, from the CPU's O and LSE.
  std::vector<uint8_t> lse_bytes(lse_out[0].size() * 4);
  std::memcpy(lse_bytes.data(), lse_out[0].data(), lse_bytes.size());
  std::vector<float> g_out[2][3];
  for (int i = 0; i < 2; ++i) {
    AttentionBackwardArgs a;
    a.dims.batch = k.batch;
    a.dims.heads = k.heads;
    a.dims.kv_heads = k.kv_heads;
    a.dims.head_dim = k.head_dim;
    a.dims.tokens_q = tq;
    a.dims.tokens_kv = tkv;
    a.dims.max_seq_q = k.sq;
    a.dims.max_seq_kv = k.skv;
    a.dims.mask = k.mask;
    a.dims.softmax_scale = 1.0f / std::sqrt(static_cast<float>(k.head_dim));
    if (thd) {
      a.dims.cu_seqlens_q = static_cast<const int32_t *>(buf(i, cuqb));
      a.dims.cu_seqlens_kv = static_cast<const int32_t *>(buf(i, cukb));
    }
    a.q = make_view(buf(i, qb), k.dt, dev[i], tq, qc);
    a.k = make_view(buf(i, kb), k.dt, dev[i], tkv, kc);
    a.v = make_view(buf(i, vb), k.dt, dev[i], tkv, kc);
    a.o = make_view(buf(i, o_cpu_bytes), k.dt, dev[i], tq, qc);
    a.d_o = make_view(buf(i, dob), k.dt, dev[i], tq, qc);
    a.lse = static_cast<const float *>(buf(i, lse_bytes));
    // Garbage in the outputs: they must be written, not accumulated.
    const std::vector<uint8_t> junk_q = to_bytes(randn(tq * qc, 99, 3.0f), k.dt);
    const std::vector<uint8_t> junk_kv = to_bytes(randn(tkv * kc, 98, 3.0f), k.dt);
    DeviceBuffer *dq = nullptr, *dk = nullptr, *dv = nullptr;
    keep.push_back(std::make_unique<DeviceBuffer>(*be[i], junk_q));
    dq = keep.back().get();
    keep.push_back(std::make_unique<DeviceBuffer>(*be[i], junk_kv));
    dk = keep.back().get();
    keep.push_back(std::make_unique<DeviceBuffer>(*be[i], junk_kv));
    dv = keep.back().get();
    a.dq = make_view(dq->get(), k.dt, dev[i], tq, qc);
    a.dk = make_view(dk->get(), k.dt, dev[i], tkv, kc);
    a.dv = make_view(dv->get(), k.dt, dev[i], tkv, kc);
    try {
      be[i]->attention_backward(a);
    } catch (const std::exception &e) {
      if (declined(i, e, allow_decline, k)) return;
      ADD_FAILURE() << k.name() << (i ? " gpu" : " cpu") << " backward threw: " << e.what();
      return;
    }
    be[i]->synchronize();
    g_out[i][0] = from_bytes(dq->read<uint8_t>(), k.dt);
    g_out[i][1] = from_bytes(dk->read<uint8_t>(), k.dt);
    g_out[i][2] = from_bytes(dv->read<uint8_t>(), k.dt);
  }
  const double gtol = 2 * tol;
  EXPECT_CLOSE(g_out[0][0], g_out[1][0], gtol, "dQ");
  EXPECT_CLOSE(g_out[0][1], g_out[1][1], gtol, "dK");
  EXPECT_CLOSE(g_out[0][2], g_out[1][2], gtol, "dV");
}

// FP8 forward: E4M3 q/k/v with per-tensor scale_inv, P quantized with s_scale, O in k.dt.
// Both sides quantize P, but a P that the two compute a rounding apart can land on neighbouring
// E4M3 codes (2^-3 relative), so O is compared within 2^-4 of max|O|; max P exactly-ish.
void run_fp8_case(Backend &cpu, Backend &gpu, const Case &k, uint32_t seed) {
  const bool thd = !k.lens_q.empty();
  std::vector<int32_t> cu_q(1, 0), cu_kv(1, 0);
  int64_t tq, tkv;
  if (thd) {
    for (auto l : k.lens_q) cu_q.push_back(cu_q.back() + l);
    for (auto l : k.lens_kv) cu_kv.push_back(cu_kv.back() + l);
    tq = cu_q.back();
    tkv = cu_kv.back();
  } else {
    tq = k.batch * k.sq;
    tkv = k.batch * k.skv;
  }
  const int64_t qc = k.heads * k.head_dim, kc = k.kv_heads * k.head_dim;
  const std::vector<uint8_t> qb = to_bytes(randn(tq * qc, seed, 8.0f), DType::E4M3);
  const std::vector<uint8_t> kb = to_bytes(randn(tkv * kc, seed + 1, 8.0f), DType::E4M3);
  const std::vector<uint8_t> vb = to_bytes(randn(tkv * kc, seed + 2, 8.0f), DType::E4M3);
  std::vector<uint8_t> cuqb(cu_q.size() * 4), cukb(cu_kv.size() * 4);
  std::memcpy(cuqb.data(), cu_q.data(), cuqb.size());
  std::memcpy(cukb.data(), cu_kv.data(), cukb.size());
  auto f32 = [](float x) {
    std::vector<uint8_t> b(4);
    std::memcpy(b.data(), &x, 4);
    return b;
  };
  Backend *be[2] = {&cpu, &gpu};
  const Device dev[2] = {kCpu, kGpu};
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  auto buf = [&](int i, const std::vector<uint8_t> &host) {
    keep.push_back(std::make_unique<DeviceBuffer>(*be[i], host));
    return keep.back()->get();
  };
  std::vector<float> o_out[2], lse_out[2], amax_out[2];
  for (int i = 0; i < 2; ++i) {
    AttentionForwardArgs a;
    a.dims.batch = k.batch;
    a.dims.heads = k.heads;
    a.dims.kv_heads = k.kv_heads;
    a.dims.head_dim = k.head_dim;
    a.dims.tokens_q = tq;
    a.dims.tokens_kv = tkv;
    a.dims.max_seq_q = k.sq;
    a.dims.max_seq_kv = k.skv;
    a.dims.mask = k.mask;
    a.dims.softmax_scale = 1.0f / std::sqrt(static_cast<float>(k.head_dim));
    if (thd) {
      a.dims.cu_seqlens_q = static_cast<const int32_t *>(buf(i, cuqb));
      a.dims.cu_seqlens_kv = static_cast<const int32_t *>(buf(i, cukb));
    }
    a.q = make_view(buf(i, qb), DType::E4M3, dev[i], tq, qc);
    a.q.scale_inv = static_cast<float *>(buf(i, f32(0.125f)));
    a.k = make_view(buf(i, kb), DType::E4M3, dev[i], tkv, kc);
    a.k.scale_inv = static_cast<float *>(buf(i, f32(0.0625f)));
    a.v = make_view(buf(i, vb), DType::E4M3, dev[i], tkv, kc);
    a.v.scale_inv = static_cast<float *>(buf(i, f32(0.125f)));
    a.s_scale = static_cast<const float *>(buf(i, f32(448.0f)));
    a.s_scale_inv = static_cast<const float *>(buf(i, f32(1.0f / 448.0f)));
    a.s_amax = static_cast<float *>(buf(i, f32(1e-3f)));
    keep.push_back(std::make_unique<DeviceBuffer>(*be[i], tq * qc * dtype_size(k.dt)));
    DeviceBuffer *o = keep.back().get();
    keep.push_back(std::make_unique<DeviceBuffer>(*be[i], tq * k.heads * 4));
    DeviceBuffer *lse = keep.back().get();
    a.o = make_view(o->get(), k.dt, dev[i], tq, qc);
    a.lse = lse->floats();
    try {
      be[i]->attention_forward(a);
    } catch (const std::exception &e) {
      // cuDNN declining a case is allowed (libte's kernels run it then); anything else fails.
      if (i == 1 && std::string(e.what()).find("cannot run this call") != std::string::npos) {
        std::printf("[ note ] %s FP8: cuDNN declines: %s\n", k.name().c_str(), e.what());
        return;
      }
      ADD_FAILURE() << k.name() << " FP8" << (i ? " gpu" : " cpu") << " forward threw: " << e.what();
      return;
    }
    be[i]->synchronize();
    o_out[i] = from_bytes(o->read<uint8_t>(), k.dt);
    lse_out[i] = lse->read<float>();
    std::vector<uint8_t> am(4);
    be[i]->copy_to_host(am.data(), a.s_amax, 4);
    amax_out[i] = from_bytes(am, DType::F32);
  }
  EXPECT_CLOSE(o_out[0], o_out[1], 1.0 / 16, "FP8 O");
  EXPECT_CLOSE(lse_out[0], lse_out[1], 1e-3, "FP8 LSE");
  EXPECT_NEAR(amax_out[0][0], amax_out[1][0], 1e-3 * amax_out[0][0]) << k.name() << " FP8 s_amax";
}

std::vector<Case> fixed_cases() {
  std::vector<Case> out;
  for (DType dt : {DType::BF16, DType::F16})
    for (AttnMask m : {AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight})
      for (int64_t d : {64, 128}) {
        Case c;
        c.dt = dt;
        c.mask = m;
        c.head_dim = d;
        out.push_back(c);  // 2 x 128 x 128, 8/2 heads
        Case e = c;
        e.kv_heads = 8;
        e.sq = 64;
        e.skv = 192;
        out.push_back(e);  // sq < skv, MHA
        Case f = c;
        f.batch = 3;
        f.heads = 4;
        f.kv_heads = 1;
        f.sq = 200;
        f.skv = 136;
        out.push_back(f);  // sq > skv, odd lengths
      }
  return out;
}

std::vector<Case> thd_cases() {
  std::vector<Case> out;
  for (DType dt : {DType::BF16, DType::F16})
    for (AttnMask m : {AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight})
      for (int64_t d : {64, 128}) {
        Case c;
        c.dt = dt;
        c.mask = m;
        c.head_dim = d;
        c.batch = 4;
        c.sq = 160;
        c.skv = 200;
        c.lens_q = {37, 160, 1, 90};
        c.lens_kv = {50, 128, 200, 90};
        out.push_back(c);
        Case e = c;  // a sequence without keys, one with more queries than keys
        e.batch = 3;
        e.kv_heads = 8;
        e.lens_q = {16, 70, 128};
        e.lens_kv = {0, 33, 200};
        out.push_back(e);
      }
  return out;
}

TEST_F(CudnnAttentionTest, CudnnFixedLengths) {
  uint32_t seed = 1;
  for (const Case &k : fixed_cases()) run_case(*cpu, *gpu, k, seed += 7);
}

TEST_F(CudnnAttentionTest, CudnnThd) {
  uint32_t seed = 1000;
  for (const Case &k : thd_cases()) run_case(*cpu, *gpu, k, seed += 7);
}

// On Hopper cuDNN declines (its FP8 engines there write O in FP8); the cases then print a note.
// On Blackwell the path is opt-in (TE_CUDNN_SDPA_FP8=1), which this test sets.
TEST_F(CudnnAttentionTest, CudnnFp8Forward) {
  setenv("TE_CUDNN_SDPA_FP8", "1", 1);
  uint32_t seed = 3000;
  for (AttnMask m : {AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight})
    for (int64_t d : {64, 128}) {
      Case c;
      c.mask = m;
      c.head_dim = d;
      run_fp8_case(*cpu, *gpu, c, seed += 7);
      Case t = c;
      t.batch = 4;
      t.sq = 160;
      t.skv = 200;
      t.lens_q = {37, 160, 1, 90};
      t.lens_kv = {50, 128, 200, 90};
      run_fp8_case(*cpu, *gpu, t, seed += 7);
    }
}

// Head dims beyond 64 and 128: where cuDNN takes them they must be right; where it declines,
// libte's kernels run them (a note is printed).
TEST_F(CudnnAttentionTest, CudnnOtherHeadDims) {
  uint32_t seed = 5000;
  for (int64_t d : {32, 80, 96, 192, 256}) {
    Case c;
    c.head_dim = d;
    c.mask = AttnMask::Causal;
    run_case(*cpu, *gpu, c, seed += 7, true);
  }
}

// A second call of a shape reuses its plan; outputs of two runs are the same bytes (forward).
TEST_F(CudnnAttentionTest, CudnnRepeatable) {
  Case k;
  k.batch = 2;
  k.sq = k.skv = 256;
  k.mask = AttnMask::Causal;
  run_case(*cpu, *gpu, k, 5);
  run_case(*cpu, *gpu, k, 5);
}

// Forward + backward (THD, bottom-right causal, GQA) captured in a CUDA graph and replayed give
// what the eager calls give: after the first call of a shape (the plan is built then) nothing
// synchronises the host or allocates outside stream order. O and LSE bit for bit; dQ is
// accumulated with atomics in cuDNN, so gradients within fp32-rounding noise.
TEST_F(CudnnAttentionTest, CudnnCudaGraphCapture) {
  const int64_t B = 3, H = 8, HK = 2, D = 128, SQ = 300, SKV = 300;
  const std::vector<int32_t> cu_q{0, 100, 400, 650}, cu_kv{0, 300, 420, 700};
  const int64_t TQ = cu_q.back(), TKV = cu_kv.back();
  const DType dt = DType::BF16;
  Backend &g = *gpu;
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  g.set_stream(st);
  auto bytes_of = [](const std::vector<int32_t> &v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  DeviceBuffer cq(g, bytes_of(cu_q)), ckv(g, bytes_of(cu_kv));
  DeviceBuffer q(g, to_bytes(randn(TQ * H * D, 11, 1.0f), dt)), k(g, to_bytes(randn(TKV * HK * D, 12, 1.0f), dt)),
      v(g, to_bytes(randn(TKV * HK * D, 13, 1.0f), dt)), d_o(g, to_bytes(randn(TQ * H * D, 14, 1.0f), dt));
  DeviceBuffer o(g, TQ * H * D * 2), lse(g, TQ * H * 4), dq(g, TQ * H * D * 2), dk(g, TKV * HK * D * 2),
      dv(g, TKV * HK * D * 2);
  const Device dev{DeviceType::CUDA, 0};
  AttentionDims d;
  d.batch = B;
  d.heads = H;
  d.kv_heads = HK;
  d.head_dim = D;
  d.tokens_q = TQ;
  d.tokens_kv = TKV;
  d.max_seq_q = SQ;
  d.max_seq_kv = SKV;
  d.cu_seqlens_q = static_cast<const int32_t *>(cq.get());
  d.cu_seqlens_kv = static_cast<const int32_t *>(ckv.get());
  d.mask = AttnMask::CausalBottomRight;
  d.softmax_scale = 0.088f;
  AttentionForwardArgs f;
  f.dims = d;
  f.q = make_view(q.get(), dt, dev, TQ, H * D);
  f.k = make_view(k.get(), dt, dev, TKV, HK * D);
  f.v = make_view(v.get(), dt, dev, TKV, HK * D);
  f.o = make_view(o.get(), dt, dev, TQ, H * D);
  f.lse = lse.floats();
  AttentionBackwardArgs b;
  b.dims = d;
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.o = f.o;
  b.d_o = make_view(d_o.get(), dt, dev, TQ, H * D);
  b.lse = f.lse;
  b.dq = make_view(dq.get(), dt, dev, TQ, H * D);
  b.dk = make_view(dk.get(), dt, dev, TKV, HK * D);
  b.dv = make_view(dv.get(), dt, dev, TKV, HK * D);
  auto step = [&] {
    g.attention_forward(f);
    g.attention_backward(b);
  };
  step();
  g.synchronize();
  const auto o0 = o.read<uint8_t>(), l0 = lse.read<uint8_t>();
  const auto dq0 = from_bytes(dq.read<uint8_t>(), dt), dk0 = from_bytes(dk.read<uint8_t>(), dt),
             dv0 = from_bytes(dv.read<uint8_t>(), dt);
  // Clear the outputs, then capture and replay.
  for (DeviceBuffer *x : {&o, &lse, &dq, &dk, &dv}) {
    std::vector<uint8_t> z(x->read<uint8_t>().size(), 0);
    g.copy_from_host(x->get(), z.data(), z.size());
  }
  g.synchronize();
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
  step();
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  EXPECT_EQ(o.read<uint8_t>(), o0) << "O after graph replay";
  EXPECT_EQ(lse.read<uint8_t>(), l0) << "LSE after graph replay";
  const auto dq1 = from_bytes(dq.read<uint8_t>(), dt), dk1 = from_bytes(dk.read<uint8_t>(), dt),
             dv1 = from_bytes(dv.read<uint8_t>(), dt);
  {
    Case k;  // names the case in EXPECT_CLOSE's message
    k.batch = B;
    k.mask = d.mask;
    k.head_dim = D;
    EXPECT_CLOSE(dq0, dq1, 1.0 / 128, "dQ after graph replay");
    EXPECT_CLOSE(dk0, dk1, 1.0 / 128, "dK after graph replay");
    EXPECT_CLOSE(dv0, dv1, 1.0 / 128, "dV after graph replay");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  g.set_stream(nullptr);
  cudaStreamDestroy(st);
}

}  // namespace
}  // namespace te::gpu_test
