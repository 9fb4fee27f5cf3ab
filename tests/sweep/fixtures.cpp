// The sweep's fixture table: one VALID call per TE_API function of te.h, and what the header
// says about its arguments where the generic rules of sweep_main.cpp need to know:
//
//   .null_ok(path, words)     the header allows NULL there (its words, quoted)
//   .boolean / .not_boolean   how an int parameter is read (0/1 flags get the mutation 2)
//   .tensor(path, dt, shape)  the valid call's tensors (which tensor mutations apply)
//   .wrong_dtype(path, dt)    a valid dtype this argument cannot take, where the default
//                             (F32 <-> BF16, FP8 -> F32) would be valid or blame another argument
//   .inout / .filled          non-const struct arguments that are read / te_tensor outputs
//                             written as a whole
//   .valid(statuses, words)   the valid call cannot succeed in every build (NCCL)
//   .expect(glob, Expect)     a mutation whose documented outcome is not the default
//                             (INVALID_ARGUMENT naming the argument), with the header's words
//   .skip(glob, why)          a mutation that does not apply
//   .extra(name, fn, Expect)  hand-written mutations the types cannot suggest
//   .getter(Expect)           what a getter that cannot fail returns for bad arguments
//
// A function added to te.h without an entry here fails the sweep (case <function>__no_fixture).
#include <cmath>
#include <cstring>
#include <limits>

#include "dlpack_abi.h"
#include "sweep.h"

