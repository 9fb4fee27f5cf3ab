#include <cmath>

#include "modules/attention/attention.h"
#include "modules/common/validate.h"

namespace te {

namespace {

// An attention tensor: `dims` dimensions [..., heads, head_dim].
void check_heads(const TensorView &t, const ArgName &name, int dims, int64_t heads, const char *heads_name,
                 int64_t head_dim) {
  if (t.ndim != dims)
    fail(Status::InvalidArgument, "argument '%s': expected %d dimensions ([%s, %s, head_dim]), got %d",
         name.c_str(), dims,
         dims == 4 ? "batch, seq" : "tokens", heads_name, t.ndim);
  if (t.shape[dims - 2] != heads)
    fail(Status::InvalidArgument, "argument '%s': expected %s=%lld heads (dimension %d), got %lld",
         name.c_str(), heads_name,
         (long long)heads, dims - 2, (long long)t.shape[dims - 2]);
  if (t.shape[dims - 1] != head_dim)
    fail(Status::InvalidArgument, "argument '%s': expected head_dim=%lld (last dimension), got %lld", name.c_str(),
         (long long)head_dim, (long long)t.shape[dims - 1]);
}

// Offsets [batch + 1] of I32 on the device; on the CPU also their values.
void check_offsets(const TensorView &cu, const ArgName &name, int64_t tokens, int64_t max_len, const char *max_name,
                   const Device &dev) {
  check_tensor(cu, name, DType::I32, dev);
  if (cu.ndim != 1 || cu.shape[0] < 2)
    fail(Status::InvalidArgument, "argument '%s': expected 1 dimension [batch + 1] with batch >= 1, got %d dims of %lld",
         name.c_str(), cu.ndim, (long long)cu.shape[0]);
  if (dev.type != DeviceType::CPU || !cu.data) return;  // no data: a size query (shapes only)
  const int32_t *c = static_cast<const int32_t *>(cu.data);
  if (c[0] != 0)
    fail(Status::InvalidArgument, "argument '%s': expected offsets starting at 0, got %d", name.c_str(), c[0]);
  for (int64_t b = 0; b + 1 < cu.shape[0]; ++b) {
    const int64_t len = static_cast<int64_t>(c[b + 1]) - c[b];
    if (len < 0)
      fail(Status::InvalidArgument, "argument '%s': offsets must not decrease, got [%lld] = %d > [%lld] = %d",
           name.c_str(),
           (long long)b, c[b], (long long)(b + 1), c[b + 1]);
    if (len > max_len)
      fail(Status::InvalidArgument, "argument '%s': sequence %lld has %lld tokens, more than %s=%lld", name.c_str(),
           (long long)b, (long long)len, max_name, (long long)max_len);
  }
  if (c[cu.shape[0] - 1] != tokens)
    fail(Status::InvalidArgument, "argument '%s': the last offset must be the token count %lld, got %d", name.c_str(),
         (long long)tokens, c[cu.shape[0] - 1]);
}

}  // namespace

AttentionDims attention_validate(Context &ctx, const AttentionOptions &o, const AttentionInputs &in,
                                 const TensorView &out, const char *p) {
  const Device &dev = ctx.device();
  const DType dt = o.activation_dtype;
  check_tensor(in.q, ArgName(p, "q"), dt, dev);
  check_tensor(in.k, ArgName(p, "k"), dt, dev);
  check_tensor(in.v, ArgName(p, "v"), dt, dev);
  // Present = given (ndim > 0): a size query passes offsets of shape only, data NULL.
  const bool has_q = in.cu_seqlens_q.ndim > 0, has_kv = in.cu_seqlens_kv.ndim > 0;
  if (has_q != has_kv)
    fail(Status::InvalidArgument, "argument '%s->%s': NULL while '%s->%s' is given: THD needs both offsets", p,
         has_q ? "cu_seqlens_kv" : "cu_seqlens_q", p, has_q ? "cu_seqlens_q" : "cu_seqlens_kv");
  AttentionDims d;
  d.heads = o.heads;
  d.kv_heads = o.kv_heads;
  d.head_dim = o.head_dim;
  d.mask = o.mask;
  d.softmax_scale = o.softmax_scale;
  const int nd = has_q ? 3 : 4;
  check_heads(in.q, ArgName(p, "q"), nd, o.heads, "num_heads", o.head_dim);
  check_heads(in.k, ArgName(p, "k"), nd, o.kv_heads, "num_kv_heads", o.head_dim);
  check_same_shape(in.v, ArgName(p, "v"), in.k, ArgName(p, "k"));
  if (!has_q) {
    if (in.k.shape[0] != in.q.shape[0])
      fail(Status::InvalidArgument, "argument '%s->k': expected q's batch %lld (dimension 0), got %lld", p,
           (long long)in.q.shape[0], (long long)in.k.shape[0]);
    d.batch = in.q.shape[0];
    d.max_seq_q = in.q.shape[1];
    d.max_seq_kv = in.k.shape[1];
    d.tokens_q = d.batch * d.max_seq_q;
    d.tokens_kv = d.batch * d.max_seq_kv;
  } else {
    d.tokens_q = in.q.shape[0];
    d.tokens_kv = in.k.shape[0];
    if (in.max_seqlen_q < 1 || in.max_seqlen_q > d.tokens_q)
      fail(Status::InvalidArgument, "argument '%s->max_seqlen_q': expected 1..%lld (q's tokens), got %lld", p,
           (long long)d.tokens_q, (long long)in.max_seqlen_q);
    if (in.max_seqlen_kv < 1 || in.max_seqlen_kv > d.tokens_kv)
      fail(Status::InvalidArgument, "argument '%s->max_seqlen_kv': expected 1..%lld (k's tokens), got %lld", p,
           (long long)d.tokens_kv, (long long)in.max_seqlen_kv);
    check_offsets(in.cu_seqlens_q, ArgName(p, "cu_seqlens_q"), d.tokens_q, in.max_seqlen_q, "max_seqlen_q", dev);
    check_offsets(in.cu_seqlens_kv, ArgName(p, "cu_seqlens_kv"), d.tokens_kv, in.max_seqlen_kv, "max_seqlen_kv", dev);
    if (in.cu_seqlens_kv.shape[0] != in.cu_seqlens_q.shape[0])
      fail(Status::InvalidArgument, "argument '%s->cu_seqlens_kv': expected %lld offsets like cu_seqlens_q, got %lld", p,
           (long long)in.cu_seqlens_q.shape[0], (long long)in.cu_seqlens_kv.shape[0]);
    d.batch = in.cu_seqlens_q.shape[0] - 1;
    d.max_seq_q = in.max_seqlen_q;
    d.max_seq_kv = in.max_seqlen_kv;
    d.cu_seqlens_q = static_cast<const int32_t *>(in.cu_seqlens_q.data);
    d.cu_seqlens_kv = static_cast<const int32_t *>(in.cu_seqlens_kv.data);
  }
  if (out.data) {
    check_tensor(out, "o", dt, dev);
    check_same_shape(out, "o", in.q, ArgName(p, "q"));
  }
  return d;
}

namespace {

// FP8 attention needs a per-tensor recipe.
void check_fp8_recipe(const Recipe &r) {
  if (r.kind() == RecipeKind::Block)
    fail(Status::Unsupported, "argument 'm': FP8 attention needs per-tensor scaling (a DELAYED or CURRENT recipe); "
         "the innermost autocast scope uses block scaling (create the attention with fp8 = 0 to run it in high "
         "precision there)");
}

}  // namespace

AttentionSaved *attention_forward_compute(Context &ctx, Attention &m, const AttentionInputs &in, const TensorView &o) {
  AttentionCore &A = *m.core();
  const AttentionOptions &opt = A.opts;
  if (!o.data) fail(Status::InvalidArgument, "argument 'o->data': expected a non-NULL pointer, got NULL");
  const AttentionDims dims = attention_validate(ctx, opt, in, o, "args");
  Backend &be = ctx.backend();
  Autocast &ac = ctx.autocast();
  const ForwardMode mode = ForwardMode::of(ac);
  const bool fp8 = opt.fp8 && mode.fp8;
  if (fp8) check_fp8_recipe(*mode.recipe);
  const bool delayed = fp8 && mode.delayed();

  AttentionPools &pools = attention_pools(ctx);
  AttentionSaved *s = pools.saved.acquire(ctx);
  try {
    s->fp8 = fp8;
    s->dims = dims;
    s->o = o;
    s->lse = Buffer(&be, sizeof(float) * static_cast<size_t>(dims.tokens_q * dims.heads));
    AttentionForwardArgs fa;
    fa.dims = dims;
    fa.o = o;
    fa.lse = s->lse.floats();
    ScratchPlan plan;
    ScalingState::Staged staged[4];
    QuantizeRequest req;
    if (fp8) {
      const Recipe &r = *mode.recipe;
      req.recipe = &r;
      req.group = mode.group;
      const int64_t hd = dims.head_dim;
      s->q8.allocate(be, ScalingMode::PerTensor, DType::E4M3, dims.tokens_q * dims.heads, hd, true, false);
      s->k8.allocate(be, ScalingMode::PerTensor, DType::E4M3, dims.tokens_kv * dims.kv_heads, hd, true, false);
      s->v8.allocate(be, ScalingMode::PerTensor, DType::E4M3, dims.tokens_kv * dims.kv_heads, hd, true, false);
      s->s_scale = A.p_scale(be, r.options());
      for (int i = 0; i < 4; ++i) staged[i] = A.states[i].stage(be, ctx.amax_slots(), r, DType::E4M3);
      plan_quantize(be, req, in.q, s->q8, &plan);
      plan_quantize(be, req, in.k, s->k8, &plan);
      plan_quantize(be, req, in.v, s->v8, &plan);
      s->q = s->q8.row;
      s->k = s->k8.row;
      s->v = s->v8.row;
      fa.s_scale = s->s_scale;
      fa.s_scale_inv = s->s_scale + 1;
    } else {
      s->q = in.q;
      s->k = in.k;
      s->v = in.v;
    }
    fa.q = s->q;
    fa.k = s->k;
    fa.v = s->v;
    be.plan_attention_forward(fa, &plan);
    be.reserve(plan);
    if (delayed) ac.reserve_forward(4);

    if (fp8) {
      for (int i = 0; i < 4; ++i) A.states[i].commit(be, std::move(staged[i]));
      s->ticket = ac.enter_module();
      const TensorView hp[3] = {in.q, in.k, in.v};
      QuantizedMatrix *q8[3] = {&s->q8, &s->k8, &s->v8};
      QuantizeRequest reqs[3] = {req, req, req};
      for (int i = 0; i < 3; ++i) reqs[i].state = &A.states[i];
      quantize_many(be, reqs, hp, q8, 3);
      // P <= 1, so its scale comes from that bound under every recipe (s_scale, made once per
      // recipe options): no pass over the scores, and no first steps at the state's initial
      // scale 1, which would flush the P of long sequences (~1/seq) to zero. Delayed scaling
      // still records max P in S's state.
      ScalingState &S = A.state(AttnTensor::S);
      if (!delayed) be.copy(S.scale(), s->s_scale, 2 * sizeof(float));  // scale and scale_inv side by side
      // Only now: commit() gives a state used for the first time its amax slot.
      if (delayed) fa.s_amax = S.amax();
    }
    be.attention_forward(fa);
    if (delayed)
      for (int i = 0; i < 4; ++i) ac.register_forward(&A.states[i]);
  } catch (...) {
    pools.saved.release(s);
    throw;
  }
  s->layer = m.core();
  if (fp8) {
    s->recipe = RecipeRef(mode.recipe);
    s->group = GroupRef(mode.group);
  }
  return s;
}

}  // namespace te
