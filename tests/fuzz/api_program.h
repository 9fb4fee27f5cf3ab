// The interpreter behind fuzz_api_sequence: the fuzz input is a program of public API calls
// over a few slots of each handle type (contexts, recipes, groups, linears, residuals, backward
// contexts, te_context_malloc blocks), run against a model of what the library should do.
//
// Every call's status is accepted, but a call that the header says must fail (a malformed
// tensor, a stale or wrong-type handle, an out-of-range enum or boolean, a wrong token...) must
// fail, and every failed call must leave its outputs untouched (they are snapshotted or filled
// with a sentinel first) and name itself in te_last_error(). Crashes, sanitizer reports, leaks
// and aborts are bugs. Caller rules of the header are kept (a context outlives its linears,
// backward contexts, residuals and blocks; buffers a high-precision forward referenced stay
// alive until the end), so that every report is the library's.
//
// Also included by make_corpus.cpp, which runs scripted programs with a recording Reader to
// write the seed corpus.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "api_model.h"

namespace fuzz {

// The forward arguments of a caller-memory op (api_caller.h), by kind: 0 te_linear, 1
// LayerNormLinear, 2 LayerNormMLP, 3 grouped; m*: moved copies of the parameters.
struct CrArgs {
  te_tensor x{}, w{}, b{}, gamma{}, beta{}, w2{}, b2{};
  std::vector<te_tensor> ew, eb;
  std::vector<const te_tensor *> ewp, ebp;
  std::vector<int64_t> splits;
  te_linear_forward_args la{};
  te_layernorm_linear_forward_args nla{};
  te_layernorm_mlp_forward_args nma{};
  te_grouped_linear_forward_args ga{};
  Blob mx, mw, mb, mg, mbeta, mw2, mb2;
  const void *args(int kind) const;
};

// ---- the program ---------------------------------------------------------------------------

class Program {
 public:
  explicit Program(Reader &r) : R(r) {}
  ~Program() { teardown(); }

  void run() {
    // Every program starts with one CPU context: most inputs then reach the interesting calls.
    create_context(0, 1);
    for (size_t n = 0; n < kMaxOps && R.more_ops(); ++n) step(R.op() % OP_COUNT);
  }

 private:
  struct Scope {
    te_autocast_token token;
    int enabled, calibrating;
    const te_recipe *recipe;  // as given (NULL: the context's default)
  };
  struct CtxSlot {
    te_context *h = nullptr;
    bool live = false;
    std::vector<Scope> scopes;
    uint64_t closed = 0;  // successful te_autocast_end calls
  };
  struct RecipeSlot {
    te_recipe *h = nullptr;
    int refs = 0;
  };
  struct GroupSlot {
    te_group *h = nullptr;
    bool live = false;
  };
  struct LinCfg {
    int64_t in = 16, out = 16;
    int bias = 1, dtype = TE_DTYPE_BF16, fuse = 0;
    bool small() const { return in >= 1 && in <= 64 && out >= 1 && out <= 64; }
  };
  // A linear's parameters: x (room for kMaxTokens rows), W, b, main_grad. A high-precision
  // forward's residuals reference x and W, so these live until the end of the program.
  struct LinBufs {
    Blob x, w, b, main_grad;
  };
  struct LinSlot {
    te_linear *h = nullptr;
    bool live = false;
    int ctx = 0;
    LinCfg cfg;
    LinBufs *bufs = nullptr;
  };
  struct ResSlot {
    te_linear_residuals r{};
    bool filled = false;
    uint64_t id = 0;  // which forward_compute filled it (copies share it)
    int ctx = 0;
    te_linear *lin = nullptr;
    LinCfg cfg;
    int64_t tokens = 16;
  };
  struct BwdSlot {
    te_linear_backward_ctx *h = nullptr;
    bool live = false;
    int ctx = 0;
    te_linear *lin = nullptr;
    LinCfg cfg;
    LinBufs *bufs = nullptr;
    int64_t tokens = 16;
    bool once_done = false;
  };
  struct Block {
    int ctx;
    uint8_t *p;
    size_t n;
  };
  // A grouped linear (api_grouped.h): its configuration, and parameters that live until the end
  // (a high-precision forward's residuals reference x and the weights).
  static constexpr int kMoeSlots = 3, kMoeBwdSlots = 4;
  struct MoeCfg {
    int n = 2;
    int64_t in = 16, out = 16;
    int bias = 1, dtype = TE_DTYPE_BF16, fuse = 0;
    bool small() const { return n >= 1 && n <= 4 && in >= 1 && in <= 64 && out >= 1 && out <= 64; }
  };
  struct MoeBufs {
    Blob x, w, b, main_grad;  // x [kMaxTokens, in]; every expert's W, b and F32 main_grad
  };
  struct MoeSlot {
    te_grouped_linear *h = nullptr;
    bool live = false;
    int ctx = 0;
    MoeCfg cfg;
    MoeBufs *bufs = nullptr;
  };
  struct MoeBwdSlot {
    te_grouped_linear_backward_ctx *h = nullptr;
    bool live = false;
    int ctx = 0;
    MoeCfg cfg;
    MoeBufs *bufs = nullptr;
    std::vector<int64_t> splits;  // the forward's
    bool once_done = false;
  };