namespace sweep {

namespace {

using te_test::make_tensor;
using te_test::random_tensor;

constexpr int64_t N = World::N;
const auto IA = TE_ERROR_INVALID_ARGUMENT;
const auto IS = TE_ERROR_INVALID_STATE;
const auto UNSUP = TE_ERROR_UNSUPPORTED;
const auto OOM = TE_ERROR_OUT_OF_MEMORY;

HostTensor &input(World &w, te_dtype dt, std::vector<int64_t> shape, uint32_t seed) {
  return w.keep(random_tensor(dt, std::move(shape), -2, 2, seed));
}
// Outputs start as the 0xA5 sentinel.
HostTensor &output(World &w, te_dtype dt, std::vector<int64_t> shape,
                   te_scaling_mode mode = TE_SCALING_PER_TENSOR) {
  return w.keep(make_tensor(dt, std::move(shape), mode));
}

te_linear_forward_args &fwd_args(World &w) {
  te_linear_forward_args &a = w.keep(te_linear_forward_args{});
  w.ok(te_linear_forward_args_init(&a), "te_linear_forward_args_init");
  a.input = w.x.get();
  a.weight = w.w.get();
  a.bias = w.b.get();
  return a;
}

te_linear_residuals &new_residuals(World &w, te_linear *lin) {
  te_linear_residuals &r = w.keep(te_linear_residuals{});
  r.struct_size = sizeof r;
  HostTensor &y = output(w, TE_DTYPE_F32, {N, N});
  w.ok(te_linear_forward_compute(w.ctx, lin, &fwd_args(w), y.get(), &r), "te_linear_forward_compute (fixture)");
  return r;
}

std::vector<unsigned char> &saved_state(World &w, te_linear *lin) {
  size_t n = 0;
  w.ok(te_linear_state_save(w.ctx, lin, nullptr, 0, &n), "te_linear_state_save (size)");
  std::vector<unsigned char> &buf = w.keep(std::vector<unsigned char>(n));
  w.ok(te_linear_state_save(w.ctx, lin, buf.data(), n, &n), "te_linear_state_save");
  return buf;
}

te_quantize_options &quantize_opts(World &w) {
  te_quantize_options &o = w.keep(te_quantize_options{});
  w.ok(te_quantize_options_init(&o), "te_quantize_options_init");
  o.scale = &w.keep(2.0f);
  o.amax = &w.keep(0.0f);
  return o;
}

// A linear of a second context (and that context).
te_linear *other_context_linear(World &w, te_context **ctx2 = nullptr) {
  te_context *c2 = static_cast<te_context *>(w.make("te_context"));
  if (ctx2) *ctx2 = c2;
  te_linear_options o;
  std::memset(&o, 0, sizeof o);
  w.ok(te_linear_options_init(&o), "te_linear_options_init");
  o.in_features = N;
  o.out_features = N;
  o.activation_dtype = TE_DTYPE_F32;
  te_linear *l = nullptr;
  w.ok(te_linear_create(&l, c2, &o), "te_linear_create (other context)");
  return l;
}

// ---- grouped linear: three experts [16 -> 16], F32, bias ---------------------------------

te_grouped_linear_options &grouped_options(World &w) {
  te_grouped_linear_options &o = w.keep(te_grouped_linear_options{});
  w.ok(te_grouped_linear_options_init(&o), "te_grouped_linear_options_init");
  o.num_gemms = 3;
  o.in_features = N;
  o.out_features = N;
  o.activation_dtype = TE_DTYPE_F32;
  return o;
}

// A fresh layer on ctx; with watch_state, its saved state is part of what a bad call must not change.
te_grouped_linear *grouped_new(World &w, te_context *ctx, bool watch_state = true) {
  te_grouped_linear *g = nullptr;
  w.ok(te_grouped_linear_create(&g, ctx, &grouped_options(w)), "te_grouped_linear_create (fixture)");
  if (watch_state && g)
    w.add_state([&w, ctx, g]() -> std::string {
      size_t n = 0;
      if (te_grouped_linear_state_save(ctx, g, nullptr, 0, &n) != TE_SUCCESS) return "grouped state: size failed";
      std::vector<unsigned char> buf(n);
      if (te_grouped_linear_state_save(ctx, g, buf.data(), n, &n) != TE_SUCCESS) return "grouped state: save failed";
      std::string o = "grouped state: ";
      static const char *hex = "0123456789abcdef";
      for (unsigned char c : buf) o += std::string{hex[c >> 4], hex[c & 15]};
      return o;
    });
  return g;
}

// x = the world's x [16, 16] split {5, 0, 11}; every expert's W and b are the world's.
te_grouped_linear_forward_args &grouped_fwd_args(World &w) {
  te_grouped_linear_forward_args &a = w.keep(te_grouped_linear_forward_args{});
  w.ok(te_grouped_linear_forward_args_init(&a), "te_grouped_linear_forward_args_init");
  a.input = w.x.get();
  a.m_splits = w.keep(std::vector<int64_t>{5, 0, 11}).data();
  a.weights = w.keep(std::vector<const te_tensor *>(3, w.w.get())).data();
  a.biases = w.keep(std::vector<const te_tensor *>(3, w.b.get())).data();
  return a;
}

// Residuals of a forward in whatever scope is open.
te_grouped_linear_residuals &grouped_residuals(World &w, te_grouped_linear *g) {
  te_grouped_linear_residuals &r = w.keep(te_grouped_linear_residuals{});
  r.struct_size = sizeof r;
  HostTensor &y = output(w, TE_DTYPE_F32, {N, N});
  w.ok(te_grouped_linear_forward_compute(w.ctx, g, &grouped_fwd_args(w), y.get(), &r),
       "te_grouped_linear_forward_compute (fixture)");
  return r;
}

// A backward context of one forward of g on ctx: FP8 in a scope opened and closed here, or high
// precision (which changes no state and no counter of ctx).
te_grouped_linear_backward_ctx *grouped_backward_ctx(World &w, te_context *ctx, te_grouped_linear *g, bool fp8 = true) {
  te_autocast_options o;
  std::memset(&o, 0, sizeof o);
  w.ok(te_autocast_options_init(&o), "te_autocast_options_init");
  o.recipe = w.recipe;
  te_autocast_token t = 0;
  if (fp8) w.ok(te_autocast_begin(ctx, &o, &t), "te_autocast_begin (grouped fixture)");
  HostTensor &y = output(w, TE_DTYPE_F32, {N, N});
  te_grouped_linear_backward_ctx *b = nullptr;
  w.ok(te_grouped_linear_forward(ctx, g, &grouped_fwd_args(w), y.get(), &b), "te_grouped_linear_forward (fixture)");
  if (fp8) w.ok(te_autocast_end(ctx, t), "te_autocast_end (grouped fixture)");
  return b;
}

// A layer after one FP8 step (forward, scale update, backward), so that its states hold values.
te_grouped_linear *grouped_used(World &w, te_context *ctx) {
  te_grouped_linear *g = grouped_new(w, ctx);
  te_grouped_linear_backward_ctx *b = grouped_backward_ctx(w, ctx, g);
  HostTensor &dx = output(w, TE_DTYPE_F32, {N, N});
  w.ok(te_grouped_linear_backward(ctx, b, w.dy.get(), dx.get(), nullptr, nullptr, nullptr),
       "te_grouped_linear_backward (fixture)");
  te_grouped_linear_backward_ctx_destroy(b);
  return g;
}

std::vector<unsigned char> &grouped_saved_state(World &w, te_grouped_linear *g) {
  size_t n = 0;
  w.ok(te_grouped_linear_state_save(w.ctx, g, nullptr, 0, &n), "te_grouped_linear_state_save (size)");
  std::vector<unsigned char> &buf = w.keep(std::vector<unsigned char>(n));
  w.ok(te_grouped_linear_state_save(w.ctx, g, buf.data(), n, &n), "te_grouped_linear_state_save");
  return buf;
}

// ---- LayerNormLinear [16 -> 16] and LayerNormMLP [hidden 16, ffn 16, GELU]: F32, bias,
// LayerNorm; x, W, b and dy are the world's (every weight and bias of the MLP too) ------------

te_layernorm_linear_options &lnl_options(World &w) {
  te_layernorm_linear_options &o = w.keep(te_layernorm_linear_options{});
  w.ok(te_layernorm_linear_options_init(&o), "te_layernorm_linear_options_init");
  o.in_features = N;
  o.out_features = N;
  o.activation_dtype = TE_DTYPE_F32;
  return o;
}
te_layernorm_mlp_options &mlp_options(World &w) {
  te_layernorm_mlp_options &o = w.keep(te_layernorm_mlp_options{});
  w.ok(te_layernorm_mlp_options_init(&o), "te_layernorm_mlp_options_init");
  o.hidden_size = N;
  o.ffn_hidden_size = N;
  o.activation_dtype = TE_DTYPE_F32;
  return o;
}

// The saved state of a module as hex, for World::add_state.
template <class M, class Save>
std::string module_state_hex(const char *what, te_context *ctx, const M *m, Save save) {
  size_t n = 0;
  if (save(ctx, m, nullptr, 0, &n) != TE_SUCCESS) return std::string(what) + " state: size failed";
  std::vector<unsigned char> buf(n);
  if (save(ctx, m, buf.data(), n, &n) != TE_SUCCESS) return std::string(what) + " state: save failed";
  std::string o = std::string(what) + " state: ";
  static const char *hex = "0123456789abcdef";
  for (unsigned char c : buf) o += std::string{hex[c >> 4], hex[c & 15]};
  return o;
}

// A fresh module on ctx (options edited by `edit`); with watch_state, its saved state is part of
// what a bad call must not change.
te_layernorm_linear *lnl_new(World &w, te_context *ctx, bool watch_state = true,
                             std::function<void(te_layernorm_linear_options &)> edit = nullptr) {
  te_layernorm_linear_options &o = lnl_options(w);
  if (edit) edit(o);
  te_layernorm_linear *m = nullptr;
  w.ok(te_layernorm_linear_create(&m, ctx, &o), "te_layernorm_linear_create (fixture)");
  if (watch_state && m)
    w.add_state([ctx, m] { return module_state_hex("layernorm_linear", ctx, m, te_layernorm_linear_state_save); });
  return m;
}
te_layernorm_mlp *mlp_new(World &w, te_context *ctx, bool watch_state = true,
                          std::function<void(te_layernorm_mlp_options &)> edit = nullptr) {
  te_layernorm_mlp_options &o = mlp_options(w);
  if (edit) edit(o);
  te_layernorm_mlp *m = nullptr;
  w.ok(te_layernorm_mlp_create(&m, ctx, &o), "te_layernorm_mlp_create (fixture)");
  if (watch_state && m)
    w.add_state([ctx, m] { return module_state_hex("layernorm_mlp", ctx, m, te_layernorm_mlp_state_save); });
  return m;
}

// gamma [16] and beta [16], made once per case.
const te_tensor *ln_gamma(World &w) {
  auto it = w.values.find("ln_gamma");
  if (it != w.values.end()) return reinterpret_cast<const te_tensor *>(static_cast<uintptr_t>(it->second));
  const te_tensor *g = input(w, TE_DTYPE_F32, {N}, 70).get();
  w.values["ln_gamma"] = reinterpret_cast<uintptr_t>(g);
  return g;
}
const te_tensor *ln_beta(World &w) {
  auto it = w.values.find("ln_beta");
  if (it != w.values.end()) return reinterpret_cast<const te_tensor *>(static_cast<uintptr_t>(it->second));
  const te_tensor *b = input(w, TE_DTYPE_F32, {N}, 71).get();
  w.values["ln_beta"] = reinterpret_cast<uintptr_t>(b);
  return b;
}

te_layernorm_linear_forward_args &lnl_fwd_args(World &w) {
  te_layernorm_linear_forward_args &a = w.keep(te_layernorm_linear_forward_args{});
  w.ok(te_layernorm_linear_forward_args_init(&a), "te_layernorm_linear_forward_args_init");
  a.input = w.x.get();
  a.ln_weight = ln_gamma(w);
  a.ln_bias = ln_beta(w);
  a.weight = w.w.get();
  a.bias = w.b.get();
  a.ln_out = output(w, TE_DTYPE_F32, {N, N}).get();
  return a;
}
te_layernorm_mlp_forward_args &mlp_fwd_args(World &w) {
  te_layernorm_mlp_forward_args &a = w.keep(te_layernorm_mlp_forward_args{});
  w.ok(te_layernorm_mlp_forward_args_init(&a), "te_layernorm_mlp_forward_args_init");
  a.input = w.x.get();
  a.ln_weight = ln_gamma(w);
  a.ln_bias = ln_beta(w);
  a.fc1_weight = w.w.get();
  a.fc1_bias = w.b.get();
  a.fc2_weight = w.w.get();
  a.fc2_bias = w.b.get();
  a.ln_out = output(w, TE_DTYPE_F32, {N, N}).get();
  return a;
}

te_layernorm_linear_residuals &lnl_residuals(World &w, te_layernorm_linear *m) {
  te_layernorm_linear_residuals &r = w.keep(te_layernorm_linear_residuals{});
  r.struct_size = sizeof r;
  HostTensor &y = output(w, TE_DTYPE_F32, {N, N});
  w.ok(te_layernorm_linear_forward_compute(w.ctx, m, &lnl_fwd_args(w), y.get(), &r),
       "te_layernorm_linear_forward_compute (fixture)");
  return r;
}
te_layernorm_mlp_residuals &mlp_residuals(World &w, te_layernorm_mlp *m) {
  te_layernorm_mlp_residuals &r = w.keep(te_layernorm_mlp_residuals{});
  r.struct_size = sizeof r;
  HostTensor &y = output(w, TE_DTYPE_F32, {N, N});
  w.ok(te_layernorm_mlp_forward_compute(w.ctx, m, &mlp_fwd_args(w), y.get(), &r),
       "te_layernorm_mlp_forward_compute (fixture)");
  return r;
}

// A scope of ctx for a fixture's forward: enabled with the world's recipe (fp8), or, when a scope
// is open already, a disabled one (so that the forward is high precision and changes no pass).
struct FixtureScope {
  World &w;
  te_context *ctx;
  te_autocast_token tok = 0;
  bool open = false;
  FixtureScope(World &world, te_context *c, bool fp8) : w(world), ctx(c) {
    te_autocast_state st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    w.ok(te_autocast_get_state(ctx, &st), "te_autocast_get_state (fixture)");
    if (!fp8 && st.depth == 0) return;
    te_autocast_options o;
    std::memset(&o, 0, sizeof o);
    w.ok(te_autocast_options_init(&o), "te_autocast_options_init");
    o.recipe = w.recipe;
    o.enabled = fp8;
    open = w.ok(te_autocast_begin(ctx, &o, &tok), "te_autocast_begin (fixture)");
  }
  ~FixtureScope() {
    if (open) w.ok(te_autocast_end(ctx, tok), "te_autocast_end (fixture)");
  }
};

te_layernorm_linear_backward_ctx *lnl_backward_ctx(World &w, te_context *ctx, te_layernorm_linear *m, bool fp8 = true,
                                                   te_layernorm_linear_forward_args *args = nullptr) {
  FixtureScope scope(w, ctx, fp8);
  HostTensor &y = output(w, TE_DTYPE_F32, {N, N});
  te_layernorm_linear_backward_ctx *b = nullptr;
  w.ok(te_layernorm_linear_forward(ctx, m, args ? args : &lnl_fwd_args(w), y.get(), &b),
       "te_layernorm_linear_forward (fixture)");
  return b;
}
te_layernorm_mlp_backward_ctx *mlp_backward_ctx(World &w, te_context *ctx, te_layernorm_mlp *m, bool fp8 = true,
                                                te_layernorm_mlp_forward_args *args = nullptr) {
  FixtureScope scope(w, ctx, fp8);
  HostTensor &y = output(w, TE_DTYPE_F32, {N, N});
  te_layernorm_mlp_backward_ctx *b = nullptr;
  w.ok(te_layernorm_mlp_forward(ctx, m, args ? args : &mlp_fwd_args(w), y.get(), &b),
       "te_layernorm_mlp_forward (fixture)");
  return b;
}

// A module after one FP8 step (forward, scale update, backward), so that its states hold values.
te_layernorm_linear *lnl_used(World &w, te_context *ctx) {
  te_layernorm_linear *m = lnl_new(w, ctx);
  te_layernorm_linear_backward_ctx *b = lnl_backward_ctx(w, ctx, m);
  te_layernorm_linear_grads g;
  w.ok(te_layernorm_linear_grads_init(&g), "te_layernorm_linear_grads_init");
  g.dx = output(w, TE_DTYPE_F32, {N, N}).get();
  w.ok(te_layernorm_linear_backward(ctx, b, w.dy.get(), &g, nullptr), "te_layernorm_linear_backward (fixture)");
  te_layernorm_linear_backward_ctx_destroy(b);
  return m;
}
te_layernorm_mlp *mlp_used(World &w, te_context *ctx) {
  te_layernorm_mlp *m = mlp_new(w, ctx);
  te_layernorm_mlp_backward_ctx *b = mlp_backward_ctx(w, ctx, m);
  te_layernorm_mlp_grads g;
  w.ok(te_layernorm_mlp_grads_init(&g), "te_layernorm_mlp_grads_init");
  g.dx = output(w, TE_DTYPE_F32, {N, N}).get();
  w.ok(te_layernorm_mlp_backward(ctx, b, w.dy.get(), &g, nullptr), "te_layernorm_mlp_backward (fixture)");
  te_layernorm_mlp_backward_ctx_destroy(b);
  return m;
}

std::vector<unsigned char> &lnl_saved_state(World &w, te_layernorm_linear *m) {
  size_t n = 0;
  w.ok(te_layernorm_linear_state_save(w.ctx, m, nullptr, 0, &n), "te_layernorm_linear_state_save (size)");
  std::vector<unsigned char> &buf = w.keep(std::vector<unsigned char>(n));
  w.ok(te_layernorm_linear_state_save(w.ctx, m, buf.data(), n, &n), "te_layernorm_linear_state_save");
  return buf;
}
std::vector<unsigned char> &mlp_saved_state(World &w, te_layernorm_mlp *m) {
  size_t n = 0;
  w.ok(te_layernorm_mlp_state_save(w.ctx, m, nullptr, 0, &n), "te_layernorm_mlp_state_save (size)");
  std::vector<unsigned char> &buf = w.keep(std::vector<unsigned char>(n));
  w.ok(te_layernorm_mlp_state_save(w.ctx, m, buf.data(), n, &n), "te_layernorm_mlp_state_save");
  return buf;
}

// ---- Attention: 2 query heads, 1 kv head (GQA), head_dim 8, F32, causal, fp8 = 1 (the FP8
// path inside the world's delayed-scaling scopes). THD: q lengths {3, 5} (8 tokens, max 5), kv
// lengths {4, 4} (8 tokens, max 4); BSHD: batch 2, seq 4. RoPE: the same THD offsets ---------

constexpr int64_t AH = 2, AKV = 1, AD = 8, ATQ = 8, ATKV = 8;

te_attention_options &attn_options(World &w) {
  te_attention_options &o = w.keep(te_attention_options{});
  w.ok(te_attention_options_init(&o), "te_attention_options_init");
  o.num_heads = AH;
  o.num_kv_heads = AKV;
  o.head_dim = AD;
  o.mask = TE_ATTN_MASK_CAUSAL;
  o.activation_dtype = TE_DTYPE_F32;
  o.fp8 = 1;
  return o;
}

// A fresh attention on ctx (options edited by `edit`); with watch_state, its saved state is part
// of what a bad call must not change.
te_attention *attn_new(World &w, te_context *ctx, bool watch_state = true,
                       std::function<void(te_attention_options &)> edit = nullptr) {
  te_attention_options &o = attn_options(w);
  if (edit) edit(o);
  te_attention *m = nullptr;
  w.ok(te_attention_create(&m, ctx, &o), "te_attention_create (fixture)");
  if (watch_state && m)
    w.add_state([ctx, m] { return module_state_hex("attention", ctx, m, te_attention_state_save); });
  return m;
}

// I32 offsets [lens.size() + 1] from sequence lengths.
HostTensor &attn_offsets(World &w, std::vector<int32_t> lens) {
  HostTensor &h = w.keep(HostTensor(TE_DTYPE_I32, {static_cast<int64_t>(lens.size()) + 1}));
  int32_t acc = 0;
  std::memcpy(h.bytes.data(), &acc, 4);
  for (size_t i = 0; i < lens.size(); ++i) {
    acc += lens[i];
    std::memcpy(h.bytes.data() + 4 * (i + 1), &acc, 4);
  }
  return h;
}
// Offsets written out as given (decreasing, out of range, ...).
HostTensor &attn_raw_offsets(World &w, std::vector<int32_t> v) {
  HostTensor &h = w.keep(HostTensor(TE_DTYPE_I32, {static_cast<int64_t>(v.size())}));
  std::memcpy(h.bytes.data(), v.data(), 4 * v.size());
  return h;
}

// THD args (q [8, 2, 8], k and v [8, 1, 8]); the same tensors for every call of a case.
te_attention_forward_args &attn_thd_args(World &w) {
  te_attention_forward_args &a = w.keep(te_attention_forward_args{});
  w.ok(te_attention_forward_args_init(&a), "te_attention_forward_args_init");
  auto it = w.values.find("attn_q");
  if (it == w.values.end()) {
    w.values["attn_q"] = reinterpret_cast<uintptr_t>(input(w, TE_DTYPE_F32, {ATQ, AH, AD}, 90).get());
    w.values["attn_k"] = reinterpret_cast<uintptr_t>(input(w, TE_DTYPE_F32, {ATKV, AKV, AD}, 91).get());
    w.values["attn_v"] = reinterpret_cast<uintptr_t>(input(w, TE_DTYPE_F32, {ATKV, AKV, AD}, 92).get());
    w.values["attn_cu_q"] = reinterpret_cast<uintptr_t>(attn_offsets(w, {3, 5}).get());
    w.values["attn_cu_kv"] = reinterpret_cast<uintptr_t>(attn_offsets(w, {4, 4}).get());
  }
  auto t = [&w](const char *n) { return reinterpret_cast<const te_tensor *>(static_cast<uintptr_t>(w.values[n])); };
  a.q = t("attn_q");
  a.k = t("attn_k");
  a.v = t("attn_v");
  a.cu_seqlens_q = t("attn_cu_q");
  a.cu_seqlens_kv = t("attn_cu_kv");
  a.max_seqlen_q = 5;
  a.max_seqlen_kv = 4;
  return a;
}
// BSHD args (q [2, 4, 2, 8], k and v [2, 4, 1, 8]).
te_attention_forward_args &attn_bshd_args(World &w) {
  te_attention_forward_args &a = w.keep(te_attention_forward_args{});
  w.ok(te_attention_forward_args_init(&a), "te_attention_forward_args_init");
  a.q = input(w, TE_DTYPE_F32, {2, 4, AH, AD}, 93).get();
  a.k = input(w, TE_DTYPE_F32, {2, 4, AKV, AD}, 94).get();
  a.v = input(w, TE_DTYPE_F32, {2, 4, AKV, AD}, 95).get();
  return a;
}

HostTensor &attn_o(World &w) { return output(w, TE_DTYPE_F32, {ATQ, AH, AD}); }

// Residuals of a THD forward in whatever scope is open.
te_attention_residuals &attn_residuals(World &w, te_attention *m) {
  te_attention_residuals &r = w.keep(te_attention_residuals{});
  r.struct_size = sizeof r;
  w.ok(te_attention_forward_compute(w.ctx, m, &attn_thd_args(w), attn_o(w).get(), &r),
       "te_attention_forward_compute (fixture)");
  return r;
}

te_attention_backward_ctx *attn_backward_ctx(World &w, te_context *ctx, te_attention *m, bool fp8 = true,
                                             te_attention_forward_args *args = nullptr) {
  FixtureScope scope(w, ctx, fp8);
  te_attention_backward_ctx *b = nullptr;
  w.ok(te_attention_forward(ctx, m, args ? args : &attn_thd_args(w), attn_o(w).get(), &b),
       "te_attention_forward (fixture)");
  return b;
}

te_attention_grads &attn_grads(World &w) {
  te_attention_grads &g = w.keep(te_attention_grads{});
  w.ok(te_attention_grads_init(&g), "te_attention_grads_init");
  g.dq = output(w, TE_DTYPE_F32, {ATQ, AH, AD}).get();
  g.dk = output(w, TE_DTYPE_F32, {ATKV, AKV, AD}).get();
  g.dv = output(w, TE_DTYPE_F32, {ATKV, AKV, AD}).get();
  return g;
}

// An attention after one FP8 step (forward, scale update, backward): its six states hold values.
te_attention *attn_used(World &w, te_context *ctx) {
  te_attention *m = attn_new(w, ctx);
  te_attention_backward_ctx *b = attn_backward_ctx(w, ctx, m);
  HostTensor &dout = input(w, TE_DTYPE_F32, {ATQ, AH, AD}, 96);
  w.ok(te_attention_backward(ctx, b, dout.get(), &attn_grads(w), nullptr), "te_attention_backward (fixture)");
  te_attention_backward_ctx_destroy(b);
  return m;
}

std::vector<unsigned char> &attn_saved_state(World &w, te_attention *m) {
  size_t n = 0;
  w.ok(te_attention_state_save(w.ctx, m, nullptr, 0, &n), "te_attention_state_save (size)");
  std::vector<unsigned char> &buf = w.keep(std::vector<unsigned char>(n));
  w.ok(te_attention_state_save(w.ctx, m, buf.data(), n, &n), "te_attention_state_save");
  return buf;
}

// RoPE's input and output of either direction.
const te_tensor *&rope_in(args::te_rope_forward &a) { return a.x; }
const te_tensor *&rope_in(args::te_rope_backward &a) { return a.dy; }
te_tensor *&rope_out(args::te_rope_forward &a) { return a.y; }
te_tensor *&rope_out(args::te_rope_backward &a) { return a.dx; }

// ---- DLPack, written out from the spec (tests/api/dlpack_abi.h) --------------------------
using namespace dlpack;

// A uint8 [4, 8] CPU tensor (viewed as FP8), its shape and strides in arrays of 16.
struct DLFix {
  alignas(64) unsigned char buf[256] = {};
  int64_t shape[16] = {4, 8};
  int64_t strides[16] = {8, 1};
  DLManagedTensor m{};
  DLFix() {
    m.dl_tensor.data = buf;
    m.dl_tensor.device = {kDLCPU, 0};
    m.dl_tensor.ndim = 2;
    m.dl_tensor.dtype = {kDLUInt, 8, 1};
    m.dl_tensor.shape = shape;
  }
};
// The dl_managed_tensor of a te_tensor_from_dlpack call, copied so that a mutation leaves the
// valid one alone.
DLFix &dl_copy(World &w) { return w.emplace<DLFix>(); }

const char *kNcclWhy = "UNSUPPORTED in builds without NCCL or without a usable GPU";

// Every case of a function whose valid call is UNSUPPORTED in builds without NCCL.
Expect nccl_reject() { return reject({IA, UNSUP}, kNcclWhy); }

}  // namespace

const std::map<std::string, std::pair<bool, std::string>> &int_fields() {
  static const std::map<std::string, std::pair<bool, std::string>> m = {
      {"te_context_options.use_default_device", {true, "1 (default): CUDA 0 when usable, else the CPU"}},
      {"te_context_options.device.index", {false, "CUDA ordinal; 0 for the CPU"}},
      {"te_recipe_options.margin", {false, "0..127"}},
      {"te_recipe_options.amax_history_len", {false, "1..65536"}},
      {"te_recipe_options.reduce_amax", {true, "default 1"}},
      {"te_recipe_options.power_of_2_scales", {true, "keep only the scale's exponent"}},
      {"te_recipe_options.fprop_split_accumulator", {true, "default 0"}},
      {"te_recipe_options.dgrad_split_accumulator", {true, "default 1"}},
      {"te_recipe_options.wgrad_split_accumulator", {true, "default 1"}},
      {"te_group_nccl_options.timeout_ms", {false, "0: no limit"}},
      {"te_autocast_options.enabled", {true, "default 1"}},
      {"te_autocast_options.calibrating", {true, "default 0"}},
      {"te_linear_options.bias", {true, "default 1"}},
      {"te_linear_options.fuse_wgrad_accumulation", {true, "default 0; 1: ..."}},
      {"te_linear_forward_args.weight_unchanged", {true, "1: W is the same ...; default 0"}},
      {"te_linear_backward_args.flags", {false, "TE_BACKWARD_ONCE: a set of flags"}},
      {"te_grouped_linear_options.num_gemms", {false, "required, 1..TE_GROUPED_LINEAR_MAX_GEMMS"}},
      {"te_grouped_linear_options.bias", {true, "default 1"}},
      {"te_grouped_linear_options.fuse_wgrad_accumulation", {true, "default 0"}},
      {"te_grouped_linear_forward_args.weight_unchanged", {true, "every expert's FP8 weight may be reused"}},
      {"te_layernorm_linear_options.bias", {true, "default 1"}},
      {"te_layernorm_linear_options.fuse_wgrad_accumulation", {true, "default 0"}},
      {"te_layernorm_linear_options.zero_centered_gamma", {true, "default 0"}},
      {"te_layernorm_linear_forward_args.weight_unchanged", {true, "as te_linear_forward_args"}},
      {"te_layernorm_mlp_options.bias", {true, "default 1: fc1 and fc2 have biases"}},
      {"te_layernorm_mlp_options.fuse_wgrad_accumulation", {true, "default 0"}},
      {"te_layernorm_mlp_options.zero_centered_gamma", {true, "default 0"}},
      {"te_layernorm_mlp_forward_args.weight_unchanged", {true, "both FP8 weights may be reused"}},
      {"te_quantize_options.power_of_2_scales", {true, "keep only the exponent"}},
      {"te_gemm_options.transa", {true, "op(A) = A^T"}},
      {"te_gemm_options.transb", {true, "op(B) = B^T"}},
      {"te_gemm_options.accumulate", {true, "the result includes the old D"}},
      {"te_gemm_options.use_split_accumulator", {true, "FP8: promote partial sums"}},
      {"te_norm_options.zero_centered_gamma", {true, "default 0; 1: the scale applied is (1 + gamma)"}},
      {"te_attention_options.num_heads", {false, "required, > 0"}},
      {"te_attention_options.num_kv_heads", {false, "default 0: num_heads; must divide num_heads"}},
      {"te_attention_options.head_dim", {false, "required, a multiple of 8 in 8..256"}},
      {"te_attention_options.fp8", {true, "default 0: see above (TE's fp8_dpa)"}},
      {"te_attention_residuals.fp8", {true, "set by the forward: FP8 copies or the caller's"}},
      {"te_rope_options.rot_dim", {false, "default 0: head_dim; else even, in 2..head_dim"}},
      {"te_rope_options.interleaved", {true, "default 0"}},
      {"te_cross_entropy_options.ignore_index", {false, "default -100"}},
      {"te_adamw_param.weight_decay", {true, "1 (default): apply the options' weight decay; 0: not"}},
      {"te_adamw_param.owner_gemm", {false, "TE_MLP_FC1 / TE_MLP_FC2 for a te_layernorm_mlp"}},
  };
  return m;
}

const std::vector<Fixture> &fixtures() {
  static const std::vector<Fixture> table = [] {
    std::vector<Fixture> t;

    // ---- versions and errors --------------------------------------------------------------
    t.push_back(Def<args::te_version>([](World &, args::te_version &) {})
                    .check([](World &, const args::te_version &, const CallResult &r) {
                      return r.value == TE_VERSION_NUMBER ? "" : "not TE_VERSION_NUMBER";
                    }));
    t.push_back(Def<args::te_version_string>([](World &, args::te_version_string &) {})
                    .check([](World &, const args::te_version_string &, const CallResult &r) {
                      std::string want = std::to_string(TE_VERSION_MAJOR) + "." + std::to_string(TE_VERSION_MINOR) + "." +
                                         std::to_string(TE_VERSION_PATCH);
                      return r.text && want == r.text ? "" : "not MAJOR.MINOR.PATCH";
                    }));
    t.push_back(Def<args::te_status_string>([](World &, args::te_status_string &a) { a.status = TE_ERROR_INVALID_STATE; })
                    .getter(returns_text("TE_ERROR_UNKNOWN", "unknown values give \"TE_ERROR_UNKNOWN\""))
                    .check([](World &, const args::te_status_string &, const CallResult &r) {
                      return r.text && std::string(r.text) == "TE_ERROR_INVALID_STATE" ? "" : "wrong text";
                    }));
    t.push_back(Def<args::te_last_error>([](World &, args::te_last_error &) {})
                    .result_varies("the calling thread's last message")
                    .check([](World &, const args::te_last_error &, const CallResult &r) {
                      return r.text ? "" : "NULL";
                    }));

    // ---- tensors --------------------------------------------------------------------------
    t.push_back(
        Def<args::te_tensor_numel>([](World &w, args::te_tensor_numel &a) { a.t = input(w, TE_DTYPE_F32, {N, 2 * N}, 5).get(); })
            .tensor("t", TE_DTYPE_F32, {N, 2 * N})
            .getter(returns_value(0, "0 for NULL or bad ndim"))
            .expect("t:data_null", returns_as_valid("product of its shape: data does not enter"))
            .expect("t:dtype_*", returns_as_valid("product of its shape: the dtype does not enter"))
            .expect("t:device_*", returns_as_valid("product of its shape: the device does not enter"))
            .expect("t:dim_neg1", returns_value(0, "0 for NULL or bad ndim; a dimension < 1 is malformed: no count "
                                                   "of elements is negative"))
            // The count fits int64 but the F32 byte size does not: the product, or 0 for a tensor
            // no memory can hold.
            .expect("t:bytes_overflow", returns_one_of({int64_t(1) << 62, 0}, "product of its shape (2^62 fits "
                                                                              "int64); 0 for a malformed tensor"))
            .expect("t:bytes_wraps", returns_one_of({(N + (int64_t(1) << 57)) * 2 * N, 0},
                                                    "product of its shape (fits int64); 0 for a malformed tensor"))
            .expect("t:numel_*", returns_value(0, "Number of elements of t (product of its shape): not "
                                                  "representable in int64, so no count; 0 as for a bad tensor"))
            .check([](World &, const args::te_tensor_numel &, const CallResult &r) {
              return r.value == N * 2 * N ? "" : "wrong count";
            }));
    t.push_back(Def<args::te_tensor_scale_inv_count>([](World &w, args::te_tensor_scale_inv_count &a) {
                  a.count = &w.keep(int64_t(0));
                  a.t = output(w, TE_DTYPE_E4M3, {256, 256}, TE_SCALING_BLOCK_1X128).get();
                })
                    .tensor("t", TE_DTYPE_E4M3, {256, 256})
                    .expect("t:data_null", reject_or_accept("the count of floats t->scale_inv must hold: data "
                                                            "is not read (malformed tensors 'may' be rejected)"))
                    .expect("t:no_scale_inv", reject_or_accept("it sizes the scale_inv the caller is about to "
                                                               "allocate"))
                    .expect("t:device_*", reject_or_accept("the count for t's shape and scaling mode: the "
                                                           "device does not enter (malformed tensors 'may' be "
                                                           "rejected)"))
                    .check([](World &, const args::te_tensor_scale_inv_count &a, const CallResult &) {
                      return *a.count == 256 * 2 ? "" : "wrong count for 1x128 blocks of [256, 256]";
                    }));
    {
      auto dl = [](std::function<void(DLFix &, args::te_tensor_from_dlpack &)> m) {
        return [m](World &w, args::te_tensor_from_dlpack &a) {
          DLFix &f = dl_copy(w);
          m(f, a);
          a.dl_managed_tensor = &f.m;
        };
      };
      const std::string dn = "dl_managed_tensor";
      t.push_back(
          Def<args::te_tensor_from_dlpack>([](World &w, args::te_tensor_from_dlpack &a) {
            a.out = &w.keep(te_tensor{});
            a.dl_managed_tensor = &dl_copy(w).m;
            a.versioned = 0;
            a.fp8_dtype = TE_DTYPE_E4M3;
          })
              .filled("out")
              .not_boolean("versioned", "DLManagedTensorVersioned when `versioned` is non-zero: any non-zero "
                                        "value, not a 0/1 flag")
              .extra("dl_data_null", dl([](DLFix &f, auto &) { f.m.dl_tensor.data = nullptr; }), invalid(dn))
              .extra("dl_shape_null", dl([](DLFix &f, auto &) { f.m.dl_tensor.shape = nullptr; }), invalid(dn))
              .extra("dl_ndim_0", dl([](DLFix &f, auto &) { f.m.dl_tensor.ndim = 0; }), invalid(dn))
              .extra("dl_ndim_9", dl([](DLFix &f, auto &) {
                       f.m.dl_tensor.ndim = TE_MAX_DIMS + 1;
                       for (int i = 0; i < TE_MAX_DIMS + 1; ++i) f.shape[i] = 1;
                     }), invalid(dn))
              .extra("dl_dim_0", dl([](DLFix &f, auto &) { f.shape[1] = 0; }), invalid(dn))
              .extra("dl_dim_neg1", dl([](DLFix &f, auto &) { f.shape[1] = -1; }), invalid(dn))
              .extra("dl_numel_overflow", dl([](DLFix &f, auto &) { f.shape[0] = f.shape[1] = int64_t(1) << 40; }),
                     invalid(dn))
              .extra("dl_numel_wraps", dl([](DLFix &f, auto &) { f.shape[0] = 4 + (int64_t(1) << 61); }), invalid(dn))
              .extra("dl_bytes_overflow", dl([](DLFix &f, auto &) {
                       f.m.dl_tensor.dtype = {kDLFloat, 32, 1};
                       f.m.dl_tensor.ndim = 1;
                       f.shape[0] = int64_t(1) << 62;
                     }), invalid(dn))
              .extra("dl_strides_not_contiguous", dl([](DLFix &f, auto &) {
                       f.strides[0] = 1;
                       f.strides[1] = 4;
                       f.m.dl_tensor.strides = f.strides;
                     }), invalid(dn))
              .extra("dl_byte_offset_misaligned", dl([](DLFix &f, auto &) {
                       f.m.dl_tensor.dtype = {kDLFloat, 32, 1};
                       f.m.dl_tensor.byte_offset = 2;
                     }), invalid(dn))
              .extra("dl_byte_offset_wraps_address", dl([](DLFix &f, auto &) { f.m.dl_tensor.byte_offset = ~uint64_t(0); }),
                     invalid(dn))
              .extra("dl_device_unknown", dl([](DLFix &f, auto &) { f.m.dl_tensor.device = {kDLVulkan, 0}; }), invalid(dn))
              .extra("dl_dtype_float64", dl([](DLFix &f, auto &) { f.m.dl_tensor.dtype = {kDLFloat, 64, 1}; }), invalid(dn))
              .extra("dl_lanes_2", dl([](DLFix &f, auto &) { f.m.dl_tensor.dtype.lanes = 2; }), invalid(dn))
              .extra("fp8_dtype_f32", [](World &, args::te_tensor_from_dlpack &a) { a.fp8_dtype = TE_DTYPE_F32; },
                     invalid("fp8_dtype"))
              .extra("versioned_major_2",
                     [](World &w, args::te_tensor_from_dlpack &a) {
                       auto &v = w.keep(DLManagedTensorVersioned{});
                       auto &f = dl_copy(w);
                       v.version = {2, 0};
                       v.dl_tensor = f.m.dl_tensor;
                       v.dl_tensor.data = f.buf;
                       v.dl_tensor.shape = f.shape;
                       a.dl_managed_tensor = &v;
                       a.versioned = 1;
                     },
                     reject({UNSUP}, "UNSUPPORTED for a DLManagedTensorVersioned of a major version other than 1", dn))
              .check([](World &, const args::te_tensor_from_dlpack &a, const CallResult &) {
                const te_tensor &o = *a.out;
                return o.dtype == TE_DTYPE_E4M3 && o.ndim == 2 && o.shape[0] == 4 && o.shape[1] == 8 && o.data ? ""
                                                                                                                : "wrong tensor";
              }));
    }

    // ---- context --------------------------------------------------------------------------
    t.push_back(Def<args::te_context_options_init>([](World &w, args::te_context_options_init &a) {
      a.opts = &w.keep(te_context_options{});
    }));
    t.push_back(
        Def<args::te_context_create>([](World &w, args::te_context_create &a) {
          a.out = &w.keep<te_context *>(nullptr);
          te_context_options &o = w.keep(te_context_options{});
          w.ok(te_context_options_init(&o), "te_context_options_init");
          o.use_default_device = 0;
          o.device.type = TE_DEVICE_CPU;
          a.opts = &o;
        })
            .null_ok("opts", "opts may be NULL (defaults)")
            .extra("device_index_neg1",
                   [](World &w, args::te_context_create &a) {
                     te_context_options &o = w.keep(*a.opts);
                     o.device.index = -1;
                     a.opts = &o;
                   },
                   invalid("opts->device.index"))
            .extra("device_cuda_99",
                   [](World &w, args::te_context_create &a) {
                     te_context_options &o = w.keep(*a.opts);
                     o.device.type = TE_DEVICE_CUDA;
                     o.device.index = 99;
                     a.opts = &o;
                   },
                   reject({UNSUP}, "UNSUPPORTED (CUDA asked for, but this build has no CUDA backend or no such GPU)")));
    t.push_back(Def<args::te_context_destroy>([](World &w, args::te_context_destroy &a) {
      a.ctx = static_cast<te_context *>(w.make("te_context"));
    }));
    t.push_back(Def<args::te_context_get_device>([](World &w, args::te_context_get_device &a) {
                  a.ctx = w.ctx;
                  a.out = &w.keep(te_device{});
                }).check([](World &, const args::te_context_get_device &a, const CallResult &) {
      return a.out->type == TE_DEVICE_CPU && a.out->index == 0 ? "" : "not the CPU";
    }));
    t.push_back(Def<args::te_context_set_stream>([](World &w, args::te_context_set_stream &a) {
                  a.ctx = w.ctx;
                  a.stream = nullptr;
                })
                    .null_ok("stream", "NULL = the legacy default stream")
                    .extra("stream_on_cpu",
                           [](World &w, args::te_context_set_stream &a) { a.stream = w.block(64); },
                           invalid("stream")));
    t.push_back(Def<args::te_context_synchronize>([](World &w, args::te_context_synchronize &a) { a.ctx = w.ctx; }));
    t.push_back(
        Def<args::te_context_malloc>([](World &w, args::te_context_malloc &a) {
          a.ctx = w.ctx;
          a.bytes = 64;
          a.out = &w.keep<void *>(nullptr);
        })
            .expect("bytes:size_max", reject({IA, OOM}, "Errors: INVALID_ARGUMENT (bytes == 0), OUT_OF_MEMORY", "bytes"))
            .extra("bytes_0", [](World &, args::te_context_malloc &a) { a.bytes = 0; }, invalid("bytes"))
            .extra("bytes_size_max_minus_32", [](World &, args::te_context_malloc &a) { a.bytes = SIZE_MAX - 32; },
                   reject({IA, OOM}, "64-byte aligned host memory: rounding up must not wrap", "bytes"))
            .extra("bytes_2pow62", [](World &, args::te_context_malloc &a) { a.bytes = size_t(1) << 62; },
                   reject({IA, OOM}, "OUT_OF_MEMORY", "bytes"))
            .check([](World &, const args::te_context_malloc &a, const CallResult &) -> std::string {
              void *p = *a.out;
              if (!p) return "NULL block";
              if (reinterpret_cast<uintptr_t>(p) % 64) return "block not 64-byte aligned";
              std::memset(p, 1, 64);
              return "";
            }));
    t.push_back(
        Def<args::te_context_free>([](World &w, args::te_context_free &a) {
          a.ctx = w.ctx;
          void *p = nullptr;
          w.ok(te_context_malloc(w.ctx, 128, &p), "te_context_malloc");
          a.ptr = p;
        })
            .null_ok("ptr", "NULL is a no-op")
            .extra("ptr_foreign", [](World &w, args::te_context_free &a) { a.ptr = w.block(128); },
                   invalid("ptr"))
            .extra("ptr_interior", [](World &, args::te_context_free &a) { a.ptr = static_cast<char *>(a.ptr) + 64; },
                   invalid("ptr"))
            .extra("ptr_freed",
                   [](World &w, args::te_context_free &a) {
                     void *p = nullptr;
                     w.ok(te_context_malloc(w.ctx, 128, &p), "te_context_malloc");
                     w.ok(te_context_free(w.ctx, p), "te_context_free");
                     a.ptr = p;
                   },
                   invalid("ptr"))
            .extra("ptr_of_another_context",
                   [](World &w, args::te_context_free &a) {
                     te_context *c2 = static_cast<te_context *>(w.make("te_context"));
                     void *p = nullptr;
                     w.ok(te_context_malloc(c2, 128, &p), "te_context_malloc (other context)");
                     a.ptr = p;
                   },
                   invalid("ptr")));
    t.push_back(Def<args::te_context_copy>([](World &w, args::te_context_copy &a) {
                  a.ctx = w.ctx;
                  a.dst = w.block(64);
                  void *src = w.block(64);
                  std::memset(src, 0x5C, 64);
                  a.src = src;
                  a.bytes = 64;
                  a.kind = TE_COPY_HOST_TO_DEVICE;
                  w.watch(a.dst, 64, "dst");
                }).skip("bytes:size_max", "the library cannot know the sizes of the caller's buffers (on a CPU "
                                          "context every kind is a memcpy); the header bounds `bytes` nowhere"));
    t.push_back(Def<args::te_context_get_stats>([](World &w, args::te_context_get_stats &a) {
      a.ctx = w.ctx;
      te_context_stats &s = w.keep(te_context_stats{});
      s.struct_size = sizeof s;
      a.out = &s;
    }));

    // ---- recipes --------------------------------------------------------------------------
    t.push_back(Def<args::te_recipe_options_init>([](World &w, args::te_recipe_options_init &a) {
      a.opts = &w.keep(te_recipe_options{});
      a.kind = TE_RECIPE_CURRENT_SCALING;
    }));
    {
      auto with = [](std::function<void(te_recipe_options &)> m) {
        return [m](World &w, args::te_recipe_create &a) {
          te_recipe_options &o = w.keep(*a.opts);
          m(o);
          a.opts = &o;
        };
      };
      t.push_back(
          Def<args::te_recipe_create>([](World &w, args::te_recipe_create &a) {
            a.out = &w.keep<te_recipe *>(nullptr);
            te_recipe_options &o = w.keep(te_recipe_options{});
            w.ok(te_recipe_options_init(&o, TE_RECIPE_DELAYED_SCALING), "te_recipe_options_init");
            o.amax_history_len = 16;
            a.opts = &o;
          })
              .null_ok("opts", "opts NULL = default delayed scaling")
              .extra("margin_neg1", with([](te_recipe_options &o) { o.margin = -1; }), invalid("opts->margin"))
              .extra("margin_128", with([](te_recipe_options &o) { o.margin = 128; }), invalid("opts->margin"))
              .extra("amax_history_len_0", with([](te_recipe_options &o) { o.amax_history_len = 0; }),
                     invalid("opts->amax_history_len"))
              .extra("amax_history_len_65537", with([](te_recipe_options &o) { o.amax_history_len = 65537; }),
                     invalid("opts->amax_history_len"))
              .extra("amax_epsilon_neg1", with([](te_recipe_options &o) { o.amax_epsilon = -1.0f; }),
                     invalid("opts->amax_epsilon"))
              .extra("amax_epsilon_nan", with([](te_recipe_options &o) { o.amax_epsilon = std::nanf(""); }),
                     invalid("opts->amax_epsilon")));
    }
    t.push_back(Def<args::te_recipe_retain>([](World &w, args::te_recipe_retain &a) {
                  a.r = static_cast<te_recipe *>(w.make("te_recipe"));
                })
                    .getter(returns_null("NULL is a no-op (returns NULL); nothing else is a recipe to retain"))
                    .check([](World &, const args::te_recipe_retain &a, const CallResult &r) {
                      return r.pointer == a.r ? "" : "did not return r";
                    }));
    t.push_back(Def<args::te_recipe_release>([](World &w, args::te_recipe_release &a) {
      a.r = static_cast<te_recipe *>(w.make("te_recipe"));
    }));
    t.push_back(Def<args::te_recipe_key>([](World &w, args::te_recipe_key &a) { a.r = w.recipe; })
                    .getter(returns_value(0, "Never 0 for a valid recipe; 0 for NULL"))
                    .check([](World &, const args::te_recipe_key &, const CallResult &r) {
                      return r.value ? "" : "0 for a valid recipe";
                    }));
    t.push_back(Def<args::te_recipe_describe>([](World &w, args::te_recipe_describe &a) { a.r = w.recipe; })
                    .getter(returns_text("", "\"\" for NULL"))
                    .check([](World &, const args::te_recipe_describe &, const CallResult &r) {
                      return r.text && *r.text ? "" : "empty description";
                    }));
    t.push_back(Def<args::te_recipe_get_options>([](World &w, args::te_recipe_get_options &a) {
                  a.r = w.recipe;
                  te_recipe_options &o = w.keep(te_recipe_options{});
                  o.struct_size = sizeof o;
                  a.out = &o;
                }).check([](World &, const args::te_recipe_get_options &a, const CallResult &) {
      return a.out->amax_history_len == 16 ? "" : "not the recipe's amax_history_len";
    }));

    // ---- groups ---------------------------------------------------------------------------
    t.push_back(Def<args::te_group_create_single>([](World &w, args::te_group_create_single &a) {
      a.out = &w.keep<te_group *>(nullptr);
    }));
    t.push_back(Def<args::te_group_create_nccl>([](World &w, args::te_group_create_nccl &a) {
                  a.out = &w.keep<te_group *>(nullptr);
                  a.nccl_comm = w.block(64);  // no communicator can exist without NCCL
                })
                    .valid({UNSUP}, kNcclWhy)
                    .needs("no_nccl")
                    .expect("*", nccl_reject()));
    t.push_back(Def<args::te_nccl_get_unique_id>([](World &w, args::te_nccl_get_unique_id &a) {
                  a.out = &w.keep(te_nccl_id{});
                })
                    .valid({TE_SUCCESS, UNSUP}, "UNSUPPORTED: a valid request this build cannot do (no NCCL)")
                    .result_varies("a new id each call")
                    .expect("*", reject({IA, UNSUP}, "UNSUPPORTED in builds without NCCL")));
    t.push_back(Def<args::te_group_nccl_options_init>([](World &w, args::te_group_nccl_options_init &a) {
      a.opts = &w.keep(te_group_nccl_options{});
    }));
    {
      auto init_setup = [](World &w, te_group **&out, int32_t &rank, int32_t &nranks, const te_nccl_id *&id) {
        out = &w.keep<te_group *>(nullptr);
        rank = 0;
        nranks = 1;
        id = &w.keep(te_nccl_id{});
      };
      t.push_back(
          Def<args::te_group_init_nccl_with_options>([init_setup](World &w, args::te_group_init_nccl_with_options &a) {
            init_setup(w, a.out, a.rank, a.nranks, a.id);
            te_group_nccl_options &o = w.keep(te_group_nccl_options{});
            w.ok(te_group_nccl_options_init(&o), "te_group_nccl_options_init");
            o.timeout_ms = 1000;
            a.opts = &o;
          })
              .valid({UNSUP}, kNcclWhy)
              .needs("no_nccl")
              .null_ok("opts", "opts NULL: the defaults")
              .not_boolean("rank", "a rank, 0..nranks-1")
              .not_boolean("nranks", "a count of ranks")
              .expect("*", nccl_reject())
              .extra("rank_neg1", [](World &, auto &a) { a.rank = -1; }, reject({IA, UNSUP}, kNcclWhy, "rank"))
              .extra("rank_eq_nranks", [](World &, auto &a) { a.rank = 1; }, reject({IA, UNSUP}, kNcclWhy, "rank"))
              .extra("nranks_0", [](World &, auto &a) { a.nranks = 0; }, reject({IA, UNSUP}, kNcclWhy, "nranks|rank"))
              .extra("timeout_ms_neg1",
                     [](World &w, args::te_group_init_nccl_with_options &a) {
                       te_group_nccl_options &o = w.keep(*a.opts);
                       o.timeout_ms = -1;
                       a.opts = &o;
                     },
                     reject({IA, UNSUP}, kNcclWhy, "opts->timeout_ms")));
      t.push_back(Def<args::te_group_init_nccl>([init_setup](World &w, args::te_group_init_nccl &a) {
                    init_setup(w, a.out, a.rank, a.nranks, a.id);
                  })
                      .valid({UNSUP}, kNcclWhy)
                      .needs("no_nccl")
                      .not_boolean("rank", "a rank, 0..nranks-1")
                      .not_boolean("nranks", "a count of ranks")
                      .expect("*", nccl_reject())
                      .extra("rank_neg1", [](World &, auto &a) { a.rank = -1; }, reject({IA, UNSUP}, kNcclWhy, "rank"))
                      .extra("nranks_0", [](World &, auto &a) { a.nranks = 0; },
                             reject({IA, UNSUP}, kNcclWhy, "nranks|rank")));
    }
    t.push_back(Def<args::te_group_abort>([](World &w, args::te_group_abort &a) { a.g = w.group; })
                    .valid({IS}, "INVALID_STATE for a group that ... has no communicator (single-rank)"));
    t.push_back(Def<args::te_group_destroy>([](World &w, args::te_group_destroy &a) {
      a.g = static_cast<te_group *>(w.make("te_group"));
    }));
    t.push_back(Def<args::te_group_id>([](World &w, args::te_group_id &a) { a.g = w.group; })
                    .result_varies("a process-unique id")
                    .getter(returns_value(0, "never 0 (0 names the implicit single-rank group): nothing else "
                                             "is a group"))
                    .check([](World &, const args::te_group_id &, const CallResult &r) {
                      return r.value ? "" : "0 for a group";
                    }));
    t.push_back(Def<args::te_group_rank>([](World &w, args::te_group_rank &a) { a.g = w.group; })
                    .getter(returns_value(0, "0 for NULL")));
    t.push_back(Def<args::te_group_size>([](World &w, args::te_group_size &a) { a.g = w.group; })
                    .getter(returns_value(1, "1 for NULL")));

    // ---- autocast -------------------------------------------------------------------------
    t.push_back(Def<args::te_autocast_options_init>([](World &w, args::te_autocast_options_init &a) {
      a.opts = &w.keep(te_autocast_options{});
    }));
    t.push_back(Def<args::te_autocast_begin>([](World &w, args::te_autocast_begin &a) {
                  a.ctx = w.ctx;
                  te_autocast_options &o = w.keep(te_autocast_options{});
                  w.ok(te_autocast_options_init(&o), "te_autocast_options_init");
                  o.recipe = w.recipe;
                  o.group = w.group;
                  a.opts = &o;
                  a.token = &w.keep(te_autocast_token{0});
                })
                    .output_varies("token", "a process-wide counter: differs between the two worlds")
                    .null_ok("opts->recipe", "NULL = the default delayed-scaling recipe")
                    .null_ok("opts->group", "NULL = single-rank"));
    {
      auto token = [](std::function<te_autocast_token(World &, te_autocast_token valid)> f) {
        return [f](World &w, args::te_autocast_end &a) { a.token = f(w, a.token); };
      };
      const Expect wrong_token =
          reject({IS}, "Closes the innermost scope, which `token` must name (INVALID_STATE otherwise, with the "
                       "stack unchanged)");
      t.push_back(
          Def<args::te_autocast_end>([](World &w, args::te_autocast_end &a) {
            // outer scope, a scope opened and closed, then the inner scope the valid call closes
            a.ctx = w.ctx;
            te_autocast_options o;
            std::memset(&o, 0, sizeof o);
            w.ok(te_autocast_options_init(&o), "te_autocast_options_init");
            o.recipe = w.recipe;
            te_autocast_token outer = 0, closed = 0, inner = 0;
            w.ok(te_autocast_begin(w.ctx, &o, &outer), "te_autocast_begin (outer)");
            w.ok(te_autocast_begin(w.ctx, &o, &closed), "te_autocast_begin (closed)");
            w.ok(te_autocast_end(w.ctx, closed), "te_autocast_end (closed)");
            w.ok(te_autocast_begin(w.ctx, &o, &inner), "te_autocast_begin (inner)");
            w.values["outer"] = outer;
            w.values["closed"] = closed;
            a.token = inner;
          })
              .not_boolean("token", "identifies one open scope: the extras pass wrong ones")
              .extra("token_0", token([](World &, te_autocast_token) { return te_autocast_token(0); }), wrong_token)
              .extra("token_all_ones", token([](World &, te_autocast_token) { return ~te_autocast_token(0); }),
                     wrong_token)
              .extra("token_plus_1", token([](World &, te_autocast_token v) { return v + 1; }), wrong_token)
              .extra("token_of_outer_scope", token([](World &w, te_autocast_token) { return w.values["outer"]; }),
                     wrong_token)
              .extra("token_of_closed_scope", token([](World &w, te_autocast_token) { return w.values["closed"]; }),
                     wrong_token));
    }
    t.push_back(Def<args::te_autocast_get_state>([](World &w, args::te_autocast_get_state &a) {
                  a.ctx = w.ctx;
                  begin_fp8_scope(w);
                  te_autocast_state &s = w.keep(te_autocast_state{});
                  s.struct_size = sizeof s;
                  a.out = &s;
                }).check([](World &w, const args::te_autocast_get_state &a, const CallResult &) {
      return a.out->depth == 1 && a.out->enabled == 1 && a.out->recipe == w.recipe ? "" : "not the open scope";
    }));
    t.push_back(Def<args::te_autocast_flush_backward>([](World &w, args::te_autocast_flush_backward &a) { a.ctx = w.ctx; }));

    // ---- linear ---------------------------------------------------------------------------
    t.push_back(Def<args::te_linear_options_init>([](World &w, args::te_linear_options_init &a) {
      a.opts = &w.keep(te_linear_options{});
    }));
    {
      auto with = [](std::function<void(te_linear_options &)> m) {
        return [m](World &w, args::te_linear_create &a) {
          te_linear_options &o = w.keep(*a.opts);
          m(o);
          a.opts = &o;
        };
      };
      t.push_back(
          Def<args::te_linear_create>([](World &w, args::te_linear_create &a) {
            a.out = &w.keep<te_linear *>(nullptr);
            a.ctx = w.ctx;
            te_linear_options &o = w.keep(te_linear_options{});
            w.ok(te_linear_options_init(&o), "te_linear_options_init");
            o.in_features = 32;
            o.out_features = N;
            o.activation_dtype = TE_DTYPE_F32;
            a.opts = &o;
          })
              .extra("in_features_0", with([](te_linear_options &o) { o.in_features = 0; }), invalid("opts->in_features"))
              .extra("in_features_neg1", with([](te_linear_options &o) { o.in_features = -1; }),
                     invalid("opts->in_features"))
              .extra("out_features_0", with([](te_linear_options &o) { o.out_features = 0; }),
                     invalid("opts->out_features"))
              .extra("activation_dtype_e4m3", with([](te_linear_options &o) { o.activation_dtype = TE_DTYPE_E4M3; }),
                     invalid("opts->activation_dtype")));
    }
    t.push_back(Def<args::te_linear_destroy>([](World &w, args::te_linear_destroy &a) {
      a.lin = static_cast<te_linear *>(w.make("te_linear"));
    }));
    t.push_back(Def<args::te_linear_forward_args_init>([](World &w, args::te_linear_forward_args_init &a) {
      a.args = &w.keep(te_linear_forward_args{});
    }));
    {
      // forward_compute and forward: inside an enabled scope (the FP8 path records amaxes).
      auto fwd_common = [](auto d) {
        return d.tensor("args->input", TE_DTYPE_F32, {N, N})
            .tensor("args->weight", TE_DTYPE_F32, {N, N})
            .tensor("args->bias", TE_DTYPE_F32, {N})
            .tensor("y", TE_DTYPE_F32, {N, N});
      };
      t.push_back(fwd_common(Def<args::te_linear_forward_compute>([](World &w, args::te_linear_forward_compute &a) {
                               begin_fp8_scope(w);
                               a.ctx = w.ctx;
                               a.lin = w.lin;
                               a.args = &fwd_args(w);
                               a.y = w.y.get();
                               te_linear_residuals &r = w.keep(te_linear_residuals{});
                               r.struct_size = sizeof r;
                               a.residuals = &r;
                             }))
                      .extra("lin_of_another_context",
                             [](World &w, args::te_linear_forward_compute &a) { a.lin = other_context_linear(w); },
                             invalid("lin|ctx")));
      t.push_back(fwd_common(Def<args::te_linear_forward>([](World &w, args::te_linear_forward &a) {
                               begin_fp8_scope(w);
                               a.ctx = w.ctx;
                               a.lin = w.lin;
                               a.args = &fwd_args(w);
                               a.y = w.y.get();
                               a.out = &w.keep<te_linear_backward_ctx *>(nullptr);
                             }))
                      .extra("lin_of_another_context",
                             [](World &w, args::te_linear_forward &a) { a.lin = other_context_linear(w); },
                             invalid("lin|ctx")));
    }
    t.push_back(
        Def<args::te_linear_residuals_release>([](World &w, args::te_linear_residuals_release &a) {
          begin_fp8_scope(w);
          a.residuals = &new_residuals(w, w.lin);
        })
            .inout("residuals")
            .extra("internal_garbage",
                   [](World &w, args::te_linear_residuals_release &a) {
                     te_linear_residuals &c = w.keep(*a.residuals);
                     c.internal = w.block(64);
                     a.residuals = &c;
                   },
                   no_crash())
            .extra("internal_released_copy",
                   // A copy of residuals that were released, after new residuals were made: the
                   // release must not free the new ones (whatever `internal` now resolves to).
                   [](World &w, args::te_linear_residuals_release &a) {
                     te_linear_residuals &old = new_residuals(w, w.lin);
                     te_linear_residuals &copy = w.keep(old);
                     te_linear_residuals_release(&old);
                     te_linear_residuals &fresh = new_residuals(w, w.lin);
                     a.residuals = &copy;
                     w.post_check([&w, &fresh]() -> std::string {
                       te_linear_backward_ctx *b = nullptr;
                       te_status s = te_linear_forward_save(w.ctx, w.lin, &fresh, &b);
                       return s == TE_SUCCESS ? "" : std::string("residuals made after the released ones were freed by "
                                                                 "releasing a stale copy: te_linear_forward_save says ") +
                                                         te_last_error();
                     });
                   },
                   no_crash()));
    t.push_back(
        Def<args::te_linear_forward_save>([](World &w, args::te_linear_forward_save &a) {
          begin_fp8_scope(w);
          a.ctx = w.ctx;
          a.lin = w.lin;
          a.residuals = &new_residuals(w, w.lin);
          a.out = &w.keep<te_linear_backward_ctx *>(nullptr);
        })
            .inout("residuals")
            .extra("internal_null",
                   [](World &w, args::te_linear_forward_save &a) {
                     te_linear_residuals &c = w.keep(*a.residuals);
                     c.internal = nullptr;
                     a.residuals = &c;
                   },
                   invalid("residuals"))
            .extra("internal_garbage",
                   [](World &w, args::te_linear_forward_save &a) {
                     te_linear_residuals &c = w.keep(*a.residuals);
                     c.internal = w.block(64);
                     a.residuals = &c;
                   },
                   invalid("residuals"))
            .extra("internal_released_copy",
                   [](World &w, args::te_linear_forward_save &a) {
                     te_linear_residuals &old = new_residuals(w, w.lin);
                     te_linear_residuals &copy = w.keep(old);
                     te_linear_residuals_release(&old);
                     (void)new_residuals(w, w.lin);
                     a.residuals = &copy;
                   },
                   invalid("residuals"))
            .extra("already_saved_copy",
                   [](World &w, args::te_linear_forward_save &a) {
                     te_linear_residuals &old = new_residuals(w, w.lin);
                     te_linear_residuals &copy = w.keep(old);
                     te_linear_backward_ctx *b = nullptr;
                     w.ok(te_linear_forward_save(w.ctx, w.lin, &old, &b), "te_linear_forward_save (extra)");
                     a.residuals = &copy;
                   },
                   invalid("residuals"))
            .extra("residuals_of_another_linear",
                   [](World &w, args::te_linear_forward_save &a) { a.residuals = &new_residuals(w, w.lin_aux); },
                   invalid("residuals|lin")));
    t.push_back(Def<args::te_linear_backward_args_init>([](World &w, args::te_linear_backward_args_init &a) {
      a.args = &w.keep(te_linear_backward_args{});
    }));
    t.push_back(
        Def<args::te_linear_backward>([](World &w, args::te_linear_backward &a) {
          a.ctx = w.ctx;
          a.bwd = w.bwd;
          a.dy = w.dy.get();
          a.dx = w.dx.get();
          a.dw = w.dw.get();
          a.db = w.db.get();
          te_linear_backward_args &b = w.keep(te_linear_backward_args{});
          w.ok(te_linear_backward_args_init(&b), "te_linear_backward_args_init");
          a.args = &b;
        })
            .tensor("dy", TE_DTYPE_F32, {N, N})
            .tensor("dx", TE_DTYPE_F32, {N, N})
            .tensor("dw", TE_DTYPE_F32, {N, N})
            .tensor("db", TE_DTYPE_F32, {N})
            .null_ok("dx", "Any of dx, dw, db may be NULL to skip it")
            .null_ok("dw", "Any of dx, dw, db may be NULL to skip it")
            .null_ok("db", "Any of dx, dw, db may be NULL to skip it")
            .null_ok("args", "args may be NULL")
            .extra("flags_unknown",
                   [](World &w, args::te_linear_backward &a) {
                     te_linear_backward_args &b = w.keep(*a.args);
                     b.flags = 0x2;
                     a.args = &b;
                   },
                   invalid("args->flags"))
            .extra("bwd_once_already_run",
                   [](World &w, args::te_linear_backward &a) {
                     te_linear_forward_args &fa = fwd_args(w);
                     HostTensor &yy = output(w, TE_DTYPE_F32, {N, N});
                     te_linear_backward_ctx *b = nullptr;
                     w.ok(te_linear_forward(w.ctx, w.lin, &fa, yy.get(), &b), "te_linear_forward (extra)");
                     te_linear_backward_args ba;
                     w.ok(te_linear_backward_args_init(&ba), "te_linear_backward_args_init");
                     ba.flags = TE_BACKWARD_ONCE;
                     HostTensor &ddx = output(w, TE_DTYPE_F32, {N, N});
                     w.ok(te_linear_backward(w.ctx, b, w.dy.get(), ddx.get(), nullptr, nullptr, &ba),
                          "te_linear_backward (once)");
                     a.bwd = b;
                   },
                   reject({IS}, "unless TE_BACKWARD_ONCE was given (later calls: INVALID_STATE)"))
            .extra("bwd_of_another_context",
                   [](World &w, args::te_linear_backward &a) {
                     te_context *c2 = nullptr;
                     te_linear *l2 = other_context_linear(w, &c2);
                     HostTensor &yy = output(w, TE_DTYPE_F32, {N, N});
                     te_linear_backward_ctx *b = nullptr;
                     w.ok(te_linear_forward(c2, l2, &fwd_args(w), yy.get(), &b), "te_linear_forward (other context)");
                     a.bwd = b;
                   },
                   invalid("bwd|ctx")));
    t.push_back(Def<args::te_linear_backward_ctx_destroy>([](World &w, args::te_linear_backward_ctx_destroy &a) {
      a.bwd = static_cast<te_linear_backward_ctx *>(w.make("te_linear_backward_ctx"));
    }));
    t.push_back(Def<args::te_linear_get_scaling_state>([](World &w, args::te_linear_get_scaling_state &a) {
                  a.ctx = w.ctx;
                  a.lin = w.lin;
                  a.role = TE_ROLE_WEIGHT;
                  te_scaling_state_info &i = w.keep(te_scaling_state_info{});
                  i.struct_size = sizeof i;
                  a.info = &i;
                  std::vector<float> &h = w.keep(std::vector<float>(16, -7.0f));
                  a.history = h.data();
                  a.history_cap = h.size();
                  w.watch(h.data(), h.size() * sizeof(float), "history[16]");
                })
                    .null_ok("history", "`history` may be NULL")
                    .expect("history_cap:size_max",
                            accept("min(history_cap, amax_history_len) floats are written: the buffer holds "
                                   "amax_history_len (16)"))
                    .check([](World &, const args::te_linear_get_scaling_state &a, const CallResult &) {
                      return a.info->amax_history_len == 16 ? "" : "amax_history_len is not the recipe's 16";
                    }));
    t.push_back(Def<args::te_linear_state_save>([](World &w, args::te_linear_state_save &a) {
                  a.ctx = w.ctx;
                  a.lin = w.lin;
                  size_t n = 0;
                  w.ok(te_linear_state_save(w.ctx, w.lin, nullptr, 0, &n), "te_linear_state_save (size)");
                  a.buf = w.block(n);
                  a.capacity = n;
                  a.size = &w.keep(size_t(0));
                  w.watch(a.buf, n, "buf");
                })
                    .null_ok("buf", "With buf NULL, only *size is set to the bytes needed")
                    .expect("capacity:size_max", accept("capacity is the caller's buffer size: the state fits"))
                    .extra("capacity_short", [](World &, args::te_linear_state_save &a) { a.capacity -= 1; },
                           invalid("capacity")));
    {
      auto bytes = [](std::function<void(std::vector<unsigned char> &)> m) {
        return [m](World &w, args::te_linear_state_load &a) {
          const auto *p = static_cast<const unsigned char *>(a.buf);
          std::vector<unsigned char> &c = w.keep(std::vector<unsigned char>(p, p + a.size));
          m(c);
          a.buf = c.data();
          a.size = c.size();
        };
      };
      auto put32 = [](std::vector<unsigned char> &v, size_t at, int32_t x) { std::memcpy(v.data() + at, &x, 4); };
      // Layout (core/modules/linear/state_io.cpp, the versioned format): "TELS", u32 version,
      // i64 in, i64 out, then per state: i32 history_len, i32 fp8 dtype, f32 scale,
      // f32 scale_inv, history.
      const size_t first_state = 4 + 4 + 8 + 8;
      t.push_back(
          Def<args::te_linear_state_load>([](World &w, args::te_linear_state_load &a) {
            a.ctx = w.ctx;
            a.lin = w.lin;
            std::vector<unsigned char> &s = saved_state(w, w.lin);
            a.buf = s.data();
            a.size = s.size();
          })
              .expect("size:size_max", reject_or_accept("the buffer holds a whole state; the header bounds "
                                                        "nothing but truncation"))
              .extra("truncated", bytes([](std::vector<unsigned char> &v) { v.pop_back(); }), invalid("buf|size"))
              .extra("empty", [](World &, args::te_linear_state_load &a) { a.size = 0; }, invalid("buf|size"))
              .extra("bad_magic", bytes([](std::vector<unsigned char> &v) { v[0] = 'X'; }), invalid("buf"))
              .extra("other_version", bytes([](std::vector<unsigned char> &v) { v[4] ^= 0x40; }), invalid("buf"))
              .extra("other_shape",
                     [](World &w, args::te_linear_state_load &a) {
                       te_linear_options o;
                       std::memset(&o, 0, sizeof o);
                       w.ok(te_linear_options_init(&o), "te_linear_options_init");
                       o.in_features = 32;
                       o.out_features = N;
                       o.activation_dtype = TE_DTYPE_F32;
                       te_linear *l = nullptr;
                       w.ok(te_linear_create(&l, w.ctx, &o), "te_linear_create");
                       std::vector<unsigned char> &s = saved_state(w, l);
                       a.buf = s.data();
                       a.size = s.size();
                     },
                     invalid("buf|lin"))
              .extra("history_len_neg1", bytes([put32, first_state](std::vector<unsigned char> &v) { put32(v, first_state, -1); }),
                     invalid("buf"))
              .extra("history_len_huge",
                     bytes([put32, first_state](std::vector<unsigned char> &v) { put32(v, first_state, 0x7fffffff); }),
                     invalid("buf"))
              .extra("fp8_dtype_99", bytes([put32, first_state](std::vector<unsigned char> &v) { put32(v, first_state + 4, 99); }),
                     invalid("buf")));
    }

    // ---- activations ----------------------------------------------------------------------
    t.push_back(Def<args::te_activation_forward>([](World &w, args::te_activation_forward &a) {
                  a.ctx = w.ctx;
                  a.act = TE_ACTIVATION_GELU;
                  a.x = input(w, TE_DTYPE_F32, {4, 32}, 20).get();
                  a.y = output(w, TE_DTYPE_F32, {4, 32}).get();
                })
                    .tensor("x", TE_DTYPE_F32, {4, 32})
                    .tensor("y", TE_DTYPE_F32, {4, 32})
                    .wrong_dtype("x", TE_DTYPE_E4M3));
    t.push_back(Def<args::te_activation_backward>([](World &w, args::te_activation_backward &a) {
                  a.ctx = w.ctx;
                  a.act = TE_ACTIVATION_GELU;
                  a.x = input(w, TE_DTYPE_F32, {4, 32}, 21).get();
                  a.dy = input(w, TE_DTYPE_F32, {4, 32}, 22).get();
                  a.dx = output(w, TE_DTYPE_F32, {4, 32}).get();
                })
                    .tensor("x", TE_DTYPE_F32, {4, 32})
                    .tensor("dy", TE_DTYPE_F32, {4, 32})
                    .tensor("dx", TE_DTYPE_F32, {4, 32})
                    .wrong_dtype("x", TE_DTYPE_E4M3));

    // ---- primitives -----------------------------------------------------------------------
    t.push_back(Def<args::te_quantize_options_init>([](World &w, args::te_quantize_options_init &a) {
      a.opts = &w.keep(te_quantize_options{});
    }));
    {
      auto eps = [](float v) {
        return [v](World &w, auto &a) {
          te_quantize_options &o = w.keep(*a.opts);
          o.amax_epsilon = v;
          a.opts = &o;
        };
      };
      const char *eps_why = "a negative or infinite epsilon";
      t.push_back(Def<args::te_quantize>([](World &w, args::te_quantize &a) {
                    a.ctx = w.ctx;
                    a.x = input(w, TE_DTYPE_F32, {N, 32}, 23).get();
                    a.out = output(w, TE_DTYPE_E4M3, {N, 32}).get();
                    a.opts = &quantize_opts(w);
                  })
                      .tensor("x", TE_DTYPE_F32, {N, 32})
                      .tensor("out", TE_DTYPE_E4M3, {N, 32})
                      .wrong_dtype("x", TE_DTYPE_E4M3)
                      .null_ok("opts", "opts may be NULL (current scaling, epsilon 0)")
                      .null_ok("opts->scale", "NULL: compute it from x's amax (current scaling)")
                      .null_ok("opts->amax", "Optional: x's amax is max-accumulated into this float")
                      .extra("amax_epsilon_neg1", eps(-1.0f), reject({IA}, eps_why, "opts->amax_epsilon"))
                      .extra("amax_epsilon_inf", eps(INFINITY), reject({IA}, eps_why, "opts->amax_epsilon"))
                      .extra("amax_epsilon_nan", eps(std::nanf("")), reject({IA}, eps_why, "opts->amax_epsilon")));
      t.push_back(Def<args::te_cast_transpose>([](World &w, args::te_cast_transpose &a) {
                    a.ctx = w.ctx;
                    a.x = input(w, TE_DTYPE_F32, {N, 32}, 24).get();
                    a.out = output(w, TE_DTYPE_E4M3, {N, 32}).get();
                    a.out_t = output(w, TE_DTYPE_E4M3, {32, N}).get();
                    a.opts = &quantize_opts(w);
                  })
                      .tensor("x", TE_DTYPE_F32, {N, 32})
                      .tensor("out", TE_DTYPE_E4M3, {N, 32})
                      .tensor("out_t", TE_DTYPE_E4M3, {32, N})
                      .wrong_dtype("x", TE_DTYPE_E4M3)
                      .null_ok("out", "Either output may be NULL")
                      .null_ok("out_t", "Either output may be NULL")
                      .null_ok("opts", "opts may be NULL, as for te_quantize")
                      .null_ok("opts->scale", "NULL: compute it from x's amax (current scaling)")
                      .null_ok("opts->amax", "Optional: x's amax is max-accumulated into this float")
                      .extra("both_outputs_null",
                             [](World &, args::te_cast_transpose &a) {
                               a.out = nullptr;
                               a.out_t = nullptr;
                             },
                             invalid("out|out_t"))
                      .extra("amax_epsilon_neg1", eps(-1.0f), reject({IA}, eps_why, "opts->amax_epsilon")));
    }
    t.push_back(Def<args::te_dequantize>([](World &w, args::te_dequantize &a) {
                  a.ctx = w.ctx;
                  HostTensor &q = w.keep(make_tensor(TE_DTYPE_E4M3, {N, 32}, TE_SCALING_PER_TENSOR, 0x38));
                  q.scale_inv[0] = 0.5f;
                  a.x = q.get();
                  a.out = output(w, TE_DTYPE_F32, {N, 32}).get();
                })
                    .tensor("x", TE_DTYPE_E4M3, {N, 32})
                    .tensor("out", TE_DTYPE_F32, {N, 32})
                    .wrong_dtype("out", TE_DTYPE_E5M2));
    t.push_back(Def<args::te_amax>([](World &w, args::te_amax &a) {
                  a.ctx = w.ctx;
                  a.x = input(w, TE_DTYPE_F32, {N, 32}, 25).get();
                  a.amax = &w.keep(0.0f);
                })
                    .tensor("x", TE_DTYPE_F32, {N, 32})
                    .wrong_dtype("x", TE_DTYPE_E4M3));
    t.push_back(Def<args::te_gemm_options_init>([](World &w, args::te_gemm_options_init &a) {
      a.opts = &w.keep(te_gemm_options{});
    }));
    t.push_back(Def<args::te_gemm>([](World &w, args::te_gemm &a) {
                  a.ctx = w.ctx;
                  a.a = input(w, TE_DTYPE_F32, {N, 32}, 26).get();
                  a.b = input(w, TE_DTYPE_F32, {32, 64}, 27).get();
                  a.d = output(w, TE_DTYPE_F32, {N, 64}).get();
                  te_gemm_options &o = w.keep(te_gemm_options{});
                  w.ok(te_gemm_options_init(&o), "te_gemm_options_init");
                  o.epilogue = TE_EPILOGUE_BIAS_GELU;
                  o.bias = input(w, TE_DTYPE_F32, {64}, 28).get();
                  o.gelu_input = output(w, TE_DTYPE_F32, {N, 64}).get();
                  a.opts = &o;
                })
                    .tensor("a", TE_DTYPE_F32, {N, 32})
                    .tensor("b", TE_DTYPE_F32, {32, 64})
                    .tensor("d", TE_DTYPE_F32, {N, 64})
                    .tensor("opts->bias", TE_DTYPE_F32, {64})
                    .tensor("opts->gelu_input", TE_DTYPE_F32, {N, 64})
                    .null_ok("opts", "opts may be NULL: te_gemm_options_init's defaults")
                    .wrong_dtype("d", TE_DTYPE_E4M3)
                    .wrong_dtype("opts->bias", TE_DTYPE_E4M3)
                    .wrong_dtype("opts->gelu_input", TE_DTYPE_E4M3)
                    .null_ok("opts->gelu_input", "optional: pre-GELU values [m, n] for GELU epilogues")
                    .expect("a:dtype_wrong", invalid("a|b"))  // "A and B are both FP8 or both of one
                                                              // high-precision dtype": either may be blamed
                    .extra("bias_with_epilogue_none",
                           [](World &w, args::te_gemm &a) {
                             te_gemm_options &o = w.keep(*a.opts);
                             o.epilogue = TE_EPILOGUE_NONE;
                             o.gelu_input = nullptr;
                             a.opts = &o;
                           },
                           invalid("opts->bias")));

    // ---- normalization --------------------------------------------------------------------
    t.push_back(Def<args::te_norm_options_init>([](World &w, args::te_norm_options_init &a) {
      a.opts = &w.keep(te_norm_options{});
    }));
    t.push_back(Def<args::te_norm_forward_args_init>([](World &w, args::te_norm_forward_args_init &a) {
      a.args = &w.keep(te_norm_forward_args{});
    }));
    {
      // The valid forward: LayerNorm of x [16, 32] into an FP8 output, its transpose, mu, rsigma,
      // with a given scale and an amax.
      using F = args::te_norm_forward;
      auto opts_with = [](std::function<void(te_norm_options &)> m) {
        return [m](World &w, F &a) {
          te_norm_options &o = w.keep(*a.opts);
          m(o);
          a.opts = &o;
        };
      };
      auto args_with = [](std::function<void(World &, te_norm_forward_args &)> m) {
        return [m](World &w, F &a) {
          te_norm_forward_args &c = w.keep(*a.args);
          m(w, c);
          a.args = &c;
        };
      };
      auto quantize_with = [](std::function<void(te_quantize_options &)> m) {
        return [m](World &w, F &a) {
          te_norm_forward_args &c = w.keep(*a.args);
          te_quantize_options &q = w.keep(*c.quantize);
          m(q);
          c.quantize = &q;
          a.args = &c;
        };
      };
      auto rmsnorm = [](World &w, F &a) {
        te_norm_options &o = w.keep(*a.opts);
        o.kind = TE_NORM_RMSNORM;
        a.opts = &o;
        te_norm_forward_args &c = w.keep(*a.args);
        c.bias = nullptr;
        c.mu = nullptr;
        a.args = &c;
        return &c;
      };
      const char *eps_why = "eps: default 1e-5; finite and > 0";
      t.push_back(
          Def<F>([](World &w, F &a) {
            a.ctx = w.ctx;
            te_norm_options &o = w.keep(te_norm_options{});
            w.ok(te_norm_options_init(&o), "te_norm_options_init");
            a.opts = &o;
            te_norm_forward_args &g = w.keep(te_norm_forward_args{});
            w.ok(te_norm_forward_args_init(&g), "te_norm_forward_args_init");
            g.input = input(w, TE_DTYPE_F32, {N, 32}, 40).get();
            g.weight = input(w, TE_DTYPE_F32, {32}, 41).get();
            g.bias = input(w, TE_DTYPE_F32, {32}, 42).get();
            g.output = output(w, TE_DTYPE_E4M3, {N, 32}).get();
            g.output_t = output(w, TE_DTYPE_E4M3, {32, N}).get();
            g.mu = output(w, TE_DTYPE_F32, {N}).get();
            g.rsigma = output(w, TE_DTYPE_F32, {N}).get();
            te_quantize_options &q = quantize_opts(w);
            g.quantize = &q;
            w.watch(q.amax, sizeof(float), "args->quantize->amax");
            a.args = &g;
          })
              .tensor("args->input", TE_DTYPE_F32, {N, 32})
              .tensor("args->weight", TE_DTYPE_F32, {32})
              .tensor("args->bias", TE_DTYPE_F32, {32})
              .tensor("args->output", TE_DTYPE_E4M3, {N, 32})
              .tensor("args->output_t", TE_DTYPE_E4M3, {32, N})
              .tensor("args->mu", TE_DTYPE_F32, {N})
              .tensor("args->rsigma", TE_DTYPE_F32, {N})
              .wrong_dtype("args->input", TE_DTYPE_E4M3)
              // Any dtype but E4M3 is a valid output on its own: E5M2 conflicts with output_t.
              .wrong_dtype("args->output", TE_DTYPE_E5M2)
              .expect("args->output:dtype_wrong",
                      invalid("args->output|args->output_t"))  // "FP8 outputs of two dtypes": either may be blamed
              .null_ok("opts", "opts may be NULL (defaults)")
              .null_ok("args->output", "may be NULL when output_t is given")
              .null_ok("args->output_t", "optional FP8 [hidden, rows]")
              .null_ok("args->mu", "optional F32 [rows]: the means (LayerNorm only)")
              .null_ok("args->rsigma", "optional F32 [rows]: 1 / sqrt(var + eps)")
              .null_ok("args->quantize", "NULL (or quantize NULL): current scaling from y's own amax")
              .extra("eps_0", opts_with([](te_norm_options &o) { o.eps = 0.0f; }), reject({IA}, eps_why, "opts->eps"))
              .extra("eps_neg1", opts_with([](te_norm_options &o) { o.eps = -1.0f; }), reject({IA}, eps_why, "opts->eps"))
              .extra("eps_nan", opts_with([](te_norm_options &o) { o.eps = std::nanf(""); }),
                     reject({IA}, eps_why, "opts->eps"))
              .extra("eps_inf", opts_with([](te_norm_options &o) { o.eps = INFINITY; }),
                     reject({IA}, eps_why, "opts->eps"))
              .extra("rmsnorm_with_beta",
                     [rmsnorm](World &w, F &a) { rmsnorm(w, a)->bias = input(w, TE_DTYPE_F32, {32}, 43).get(); },
                     reject({IA}, "a beta given to RMSNorm", "args->bias"))
              .extra("rmsnorm_with_mu",
                     [rmsnorm](World &w, F &a) { rmsnorm(w, a)->mu = output(w, TE_DTYPE_F32, {N}).get(); },
                     reject({IA}, "mu with RMSNorm", "args->mu"))
              .extra("no_output_at_all", args_with([](World &, te_norm_forward_args &c) {
                       c.output = nullptr;
                       c.output_t = nullptr;
                     }),
                     reject({IA}, "no output at all", "args->output|args->output_t"))
              .extra("output_block_1x128", args_with([](World &w, te_norm_forward_args &c) {
                       c.output = output(w, TE_DTYPE_E4M3, {N, 32}, TE_SCALING_BLOCK_1X128).get();
                     }),
                     reject({IA}, "block scaling", "args->output"))
              .extra("output_t_block_128x128", args_with([](World &w, te_norm_forward_args &c) {
                       c.output_t = output(w, TE_DTYPE_E4M3, {32, N}, TE_SCALING_BLOCK_128X128).get();
                     }),
                     reject({IA}, "block scaling", "args->output_t"))
              .extra("output_t_not_transposed", args_with([](World &w, te_norm_forward_args &c) {
                       c.output_t = output(w, TE_DTYPE_E4M3, {N, 32}).get();
                     }),
                     reject({IA}, "optional FP8 [hidden, rows]", "args->output_t"))
              .extra("output_wrong_shape", args_with([](World &w, te_norm_forward_args &c) {
                       c.output = output(w, TE_DTYPE_E4M3, {32, N}).get();
                     }),
                     reject({IA}, "y [..., hidden] (or [rows, hidden])", "args->output"))
              .extra("fp8_outputs_of_two_dtypes", args_with([](World &w, te_norm_forward_args &c) {
                       c.output_t = output(w, TE_DTYPE_E5M2, {32, N}).get();
                     }),
                     reject({IA}, "FP8 outputs of two dtypes", "args->output|args->output_t"))
              .extra("scale_with_high_precision_output_only", args_with([](World &w, te_norm_forward_args &c) {
                       c.output = output(w, TE_DTYPE_F32, {N, 32}).get();
                       c.output_t = nullptr;
                     }),
                     reject({IA}, "a scale ... with a high-precision output only", "args->quantize->scale"))
              .extra("weight_wrong_shape", args_with([](World &w, te_norm_forward_args &c) {
                       c.weight = input(w, TE_DTYPE_F32, {33}, 44).get();
                     }),
                     reject({IA}, "gamma [hidden], x's dtype", "args->weight"))
              .extra("mu_wrong_shape", args_with([](World &w, te_norm_forward_args &c) {
                       c.mu = output(w, TE_DTYPE_F32, {N + 1}).get();
                     }),
                     reject({IA}, "optional F32 [rows]", "args->mu"))
              .extra("quantize_struct_size_0", quantize_with([](te_quantize_options &q) { q.struct_size = 0; }),
                     invalid("args->quantize"))
              .extra("quantize_amax_epsilon_neg1", quantize_with([](te_quantize_options &q) { q.amax_epsilon = -1.0f; }),
                     invalid("args->quantize->amax_epsilon"))
              .extra("quantize_amax_epsilon_inf",
                     quantize_with([](te_quantize_options &q) { q.amax_epsilon = INFINITY; }),
                     invalid("args->quantize->amax_epsilon"))
              .extra("quantize_power_of_2_scales_2",
                     quantize_with([](te_quantize_options &q) { q.power_of_2_scales = 2; }),
                     invalid("args->quantize->power_of_2_scales")));
    }
    {
      // The valid backward: LayerNorm of x [16, 32], all three gradients.
      using B = args::te_norm_backward;
      auto rms = [](World &w, B &a) {
        te_norm_options &o = w.keep(*a.opts);
        o.kind = TE_NORM_RMSNORM;
        a.opts = &o;
        a.mu = nullptr;
        a.dbeta = nullptr;
      };
      t.push_back(
          Def<B>([](World &w, B &a) {
            a.ctx = w.ctx;
            te_norm_options &o = w.keep(te_norm_options{});
            w.ok(te_norm_options_init(&o), "te_norm_options_init");
            a.opts = &o;
            a.dy = input(w, TE_DTYPE_F32, {N, 32}, 45).get();
            a.x = input(w, TE_DTYPE_F32, {N, 32}, 46).get();
            a.gamma = input(w, TE_DTYPE_F32, {32}, 47).get();
            a.mu = input(w, TE_DTYPE_F32, {N}, 48).get();
            a.rsigma = w.keep(random_tensor(TE_DTYPE_F32, {N}, 0.5f, 2.0f, 49)).get();
            a.dx = output(w, TE_DTYPE_F32, {N, 32}).get();
            a.dgamma = output(w, TE_DTYPE_F32, {32}).get();
            a.dbeta = output(w, TE_DTYPE_F32, {32}).get();
          })
              .tensor("dy", TE_DTYPE_F32, {N, 32})
              .tensor("x", TE_DTYPE_F32, {N, 32})
              .tensor("gamma", TE_DTYPE_F32, {32})
              .tensor("mu", TE_DTYPE_F32, {N})
              .tensor("rsigma", TE_DTYPE_F32, {N})
              .tensor("dx", TE_DTYPE_F32, {N, 32})
              .tensor("dgamma", TE_DTYPE_F32, {32})
              .tensor("dbeta", TE_DTYPE_F32, {32})
              .wrong_dtype("x", TE_DTYPE_E4M3)
              .null_ok("opts", "opts may be NULL (defaults)")
              .null_ok("dx", "each output may be NULL")
              .null_ok("dgamma", "each output may be NULL")
              .null_ok("dbeta", "each output may be NULL")
              .extra("eps_0",
                     [](World &w, B &a) {
                       te_norm_options &o = w.keep(*a.opts);
                       o.eps = 0.0f;
                       a.opts = &o;
                     },
                     reject({IA}, "eps: finite and > 0", "opts->eps"))
              .extra("rmsnorm_with_mu",
                     [rms](World &w, B &a) {
                       rms(w, a);
                       a.mu = input(w, TE_DTYPE_F32, {N}, 50).get();
                     },
                     reject({IA}, "mu: LayerNorm only, NULL for RMSNorm", "mu"))
              .extra("rmsnorm_with_dbeta",
                     [rms](World &w, B &a) {
                       rms(w, a);
                       a.dbeta = output(w, TE_DTYPE_F32, {32}).get();
                     },
                     reject({IA}, "dbeta [hidden] (LayerNorm only)", "dbeta"))
              .extra("dy_wrong_shape", [](World &w, B &a) { a.dy = input(w, TE_DTYPE_F32, {N, 16}, 51).get(); },
                     reject({IA}, "dy [..., hidden]", "dy"))
              .extra("gamma_wrong_shape", [](World &w, B &a) { a.gamma = input(w, TE_DTYPE_F32, {16}, 52).get(); },
                     reject({IA}, "gamma [hidden]", "gamma"))
              .extra("dgamma_wrong_shape", [](World &w, B &a) { a.dgamma = output(w, TE_DTYPE_F32, {2, 16}).get(); },
                     reject({IA}, "dgamma [hidden]", "dgamma")));
    }
    // ---- grouped linear -------------------------------------------------------------------
    // Three experts [16 -> 16], F32, bias, splits {5, 0, 11}: an expert padded under FP8 and an
    // empty one. The layers are made per case (grouped_used: after one FP8 step).
    t.push_back(Def<args::te_grouped_linear_options_init>([](World &w, args::te_grouped_linear_options_init &a) {
      a.opts = &w.keep(te_grouped_linear_options{});
    }));
    {
      auto with = [](std::function<void(te_grouped_linear_options &)> m) {
        return [m](World &w, args::te_grouped_linear_create &a) {
          te_grouped_linear_options &o = w.keep(*a.opts);
          m(o);
          a.opts = &o;
        };
      };
      using O = te_grouped_linear_options;
      t.push_back(
          Def<args::te_grouped_linear_create>([](World &w, args::te_grouped_linear_create &a) {
            a.out = &w.keep<te_grouped_linear *>(nullptr);
            a.ctx = w.ctx;
            a.opts = &grouped_options(w);
          })
              .extra("num_gemms_0", with([](O &o) { o.num_gemms = 0; }), invalid("opts->num_gemms"))
              .extra("num_gemms_above_max", with([](O &o) { o.num_gemms = TE_GROUPED_LINEAR_MAX_GEMMS + 1; }),
                     invalid("opts->num_gemms"))
              .extra("in_features_0", with([](O &o) { o.in_features = 0; }), invalid("opts->in_features"))
              .extra("out_features_neg1", with([](O &o) { o.out_features = -1; }), invalid("opts->out_features"))
              .extra("features_overflow", with([](O &o) { o.in_features = o.out_features = int64_t(1) << 31; }),
                     invalid("opts"))
              .extra("activation_dtype_e4m3", with([](O &o) { o.activation_dtype = TE_DTYPE_E4M3; }),
                     invalid("opts->activation_dtype")));
    }
    t.push_back(Def<args::te_grouped_linear_destroy>([](World &w, args::te_grouped_linear_destroy &a) {
      a.g = grouped_new(w, w.ctx);
    }));
    t.push_back(Def<args::te_grouped_linear_forward_args_init>([](World &w, args::te_grouped_linear_forward_args_init &a) {
      a.args = &w.keep(te_grouped_linear_forward_args{});
    }));
    {
      // forward_compute and forward: inside an enabled scope (the FP8 path, one expert padded).
      using A = te_grouped_linear_forward_args;
      auto args_with = [](std::function<void(World &, A &)> m) {
        return [m](World &w, auto &a) {
          A &c = w.keep(*a.args);
          m(w, c);
          a.args = &c;
        };
      };
      auto splits = [args_with](std::vector<int64_t> s) {
        return args_with([s](World &w, A &c) { c.m_splits = w.keep(s).data(); });
      };
      auto weight = [args_with](int i, std::function<const te_tensor *(World &)> t) {
        return args_with([i, t](World &w, A &c) {
          std::vector<const te_tensor *> &v = w.keep(std::vector<const te_tensor *>(c.weights, c.weights + 3));
          v[static_cast<size_t>(i)] = t(w);
          c.weights = v.data();
        });
      };
      auto common = [splits, weight, args_with](auto d) {
        return d.tensor("args->input", TE_DTYPE_F32, {N, N})
            .tensor("y", TE_DTYPE_F32, {N, N})
            .extra("m_splits_sum_short", splits({5, 0, 10}), invalid("args->m_splits"))
            .extra("m_splits_negative", splits({5, -1, 12}), invalid("args->m_splits[1]"))
            .extra("m_splits_sum_overflows", splits({INT64_MAX, INT64_MAX, 11}), invalid("args->m_splits"))
            .extra("weights_1_null", weight(1, [](World &) -> const te_tensor * { return nullptr; }),
                   invalid("args->weights[1]"))
            .extra("weights_2_wrong_shape",
                   weight(2, [](World &w) -> const te_tensor * { return input(w, TE_DTYPE_F32, {N, 32}, 60).get(); }),
                   invalid("args->weights[2]"))
            .extra("biases_0_wrong_shape",
                   args_with([](World &w, A &c) {
                     std::vector<const te_tensor *> &v = w.keep(std::vector<const te_tensor *>(c.biases, c.biases + 3));
                     v[0] = input(w, TE_DTYPE_F32, {1, N}, 61).get();
                     c.biases = v.data();
                   }),
                   invalid("args->biases[0]"));
      };
      t.push_back(common(Def<args::te_grouped_linear_forward_compute>(
                             [](World &w, args::te_grouped_linear_forward_compute &a) {
                               a.g = grouped_new(w, w.ctx);
                               begin_fp8_scope(w);
                               a.ctx = w.ctx;
                               a.args = &grouped_fwd_args(w);
                               a.y = w.y.get();
                               te_grouped_linear_residuals &r = w.keep(te_grouped_linear_residuals{});
                               r.struct_size = sizeof r;
                               a.residuals = &r;
                             }))
                      .extra("g_of_another_context",
                             [](World &w, args::te_grouped_linear_forward_compute &a) {
                               a.g = grouped_new(w, static_cast<te_context *>(w.make("te_context")), false);
                             },
                             invalid("g|ctx")));
      t.push_back(common(Def<args::te_grouped_linear_forward>([](World &w, args::te_grouped_linear_forward &a) {
                           a.g = grouped_new(w, w.ctx);
                           begin_fp8_scope(w);
                           a.ctx = w.ctx;
                           a.args = &grouped_fwd_args(w);
                           a.y = w.y.get();
                           a.out = &w.keep<te_grouped_linear_backward_ctx *>(nullptr);
                         }))
                      .extra("g_of_another_context",
                             [](World &w, args::te_grouped_linear_forward &a) {
                               a.g = grouped_new(w, static_cast<te_context *>(w.make("te_context")), false);
                             },
                             invalid("g|ctx"))
                      .extra("features_not_multiples_of_16_under_fp8",
                             [](World &w, args::te_grouped_linear_forward &a) {
                               te_grouped_linear_options &o = grouped_options(w);
                               o.in_features = 8;
                               te_grouped_linear *g = nullptr;
                               w.ok(te_grouped_linear_create(&g, w.ctx, &o), "te_grouped_linear_create (extra)");
                               A &c = w.keep(*a.args);
                               c.input = input(w, TE_DTYPE_F32, {N, 8}, 62).get();
                               HostTensor &wt = input(w, TE_DTYPE_F32, {N, 8}, 63);
                               c.weights = w.keep(std::vector<const te_tensor *>(3, wt.get())).data();
                               a.args = &c;
                               a.g = g;
                             },
                             reject({UNSUP}, "UNSUPPORTED (FP8 with in or out not a multiple of 16)", "g")));
    }
    t.push_back(
        Def<args::te_grouped_linear_residuals_release>([](World &w, args::te_grouped_linear_residuals_release &a) {
          te_grouped_linear *g = grouped_new(w, w.ctx);
          begin_fp8_scope(w);
          a.residuals = &grouped_residuals(w, g);
        })
            .inout("residuals")
            .extra("internal_garbage",
                   [](World &w, args::te_grouped_linear_residuals_release &a) {
                     te_grouped_linear_residuals &c = w.keep(*a.residuals);
                     c.internal = w.block(64);
                     a.residuals = &c;
                   },
                   no_crash())
            .extra("internal_of_a_linear",
                   // A te_linear's residuals handle in a grouped struct: another type, left alone.
                   [](World &w, args::te_grouped_linear_residuals_release &a) {
                     te_linear_residuals &lr = new_residuals(w, w.lin_aux);
                     te_grouped_linear_residuals &c = w.keep(*a.residuals);
                     c.internal = lr.internal;
                     a.residuals = &c;
                     w.post_check([&w, &lr]() -> std::string {
                       te_linear_backward_ctx *b = nullptr;
                       te_status s = te_linear_forward_save(w.ctx, w.lin_aux, &lr, &b);
                       return s == TE_SUCCESS ? "" : std::string("a te_linear's residuals were freed through "
                                                                 "te_grouped_linear_residuals_release: ") +
                                                         te_last_error();
                     });
                   },
                   no_crash()));
    {
      using R = args::te_grouped_linear_forward_save;
      t.push_back(
          Def<R>([](World &w, R &a) {
            a.g = grouped_new(w, w.ctx);
            begin_fp8_scope(w);
            a.ctx = w.ctx;
            a.residuals = &grouped_residuals(w, a.g);
            a.out = &w.keep<te_grouped_linear_backward_ctx *>(nullptr);
          })
              .inout("residuals")
              .extra("internal_null",
                     [](World &w, R &a) {
                       te_grouped_linear_residuals &c = w.keep(*a.residuals);
                       c.internal = nullptr;
                       a.residuals = &c;
                     },
                     invalid("residuals"))
              .extra("internal_garbage",
                     [](World &w, R &a) {
                       te_grouped_linear_residuals &c = w.keep(*a.residuals);
                       c.internal = w.block(64);
                       a.residuals = &c;
                     },
                     invalid("residuals"))
              .extra("already_saved_copy",
                     [](World &w, R &a) {
                       te_grouped_linear_residuals &old = grouped_residuals(w, a.g);
                       te_grouped_linear_residuals &copy = w.keep(old);
                       te_grouped_linear_backward_ctx *b = nullptr;
                       w.ok(te_grouped_linear_forward_save(w.ctx, a.g, &old, &b), "te_grouped_linear_forward_save");
                       a.residuals = &copy;
                     },
                     invalid("residuals"))
              .extra("residuals_of_another_layer",
                     [](World &w, R &a) { a.residuals = &grouped_residuals(w, grouped_new(w, w.ctx, false)); },
                     invalid("residuals|g")));
    }
    {
      using B = args::te_grouped_linear_backward;
      // dW and db arrays of the valid call: their tensors' bytes are outputs.
      auto grads = [](World &w, te_tensor *const **dw, te_tensor *const **db) {
        std::vector<te_tensor *> &vw = w.keep(std::vector<te_tensor *>());
        std::vector<te_tensor *> &vb = w.keep(std::vector<te_tensor *>());
        for (int i = 0; i < 3; ++i) {
          HostTensor &tw = output(w, TE_DTYPE_F32, {N, N}), &tb = output(w, TE_DTYPE_F32, {N});
          w.watch(tw.bytes.data(), tw.bytes.size(), "dw[" + std::to_string(i) + "]");
          w.watch(tb.bytes.data(), tb.bytes.size(), "db[" + std::to_string(i) + "]");
          vw.push_back(tw.get());
          vb.push_back(tb.get());
        }
        *dw = vw.data();
        *db = vb.data();
      };
      auto element = [](bool of_dw, int i, std::function<te_tensor *(World &)> t) {
        return [of_dw, i, t](World &w, B &a) {
          te_tensor *const *src = of_dw ? a.dw : a.db;
          std::vector<te_tensor *> &v = w.keep(std::vector<te_tensor *>(src, src + 3));
          v[static_cast<size_t>(i)] = t(w);
          (of_dw ? a.dw : a.db) = v.data();
        };
      };
      t.push_back(
          Def<B>([grads](World &w, B &a) {
            a.ctx = w.ctx;
            a.bwd = grouped_backward_ctx(w, w.ctx, grouped_used(w, w.ctx));
            a.dy = w.dy.get();
            a.dx = w.dx.get();
            grads(w, &a.dw, &a.db);
            te_linear_backward_args &b = w.keep(te_linear_backward_args{});
            w.ok(te_linear_backward_args_init(&b), "te_linear_backward_args_init");
            a.args = &b;
          })
              .tensor("dy", TE_DTYPE_F32, {N, N})
              .tensor("dx", TE_DTYPE_F32, {N, N})
              .null_ok("dx", "each array, and dx, may be NULL to skip it")
              .null_ok("dw", "each array, and dx, may be NULL to skip it")
              .null_ok("db", "each array, and dx, may be NULL to skip it")
              .null_ok("args", "args may be NULL (as te_linear_backward)")
              .extra("flags_unknown",
                     [](World &w, B &a) {
                       te_linear_backward_args &b = w.keep(*a.args);
                       b.flags = 0x2;
                       a.args = &b;
                     },
                     invalid("args->flags"))
              .extra("dw_1_null", element(true, 1, [](World &) -> te_tensor * { return nullptr; }), invalid("dw[1]"))
              .extra("dw_2_transposed",
                     element(true, 2, [](World &w) -> te_tensor * { return output(w, TE_DTYPE_F32, {N, 32}).get(); }),
                     invalid("dw[2]"))
              .extra("db_0_bf16",
                     element(false, 0, [](World &w) -> te_tensor * { return output(w, TE_DTYPE_BF16, {N}).get(); }),
                     invalid("db[0]"))
              .extra("dy_other_tokens", [](World &w, B &a) { a.dy = input(w, TE_DTYPE_F32, {2 * N, N}, 64).get(); },
                     invalid("dy"))
              .extra("db_without_bias",
                     [](World &w, B &a) {
                       te_grouped_linear_options &o = grouped_options(w);
                       o.bias = 0;
                       te_grouped_linear *g = nullptr;
                       w.ok(te_grouped_linear_create(&g, w.ctx, &o), "te_grouped_linear_create (no bias)");
                       te_grouped_linear_forward_args &fa = grouped_fwd_args(w);
                       fa.biases = nullptr;
                       HostTensor &yy = output(w, TE_DTYPE_F32, {N, N});
                       te_grouped_linear_backward_ctx *b = nullptr;
                       w.ok(te_grouped_linear_forward(w.ctx, g, &fa, yy.get(), &b), "te_grouped_linear_forward");
                       a.bwd = b;
                     },
                     reject({IA}, "db[i] [out]: layers with bias only", "db"))
              .extra("bwd_once_already_run",
                     [](World &w, B &a) {
                       te_grouped_linear_backward_ctx *b =
                           grouped_backward_ctx(w, w.ctx, grouped_new(w, w.ctx, false), false);
                       te_linear_backward_args ba;
                       w.ok(te_linear_backward_args_init(&ba), "te_linear_backward_args_init");
                       ba.flags = TE_BACKWARD_ONCE;
                       HostTensor &ddx = output(w, TE_DTYPE_F32, {N, N});
                       w.ok(te_grouped_linear_backward(w.ctx, b, w.dy.get(), ddx.get(), nullptr, nullptr, &ba),
                            "te_grouped_linear_backward (once)");
                       a.bwd = b;
                     },
                     reject({IS}, "TE_BACKWARD_ONCE frees it at the first (later calls: INVALID_STATE)"))
              .extra("bwd_of_another_context",
                     [](World &w, B &a) {
                       te_context *c2 = static_cast<te_context *>(w.make("te_context"));
                       a.bwd = grouped_backward_ctx(w, c2, grouped_new(w, c2, false));
                     },
                     invalid("bwd|ctx")));
    }
    t.push_back(
        Def<args::te_grouped_linear_backward_ctx_destroy>([](World &w, args::te_grouped_linear_backward_ctx_destroy &a) {
          a.bwd = grouped_backward_ctx(w, w.ctx, grouped_new(w, w.ctx, false), false);
        }));
    t.push_back(Def<args::te_grouped_linear_get_scaling_state>([](World &w, args::te_grouped_linear_get_scaling_state &a) {
                  a.ctx = w.ctx;
                  a.g = grouped_used(w, w.ctx);
                  a.expert = 2;
                  a.role = TE_ROLE_WEIGHT;
                  te_scaling_state_info &i = w.keep(te_scaling_state_info{});
                  i.struct_size = sizeof i;
                  a.info = &i;
                  std::vector<float> &h = w.keep(std::vector<float>(16, -7.0f));
                  a.history = h.data();
                  a.history_cap = h.size();
                  w.watch(h.data(), h.size() * sizeof(float), "history[16]");
                })
                    .not_boolean("expert", "`expert` in 0..num_gemms-1")
                    .null_ok("history", "`history` may be NULL (as te_linear_get_scaling_state)")
                    .expect("history_cap:size_max",
                            accept("min(history_cap, amax_history_len) floats are written: the buffer holds "
                                   "amax_history_len (16)"))
                    .extra("expert_neg1", [](World &, args::te_grouped_linear_get_scaling_state &a) { a.expert = -1; },
                           invalid("expert"))
                    .extra("expert_num_gemms", [](World &, args::te_grouped_linear_get_scaling_state &a) { a.expert = 3; },
                           invalid("expert"))
                    .check([](World &, const args::te_grouped_linear_get_scaling_state &a, const CallResult &) {
                      return a.info->amax_history_len == 16 ? "" : "amax_history_len is not the recipe's 16";
                    }));
    t.push_back(Def<args::te_grouped_linear_state_save>([](World &w, args::te_grouped_linear_state_save &a) {
                  a.ctx = w.ctx;
                  a.g = grouped_used(w, w.ctx);
                  size_t n = 0;
                  w.ok(te_grouped_linear_state_save(w.ctx, a.g, nullptr, 0, &n), "te_grouped_linear_state_save (size)");
                  a.buf = w.block(n);
                  a.capacity = n;
                  a.size = &w.keep(size_t(0));
                  w.watch(a.buf, n, "buf");
                })
                    .null_ok("buf", "With buf NULL, only *size is set to the bytes needed (as te_linear_state_save)")
                    .expect("capacity:size_max", accept("capacity is the caller's buffer size: the state fits"))
                    .extra("capacity_short", [](World &, args::te_grouped_linear_state_save &a) { a.capacity -= 1; },
                           invalid("capacity")));
    {
      using L = args::te_grouped_linear_state_load;
      auto bytes = [](std::function<void(std::vector<unsigned char> &)> m) {
        return [m](World &w, L &a) {
          const auto *p = static_cast<const unsigned char *>(a.buf);
          std::vector<unsigned char> &c = w.keep(std::vector<unsigned char>(p, p + a.size));
          m(c);
          a.buf = c.data();
          a.size = c.size();
        };
      };
      // Layout (core/modules/grouped_linear/pool_and_state.cpp): "TEGL", u32 version, i64
      // num_gemms, in, out, then per expert and role: i32 history_len, i32 fp8 dtype, f32 scale,
      // f32 scale_inv, history.
      const size_t first_state = 4 + 4 + 3 * 8;
      t.push_back(
          Def<L>([](World &w, L &a) {
            a.ctx = w.ctx;
            a.g = grouped_used(w, w.ctx);
            std::vector<unsigned char> &s = grouped_saved_state(w, a.g);
            a.buf = s.data();
            a.size = s.size();
          })
              .expect("size:size_max", reject_or_accept("the buffer holds a whole state; the header bounds "
                                                        "nothing but truncation"))
              .extra("truncated", bytes([](std::vector<unsigned char> &v) { v.pop_back(); }), invalid("buf|size"))
              .extra("empty", [](World &, L &a) { a.size = 0; }, invalid("buf|size"))
              .extra("bad_magic", bytes([](std::vector<unsigned char> &v) { v[0] = 'X'; }), invalid("buf"))
              .extra("a_linear_state", [](World &w, L &a) {
                       std::vector<unsigned char> &s = saved_state(w, w.lin);
                       a.buf = s.data();
                       a.size = s.size();
                     }, invalid("buf"))
              .extra("other_num_gemms",
                     [](World &w, L &a) {
                       te_grouped_linear_options &o = grouped_options(w);
                       o.num_gemms = 2;
                       te_grouped_linear *g = nullptr;
                       w.ok(te_grouped_linear_create(&g, w.ctx, &o), "te_grouped_linear_create (2 experts)");
                       std::vector<unsigned char> &s = grouped_saved_state(w, g);
                       a.buf = s.data();
                       a.size = s.size();
                     },
                     invalid("buf|g"))
              .extra("history_len_neg1",
                     bytes([first_state](std::vector<unsigned char> &v) {
                       const int32_t bad = -1;
                       std::memcpy(v.data() + first_state, &bad, 4);
                     }),
                     invalid("buf")));
    }
    // ---- LayerNormLinear and LayerNormMLP ----------------------------------------------------
    // Modules are made per case (lnl_/mlp_ helpers above): [16 -> 16] and [hidden 16, ffn 16,
    // GELU], F32, bias, LayerNorm, on the world's x, W, b, dy.
    {
      const char *eps_why = "eps: default 1e-5 (te_norm_options: finite and > 0)";
      auto lnl_with = [](std::function<void(te_layernorm_linear_options &)> m) {
        return [m](World &w, args::te_layernorm_linear_create &a) {
          te_layernorm_linear_options &o = w.keep(*a.opts);
          m(o);
          a.opts = &o;
        };
      };
      auto mlp_with = [](std::function<void(te_layernorm_mlp_options &)> m) {
        return [m](World &w, args::te_layernorm_mlp_create &a) {
          te_layernorm_mlp_options &o = w.keep(*a.opts);
          m(o);
          a.opts = &o;
        };
      };
      using LO = te_layernorm_linear_options;
      using MO = te_layernorm_mlp_options;
      t.push_back(Def<args::te_layernorm_linear_options_init>([](World &w, args::te_layernorm_linear_options_init &a) {
        a.opts = &w.keep(te_layernorm_linear_options{});
      }));
      t.push_back(Def<args::te_layernorm_mlp_options_init>([](World &w, args::te_layernorm_mlp_options_init &a) {
        a.opts = &w.keep(te_layernorm_mlp_options{});
      }));
      t.push_back(
          Def<args::te_layernorm_linear_create>([](World &w, args::te_layernorm_linear_create &a) {
            a.out = &w.keep<te_layernorm_linear *>(nullptr);
            a.ctx = w.ctx;
            a.opts = &lnl_options(w);
          })
              .extra("in_features_0", lnl_with([](LO &o) { o.in_features = 0; }), invalid("opts->in_features"))
              .extra("out_features_neg1", lnl_with([](LO &o) { o.out_features = -1; }), invalid("opts->out_features"))
              .extra("features_overflow", lnl_with([](LO &o) { o.in_features = o.out_features = int64_t(1) << 31; }),
                     invalid("opts"))
              .extra("activation_dtype_e4m3", lnl_with([](LO &o) { o.activation_dtype = TE_DTYPE_E4M3; }),
                     invalid("opts->activation_dtype"))
              .extra("eps_0", lnl_with([](LO &o) { o.eps = 0.0f; }), reject({IA}, eps_why, "opts->eps"))
              .extra("eps_neg", lnl_with([](LO &o) { o.eps = -1e-5f; }), reject({IA}, eps_why, "opts->eps"))
              .extra("eps_nan", lnl_with([](LO &o) { o.eps = std::nanf(""); }), reject({IA}, eps_why, "opts->eps"))
              .extra("eps_inf", lnl_with([](LO &o) { o.eps = INFINITY; }), reject({IA}, eps_why, "opts->eps")));
      t.push_back(
          Def<args::te_layernorm_mlp_create>([](World &w, args::te_layernorm_mlp_create &a) {
            a.out = &w.keep<te_layernorm_mlp *>(nullptr);
            a.ctx = w.ctx;
            a.opts = &mlp_options(w);
          })
              .extra("hidden_size_0", mlp_with([](MO &o) { o.hidden_size = 0; }), invalid("opts->hidden_size"))
              .extra("ffn_hidden_size_neg1", mlp_with([](MO &o) { o.ffn_hidden_size = -1; }),
                     invalid("opts->ffn_hidden_size"))
              .extra("sizes_overflow", mlp_with([](MO &o) { o.hidden_size = o.ffn_hidden_size = int64_t(1) << 31; }),
                     invalid("opts"))
              .extra("gated_sizes_overflow", mlp_with([](MO &o) {
                       o.activation = TE_ACTIVATION_SWIGLU;
                       o.hidden_size = o.ffn_hidden_size = int64_t(1) << 30;  // 2^60 elements, 2^61 gated
                     }),
                     invalid("opts"))
              .extra("activation_5", mlp_with([](MO &o) {
                       const int32_t v = 5;
                       std::memcpy(&o.activation, &v, sizeof v);
                     }),
                     invalid("opts->activation"))
              .extra("activation_dtype_e5m2", mlp_with([](MO &o) { o.activation_dtype = TE_DTYPE_E5M2; }),
                     invalid("opts->activation_dtype"))
              .extra("eps_0", mlp_with([](MO &o) { o.eps = 0.0f; }), reject({IA}, eps_why, "opts->eps"))
              .extra("eps_nan", mlp_with([](MO &o) { o.eps = std::nanf(""); }), reject({IA}, eps_why, "opts->eps"))
              .extra("eps_inf", mlp_with([](MO &o) { o.eps = -INFINITY; }), reject({IA}, eps_why, "opts->eps")));
      t.push_back(Def<args::te_layernorm_linear_destroy>([](World &w, args::te_layernorm_linear_destroy &a) {
        a.m = lnl_new(w, w.ctx, false);
      }));
      t.push_back(Def<args::te_layernorm_mlp_destroy>([](World &w, args::te_layernorm_mlp_destroy &a) {
        a.m = mlp_new(w, w.ctx, false);
      }));
      t.push_back(Def<args::te_layernorm_linear_forward_args_init>(
          [](World &w, args::te_layernorm_linear_forward_args_init &a) { a.args = &w.keep(te_layernorm_linear_forward_args{}); }));
      t.push_back(Def<args::te_layernorm_mlp_forward_args_init>(
          [](World &w, args::te_layernorm_mlp_forward_args_init &a) { a.args = &w.keep(te_layernorm_mlp_forward_args{}); }));
      t.push_back(Def<args::te_layernorm_linear_grads_init>(
          [](World &w, args::te_layernorm_linear_grads_init &a) { a.grads = &w.keep(te_layernorm_linear_grads{}); }));
      t.push_back(Def<args::te_layernorm_mlp_grads_init>(
          [](World &w, args::te_layernorm_mlp_grads_init &a) { a.grads = &w.keep(te_layernorm_mlp_grads{}); }));
    }
    {
      // forward_compute and forward: inside an enabled scope (the fused FP8 norm, the amaxes).
      using LA = te_layernorm_linear_forward_args;
      using MA = te_layernorm_mlp_forward_args;
      auto args_with = [](auto m) {
        return [m](World &w, auto &a) {
          auto &c = w.keep(*a.args);
          m(w, c);
          a.args = &c;
        };
      };
      const char *rms_why = "a beta given to RMSNorm or missing for LayerNorm";
      auto lnl_common = [args_with, rms_why](auto d) {
        return d.tensor("args->input", TE_DTYPE_F32, {N, N})
            .tensor("args->ln_weight", TE_DTYPE_F32, {N})
            .tensor("args->ln_bias", TE_DTYPE_F32, {N})
            .tensor("args->weight", TE_DTYPE_F32, {N, N})
            .tensor("args->bias", TE_DTYPE_F32, {N})
            .tensor("args->ln_out", TE_DTYPE_F32, {N, N})
            .tensor("y", TE_DTYPE_F32, {N, N})
            .null_ok("args->ln_out", "optional output: norm(x) [..., in_features]")
            .extra("ln_weight_wrong_length",
                   args_with([](World &w, LA &c) { c.ln_weight = input(w, TE_DTYPE_F32, {N + 1}, 72).get(); }),
                   reject({IA}, "gamma/beta not [in_features] of the activation dtype", "args->ln_weight"))
            .extra("ln_out_wrong_shape",
                   args_with([](World &w, LA &c) { c.ln_out = output(w, TE_DTYPE_F32, {N, 2 * N}).get(); }),
                   reject({IA}, "ln_out not like x", "args->ln_out"))
            .extra("weight_transposed_shape",
                   args_with([](World &w, LA &c) { c.weight = input(w, TE_DTYPE_F32, {N, 2 * N}, 73).get(); }),
                   invalid("args->weight"))
            .extra("tokens_not_multiple_of_16_under_fp8",
                   [](World &w, auto &a) {
                     LA &c = w.keep(*a.args);
                     c.input = input(w, TE_DTYPE_F32, {8, N}, 74).get();
                     c.ln_out = nullptr;
                     a.args = &c;
                     a.y = output(w, TE_DTYPE_F32, {8, N}).get();
                   },
                   reject({UNSUP}, "UNSUPPORTED (FP8 with tokens, in or out not a multiple of 16)", "args->input"))
            .extra("rmsnorm_module_with_beta",
                   [](World &w, auto &a) {
                     a.m = lnl_new(w, w.ctx, false, [](te_layernorm_linear_options &o) { o.normalization = TE_NORM_RMSNORM; });
                   },
                   reject({IA}, rms_why, "args->ln_bias"))
            .extra("bias_to_a_module_without",
                   [](World &w, auto &a) { a.m = lnl_new(w, w.ctx, false, [](te_layernorm_linear_options &o) { o.bias = 0; }); },
                   invalid("args->bias"))
            .extra("m_of_another_context",
                   [](World &w, auto &a) { a.m = lnl_new(w, static_cast<te_context *>(w.make("te_context")), false); },
                   invalid("m|ctx"));
      };
      auto mlp_common = [args_with, rms_why](auto d) {
        return d.tensor("args->input", TE_DTYPE_F32, {N, N})
            .tensor("args->ln_weight", TE_DTYPE_F32, {N})
            .tensor("args->ln_bias", TE_DTYPE_F32, {N})
            .tensor("args->fc1_weight", TE_DTYPE_F32, {N, N})
            .tensor("args->fc1_bias", TE_DTYPE_F32, {N})
            .tensor("args->fc2_weight", TE_DTYPE_F32, {N, N})
            .tensor("args->fc2_bias", TE_DTYPE_F32, {N})
            .tensor("args->ln_out", TE_DTYPE_F32, {N, N})
            .tensor("y", TE_DTYPE_F32, {N, N})
            .null_ok("args->ln_out", "optional output: norm(x) [..., hidden]")
            .extra("fc1_weight_not_2ffn_for_swiglu",
                   [](World &w, auto &a) {
                     a.m = mlp_new(w, w.ctx, false, [](te_layernorm_mlp_options &o) { o.activation = TE_ACTIVATION_SWIGLU; });
                   },
                   reject({IA}, "[2 * ffn_hidden_size, hidden_size] for the gated SwiGLU and GEGLU", "args->fc1_weight"))
            .extra("fc2_weight_transposed_shape",
                   args_with([](World &w, MA &c) { c.fc2_weight = input(w, TE_DTYPE_F32, {2 * N, N}, 75).get(); }),
                   invalid("args->fc2_weight"))
            .extra("fc1_bias_wrong_length",
                   args_with([](World &w, MA &c) { c.fc1_bias = input(w, TE_DTYPE_F32, {2 * N}, 76).get(); }),
                   invalid("args->fc1_bias"))
            .extra("ln_out_wrong_shape",
                   args_with([](World &w, MA &c) { c.ln_out = output(w, TE_DTYPE_F32, {2 * N, N}).get(); }),
                   reject({IA}, "ln_out not like x", "args->ln_out"))
            .extra("tokens_not_multiple_of_16_under_fp8",
                   [](World &w, auto &a) {
                     MA &c = w.keep(*a.args);
                     c.input = input(w, TE_DTYPE_F32, {8, N}, 77).get();
                     c.ln_out = nullptr;
                     a.args = &c;
                     a.y = output(w, TE_DTYPE_F32, {8, N}).get();
                   },
                   reject({UNSUP}, "UNSUPPORTED under FP8 when tokens, hidden or ffn is not a multiple of 16",
                          "args->input"))
            .extra("rmsnorm_module_with_beta",
                   [](World &w, auto &a) {
                     a.m = mlp_new(w, w.ctx, false, [](te_layernorm_mlp_options &o) { o.normalization = TE_NORM_RMSNORM; });
                   },
                   reject({IA}, rms_why, "args->ln_bias"))
            .extra("biases_to_a_module_without",
                   [](World &w, auto &a) { a.m = mlp_new(w, w.ctx, false, [](te_layernorm_mlp_options &o) { o.bias = 0; }); },
                   invalid("args->fc1_bias|args->fc2_bias"))
            .extra("m_of_another_context",
                   [](World &w, auto &a) { a.m = mlp_new(w, static_cast<te_context *>(w.make("te_context")), false); },
                   invalid("m|ctx"));
      };
      t.push_back(lnl_common(Def<args::te_layernorm_linear_forward_compute>(
          [](World &w, args::te_layernorm_linear_forward_compute &a) {
            a.m = lnl_new(w, w.ctx);
            begin_fp8_scope(w);
            a.ctx = w.ctx;
            a.args = &lnl_fwd_args(w);
            a.y = w.y.get();
            te_layernorm_linear_residuals &r = w.keep(te_layernorm_linear_residuals{});
            r.struct_size = sizeof r;
            a.residuals = &r;
          })));
      t.push_back(lnl_common(Def<args::te_layernorm_linear_forward>([](World &w, args::te_layernorm_linear_forward &a) {
        a.m = lnl_new(w, w.ctx);
        begin_fp8_scope(w);
        a.ctx = w.ctx;
        a.args = &lnl_fwd_args(w);
        a.y = w.y.get();
        a.out = &w.keep<te_layernorm_linear_backward_ctx *>(nullptr);
      })));
      t.push_back(mlp_common(Def<args::te_layernorm_mlp_forward_compute>(
          [](World &w, args::te_layernorm_mlp_forward_compute &a) {
            a.m = mlp_new(w, w.ctx);
            begin_fp8_scope(w);
            a.ctx = w.ctx;
            a.args = &mlp_fwd_args(w);
            a.y = w.y.get();
            te_layernorm_mlp_residuals &r = w.keep(te_layernorm_mlp_residuals{});
            r.struct_size = sizeof r;
            a.residuals = &r;
          })));
      t.push_back(mlp_common(Def<args::te_layernorm_mlp_forward>([](World &w, args::te_layernorm_mlp_forward &a) {
        a.m = mlp_new(w, w.ctx);
        begin_fp8_scope(w);
        a.ctx = w.ctx;
        a.args = &mlp_fwd_args(w);
        a.y = w.y.get();
        a.out = &w.keep<te_layernorm_mlp_backward_ctx *>(nullptr);
      })));
    }
    {
      // residuals_release and forward_save: residuals of an FP8 forward in an open scope.
      t.push_back(
          Def<args::te_layernorm_linear_residuals_release>([](World &w, args::te_layernorm_linear_residuals_release &a) {
            te_layernorm_linear *m = lnl_new(w, w.ctx);
            begin_fp8_scope(w);
            a.residuals = &lnl_residuals(w, m);
          })
              .inout("residuals")
              .extra("internal_garbage",
                     [](World &w, args::te_layernorm_linear_residuals_release &a) {
                       te_layernorm_linear_residuals &c = w.keep(*a.residuals);
                       c.internal = w.block(64);
                       a.residuals = &c;
                     },
                     no_crash())
              .extra("internal_of_an_mlp",
                     // An MLP's residuals handle in a LayerNormLinear struct: another type, left alone.
                     [](World &w, args::te_layernorm_linear_residuals_release &a) {
                       te_layernorm_mlp *mm = mlp_new(w, w.ctx, false);
                       te_layernorm_mlp_residuals &mr = mlp_residuals(w, mm);
                       te_layernorm_linear_residuals &c = w.keep(*a.residuals);
                       c.internal = mr.internal;
                       a.residuals = &c;
                       w.post_check([&w, mm, &mr]() -> std::string {
                         te_layernorm_mlp_backward_ctx *b = nullptr;
                         te_status s = te_layernorm_mlp_forward_save(w.ctx, mm, &mr, &b);
                         te_layernorm_mlp_backward_ctx_destroy(b);
                         return s == TE_SUCCESS ? "" : std::string("an MLP's residuals were freed through "
                                                                   "te_layernorm_linear_residuals_release: ") +
                                                           te_last_error();
                       });
                     },
                     no_crash()));
      t.push_back(
          Def<args::te_layernorm_mlp_residuals_release>([](World &w, args::te_layernorm_mlp_residuals_release &a) {
            te_layernorm_mlp *m = mlp_new(w, w.ctx);
            begin_fp8_scope(w);
            a.residuals = &mlp_residuals(w, m);
          })
              .inout("residuals")
              .extra("internal_garbage",
                     [](World &w, args::te_layernorm_mlp_residuals_release &a) {
                       te_layernorm_mlp_residuals &c = w.keep(*a.residuals);
                       c.internal = w.block(64);
                       a.residuals = &c;
                     },
                     no_crash())
              .extra("internal_of_a_layernorm_linear",
                     [](World &w, args::te_layernorm_mlp_residuals_release &a) {
                       te_layernorm_linear *lm = lnl_new(w, w.ctx, false);
                       te_layernorm_linear_residuals &lr = lnl_residuals(w, lm);
                       te_layernorm_mlp_residuals &c = w.keep(*a.residuals);
                       c.internal = lr.internal;
                       a.residuals = &c;
                       w.post_check([&w, lm, &lr]() -> std::string {
                         te_layernorm_linear_backward_ctx *b = nullptr;
                         te_status s = te_layernorm_linear_forward_save(w.ctx, lm, &lr, &b);
                         te_layernorm_linear_backward_ctx_destroy(b);
                         return s == TE_SUCCESS ? "" : std::string("a LayerNormLinear's residuals were freed through "
                                                                   "te_layernorm_mlp_residuals_release: ") +
                                                           te_last_error();
                       });
                     },
                     no_crash()));
      using LS = args::te_layernorm_linear_forward_save;
      t.push_back(
          Def<LS>([](World &w, LS &a) {
            a.m = lnl_new(w, w.ctx);
            begin_fp8_scope(w);
            a.ctx = w.ctx;
            a.residuals = &lnl_residuals(w, a.m);
            a.out = &w.keep<te_layernorm_linear_backward_ctx *>(nullptr);
          })
              .inout("residuals")
              .extra("internal_null",
                     [](World &w, LS &a) {
                       te_layernorm_linear_residuals &c = w.keep(*a.residuals);
                       c.internal = nullptr;
                       a.residuals = &c;
                     },
                     invalid("residuals"))
              .extra("internal_garbage",
                     [](World &w, LS &a) {
                       te_layernorm_linear_residuals &c = w.keep(*a.residuals);
                       c.internal = w.block(64);
                       a.residuals = &c;
                     },
                     invalid("residuals"))
              .extra("already_saved_copy",
                     [](World &w, LS &a) {
                       te_layernorm_linear_residuals &old = lnl_residuals(w, a.m);
                       te_layernorm_linear_residuals &copy = w.keep(old);
                       te_layernorm_linear_backward_ctx *b = nullptr;
                       w.ok(te_layernorm_linear_forward_save(w.ctx, a.m, &old, &b), "te_layernorm_linear_forward_save");
                       a.residuals = &copy;
                     },
                     invalid("residuals"))
              .extra("released_copy",
                     [](World &w, LS &a) {
                       te_layernorm_linear_residuals &old = lnl_residuals(w, a.m);
                       te_layernorm_linear_residuals &copy = w.keep(old);
                       te_layernorm_linear_residuals_release(&old);
                       (void)lnl_residuals(w, a.m);
                       a.residuals = &copy;
                     },
                     invalid("residuals"))
              .extra("residuals_of_another_module",
                     [](World &w, LS &a) { a.residuals = &lnl_residuals(w, lnl_new(w, w.ctx, false)); },
                     invalid("residuals|m"))
              .extra("internal_of_an_mlp",
                     [](World &w, LS &a) {
                       te_layernorm_linear_residuals &c = w.keep(*a.residuals);
                       c.internal = mlp_residuals(w, mlp_new(w, w.ctx, false)).internal;
                       a.residuals = &c;
                     },
                     invalid("residuals")));
      using MS = args::te_layernorm_mlp_forward_save;
      t.push_back(
          Def<MS>([](World &w, MS &a) {
            a.m = mlp_new(w, w.ctx);
            begin_fp8_scope(w);
            a.ctx = w.ctx;
            a.residuals = &mlp_residuals(w, a.m);
            a.out = &w.keep<te_layernorm_mlp_backward_ctx *>(nullptr);
          })
              .inout("residuals")
              .extra("internal_null",
                     [](World &w, MS &a) {
                       te_layernorm_mlp_residuals &c = w.keep(*a.residuals);
                       c.internal = nullptr;
                       a.residuals = &c;
                     },
                     invalid("residuals"))
              .extra("internal_garbage",
                     [](World &w, MS &a) {
                       te_layernorm_mlp_residuals &c = w.keep(*a.residuals);
                       c.internal = w.block(64);
                       a.residuals = &c;
                     },
                     invalid("residuals"))
              .extra("already_saved_copy",
                     [](World &w, MS &a) {
                       te_layernorm_mlp_residuals &old = mlp_residuals(w, a.m);
                       te_layernorm_mlp_residuals &copy = w.keep(old);
                       te_layernorm_mlp_backward_ctx *b = nullptr;
                       w.ok(te_layernorm_mlp_forward_save(w.ctx, a.m, &old, &b), "te_layernorm_mlp_forward_save");
                       a.residuals = &copy;
                     },
                     invalid("residuals"))
              .extra("residuals_of_another_module",
                     [](World &w, MS &a) { a.residuals = &mlp_residuals(w, mlp_new(w, w.ctx, false)); },
                     invalid("residuals|m"))
              .extra("internal_of_a_layernorm_linear",
                     [](World &w, MS &a) {
                       te_layernorm_mlp_residuals &c = w.keep(*a.residuals);
                       c.internal = lnl_residuals(w, lnl_new(w, w.ctx, false)).internal;
                       a.residuals = &c;
                     },
                     invalid("residuals")));
    }
    {
      // backward: the backward context of one FP8 step of a used module, every gradient.
      using LB = args::te_layernorm_linear_backward;
      using MB = args::te_layernorm_mlp_backward;
      const char *null_why = "every pointer may be NULL to skip it";
      auto grads_with = [](auto m) {
        return [m](World &w, auto &a) {
          auto &c = w.keep(*a.grads);
          m(w, c);
          a.grads = &c;
        };
      };
      auto flags_unknown = [](World &w, auto &a) {
        te_linear_backward_args &b = w.keep(*a.args);
        b.flags = 0x2;
        a.args = &b;
      };
      t.push_back(
          Def<LB>([](World &w, LB &a) {
            a.ctx = w.ctx;
            a.bwd = lnl_backward_ctx(w, w.ctx, lnl_used(w, w.ctx));
            a.dy = w.dy.get();
            te_layernorm_linear_grads &g = w.keep(te_layernorm_linear_grads{});
            w.ok(te_layernorm_linear_grads_init(&g), "te_layernorm_linear_grads_init");
            g.dx = w.dx.get();
            g.dln_weight = output(w, TE_DTYPE_F32, {N}).get();
            g.dln_bias = output(w, TE_DTYPE_F32, {N}).get();
            g.dw = w.dw.get();
            g.db = w.db.get();
            a.grads = &g;
            te_linear_backward_args &b = w.keep(te_linear_backward_args{});
            w.ok(te_linear_backward_args_init(&b), "te_linear_backward_args_init");
            a.args = &b;
          })
              .tensor("dy", TE_DTYPE_F32, {N, N})
              .tensor("grads->dx", TE_DTYPE_F32, {N, N})
              .tensor("grads->dln_weight", TE_DTYPE_F32, {N})
              .tensor("grads->dln_bias", TE_DTYPE_F32, {N})
              .tensor("grads->dw", TE_DTYPE_F32, {N, N})
              .tensor("grads->db", TE_DTYPE_F32, {N})
              .null_ok("grads", "grads and args may be NULL (nothing requested / no flags)")
              .null_ok("args", "grads and args may be NULL (nothing requested / no flags)")
              .null_ok("grads->dx", null_why)
              .null_ok("grads->dln_weight", null_why)
              .null_ok("grads->dln_bias", null_why)
              .null_ok("grads->dw", null_why)
              .null_ok("grads->db", null_why)
              .extra("flags_unknown", flags_unknown, invalid("args->flags"))
              .extra("dy_other_tokens", [](World &w, LB &a) { a.dy = input(w, TE_DTYPE_F32, {2 * N, N}, 78).get(); },
                     invalid("dy"))
              .extra("dw_transposed_shape",
                     grads_with([](World &w, te_layernorm_linear_grads &c) { c.dw = output(w, TE_DTYPE_F32, {N, 2 * N}).get(); }),
                     invalid("grads->dw"))
              .extra("dbeta_for_rmsnorm",
                     [](World &w, LB &a) {
                       te_layernorm_linear *m =
                           lnl_new(w, w.ctx, false, [](te_layernorm_linear_options &o) { o.normalization = TE_NORM_RMSNORM; });
                       te_layernorm_linear_forward_args &fa = lnl_fwd_args(w);
                       fa.ln_bias = nullptr;
                       a.bwd = lnl_backward_ctx(w, w.ctx, m, false, &fa);
                     },
                     reject({IA}, "dbeta [in]: LayerNorm only", "grads->dln_bias"))
              .extra("db_without_bias",
                     [](World &w, LB &a) {
                       te_layernorm_linear *m = lnl_new(w, w.ctx, false, [](te_layernorm_linear_options &o) { o.bias = 0; });
                       te_layernorm_linear_forward_args &fa = lnl_fwd_args(w);
                       fa.bias = nullptr;
                       a.bwd = lnl_backward_ctx(w, w.ctx, m, false, &fa);
                     },
                     reject({IA}, "db [out]: layers with bias only", "grads->db"))
              .extra("fused_wgrad_main_grad_wrong_shape",
                     [](World &w, LB &a) {
                       te_layernorm_linear *m =
                           lnl_new(w, w.ctx, false, [](te_layernorm_linear_options &o) { o.fuse_wgrad_accumulation = 1; });
                       a.bwd = lnl_backward_ctx(w, w.ctx, m, false);
                       te_layernorm_linear_grads &c = w.keep(*a.grads);
                       c.dw = output(w, TE_DTYPE_F32, {2 * N, N}).get();
                       a.grads = &c;
                     },
                     invalid("grads->dw"))
              .extra("bwd_once_already_run",
                     [](World &w, LB &a) {
                       te_layernorm_linear_backward_ctx *b = lnl_backward_ctx(w, w.ctx, lnl_new(w, w.ctx, false), false);
                       te_linear_backward_args ba;
                       w.ok(te_linear_backward_args_init(&ba), "te_linear_backward_args_init");
                       ba.flags = TE_BACKWARD_ONCE;
                       w.ok(te_layernorm_linear_backward(w.ctx, b, w.dy.get(), nullptr, &ba),
                            "te_layernorm_linear_backward (once)");
                       a.bwd = b;
                     },
                     reject({IS}, "TE_BACKWARD_ONCE frees it at the first (later calls: INVALID_STATE)"))
              .extra("bwd_of_another_context",
                     [](World &w, LB &a) {
                       te_context *c2 = static_cast<te_context *>(w.make("te_context"));
                       a.bwd = lnl_backward_ctx(w, c2, lnl_new(w, c2, false));
                     },
                     invalid("bwd|ctx")));
      t.push_back(
          Def<MB>([](World &w, MB &a) {
            a.ctx = w.ctx;
            a.bwd = mlp_backward_ctx(w, w.ctx, mlp_used(w, w.ctx));
            a.dy = w.dy.get();
            te_layernorm_mlp_grads &g = w.keep(te_layernorm_mlp_grads{});
            w.ok(te_layernorm_mlp_grads_init(&g), "te_layernorm_mlp_grads_init");
            g.dx = w.dx.get();
            g.dln_weight = output(w, TE_DTYPE_F32, {N}).get();
            g.dln_bias = output(w, TE_DTYPE_F32, {N}).get();
            g.dfc1_weight = w.dw.get();
            g.dfc1_bias = w.db.get();
            g.dfc2_weight = output(w, TE_DTYPE_F32, {N, N}).get();
            g.dfc2_bias = output(w, TE_DTYPE_F32, {N}).get();
            a.grads = &g;
            te_linear_backward_args &b = w.keep(te_linear_backward_args{});
            w.ok(te_linear_backward_args_init(&b), "te_linear_backward_args_init");
            a.args = &b;
          })
              .tensor("dy", TE_DTYPE_F32, {N, N})
              .tensor("grads->dx", TE_DTYPE_F32, {N, N})
              .tensor("grads->dln_weight", TE_DTYPE_F32, {N})
              .tensor("grads->dln_bias", TE_DTYPE_F32, {N})
              .tensor("grads->dfc1_weight", TE_DTYPE_F32, {N, N})
              .tensor("grads->dfc1_bias", TE_DTYPE_F32, {N})
              .tensor("grads->dfc2_weight", TE_DTYPE_F32, {N, N})
              .tensor("grads->dfc2_bias", TE_DTYPE_F32, {N})
              .null_ok("grads", "(as te_layernorm_linear_backward) grads and args may be NULL")
              .null_ok("args", "(as te_layernorm_linear_backward) grads and args may be NULL")
              .null_ok("grads->dx", null_why)
              .null_ok("grads->dln_weight", null_why)
              .null_ok("grads->dln_bias", null_why)
              .null_ok("grads->dfc1_weight", null_why)
              .null_ok("grads->dfc1_bias", null_why)
              .null_ok("grads->dfc2_weight", null_why)
              .null_ok("grads->dfc2_bias", null_why)
              .extra("flags_unknown", flags_unknown, invalid("args->flags"))
              .extra("dy_other_tokens", [](World &w, MB &a) { a.dy = input(w, TE_DTYPE_F32, {2 * N, N}, 79).get(); },
                     invalid("dy"))
              .extra("dfc1_weight_transposed_shape",
                     grads_with([](World &w, te_layernorm_mlp_grads &c) {
                       c.dfc1_weight = output(w, TE_DTYPE_F32, {N, 2 * N}).get();
                     }),
                     invalid("grads->dfc1_weight"))
              .extra("dfc2_bias_wrong_length",
                     grads_with([](World &w, te_layernorm_mlp_grads &c) { c.dfc2_bias = output(w, TE_DTYPE_F32, {2 * N}).get(); }),
                     invalid("grads->dfc2_bias"))
              .extra("biases_without_bias",
                     [](World &w, MB &a) {
                       te_layernorm_mlp *m = mlp_new(w, w.ctx, false, [](te_layernorm_mlp_options &o) { o.bias = 0; });
                       te_layernorm_mlp_forward_args &fa = mlp_fwd_args(w);
                       fa.fc1_bias = nullptr;
                       fa.fc2_bias = nullptr;
                       a.bwd = mlp_backward_ctx(w, w.ctx, m, false, &fa);
                     },
                     reject({IA}, "the module has no bias", "grads->dfc1_bias|grads->dfc2_bias"))
              .extra("bwd_once_already_run",
                     [](World &w, MB &a) {
                       te_layernorm_mlp_backward_ctx *b = mlp_backward_ctx(w, w.ctx, mlp_new(w, w.ctx, false), false);
                       te_linear_backward_args ba;
                       w.ok(te_linear_backward_args_init(&ba), "te_linear_backward_args_init");
                       ba.flags = TE_BACKWARD_ONCE;
                       w.ok(te_layernorm_mlp_backward(w.ctx, b, w.dy.get(), nullptr, &ba), "te_layernorm_mlp_backward (once)");
                       a.bwd = b;
                     },
                     reject({IS}, "TE_BACKWARD_ONCE frees it at the first (later calls: INVALID_STATE)"))
              .extra("bwd_of_another_context",
                     [](World &w, MB &a) {
                       te_context *c2 = static_cast<te_context *>(w.make("te_context"));
                       a.bwd = mlp_backward_ctx(w, c2, mlp_new(w, c2, false));
                     },
                     invalid("bwd|ctx")));
      t.push_back(Def<args::te_layernorm_linear_backward_ctx_destroy>(
          [](World &w, args::te_layernorm_linear_backward_ctx_destroy &a) {
            a.bwd = lnl_backward_ctx(w, w.ctx, lnl_new(w, w.ctx, false), false);
          }));
      t.push_back(Def<args::te_layernorm_mlp_backward_ctx_destroy>(
          [](World &w, args::te_layernorm_mlp_backward_ctx_destroy &a) {
            a.bwd = mlp_backward_ctx(w, w.ctx, mlp_new(w, w.ctx, false), false);
          }));
    }
    {
      // Scaling states and state save/load of used modules.
      auto history = [](World &w, float **h, size_t *cap) {
        std::vector<float> &v = w.keep(std::vector<float>(16, -7.0f));
        *h = v.data();
        *cap = v.size();
        w.watch(v.data(), v.size() * sizeof(float), "history[16]");
      };
      const char *cap_why = "min(history_cap, amax_history_len) floats are written: the buffer holds amax_history_len (16)";
      t.push_back(Def<args::te_layernorm_linear_get_scaling_state>(
                      [history](World &w, args::te_layernorm_linear_get_scaling_state &a) {
                        a.ctx = w.ctx;
                        a.m = lnl_used(w, w.ctx);
                        a.role = TE_ROLE_GRAD_OUTPUT;
                        te_scaling_state_info &i = w.keep(te_scaling_state_info{});
                        i.struct_size = sizeof i;
                        a.info = &i;
                        history(w, &a.history, &a.history_cap);
                      })
                      .null_ok("history", "`history` may be NULL (as te_linear_get_scaling_state)")
                      .expect("history_cap:size_max", accept(cap_why))
                      .check([](World &, const args::te_layernorm_linear_get_scaling_state &a, const CallResult &) {
                        return a.info->amax_history_len == 16 && a.info->fp8_dtype == TE_DTYPE_E5M2
                                   ? ""
                                   : "not the GRAD_OUTPUT state of one FP8 step (length 16, E5M2)";
                      }));
      t.push_back(Def<args::te_layernorm_mlp_get_scaling_state>(
                      [history](World &w, args::te_layernorm_mlp_get_scaling_state &a) {
                        a.ctx = w.ctx;
                        a.m = mlp_used(w, w.ctx);
                        a.gemm = TE_MLP_FC2;
                        a.role = TE_ROLE_INPUT;
                        te_scaling_state_info &i = w.keep(te_scaling_state_info{});
                        i.struct_size = sizeof i;
                        a.info = &i;
                        history(w, &a.history, &a.history_cap);
                      })
                      .null_ok("history", "`history` may be NULL (as te_linear_get_scaling_state)")
                      .expect("history_cap:size_max", accept(cap_why))
                      .check([](World &, const args::te_layernorm_mlp_get_scaling_state &a, const CallResult &) {
                        return a.info->amax_history_len == 16 ? "" : "amax_history_len is not the recipe's 16";
                      }));
      const char *buf_why = "With buf NULL, only *size is set to the bytes needed (as te_linear_state_save)";
      t.push_back(Def<args::te_layernorm_linear_state_save>([](World &w, args::te_layernorm_linear_state_save &a) {
                    a.ctx = w.ctx;
                    a.m = lnl_used(w, w.ctx);
                    size_t n = 0;
                    w.ok(te_layernorm_linear_state_save(w.ctx, a.m, nullptr, 0, &n), "te_layernorm_linear_state_save (size)");
                    a.buf = w.block(n);
                    a.capacity = n;
                    a.size = &w.keep(size_t(0));
                    w.watch(a.buf, n, "buf");
                  })
                      .null_ok("buf", buf_why)
                      .expect("capacity:size_max", accept("capacity is the caller's buffer size: the state fits"))
                      .extra("capacity_short", [](World &, args::te_layernorm_linear_state_save &a) { a.capacity -= 1; },
                             invalid("capacity")));
      t.push_back(Def<args::te_layernorm_mlp_state_save>([](World &w, args::te_layernorm_mlp_state_save &a) {
                    a.ctx = w.ctx;
                    a.m = mlp_used(w, w.ctx);
                    size_t n = 0;
                    w.ok(te_layernorm_mlp_state_save(w.ctx, a.m, nullptr, 0, &n), "te_layernorm_mlp_state_save (size)");
                    a.buf = w.block(n);
                    a.capacity = n;
                    a.size = &w.keep(size_t(0));
                    w.watch(a.buf, n, "buf");
                  })
                      .null_ok("buf", buf_why)
                      .expect("capacity:size_max", accept("capacity is the caller's buffer size: the state fits"))
                      .extra("capacity_short", [](World &, args::te_layernorm_mlp_state_save &a) { a.capacity -= 1; },
                             invalid("capacity")));
      // Loads: the state of another used module of the same kind. Layout (modules/common/state_io.h):
      // magic, u32 version, the shape (LayerNormLinear [in, out]; LayerNormMLP [hidden, ffn,
      // fc1 rows]) as i64, then per state: i32 history_len, i32 fp8 dtype, f32 scale, f32
      // scale_inv, history.
      auto bytes = [](std::function<void(std::vector<unsigned char> &)> m) {
        return [m](World &w, auto &a) {
          const auto *p = static_cast<const unsigned char *>(a.buf);
          std::vector<unsigned char> &c = w.keep(std::vector<unsigned char>(p, p + a.size));
          m(c);
          a.buf = c.data();
          a.size = c.size();
        };
      };
      auto put32 = [](std::vector<unsigned char> &v, size_t at, int32_t x) { std::memcpy(v.data() + at, &x, 4); };
      const size_t lnl_first = 4 + 4 + 2 * 8, mlp_first = 4 + 4 + 3 * 8;
      t.push_back(
          Def<args::te_layernorm_linear_state_load>([](World &w, args::te_layernorm_linear_state_load &a) {
            a.ctx = w.ctx;
            a.m = lnl_used(w, w.ctx);
            std::vector<unsigned char> &s = lnl_saved_state(w, lnl_used(w, w.ctx));
            a.buf = s.data();
            a.size = s.size();
          })
              .expect("size:size_max", reject_or_accept("the buffer holds a whole state; the header bounds nothing but "
                                                        "truncation"))
              .extra("truncated", bytes([](std::vector<unsigned char> &v) { v.pop_back(); }), invalid("buf|size"))
              .extra("trailing_byte", bytes([](std::vector<unsigned char> &v) { v.push_back(0); }), invalid("buf|size"))
              .extra("empty", [](World &, args::te_layernorm_linear_state_load &a) { a.size = 0; }, invalid("buf|size"))
              .extra("bad_magic", bytes([](std::vector<unsigned char> &v) { v[0] = 'X'; }), invalid("buf"))
              .extra("other_version", bytes([](std::vector<unsigned char> &v) { v[4] ^= 0x40; }), invalid("buf"))
              .extra("history_len_neg1", bytes([put32, lnl_first](std::vector<unsigned char> &v) { put32(v, lnl_first, -1); }),
                     invalid("buf"))
              .extra("fp8_dtype_99", bytes([put32, lnl_first](std::vector<unsigned char> &v) { put32(v, lnl_first + 4, 99); }),
                     invalid("buf"))
              .extra("other_shape",
                     [](World &w, args::te_layernorm_linear_state_load &a) {
                       std::vector<unsigned char> &s = lnl_saved_state(
                           w, lnl_new(w, w.ctx, false, [](te_layernorm_linear_options &o) { o.in_features = 32; }));
                       a.buf = s.data();
                       a.size = s.size();
                     },
                     invalid("buf|m"))
              .extra("a_te_linear_state",
                     [](World &w, args::te_layernorm_linear_state_load &a) {
                       std::vector<unsigned char> &s = saved_state(w, w.lin);
                       a.buf = s.data();
                       a.size = s.size();
                     },
                     invalid("buf"))
              .extra("a_layernorm_mlp_state",
                     [](World &w, args::te_layernorm_linear_state_load &a) {
                       // (a fresh module's: another FP8 step would change the context's counters)
                       std::vector<unsigned char> &s = mlp_saved_state(w, mlp_new(w, w.ctx, false));
                       a.buf = s.data();
                       a.size = s.size();
                     },
                     invalid("buf")));
      t.push_back(
          Def<args::te_layernorm_mlp_state_load>([](World &w, args::te_layernorm_mlp_state_load &a) {
            a.ctx = w.ctx;
            a.m = mlp_used(w, w.ctx);
            std::vector<unsigned char> &s = mlp_saved_state(w, mlp_used(w, w.ctx));
            a.buf = s.data();
            a.size = s.size();
          })
              .expect("size:size_max", reject_or_accept("the buffer holds a whole state; the header bounds nothing but "
                                                        "truncation"))
              .extra("truncated", bytes([](std::vector<unsigned char> &v) { v.pop_back(); }), invalid("buf|size"))
              .extra("empty", [](World &, args::te_layernorm_mlp_state_load &a) { a.size = 0; }, invalid("buf|size"))
              .extra("bad_magic", bytes([](std::vector<unsigned char> &v) { v[2] = 'X'; }), invalid("buf"))
              .extra("other_version", bytes([](std::vector<unsigned char> &v) { v[5] ^= 0x01; }), invalid("buf"))
              .extra("history_len_huge",
                     bytes([put32, mlp_first](std::vector<unsigned char> &v) { put32(v, mlp_first, 0x7fffffff); }),
                     invalid("buf"))
              .extra("nan_scale", bytes([mlp_first](std::vector<unsigned char> &v) {
                       const float nan = std::nanf("");
                       std::memcpy(v.data() + mlp_first + 8, &nan, 4);
                     }),
                     invalid("buf"))
              .extra("gated_module_loading_a_gelu_state",
                     [](World &w, args::te_layernorm_mlp_state_load &a) {
                       te_layernorm_mlp *m =
                           mlp_new(w, w.ctx, false, [](te_layernorm_mlp_options &o) { o.activation = TE_ACTIVATION_GEGLU; });
                       a.m = m;
                       std::vector<unsigned char> &fresh = mlp_saved_state(w, m);
                       w.post_check([&w, m, &fresh]() -> std::string {
                         size_t n = 0;
                         std::vector<unsigned char> now(fresh.size() + 64);
                         if (te_layernorm_mlp_state_save(w.ctx, m, now.data(), now.size(), &n) != TE_SUCCESS)
                           return "state_save of the gated module failed";
                         now.resize(n);
                         return now == fresh ? "" : "the refused load changed the gated module's state";
                       });
                     },
                     invalid("buf|m"))
              .extra("a_layernorm_linear_state",
                     [](World &w, args::te_layernorm_mlp_state_load &a) {
                       std::vector<unsigned char> &s = lnl_saved_state(w, lnl_new(w, w.ctx, false));
                       a.buf = s.data();
                       a.size = s.size();
                     },
                     invalid("buf")));
    }
    {
      // Residuals in the caller's memory (te_*_residuals_size, _forward_compute_into,
      // _backward_from) of the four modules: the size query reads only the input's shape (and
      // GroupedLinear's m_splits); the forward writes the caller's block (watched); the backward
      // finds the record of a forward made into a block in a scope opened and closed here.
      const char *shape_only = "It reads only the shapes of args' tensors (their data may be NULL)";
      const char *room = "at least residuals_size bytes: SIZE_MAX bytes of room are room enough";
      // Declares every tensor field of `prefix` (x, weights, biases: F32 of the world's shapes).
      auto lin_tensors = [](auto d, const std::string &p) {
        return d.tensor(p + "->input", TE_DTYPE_F32, {N, N}).tensor(p + "->weight", TE_DTYPE_F32, {N, N})
            .tensor(p + "->bias", TE_DTYPE_F32, {N});
      };
      auto lnl_tensors = [](auto d, const std::string &p) {
        return d.tensor(p + "->input", TE_DTYPE_F32, {N, N}).tensor(p + "->ln_weight", TE_DTYPE_F32, {N})
            .tensor(p + "->ln_bias", TE_DTYPE_F32, {N}).tensor(p + "->weight", TE_DTYPE_F32, {N, N})
            .tensor(p + "->bias", TE_DTYPE_F32, {N}).tensor(p + "->ln_out", TE_DTYPE_F32, {N, N})
            .null_ok(p + "->ln_out", "optional output: norm(x) [..., in_features]");
      };
      auto mlp_tensors = [](auto d, const std::string &p) {
        return d.tensor(p + "->input", TE_DTYPE_F32, {N, N}).tensor(p + "->ln_weight", TE_DTYPE_F32, {N})
            .tensor(p + "->ln_bias", TE_DTYPE_F32, {N}).tensor(p + "->fc1_weight", TE_DTYPE_F32, {N, N})
            .tensor(p + "->fc1_bias", TE_DTYPE_F32, {N}).tensor(p + "->fc2_weight", TE_DTYPE_F32, {N, N})
            .tensor(p + "->fc2_bias", TE_DTYPE_F32, {N}).tensor(p + "->ln_out", TE_DTYPE_F32, {N, N})
            .null_ok(p + "->ln_out", "optional output: norm(x) [..., hidden]");
      };
      // residuals_size: the input's shape, dtype and device are read; nothing else of args.
      auto size_common = [shape_only](auto d, std::vector<std::string> unread) {
        d.expect("args->input:data_null", accept(shape_only));
        for (const std::string &u : unread) d.expect("args->" + u + ":*", accept(shape_only));
        return d;
      };
      t.push_back(size_common(lin_tensors(Def<args::te_linear_residuals_size>([](World &w, args::te_linear_residuals_size &a) {
                                            begin_fp8_scope(w);
                                            a.ctx = w.ctx;
                                            a.lin = w.lin;
                                            a.args = &fwd_args(w);
                                            a.bytes = &w.keep(size_t(0));
                                          }),
                                          "args"),
                              {"weight", "bias"})
                      .null_ok("args->weight", shape_only)
                      .null_ok("args->bias", shape_only));
      t.push_back(size_common(lnl_tensors(Def<args::te_layernorm_linear_residuals_size>(
                                              [](World &w, args::te_layernorm_linear_residuals_size &a) {
                                                a.m = lnl_new(w, w.ctx);
                                                begin_fp8_scope(w);
                                                a.ctx = w.ctx;
                                                a.args = &lnl_fwd_args(w);
                                                a.bytes = &w.keep(size_t(0));
                                              }),
                                          "args"),
                              {"ln_weight", "ln_bias", "weight", "bias", "ln_out"})
                      .null_ok("args->ln_weight", shape_only)
                      .null_ok("args->ln_bias", shape_only)
                      .null_ok("args->weight", shape_only)
                      .null_ok("args->bias", shape_only));
      t.push_back(size_common(mlp_tensors(Def<args::te_layernorm_mlp_residuals_size>(
                                              [](World &w, args::te_layernorm_mlp_residuals_size &a) {
                                                a.m = mlp_new(w, w.ctx);
                                                begin_fp8_scope(w);
                                                a.ctx = w.ctx;
                                                a.args = &mlp_fwd_args(w);
                                                a.bytes = &w.keep(size_t(0));
                                              }),
                                          "args"),
                              {"ln_weight", "ln_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "ln_out"})
                      .null_ok("args->ln_weight", shape_only)
                      .null_ok("args->ln_bias", shape_only)
                      .null_ok("args->fc1_weight", shape_only)
                      .null_ok("args->fc1_bias", shape_only)
                      .null_ok("args->fc2_weight", shape_only)
                      .null_ok("args->fc2_bias", shape_only));
      t.push_back(size_common(Def<args::te_grouped_linear_residuals_size>([](World &w, args::te_grouped_linear_residuals_size &a) {
                                a.g = grouped_new(w, w.ctx);
                                begin_fp8_scope(w);
                                a.ctx = w.ctx;
                                a.args = &grouped_fwd_args(w);
                                a.bytes = &w.keep(size_t(0));
                              }).tensor("args->input", TE_DTYPE_F32, {N, N}),
                              {})
                      .null_ok("args->weights", "residuals_size reads args->m_splits (host ints) and the input's shape")
                      .null_ok("args->biases", "residuals_size reads args->m_splits (host ints) and the input's shape")
                      .extra("m_splits_sum_short",
                             [](World &w, args::te_grouped_linear_residuals_size &a) {
                               te_grouped_linear_forward_args &c = w.keep(*a.args);
                               c.m_splits = w.keep(std::vector<int64_t>{5, 0, 10}).data();
                               a.args = &c;
                             },
                             invalid("args->m_splits"))
                      .extra("m_splits_negative",
                             [](World &w, args::te_grouped_linear_residuals_size &a) {
                               te_grouped_linear_forward_args &c = w.keep(*a.args);
                               c.m_splits = w.keep(std::vector<int64_t>{-1, 6, 11}).data();
                               a.args = &c;
                             },
                             invalid("args->m_splits[0]")));

      // forward_compute_into: the forward's checks, then the block's.
      auto block_extras = [room](auto d) {
        return d.expect("residuals_bytes:size_max", accept(room))
            .extra("residuals_bytes_short", [](World &, auto &a) { a.residuals_bytes -= 1; }, invalid("residuals_bytes"))
            .extra("residuals_misaligned",
                   [](World &w, auto &a) {
                     unsigned char *p = static_cast<unsigned char *>(w.block(a.residuals_bytes + 64));
                     a.residuals = p + 1;
                   },
                   invalid("residuals"));
      };
      // The block a forward of the world's shapes leaves under the open scope.
      auto into_block = [](World &w, auto &a, auto size_fn) {
        size_t n = 0;
        w.ok(size_fn(a.ctx, a.args, &n), "residuals_size (fixture)");
        a.residuals = w.block(n);
        a.residuals_bytes = n;
        w.watch(a.residuals, n, "residuals");
      };
      t.push_back(block_extras(lin_tensors(Def<args::te_linear_forward_compute_into>(
                                               [into_block](World &w, args::te_linear_forward_compute_into &a) {
                                                 begin_fp8_scope(w);
                                                 a.ctx = w.ctx;
                                                 a.lin = w.lin;
                                                 a.args = &fwd_args(w);
                                                 a.y = w.y.get();
                                                 into_block(w, a, [&a](te_context *c, const te_linear_forward_args *f,
                                                                       size_t *n) {
                                                   return te_linear_residuals_size(c, a.lin, f, n);
                                                 });
                                               }),
                                           "args")
                                   .tensor("y", TE_DTYPE_F32, {N, N})));
      t.push_back(block_extras(lnl_tensors(Def<args::te_layernorm_linear_forward_compute_into>(
                                               [into_block](World &w, args::te_layernorm_linear_forward_compute_into &a) {
                                                 a.m = lnl_new(w, w.ctx);
                                                 begin_fp8_scope(w);
                                                 a.ctx = w.ctx;
                                                 a.args = &lnl_fwd_args(w);
                                                 a.y = w.y.get();
                                                 into_block(w, a, [&a](te_context *c,
                                                                       const te_layernorm_linear_forward_args *f,
                                                                       size_t *n) {
                                                   return te_layernorm_linear_residuals_size(c, a.m, f, n);
                                                 });
                                               }),
                                           "args")
                                   .tensor("y", TE_DTYPE_F32, {N, N})));
      t.push_back(block_extras(mlp_tensors(Def<args::te_layernorm_mlp_forward_compute_into>(
                                               [into_block](World &w, args::te_layernorm_mlp_forward_compute_into &a) {
                                                 a.m = mlp_new(w, w.ctx);
                                                 begin_fp8_scope(w);
                                                 a.ctx = w.ctx;
                                                 a.args = &mlp_fwd_args(w);
                                                 a.y = w.y.get();
                                                 into_block(w, a, [&a](te_context *c,
                                                                       const te_layernorm_mlp_forward_args *f,
                                                                       size_t *n) {
                                                   return te_layernorm_mlp_residuals_size(c, a.m, f, n);
                                                 });
                                               }),
                                           "args")
                                   .tensor("y", TE_DTYPE_F32, {N, N})));
      t.push_back(block_extras(Def<args::te_grouped_linear_forward_compute_into>(
                                   [into_block](World &w, args::te_grouped_linear_forward_compute_into &a) {
                                     a.g = grouped_new(w, w.ctx);
                                     begin_fp8_scope(w);
                                     a.ctx = w.ctx;
                                     a.args = &grouped_fwd_args(w);
                                     a.y = w.y.get();
                                     into_block(w, a, [&a](te_context *c, const te_grouped_linear_forward_args *f,
                                                           size_t *n) { return te_grouped_linear_residuals_size(c, a.g, f, n); });
                                   })
                                   .tensor("args->input", TE_DTYPE_F32, {N, N})
                                   .tensor("y", TE_DTYPE_F32, {N, N})));

      // backward_from: the record of one FP8 forward into a block (scope opened and closed).
      auto from_extras = [room](auto d) {
        return d.skip("residuals_bytes:size_max",
                      std::string(room) + "; an accepted backward_from is a second backward of the pass, which the "
                      "valid call after it cannot repeat bit for bit (tests/api covers repeated backwards)")
            .null_ok("args", "args may be NULL (as te_linear_backward)")
            .extra("residuals_bytes_short", [](World &, auto &a) { a.residuals_bytes -= 1; }, invalid("residuals_bytes"))
            .extra("residuals_no_forward_filled",
                   [](World &w, auto &a) { a.residuals = w.block(a.residuals_bytes); }, invalid("residuals"))
            .extra("flags_unknown",
                   [](World &w, auto &a) {
                     te_linear_backward_args &b = w.keep(te_linear_backward_args{});
                     te_linear_backward_args_init(&b);
                     b.flags = 0x2;
                     a.args = &b;
                   },
                   invalid("args->flags"));
      };
      // Makes the block and its record: forward_compute_into in an FP8 scope of its own.
      auto fill = [](World &w, auto &a, auto size_fn, auto into_fn) {
        FixtureScope scope(w, w.ctx, true);
        size_t n = 0;
        w.ok(size_fn(&n), "residuals_size (fixture)");
        void *p = w.block(n);
        HostTensor &yy = output(w, TE_DTYPE_F32, {N, N});
        w.ok(into_fn(yy.get(), p, n), "forward_compute_into (fixture)");
        a.residuals = p;
        a.residuals_bytes = n;
      };
      auto bargs = [](World &w) {
        te_linear_backward_args &b = w.keep(te_linear_backward_args{});
        w.ok(te_linear_backward_args_init(&b), "te_linear_backward_args_init");
        return &b;
      };
      t.push_back(from_extras(lin_tensors(Def<args::te_linear_backward_from>([fill, bargs](World &w,
                                                                                             args::te_linear_backward_from &a) {
                                            a.ctx = w.ctx;
                                            a.lin = static_cast<te_linear *>(w.make("te_linear"));
                                            a.inputs = &fwd_args(w);
                                            fill(w, a, [&](size_t *n) { return te_linear_residuals_size(w.ctx, a.lin, a.inputs, n); },
                                                 [&](te_tensor *y, void *p, size_t n) {
                                                   return te_linear_forward_compute_into(w.ctx, a.lin, a.inputs, y, p, n);
                                                 });
                                            a.dy = w.dy.get();
                                            a.dx = w.dx.get();
                                            a.dw = w.dw.get();
                                            a.db = w.db.get();
                                            a.args = bargs(w);
                                          }),
                                          "inputs")
                                  .tensor("dy", TE_DTYPE_F32, {N, N})
                                  .tensor("dx", TE_DTYPE_F32, {N, N})
                                  .tensor("dw", TE_DTYPE_F32, {N, N})
                                  .tensor("db", TE_DTYPE_F32, {N})
                                  .null_ok("dx", "Any of dx, dw, db may be NULL to skip it")
                                  .null_ok("dw", "Any of dx, dw, db may be NULL to skip it")
                                  .null_ok("db", "Any of dx, dw, db may be NULL to skip it")
                                  .null_ok("inputs", "inputs are optional in FP8 (x^T is in the block)")
                                  .null_ok("inputs->bias", "inputs->bias is never read and may be NULL (te.h)")
                                  .expect("residuals:null", invalid("residuals"))));
      auto lnl_grads = [](World &w) {
        te_layernorm_linear_grads &g = w.keep(te_layernorm_linear_grads{});
        w.ok(te_layernorm_linear_grads_init(&g), "te_layernorm_linear_grads_init");
        g.dx = w.dx.get();
        g.dln_weight = output(w, TE_DTYPE_F32, {N}).get();
        g.dln_bias = output(w, TE_DTYPE_F32, {N}).get();
        g.dw = w.dw.get();
        g.db = w.db.get();
        return &g;
      };
      const char *grads_null = "every pointer may be NULL to skip it";
      t.push_back(from_extras(lnl_tensors(Def<args::te_layernorm_linear_backward_from>(
                                              [fill, bargs, lnl_grads](World &w, args::te_layernorm_linear_backward_from &a) {
                                                a.ctx = w.ctx;
                                                a.m = lnl_new(w, w.ctx);
                                                a.inputs = &lnl_fwd_args(w);
                                                fill(w, a,
                                                     [&](size_t *n) {
                                                       return te_layernorm_linear_residuals_size(w.ctx, a.m, a.inputs, n);
                                                     },
                                                     [&](te_tensor *y, void *p, size_t n) {
                                                       return te_layernorm_linear_forward_compute_into(w.ctx, a.m, a.inputs,
                                                                                                       y, p, n);
                                                     });
                                                a.dy = w.dy.get();
                                                a.grads = lnl_grads(w);
                                                a.args = bargs(w);
                                              }),
                                          "inputs")
                                  .tensor("dy", TE_DTYPE_F32, {N, N})
                                  .tensor("grads->dx", TE_DTYPE_F32, {N, N})
                                  .tensor("grads->dln_weight", TE_DTYPE_F32, {N})
                                  .tensor("grads->dln_bias", TE_DTYPE_F32, {N})
                                  .tensor("grads->dw", TE_DTYPE_F32, {N, N})
                                  .tensor("grads->db", TE_DTYPE_F32, {N})
                                  .null_ok("grads", "grads and args may be NULL (nothing requested / no flags)")
                                  .null_ok("grads->dx", grads_null)
                                  .null_ok("grads->dln_weight", grads_null)
                                  .null_ok("grads->dln_bias", grads_null)
                                  .null_ok("grads->dw", grads_null)
                                  .null_ok("grads->db", grads_null)
                                  ));
      auto mlp_grads = [](World &w) {
        te_layernorm_mlp_grads &g = w.keep(te_layernorm_mlp_grads{});
        w.ok(te_layernorm_mlp_grads_init(&g), "te_layernorm_mlp_grads_init");
        g.dx = w.dx.get();
        g.dln_weight = output(w, TE_DTYPE_F32, {N}).get();
        g.dln_bias = output(w, TE_DTYPE_F32, {N}).get();
        g.dfc1_weight = output(w, TE_DTYPE_F32, {N, N}).get();
        g.dfc1_bias = output(w, TE_DTYPE_F32, {N}).get();
        g.dfc2_weight = output(w, TE_DTYPE_F32, {N, N}).get();
        g.dfc2_bias = output(w, TE_DTYPE_F32, {N}).get();
        return &g;
      };
      t.push_back(from_extras(mlp_tensors(Def<args::te_layernorm_mlp_backward_from>(
                                              [fill, bargs, mlp_grads](World &w, args::te_layernorm_mlp_backward_from &a) {
                                                a.ctx = w.ctx;
                                                a.m = mlp_new(w, w.ctx);
                                                a.inputs = &mlp_fwd_args(w);
                                                fill(w, a,
                                                     [&](size_t *n) {
                                                       return te_layernorm_mlp_residuals_size(w.ctx, a.m, a.inputs, n);
                                                     },
                                                     [&](te_tensor *y, void *p, size_t n) {
                                                       return te_layernorm_mlp_forward_compute_into(w.ctx, a.m, a.inputs, y,
                                                                                                    p, n);
                                                     });
                                                a.dy = w.dy.get();
                                                a.grads = mlp_grads(w);
                                                a.args = bargs(w);
                                              }),
                                          "inputs")
                                  .tensor("dy", TE_DTYPE_F32, {N, N})
                                  .tensor("grads->dx", TE_DTYPE_F32, {N, N})
                                  .tensor("grads->dln_weight", TE_DTYPE_F32, {N})
                                  .tensor("grads->dln_bias", TE_DTYPE_F32, {N})
                                  .tensor("grads->dfc1_weight", TE_DTYPE_F32, {N, N})
                                  .tensor("grads->dfc1_bias", TE_DTYPE_F32, {N})
                                  .tensor("grads->dfc2_weight", TE_DTYPE_F32, {N, N})
                                  .tensor("grads->dfc2_bias", TE_DTYPE_F32, {N})
                                  .null_ok("grads", "grads and args may be NULL (nothing requested / no flags)")
                                  .null_ok("grads->dx", grads_null)
                                  .null_ok("grads->dln_weight", grads_null)
                                  .null_ok("grads->dln_bias", grads_null)
                                  .null_ok("grads->dfc1_weight", grads_null)
                                  .null_ok("grads->dfc1_bias", grads_null)
                                  .null_ok("grads->dfc2_weight", grads_null)
                                  .null_ok("grads->dfc2_bias", grads_null)
                                  ));
      t.push_back(from_extras(Def<args::te_grouped_linear_backward_from>(
                                  [fill, bargs](World &w, args::te_grouped_linear_backward_from &a) {
                                    a.ctx = w.ctx;
                                    a.g = grouped_new(w, w.ctx);
                                    a.inputs = &grouped_fwd_args(w);
                                    fill(w, a,
                                         [&](size_t *n) { return te_grouped_linear_residuals_size(w.ctx, a.g, a.inputs, n); },
                                         [&](te_tensor *y, void *p, size_t n) {
                                           return te_grouped_linear_forward_compute_into(w.ctx, a.g, a.inputs, y, p, n);
                                         });
                                    a.dy = w.dy.get();
                                    a.dx = w.dx.get();
                                    a.args = bargs(w);
                                  })
                                  .tensor("inputs->input", TE_DTYPE_F32, {N, N})
                                  .tensor("dy", TE_DTYPE_F32, {N, N})
                                  .tensor("dx", TE_DTYPE_F32, {N, N})
                                  .null_ok("inputs", "Under FP8 inputs may be NULL")
                                  .null_ok("dx", "each array, and dx, may be NULL to skip it")
                                  .null_ok("dw", "each array, and dx, may be NULL to skip it")
                                  .null_ok("db", "each array, and dx, may be NULL to skip it")
                                  .expect("residuals:null", invalid("residuals"))
                                  .extra("inputs_m_splits_differ",
                                         [](World &w, args::te_grouped_linear_backward_from &a) {
                                           te_grouped_linear_forward_args &c = w.keep(*a.inputs);
                                           c.m_splits = w.keep(std::vector<int64_t>{5, 5, 6}).data();
                                           a.inputs = &c;
                                         },
                                         invalid("inputs->m_splits[1]"))));
    }
    // ---- attention and RoPE ---------------------------------------------------------------
    // Attentions are made per case (attn_ helpers above): 2 query heads, 1 kv head, head_dim 8,
    // F32, causal, fp8 = 1; forwards in THD with CPU offsets {0, 3, 8} / {0, 4, 8}, FP8 inside
    // the world's delayed-scaling scope.
    {
      using AO = te_attention_options;
      auto with = [](std::function<void(AO &)> m) {
        return [m](World &w, args::te_attention_create &a) {
          AO &o = w.keep(*a.opts);
          m(o);
          a.opts = &o;
        };
      };
      const char *scale_why = "softmax_scale: default 0: 1 / sqrt(head_dim); else finite, > 0";
      t.push_back(Def<args::te_attention_options_init>([](World &w, args::te_attention_options_init &a) {
        a.opts = &w.keep(te_attention_options{});
      }));
      t.push_back(
          Def<args::te_attention_create>([](World &w, args::te_attention_create &a) {
            a.out = &w.keep<te_attention *>(nullptr);
            a.ctx = w.ctx;
            a.opts = &attn_options(w);
          })
              .extra("num_heads_0", with([](AO &o) { o.num_heads = 0; }), invalid("opts->num_heads"))
              .extra("num_heads_neg1", with([](AO &o) { o.num_heads = -1; }), invalid("opts->num_heads"))
              .extra("num_kv_heads_not_a_divisor", with([](AO &o) { o.num_heads = 4; o.num_kv_heads = 3; }),
                     invalid("opts->num_kv_heads"))
              .extra("num_kv_heads_above_num_heads", with([](AO &o) { o.num_kv_heads = 4; }), invalid("opts->num_kv_heads"))
              .extra("num_kv_heads_neg1", with([](AO &o) { o.num_kv_heads = -1; }), invalid("opts->num_kv_heads"))
              .extra("num_kv_heads_int_min", with([](AO &o) { o.num_kv_heads = INT32_MIN; }), invalid("opts->num_kv_heads"))
              .extra("head_dim_0", with([](AO &o) { o.head_dim = 0; }), invalid("opts->head_dim"))
              .extra("head_dim_12", with([](AO &o) { o.head_dim = 12; }), invalid("opts->head_dim"))
              .extra("head_dim_264", with([](AO &o) { o.head_dim = 264; }), invalid("opts->head_dim"))
              .extra("softmax_scale_neg", with([](AO &o) { o.softmax_scale = -1.0f; }),
                     reject({IA}, scale_why, "opts->softmax_scale"))
              .extra("softmax_scale_nan", with([](AO &o) { o.softmax_scale = std::nanf(""); }),
                     reject({IA}, scale_why, "opts->softmax_scale"))
              .extra("softmax_scale_inf", with([](AO &o) { o.softmax_scale = INFINITY; }),
                     reject({IA}, scale_why, "opts->softmax_scale"))
              .extra("mask_3", with([](AO &o) {
                       const int32_t v = 3;
                       std::memcpy(&o.mask, &v, sizeof v);
                     }),
                     invalid("opts->mask"))
              .extra("activation_dtype_e4m3", with([](AO &o) { o.activation_dtype = TE_DTYPE_E4M3; }),
                     invalid("opts->activation_dtype"))
              .extra("activation_dtype_i32", with([](AO &o) { o.activation_dtype = TE_DTYPE_I32; }),
                     invalid("opts->activation_dtype")));
      t.push_back(Def<args::te_attention_destroy>([](World &w, args::te_attention_destroy &a) {
        a.m = attn_new(w, w.ctx, false);
      }));
      t.push_back(Def<args::te_attention_forward_args_init>([](World &w, args::te_attention_forward_args_init &a) {
        a.args = &w.keep(te_attention_forward_args{});
      }));
      t.push_back(Def<args::te_attention_grads_init>([](World &w, args::te_attention_grads_init &a) {
        a.grads = &w.keep(te_attention_grads{});
      }));
    }
    // The THD forward's tensors under `p` ("args" or "inputs").
    auto attn_tensors = [](auto d, const std::string &p) {
      return d.tensor(p + "->q", TE_DTYPE_F32, {ATQ, AH, AD})
          .tensor(p + "->k", TE_DTYPE_F32, {ATKV, AKV, AD})
          .tensor(p + "->v", TE_DTYPE_F32, {ATKV, AKV, AD})
          .tensor(p + "->cu_seqlens_q", TE_DTYPE_I32, {3})
          .tensor(p + "->cu_seqlens_kv", TE_DTYPE_I32, {3});
    };
    {
      // forward_compute, forward, forward_compute_into: THD, FP8 in the world's scope.
      using FA = te_attention_forward_args;
      auto args_with = [](std::function<void(World &, FA &)> m) {
        return [m](World &w, auto &a) {
          FA &c = w.keep(*a.args);
          m(w, c);
          a.args = &c;
        };
      };
      auto cu_q = [args_with](std::vector<int32_t> v) {
        return args_with([v](World &w, FA &c) { c.cu_seqlens_q = attn_raw_offsets(w, v).get(); });
      };
      auto cu_kv = [args_with](std::vector<int32_t> v) {
        return args_with([v](World &w, FA &c) { c.cu_seqlens_kv = attn_raw_offsets(w, v).get(); });
      };
      const char *offs_why = "On a CPU context the offsets are validated (start at 0, never decrease, end at the "
                             "token count, lengths within max_seqlen: INVALID_ARGUMENT otherwise)";
      auto common = [=](auto d) {
        return attn_tensors(d, "args")
            .tensor("o", TE_DTYPE_F32, {ATQ, AH, AD})
            .extra("cu_seqlens_q_decreasing", cu_q({0, 9, 8}), reject({IA}, offs_why, "args->cu_seqlens_q"))
            .extra("cu_seqlens_q_not_from_0", cu_q({1, 3, 8}), reject({IA}, offs_why, "args->cu_seqlens_q"))
            .extra("cu_seqlens_q_negative", cu_q({0, -3, 8}), reject({IA}, offs_why, "args->cu_seqlens_q"))
            .extra("cu_seqlens_q_last_short", cu_q({0, 3, 7}), reject({IA}, offs_why, "args->cu_seqlens_q"))
            .extra("cu_seqlens_q_last_beyond", cu_q({0, 3, 9}), reject({IA}, offs_why, "args->cu_seqlens_q"))
            .extra("cu_seqlens_q_int_max", cu_q({0, INT32_MAX, 8}), reject({IA}, offs_why, "args->cu_seqlens_q"))
            .extra("cu_seqlens_q_length_above_max", cu_q({0, 1, 8}), reject({IA}, offs_why, "args->cu_seqlens_q"))
            .extra("cu_seqlens_kv_decreasing", cu_kv({0, 8, 4, 8}), invalid("args->cu_seqlens_kv"))
            .extra("cu_seqlens_kv_int_min", cu_kv({0, INT32_MIN, 8}), reject({IA}, offs_why, "args->cu_seqlens_kv"))
            .extra("cu_seqlens_kv_other_batch", cu_kv({0, 4, 4, 8}),
                   reject({IA}, "offsets not I32 [batch + 1]", "args->cu_seqlens_kv"))
            .extra("cu_seqlens_q_one_entry", cu_q({0}), reject({IA}, "offsets not I32 [batch + 1]", "args->cu_seqlens_q"))
            .extra("cu_seqlens_q_2d",
                   args_with([](World &w, FA &c) {
                     HostTensor &h = attn_offsets(w, {3, 5});
                     h.t.ndim = 2;
                     h.t.shape[0] = 1;
                     h.t.shape[1] = 3;
                     c.cu_seqlens_q = h.get();
                   }),
                   reject({IA}, "offsets not I32 [batch + 1]", "args->cu_seqlens_q"))
            .extra("max_seqlen_q_0", args_with([](World &, FA &c) { c.max_seqlen_q = 0; }),
                   reject({IA}, "max_seqlen_q / _kv bound every length (THD: required, > 0)", "args->max_seqlen_q"))
            .extra("max_seqlen_kv_neg1", args_with([](World &, FA &c) { c.max_seqlen_kv = -1; }),
                   reject({IA}, "THD: required, > 0", "args->max_seqlen_kv"))
            .extra("max_seqlen_kv_int64_max", args_with([](World &, FA &c) { c.max_seqlen_kv = INT64_MAX; }),
                   [] {
                     // te.h bounds the lengths by max_seqlen, not max_seqlen by the tokens; the
                     // library refuses max_seqlen above the token count (reported as undocumented).
                     Expect e = reject_or_accept("max_seqlen_q / _kv bound every length (THD: required, > 0)");
                     e.name = "args->max_seqlen_kv";
                     return e;
                   }())
            .extra("q_heads_not_num_heads",
                   args_with([](World &w, FA &c) { c.q = input(w, TE_DTYPE_F32, {ATQ, 3, AD}, 97).get(); }),
                   reject({IA}, "head counts or head_dim not the layer's", "args->q"))
            .extra("k_head_dim_16",
                   args_with([](World &w, FA &c) { c.k = input(w, TE_DTYPE_F32, {ATKV, AKV, 16}, 98).get(); }),
                   reject({IA}, "head counts or head_dim not the layer's", "args->k"))
            .extra("v_not_like_k",
                   args_with([](World &w, FA &c) { c.v = input(w, TE_DTYPE_F32, {ATKV - 1, AKV, AD}, 99).get(); }),
                   invalid("args->v"))
            .extra("q_bshd_with_offsets",
                   args_with([](World &w, FA &c) { c.q = input(w, TE_DTYPE_F32, {2, 4, AH, AD}, 100).get(); }),
                   invalid("args->q"))
            .extra("bshd_batch_differs",
                   [](World &w, auto &a) {
                     FA &c = attn_bshd_args(w);
                     c.k = input(w, TE_DTYPE_F32, {3, 4, AKV, AD}, 101).get();
                     c.v = c.k;
                     a.args = &c;
                     a.o = output(w, TE_DTYPE_F32, {2, 4, AH, AD}).get();
                   },
                   reject({IA}, "batch of q and k differing", "args->k"))
            .extra("o_wrong_shape", [](World &w, auto &a) { a.o = output(w, TE_DTYPE_F32, {ATQ, AH, 16}).get(); },
                   invalid("o"))
            .extra("m_of_another_context",
                   [](World &w, auto &a) { a.m = attn_new(w, static_cast<te_context *>(w.make("te_context")), false); },
                   invalid("m|ctx"));
      };
      t.push_back(common(Def<args::te_attention_forward_compute>([](World &w, args::te_attention_forward_compute &a) {
        a.m = attn_new(w, w.ctx);
        begin_fp8_scope(w);
        a.ctx = w.ctx;
        a.args = &attn_thd_args(w);
        a.o = attn_o(w).get();
        te_attention_residuals &r = w.keep(te_attention_residuals{});
        r.struct_size = sizeof r;
        a.residuals = &r;
      })));
      t.push_back(common(Def<args::te_attention_forward>([](World &w, args::te_attention_forward &a) {
        a.m = attn_new(w, w.ctx);
        begin_fp8_scope(w);
        a.ctx = w.ctx;
        a.args = &attn_thd_args(w);
        a.o = attn_o(w).get();
        a.out = &w.keep<te_attention_backward_ctx *>(nullptr);
      })));
      const char *room = "at least residuals_size bytes: SIZE_MAX bytes of room are room enough";
      t.push_back(common(Def<args::te_attention_forward_compute_into>(
                             [](World &w, args::te_attention_forward_compute_into &a) {
                               a.m = attn_new(w, w.ctx);
                               begin_fp8_scope(w);
                               a.ctx = w.ctx;
                               a.args = &attn_thd_args(w);
                               a.o = attn_o(w).get();
                               size_t n = 0;
                               w.ok(te_attention_residuals_size(w.ctx, a.m, a.args, &n), "te_attention_residuals_size");
                               a.residuals = w.block(n);
                               a.residuals_bytes = n;
                               w.watch(a.residuals, n, "residuals");
                             }))
                      .expect("residuals_bytes:size_max", accept(room))
                      .extra("residuals_bytes_short",
                             [](World &, args::te_attention_forward_compute_into &a) { a.residuals_bytes -= 1; },
                             invalid("residuals_bytes"))
                      .extra("residuals_misaligned",
                             [](World &w, args::te_attention_forward_compute_into &a) {
                               unsigned char *p = static_cast<unsigned char *>(w.block(a.residuals_bytes + 64));
                               a.residuals = p + 1;
                             },
                             invalid("residuals")));
      // residuals_size: THD shapes (CPU offsets that are given are validated).
      const char *shape_only = "residuals_size reads shapes only (every data pointer, the offsets' too, may be NULL)";
      t.push_back(attn_tensors(Def<args::te_attention_residuals_size>([](World &w, args::te_attention_residuals_size &a) {
                                 a.m = attn_new(w, w.ctx);
                                 begin_fp8_scope(w);
                                 a.ctx = w.ctx;
                                 a.args = &attn_thd_args(w);
                                 a.bytes = &w.keep(size_t(0));
                               }),
                               "args")
                      .expect("args->q:data_null", accept(shape_only))
                      .expect("args->k:data_null", accept(shape_only))
                      .expect("args->v:data_null", accept(shape_only))
                      .expect("args->cu_seqlens_q:data_null", accept(shape_only))
                      .expect("args->cu_seqlens_kv:data_null", accept(shape_only))
                      .extra("cu_seqlens_q_decreasing", cu_q({0, 9, 8}), invalid("args->cu_seqlens_q"))
                      .extra("max_seqlen_q_0", args_with([](World &, FA &c) { c.max_seqlen_q = 0; }),
                             invalid("args->max_seqlen_q"))
                      .check([](World &, const args::te_attention_residuals_size &a, const CallResult &) {
                        return *a.bytes > 0 ? "" : "0 bytes: the block holds the LSE, so it is never empty";
                      }));
    }
    {
      // residuals_release and forward_save: residuals of an FP8 THD forward in an open scope.
      using RR = args::te_attention_residuals_release;
      t.push_back(Def<RR>([](World &w, RR &a) {
                    te_attention *m = attn_new(w, w.ctx);
                    begin_fp8_scope(w);
                    a.residuals = &attn_residuals(w, m);
                  })
                      .inout("residuals")
                      .extra("internal_garbage",
                             [](World &w, RR &a) {
                               te_attention_residuals &c = w.keep(*a.residuals);
                               c.internal = w.block(64);
                               a.residuals = &c;
                             },
                             no_crash())
                      .extra("internal_of_a_layernorm_linear",
                             [](World &w, RR &a) {
                               te_layernorm_linear *lm = lnl_new(w, w.ctx, false);
                               te_layernorm_linear_residuals &lr = lnl_residuals(w, lm);
                               te_attention_residuals &c = w.keep(*a.residuals);
                               c.internal = lr.internal;
                               a.residuals = &c;
                               w.post_check([&w, lm, &lr]() -> std::string {
                                 te_layernorm_linear_backward_ctx *b = nullptr;
                                 te_status s = te_layernorm_linear_forward_save(w.ctx, lm, &lr, &b);
                                 te_layernorm_linear_backward_ctx_destroy(b);
                                 return s == TE_SUCCESS ? "" : std::string("a LayerNormLinear's residuals were freed "
                                                                           "through te_attention_residuals_release: ") +
                                                                   te_last_error();
                               });
                             },
                             no_crash()));
      using FS = args::te_attention_forward_save;
      t.push_back(
          Def<FS>([](World &w, FS &a) {
            a.m = attn_new(w, w.ctx);
            begin_fp8_scope(w);
            a.ctx = w.ctx;
            a.residuals = &attn_residuals(w, a.m);
            a.out = &w.keep<te_attention_backward_ctx *>(nullptr);
          })
              .inout("residuals")
              .extra("internal_null",
                     [](World &w, FS &a) {
                       te_attention_residuals &c = w.keep(*a.residuals);
                       c.internal = nullptr;
                       a.residuals = &c;
                     },
                     invalid("residuals"))
              .extra("internal_garbage",
                     [](World &w, FS &a) {
                       te_attention_residuals &c = w.keep(*a.residuals);
                       c.internal = w.block(64);
                       a.residuals = &c;
                     },
                     invalid("residuals"))
              .extra("already_saved_copy",
                     [](World &w, FS &a) {
                       te_attention_residuals &old = attn_residuals(w, a.m);
                       te_attention_residuals &copy = w.keep(old);
                       te_attention_backward_ctx *b = nullptr;
                       w.ok(te_attention_forward_save(w.ctx, a.m, &old, &b), "te_attention_forward_save");
                       a.residuals = &copy;
                     },
                     invalid("residuals"))
              .extra("released_copy",
                     [](World &w, FS &a) {
                       te_attention_residuals &old = attn_residuals(w, a.m);
                       te_attention_residuals &copy = w.keep(old);
                       te_attention_residuals_release(&old);
                       (void)attn_residuals(w, a.m);
                       a.residuals = &copy;
                     },
                     invalid("residuals"))
              .extra("residuals_of_another_module",
                     [](World &w, FS &a) { a.residuals = &attn_residuals(w, attn_new(w, w.ctx, false)); },
                     invalid("residuals|m"))
              .extra("internal_of_a_layernorm_linear",
                     [](World &w, FS &a) {
                       te_attention_residuals &c = w.keep(*a.residuals);
                       c.internal = lnl_residuals(w, lnl_new(w, w.ctx, false)).internal;
                       a.residuals = &c;
                     },
                     invalid("residuals")));
    }
    {
      // backward: the backward context of one FP8 step of a used attention, every gradient.
      using AB = args::te_attention_backward;
      const char *null_why = "The gradients backward writes, each like its input; any may be NULL.";
      const char *ga_why = "grads and args may be NULL.";
      auto grads_with = [](std::function<void(World &, te_attention_grads &)> m) {
        return [m](World &w, auto &a) {
          te_attention_grads &c = w.keep(*a.grads);
          m(w, c);
          a.grads = &c;
        };
      };
      auto grad_tensors = [null_why, ga_why](auto d) {
        return d.tensor("d_o", TE_DTYPE_F32, {ATQ, AH, AD})
            .tensor("grads->dq", TE_DTYPE_F32, {ATQ, AH, AD})
            .tensor("grads->dk", TE_DTYPE_F32, {ATKV, AKV, AD})
            .tensor("grads->dv", TE_DTYPE_F32, {ATKV, AKV, AD})
            .null_ok("grads", ga_why)
            .null_ok("args", ga_why)
            .null_ok("grads->dq", null_why)
            .null_ok("grads->dk", null_why)
            .null_ok("grads->dv", null_why);
      };
      auto bad_grads = [grads_with](auto d) {
        return d
            .extra("flags_unknown",
                   [](World &w, auto &a) {
                     te_linear_backward_args &b = w.keep(te_linear_backward_args{});
                     te_linear_backward_args_init(&b);
                     b.flags = 0x2;
                     a.args = &b;
                   },
                   invalid("args->flags"))
            .extra("d_o_other_tokens", [](World &w, auto &a) { a.d_o = input(w, TE_DTYPE_F32, {ATQ + 1, AH, AD}, 102).get(); },
                   invalid("d_o"))
            .extra("dq_kv_shaped",
                   grads_with([](World &w, te_attention_grads &c) { c.dq = output(w, TE_DTYPE_F32, {ATKV, AKV, AD}).get(); }),
                   invalid("grads->dq"))
            .extra("dk_q_shaped",
                   grads_with([](World &w, te_attention_grads &c) { c.dk = output(w, TE_DTYPE_F32, {ATQ, AH, AD}).get(); }),
                   invalid("grads->dk"))
            .extra("dv_bf16",
                   grads_with([](World &w, te_attention_grads &c) { c.dv = output(w, TE_DTYPE_BF16, {ATKV, AKV, AD}).get(); }),
                   invalid("grads->dv"));
      };
      t.push_back(bad_grads(grad_tensors(Def<AB>([](World &w, AB &a) {
                                           a.ctx = w.ctx;
                                           a.bwd = attn_backward_ctx(w, w.ctx, attn_used(w, w.ctx));
                                           a.d_o = input(w, TE_DTYPE_F32, {ATQ, AH, AD}, 96).get();
                                           a.grads = &attn_grads(w);
                                           te_linear_backward_args &b = w.keep(te_linear_backward_args{});
                                           w.ok(te_linear_backward_args_init(&b), "te_linear_backward_args_init");
                                           a.args = &b;
                                         })))
                      .extra("bwd_once_already_run",
                             [](World &w, AB &a) {
                               te_attention_backward_ctx *b = attn_backward_ctx(w, w.ctx, attn_new(w, w.ctx, false), false);
                               te_linear_backward_args ba;
                               w.ok(te_linear_backward_args_init(&ba), "te_linear_backward_args_init");
                               ba.flags = TE_BACKWARD_ONCE;
                               w.ok(te_attention_backward(w.ctx, b, a.d_o, nullptr, &ba), "te_attention_backward (once)");
                               a.bwd = b;
                             },
                             reject({IS}, "as te_linear_backward: TE_BACKWARD_ONCE frees it at the first (later calls: "
                                          "INVALID_STATE)"))
                      .extra("bwd_of_another_context",
                             [](World &w, AB &a) {
                               te_context *c2 = static_cast<te_context *>(w.make("te_context"));
                               a.bwd = attn_backward_ctx(w, c2, attn_new(w, c2, false));
                             },
                             invalid("bwd|ctx")));
      t.push_back(Def<args::te_attention_backward_ctx_destroy>([](World &w, args::te_attention_backward_ctx_destroy &a) {
        a.bwd = attn_backward_ctx(w, w.ctx, attn_new(w, w.ctx, false), false);
      }));
      // backward_from: the record of one FP8 THD forward into a block (scope opened and closed here).
      using BF = args::te_attention_backward_from;
      const char *room = "at least residuals_size bytes: SIZE_MAX bytes of room are room enough";
      t.push_back(bad_grads(grad_tensors(attn_tensors(Def<BF>([](World &w, BF &a) {
                                                        a.ctx = w.ctx;
                                                        a.m = attn_new(w, w.ctx);
                                                        a.inputs = &attn_thd_args(w);
                                                        HostTensor &o = attn_o(w);
                                                        {
                                                          FixtureScope scope(w, w.ctx, true);
                                                          size_t n = 0;
                                                          w.ok(te_attention_residuals_size(w.ctx, a.m, a.inputs, &n),
                                                               "te_attention_residuals_size (fixture)");
                                                          void *p = w.block(n);
                                                          w.ok(te_attention_forward_compute_into(w.ctx, a.m, a.inputs,
                                                                                                 o.get(), p, n),
                                                               "te_attention_forward_compute_into (fixture)");
                                                          a.residuals = p;
                                                          a.residuals_bytes = n;
                                                        }
                                                        a.o = o.get();
                                                        a.d_o = input(w, TE_DTYPE_F32, {ATQ, AH, AD}, 96).get();
                                                        a.grads = &attn_grads(w);
                                                        te_linear_backward_args &b = w.keep(te_linear_backward_args{});
                                                        w.ok(te_linear_backward_args_init(&b), "te_linear_backward_args_init");
                                                        a.args = &b;
                                                      }),
                                                      "inputs")))
                      .tensor("o", TE_DTYPE_F32, {ATQ, AH, AD})
                      .skip("residuals_bytes:size_max",
                            std::string(room) + "; an accepted backward_from is a second backward of the pass, which "
                            "the valid call after it cannot repeat bit for bit (tests/api covers repeated backwards)")
                      .expect("residuals:null", invalid("residuals"))
                      .extra("residuals_bytes_short", [](World &, BF &a) { a.residuals_bytes -= 1; },
                             invalid("residuals_bytes"))
                      .extra("residuals_no_forward_filled", [](World &w, BF &a) { a.residuals = w.block(a.residuals_bytes); },
                             invalid("residuals"))
                      .extra("inputs_other_lengths",
                             [](World &w, BF &a) {
                               te_attention_forward_args &c = w.keep(*a.inputs);
                               c.max_seqlen_q = 6;
                               a.inputs = &c;
                             },
                             invalid("inputs"))
                      .extra("inputs_offsets_decreasing",
                             [](World &w, BF &a) {
                               te_attention_forward_args &c = w.keep(*a.inputs);
                               c.cu_seqlens_q = attn_raw_offsets(w, {0, 9, 8}).get();
                               a.inputs = &c;
                             },
                             invalid("inputs->cu_seqlens_q"))
                      .extra("o_other_shape", [](World &w, BF &a) { a.o = input(w, TE_DTYPE_F32, {ATQ, AH, 16}, 103).get(); },
                             invalid("o"))
                      .extra("m_of_another_forward",
                             [](World &w, BF &a) { a.m = attn_new(w, w.ctx, false); }, invalid("residuals")));
    }
    {
      // Scaling states and state save/load of used attentions.
      using GS = args::te_attention_get_scaling_state;
      t.push_back(Def<GS>([](World &w, GS &a) {
                    a.ctx = w.ctx;
                    a.m = attn_used(w, w.ctx);
                    a.which = TE_ATTN_DO;
                    te_scaling_state_info &i = w.keep(te_scaling_state_info{});
                    i.struct_size = sizeof i;
                    a.info = &i;
                    std::vector<float> &h = w.keep(std::vector<float>(16, -7.0f));
                    a.history = h.data();
                    a.history_cap = h.size();
                    w.watch(h.data(), h.size() * sizeof(float), "history[16]");
                  })
                      .null_ok("history", "with te_linear's module contract (... scaling-state inspection ...): "
                                          "`history` may be NULL (te_linear_get_scaling_state)")
                      .expect("history_cap:size_max",
                              accept("min(history_cap, amax_history_len) floats are written: the buffer holds "
                                     "amax_history_len (16)"))
                      .extra("which_6", [](World &, GS &a) { a.which = static_cast<te_attention_tensor>(6); },
                             invalid("which"))
                      .check([](World &, const GS &a, const CallResult &) {
                        return a.info->amax_history_len == 16 ? "" : "dO's amax_history_len is not the recipe's 16";
                      }));
      t.push_back(Def<args::te_attention_state_save>([](World &w, args::te_attention_state_save &a) {
                    a.ctx = w.ctx;
                    a.m = attn_used(w, w.ctx);
                    size_t n = 0;
                    w.ok(te_attention_state_save(w.ctx, a.m, nullptr, 0, &n), "te_attention_state_save (size)");
                    a.buf = w.block(n);
                    a.capacity = n;
                    a.size = &w.keep(size_t(0));
                    w.watch(a.buf, n, "buf");
                  })
                      .null_ok("buf", "with te_linear's module contract (... state save/load ...): With buf NULL, "
                                      "only *size is set to the bytes needed (te_linear_state_save)")
                      .expect("capacity:size_max", accept("capacity is the caller's buffer size: the state fits"))
                      .extra("capacity_short", [](World &, args::te_attention_state_save &a) { a.capacity -= 1; },
                             invalid("capacity")));
      using SL = args::te_attention_state_load;
      auto bytes = [](std::function<void(std::vector<unsigned char> &)> m) {
        return [m](World &w, SL &a) {
          const auto *p = static_cast<const unsigned char *>(a.buf);
          std::vector<unsigned char> &c = w.keep(std::vector<unsigned char>(p, p + a.size));
          m(c);
          a.buf = c.data();
          a.size = c.size();
        };
      };
      // Layout (core/modules/attention/pool_and_state.cpp, modules/common/state_io.h): "TEAT", u32
      // version, [heads, kv_heads, head_dim] as i64, then per state (Q, K, V, S, dO, dP): i32
      // history_len, i32 fp8 dtype, f32 scale, f32 scale_inv, history.
      const size_t first = 4 + 4 + 3 * 8;
      auto put32 = [](std::vector<unsigned char> &v, size_t at, int32_t x) { std::memcpy(v.data() + at, &x, 4); };
      t.push_back(
          Def<SL>([](World &w, SL &a) {
            a.ctx = w.ctx;
            a.m = attn_used(w, w.ctx);
            std::vector<unsigned char> &s = attn_saved_state(w, attn_used(w, w.ctx));
            a.buf = s.data();
            a.size = s.size();
          })
              .expect("size:size_max", reject_or_accept("the buffer holds a whole state; te_linear's contract bounds "
                                                        "nothing but truncation"))
              .extra("truncated", bytes([](std::vector<unsigned char> &v) { v.pop_back(); }), invalid("buf|size"))
              .extra("trailing_byte", bytes([](std::vector<unsigned char> &v) { v.push_back(0); }), invalid("buf|size"))
              .extra("empty", [](World &, SL &a) { a.size = 0; }, invalid("buf|size"))
              .extra("bad_magic", bytes([](std::vector<unsigned char> &v) { v[3] = 'X'; }), invalid("buf"))
              .extra("other_version", bytes([](std::vector<unsigned char> &v) { v[4] ^= 0x40; }), invalid("buf"))
              .extra("history_len_neg1", bytes([put32, first](std::vector<unsigned char> &v) { put32(v, first, -1); }),
                     invalid("buf"))
              .extra("fp8_dtype_i32", bytes([put32, first](std::vector<unsigned char> &v) { put32(v, first + 4, TE_DTYPE_I32); }),
                     invalid("buf"))
              .extra("other_heads",
                     [](World &w, SL &a) {
                       std::vector<unsigned char> &s = attn_saved_state(
                           w, attn_new(w, w.ctx, false, [](te_attention_options &o) { o.num_heads = 4; }));
                       a.buf = s.data();
                       a.size = s.size();
                     },
                     invalid("buf|m"))
              .extra("other_kv_heads_only",
                     [](World &w, SL &a) {
                       std::vector<unsigned char> &s = attn_saved_state(
                           w, attn_new(w, w.ctx, false, [](te_attention_options &o) { o.num_kv_heads = 2; }));
                       a.buf = s.data();
                       a.size = s.size();
                     },
                     invalid("buf|m"))
              .extra("a_te_linear_state",
                     [](World &w, SL &a) {
                       std::vector<unsigned char> &s = saved_state(w, w.lin);
                       a.buf = s.data();
                       a.size = s.size();
                     },
                     invalid("buf"))
              .extra("a_layernorm_linear_state",
                     [](World &w, SL &a) {
                       std::vector<unsigned char> &s = lnl_saved_state(w, lnl_new(w, w.ctx, false));
                       a.buf = s.data();
                       a.size = s.size();
                     },
                     invalid("buf")));
    }
    {
      // RoPE: x [6, 2, 8] F32 THD (offsets {0, 2, 6}) forward, dy [2, 3, 2, 8] BSHD backward;
      // freqs F32 [4, 4] (rot_dim 8 = head_dim).
      t.push_back(Def<args::te_rope_options_init>([](World &w, args::te_rope_options_init &a) {
        a.opts = &w.keep(te_rope_options{});
      }));
      const char *opts_null = "te.h says nothing of a NULL opts (te_rope_options_init's defaults are documented, a "
                              "NULL opts is not); the implementation takes the defaults. Header/library mismatch, "
                              "reported: either outcome passes until te.h decides";
      const char *bshd_words = "BSHD [batch, seq, heads, head_dim], or THD [tokens, heads, head_dim] with "
                               "cu_seqlens I32 [batch + 1]";
      auto rope_opts = [](World &w) {
        te_rope_options &o = w.keep(te_rope_options{});
        w.ok(te_rope_options_init(&o), "te_rope_options_init");
        o.interleaved = 1;
        return &o;
      };
      auto opts_with = [](std::function<void(te_rope_options &)> m) {
        return [m](World &w, auto &a) {
          te_rope_options &o = w.keep(*a.opts);
          m(o);
          a.opts = &o;
        };
      };
      auto rope_common = [=](auto d, const std::string &x, const std::string &y) {
        return d.tensor("freqs", TE_DTYPE_F32, {4, 4})
            .wrong_dtype(x, TE_DTYPE_E4M3)
            .expect("opts:null", reject_or_accept(opts_null))
            .extra("rot_dim_odd", opts_with([](te_rope_options &o) { o.rot_dim = 7; }),
                   reject({IA}, "rot_dim odd or above head_dim", "opts->rot_dim"))
            .extra("rot_dim_above_head_dim", opts_with([](te_rope_options &o) { o.rot_dim = 10; }),
                   reject({IA}, "rot_dim odd or above head_dim", "opts->rot_dim"))
            .extra("rot_dim_neg2", opts_with([](te_rope_options &o) { o.rot_dim = -2; }), invalid("opts->rot_dim"))
            .extra("rot_dim_int_min", opts_with([](te_rope_options &o) { o.rot_dim = INT32_MIN; }),
                   invalid("opts->rot_dim"))
            .extra("rot_dim_4_with_full_freqs", opts_with([](te_rope_options &o) { o.rot_dim = 4; }),
                   reject({IA}, "freqs: F32 [positions, rot_dim / 2]", "freqs"))
            .extra("freqs_too_few_positions", [](World &w, auto &a) { a.freqs = input(w, TE_DTYPE_F32, {2, 4}, 110).get(); },
                   reject({IA}, "positions beyond freqs (CPU)", "freqs"))
            .extra("freqs_1d", [](World &w, auto &a) { a.freqs = input(w, TE_DTYPE_F32, {16}, 111).get(); },
                   invalid("freqs"))
            .extra(y + "_other_shape",
                   [](World &w, auto &a) { rope_out(a) = output(w, TE_DTYPE_F32, {6, 2, 16}).get(); },
                   invalid(y))
            .extra(y + "_bf16",
                   [](World &w, auto &a) {
                     const te_tensor *src = rope_in(a);
                     rope_out(a) = output(w, TE_DTYPE_BF16, std::vector<int64_t>(src->shape, src->shape + src->ndim)).get();
                   },
                   invalid(y));
      };
      t.push_back(
          rope_common(Def<args::te_rope_forward>([rope_opts](World &w, args::te_rope_forward &a) {
                        a.ctx = w.ctx;
                        a.opts = rope_opts(w);
                        a.x = input(w, TE_DTYPE_F32, {6, 2, AD}, 112).get();
                        a.freqs = input(w, TE_DTYPE_F32, {4, 4}, 113).get();
                        a.cu_seqlens = attn_offsets(w, {2, 4}).get();
                        a.y = output(w, TE_DTYPE_F32, {6, 2, AD}).get();
                      }),
                      "x", "y")
              .tensor("x", TE_DTYPE_F32, {6, 2, AD})
              .tensor("y", TE_DTYPE_F32, {6, 2, AD})
              .tensor("cu_seqlens", TE_DTYPE_I32, {3})
              .expect("cu_seqlens:null", reject({IA}, "THD [tokens, heads, head_dim] with cu_seqlens: without them x "
                                                      "is read as BSHD and its 3 dimensions are refused", "x|cu_seqlens"))
              .extra("cu_seqlens_decreasing",
                     [](World &w, args::te_rope_forward &a) { a.cu_seqlens = attn_raw_offsets(w, {0, 3, 2, 6}).get(); },
                     reject({IA}, "offsets as attention's", "cu_seqlens"))
              .extra("cu_seqlens_not_from_0",
                     [](World &w, args::te_rope_forward &a) { a.cu_seqlens = attn_raw_offsets(w, {2, 2, 6}).get(); },
                     reject({IA}, "offsets as attention's", "cu_seqlens"))
              .extra("cu_seqlens_int_min",
                     [](World &w, args::te_rope_forward &a) {
                       a.cu_seqlens = attn_raw_offsets(w, {0, INT32_MIN, 6}).get();
                     },
                     reject({IA}, "offsets as attention's", "cu_seqlens"))
              .extra("cu_seqlens_last_short",
                     [](World &w, args::te_rope_forward &a) { a.cu_seqlens = attn_raw_offsets(w, {0, 2, 5}).get(); },
                     reject({IA}, "offsets as attention's", "cu_seqlens"))
              .extra("cu_seqlens_length_beyond_freqs",
                     [](World &w, args::te_rope_forward &a) { a.cu_seqlens = attn_raw_offsets(w, {0, 1, 6}).get(); },
                     reject({IA}, "positions beyond freqs (CPU)", "freqs"))
              .extra("cu_seqlens_int_max_jump",
                     [](World &w, args::te_rope_forward &a) {
                       a.cu_seqlens = attn_raw_offsets(w, {0, INT32_MAX, 6}).get();
                     },
                     reject({IA}, "offsets as attention's", "cu_seqlens|freqs"))
              .extra("cu_seqlens_2d",
                     [](World &w, args::te_rope_forward &a) {
                       HostTensor &h = attn_offsets(w, {2, 4});
                       h.t.ndim = 2;
                       h.t.shape[0] = 1;
                       h.t.shape[1] = 3;
                       a.cu_seqlens = h.get();
                     },
                     reject({IA}, "cu_seqlens I32 [batch + 1]", "cu_seqlens"))
              .extra("x_bshd_with_offsets",
                     [](World &w, args::te_rope_forward &a) {
                       a.x = input(w, TE_DTYPE_F32, {2, 3, 2, AD}, 114).get();
                       a.y = output(w, TE_DTYPE_F32, {2, 3, 2, AD}).get();
                     },
                     invalid("x"))
              .extra("in_place",
                     [](World &w, args::te_rope_forward &a) {
                       HostTensor &c = w.keep(HostTensor());
                       c = w.keep(random_tensor(TE_DTYPE_F32, {6, 2, AD}, -2, 2, 112));
                       a.x = c.get();
                       a.y = c.get();
                     },
                     accept("y is like x and may be x itself (in place)")));
      t.push_back(
          rope_common(Def<args::te_rope_backward>([rope_opts](World &w, args::te_rope_backward &a) {
                        a.ctx = w.ctx;
                        a.opts = rope_opts(w);
                        a.dy = input(w, TE_DTYPE_F32, {2, 3, 2, AD}, 115).get();
                        a.freqs = input(w, TE_DTYPE_F32, {4, 4}, 116).get();
                        a.cu_seqlens = nullptr;
                        a.dx = output(w, TE_DTYPE_F32, {2, 3, 2, AD}).get();
                      }),
                      "dy", "dx")
              .tensor("dy", TE_DTYPE_F32, {2, 3, 2, AD})
              .tensor("dx", TE_DTYPE_F32, {2, 3, 2, AD})
              .tensor("cu_seqlens", TE_DTYPE_I32, {3})
              .null_ok("cu_seqlens", bshd_words)
              .skip("cu_seqlens:*", "the valid call is BSHD and passes no cu_seqlens to mutate (te_rope_forward's THD "
                                    "fixture mutates them)")
              .extra("seq_beyond_freqs",
                     [](World &w, args::te_rope_backward &a) {
                       a.dy = input(w, TE_DTYPE_F32, {2, 5, 2, AD}, 117).get();
                       a.dx = output(w, TE_DTYPE_F32, {2, 5, 2, AD}).get();
                     },
                     reject({IA}, "positions beyond freqs (CPU)", "freqs"))
              .extra("dy_thd_without_offsets",
                     [](World &w, args::te_rope_backward &a) {
                       a.dy = input(w, TE_DTYPE_F32, {6, 2, AD}, 118).get();
                       a.dx = output(w, TE_DTYPE_F32, {6, 2, AD}).get();
                     },
                     invalid("dy")));
    }
    add_training_fixtures(t);  // fixtures_training.cpp
    return t;
  }();
  return table;
}

// ---- the grouped linear's handle types in the World (world.cpp's knows_handle_type, make,
// destroy and probe hand these types over) ----------------------------------------------------

bool grouped_handle_type(const std::string &t) {
  return t == "te_grouped_linear" || t == "te_grouped_linear_backward_ctx";
}

void *grouped_make(World &w, const std::string &t) {
  if (t == "te_grouped_linear") return grouped_new(w, w.ctx, false);
  // A high-precision forward (inside a disabled scope when one is open, so that no pass changes).
  te_autocast_state st;
  std::memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  w.ok(te_autocast_get_state(w.ctx, &st), "te_autocast_get_state (grouped factory)");
  te_autocast_options o;
  std::memset(&o, 0, sizeof o);
  w.ok(te_autocast_options_init(&o), "te_autocast_options_init");
  o.enabled = 0;
  te_autocast_token tok = 0;
  if (st.depth > 0) w.ok(te_autocast_begin(w.ctx, &o, &tok), "te_autocast_begin (grouped factory, disabled)");
  HostTensor &y = output(w, TE_DTYPE_F32, {N, N});
  te_grouped_linear_backward_ctx *b = nullptr;
  w.ok(te_grouped_linear_forward(w.ctx, grouped_new(w, w.ctx, false), &grouped_fwd_args(w), y.get(), &b),
       "te_grouped_linear_forward (factory)");
  if (st.depth > 0) w.ok(te_autocast_end(w.ctx, tok), "te_autocast_end (grouped factory)");
  return b;
}

void grouped_destroy(const std::string &t, void *h) {
  if (t == "te_grouped_linear") te_grouped_linear_destroy(static_cast<te_grouped_linear *>(h));
  else te_grouped_linear_backward_ctx_destroy(static_cast<te_grouped_linear_backward_ctx *>(h));
}

std::string grouped_probe(World &w, const std::string &t, void *h) {
  te_status s;
  if (t == "te_grouped_linear") {
    size_t n = 0;
    s = te_grouped_linear_state_save(w.ctx, static_cast<te_grouped_linear *>(h), nullptr, 0, &n);
  } else {
    HostTensor &dx = output(w, TE_DTYPE_F32, {N, N});
    s = te_grouped_linear_backward(w.ctx, static_cast<te_grouped_linear_backward_ctx *>(h), w.dy.get(), dx.get(),
                                   nullptr, nullptr, nullptr);
  }
  return s == TE_SUCCESS ? "" : std::string(t) + " probe returned " + te_status_string(s) + ": " + te_last_error();
}


// ---- the LayerNormLinear / LayerNormMLP handle types in the World (world.cpp's
// knows_handle_type, make, destroy and probe hand these types over) ------------------------------

bool layernorm_handle_type(const std::string &t) {
  return t == "te_layernorm_linear" || t == "te_layernorm_linear_backward_ctx" || t == "te_layernorm_mlp" ||
         t == "te_layernorm_mlp_backward_ctx";
}

// Backward contexts come from a high-precision forward of a fresh module (inside a disabled
// scope when one is open, so that no pass changes).
void *layernorm_make(World &w, const std::string &t) {
  if (t == "te_layernorm_linear") return lnl_new(w, w.ctx, false);
  if (t == "te_layernorm_mlp") return mlp_new(w, w.ctx, false);
  if (t == "te_layernorm_linear_backward_ctx") return lnl_backward_ctx(w, w.ctx, lnl_new(w, w.ctx, false), false);
  return mlp_backward_ctx(w, w.ctx, mlp_new(w, w.ctx, false), false);
}

void layernorm_destroy(const std::string &t, void *h) {
  if (t == "te_layernorm_linear") te_layernorm_linear_destroy(static_cast<te_layernorm_linear *>(h));
  else if (t == "te_layernorm_mlp") te_layernorm_mlp_destroy(static_cast<te_layernorm_mlp *>(h));
  else if (t == "te_layernorm_linear_backward_ctx")
    te_layernorm_linear_backward_ctx_destroy(static_cast<te_layernorm_linear_backward_ctx *>(h));
  else te_layernorm_mlp_backward_ctx_destroy(static_cast<te_layernorm_mlp_backward_ctx *>(h));
}

std::string layernorm_probe(World &w, const std::string &t, void *h) {
  te_status s;
  size_t n = 0;
  if (t == "te_layernorm_linear") {
    s = te_layernorm_linear_state_save(w.ctx, static_cast<te_layernorm_linear *>(h), nullptr, 0, &n);
  } else if (t == "te_layernorm_mlp") {
    s = te_layernorm_mlp_state_save(w.ctx, static_cast<te_layernorm_mlp *>(h), nullptr, 0, &n);
  } else if (t == "te_layernorm_linear_backward_ctx") {
    te_layernorm_linear_grads g;
    te_layernorm_linear_grads_init(&g);
    g.dx = output(w, TE_DTYPE_F32, {N, N}).get();
    s = te_layernorm_linear_backward(w.ctx, static_cast<te_layernorm_linear_backward_ctx *>(h), w.dy.get(), &g, nullptr);
  } else {
    te_layernorm_mlp_grads g;
    te_layernorm_mlp_grads_init(&g);
    g.dx = output(w, TE_DTYPE_F32, {N, N}).get();
    s = te_layernorm_mlp_backward(w.ctx, static_cast<te_layernorm_mlp_backward_ctx *>(h), w.dy.get(), &g, nullptr);
  }
  return s == TE_SUCCESS ? "" : std::string(t) + " probe returned " + te_status_string(s) + ": " + te_last_error();
}


// ---- the attention's handle types in the World (world.cpp's knows_handle_type, make, destroy
// and probe hand these types over) ---------------------------------------------------------------

bool attention_handle_type(const std::string &t) { return t == "te_attention" || t == "te_attention_backward_ctx"; }

// A backward context comes from a high-precision forward of a fresh attention (inside a disabled
// scope when one is open, so that no pass changes).
void *attention_make(World &w, const std::string &t) {
  if (t == "te_attention") return attn_new(w, w.ctx, false);
  return attn_backward_ctx(w, w.ctx, attn_new(w, w.ctx, false), false);
}

void attention_destroy(const std::string &t, void *h) {
  if (t == "te_attention") te_attention_destroy(static_cast<te_attention *>(h));
  else te_attention_backward_ctx_destroy(static_cast<te_attention_backward_ctx *>(h));
}

std::string attention_probe(World &w, const std::string &t, void *h) {
  te_status s;
  if (t == "te_attention") {
    size_t n = 0;
    s = te_attention_state_save(w.ctx, static_cast<te_attention *>(h), nullptr, 0, &n);
  } else {
    HostTensor &dout = input(w, TE_DTYPE_F32, {ATQ, AH, AD}, 96);
    te_attention_grads g;
    te_attention_grads_init(&g);
    g.dq = output(w, TE_DTYPE_F32, {ATQ, AH, AD}).get();
    s = te_attention_backward(w.ctx, static_cast<te_attention_backward_ctx *>(h), dout.get(), &g, nullptr);
  }
  return s == TE_SUCCESS ? "" : std::string(t) + " probe returned " + te_status_string(s) + ": " + te_last_error();
}

}  // namespace sweep
