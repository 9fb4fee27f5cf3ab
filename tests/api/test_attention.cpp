// te_attention_* and te_rope_* through the public API on the CPU: forward and backward against
// an fp64 reference written here (not the library's), for every mask, GQA, BSHD and THD with
// lengths 0, 1 and not multiples of 16, head dims 64 and 128, F32 and BF16; FP8 under delayed
// and current scaling against the same reference within FP8's error; backward twice identical;
// residuals in the caller's memory equal to the opaque path; state round trips; every argument's
// rejection with outputs untouched; RoPE bit-exact against the defined formula.
#include <cmath>
#include <cstring>

#include "api_test_util.h"

using namespace te_test;

namespace {

struct AttnDeleter { void operator()(te_attention *m) const { te_attention_destroy(m); } };
using AttnPtr = std::unique_ptr<te_attention, AttnDeleter>;
struct AttnBwdDeleter { void operator()(te_attention_backward_ctx *b) const { te_attention_backward_ctx_destroy(b); } };
using AttnBwdPtr = std::unique_ptr<te_attention_backward_ctx, AttnBwdDeleter>;

struct Shape {
  int64_t batch = 2, heads = 8, kv_heads = 2, hd = 64;
  int64_t sq = 13, skv = 13;              // BSHD lengths (THD: the bounds)
  std::vector<int32_t> lens_q, lens_kv;   // THD when not empty
  bool thd() const { return !lens_q.empty(); }
  int64_t tokens_q() const {
    if (!thd()) return batch * sq;
    int64_t t = 0;
    for (int32_t l : lens_q) t += l;
    return t;
  }
  int64_t tokens_kv() const {
    if (!thd()) return batch * skv;
    int64_t t = 0;
    for (int32_t l : lens_kv) t += l;
    return t;
  }
};

HostTensor offsets(const std::vector<int32_t> &lens) {
  HostTensor h(TE_DTYPE_I32, {static_cast<int64_t>(lens.size()) + 1});
  int32_t acc = 0;
  std::memcpy(h.bytes.data(), &acc, 4);
  for (size_t i = 0; i < lens.size(); ++i) {
    acc += lens[i];
    std::memcpy(h.bytes.data() + 4 * (i + 1), &acc, 4);
  }
  return h;
}

std::vector<int64_t> qshape(const Shape &s, int64_t heads) {
  if (s.thd()) return {s.tokens_q(), heads, s.hd};
  return {s.batch, s.sq, heads, s.hd};
}
std::vector<int64_t> kvshape(const Shape &s) {
  if (s.thd()) return {s.tokens_kv(), s.kv_heads, s.hd};
  return {s.batch, s.skv, s.kv_heads, s.hd};
}

// ---- fp64 reference ---------------------------------------------------------------------------

struct RefOut {
  std::vector<double> o, dq, dk, dv;
};

int64_t visible(te_attn_mask mask, int64_t i, int64_t sq, int64_t skv) {
  int64_t n = skv;
  if (mask == TE_ATTN_MASK_CAUSAL) n = i + 1;
  if (mask == TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT) n = i + 1 + skv - sq;
  return std::max<int64_t>(0, std::min(n, skv));
}

RefOut reference(const Shape &s, te_attn_mask mask, double scale, const std::vector<double> &q,
                 const std::vector<double> &k, const std::vector<double> &v, const std::vector<double> &dout) {
  RefOut r;
  const int64_t hd = s.hd, group = s.heads / s.kv_heads;
  r.o.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  int64_t q0 = 0, k0 = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t sq = s.thd() ? s.lens_q[b] : s.sq, skv = s.thd() ? s.lens_kv[b] : s.skv;
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t n = visible(mask, i, sq, skv);
        if (n == 0) continue;
        const double *qi = &q[((q0 + i) * s.heads + h) * hd];
        std::vector<double> p(n);
        double m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const double *kj = &k[((k0 + j) * s.kv_heads + g) * hd];
          double d = 0;
          for (int64_t c = 0; c < hd; ++c) d += qi[c] * kj[c];
          p[j] = d * scale;
          m = std::max(m, p[j]);
        }
        double l = 0;
        for (double &x : p) l += (x = std::exp(x - m));
        for (double &x : p) x /= l;
        const size_t qo = ((q0 + i) * s.heads + h) * hd;
        for (int64_t j = 0; j < n; ++j)
          for (int64_t c = 0; c < hd; ++c) r.o[qo + c] += p[j] * v[((k0 + j) * s.kv_heads + g) * hd + c];
        double D = 0;
        for (int64_t c = 0; c < hd; ++c) D += dout[qo + c] * r.o[qo + c];
        for (int64_t j = 0; j < n; ++j) {
          const size_t ko = ((k0 + j) * s.kv_heads + g) * hd;
          double dp = 0;
          for (int64_t c = 0; c < hd; ++c) dp += dout[qo + c] * v[ko + c];
          const double ds = p[j] * (dp - D);
          for (int64_t c = 0; c < hd; ++c) {
            r.dq[qo + c] += scale * ds * k[ko + c];
            r.dk[ko + c] += scale * ds * q[qo + c];
            r.dv[ko + c] += p[j] * dout[qo + c];
          }
        }
      }
    }
    q0 += sq;
    k0 += skv;
  }
  return r;
}