  // A LayerNormLinear or LayerNormMLP (api_layernorm.h): kind 0 or 1, its configuration, and
  // parameters that live until the end (a forward references x and gamma, and in high precision
  // the weights). MLP: in = hidden, out = ffn.
  static constexpr int kLnSlots = 4, kLnBwdSlots = 4;
  struct LnCfg {
    int kind = 0;
    int64_t in = 16, out = 16;
    int bias = 1, dtype = TE_DTYPE_BF16, fuse = 0, norm = TE_NORM_LAYERNORM, zc = 0, act = TE_ACTIVATION_GELU;
    float eps = 1e-5f;
    int64_t fc1_rows() const {
      return kind == 1 && (act == TE_ACTIVATION_SWIGLU || act == TE_ACTIVATION_GEGLU) ? 2 * out : out;
    }
    bool small() const { return in >= 1 && in <= 64 && out >= 1 && out <= 64; }
  };
  struct LnBufs {
    Blob x, gamma, beta, w, b, w2, b2, main_grad, main_grad2;  // w, b: LayerNormLinear's or fc1's
  };
  struct LnSlot {
    void *h = nullptr;
    bool live = false;
    int ctx = 0;
    LnCfg cfg;
    LnBufs *bufs = nullptr;
  };
  struct LnBwdSlot {
    void *h = nullptr;
    bool live = false;
    int ctx = 0;
    LnCfg cfg;
    LnBufs *bufs = nullptr;
    int64_t tokens = 16;
    bool once_done = false;
  };

  // A caller-memory forward (api_caller.h): its layer, and the block it filled.
  struct CrLayer {
    int kind = 0;  // 0 linear, 1 LayerNormLinear, 2 LayerNormMLP, 3 grouped
    void *h = nullptr;
    bool live = false;
    int ctx = 0;
    int64_t in = 16, out = 16;
    int bias = 1, dt = TE_DTYPE_BF16, fuse = 0, n = 1;
    LnCfg ln;
    LinBufs *lb = nullptr;
    LnBufs *nb = nullptr;
    MoeBufs *mb = nullptr;
  };
  static constexpr int kCrSlots = 4;
  struct CrSlot {
    bool filled = false, once_done = false;
    CrLayer layer;
    int ctx = 0, fp8 = 0;
    int64_t tokens = 16;
    std::vector<int64_t> splits;
    uint8_t *mem = nullptr;           // owned (free)
    uint8_t *block = nullptr;         // what the forward got (mem, or NULL)
    size_t bytes = 0;
  };

