// Allocation-failure injection over training steps of LayerNormLinear and LayerNormMLP, and the
// allocation count of a warm step, on the CPU backend, through the public API only.
//
// As alloc_failure_test.cpp: this program replaces the global operator new/delete (every
// variant), which libte.so's allocations resolve to (its objects, containers and the CPU
// backend's blocks). A countdown makes the N-th allocation after arming fail. For N = 1, 2, ...
// until two steps run with no failure left to inject, the steps run call by call; a call that
// hits the failure must return TE_ERROR_OUT_OF_MEMORY naming itself, with everything a caller
// can observe unchanged (the module's FP8 state, the scope depth, every output including the
// main_grads that backward adds into, the residuals struct and the backward-context pointer),
// and must then succeed when retried. The steps' results must be bit-identical to an
// uninjected run.
//
// WarmStepsDoNotAllocate counts the allocations of training steps after two warm-up steps:
// zero, the promise the caching allocator, the object pools and the bucket pools make.
#include <gtest/gtest.h>
#include <te/te.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace {

// -1: disarmed. Otherwise the number of allocations still allowed before one fails.
long g_countdown = -1;
long g_injected = 0;
std::atomic<long> g_allocations{0};

bool take_failure() {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (g_countdown < 0) return false;
  if (g_countdown == 0) {
    g_countdown = -1;  // one failure per arming
    ++g_injected;
    return true;
  }
  --g_countdown;
  return false;
}

void *raw_alloc(std::size_t size, std::size_t align) {
  if (size == 0) size = 1;
  if (align <= alignof(std::max_align_t)) return std::malloc(size);
  void *p = nullptr;
  return posix_memalign(&p, align, size) == 0 ? p : nullptr;
}

}  // namespace

