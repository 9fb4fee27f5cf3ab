// Writes the fuzzers' seed corpora (tests/fuzz/corpus/<fuzzer>/ holds a checked-in copy):
//   fuzz_make_corpus state  DIR   real te_linear_state_save output (fuzz_state_load's layout: a
//                                 configuration byte, then the state) from layers of each shape
//                                 and recipe, never used and used for some steps
//   fuzz_make_corpus api    DIR   API programs (api_program.h), recorded while they run
//   fuzz_make_corpus dlpack DIR   DLPack structs (dlpack_spec.h), valid and not
//   fuzz_make_corpus all    ROOT  the three, into ROOT/fuzz_state_load, ROOT/fuzz_api_sequence,
//                                 ROOT/fuzz_dlpack
// scripts/test_fuzz.sh regenerates the state seeds on every run, so that they always match the
// library's state format. Deterministic: the same library writes the same files.
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "api_program.h"
#include "dlpack_spec.h"

FUZZ_SANITIZER_DEFAULTS

namespace {

int g_written = 0;

void write_file(const std::string &dir, const std::string &name, const std::vector<uint8_t> &bytes) {
  mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/seed-" + name;
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "fuzz_make_corpus: cannot write %s\n", path.c_str());
    std::exit(1);
  }
  ++g_written;
}

void check(te_status s, const char *what) {
  if (s != TE_SUCCESS) {
    std::fprintf(stderr, "fuzz_make_corpus: %s failed: %s\n", what, te_last_error());
    std::exit(1);
  }
}

// ---- fuzz_state_load ------------------------------------------------------------------------

struct Shape {
  int64_t in, out;
};
const Shape kShapes[8] = {{16, 16}, {32, 16}, {16, 48}, {48, 32}, {64, 64}, {17, 5}, {1, 1}, {32, 32}};

te_recipe *recipe_for(int idx) {  // the same four recipes as fuzz_state_load.cpp
  te_recipe_options o;
  const te_recipe_kind kinds[4] = {TE_RECIPE_DELAYED_SCALING, TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING,
                                   TE_RECIPE_BLOCK_SCALING};
  check(te_recipe_options_init(&o, kinds[idx]), "te_recipe_options_init");
  if (idx == 1) {
    o.amax_history_len = 16;
    o.amax_algo = TE_AMAX_MOST_RECENT;
    o.margin = 1;
  }
  te_recipe *r = nullptr;
  check(te_recipe_create(&r, &o), "te_recipe_create");
  return r;
}