// max |got - want| / max |want| (0 for an all-zero reference that got exactly 0).
double rel_max_error(const HostTensor &got, const std::vector<double> &want) {
  double err = 0, scale = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    err = std::max(err, std::fabs(got.at(i) - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return scale > 0 ? err / scale : err;
}
// ||got - want|| / ||want||.
double rel_norm_error(const HostTensor &got, const std::vector<double> &want) {
  double e = 0, w = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    e += (got.at(i) - want[i]) * (got.at(i) - want[i]);
    w += want[i] * want[i];
  }
  return w > 0 ? std::sqrt(e / w) : std::sqrt(e);
}

// ---- one problem ----------------------------------------------------------------------------

struct Problem {
  Shape s;
  te_dtype dt = TE_DTYPE_BF16;
  te_attn_mask mask = TE_ATTN_MASK_NONE;
  HostTensor q, k, v, dout, cu_q, cu_kv;
  Problem(const Shape &shape, te_dtype dtype, te_attn_mask m, uint32_t seed) : s(shape), dt(dtype), mask(m) {
    q = random_tensor(dt, qshape(s, s.heads), -1.5f, 1.5f, seed);
    k = random_tensor(dt, kvshape(s), -1.5f, 1.5f, seed + 1);
    v = random_tensor(dt, kvshape(s), -1.0f, 1.0f, seed + 2);
    dout = random_tensor(dt, qshape(s, s.heads), -1.0f, 1.0f, seed + 3);
    if (s.thd()) {
      cu_q = offsets(s.lens_q);
      cu_kv = offsets(s.lens_kv);
    }
  }
  te_attention_options options(int fp8 = 0) const {
    te_attention_options o;
    EXPECT_TE_OK(te_attention_options_init(&o));
    o.num_heads = static_cast<int32_t>(s.heads);
    o.num_kv_heads = static_cast<int32_t>(s.kv_heads);
    o.head_dim = static_cast<int32_t>(s.hd);
    o.mask = mask;
    o.activation_dtype = dt;
    o.fp8 = fp8;
    return o;
  }
  te_attention_forward_args args() {
    te_attention_forward_args a;
    EXPECT_TE_OK(te_attention_forward_args_init(&a));
    a.q = q.get();
    a.k = k.get();
    a.v = v.get();
    if (s.thd()) {
      a.cu_seqlens_q = cu_q.get();
      a.cu_seqlens_kv = cu_kv.get();
      a.max_seqlen_q = *std::max_element(s.lens_q.begin(), s.lens_q.end());
      a.max_seqlen_kv = *std::max_element(s.lens_kv.begin(), s.lens_kv.end());
      if (a.max_seqlen_q == 0) a.max_seqlen_q = 1;
      if (a.max_seqlen_kv == 0) a.max_seqlen_kv = 1;
    }
    return a;
  }
  RefOut ref() const {
    return reference(s, mask, 1.0 / std::sqrt(static_cast<double>(s.hd)), q.values(), k.values(), v.values(),
                     dout.values());
  }
};

AttnPtr make_attention(te_context *ctx, const te_attention_options &o) {
  te_attention *m = nullptr;
  EXPECT_TE_OK(te_attention_create(&m, ctx, &o));
  return AttnPtr(m);
}

struct Grads {
  HostTensor o, dq, dk, dv;
};

// forward + backward (twice, checking the second equals the first).
Grads run(te_context *ctx, te_attention *m, Problem &p) {
  Grads g;
  g.o = make_tensor(p.dt, qshape(p.s, p.s.heads));
  g.dq = make_tensor(p.dt, qshape(p.s, p.s.heads));
  g.dk = make_tensor(p.dt, kvshape(p.s));
  g.dv = make_tensor(p.dt, kvshape(p.s));
  te_attention_forward_args a = p.args();
  te_attention_backward_ctx *bwd = nullptr;
  EXPECT_TE_OK(te_attention_forward(ctx, m, &a, g.o.get(), &bwd));
  AttnBwdPtr owned(bwd);
  te_attention_grads gr;
  EXPECT_TE_OK(te_attention_grads_init(&gr));
  gr.dq = g.dq.get();
  gr.dk = g.dk.get();
  gr.dv = g.dv.get();
  EXPECT_TE_OK(te_attention_backward(ctx, bwd, p.dout.get(), &gr, nullptr));
  Grads again = g;
  gr.dq = again.dq.get();
  gr.dk = again.dk.get();
  gr.dv = again.dv.get();
  again.dq.fill_byte(0x11);
  EXPECT_TE_OK(te_attention_backward(ctx, bwd, p.dout.get(), &gr, nullptr));
  EXPECT_TRUE(bitwise_equal(again.dq, g.dq) && bitwise_equal(again.dk, g.dk) && bitwise_equal(again.dv, g.dv))
      << "a second backward differs";
  return g;
}

// Tolerance of a high-precision run against fp64: the output rounding (BF16: 2^-8 relative to
// the tensor's largest value, with a few roundings of the inputs to P and the sums on top).
double hp_tolerance(te_dtype dt) { return dt == TE_DTYPE_F32 ? 2e-5 : 1.6e-2; }

class AttentionTest : public CpuContextTest {};

void check_against_reference(te_context *ctx, const Shape &s, te_dtype dt, te_attn_mask mask, uint32_t seed) {
  Problem p(s, dt, mask, seed);
  AttnPtr m = make_attention(ctx, p.options());
  Grads g = run(ctx, m.get(), p);
  const RefOut r = p.ref();
  const double tol = hp_tolerance(dt);
  EXPECT_LT(rel_max_error(g.o, r.o), tol) << "O";
  EXPECT_LT(rel_max_error(g.dq, r.dq), tol) << "dQ";
  EXPECT_LT(rel_max_error(g.dk, r.dk), tol) << "dK";
  EXPECT_LT(rel_max_error(g.dv, r.dv), tol) << "dV";
}

TEST_F(AttentionTest, MatchesFp64ForEveryMaskDtypeAndHeadDim) {
  for (te_attn_mask mask : {TE_ATTN_MASK_NONE, TE_ATTN_MASK_CAUSAL, TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT})
    for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16})
      for (int64_t hd : {64, 128}) {
        SCOPED_TRACE(testing::Message() << "mask " << mask << " dtype " << dt << " head_dim " << hd);
        Shape s;
        s.hd = hd;
        s.sq = 11;
        s.skv = 19;  // bottom-right and top-left differ
        check_against_reference(ctx_, s, dt, mask, 7);
      }
}