void *operator new(std::size_t n) {
  void *p = take_failure() ? nullptr : raw_alloc(n, 0);
  if (!p) throw std::bad_alloc();
  return p;
}
void *operator new[](std::size_t n) { return operator new(n); }
void *operator new(std::size_t n, const std::nothrow_t &) noexcept { return take_failure() ? nullptr : raw_alloc(n, 0); }
void *operator new[](std::size_t n, const std::nothrow_t &) noexcept { return operator new(n, std::nothrow); }
void *operator new(std::size_t n, std::align_val_t a) {
  void *p = take_failure() ? nullptr : raw_alloc(n, static_cast<std::size_t>(a));
  if (!p) throw std::bad_alloc();
  return p;
}
void *operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void *operator new(std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept {
  return take_failure() ? nullptr : raw_alloc(n, static_cast<std::size_t>(a));
}
void *operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept {
  return operator new(n, a, std::nothrow);
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }
void operator delete[](void *p, std::size_t) noexcept { std::free(p); }
void operator delete(void *p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void *p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void *p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void *p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete(void *p, std::align_val_t, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete[](void *p, std::align_val_t, const std::nothrow_t &) noexcept { std::free(p); }

namespace {

constexpr int64_t kTokens = 32, kHidden = 32, kOut = 48, kFfn = 16;

struct Floats {
  std::vector<float> v;
  te_tensor t{};
  Floats(std::vector<int64_t> shape, float lo, float hi, uint32_t seed) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    v.resize(static_cast<size_t>(n));
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    for (float &x : v) x = u(rng);
    t.data = v.data();
    t.dtype = TE_DTYPE_F32;
    t.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
    t.device.type = TE_DEVICE_CPU;
  }
  std::string bytes() const { return std::string(reinterpret_cast<const char *>(v.data()), v.size() * sizeof(float)); }
};

enum class Module { LnLinear, Mlp };
enum class Mode { Fp8, Calibrating, HighPrecision };

// Everything one run touches, created with injection disarmed. F32 activations; fused wgrad
// accumulation, so that backward adds into main_grads (a half-done call would count twice).
struct Step {
  Module module;
  te_recipe_kind kind;
  uint32_t backward_flags;
  te_context *ctx = nullptr;
  te_recipe *recipe = nullptr;
  te_layernorm_linear *lnl = nullptr;
  te_layernorm_mlp *mlp = nullptr;
  // LayerNormLinear: x [2, 16, hidden] -> y [2, 16, out]. LayerNormMLP (SwiGLU, RMSNorm):
  // x -> y [2, 16, hidden], fc1 [2 ffn, hidden], fc2 [hidden, ffn].
  Floats x{{2, kTokens / 2, kHidden}, -2, 2, 1}, gamma{{kHidden}, 0.5f, 1.5f, 2}, beta{{kHidden}, -0.5f, 0.5f, 3};
  Floats w{{kOut, kHidden}, -0.5f, 0.5f, 4}, b{{kOut}, -1, 1, 5};
  Floats w1{{2 * kFfn, kHidden}, -0.5f, 0.5f, 6}, b1{{2 * kFfn}, -1, 1, 7}, w2{{kHidden, kFfn}, -0.5f, 0.5f, 8},
      b2{{kHidden}, -1, 1, 9};
  Floats y, dy, ln_out{{2, kTokens / 2, kHidden}, 0, 0, 10}, dx{{2, kTokens / 2, kHidden}, 0, 0, 11};
  Floats dgamma{{kHidden}, 0, 0, 12}, dbeta{{kHidden}, 0, 0, 13};
  Floats main_grad{{kOut, kHidden}, -0.1f, 0.1f, 14}, db{{kOut}, 0, 0, 15};
  Floats main_grad1{{2 * kFfn, kHidden}, -0.1f, 0.1f, 16}, db1{{2 * kFfn}, 0, 0, 17};
  Floats main_grad2{{kHidden, kFfn}, -0.1f, 0.1f, 18}, db2{{kHidden}, 0, 0, 19};
  te_layernorm_linear_residuals lres{};
  te_layernorm_mlp_residuals mres{};
  void *bwd = nullptr;  // te_layernorm_linear_backward_ctx * or te_layernorm_mlp_backward_ctx *
  std::vector<unsigned char> saved;

  Step(Module m, te_recipe_kind k, uint32_t flags)
      : module(m), kind(k), backward_flags(flags),
        y({2, kTokens / 2, m == Module::LnLinear ? kOut : kHidden}, 0, 0, 20),
        dy({2, kTokens / 2, m == Module::LnLinear ? kOut : kHidden}, -1, 1, 21) {
    te_context_options co;
    te_context_options_init(&co);
    co.use_default_device = 0;
    co.device.type = TE_DEVICE_CPU;
    EXPECT_EQ(te_context_create(&ctx, &co), TE_SUCCESS) << te_last_error();
    te_recipe_options ro;
    te_recipe_options_init(&ro, kind);
    if (kind == TE_RECIPE_DELAYED_SCALING) ro.amax_history_len = 8;
    EXPECT_EQ(te_recipe_create(&recipe, &ro), TE_SUCCESS) << te_last_error();
    if (m == Module::LnLinear) {
      te_layernorm_linear_options o;
      te_layernorm_linear_options_init(&o);
      o.in_features = kHidden;
      o.out_features = kOut;
      o.activation_dtype = TE_DTYPE_F32;
      o.fuse_wgrad_accumulation = 1;
      EXPECT_EQ(te_layernorm_linear_create(&lnl, ctx, &o), TE_SUCCESS) << te_last_error();
    } else {
      te_layernorm_mlp_options o;
      te_layernorm_mlp_options_init(&o);
      o.hidden_size = kHidden;
      o.ffn_hidden_size = kFfn;
      o.activation = TE_ACTIVATION_SWIGLU;
      o.normalization = TE_NORM_RMSNORM;
      o.activation_dtype = TE_DTYPE_F32;
      o.fuse_wgrad_accumulation = 1;
      EXPECT_EQ(te_layernorm_mlp_create(&mlp, ctx, &o), TE_SUCCESS) << te_last_error();
    }
    lres.struct_size = sizeof lres;
    mres.struct_size = sizeof mres;
  }
  ~Step() {
    destroy_backward();
    te_layernorm_linear_residuals_release(&lres);
    te_layernorm_mlp_residuals_release(&mres);
    te_layernorm_linear_destroy(lnl);
    te_layernorm_mlp_destroy(mlp);
    te_recipe_release(recipe);
    te_context_destroy(ctx);
  }

  // ---- the calls of a step ----
  te_status forward_compute() {
    if (module == Module::LnLinear) {
      te_layernorm_linear_forward_args a;
      te_layernorm_linear_forward_args_init(&a);
      a.input = &x.t;
      a.ln_weight = &gamma.t;
      a.ln_bias = &beta.t;
      a.weight = &w.t;
      a.bias = &b.t;
      a.ln_out = &ln_out.t;
      return te_layernorm_linear_forward_compute(ctx, lnl, &a, &y.t, &lres);
    }
    te_layernorm_mlp_forward_args a;
    te_layernorm_mlp_forward_args_init(&a);
    a.input = &x.t;
    a.ln_weight = &gamma.t;
    a.fc1_weight = &w1.t;
    a.fc1_bias = &b1.t;
    a.fc2_weight = &w2.t;
    a.fc2_bias = &b2.t;
    a.ln_out = &ln_out.t;
    return te_layernorm_mlp_forward_compute(ctx, mlp, &a, &y.t, &mres);
  }
  te_status forward_save() {
    if (module == Module::LnLinear)
      return te_layernorm_linear_forward_save(ctx, lnl, &lres, reinterpret_cast<te_layernorm_linear_backward_ctx **>(&bwd));
    return te_layernorm_mlp_forward_save(ctx, mlp, &mres, reinterpret_cast<te_layernorm_mlp_backward_ctx **>(&bwd));
  }
  te_status backward() {
    te_linear_backward_args ba;
    te_linear_backward_args_init(&ba);
    ba.flags = backward_flags;
    if (module == Module::LnLinear) {
      te_layernorm_linear_grads g;
      te_layernorm_linear_grads_init(&g);
      g.dx = &dx.t;
      g.dln_weight = &dgamma.t;
      g.dln_bias = &dbeta.t;
      g.dw = &main_grad.t;
      g.db = &db.t;
      return te_layernorm_linear_backward(ctx, static_cast<te_layernorm_linear_backward_ctx *>(bwd), &dy.t, &g, &ba);
    }
    te_layernorm_mlp_grads g;
    te_layernorm_mlp_grads_init(&g);
    g.dx = &dx.t;
    g.dln_weight = &dgamma.t;
    g.dfc1_weight = &main_grad1.t;
    g.dfc1_bias = &db1.t;
    g.dfc2_weight = &main_grad2.t;
    g.dfc2_bias = &db2.t;
    return te_layernorm_mlp_backward(ctx, static_cast<te_layernorm_mlp_backward_ctx *>(bwd), &dy.t, &g, &ba);
  }
  void destroy_backward() {
    if (module == Module::LnLinear)
      te_layernorm_linear_backward_ctx_destroy(static_cast<te_layernorm_linear_backward_ctx *>(bwd));
    else
      te_layernorm_mlp_backward_ctx_destroy(static_cast<te_layernorm_mlp_backward_ctx *>(bwd));
    bwd = nullptr;
  }
  // Saves into *out, which the caller sized beforehand (so that, armed, only libte allocates).
  te_status state_save_into(std::vector<unsigned char> *out) const {
    size_t size = 0;
    te_status s = module == Module::LnLinear ? te_layernorm_linear_state_save(ctx, lnl, nullptr, 0, &size)
                                             : te_layernorm_mlp_state_save(ctx, mlp, nullptr, 0, &size);
    if (s != TE_SUCCESS) return s;
    if (size != out->size()) return TE_ERROR_INTERNAL;  // (the test sized it wrong)
    return module == Module::LnLinear ? te_layernorm_linear_state_save(ctx, lnl, out->data(), out->size(), &size)
                                      : te_layernorm_mlp_state_save(ctx, mlp, out->data(), out->size(), &size);
  }
  te_status state_save(std::vector<unsigned char> *out) const {
    size_t size = 0;
    te_status s = module == Module::LnLinear ? te_layernorm_linear_state_save(ctx, lnl, nullptr, 0, &size)
                                             : te_layernorm_mlp_state_save(ctx, mlp, nullptr, 0, &size);
    if (s != TE_SUCCESS) return s;
    out->assign(size, 0xEE);
    return state_save_into(out);
  }
  te_status state_load(const std::vector<unsigned char> &buf) {
    return module == Module::LnLinear ? te_layernorm_linear_state_load(ctx, lnl, buf.data(), buf.size())
                                      : te_layernorm_mlp_state_load(ctx, mlp, buf.data(), buf.size());
  }

  std::vector<unsigned char> state() const {
    std::vector<unsigned char> s;
    EXPECT_EQ(state_save(&s), TE_SUCCESS) << te_last_error();
    return s;
  }
  int depth() const {
    te_autocast_state s{};
    s.struct_size = sizeof s;
    EXPECT_EQ(te_autocast_get_state(ctx, &s), TE_SUCCESS);
    return s.depth;
  }
  std::string outputs() const {
    std::string out;
    for (const Floats *f : {&y, &ln_out, &dx, &dgamma, &dbeta, &main_grad, &db, &main_grad1, &db1, &main_grad2, &db2})
      out += f->bytes();
    return out;
  }
  // Everything a failed call must leave as it was.
  std::string snapshot() const {
    std::vector<unsigned char> s = state();
    std::string out(s.begin(), s.end());
    out += "|depth=" + std::to_string(depth()) + "|";
    out += outputs();
    out.append(reinterpret_cast<const char *>(&lres), sizeof lres);
    out.append(reinterpret_cast<const char *>(&mres), sizeof mres);
    out.append(reinterpret_cast<const char *>(&bwd), sizeof bwd);
    out.append(reinterpret_cast<const char *>(saved.data()), saved.size());
    return out;
  }
};

const char *fn_of(const Step &s, const char *what) {
  static const std::string names[2][6] = {
      {"te_layernorm_linear_forward_compute", "te_layernorm_linear_forward_save", "te_layernorm_linear_backward",
       "te_layernorm_linear_state_save", "te_layernorm_linear_state_load", ""},
      {"te_layernorm_mlp_forward_compute", "te_layernorm_mlp_forward_save", "te_layernorm_mlp_backward",
       "te_layernorm_mlp_state_save", "te_layernorm_mlp_state_load", ""}};
  const int m = s.module == Module::LnLinear ? 0 : 1;
  const std::string w = what;
  const int i = w == "compute" ? 0 : w == "save" ? 1 : w == "backward" ? 2 : w == "state_save" ? 3 : 4;
  return names[m][i].c_str();
}

// Runs `call`; when an injected failure makes it fail, checks the failure's contract and
// retries. Returns false (with a gtest failure) when the contract breaks.
bool run_call(Step &s, const char *name, const std::function<te_status()> &call, long &armed) {
  const long before_injected = g_injected;
  const std::string before = s.snapshot();  // disarmed: the snapshot's own allocations never fail
  g_countdown = armed;                      // the countdown runs on across the steps' calls
  te_status st = call();
  armed = g_countdown;
  g_countdown = -1;
  if (g_injected == before_injected) {
    EXPECT_EQ(st, TE_SUCCESS) << name << ": " << te_last_error();
    return st == TE_SUCCESS;
  }
  if (st == TE_SUCCESS) return true;  // the library recovered by itself
  EXPECT_EQ(st, TE_ERROR_OUT_OF_MEMORY) << name << ": " << te_status_string(st) << ": " << te_last_error();
  EXPECT_NE(std::string(te_last_error()).find(name), std::string::npos)
      << "te_last_error() does not name " << name << ": " << te_last_error();
  const std::string after = s.snapshot();
  if (after != before) {
    size_t at = 0;
    while (at < after.size() && at < before.size() && after[at] == before[at]) ++at;
    ADD_FAILURE() << name << " failed with OUT_OF_MEMORY but changed what a caller sees (snapshot of "
                  << before.size() << " bytes differs from byte " << at << "; the FP8 state is the first "
                  << s.state().size() << ", then the scope depth, the outputs, the residual structs, the backward "
                                         "context pointer)";
  }
  te_status retry = call();
  EXPECT_EQ(retry, TE_SUCCESS) << name << " retried: " << te_last_error();
  return st == TE_ERROR_OUT_OF_MEMORY && retry == TE_SUCCESS;
}

struct Outcome {
  std::string outputs;
  std::vector<unsigned char> state;
  bool operator==(const Outcome &o) const { return outputs == o.outputs && state == o.state; }
};

// Two training steps (the first allocates everything for the first time, the second runs on what
// the first warmed up), then (with `state_io`) a state save and load; failure armed at allocation
// `fail_at` counted from the start of the steps, or (state_io_only) of the save. Returns whether
// a failure was injected.
bool train(Module module, te_recipe_kind kind, uint32_t flags, Mode mode, long fail_at, Outcome *out,
           bool state_io = false, bool state_io_only = false) {
  Step s(module, kind, flags);
  long armed = state_io_only ? -1 : fail_at;
  const long injected_before = g_injected;
  for (int step = 0; step < 2; ++step) {
    te_autocast_options ao;
    te_autocast_options_init(&ao);
    ao.recipe = s.recipe;
    ao.enabled = mode == Mode::Fp8;
    ao.calibrating = mode == Mode::Calibrating;
    te_autocast_token tok = 0;
    bool ok = run_call(s, "te_autocast_begin", [&] { return te_autocast_begin(s.ctx, &ao, &tok); }, armed) &&
              run_call(s, fn_of(s, "compute"), [&] { return s.forward_compute(); }, armed) &&
              run_call(s, fn_of(s, "save"), [&] { return s.forward_save(); }, armed) &&
              run_call(s, "te_autocast_end", [&] { return te_autocast_end(s.ctx, tok); }, armed) &&
              run_call(s, fn_of(s, "backward"), [&] { return s.backward(); }, armed) &&
              run_call(s, "te_autocast_flush_backward", [&] { return te_autocast_flush_backward(s.ctx); }, armed);
    g_countdown = -1;
    s.destroy_backward();
    if (!ok) return true;
  }
  if (state_io) {
    // The save writes a buffer sized while disarmed; on failure it must not have written it.
    s.saved.assign(s.state().size(), 0xEE);
    if (state_io_only) armed = fail_at;
    bool ok = run_call(s, fn_of(s, "state_save"), [&] { return s.state_save_into(&s.saved); }, armed) &&
              run_call(s, fn_of(s, "state_load"), [&] { return s.state_load(s.saved); }, armed);
    g_countdown = -1;
    if (!ok) return true;
  }
  out->outputs = s.outputs();
  out->state = s.state();
  return g_injected != injected_before;
}

using Param = std::tuple<Module, te_recipe_kind, uint32_t, Mode>;
class LayerNormModulesAllocFailure : public ::testing::TestWithParam<Param> {};

void every_allocation_fails_cleanly(const Param &p, bool state_io) {
  const Module module = std::get<0>(p);
  const te_recipe_kind kind = std::get<1>(p);
  const uint32_t flags = std::get<2>(p);
  const Mode mode = std::get<3>(p);
  Outcome reference;
  ASSERT_FALSE(train(module, kind, flags, mode, -1, &reference, state_io, state_io));
  long sites = 0;
  for (long n = 0;; ++n) {
    SCOPED_TRACE("failing allocation #" + std::to_string(n));
    Outcome got;
    const bool injected = train(module, kind, flags, mode, n, &got, state_io, state_io);
    if (::testing::Test::HasFailure()) return;
    EXPECT_TRUE(got == reference) << "steps with one failed-and-retried call differ from the uninjected steps";
    if (!injected) break;
    ++sites;
    ASSERT_LT(n, 100000) << "the steps never ran out of allocations to fail";
  }
  EXPECT_GT(sites, state_io ? 1 : 5) << "suspiciously few allocations: is operator new really replaced in libte?";
  std::printf("[ INFO     ] %ld allocation sites failed and retried\n", sites);
}

TEST_P(LayerNormModulesAllocFailure, EveryAllocationOfTrainingStepsFailsCleanlyAndRetries) {
  every_allocation_fails_cleanly(GetParam(), false);
}

// state_save and state_load of the trained module: a save that runs out of memory must not have
// written the caller's buffer, a load must not have changed the module.
TEST_P(LayerNormModulesAllocFailure, EveryAllocationOfStateSaveAndLoadFailsCleanly) {
  every_allocation_fails_cleanly(GetParam(), true);
}

std::string param_name(const ::testing::TestParamInfo<Param> &i) {
  static const char *const kinds[] = {"Delayed", "Current", "Block"};
  static const char *const modes[] = {"Fp8", "Calibrating", "HighPrecision"};
  return std::string(std::get<0>(i.param) == Module::LnLinear ? "LayerNormLinear" : "LayerNormMLP") + "_" +
         kinds[std::get<1>(i.param)] + (std::get<2>(i.param) ? "_Once" : "_Retain") + "_" +
         modes[static_cast<int>(std::get<3>(i.param))];
}

INSTANTIATE_TEST_SUITE_P(
    All, LayerNormModulesAllocFailure,
    ::testing::Combine(::testing::Values(Module::LnLinear, Module::Mlp),
                       ::testing::Values(TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING, TE_RECIPE_BLOCK_SCALING),
                       ::testing::Values(0u, TE_BACKWARD_ONCE),
                       ::testing::Values(Mode::Fp8, Mode::Calibrating, Mode::HighPrecision)),
    param_name);

// A training step (forward_compute, forward_save, scope end, backward, flush, backward context
// destroyed) makes no heap allocation once two steps warmed the caches and pools up.
TEST_P(LayerNormModulesAllocFailure, WarmStepsDoNotAllocate) {
  const Module module = std::get<0>(GetParam());
  const te_recipe_kind kind = std::get<1>(GetParam());
  const uint32_t flags = std::get<2>(GetParam());
  const Mode mode = std::get<3>(GetParam());
  Step s(module, kind, flags);
  long counted = 0;
  for (int step = 0; step < 6; ++step) {
    te_autocast_options ao;
    te_autocast_options_init(&ao);
    ao.recipe = s.recipe;
    ao.enabled = mode == Mode::Fp8;
    ao.calibrating = mode == Mode::Calibrating;
    te_autocast_token tok = 0;
    const long before = g_allocations.load();
    ASSERT_EQ(te_autocast_begin(s.ctx, &ao, &tok), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(s.forward_compute(), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(s.forward_save(), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(te_autocast_end(s.ctx, tok), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(s.backward(), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(te_autocast_flush_backward(s.ctx), TE_SUCCESS) << te_last_error();
    s.destroy_backward();
    const long n = g_allocations.load() - before;
    if (step >= 2) counted += n;
    if (step >= 2 && n) ADD_FAILURE() << "step " << step << " made " << n << " allocations after warm-up";
  }
  EXPECT_EQ(counted, 0);
}

}  // namespace