  // Attention (api_attention.h): modules, the tensors of every forward (alive until the end:
  // residuals reference them), backward contexts, caller-memory blocks; RoPE's tensors.
  static constexpr int kAttnSlots = 3, kAttnBwdSlots = 4, kAttnCrSlots = 2;
  struct AttnCfg {
    int heads = 2, kv = 1, hd = 8, dtype = TE_DTYPE_F32, mask = 0, fp8 = 0;
    float scale = 0.0f;
  };
  struct AttnSlot {
    te_attention *h = nullptr;
    bool live = false;
    int ctx = 0;
    AttnCfg cfg;
  };
  struct AttnIn {
    AttnCfg cfg;
    bool thd = false;
    int64_t batch = 1, tq = 0, tkv = 0, max_q = 0, max_kv = 0;
    std::vector<int32_t> lens_q, lens_kv;
    Tensor q, k, v, o, cq, ckv;
    te_attention_forward_args a{};
  };
  struct AttnGrads {
    Tensor d_o, dq, dk, dv;
    te_attention_grads g{};
    bool null_grads = false;
  };
  struct AttnBwdSlot {
    te_attention_backward_ctx *h = nullptr;
    bool live = false;
    int ctx = 0;
    AttnCfg cfg;
    AttnIn *in = nullptr;
    int fp8 = 0;
    bool once_done = false;
  };
  struct AttnCrSlot {
    bool filled = false, once_done = false;
    int ms = -1, ctx = 0;
    te_attention *m = nullptr;
    AttnIn *in = nullptr;
    const void *block = nullptr;
    size_t bytes = 0;
  };
  struct RopeBufs {
    Tensor x, y, freqs, cu, inplace, back;
  };

  // Checkpoints (api_training.h): slots, and a model of each one's records.
  static constexpr int kCkSlots = 3;
  struct CkRec {
    bool tensor = false;
    int dtype = 0;
    Shape shape;
    std::vector<uint8_t> bytes;
  };
  struct CkSlot {
    te_checkpoint *h = nullptr;
    bool live = false;
    std::map<std::string, CkRec> recs;
  };

  Reader &R;
  uint32_t serial_ = 0;
  CrSlot cr_[kCrSlots];
  CtxSlot ctx_[kCtxSlots];
  std::vector<te_context *> dead_ctx_;
  RecipeSlot rec_[kRecipeSlots];
  std::vector<te_recipe *> dead_rec_;
  GroupSlot grp_[kGroupSlots];
  std::vector<te_group *> dead_grp_;
  std::vector<uint64_t> group_ids_;
  LinSlot lin_[kLinearSlots];
  std::vector<te_linear *> dead_lin_;
  std::vector<std::unique_ptr<LinBufs>> all_bufs_;
  ResSlot res_[kResSlots];
  std::set<uint64_t> live_res_;
  uint64_t next_res_id_ = 1;
  BwdSlot bwd_[kBwdSlots];
  std::vector<Block> blocks_;
  std::vector<uintptr_t> freed_blocks_;
  std::vector<te_autocast_token> ended_tokens_;
  MoeSlot moe_[kMoeSlots];
  std::vector<te_grouped_linear *> dead_moe_;
  std::vector<std::unique_ptr<MoeBufs>> all_moe_bufs_;
  std::unique_ptr<MoeBufs> stand_in_;  // parameters for calls that name no usable layer
  MoeBwdSlot moe_bwd_[kMoeBwdSlots];
  LnSlot ln_[kLnSlots];
  std::vector<void *> dead_ln_;
  std::vector<std::unique_ptr<LnBufs>> all_ln_bufs_;
  std::unique_ptr<LnBufs> ln_stand_in_;
  LnBwdSlot ln_bwd_[kLnBwdSlots];
  AttnSlot attn_[kAttnSlots];
  std::vector<te_attention *> dead_attn_;
  AttnBwdSlot attn_bwd_[kAttnBwdSlots];
  AttnCrSlot attn_cr_[kAttnCrSlots];
  std::vector<std::unique_ptr<AttnIn>> attn_keep_;
  std::vector<std::unique_ptr<AttnGrads>> attn_grad_keep_;
  std::vector<std::unique_ptr<RopeBufs>> rope_keep_;
  std::vector<Blob> attn_blocks_;
  CkSlot ck_[kCkSlots];
  std::vector<te_checkpoint *> dead_ck_;

  // ---- helpers (api_arguments.h) ----
  static std::vector<uint8_t> bytes_of(const void *p, size_t n) {
    const uint8_t *b = static_cast<const uint8_t *>(p);
    return std::vector<uint8_t>(b, b + n);
  }

