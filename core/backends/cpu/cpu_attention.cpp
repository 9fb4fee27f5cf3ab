// Attention and RoPE on the CPU: numerics/attention.h computed straightforwardly, one query row
// at a time, with fp64 accumulation of every dot product and sum, so that the GPU's tiled fp32
// results are checked against something more accurate than themselves. Slow by design.
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_convert.h"
#include "numerics/attention.h"

namespace te {

namespace {

struct Span {
  int64_t q0 = 0, sq = 0, k0 = 0, skv = 0;
};

// Sequence b's rows. The core has validated the offsets (CPU memory is host memory).
Span sequence(const AttentionDims &d, int64_t b) {
  Span s;
  if (d.varlen()) {
    s.q0 = d.cu_seqlens_q[b];
    s.sq = d.cu_seqlens_q[b + 1] - s.q0;
    s.k0 = d.cu_seqlens_kv[b];
    s.skv = d.cu_seqlens_kv[b + 1] - s.k0;
  } else {
    s.q0 = b * d.max_seq_q;
    s.sq = d.max_seq_q;
    s.k0 = b * d.max_seq_kv;
    s.skv = d.max_seq_kv;
  }
  return s;
}

// The number of keys query i sees (keys 0..n-1 of its sequence; every mask is a prefix).
int64_t visible_keys(AttnMask mask, int64_t i, int64_t sq, int64_t skv) {
  int64_t n = skv;
  if (mask == AttnMask::Causal) n = i + 1;
  if (mask == AttnMask::CausalBottomRight) n = i + 1 + (skv - sq);
  return n < 0 ? 0 : (n > skv ? skv : n);
}

std::vector<float> load_all(const TensorView &t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  cpu::load_floats(t.data, t.dtype, 0, t.numel(), v.data());
  return v;
}

// An FP8 tensor's values are its codes times scale_inv[0]; the codes' factor is applied to
// the dot products (as a GEMM applies it after accumulating), so this returns the factor alone.
float dequant_factor(const TensorView &t) { return is_fp8(t.dtype) ? t.scale_inv[0] : 1.0f; }

float fp8_round(float x, DType t) { return fp8_to_float(float_to_fp8(x, t), t); }

double dot(const float *a, const float *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

// The scores of query row `qi` against keys k0..k0+n-1 of kv head g: S[j] in fp32.
void scores(const AttentionDims &d, const std::vector<float> &q, const std::vector<float> &k, float qk_factor,
            int64_t qi, int64_t h, int64_t k0, int64_t g, int64_t n, float *s) {
  const int64_t hd = d.head_dim;
  const float *qrow = &q[static_cast<size_t>((qi * d.heads + h) * hd)];
  for (int64_t j = 0; j < n; ++j) {
    const float *krow = &k[static_cast<size_t>(((k0 + j) * d.kv_heads + g) * hd)];
    s[j] = static_cast<float>(dot(qrow, krow, hd)) * qk_factor * d.softmax_scale;
  }
}

}  // namespace

void CpuBackend::attention_forward(const AttentionForwardArgs &a) {
  const AttentionDims &d = a.dims;
  const bool fp8 = is_fp8(a.q.dtype);
  const std::vector<float> q = load_all(a.q), k = load_all(a.k), v = load_all(a.v);
  const float qk_factor = dequant_factor(a.q) * dequant_factor(a.k);
  const float pv_factor = fp8 ? a.s_scale_inv[0] * dequant_factor(a.v) : 1.0f;
  const float s_scale = fp8 ? a.s_scale[0] : 1.0f;
  const int64_t hd = d.head_dim, group = d.heads / d.kv_heads;
  std::vector<float> s(static_cast<size_t>(d.max_seq_kv > 0 ? d.max_seq_kv : 1));
  std::vector<double> acc(static_cast<size_t>(hd));
  std::vector<float> orow(static_cast<size_t>(hd));
  float s_amax = 0.0f;
  for (int64_t b = 0; b < d.batch; ++b) {
    const Span sp = sequence(d, b);
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < sp.sq; ++i) {
        const int64_t qi = sp.q0 + i;
        const int64_t n = visible_keys(d.mask, i, sp.sq, sp.skv);
        float lse = -std::numeric_limits<float>::infinity();
        for (double &x : acc) x = 0.0;
        if (n > 0) {
          scores(d, q, k, qk_factor, qi, h, sp.k0, g, n, s.data());
          float m = s[0];
          for (int64_t j = 1; j < n; ++j) m = s[j] > m ? s[j] : m;
          double l = 0.0;
          for (int64_t j = 0; j < n; ++j) l += std::exp(static_cast<double>(s[j]) - m);
          lse = m + static_cast<float>(std::log(l));
          for (int64_t j = 0; j < n; ++j) {
            float p = std::exp(s[j] - lse);
            if (fp8) {
              s_amax = cpu::nan_max(s_amax, p);
              p = fp8_round(p * s_scale, DType::E4M3);
            }
            const float *vrow = &v[static_cast<size_t>(((sp.k0 + j) * d.kv_heads + g) * hd)];
            for (int64_t c = 0; c < hd; ++c) acc[c] += static_cast<double>(p) * vrow[c];
          }
        }
        for (int64_t c = 0; c < hd; ++c) orow[c] = static_cast<float>(acc[c]) * pv_factor;
        cpu::store_floats(orow.data(), hd, a.o.data, a.o.dtype, (qi * d.heads + h) * hd);
        a.lse[qi * d.heads + h] = lse;
      }
    }
  }
  if (fp8 && a.s_amax) *a.s_amax = cpu::nan_max(*a.s_amax, s_amax);
}