TEST_F(AttentionTest, GqaMhaAndMqa) {
  for (int64_t kv : {8, 2, 1}) {
    SCOPED_TRACE(kv);
    Shape s;
    s.kv_heads = kv;
    check_against_reference(ctx_, s, TE_DTYPE_F32, TE_ATTN_MASK_CAUSAL, 11);
  }
}

TEST_F(AttentionTest, VariableLengthsIncludingEmptyAndOne) {
  for (te_attn_mask mask : {TE_ATTN_MASK_NONE, TE_ATTN_MASK_CAUSAL, TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT}) {
    SCOPED_TRACE(mask);
    Shape s;
    s.batch = 5;
    s.lens_q = {1, 17, 0, 33, 5};
    s.lens_kv = {1, 17, 3, 40, 2};  // bottom-right with sq > skv leaves rows that see nothing
    check_against_reference(ctx_, s, TE_DTYPE_F32, mask, 21);
    check_against_reference(ctx_, s, TE_DTYPE_BF16, mask, 22);
  }
}

TEST_F(AttentionTest, ThdEqualsBshdForEqualLengths) {
  Shape b;
  b.batch = 3;
  b.sq = b.skv = 9;
  Shape t = b;
  t.lens_q = t.lens_kv = {9, 9, 9};
  Problem pb(b, TE_DTYPE_BF16, TE_ATTN_MASK_CAUSAL, 5), pt(t, TE_DTYPE_BF16, TE_ATTN_MASK_CAUSAL, 5);
  AttnPtr m = make_attention(ctx_, pb.options());
  Grads gb = run(ctx_, m.get(), pb), gt = run(ctx_, m.get(), pt);
  EXPECT_EQ(gb.o.bytes, gt.o.bytes);
  EXPECT_EQ(gb.dq.bytes, gt.dq.bytes);
  EXPECT_EQ(gb.dk.bytes, gt.dk.bytes);
}

TEST_F(AttentionTest, ResidualsExposeLseAndTheCallersTensors) {
  Shape s;
  Problem p(s, TE_DTYPE_F32, TE_ATTN_MASK_NONE, 3);
  AttnPtr m = make_attention(ctx_, p.options());
  HostTensor o = make_tensor(p.dt, qshape(s, s.heads));
  te_attention_forward_args a = p.args();
  te_attention_residuals r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  ASSERT_TE_OK(te_attention_forward_compute(ctx_, m.get(), &a, o.get(), &r));
  EXPECT_EQ(r.q.data, p.q.get()->data);
  EXPECT_EQ(r.o.data, o.get()->data);
  EXPECT_EQ(r.lse.dtype, TE_DTYPE_F32);
  EXPECT_EQ(r.lse.shape[0], s.tokens_q());
  EXPECT_EQ(r.lse.shape[1], s.heads);
  // Row 0, head 0: log sum_j exp(s_j) over all keys.
  const std::vector<double> q = p.q.values(), k = p.k.values();
  double l = 0;
  for (int64_t j = 0; j < s.skv; ++j) {
    double d = 0;
    for (int64_t c = 0; c < s.hd; ++c) d += q[c] * k[(j * s.kv_heads) * s.hd + c];
    l += std::exp(d / 8.0);
  }
  EXPECT_NEAR(static_cast<const float *>(r.lse.data)[0], std::log(l), 1e-5);
  te_attention_backward_ctx *bwd = nullptr;
  ASSERT_TE_OK(te_attention_forward_save(ctx_, m.get(), &r, &bwd));
  EXPECT_EQ(r.internal, nullptr);
  te_attention_backward_ctx_destroy(bwd);
  te_attention_residuals_release(&r);  // already saved: nothing happens
}

// ---- FP8 ----------------------------------------------------------------------------------

// FP8 error bounds against the high-precision fp64 reference: Q, K, V carry E4M3's relative
// step 2^-3 (half of it rounding), P another, so O stays within ~10% normwise; the backward adds
// dO and dS in E5M2 (step 2^-2) under HYBRID: 25% normwise.
constexpr double kFp8ForwardNorm = 0.10, kFp8BackwardNorm = 0.25;