// A layer trained for `steps` steps with recipe `ridx`, saved.
std::vector<uint8_t> trained_state(te_context *ctx, int shape, int ridx, int dtype, int steps, uint32_t seed) {
  const Shape sh = kShapes[shape];
  te_linear_options lo;
  te_linear_options_init(&lo);
  lo.in_features = sh.in;
  lo.out_features = sh.out;
  lo.activation_dtype = static_cast<te_dtype>(dtype);
  te_linear *lin = nullptr;
  check(te_linear_create(&lin, ctx, &lo), "te_linear_create");
  te_recipe *r = recipe_for(ridx);
  const bool fp8 = sh.in % 16 == 0 && sh.out % 16 == 0;
  const int64_t tokens = 16;
  const size_t e = fuzz::dtype_bytes(dtype);
  fuzz::Rng rng(seed);
  auto buf = [&](int64_t n, float scale) {
    std::vector<uint8_t> b(static_cast<size_t>(n) * e);
    for (int64_t i = 0; i < n; ++i) fuzz::store_hp(b.data(), dtype, i, rng.uniform(-scale, scale));
    return b;
  };
  auto tensor = [&](std::vector<uint8_t> &b, int64_t r0, int64_t c) {
    te_tensor t{};
    t.data = b.data();
    t.dtype = static_cast<te_dtype>(dtype);
    t.ndim = r0 ? 2 : 1;
    t.shape[0] = r0 ? r0 : c;
    t.shape[1] = c;
    return t;
  };
  std::vector<uint8_t> w = buf(sh.out * sh.in, 0.5f), bias = buf(sh.out, 0.5f);
  for (int step = 0; step < steps; ++step) {
    std::vector<uint8_t> x = buf(tokens * sh.in, 1.0f + static_cast<float>(step)), y = buf(tokens * sh.out, 0);
    std::vector<uint8_t> dy = buf(tokens * sh.out, 1.0f), dx = buf(tokens * sh.in, 0), dw = buf(sh.out * sh.in, 0),
                         db = buf(sh.out, 0);
    te_tensor tx = tensor(x, tokens, sh.in), tw = tensor(w, sh.out, sh.in), tb = tensor(bias, 0, sh.out),
              ty = tensor(y, tokens, sh.out), tdy = tensor(dy, tokens, sh.out), tdx = tensor(dx, tokens, sh.in),
              tdw = tensor(dw, sh.out, sh.in), tdb = tensor(db, 0, sh.out);
    te_autocast_options ao;
    te_autocast_options_init(&ao);
    ao.recipe = r;
    ao.enabled = fp8 ? 1 : 0;
    ao.calibrating = fp8 ? 0 : 1;
    te_autocast_token tok;
    check(te_autocast_begin(ctx, &ao, &tok), "te_autocast_begin");
    te_linear_forward_args fa;
    te_linear_forward_args_init(&fa);
    fa.input = &tx;
    fa.weight = &tw;
    fa.bias = &tb;
    te_linear_backward_ctx *bwd = nullptr;
    check(te_linear_forward(ctx, lin, &fa, &ty, &bwd), "te_linear_forward");
    check(te_autocast_end(ctx, tok), "te_autocast_end");
    check(te_linear_backward(ctx, bwd, &tdy, &tdx, &tdw, &tdb, nullptr), "te_linear_backward");
    te_linear_backward_ctx_destroy(bwd);
  }
  size_t n = 0;
  check(te_linear_state_save(ctx, lin, nullptr, 0, &n), "te_linear_state_save");
  std::vector<uint8_t> out(n + 1);
  check(te_linear_state_save(ctx, lin, out.data() + 1, n, &n), "te_linear_state_save");
  out[0] = static_cast<uint8_t>(shape | ridx << 3 | (dtype == TE_DTYPE_F32 ? 0x20 : 0));
  te_linear_destroy(lin);
  te_recipe_release(r);
  return out;
}

void state_corpus(te_context *ctx, const std::string &dir) {
  struct Seed {
    int shape, recipe, dtype, steps;
  };
  const Seed seeds[] = {
      {0, 0, TE_DTYPE_BF16, 0}, {0, 0, TE_DTYPE_BF16, 3}, {0, 1, TE_DTYPE_BF16, 0}, {0, 1, TE_DTYPE_BF16, 20},
      {0, 2, TE_DTYPE_F32, 2},  {0, 3, TE_DTYPE_BF16, 2}, {1, 0, TE_DTYPE_F32, 1},  {1, 1, TE_DTYPE_BF16, 5},
      {2, 0, TE_DTYPE_BF16, 2}, {2, 1, TE_DTYPE_F32, 3},  {3, 1, TE_DTYPE_BF16, 4}, {3, 2, TE_DTYPE_BF16, 1},
      {4, 1, TE_DTYPE_BF16, 2}, {4, 3, TE_DTYPE_F32, 1},  {5, 0, TE_DTYPE_BF16, 0}, {5, 1, TE_DTYPE_F32, 3},
      {6, 1, TE_DTYPE_BF16, 2}, {6, 0, TE_DTYPE_BF16, 0}, {7, 1, TE_DTYPE_BF16, 17}, {7, 0, TE_DTYPE_F32, 0},
  };
  int i = 0;
  for (const Seed &s : seeds) {
    std::vector<uint8_t> b = trained_state(ctx, s.shape, s.recipe, s.dtype, s.steps, static_cast<uint32_t>(100 + i));
    char name[64];
    std::snprintf(name, sizeof name, "%02d-shape%d-recipe%d-%s-steps%d", i++, s.shape, s.recipe,
                  s.dtype == TE_DTYPE_F32 ? "f32" : "bf16", s.steps);
    write_file(dir, name, b);
  }
  // Scales no save writes (the state format's first state: scale at byte 32, scale_inv at 36).
  {
    const std::vector<uint8_t> used = trained_state(ctx, 0, 0, TE_DTYPE_BF16, 2, 5);
    const struct {
      const char *name;
      float scale, scale_inv;
    } bad[] = {{"22-nan-scale", NAN, NAN}, {"23-zero-scale", 0.0f, INFINITY}, {"24-inconsistent-scale-inv", 1.0f, 1e30f},
               {"25-denormal-scale", 1e-45f, 1e30f}};
    for (const auto &b : bad) {
      std::vector<uint8_t> m = used;
      if (m.size() >= 1 + 40) {
        std::memcpy(&m[1 + 32], &b.scale, 4);
        std::memcpy(&m[1 + 36], &b.scale_inv, 4);
      }
      write_file(dir, b.name, m);
    }
  }
  // A short history with the in-scope (0x40) and pending-backward (0x80) bits.
  std::vector<uint8_t> b = trained_state(ctx, 7, 1, TE_DTYPE_BF16, 2, 7);
  b[0] |= 0x40;
  write_file(dir, "20-in-scope", b);
  b[0] ^= 0xC0;
  write_file(dir, "21-pending-backward", b);
}

