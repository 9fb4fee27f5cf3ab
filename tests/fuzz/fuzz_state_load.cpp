// libFuzzer harness: te_linear_state_load on fuzzed bytes. Only <te/te.h> and libte.so.
//
// Input: one configuration byte, then the state bytes.
//   bits 0-2  the layer's shape (kShapes)
//   bits 3-4  the recipe of the forwards after a successful load (kRecipes)
//   bit  5    activation dtype: BF16 (0) or F32 (1)
//   bit  6    load while an autocast scope is open and the layer was used in it
//   bit  7    load while a backward context of an earlier forward is pending (its backward runs
//             after the load)
// The seed corpus (make_corpus.cpp) is real te_linear_state_save output, from layers of each
// shape and recipe, never used and used for a few steps, behind the matching configuration byte.
//
// Checks: a call never crashes or trips a sanitizer; a failed load names te_linear_state_load
// in te_last_error() and leaves the layer's saved state as it was; after a successful load,
// te_linear_state_save reproduces the input bytes exactly (bit-exact round trip), loading them
// again succeeds, and FP8 forwards (before and after the scale update at the end of a scope) and
// a backward produce only finite numbers from finite inputs.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_common.h"

FUZZ_SANITIZER_DEFAULTS

namespace {

using fuzz::Blob;
using fuzz::violation;

struct LayerShape {
  int64_t in, out;
};
const LayerShape kShapes[8] = {{16, 16}, {32, 16}, {16, 48}, {48, 32}, {64, 64}, {17, 5}, {1, 1}, {32, 32}};

te_context *g_ctx = nullptr;
te_recipe *g_recipes[4] = {};

te_recipe *make_recipe(te_recipe_kind kind, int history, te_amax_algo algo, int margin) {
  te_recipe_options o;
  if (te_recipe_options_init(&o, kind) != TE_SUCCESS) violation("te_recipe_options_init failed");
  if (history > 0) o.amax_history_len = history;
  o.amax_algo = algo;
  o.margin = margin;
  te_recipe *r = nullptr;
  if (te_recipe_create(&r, &o) != TE_SUCCESS) violation("te_recipe_create failed");
  return r;
}

std::vector<uint8_t> saved_state(te_linear *lin) {
  size_t n = 0;
  if (TE_CALL(te_linear_state_save, g_ctx, lin, nullptr, 0, &n) != TE_SUCCESS) violation("state size query failed");
  std::vector<uint8_t> b(n);
  size_t n2 = 0;
  if (TE_CALL(te_linear_state_save, g_ctx, lin, b.data(), n, &n2) != TE_SUCCESS || n2 != n)
    violation("te_linear_state_save failed");
  return b;
}

// A layer's parameters and one batch, all finite and small.
struct Batch {
  int64_t tokens, in, out;
  int dtype;
  Blob x, w, b, y, dy, dx, dw, db;
  te_tensor tx{}, tw{}, tb{}, ty{}, tdy{}, tdx{}, tdw{}, tdb{};

  Batch(int64_t tokens_, int64_t in_, int64_t out_, int dtype_, uint32_t seed)
      : tokens(tokens_), in(in_), out(out_), dtype(dtype_) {
    const size_t e = fuzz::dtype_bytes(dtype);
    // r == 0: a vector of c elements.
    auto init = [&](Blob &blob, te_tensor &t, int64_t r, int64_t c, float scale, fuzz::Rng *rng) {
      t.ndim = r == 0 ? 1 : 2;
      if (r == 0) {
        t.shape[0] = c;
        r = 1;
      } else {
        t.shape[0] = r;
        t.shape[1] = c;
      }
      blob = Blob(static_cast<size_t>(r * c) * e);
      t.data = blob.data();
      fuzz::set_enum(t.dtype, dtype);
      t.device.type = TE_DEVICE_CPU;
      for (int64_t i = 0; i < r * c; ++i) fuzz::store_hp(blob.data(), dtype, i, rng ? rng->uniform(-scale, scale) : 0.0f);
    };
    fuzz::Rng rng(seed);
    init(x, tx, tokens, in, 1.0f, &rng);
    init(w, tw, out, in, 0.5f, &rng);
    init(b, tb, 0, out, 0.5f, &rng);
    init(y, ty, tokens, out, 0, nullptr);
    init(dy, tdy, tokens, out, 1.0f, &rng);
    init(dx, tdx, tokens, in, 0, nullptr);
    init(dw, tdw, out, in, 0, nullptr);
    init(db, tdb, 0, out, 0, nullptr);
  }