void check_fp8(te_context *ctx, te_recipe_kind kind, te_attn_mask mask) {
  Shape s;
  s.sq = s.skv = 24;
  Problem p(s, TE_DTYPE_BF16, mask, 41);
  AttnPtr m = make_attention(ctx, p.options(1));
  RecipePtr recipe = make_recipe(kind);
  const RefOut r = p.ref();
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    Grads g;
    {
      AutocastScope scope(ctx, recipe.get());
      g = run(ctx, m.get(), p);
    }
    EXPECT_LT(rel_norm_error(g.o, r.o), kFp8ForwardNorm);
    EXPECT_LT(rel_norm_error(g.dq, r.dq), kFp8BackwardNorm);
    EXPECT_LT(rel_norm_error(g.dk, r.dk), kFp8BackwardNorm);
    EXPECT_LT(rel_norm_error(g.dv, r.dv), kFp8BackwardNorm);
    EXPECT_GT(rel_norm_error(g.o, r.o), 1e-4) << "FP8 attention gave high-precision numbers";
  }
  te_scaling_state_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  float hist[4] = {};
  ASSERT_TE_OK(te_attention_get_scaling_state(ctx, m.get(), TE_ATTN_S, &info, hist, 4));
  if (kind == TE_RECIPE_DELAYED_SCALING) {
    // The updates ran: S's scale comes from max P <= 1 (so >= 448), dS's from its amax.
    EXPECT_GT(info.amax_history_len, 0);
    EXPECT_GE(info.scale, 448.0f);
    ASSERT_TE_OK(te_attention_get_scaling_state(ctx, m.get(), TE_ATTN_DP, &info, hist, 4));
    EXPECT_NE(info.scale, 1.0f);
    EXPECT_EQ(info.fp8_dtype, TE_DTYPE_E5M2);
  } else {
    EXPECT_FLOAT_EQ(info.scale, 448.0f);  // P's bound amax 1
  }
}

TEST_F(AttentionTest, Fp8DelayedScalingWithinFp8Error) {
  check_fp8(ctx_, TE_RECIPE_DELAYED_SCALING, TE_ATTN_MASK_CAUSAL);
}
// The very first FP8 forward of a fresh module records its amaxes (the states get their amax
// slots at that forward's commit).
TEST_F(AttentionTest, Fp8FirstForwardRecordsAmaxes) {
  Shape s;
  Problem p(s, TE_DTYPE_BF16, TE_ATTN_MASK_CAUSAL, 43);
  AttnPtr m = make_attention(ctx_, p.options(1));
  RecipePtr recipe = make_recipe(TE_RECIPE_DELAYED_SCALING);
  AutocastScope scope(ctx_, recipe.get());
  HostTensor o = make_tensor(p.dt, qshape(s, s.heads));
  te_attention_forward_args a = p.args();
  te_attention_backward_ctx *bwd = nullptr;
  ASSERT_TE_OK(te_attention_forward(ctx_, m.get(), &a, o.get(), &bwd));
  AttnBwdPtr owned(bwd);
  double qmax = 0;
  for (double x : p.q.values()) qmax = std::max(qmax, std::fabs(x));
  te_scaling_state_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  float hist[2] = {};
  ASSERT_TE_OK(te_attention_get_scaling_state(ctx_, m.get(), TE_ATTN_Q, &info, hist, 2));
  EXPECT_EQ(hist[0], static_cast<float>(qmax));
  ASSERT_TE_OK(te_attention_get_scaling_state(ctx_, m.get(), TE_ATTN_S, &info, hist, 2));
  EXPECT_GT(hist[0], 0.0f);
  EXPECT_LE(hist[0], 1.0f);
}

TEST_F(AttentionTest, Fp8CurrentScalingWithinFp8Error) {
  check_fp8(ctx_, TE_RECIPE_CURRENT_SCALING, TE_ATTN_MASK_NONE);
}

// P's scale comes from its bound amax 1 and the recipe's options (448; 256 with power-of-2
// scales), made once per option pair: a backward still pending from a forward under one recipe
// runs as it would have alone after a forward under the other.
TEST_F(AttentionTest, Fp8PendingBackwardKeepsItsForwardsPScale) {
  Shape s;
  Problem p(s, TE_DTYPE_BF16, TE_ATTN_MASK_CAUSAL, 47);
  te_recipe_options plain_o = recipe_defaults(TE_RECIPE_CURRENT_SCALING), p2_o = plain_o;
  p2_o.power_of_2_scales = 1;
  RecipePtr plain = make_recipe(plain_o), p2 = make_recipe(p2_o);
  auto s_scale = [&](te_attention *m) {
    te_scaling_state_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    float hist[1] = {};
    EXPECT_TE_OK(te_attention_get_scaling_state(ctx_, m, TE_ATTN_S, &info, hist, 1));
    return info.scale;
  };
  AttnPtr fresh = make_attention(ctx_, p.options(1));
  Grads want;
  {
    AutocastScope scope(ctx_, plain.get());
    want = run(ctx_, fresh.get(), p);
  }
  AttnPtr m = make_attention(ctx_, p.options(1));
  te_attention_forward_args a = p.args();
  HostTensor o1 = make_tensor(p.dt, qshape(s, s.heads)), o2 = o1;
  te_attention_backward_ctx *b1 = nullptr, *b2 = nullptr;
  {
    AutocastScope scope(ctx_, plain.get());
    ASSERT_TE_OK(te_attention_forward(ctx_, m.get(), &a, o1.get(), &b1));
  }
  AttnBwdPtr owned1(b1);
  EXPECT_EQ(s_scale(m.get()), 448.0f);
  {
    AutocastScope scope(ctx_, p2.get());
    ASSERT_TE_OK(te_attention_forward(ctx_, m.get(), &a, o2.get(), &b2));
  }
  AttnBwdPtr owned2(b2);
  EXPECT_EQ(s_scale(m.get()), 256.0f);
  EXPECT_NE(o2.bytes, o1.bytes) << "the two P scales should quantize P differently";
  HostTensor dq = make_tensor(p.dt, qshape(s, s.heads)), dk = make_tensor(p.dt, kvshape(s)), dv = dk;
  te_attention_grads gr;
  ASSERT_TE_OK(te_attention_grads_init(&gr));
  gr.dq = dq.get(), gr.dk = dk.get(), gr.dv = dv.get();
  ASSERT_TE_OK(te_attention_backward(ctx_, b1, p.dout.get(), &gr, nullptr));
  EXPECT_TRUE(bitwise_equal(o1, want.o)) << "O";
  EXPECT_TRUE(bitwise_equal(dq, want.dq) && bitwise_equal(dk, want.dk) && bitwise_equal(dv, want.dv))
      << "the pending backward used another forward's P scale";
}