  static bool same_bytes(const void *p, const std::vector<uint8_t> &s) {
    return std::memcmp(p, s.data(), s.size()) == 0;
  }

  void *some_live_handle(int avoid_kind);
  te_context *ctx_arg(bool &mf, int &slot, int preferred = -1);
  int live_ctx_slot() const;

  // ---- tensors (api_arguments.h) ----
  Shape gen_shape(int64_t cap = kMaxElems);
  void fill_values(Tensor &x, int mode, uint32_t seed);
  void make(Tensor &x, int dtype, const Shape &shape, int scaling = TE_SCALING_PER_TENSOR);
  void maybe_malform(Tensor &x);
  Tensor *maybe_null(Tensor &x, bool &mf, bool optional = false);
  static te_tensor *tp(Tensor *x) { return x ? &x->t : nullptr; }
  int pick_dtype(int def, bool &odd);
  int pick_scaling();

  // ---- contexts (api_handles.h) ----
  void create_context(int slot, int mode);
  void destroy_context(int slot);
  te_context *ctx_of(int slot) const { return slot >= 0 ? ctx_[slot].h : nullptr; }
  bool ctx_live(int slot) const { return slot >= 0 && ctx_[slot].live; }

  // ---- recipes (api_handles.h) ----
  te_recipe *recipe_arg(bool &mf, bool allow_null = true);
  void recipe_create();
  static bool same_options(const te_recipe_options &a, const te_recipe_options &b) {
    return get_enum(a.kind) == get_enum(b.kind) && get_enum(a.format) == get_enum(b.format) && a.margin == b.margin &&
           a.amax_history_len == b.amax_history_len && get_enum(a.amax_algo) == get_enum(b.amax_algo) &&
           a.reduce_amax == b.reduce_amax && a.power_of_2_scales == b.power_of_2_scales &&
           std::memcmp(&a.amax_epsilon, &b.amax_epsilon, sizeof(float)) == 0 &&
           a.fprop_split_accumulator == b.fprop_split_accumulator &&
           a.dgrad_split_accumulator == b.dgrad_split_accumulator &&
           a.wgrad_split_accumulator == b.wgrad_split_accumulator;
  }

  void check_recipe_keys();
  void release_recipe(int slot);
  void recipe_query();

  // ---- groups (api_handles.h) ----
  te_group *group_arg(bool &mf);
  void group_create();

  // ---- autocast (api_handles.h) ----
  void check_autocast_state(int slot);
  void autocast_begin();
  void autocast_end();
  void autocast_query();

  // ---- linears (api_linear.h) ----
  int64_t pick_features(bool &mf);
  void linear_create();
  void linear_destroy();
  te_linear *lin_arg(bool &mf, int &slot);
  std::vector<uint8_t> layer_state(te_context *ctx, te_linear *lin);
  int fp8_scope(int cs) const;
  void forward_tensors(int ls, const LinCfg &cfg, LinBufs *bufs, int64_t &tokens, Tensor &x, Tensor &w, Tensor &b,
                       Tensor &y, bool &mf);
  void check_residuals(const te_linear_residuals &r, const LinCfg &cfg, int64_t tokens, int expect_fp8);
  void clear_res_slot(int rs);
  void forward_compute();
  BwdSlot &fresh_bwd_slot(int &bs);
  void forward_save();
  void forward();
  void backward();
  void backward_destroy();
  void residuals_release();
  void residuals_copy();

  // ---- state save/load (api_state.h) ----
  void state_ops();
  void load_and_check(te_context *ctx, te_linear *lh, const std::vector<uint8_t> &m,
                      const std::vector<uint8_t> &original);
  void scaling_state();

  // ---- primitives (api_primitives.h) ----
  te_quantize_options *quantize_opts(te_quantize_options &o, Blob &scale, Blob &amax, bool block, bool &mf);
  void quantize();
  void dequantize();
  void cast_transpose();
  void amax_op();
  void gemm();
  void activation(bool backward_pass);