// ---- fuzz_api_sequence ----------------------------------------------------------------------

void api_corpus(const std::string &dir) {
  using namespace fuzz;
  struct Script {
    const char *name;
    std::vector<uint8_t> ops;
  };
  const std::vector<Script> scripts = {
      {"train", {OP_LINEAR_CREATE, OP_TRAIN_STEP, OP_TRAIN_STEP, OP_TRAIN_STEP, OP_BACKWARD, OP_STATE}},
      {"split-forward",
       {OP_RECIPE_CREATE, OP_LINEAR_CREATE, OP_AUTOCAST_BEGIN, OP_FORWARD_COMPUTE, OP_FORWARD_SAVE, OP_AUTOCAST_END,
        OP_BACKWARD, OP_BACKWARD, OP_BACKWARD_DESTROY, OP_BACKWARD}},
      {"residual-copies",
       {OP_LINEAR_CREATE, OP_AUTOCAST_BEGIN, OP_FORWARD_COMPUTE, OP_RESIDUALS_COPY, OP_RESIDUALS_RELEASE,
        OP_FORWARD_COMPUTE, OP_RESIDUALS_RELEASE, OP_FORWARD_SAVE, OP_AUTOCAST_END, OP_RESIDUALS_RELEASE}},
      {"stale-backward",
       {OP_LINEAR_CREATE, OP_FORWARD, OP_BACKWARD_DESTROY, OP_FORWARD, OP_BACKWARD, OP_BACKWARD_DESTROY,
        OP_BACKWARD}},
      {"groups",
       {OP_GROUP_CREATE, OP_RECIPE_CREATE, OP_AUTOCAST_BEGIN, OP_LINEAR_CREATE, OP_FORWARD, OP_GROUP_DESTROY,
        OP_AUTOCAST_END, OP_BACKWARD, OP_GROUP_QUERY, OP_AUTOCAST_QUERY}},
      {"state", {OP_LINEAR_CREATE, OP_TRAIN_STEP, OP_STATE, OP_STATE, OP_STATE, OP_STATE, OP_SCALING_STATE}},
      {"primitives",
       {OP_QUANTIZE, OP_DEQUANTIZE, OP_CAST_TRANSPOSE, OP_AMAX, OP_GEMM, OP_ACTIVATION_FORWARD,
        OP_ACTIVATION_BACKWARD, OP_GEMM}},
      {"recipes",
       {OP_RECIPE_CREATE, OP_RECIPE_CREATE, OP_RECIPE_CREATE, OP_RECIPE_RETAIN, OP_RECIPE_QUERY, OP_RECIPE_RELEASE,
        OP_RECIPE_QUERY, OP_RECIPE_RELEASE}},
      {"nested-scopes",
       {OP_AUTOCAST_BEGIN, OP_AUTOCAST_BEGIN, OP_AUTOCAST_BEGIN, OP_AUTOCAST_BEGIN, OP_AUTOCAST_QUERY,
        OP_AUTOCAST_END, OP_AUTOCAST_END, OP_AUTOCAST_END, OP_AUTOCAST_END, OP_AUTOCAST_END}},
      {"contexts",
       {OP_CTX_CREATE, OP_LINEAR_CREATE, OP_MALLOC, OP_COPY, OP_FREE, OP_CTX_DESTROY, OP_FORWARD, OP_CONTEXT_MISC,
        OP_CTX_CREATE}},
      {"wrong-handles",
       {OP_RECIPE_CREATE, OP_GROUP_CREATE, OP_LINEAR_CREATE, OP_FORWARD, OP_WRONG_HANDLE, OP_WRONG_HANDLE,
        OP_WRONG_HANDLE, OP_WRONG_HANDLE}},
      {"memory", {OP_TENSOR_QUERY, OP_TENSOR_QUERY, OP_MALLOC, OP_MALLOC, OP_FREE, OP_MALLOC, OP_TENSOR_QUERY}},
      {"norms",
       {OP_NORM_FORWARD, OP_NORM_BACKWARD, OP_NORM_FORWARD, OP_NORM_FORWARD, OP_NORM_BACKWARD, OP_NORM_FORWARD,
        OP_NORM_BACKWARD, OP_NORM_FORWARD}},
      {"grouped",
       {OP_GROUPED_CREATE, OP_GROUPED_FORWARD, OP_GROUPED_BACKWARD, OP_AUTOCAST_BEGIN, OP_GROUPED_FORWARD,
        OP_GROUPED_FORWARD, OP_AUTOCAST_END, OP_GROUPED_BACKWARD, OP_GROUPED_STATE, OP_GROUPED_STATE,
        OP_GROUPED_BACKWARD_DESTROY, OP_GROUPED_DESTROY, OP_GROUPED_FORWARD}},
      {"layernorm",
       {OP_LN_CREATE, OP_LN_FORWARD, OP_LN_BACKWARD, OP_AUTOCAST_BEGIN, OP_LN_FORWARD, OP_LN_FORWARD, OP_AUTOCAST_END,
        OP_LN_BACKWARD, OP_LN_BACKWARD, OP_LN_STATE, OP_LN_STATE, OP_LN_STATE, OP_LN_BACKWARD_DESTROY, OP_LN_DESTROY,
        OP_LN_FORWARD}},
      {"caller-residuals",
       {OP_LINEAR_CREATE, OP_CR_SIZE, OP_CR_FORWARD, OP_CR_BACKWARD, OP_AUTOCAST_BEGIN, OP_CR_SIZE, OP_CR_FORWARD,
        OP_CR_FORWARD, OP_CR_BACKWARD, OP_AUTOCAST_END, OP_CR_BACKWARD, OP_CR_BACKWARD, OP_CR_DESTROY,
        OP_CR_BACKWARD}},
      {"attention",
       {OP_ATTN_CREATE, OP_ATTN_FORWARD, OP_ATTN_BACKWARD, OP_AUTOCAST_BEGIN, OP_ATTN_FORWARD, OP_ATTN_FORWARD,
        OP_AUTOCAST_END, OP_ATTN_BACKWARD, OP_ATTN_BACKWARD, OP_ATTN_STATE, OP_ATTN_STATE, OP_ATTN_CALLER,
        OP_ATTN_CALLER, OP_ATTN_CALLER, OP_ATTN_BACKWARD_DESTROY, OP_ATTN_DESTROY, OP_ATTN_FORWARD}},
      {"rope", {OP_ROPE, OP_ROPE, OP_ROPE, OP_ROPE, OP_ROPE, OP_ROPE, OP_ROPE, OP_ROPE}},
      {"training-ops",
       {OP_ADD, OP_COLUMNS, OP_EMBEDDING, OP_CROSS_ENTROPY, OP_ADAMW, OP_ADD, OP_COLUMNS, OP_EMBEDDING,
        OP_CROSS_ENTROPY, OP_ADAMW, OP_COLUMNS, OP_EMBEDDING}},
      {"adamw-owners",
       {OP_LINEAR_CREATE, OP_LN_CREATE, OP_TRAIN_STEP, OP_ADAMW, OP_ADAMW, OP_ADAMW, OP_TRAIN_STEP, OP_ADAMW,
        OP_ADAMW, OP_ADAMW}},
      {"checkpoints",
       {OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT,
        OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT}},
  };
  // Programs aimed at one class of bug each: their first arguments are given (the rest are 0).
  struct Aimed {
    const char *name;
    std::vector<uint8_t> ops;
    std::vector<std::vector<uint8_t>> args;  // per operation
  };
  std::vector<Aimed> aimed = {
      // a by-value copy of residuals released after the original was saved, then backward
      {"aim-residual-copy-released-after-save",
       {OP_LINEAR_CREATE, OP_AUTOCAST_BEGIN, OP_FORWARD_COMPUTE, OP_RESIDUALS_COPY, OP_FORWARD_SAVE,
        OP_RESIDUALS_RELEASE, OP_AUTOCAST_END, OP_BACKWARD},
       {{}, {}, {0}, {0, 1}, {0}, {1}, {}, {0}}},
      // a copy released after the original was released and its storage handed out again
      {"aim-residual-copy-double-release",
       {OP_LINEAR_CREATE, OP_FORWARD_COMPUTE, OP_RESIDUALS_COPY, OP_RESIDUALS_RELEASE, OP_FORWARD_COMPUTE,
        OP_RESIDUALS_RELEASE, OP_FORWARD_COMPUTE, OP_FORWARD_SAVE, OP_RESIDUALS_RELEASE, OP_BACKWARD},
       {{}, {0}, {0, 1}, {0}, {2}, {1}, {3}, {2}, {3}, {0}}},
      // a group destroyed while a scope and its bucket use it
      {"aim-group-destroyed-in-scope",
       {OP_GROUP_CREATE, OP_LINEAR_CREATE, OP_AUTOCAST_BEGIN, OP_FORWARD, OP_GROUP_DESTROY, OP_AUTOCAST_END,
        OP_BACKWARD},
       {{0}, {}, {0, 0, 0, 0, 150}, {0}, {0}, {}, {0}}},
      // a destroyed backward context's handle used after its storage went to a new one
      {"aim-stale-backward-reissued",
       {OP_LINEAR_CREATE, OP_FORWARD, OP_BACKWARD_DESTROY, OP_FORWARD, OP_BACKWARD, OP_BACKWARD_DESTROY},
       {{}, {0}, {0}, {1}, {0}, {0}}},
      {"aim-stale-context", {OP_CTX_DESTROY, OP_AMAX, OP_AUTOCAST_BEGIN}, {{0}, {0}, {0}}},
      {"aim-stale-linear", {OP_LINEAR_CREATE, OP_LINEAR_DESTROY, OP_FORWARD, OP_LINEAR_DESTROY}, {{}, {0}, {0, 0}, {0}}},
      {"aim-stale-recipe", {OP_RECIPE_CREATE, OP_RECIPE_RELEASE, OP_RECIPE_QUERY}, {{0}, {0}, {200, 0}}},
      {"aim-malloc-size-max", {OP_MALLOC, OP_MALLOC}, {{0, 2}, {0, 3, 100}}},
      {"aim-status-string", {OP_CONTEXT_MISC}, {{0, 4, 0x4a, 0, 0, 0}}},
      // x of 16 x 16 floats claiming {2^62 + 1, 4} (wraps to 4 elements in int64)
      // a grouped layer destroyed while its backward context is pending; the stale layer used
      {"aim-grouped-layer-destroyed-before-backward",
       {OP_GROUPED_CREATE, OP_AUTOCAST_BEGIN, OP_GROUPED_FORWARD, OP_AUTOCAST_END, OP_GROUPED_DESTROY,
        OP_GROUPED_BACKWARD, OP_GROUPED_FORWARD, OP_GROUPED_STATE},
       {{}, {}, {0}, {}, {0}, {0}, {1}, {0}}},
      {"aim-numel-overflow", {OP_AMAX, OP_TENSOR_QUERY}, {{0, 0, 0, 0, 0, 0, 0, 237, 2}, {}}},
      // LayerNormMLP (kind byte 200) and LayerNormLinear in one FP8 pass; backward of the second
      // (the pass stays pending), then of the first (it ends the pass; the fuzzer varies what it
      // requests, nothing included)
      {"aim-layernorm-first-module-backward-requests-nothing",
       {OP_LN_CREATE, OP_LN_CREATE, OP_AUTOCAST_BEGIN, OP_LN_FORWARD, OP_LN_FORWARD, OP_AUTOCAST_END, OP_LN_BACKWARD,
        OP_LN_BACKWARD, OP_LN_STATE},
       {{0, 0, 200}, {1}, {}, {0, 0}, {1, 1}, {}, {1}, {0}, {0}}},
      // a module destroyed while its backward context is pending; the stale module used after
      {"aim-layernorm-module-destroyed-before-backward",
       {OP_LN_CREATE, OP_AUTOCAST_BEGIN, OP_LN_FORWARD, OP_AUTOCAST_END, OP_LN_DESTROY, OP_LN_BACKWARD, OP_LN_FORWARD,
        OP_LN_STATE},
       {{0, 0, 200}, {}, {0}, {}, {0}, {0}, {1}, {0}}},
      // residuals in the caller's memory for a LayerNormLinear, a LayerNormMLP and a grouped linear
      // in an FP8 pass and outside it: size, forward_compute_into, backward_from (TE_BACKWARD_ONCE,
      // then again: stale), a layer destroyed with its records pending
      {"aim-caller-residuals-modules",
       {OP_LN_CREATE, OP_LN_CREATE, OP_GROUPED_CREATE, OP_AUTOCAST_BEGIN, OP_CR_SIZE, OP_CR_SIZE, OP_CR_FORWARD,
        OP_CR_FORWARD, OP_CR_FORWARD, OP_AUTOCAST_END, OP_CR_BACKWARD, OP_CR_BACKWARD, OP_CR_BACKWARD, OP_CR_FORWARD,
        OP_CR_BACKWARD, OP_CR_BACKWARD, OP_CR_DESTROY, OP_CR_BACKWARD},
       {{0, 0, 200},
        {1},
        {},
        {},
        {1, 0},
        {2, 0},
        {0, 1, 0},
        {1, 1, 1},
        {2, 2, 0},
        {},
        {0},
        {1},
        {2, 0, 0, 0, 0, 1},
        {3, 1, 0},
        {2, 0, 0, 0, 0, 1},
        {2},
        {0},
        {0}}},
  };
  // FP8 attention (create's fp8 byte 200) in a delayed-scaling pass: THD forwards, backward
  // twice, a caller-memory forward and backward_from, state reads; the module destroyed while a
  // backward context and a record are pending, then used.
  aimed.push_back({"aim-attention-fp8-pass",
                   {OP_ATTN_CREATE, OP_AUTOCAST_BEGIN, OP_ATTN_FORWARD, OP_ATTN_CALLER, OP_AUTOCAST_END,
                    OP_ATTN_BACKWARD, OP_ATTN_BACKWARD, OP_ATTN_CALLER, OP_ATTN_STATE, OP_ATTN_STATE, OP_ATTN_DESTROY,
                    OP_ATTN_BACKWARD, OP_ATTN_CALLER, OP_ATTN_FORWARD},
                   {{0, 0, 0, 0, 0, 0, 0, 0, 200}, {}, {0}, {0, 0, 0}, {}, {0}, {0}, {0, 200, 0, 0}, {0, 0, 0},
                    {0, 0, 200}, {0}, {0}, {0, 200, 0, 0}, {0}}});
  // Checkpoint programs (api_training.h: the first argument picks the call): create, put a
  // tensor and bytes, read them, serialise (intact and damaged), write and read a file, count.
  aimed.push_back({"aim-checkpoint-records",
                   {OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT,
                    OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT},
                   {{0}, {2, 0, 0}, {4, 0, 2, 0, 5}, {4, 0, 4, 0, 9}, {5, 0, 0}, {6, 0, 2, 150}, {6, 0, 4, 250},
                    {7, 0, 0, 0}, {7, 0, 0, 200}, {8, 0}, {9, 0}}});
  aimed.push_back({"aim-checkpoint-stale",
                   {OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT, OP_CHECKPOINT},
                   {{0}, {4, 0, 3}, {1}, {4, 0, 3}, {9, 0}}});
  // AdamW with the program's linear as the owner (its slot and context 0), after an FP8 step.
  aimed.push_back({"aim-adamw-linear-owner",
                   {OP_LINEAR_CREATE, OP_TRAIN_STEP, OP_ADAMW, OP_TRAIN_STEP, OP_ADAMW},
                   {{}, {0}, {0, 0, 0, 0, 0, 0, 0, 0, 160, 0}, {0}, {0, 150, 0, 0, 1, 0, 0, 0, 170, 0}}});
  for (const Aimed &a : aimed) {
    Reader rec(a.ops, 99, 0, a.args);
    {
      Program p(rec);
      p.run();
    }
    write_file(dir, a.name, rec.encoding());
  }
  // Each script with every argument 0 (the common choices), then twice with random arguments.
  const int kNonzero[3] = {0, 24, 64};
  for (const Script &sc : scripts) {
    for (int v = 0; v < 3; ++v) {
      Reader rec(sc.ops, 0x1234567u * static_cast<uint64_t>(v + 1) + sc.ops.size(), kNonzero[v]);
      {
        Program p(rec);
        p.run();
      }
      write_file(dir, std::string(sc.name) + "-" + std::to_string(v), rec.encoding());
    }
  }
}