TEST_F(AttentionTest, Fp8OffByDefaultAndRefusedUnderBlockScaling) {
  Shape s;
  Problem p(s, TE_DTYPE_BF16, TE_ATTN_MASK_NONE, 2);
  AttnPtr hp = make_attention(ctx_, p.options(0));
  RecipePtr block = make_recipe(TE_RECIPE_BLOCK_SCALING);
  RecipePtr delayed = make_recipe(TE_RECIPE_DELAYED_SCALING);
  Grads plain = run(ctx_, hp.get(), p);
  {
    AutocastScope scope(ctx_, delayed.get());
    Grads in_scope = run(ctx_, hp.get(), p);
    EXPECT_EQ(plain.o.bytes, in_scope.o.bytes) << "fp8 = 0 must stay in high precision";
  }
  AttnPtr f8 = make_attention(ctx_, p.options(1));
  AutocastScope scope(ctx_, block.get());
  HostTensor o = make_tensor(p.dt, qshape(s, s.heads));
  const HostTensor before = o;
  te_attention_forward_args a = p.args();
  te_attention_backward_ctx *bwd = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_UNSUPPORTED, "te_attention_forward", "m", te_attention_forward(ctx_, f8.get(), &a, o.get(), &bwd));
  EXPECT_EQ(o.bytes, before.bytes);
  EXPECT_EQ(bwd, nullptr);
}

TEST_F(AttentionTest, StateRoundTripIsBitExact) {
  Shape s;
  Problem p(s, TE_DTYPE_BF16, TE_ATTN_MASK_CAUSAL, 9);
  AttnPtr m = make_attention(ctx_, p.options(1));
  RecipePtr recipe = make_recipe(TE_RECIPE_DELAYED_SCALING);
  for (int i = 0; i < 2; ++i) {
    AutocastScope scope(ctx_, recipe.get());
    run(ctx_, m.get(), p);
  }
  size_t size = 0;
  ASSERT_TE_OK(te_attention_state_save(ctx_, m.get(), nullptr, 0, &size));
  std::vector<unsigned char> buf(size);
  ASSERT_TE_OK(te_attention_state_save(ctx_, m.get(), buf.data(), buf.size(), &size));
  AttnPtr m2 = make_attention(ctx_, p.options(1));
  ASSERT_TE_OK(te_attention_state_load(ctx_, m2.get(), buf.data(), buf.size()));
  std::vector<unsigned char> buf2(size);
  ASSERT_TE_OK(te_attention_state_save(ctx_, m2.get(), buf2.data(), buf2.size(), &size));
  EXPECT_EQ(buf, buf2);
  Grads a, b;
  {
    AutocastScope scope(ctx_, recipe.get());
    a = run(ctx_, m.get(), p);
  }
  {
    AutocastScope scope(ctx_, recipe.get());
    b = run(ctx_, m2.get(), p);
  }
  EXPECT_EQ(a.o.bytes, b.o.bytes);
  EXPECT_EQ(a.dq.bytes, b.dq.bytes);
  // Another shape's state is refused.
  Problem other(Shape(), TE_DTYPE_BF16, TE_ATTN_MASK_CAUSAL, 9);
  te_attention_options o = other.options(1);
  o.num_kv_heads = 8;
  AttnPtr m3 = make_attention(ctx_, o);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_attention_state_load", nullptr,
                 te_attention_state_load(ctx_, m3.get(), buf.data(), buf.size()));
}

// ---- residuals in the caller's memory ---------------------------------------------------------