  void check_finite(const Blob &blob, const char *what, const char *when) const {
    const int64_t n = static_cast<int64_t>(blob.size() / fuzz::dtype_bytes(dtype));
    for (int64_t i = 0; i < n; ++i) {
      const float v = fuzz::load_hp(blob.data(), dtype, i);
      FUZZ_ASSERT(std::isfinite(v), "after a successful te_linear_state_load, %s: %s[%lld] = %g from finite inputs",
                  when, what, static_cast<long long>(i), static_cast<double>(v));
    }
  }
};

te_linear_backward_ctx *forward(te_linear *lin, Batch &bt, const char *when, bool check) {
  te_linear_forward_args a;
  te_linear_forward_args_init(&a);
  a.input = &bt.tx;
  a.weight = &bt.tw;
  a.bias = &bt.tb;
  te_linear_backward_ctx *bwd = nullptr;
  te_status s = TE_CALL(te_linear_forward, g_ctx, lin, &a, &bt.ty, &bwd);
  FUZZ_ASSERT(s == TE_SUCCESS, "te_linear_forward failed (%s)", when);
  if (check) bt.check_finite(bt.y, "y", when);
  return bwd;
}

void backward(te_linear_backward_ctx *bwd, Batch &bt, const char *when, bool check) {
  te_status s = TE_CALL(te_linear_backward, g_ctx, bwd, &bt.tdy, &bt.tdx, &bt.tdw, &bt.tdb, nullptr);
  FUZZ_ASSERT(s == TE_SUCCESS, "te_linear_backward failed (%s)", when);
  if (check) {
    bt.check_finite(bt.dx, "dx", when);
    bt.check_finite(bt.dw, "dw", when);
    bt.check_finite(bt.db, "db", when);
  }
}

te_autocast_token begin(te_recipe *r) {
  te_autocast_options o;
  te_autocast_options_init(&o);
  o.recipe = r;
  te_autocast_token t = 0;
  if (TE_CALL(te_autocast_begin, g_ctx, &o, &t) != TE_SUCCESS) violation("te_autocast_begin failed");
  return t;
}

void end(te_autocast_token t) {
  if (TE_CALL(te_autocast_end, g_ctx, t) != TE_SUCCESS) violation("te_autocast_end failed");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  te_context_options o;
  te_context_options_init(&o);
  o.use_default_device = 0;
  o.device.type = TE_DEVICE_CPU;
  if (te_context_create(&g_ctx, &o) != TE_SUCCESS) violation("te_context_create failed");
  g_recipes[0] = make_recipe(TE_RECIPE_DELAYED_SCALING, 0, TE_AMAX_MAX, 0);
  g_recipes[1] = make_recipe(TE_RECIPE_DELAYED_SCALING, 16, TE_AMAX_MOST_RECENT, 1);
  g_recipes[2] = make_recipe(TE_RECIPE_CURRENT_SCALING, 0, TE_AMAX_MAX, 0);
  g_recipes[3] = make_recipe(TE_RECIPE_BLOCK_SCALING, 0, TE_AMAX_MAX, 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t cfg = data[0];
  const LayerShape shape = kShapes[cfg & 7];
  te_recipe *recipe = g_recipes[(cfg >> 3) & 3];
  const int dtype = (cfg & 0x20) ? TE_DTYPE_F32 : TE_DTYPE_BF16;
  const bool in_scope = cfg & 0x40, pending = cfg & 0x80;
  const bool fp8_ok = shape.in % 16 == 0 && shape.out % 16 == 0;

  te_linear_options lo;
  te_linear_options_init(&lo);
  lo.in_features = shape.in;
  lo.out_features = shape.out;
  lo.activation_dtype = static_cast<te_dtype>(dtype);
  te_linear *lin = nullptr;
  if (TE_CALL(te_linear_create, &lin, g_ctx, &lo) != TE_SUCCESS) violation("te_linear_create failed");

  Batch bt(16, shape.in, shape.out, dtype, static_cast<uint32_t>(size));
  te_linear_backward_ctx *early = nullptr;
  te_autocast_token scope = 0;
  if (pending || in_scope) {  // a forward before the load: in a scope (in_scope) or closed (pending)
    scope = begin(recipe);
    early = fp8_ok ? forward(lin, bt, "before the load", false) : nullptr;
    if (!in_scope) end(scope);
    if (!pending && early) {
      te_linear_backward_ctx_destroy(early);
      early = nullptr;
    }
  }

  // The load, from an exactly-sized copy (ASan sees any read past the end).
  const size_t n = size - 1;
  Blob buf(n);
  if (n) std::memcpy(buf.data(), data + 1, n);
  const std::vector<uint8_t> before = saved_state(lin);
  te_status s = TE_CALL(te_linear_state_load, g_ctx, lin, buf.data(), n);
  FUZZ_ASSERT(n == 0 || std::memcmp(buf.data(), data + 1, n) == 0, "te_linear_state_load wrote into its input");

  if (in_scope) end(scope);
  if (s != TE_SUCCESS) {
    // Closing the scope may have updated the scales: compare only when no scope was open.
    if (!in_scope) FUZZ_ASSERT(saved_state(lin) == before, "a failed te_linear_state_load changed the layer's state");
  } else {
    const std::vector<uint8_t> after = saved_state(lin);
    if (!in_scope) {
      size_t at = 0;
      while (at < n && at < after.size() && after[at] == data[1 + at]) ++at;
      FUZZ_ASSERT(after.size() == n && at == n,
                  "te_linear_state_save after a successful load does not reproduce the loaded bytes (%zu vs %zu bytes; "
                  "first difference at byte %zu: saved 0x%02x, loaded 0x%02x)",
                  after.size(), n, at, at < after.size() ? after[at] : 0, at < n ? data[1 + at] : 0);
      FUZZ_ASSERT(TE_CALL(te_linear_state_load, g_ctx, lin, buf.data(), n) == TE_SUCCESS,
                  "loading the same state twice failed the second time");
    }
  }
  if (early) {
    backward(early, bt, "a backward pending across the load", s == TE_SUCCESS);
    te_linear_backward_ctx_destroy(early);
  }
  if (s == TE_SUCCESS && fp8_ok) {
    // FP8 with the loaded scales, then again after the update at the end of the scope.
    const char *when[2] = {"first FP8 forward", "FP8 forward after a scale update"};
    for (int pass = 0; pass < 2; ++pass) {
      te_autocast_token t = begin(recipe);
      te_linear_backward_ctx *bwd = forward(lin, bt, when[pass], true);
      end(t);
      backward(bwd, bt, when[pass], true);
      te_linear_backward_ctx_destroy(bwd);
    }
  }
  te_linear_destroy(lin);
  return 0;
}