// ---- fuzz_dlpack ----------------------------------------------------------------------------

void dlpack_corpus(const std::string &dir) {
  using fuzz::DlpackSpec;
  auto base = [] {
    DlpackSpec s;
    std::memset(&s, 0, sizeof s);
    s.versioned = 0;
    s.version_major = 1;
    s.version_minor = 0;
    s.ndim = 2;
    s.dtype_code = fuzz::kDLFloat;
    s.dtype_bits = 32;
    s.dtype_lanes = 1;
    s.device_type = fuzz::kDLCPU;
    s.fp8_dtype = TE_DTYPE_E4M3;
    s.shape[0] = 4;
    s.shape[1] = 8;
    return s;
  };
  auto emit = [&](const char *name, const DlpackSpec &s) {
    std::vector<uint8_t> b(sizeof s);
    std::memcpy(b.data(), &s, sizeof s);
    write_file(dir, name, b);
  };
  DlpackSpec s = base();
  emit("f32-2d", s);
  s.versioned = 1;
  emit("f32-2d-versioned", s);
  s.flags = fuzz::DLPACK_FLAG_BITMASK_READ_ONLY;
  emit("read-only", s);
  s.flags = fuzz::DLPACK_FLAG_BITMASK_IS_COPIED;
  emit("is-copied", s);
  s = base();
  s.versioned = 1;
  s.version_major = 2;
  emit("major-2", s);
  s.version_major = 0;
  s.version_minor = 8;
  emit("major-0", s);
  s = base();
  s.versioned = 2;
  emit("versioned-2-plain", s);
  s.struct_kind = 1;
  emit("versioned-2-versioned", s);
  s.versioned = -1;
  emit("versioned-minus-1", s);
  s = base();
  s.dtype_code = fuzz::kDLBfloat;
  s.dtype_bits = 16;
  s.ndim = 3;
  s.shape[2] = 2;
  s.strides_mode = 1;
  emit("bf16-3d-strides", s);
  s.strides_mode = 2;
  s.strides[0] = 16;
  s.strides[1] = 1;
  s.strides[2] = 8;
  emit("bf16-3d-transposed", s);
  s = base();
  s.dtype_code = fuzz::kDLFloat;
  s.dtype_bits = 16;
  s.byte_offset = 6;
  emit("f16-offset", s);
  s.byte_offset = 3;
  emit("f16-misaligned", s);
  s.byte_offset = ~0ull - 1;
  emit("f16-offset-wraps", s);
  s = base();
  s.dtype_code = fuzz::kDLUInt;
  s.dtype_bits = 8;
  s.fp8_dtype = TE_DTYPE_E5M2;
  emit("uint8-e5m2", s);
  s.fp8_dtype = TE_DTYPE_F32;
  emit("uint8-bad-fp8", s);
  s = base();
  s.dtype_code = fuzz::kDLFloat8_e4m3fn;
  s.dtype_bits = 8;
  emit("float8-e4m3fn", s);
  s = base();
  s.dtype_lanes = 4;
  emit("lanes-4", s);
  s = base();
  s.device_type = fuzz::kDLCUDA;
  s.device_id = 1;
  emit("cuda-1", s);
  s.device_id = -1;
  emit("cuda-minus-1", s);
  s.device_type = fuzz::kDLCUDAHost;
  s.device_id = 0;
  emit("cuda-host", s);
  s.device_type = fuzz::kDLROCM;
  emit("rocm", s);
  s = base();
  s.ndim = 9;
  emit("ndim-9", s);
  s.ndim = 0;
  emit("ndim-0", s);
  s.ndim = -3;
  emit("ndim-negative", s);
  s = base();
  s.shape_mode = 1;
  emit("shape-null", s);
  s = base();
  s.data_mode = 1;
  emit("data-null", s);
  s = base();
  s.shape[0] = 0;
  emit("dim-0", s);
  s.shape[0] = -4;
  emit("dim-negative", s);
  s = base();
  s.ndim = 2;
  s.shape[0] = int64_t{1} << 62;
  s.shape[1] = 4;
  emit("numel-wraps", s);
  s.shape[0] = int64_t{1} << 32;
  s.shape[1] = int64_t{1} << 31;
  s.strides_mode = 1;
  emit("strides-wrap", s);
  s = base();
  s.ndim = 8;
  for (int i = 0; i < 8; ++i) s.shape[i] = 2;
  s.strides_mode = 1;
  emit("ndim-8", s);
  s = base();
  s.out_mode = 1;
  emit("out-null", s);
  s.out_mode = 2;
  emit("in-null", s);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fuzz_make_corpus state|api|dlpack|all DIR\n");
    return 2;
  }
  const std::string what = argv[1], dir = argv[2];
  mkdir(dir.c_str(), 0755);
  te_context_options o;
  te_context_options_init(&o);
  o.use_default_device = 0;
  o.device.type = TE_DEVICE_CPU;
  te_context *ctx = nullptr;
  check(te_context_create(&ctx, &o), "te_context_create");
  const bool all = what == "all";
  if (what == "state" || all) state_corpus(ctx, all ? dir + "/fuzz_state_load" : dir);
  if (what == "api" || all) api_corpus(all ? dir + "/fuzz_api_sequence" : dir);
  if (what == "dlpack" || all) dlpack_corpus(all ? dir + "/fuzz_dlpack" : dir);
  te_context_destroy(ctx);
  if (g_written == 0) {
    std::fprintf(stderr, "fuzz_make_corpus: unknown corpus '%s'\n", what.c_str());
    return 2;
  }
  std::printf("fuzz_make_corpus: %d files\n", g_written);
  return 0;
}