void check_caller_memory(te_context *ctx, te_recipe *recipe) {
  Shape s;
  s.batch = 3;
  s.lens_q = {5, 0, 16};
  s.lens_kv = {7, 3, 16};
  Problem p(s, TE_DTYPE_BF16, TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 13);
  AttnPtr m1 = make_attention(ctx, p.options(1)), m2 = make_attention(ctx, p.options(1));
  std::unique_ptr<AutocastScope> scope;
  if (recipe) scope = std::make_unique<AutocastScope>(ctx, recipe);
  Grads want = run(ctx, m1.get(), p);
  te_attention_forward_args a = p.args();
  size_t bytes = 0;
  ASSERT_TE_OK(te_attention_residuals_size(ctx, m2.get(), &a, &bytes));
  EXPECT_GE(bytes, static_cast<size_t>(s.tokens_q() * s.heads * 4));
  {  // shapes only: no data anywhere (a framework's fake tensors)
    te_tensor q = *p.q.get(), k = *p.k.get(), v = *p.v.get(), cq = *p.cu_q.get(), ckv = *p.cu_kv.get();
    q.data = k.data = v.data = cq.data = ckv.data = nullptr;
    te_attention_forward_args shapes = a;
    shapes.q = &q;
    shapes.k = &k;
    shapes.v = &v;
    shapes.cu_seqlens_q = &cq;
    shapes.cu_seqlens_kv = &ckv;
    size_t shape_bytes = 0;
    ASSERT_TE_OK(te_attention_residuals_size(ctx, m2.get(), &shapes, &shape_bytes));
    EXPECT_EQ(shape_bytes, bytes);
  }
  std::vector<double> block((bytes + 7) / 8);
  HostTensor o = make_tensor(p.dt, qshape(s, s.heads));
  ASSERT_TE_OK(te_attention_forward_compute_into(ctx, m2.get(), &a, o.get(), block.data(), bytes));
  EXPECT_EQ(o.bytes, want.o.bytes);
  HostTensor dq = make_tensor(p.dt, qshape(s, s.heads)), dk = make_tensor(p.dt, kvshape(s)),
             dv = make_tensor(p.dt, kvshape(s));
  te_attention_grads g;
  ASSERT_TE_OK(te_attention_grads_init(&g));
  g.dq = dq.get();
  g.dk = dk.get();
  g.dv = dv.get();
  // The inputs may have moved: pass copies.
  Problem moved = p;
  te_attention_forward_args in = moved.args();
  te_linear_backward_args once;
  ASSERT_TE_OK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;
  ASSERT_TE_OK(te_attention_backward_from(ctx, m2.get(), &in, o.get(), block.data(), bytes, p.dout.get(), &g, &once));
  EXPECT_EQ(dq.bytes, want.dq.bytes);
  EXPECT_EQ(dk.bytes, want.dk.bytes);
  EXPECT_EQ(dv.bytes, want.dv.bytes);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_attention_backward_from", "residuals",
                 te_attention_backward_from(ctx, m2.get(), &in, o.get(), block.data(), bytes, p.dout.get(), &g, nullptr));
}

TEST_F(AttentionTest, CallerMemoryEqualsOpaquePathHighPrecision) { check_caller_memory(ctx_, nullptr); }
TEST_F(AttentionTest, CallerMemoryEqualsOpaquePathFp8) {
  RecipePtr r = make_recipe(TE_RECIPE_DELAYED_SCALING);
  check_caller_memory(ctx_, r.get());
}

// ---- bad input ------------------------------------------------------------------------------

TEST_F(AttentionTest, BadOptionsAreNamed) {
  Problem p(Shape(), TE_DTYPE_BF16, TE_ATTN_MASK_NONE, 1);
  te_attention *m = nullptr;
  struct Case {
    const char *arg;
    void (*edit)(te_attention_options &);
  } cases[] = {
      {"num_heads", [](te_attention_options &o) { o.num_heads = 0; }},
      {"num_kv_heads", [](te_attention_options &o) { o.num_kv_heads = 3; }},
      {"num_kv_heads", [](te_attention_options &o) { o.num_kv_heads = 16; }},
      {"head_dim", [](te_attention_options &o) { o.head_dim = 12; }},
      {"head_dim", [](te_attention_options &o) { o.head_dim = 264; }},
      {"softmax_scale", [](te_attention_options &o) { o.softmax_scale = NAN; }},
      {"softmax_scale", [](te_attention_options &o) { o.softmax_scale = -1.0f; }},
      {"mask", [](te_attention_options &o) { std::memset(&o.mask, 0x7f, sizeof o.mask); }},
      {"activation_dtype", [](te_attention_options &o) { o.activation_dtype = TE_DTYPE_E4M3; }},
      {"fp8", [](te_attention_options &o) { o.fp8 = 2; }},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.arg);
    te_attention_options o = p.options();
    c.edit(o);
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_attention_create", c.arg, te_attention_create(&m, ctx_, &o));
    EXPECT_EQ(m, nullptr);
  }
}