void CpuBackend::attention_backward(const AttentionBackwardArgs &a) {
  const AttentionDims &d = a.dims;
  const bool fp8 = is_fp8(a.q.dtype);
  const std::vector<float> q = load_all(a.q), k = load_all(a.k), v = load_all(a.v);
  const std::vector<float> o = load_all(a.o), dout = load_all(a.d_o);
  const std::vector<float> dout8 = fp8 ? load_all(a.d_o8) : std::vector<float>();
  const std::vector<float> &dov = fp8 ? dout8 : dout;  // the dO the GEMMs see
  const DType grad_fp8 = fp8 ? a.d_o8.dtype : DType::F32;
  const float qk_factor = dequant_factor(a.q) * dequant_factor(a.k);
  const float dov_factor = fp8 ? dequant_factor(a.d_o8) * dequant_factor(a.v) : 1.0f;  // dP
  const float ds_inv = fp8 && !a.dp_amax_only ? a.dp_scale_inv[0] : 1.0f;
  const float dq_factor = ds_inv * dequant_factor(a.k) * d.softmax_scale;
  const float dk_factor = ds_inv * dequant_factor(a.q) * d.softmax_scale;
  const float dv_factor = fp8 ? a.s_scale_inv[0] * dequant_factor(a.d_o8) : 1.0f;
  const int64_t hd = d.head_dim, group = d.heads / d.kv_heads;
  const size_t kv_elems = static_cast<size_t>(d.tokens_kv * d.kv_heads * hd);
  std::vector<double> dk(a.dp_amax_only ? 0 : kv_elems, 0.0), dv(a.dp_amax_only ? 0 : kv_elems, 0.0);
  std::vector<float> s(static_cast<size_t>(d.max_seq_kv > 0 ? d.max_seq_kv : 1));
  std::vector<double> dq(static_cast<size_t>(hd));
  std::vector<float> row(static_cast<size_t>(hd));
  float dp_amax = 0.0f;
  for (int64_t b = 0; b < d.batch; ++b) {
    const Span sp = sequence(d, b);
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < sp.sq; ++i) {
        const int64_t qi = sp.q0 + i;
        const size_t qoff = static_cast<size_t>((qi * d.heads + h) * hd);
        const int64_t n = visible_keys(d.mask, i, sp.sq, sp.skv);
        for (double &x : dq) x = 0.0;
        if (n > 0) {
          const float lse = a.lse[qi * d.heads + h];
          const float D = static_cast<float>(dot(&dout[qoff], &o[qoff], hd));
          scores(d, q, k, qk_factor, qi, h, sp.k0, g, n, s.data());
          for (int64_t j = 0; j < n; ++j) {
            const size_t koff = static_cast<size_t>(((sp.k0 + j) * d.kv_heads + g) * hd);
            const float p = std::exp(s[j] - lse);
            const float dp = static_cast<float>(dot(&dov[qoff], &v[koff], hd)) * dov_factor;
            float ds = p * (dp - D);
            if (fp8) {
              dp_amax = cpu::nan_max(dp_amax, std::fabs(ds));
              if (a.dp_amax_only) continue;
              ds = fp8_round(ds * a.dp_scale[0], grad_fp8);
            }
            const float pv = fp8 ? fp8_round(p * a.s_scale[0], DType::E4M3) : p;
            for (int64_t c = 0; c < hd; ++c) {
              dq[c] += static_cast<double>(ds) * k[koff + c];
              dk[koff + c] += static_cast<double>(ds) * q[qoff + c];
              dv[koff + c] += static_cast<double>(pv) * dov[qoff + c];
            }
          }
        }
        if (a.dp_amax_only) continue;
        for (int64_t c = 0; c < hd; ++c) row[c] = static_cast<float>(dq[c]) * dq_factor;
        cpu::store_floats(row.data(), hd, a.dq.data, a.dq.dtype, static_cast<int64_t>(qoff));
      }
    }
  }
  if (fp8 && a.dp_amax) *a.dp_amax = cpu::nan_max(*a.dp_amax, dp_amax);
  if (a.dp_amax_only) return;
  std::vector<float> out(kv_elems);
  for (size_t i = 0; i < kv_elems; ++i) out[i] = static_cast<float>(dk[i]) * dk_factor;
  cpu::store_floats(out.data(), static_cast<int64_t>(kv_elems), a.dk.data, a.dk.dtype, 0);
  for (size_t i = 0; i < kv_elems; ++i) out[i] = static_cast<float>(dv[i]) * dv_factor;
  cpu::store_floats(out.data(), static_cast<int64_t>(kv_elems), a.dv.data, a.dv.dtype, 0);
}