  // ---- norms (api_norm.h) ----
  te_norm_options *norm_opts(te_norm_options &o, int &kind, bool &mf);
  void norm_forward();
  void norm_backward();

  // ---- grouped linears (api_grouped.h) ----
  te_grouped_linear *moe_arg(bool &mf, int &slot);
  std::vector<uint8_t> moe_state(te_context *ctx, te_grouped_linear *g);
  void moe_create();
  void moe_destroy();
  std::vector<int64_t> moe_splits(int n, int64_t &tokens, bool &mf);
  void moe_params(const MoeCfg &cfg, MoeBufs *bufs, std::vector<te_tensor> &w, std::vector<te_tensor> &b,
                  std::vector<const te_tensor *> &wp, std::vector<const te_tensor *> &bp, bool &mf);
  MoeBwdSlot &fresh_moe_bwd_slot(int &bs);
  void moe_forward();
  void moe_backward();
  void moe_backward_destroy();
  void moe_state_op();
  void load_moe_and_check(te_context *ctx, te_grouped_linear *g, const std::vector<uint8_t> &buf,
                          const std::vector<uint8_t> &original);
  void moe_drop_context(int slot);

  // ---- LayerNormLinear and LayerNormMLP (api_layernorm.h) ----
  void *ln_arg(bool &mf, int &slot);
  std::vector<uint8_t> ln_state(te_context *ctx, void *h, int kind);
  static void ln_destroy_handle(void *h, int kind);
  static void ln_destroy_backward(void *h, int kind);
  void ln_create();
  void ln_destroy();
  LnBwdSlot &fresh_ln_bwd_slot(int &bs);
  void ln_forward();
  void ln_backward();
  void ln_backward_destroy();
  void ln_state_op();
  void ln_load_and_check(te_context *ctx, void *h, int kind, const std::vector<uint8_t> &buf,
                         const std::vector<uint8_t> &original);
  void ln_drop_context(int slot);

  // ---- residuals in the caller's memory (api_caller.h) ----
  bool cr_layer(int family, int slot, CrLayer &L);
  bool cr_live(const CrLayer &L) const;
  std::vector<uint8_t> cr_state(const CrLayer &L);
  void cr_args(const CrLayer &L, int64_t tokens, const std::vector<int64_t> &splits, int mode, CrArgs &A);
  te_status cr_size_call(int kind, te_context *ctx, void *h, const void *a, size_t *bytes);
  bool cr_pick(CrLayer &L, int64_t &tokens, std::vector<int64_t> &splits, bool &mf);
  void cr_clear(CrSlot &S);
  void cr_size();
  void cr_forward();
  void cr_backward();
  void cr_destroy();

  // ---- attention and RoPE (api_attention.h) ----
  te_attention *attn_arg(bool &mf, int &slot);
  std::vector<uint8_t> attn_state(te_context *ctx, te_attention *m);
  void attn_create();
  void attn_destroy();
  AttnIn *attn_inputs(const AttnCfg &c, bool &mf, bool allow_perturb);
  void attn_fresh_bwd(te_attention_backward_ctx *h, int cs, const AttnCfg &c, AttnIn *in, int fp8);
  int attn_mode(const AttnCfg &c, int cs) const;
  void attn_forward();
  void attn_grads(AttnIn &I, AttnGrads &G, bool &mf, bool perturb);
  void attn_backward();
  void attn_backward_destroy();
  void attn_caller();
  void attn_state_op();
  void rope_op();
  void attn_drop_context(int slot);

  // ---- training-step ops and checkpoints (api_training.h) ----
  void malform_here(Tensor &x);
  int hp_dtype(bool &odd);
  void add_op();
  void columns_op();
  void embedding_op();
  void cross_entropy_op();
  void adamw_op();
  te_checkpoint *ck_arg(bool &mf, int &slot);
  std::string ck_name(bool &mf, bool &null_name);
  void ck_check_model(int slot);
  void ck_check_same(te_checkpoint *h, const std::map<std::string, CkRec> &recs);
  std::string ck_state(CkSlot &c);
  void checkpoint_op();