TEST_F(AttentionTest, BadForwardArgumentsChangeNothing) {
  Shape s;
  s.batch = 2;
  s.lens_q = {3, 4};
  s.lens_kv = {3, 4};
  Problem p(s, TE_DTYPE_BF16, TE_ATTN_MASK_CAUSAL, 3);
  AttnPtr m = make_attention(ctx_, p.options());
  HostTensor o = make_tensor(p.dt, qshape(s, s.heads));
  const HostTensor before = o;
  auto expect_fail = [&](const char *arg, te_attention_forward_args a, te_tensor *out) {
    SCOPED_TRACE(arg);
    te_attention_backward_ctx *bwd = nullptr;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_attention_forward", arg, te_attention_forward(ctx_, m.get(), &a, out, &bwd));
    EXPECT_EQ(bwd, nullptr);
    EXPECT_EQ(o.bytes, before.bytes);
  };
  HostTensor wrong_heads = make_tensor(p.dt, {s.tokens_q(), 4, s.hd});
  te_attention_forward_args a = p.args();
  a.q = wrong_heads.get();
  expect_fail("q", a, o.get());
  HostTensor wrong_kv = make_tensor(p.dt, {s.tokens_kv(), 4, s.hd});
  a = p.args();
  a.k = wrong_kv.get();
  expect_fail("k", a, o.get());
  HostTensor wrong_hd = make_tensor(p.dt, {s.tokens_kv(), s.kv_heads, 32});
  a = p.args();
  a.v = wrong_hd.get();
  expect_fail("v", a, o.get());
  HostTensor f32 = make_tensor(TE_DTYPE_F32, qshape(s, s.heads));
  a = p.args();
  a.q = f32.get();
  expect_fail("q", a, o.get());
  a = p.args();
  a.cu_seqlens_kv = nullptr;
  expect_fail("cu_seqlens_kv", a, o.get());
  HostTensor decreasing = offsets({4, 3});
  int32_t bad[3] = {0, 5, 7};
  std::memcpy(decreasing.bytes.data(), bad, sizeof bad);  // 5 > max_seqlen 4
  a = p.args();
  a.cu_seqlens_q = decreasing.get();
  expect_fail("cu_seqlens_q", a, o.get());
  int32_t down[3] = {0, 4, 3};
  std::memcpy(decreasing.bytes.data(), down, sizeof down);
  expect_fail("cu_seqlens_q", a, o.get());
  int32_t late[3] = {1, 4, 7};
  std::memcpy(decreasing.bytes.data(), late, sizeof late);
  expect_fail("cu_seqlens_q", a, o.get());
  HostTensor short_end = offsets({3, 3});  // ends at 6, q has 7 tokens
  a = p.args();
  a.cu_seqlens_q = short_end.get();
  expect_fail("cu_seqlens_q", a, o.get());
  HostTensor float_offsets = make_tensor(TE_DTYPE_F32, {3});
  a = p.args();
  a.cu_seqlens_q = float_offsets.get();
  expect_fail("cu_seqlens_q", a, o.get());
  HostTensor three = offsets({3, 4, 0});
  a = p.args();
  a.cu_seqlens_kv = three.get();
  expect_fail("cu_seqlens_kv", a, o.get());
  a = p.args();
  a.max_seqlen_q = 0;
  expect_fail("max_seqlen_q", a, o.get());
  HostTensor wrong_o = make_tensor(p.dt, {s.tokens_q(), s.heads, s.hd * 2});
  a = p.args();
  expect_fail("o", a, wrong_o.get());
  // BSHD: q and k of different batch sizes.
  Problem bshd(Shape(), TE_DTYPE_BF16, TE_ATTN_MASK_NONE, 3);
  HostTensor k3 = make_tensor(p.dt, {3, 13, 2, 64});
  a = bshd.args();
  a.k = k3.get();
  HostTensor ob = make_tensor(p.dt, qshape(bshd.s, 8));
  te_attention_backward_ctx *bwd = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_attention_forward", "k", te_attention_forward(ctx_, m.get(), &a, ob.get(), &bwd));
}

TEST_F(AttentionTest, BadBackwardArgumentsChangeNothing) {
  Problem p(Shape(), TE_DTYPE_BF16, TE_ATTN_MASK_CAUSAL, 3);
  AttnPtr m = make_attention(ctx_, p.options());
  HostTensor o = make_tensor(p.dt, qshape(p.s, p.s.heads));
  te_attention_forward_args a = p.args();
  te_attention_backward_ctx *bwd = nullptr;
  ASSERT_TE_OK(te_attention_forward(ctx_, m.get(), &a, o.get(), &bwd));
  AttnBwdPtr owned(bwd);
  HostTensor dq = make_tensor(p.dt, qshape(p.s, p.s.heads));
  const HostTensor before = dq;
  te_attention_grads g;
  ASSERT_TE_OK(te_attention_grads_init(&g));
  g.dq = dq.get();
  HostTensor wrong = make_tensor(p.dt, {2, 13, 8, 32});
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_attention_backward", "d_o", te_attention_backward(ctx_, bwd, wrong.get(), &g, nullptr));
  HostTensor dk_wrong = make_tensor(p.dt, qshape(p.s, 8));  // q's shape, not k's
  g.dk = dk_wrong.get();
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_attention_backward", "dk", te_attention_backward(ctx_, bwd, p.dout.get(), &g, nullptr));
  EXPECT_EQ(dq.bytes, before.bytes);
  te_linear_backward_args once;
  ASSERT_TE_OK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;
  g.dk = nullptr;
  EXPECT_TE_OK(te_attention_backward(ctx_, bwd, p.dout.get(), &g, &once));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_STATE, "te_attention_backward", nullptr, te_attention_backward(ctx_, bwd, p.dout.get(), &g, nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_attention_get_scaling_state", "which",
                 te_attention_get_scaling_state(ctx_, m.get(), static_cast<te_attention_tensor>(9), nullptr, nullptr, 0));
}

// ---- RoPE -------------------------------------------------------------------------------