void CpuBackend::rope(const RopeArgs &a) {
  const int64_t hd = a.head_dim, half = a.rot_dim / 2;
  const int64_t positions = a.freqs.shape[0];
  std::vector<float> x(static_cast<size_t>(hd)), y(static_cast<size_t>(hd));
  const float *freqs = static_cast<const float *>(a.freqs.data);
  auto one_token = [&](int64_t t, int64_t pos) {
    if (pos >= positions) pos = positions - 1;
    for (int64_t h = 0; h < a.heads; ++h) {
      const int64_t off = (t * a.heads + h) * hd;
      cpu::load_floats(a.x.data, a.x.dtype, off, hd, x.data());
      y = x;
      for (int64_t p = 0; p < half; ++p) {
        float c, s;
        rope_cos_sin(freqs[pos * half + p], a.inverse, &c, &s);
        const int64_t i1 = a.interleaved ? 2 * p : p, i2 = a.interleaved ? 2 * p + 1 : p + half;
        const float x1 = x[i1], x2 = x[i2];
        const float a1 = x1 * c, b1 = x2 * s, a2 = x2 * c, b2 = x1 * s;
        y[i1] = a1 - b1;
        y[i2] = a2 + b2;
      }
      cpu::store_floats(y.data(), hd, a.y.data, a.y.dtype, off);
    }
  };
  if (a.cu_seqlens) {
    for (int64_t b = 0; b < a.batch; ++b)
      for (int64_t t = a.cu_seqlens[b]; t < a.cu_seqlens[b + 1]; ++t) one_token(t, t - a.cu_seqlens[b]);
  } else {
    for (int64_t t = 0; t < a.tokens; ++t) one_token(t, t % a.seq_len);
  }
}

}  // namespace te
