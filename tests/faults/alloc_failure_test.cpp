// Allocation-failure injection over a whole training step on the CPU backend.
//
// This program replaces the global operator new/delete (every variant), which libte.so's
// allocations resolve to: its objects and containers, and the CPU backend's blocks (which come
// from the aligned nothrow operator new for this reason). A countdown makes the N-th allocation
// after arming fail. For N = 1, 2, ... until a step runs with no failure left to inject, the step
// runs call by call; a call that hits the failure must return TE_ERROR_OUT_OF_MEMORY with the
// layer's FP8 state and the autocast state unchanged, and must then succeed when retried. The
// step's results (y, dx, dW accumulated into main_grad, db, and the saved FP8 state after the
// scale updates) must be bit-identical to an uninjected run: nothing is lost or done twice.
#include <gtest/gtest.h>
#include <te/te.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace {

// -1: disarmed. Otherwise the number of allocations still allowed before one fails.
long g_countdown = -1;
long g_injected = 0;

bool take_failure() {
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

constexpr int64_t kTokens = 32, kIn = 32, kOut = 48;

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
};

// Everything one run of the step touches, created with injection disarmed.
struct Step {
  te_recipe_kind kind;
  uint32_t backward_flags;
  te_context *ctx = nullptr;
  te_recipe *recipe = nullptr;
  te_linear *lin = nullptr;
  Floats x{{kTokens, kIn}, -2, 2, 1}, w{{kOut, kIn}, -0.5f, 0.5f, 2}, b{{kOut}, -1, 1, 3};
  Floats y{{kTokens, kOut}, 0, 0, 4}, dy{{kTokens, kOut}, -1, 1, 5}, dx{{kTokens, kIn}, 0, 0, 6};
  Floats main_grad{{kOut, kIn}, -0.1f, 0.1f, 7}, db{{kOut}, 0, 0, 8};

  Step(te_recipe_kind k, uint32_t flags) : kind(k), backward_flags(flags) {
    te_context_options co;
    te_context_options_init(&co);
    co.use_default_device = 0;
    co.device.type = TE_DEVICE_CPU;
    EXPECT_EQ(te_context_create(&ctx, &co), TE_SUCCESS) << te_last_error();
    te_recipe_options ro;
    te_recipe_options_init(&ro, kind);
    if (kind == TE_RECIPE_DELAYED_SCALING) ro.amax_history_len = 8;
    EXPECT_EQ(te_recipe_create(&recipe, &ro), TE_SUCCESS) << te_last_error();
    te_linear_options lo;
    te_linear_options_init(&lo);
    lo.in_features = kIn;
    lo.out_features = kOut;
    lo.activation_dtype = TE_DTYPE_F32;
    lo.fuse_wgrad_accumulation = 1;
    EXPECT_EQ(te_linear_create(&lin, ctx, &lo), TE_SUCCESS) << te_last_error();
  }
  ~Step() {
    te_linear_destroy(lin);
    te_recipe_release(recipe);
    te_context_destroy(ctx);
  }

  std::vector<unsigned char> state() const {
    size_t size = 0;
    EXPECT_EQ(te_linear_state_save(ctx, lin, nullptr, 0, &size), TE_SUCCESS) << te_last_error();
    std::vector<unsigned char> buf(size);
    EXPECT_EQ(te_linear_state_save(ctx, lin, buf.data(), buf.size(), &size), TE_SUCCESS) << te_last_error();
    return buf;
  }
  int depth() const {
    te_autocast_state s{};
    s.struct_size = sizeof s;
    EXPECT_EQ(te_autocast_get_state(ctx, &s), TE_SUCCESS);
    return s.depth;
  }
  // What must not change when a call fails: the FP8 state, the scope stack and main_grad
  // (accumulated into, so a half-done call would be counted twice on retry).
  std::string snapshot() const {
    std::vector<unsigned char> s = state();
    std::string out(s.begin(), s.end());
    out += "|depth=" + std::to_string(depth()) + "|";
    out.append(reinterpret_cast<const char *>(main_grad.v.data()), main_grad.v.size() * sizeof(float));
    return out;
  }
};