  // ---- context memory (api_misc.h) ----
  void malloc_op();
  void free_block(size_t i);
  bool is_live_block(const void *p) const;
  void free_op();
  void copy_op();

  // ---- tensor and context getters, wrong-type handles, training steps (api_misc.h) ----
  void tensor_query();
  void context_misc();
  void wrong_handle();
  void train_step();

  void step(uint8_t op) {
    ++serial_;
    if (tracing()) std::fprintf(stderr, "op %u (%s)\n", op, op_name(op));
    switch (op) {
      case OP_CTX_CREATE: create_context(static_cast<int>(R.pick(kCtxSlots)), static_cast<int>(R.pick(8))); break;
      case OP_CTX_DESTROY: destroy_context(static_cast<int>(R.pick(kCtxSlots))); break;
      case OP_RECIPE_CREATE: recipe_create(); break;
      case OP_RECIPE_RETAIN: {
        RecipeSlot &r = rec_[R.pick(kRecipeSlots)];
        FUZZ_ASSERT(te_recipe_retain(nullptr) == nullptr, "te_recipe_retain(NULL) != NULL");
        if (r.refs && r.refs < 8) {
          FUZZ_ASSERT(te_recipe_retain(r.h) == r.h, "te_recipe_retain did not return its argument");
          ++r.refs;
        }
        break;
      }
      case OP_RECIPE_RELEASE: {
        const int slot = static_cast<int>(R.pick(kRecipeSlots));
        te_recipe_release(nullptr);
        release_recipe(slot);
        break;
      }
      case OP_RECIPE_QUERY: recipe_query(); break;
      case OP_GROUP_CREATE: group_create(); break;
      case OP_GROUP_DESTROY: {
        GroupSlot &g = grp_[R.pick(kGroupSlots)];
        if (g.live) {
          te_group_destroy(g.h);  // maybe while a scope or a pending update still names it
          dead_grp_.push_back(g.h);
          g.live = false;
        } else if (g.h) {
          te_group_destroy(g.h);  // destroyed before: a no-op
        }
        break;
      }
      case OP_GROUP_QUERY: {
        bool mf = false;
        te_group *g = group_arg(mf);
        const uint64_t id = te_group_id(g);
        const int32_t rank = te_group_rank(g), size = te_group_size(g);
        if (!g) FUZZ_ASSERT(id == 0 && rank == 0 && size == 1, "group getters on NULL");
        else if (!mf) FUZZ_ASSERT(id != 0 && rank == 0 && size == 1, "group getters on a live single-rank group");
        break;
      }
      case OP_AUTOCAST_BEGIN: autocast_begin(); break;
      case OP_AUTOCAST_END: autocast_end(); break;
      case OP_AUTOCAST_QUERY: autocast_query(); break;
      case OP_LINEAR_CREATE: linear_create(); break;
      case OP_LINEAR_DESTROY: linear_destroy(); break;
      case OP_FORWARD_COMPUTE: forward_compute(); break;
      case OP_FORWARD_SAVE: forward_save(); break;
      case OP_FORWARD: forward(); break;
      case OP_BACKWARD: backward(); break;
      case OP_BACKWARD_DESTROY: backward_destroy(); break;
      case OP_RESIDUALS_RELEASE: residuals_release(); break;
      case OP_RESIDUALS_COPY: residuals_copy(); break;
      case OP_STATE: state_ops(); break;
      case OP_SCALING_STATE: scaling_state(); break;
      case OP_QUANTIZE: quantize(); break;
      case OP_DEQUANTIZE: dequantize(); break;
      case OP_CAST_TRANSPOSE: cast_transpose(); break;
      case OP_AMAX: amax_op(); break;
      case OP_GEMM: gemm(); break;
      case OP_ACTIVATION_FORWARD: activation(false); break;
      case OP_ACTIVATION_BACKWARD: activation(true); break;
      case OP_MALLOC: malloc_op(); break;
      case OP_FREE: free_op(); break;
      case OP_COPY: copy_op(); break;
      case OP_TENSOR_QUERY: tensor_query(); break;
      case OP_CONTEXT_MISC: context_misc(); break;
      case OP_WRONG_HANDLE: wrong_handle(); break;
      case OP_TRAIN_STEP: train_step(); break;
      case OP_NORM_FORWARD: norm_forward(); break;
      case OP_NORM_BACKWARD: norm_backward(); break;
      case OP_GROUPED_CREATE: moe_create(); break;
      case OP_GROUPED_DESTROY: moe_destroy(); break;
      case OP_GROUPED_FORWARD: moe_forward(); break;
      case OP_GROUPED_BACKWARD: moe_backward(); break;
      case OP_GROUPED_BACKWARD_DESTROY: moe_backward_destroy(); break;
      case OP_GROUPED_STATE: moe_state_op(); break;
      case OP_LN_CREATE: ln_create(); break;
      case OP_LN_DESTROY: ln_destroy(); break;
      case OP_LN_FORWARD: ln_forward(); break;
      case OP_LN_BACKWARD: ln_backward(); break;
      case OP_LN_BACKWARD_DESTROY: ln_backward_destroy(); break;
      case OP_LN_STATE: ln_state_op(); break;
      case OP_CR_SIZE: cr_size(); break;
      case OP_CR_FORWARD: cr_forward(); break;
      case OP_CR_BACKWARD: cr_backward(); break;
      case OP_CR_DESTROY: cr_destroy(); break;
      case OP_ATTN_CREATE: attn_create(); break;
      case OP_ATTN_DESTROY: attn_destroy(); break;
      case OP_ATTN_FORWARD: attn_forward(); break;
      case OP_ATTN_BACKWARD: attn_backward(); break;
      case OP_ATTN_BACKWARD_DESTROY: attn_backward_destroy(); break;
      case OP_ATTN_CALLER: attn_caller(); break;
      case OP_ATTN_STATE: attn_state_op(); break;
      case OP_ROPE: rope_op(); break;
      case OP_ADD: add_op(); break;
      case OP_COLUMNS: columns_op(); break;
      case OP_EMBEDDING: embedding_op(); break;
      case OP_CROSS_ENTROPY: cross_entropy_op(); break;
      case OP_ADAMW: adamw_op(); break;
      case OP_CHECKPOINT: checkpoint_op(); break;
      default: break;
    }
  }