// The defined formula (te.h / numerics): cos and sin of the double angle rounded to float, then
// separately rounded fp32 products and sums, then the dtype.
void rope_reference(HostTensor &y, const HostTensor &x, const std::vector<float> &freqs, int64_t rot, bool interleaved,
                    bool inverse, const std::vector<int64_t> &pos, int64_t heads, int64_t hd) {
  const int64_t half = rot / 2;
  for (size_t t = 0; t < pos.size(); ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (static_cast<int64_t>(t) * heads + h) * hd;
      for (int64_t c = 0; c < hd; ++c) y.set(base + c, static_cast<float>(x.at(base + c)));
      for (int64_t k = 0; k < half; ++k) {
        const double ang = freqs[pos[t] * half + k];
        const float c = static_cast<float>(std::cos(ang));
        float s = static_cast<float>(std::sin(ang));
        if (inverse) s = -s;
        const int64_t i1 = interleaved ? 2 * k : k, i2 = interleaved ? 2 * k + 1 : k + half;
        const float x1 = static_cast<float>(x.at(base + i1)), x2 = static_cast<float>(x.at(base + i2));
        volatile float a1 = x1 * c, b1 = x2 * s, a2 = x2 * c, b2 = x1 * s;
        y.set(base + i1, a1 - b1);
        y.set(base + i2, a2 + b2);
      }
    }
}

TEST_F(AttentionTest, RopeIsTheDefinedRotationAndBackwardInvertsIt) {
  const int64_t heads = 3, hd = 64, positions = 40;
  for (bool thd : {false, true})
    for (bool interleaved : {false, true})
      for (int64_t rot : {64, 32}) {
        SCOPED_TRACE(testing::Message() << "thd " << thd << " interleaved " << interleaved << " rot " << rot);
        std::vector<float> f(static_cast<size_t>(positions * rot / 2));
        for (int64_t p = 0; p < positions; ++p)
          for (int64_t k = 0; k < rot / 2; ++k)
            f[p * rot / 2 + k] = static_cast<float>(p * std::pow(10000.0, -2.0 * k / rot));
        HostTensor freqs = make_tensor(TE_DTYPE_F32, {positions, rot / 2}, f);
        std::vector<int64_t> pos;
        HostTensor x, cu;
        if (thd) {
          std::vector<int32_t> lens = {5, 0, 31, 1};
          cu = offsets(lens);
          for (int32_t l : lens)
            for (int32_t i = 0; i < l; ++i) pos.push_back(i);
          x = random_tensor(TE_DTYPE_BF16, {static_cast<int64_t>(pos.size()), heads, hd}, -2, 2, 5);
        } else {
          for (int b = 0; b < 2; ++b)
            for (int i = 0; i < 17; ++i) pos.push_back(i);
          x = random_tensor(TE_DTYPE_BF16, {2, 17, heads, hd}, -2, 2, 5);
        }
        te_rope_options o;
        ASSERT_TE_OK(te_rope_options_init(&o));
        o.rot_dim = rot == hd ? 0 : static_cast<int32_t>(rot);
        o.interleaved = interleaved;
        HostTensor y = make_tensor(TE_DTYPE_BF16, std::vector<int64_t>(x.t.shape, x.t.shape + x.t.ndim));
        ASSERT_TE_OK(te_rope_forward(ctx_, &o, x.get(), freqs.get(), thd ? cu.get() : nullptr, y.get()));
        HostTensor want = y;
        rope_reference(want, x, f, rot, interleaved, false, pos, heads, hd);
        EXPECT_EQ(y.bytes, want.bytes);
        HostTensor back = y;  // in place
        ASSERT_TE_OK(te_rope_backward(ctx_, &o, back.get(), freqs.get(), thd ? cu.get() : nullptr, back.get()));
        rope_reference(want, y, f, rot, interleaved, true, pos, heads, hd);
        EXPECT_EQ(back.bytes, want.bytes);
        EXPECT_LT(rel_max_error(back, x.values()), 0.02);  // the inverse rotation, within BF16
      }
}

TEST_F(AttentionTest, RopeBadInput) {
  HostTensor x = random_tensor(TE_DTYPE_F32, {1, 8, 2, 16}, -1, 1, 1);
  HostTensor y = make_tensor(TE_DTYPE_F32, {1, 8, 2, 16});
  HostTensor freqs = random_tensor(TE_DTYPE_F32, {8, 8}, 0, 1, 2);
  HostTensor few = random_tensor(TE_DTYPE_F32, {4, 8}, 0, 1, 2);
  HostTensor wrong_cols = random_tensor(TE_DTYPE_F32, {8, 4}, 0, 1, 2);
  const HostTensor before = y;
  te_rope_options o;
  ASSERT_TE_OK(te_rope_options_init(&o));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_rope_forward", "freqs", te_rope_forward(ctx_, &o, x.get(), few.get(), nullptr, y.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_rope_forward", "freqs", te_rope_forward(ctx_, &o, x.get(), wrong_cols.get(), nullptr, y.get()));
  o.rot_dim = 7;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_rope_forward", "rot_dim", te_rope_forward(ctx_, &o, x.get(), freqs.get(), nullptr, y.get()));
  o.rot_dim = 0;
  o.interleaved = 5;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_rope_forward", "interleaved", te_rope_forward(ctx_, &o, x.get(), freqs.get(), nullptr, y.get()));
  o.interleaved = 0;
  HostTensor cu = offsets({4, 4});
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_rope_forward", "x", te_rope_forward(ctx_, &o, x.get(), freqs.get(), cu.get(), y.get()));
  HostTensor y3 = make_tensor(TE_DTYPE_F32, {1, 8, 2, 8});
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_rope_backward", "dx", te_rope_backward(ctx_, &o, x.get(), freqs.get(), nullptr, y3.get()));
  EXPECT_EQ(y.bytes, before.bytes);
}

}  // namespace