// Runs `call`; when an injected failure makes it fail, checks the failure's contract and retries.
// Returns false (with a gtest failure) when the contract breaks.
bool run_call(Step &s, const char *name, const std::function<te_status()> &call, long &armed) {
  const long before_injected = g_injected;
  const std::string before = s.snapshot();  // disarmed: the snapshot's own allocations never fail
  g_countdown = armed;                      // the countdown runs on across the step's calls
  te_status st = call();
  armed = g_countdown;
  g_countdown = -1;
  if (g_injected == before_injected) {
    EXPECT_EQ(st, TE_SUCCESS) << name << ": " << te_last_error();
    return st == TE_SUCCESS;
  }
  // The failure landed in this call.
  if (st == TE_SUCCESS) return true;  // the library recovered by itself (e.g. a nothrow fallback)
  EXPECT_EQ(st, TE_ERROR_OUT_OF_MEMORY) << name << ": " << te_status_string(st) << ": " << te_last_error();
  EXPECT_NE(std::string(te_last_error()).find(name), std::string::npos) << te_last_error();
  const std::string after = s.snapshot();
  if (after != before) {
    size_t at = 0;
    while (at < after.size() && at < before.size() && after[at] == before[at]) ++at;
    ADD_FAILURE() << name << " failed with OUT_OF_MEMORY but changed state (snapshot of " << before.size()
                  << " bytes differs from byte " << at << "; the FP8 state is the first " << s.state().size()
                  << ", then the scope depth, then main_grad)";
  }
  te_status retry = call();
  EXPECT_EQ(retry, TE_SUCCESS) << name << " retried: " << te_last_error();
  return st == TE_ERROR_OUT_OF_MEMORY && retry == TE_SUCCESS;
}

struct Outcome {
  std::vector<float> y, dx, main_grad, db;
  std::vector<unsigned char> state;
  bool operator==(const Outcome &o) const {
    return y == o.y && dx == o.dx && main_grad == o.main_grad && db == o.db && state == o.state;
  }
};

enum class Mode { Fp8, Calibrating, HighPrecision };

// Two training steps (the first allocates everything for the first time, the second runs with
// what the first warmed up), failure armed at allocation `fail_at` counted from the start.
// Returns whether a failure was injected.
bool train(te_recipe_kind kind, uint32_t flags, Mode mode, long fail_at, Outcome *out) {
  Step s(kind, flags);
  long armed = fail_at;
  const long injected_before = g_injected;
  for (int step = 0; step < 2; ++step) {
    te_autocast_options ao;
    te_autocast_options_init(&ao);
    ao.recipe = s.recipe;
    ao.enabled = mode == Mode::Fp8;
    ao.calibrating = mode == Mode::Calibrating;
    te_autocast_token tok = 0;
    te_linear_backward_ctx *bwd = nullptr;
    te_linear_forward_args fa;
    te_linear_forward_args_init(&fa);
    fa.input = &s.x.t;
    fa.weight = &s.w.t;
    fa.bias = &s.b.t;
    te_linear_backward_args ba;
    te_linear_backward_args_init(&ba);
    ba.flags = flags;
    bool ok = run_call(s, "te_autocast_begin", [&] { return te_autocast_begin(s.ctx, &ao, &tok); }, armed) &&
              run_call(s, "te_linear_forward", [&] { return te_linear_forward(s.ctx, s.lin, &fa, &s.y.t, &bwd); }, armed) &&
              run_call(s, "te_autocast_end", [&] { return te_autocast_end(s.ctx, tok); }, armed) &&
              run_call(s, "te_linear_backward", [&] {
                return te_linear_backward(s.ctx, bwd, &s.dy.t, &s.dx.t, &s.main_grad.t, &s.db.t, &ba);
              }, armed) &&
              run_call(s, "te_autocast_flush_backward", [&] { return te_autocast_flush_backward(s.ctx); }, armed);
    g_countdown = -1;
    te_linear_backward_ctx_destroy(bwd);
    if (!ok) return true;
  }
  out->y = s.y.v;
  out->dx = s.dx.v;
  out->main_grad = s.main_grad.v;
  out->db = s.db.v;
  out->state = s.state();
  return g_injected != injected_before;
}

class AllocFailure : public ::testing::TestWithParam<std::tuple<te_recipe_kind, uint32_t, Mode>> {};

TEST_P(AllocFailure, EveryAllocationOfATrainingStepFailsCleanlyAndRetries) {
  const te_recipe_kind kind = std::get<0>(GetParam());
  const uint32_t flags = std::get<1>(GetParam());
  const Mode mode = std::get<2>(GetParam());
  Outcome reference;
  ASSERT_FALSE(train(kind, flags, mode, -1, &reference));
  long sites = 0;
  for (long n = 0;; ++n) {
    SCOPED_TRACE("failing allocation #" + std::to_string(n));
    Outcome got;
    const bool injected = train(kind, flags, mode, n, &got);
    if (::testing::Test::HasFailure()) return;
    EXPECT_TRUE(got == reference) << "a step with one failed-and-retried call differs from the uninjected step";
    if (!injected) break;
    ++sites;
    ASSERT_LT(n, 100000) << "the step never ran out of allocations to fail";
  }
  EXPECT_GT(sites, 5) << "suspiciously few allocations: is operator new really replaced in libte?";
  std::printf("[ INFO     ] %ld allocation sites failed and retried\n", sites);
}

INSTANTIATE_TEST_SUITE_P(Recipes, AllocFailure,
                         ::testing::Combine(::testing::Values(TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING,
                                                              TE_RECIPE_BLOCK_SCALING),
                                            ::testing::Values(0u, TE_BACKWARD_ONCE),
                                            ::testing::Values(Mode::Fp8, Mode::Calibrating, Mode::HighPrecision)));

}  // namespace