  // Everything still alive, in the order the header asks for.
  void teardown() {
    for (auto &b : bwd_)
      if (b.live) {
        te_linear_backward_ctx_destroy(b.h);
        b.live = false;
      }
    for (auto &r : res_)
      if (r.filled) {
        te_linear_residuals_release(&r.r);  // stale copies too: a no-op for them
        r.filled = false;
      }
    for (int i = 0; i < kCtxSlots; ++i) moe_drop_context(i);
    for (int i = 0; i < kCtxSlots; ++i) ln_drop_context(i);
    for (int i = 0; i < kCtxSlots; ++i) attn_drop_context(i);
    for (auto &l : lin_)
      if (l.live) {
        te_linear_destroy(l.h);
        l.live = false;
      }
    while (!blocks_.empty()) free_block(blocks_.size() - 1);
    for (int i = 0; i < kCtxSlots; ++i)
      if (ctx_[i].live) {
        te_context_destroy(ctx_[i].h);
        ctx_[i].live = false;
      }
    for (int i = 0; i < kRecipeSlots; ++i)
      while (rec_[i].refs) release_recipe(i);
    for (auto &g : grp_)
      if (g.live) {
        te_group_destroy(g.h);
        g.live = false;
      }
    for (auto &c : cr_) cr_clear(c);  // the layers (and their records) went first
    for (auto &c : ck_)
      if (c.live) {
        te_checkpoint_destroy(c.h);
        c.live = false;
      }
    all_bufs_.clear();
  }
};

}  // namespace fuzz

// The operations, by concern.
#include "api_arguments.h"
#include "api_handles.h"
#include "api_linear.h"
#include "api_state.h"
#include "api_primitives.h"
#include "api_norm.h"
#include "api_grouped.h"
#include "api_layernorm.h"
#include "api_caller.h"
#include "api_attention.h"
#include "api_training.h"
#include "api_misc.h"
