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

#include <algorithm>
#include <climits>
#include <cmath>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "fuzz_common.h"

namespace fuzz {

enum Op : uint8_t {
  OP_NOP = 0,
  OP_CTX_CREATE,
  OP_CTX_DESTROY,
  OP_RECIPE_CREATE,
  OP_RECIPE_RETAIN,
  OP_RECIPE_RELEASE,
  OP_RECIPE_QUERY,
  OP_GROUP_CREATE,
  OP_GROUP_DESTROY,
  OP_GROUP_QUERY,
  OP_AUTOCAST_BEGIN,
  OP_AUTOCAST_END,
  OP_AUTOCAST_QUERY,
  OP_LINEAR_CREATE,
  OP_LINEAR_DESTROY,
  OP_FORWARD_COMPUTE,
  OP_FORWARD_SAVE,
  OP_FORWARD,
  OP_BACKWARD,
  OP_BACKWARD_DESTROY,
  OP_RESIDUALS_RELEASE,
  OP_RESIDUALS_COPY,
  OP_STATE,
  OP_SCALING_STATE,
  OP_QUANTIZE,
  OP_DEQUANTIZE,
  OP_CAST_TRANSPOSE,
  OP_AMAX,
  OP_GEMM,
  OP_ACTIVATION_FORWARD,
  OP_ACTIVATION_BACKWARD,
  OP_MALLOC,
  OP_FREE,
  OP_COPY,
  OP_TENSOR_QUERY,
  OP_CONTEXT_MISC,
  OP_WRONG_HANDLE,
  OP_TRAIN_STEP,
  OP_COUNT
};

inline const char *op_name(uint8_t op) {
  static const char *const kNames[OP_COUNT] = {
      "nop", "ctx_create", "ctx_destroy", "recipe_create", "recipe_retain", "recipe_release", "recipe_query",
      "group_create", "group_destroy", "group_query", "autocast_begin", "autocast_end", "autocast_query",
      "linear_create", "linear_destroy", "forward_compute", "forward_save", "forward", "backward", "backward_destroy",
      "residuals_release", "residuals_copy", "state", "scaling_state", "quantize", "dequantize", "cast_transpose",
      "amax", "gemm", "activation_forward", "activation_backward", "malloc", "free", "copy", "tensor_query",
      "context_misc", "wrong_handle", "train_step"};
  return op < OP_COUNT ? kNames[op] : "?";
}

constexpr int kCtxSlots = 2, kRecipeSlots = 6, kGroupSlots = 3, kLinearSlots = 4, kResSlots = 4, kBwdSlots = 6;
constexpr int64_t kMaxTokens = 64;
constexpr int64_t kMaxElems = 16384;  // cap on fuzzed tensors: runs stay fast
constexpr size_t kMaxOps = 192;

template <class T>
T *sentinel() {
  return reinterpret_cast<T *>(static_cast<uintptr_t>(0xFEEDFACECAFEBEE0ull));
}

// ---- shapes and tensors --------------------------------------------------------------------

struct Shape {
  int ndim = 2;
  int64_t d[TE_MAX_DIMS] = {16, 16};
  bool good() const {
    if (ndim < 1 || ndim > TE_MAX_DIMS) return false;
    __int128 n = 1;
    for (int i = 0; i < ndim; ++i) {
      if (d[i] < 1) return false;
      n *= d[i];
      if (n > INT64_MAX) return false;
    }
    return true;
  }
  int64_t numel() const {  // good() shapes only
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= d[i];
    return n;
  }
  int64_t cols() const { return d[ndim - 1]; }
  int64_t rows() const { return numel() / cols(); }
  bool same(const Shape &o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (d[i] != o.d[i]) return false;
    return true;
  }
};

inline Shape shape2(int64_t a, int64_t b) {
  Shape s;
  s.ndim = 2;
  s.d[0] = a;
  s.d[1] = b;
  return s;
}
inline Shape shape1(int64_t a) {
  Shape s;
  s.ndim = 1;
  s.d[0] = a;
  return s;
}

inline int64_t blocks128(int64_t n) { return n / 128 + (n % 128 != 0); }
// What the header says t->scale_inv must hold.
inline int64_t scale_count(int scaling, const Shape &s) {
  if (scaling == TE_SCALING_BLOCK_1X128) return s.rows() * blocks128(s.cols());
  if (scaling == TE_SCALING_BLOCK_128X128) return blocks128(s.rows()) * blocks128(s.cols());
  return 1;
}

// Dimensions whose product exceeds INT64_MAX (some wrap to a small positive number in int64
// arithmetic: {2^62 + 1, 4} wraps to 4). No such tensor exists, so every call must reject them.
struct OverflowShape {
  int ndim;
  int64_t d[TE_MAX_DIMS];
};
static const OverflowShape kOverflowShapes[] = {
    {2, {INT64_MAX, 2}},
    {2, {int64_t{1} << 32, int64_t{1} << 32}},
    {2, {0x4000000000000001ll, 4}},
    {2, {3, 0x5555555555555556ll}},
    {3, {int64_t{1} << 62, 2, 2}},
    {2, {3037000500ll, 3037000500ll}},
    {3, {int64_t{1} << 31, int64_t{1} << 31, 4}},
    {2, {0x2000000000000001ll, 8}},
    {3, {INT64_MAX, INT64_MAX, INT64_MAX}},
    {3, {int64_t{1} << 21, int64_t{1} << 21, int64_t{1} << 22}},
    {8, {256, 256, 256, 256, 256, 256, 256, 256}},
    {2, {0x0800000000000001ll, 16}},
};
constexpr int kNumOverflowShapes = sizeof(kOverflowShapes) / sizeof(kOverflowShapes[0]);

struct Tensor {
  te_tensor t{};
  Shape shape;  // as allocated
  Blob data, scale;
  bool malformed = false;  // a call given this tensor must fail
  std::vector<uint8_t> snap_data, snap_scale;

  void snapshot() {
    snap_data = data.snapshot();
    snap_scale = scale.snapshot();
  }
  void check_untouched(const char *fn, const char *name) const {
    FUZZ_ASSERT(data.equals(snap_data), "%s failed but wrote into '%s' (data)", fn, name);
    FUZZ_ASSERT(scale.equals(snap_scale), "%s failed but wrote into '%s' (scale_inv)", fn, name);
  }
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

  Reader &R;
  uint32_t serial_ = 0;
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

  // ---- helpers ----

  static std::vector<uint8_t> bytes_of(const void *p, size_t n) {
    const uint8_t *b = static_cast<const uint8_t *>(p);
    return std::vector<uint8_t>(b, b + n);
  }
  static bool same_bytes(const void *p, const std::vector<uint8_t> &s) {
    return std::memcmp(p, s.data(), s.size()) == 0;
  }

  // Any live handle, cast to another type by the caller: a wrong-type handle.
  void *some_live_handle(int avoid_kind) {
    std::vector<void *> c;
    if (avoid_kind != 0)
      for (auto &s : ctx_)
        if (s.live) c.push_back(s.h);
    if (avoid_kind != 1)
      for (auto &s : rec_)
        if (s.refs) c.push_back(s.h);
    if (avoid_kind != 2)
      for (auto &s : grp_)
        if (s.live) c.push_back(s.h);
    if (avoid_kind != 3)
      for (auto &s : lin_)
        if (s.live) c.push_back(s.h);
    if (avoid_kind != 4)
      for (auto &s : bwd_)
        if (s.live) c.push_back(s.h);
    if (c.empty()) return nullptr;
    return c[R.pick(static_cast<uint32_t>(c.size()))];
  }

  // A context argument: usually a live slot; sometimes NULL, stale or of another type (then
  // the call must fail). `slot` is the slot used (-1 for none).
  te_context *ctx_arg(bool &mf, int &slot, int preferred = -1) {
    uint8_t v = R.u8();
    slot = -1;
    if (v < 240) {
      slot = preferred >= 0 && v < 200 ? preferred : v % kCtxSlots;
      if (ctx_[slot].live) return ctx_[slot].h;
      mf = true;
      return ctx_[slot].h;  // stale or NULL
    }
    mf = true;
    if (v < 246) return nullptr;
    if (v < 251 && !dead_ctx_.empty()) return dead_ctx_[R.pick(static_cast<uint32_t>(dead_ctx_.size()))];
    return static_cast<te_context *>(some_live_handle(0));
  }
  int live_ctx_slot() const {
    for (int i = 0; i < kCtxSlots; ++i)
      if (ctx_[i].live) return i;
    return -1;
  }

  // ---- tensors ----

  Shape gen_shape(int64_t cap = kMaxElems) {
    static const int64_t kDims[16] = {16, 32, 1, 3, 128, 17, 64, 130, 2, 48, 256, 5, 8, 96, 127, 129};
    static const int kNd[4] = {2, 1, 3, 4};
    Shape s;
    s.ndim = kNd[R.pick(4)];
    for (int i = 0; i < s.ndim; ++i) s.d[i] = kDims[R.pick(16)];
    for (int i = 0; i < s.ndim && s.numel() > cap; ++i) s.d[i] = 1;
    while (s.numel() > cap) s.d[s.ndim - 1] = 16;
    return s;
  }

  void fill_values(Tensor &x, int mode, uint32_t seed) {
    Rng rng(seed + 977u * serial_);
    const int dtype = get_enum(x.t.dtype);
    const size_t n = x.data.size();
    if (is_fp8(dtype) || mode == 7) {
      for (size_t i = 0; i < n; ++i) x.data.data()[i] = static_cast<uint8_t>(rng.next());
    } else {
      const int64_t count = static_cast<int64_t>(n / dtype_bytes(dtype));
      for (int64_t i = 0; i < count; ++i) {
        float v;
        switch (mode) {
          case 1: v = rng.uniform(-448.0f, 448.0f); break;
          case 2: v = rng.uniform(-1e-30f, 1e-30f); break;
          case 3: v = 0.0f; break;
          case 4: v = (rng.next() % 17 == 0) ? NAN : rng.uniform(-2, 2); break;
          case 5: v = (rng.next() % 13 == 0) ? -INFINITY : rng.uniform(-2, 2); break;
          case 6: v = rng.uniform(-3e4f, 3e4f); break;
          default: v = rng.uniform(-2.0f, 2.0f); break;
        }
        store_hp(x.data.data(), dtype, i, v);
      }
    }
    const size_t ns = x.scale.size() / sizeof(float);
    for (size_t i = 0; i < ns; ++i) {
      float v = rng.uniform(1e-3f, 4.0f);
      if (mode == 4 && i == 0) v = NAN;
      if (mode == 5 && i == 0) v = INFINITY;
      if (mode == 3) v = 0.0f;
      std::memcpy(x.scale.data() + 4 * i, &v, 4);
    }
  }

  // A well-formed tensor of `shape` and `dtype` on the CPU, filled from the input.
  void make(Tensor &x, int dtype, const Shape &shape, int scaling = TE_SCALING_PER_TENSOR) {
    x.shape = shape;
    x.malformed = false;
    std::memset(&x.t, 0, sizeof x.t);
    set_enum(x.t.dtype, dtype);
    x.t.ndim = shape.ndim;
    for (int i = 0; i < shape.ndim; ++i) x.t.shape[i] = shape.d[i];
    x.t.device.type = TE_DEVICE_CPU;
    x.t.device.index = 0;
    const int64_t n = shape.good() ? shape.numel() : 1;
    x.data = Blob(static_cast<size_t>(n) * dtype_bytes(dtype));
    x.t.data = x.data.data();
    if (is_fp8(dtype)) {
      set_enum(x.t.scaling, scaling);
      const bool known = scaling >= 0 && scaling <= 2;
      x.scale = Blob(sizeof(float) * static_cast<size_t>(known && shape.good() ? scale_count(scaling, shape) : 1));
      x.t.scale_inv = x.scale.floats();
    } else {
      x.scale = Blob();
    }
    fill_values(x, static_cast<int>(R.pick(8)), R.u8());
  }

  // Sometimes breaks the tensor in a way the header says every call must reject.
  void maybe_malform(Tensor &x) {
    uint8_t m = R.u8();
    if (m < 230) return;
    te_tensor &t = x.t;
    const int dtype = get_enum(t.dtype);
    const int i = t.ndim >= 1 && t.ndim <= TE_MAX_DIMS ? static_cast<int>(R.pick(static_cast<uint32_t>(t.ndim))) : 0;
    switch (m - 230) {
      case 0: t.data = nullptr; x.malformed = true; break;
      case 1: t.ndim = 0; x.malformed = true; break;
      case 2: t.ndim = TE_MAX_DIMS + 1; x.malformed = true; break;
      case 3: t.ndim = -1; x.malformed = true; break;
      case 4: t.shape[i] = 0; x.malformed = true; break;
      case 5: t.shape[i] = -1 - R.u8(); x.malformed = true; break;
      case 6: t.shape[i] = INT64_MIN; x.malformed = true; break;
      case 7: case 8: case 9: case 10: case 11: {
        const OverflowShape &o = kOverflowShapes[R.pick(kNumOverflowShapes)];
        t.ndim = o.ndim;
        for (int k = 0; k < o.ndim; ++k) t.shape[k] = o.d[k];
        x.malformed = true;
        break;
      }
      case 12: set_enum(t.dtype, 5); x.malformed = true; break;
      case 13: set_enum(t.dtype, -1); x.malformed = true; break;
      case 14: set_enum(t.dtype, INT_MAX); x.malformed = true; break;
      case 15: if (is_fp8(dtype)) { t.scale_inv = nullptr; x.malformed = true; } break;
      case 16: if (is_fp8(dtype)) { set_enum(t.scaling, 3); x.malformed = true; } break;
      case 17: if (is_fp8(dtype)) { set_enum(t.scaling, -1); x.malformed = true; } break;
      case 18: t.device.type = TE_DEVICE_CUDA; t.device.index = 0; x.malformed = true; break;
      case 19: set_enum(t.device.type, 2); x.malformed = true; break;
      case 20: t.device.index = -1; x.malformed = true; break;
      case 21: t.device.index = 1; x.malformed = true; break;  // CPU:1 is not the context's device
      case 22:  // the same elements with leading 1s: still well-formed
        if (t.ndim >= 1 && t.ndim < TE_MAX_DIMS && !x.malformed) {
          std::memmove(&t.shape[1], &t.shape[0], sizeof(int64_t) * static_cast<size_t>(t.ndim));
          t.shape[0] = 1;
          ++t.ndim;
        }
        break;
      default: break;
    }
  }

  Tensor *maybe_null(Tensor &x, bool &mf, bool optional = false) {
    if (R.u8() >= 250) {
      if (!optional) mf = true;
      return nullptr;
    }
    if (x.malformed) mf = true;
    return &x;
  }

  static te_tensor *tp(Tensor *x) { return x ? &x->t : nullptr; }

  int pick_dtype(int def, bool &odd) {
    uint8_t v = R.u8();
    if (v < 200) return def;
    odd = true;
    if (v < 250) return static_cast<int>(v % 5);
    return v < 253 ? 5 : -1;
  }
  int pick_scaling() {
    uint8_t v = R.u8();
    if (v < 160) return TE_SCALING_PER_TENSOR;
    if (v < 205) return TE_SCALING_BLOCK_1X128;
    if (v < 250) return TE_SCALING_BLOCK_128X128;
    return v < 253 ? 3 : -1;
  }

  // ---- contexts ----

  void create_context(int slot, int mode) {
    CtxSlot &c = ctx_[slot];
    if (c.live) destroy_context(slot);
    te_context_options o;
    std::memset(&o, 0xAB, sizeof o);
    bool mf = false;
    const te_context_options *po = &o;
    if (TE_CALL(te_context_options_init, &o) != TE_SUCCESS) violation("te_context_options_init failed");
    switch (mode) {
      case 0: po = nullptr; break;  // default device: CUDA where usable (handled below)
      case 2: o.struct_size = sizeof o - 1; mf = true; break;
      case 3: o.use_default_device = 0; o.device.type = TE_DEVICE_CUDA; o.device.index = 0; break;
      case 4: o.use_default_device = 0; set_enum(o.device.type, 7); mf = true; break;
      case 5: o.use_default_device = 0; o.device.index = -1; mf = true; break;
      case 6: o.use_default_device = 2; mf = true; break;
      case 7: o.use_default_device = 0; o.device.index = 3; mf = true; break;  // CPU 3
      default: o.use_default_device = 0; o.device.type = TE_DEVICE_CPU; o.device.index = 0; break;
    }
    te_context *h = sentinel<te_context>();
    te_status s = TE_CALL(te_context_create, &h, po);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_create accepted bad options (mode %d)", mode);
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(h == sentinel<te_context>(), "te_context_create failed but wrote *out");
      return;
    }
    te_device dev;
    std::memset(&dev, 0xCD, sizeof dev);
    FUZZ_ASSERT(TE_CALL(te_context_get_device, h, &dev) == TE_SUCCESS, "te_context_get_device failed");
    if (get_enum(dev.type) != TE_DEVICE_CPU) {  // a GPU context (GPU builds only): not fuzzed here
      te_context_destroy(h);
      return;
    }
    FUZZ_ASSERT(dev.index == 0, "a CPU context reports device index %d", dev.index);
    c.h = h;
    c.live = true;
    c.scopes.clear();
    c.closed = 0;
  }

  // Frees what the header says must go first: backward contexts, residuals, linears, blocks.
  void destroy_context(int slot) {
    CtxSlot &c = ctx_[slot];
    if (!c.live) return;
    for (auto &b : bwd_)
      if (b.live && b.ctx == slot) {
        te_linear_backward_ctx_destroy(b.h);
        b.live = false;
      }
    for (auto &r : res_)
      if (r.filled && r.ctx == slot) {
        te_linear_residuals_release(&r.r);
        live_res_.erase(r.id);
        r.filled = false;
      }
    for (auto &l : lin_)
      if (l.live && l.ctx == slot) {
        te_linear_destroy(l.h);
        l.live = false;
        dead_lin_.push_back(l.h);
      }
    for (size_t i = 0; i < blocks_.size();) {
      if (blocks_[i].ctx == slot) {
        FUZZ_ASSERT(TE_CALL(te_context_free, c.h, blocks_[i].p) == TE_SUCCESS, "te_context_free of a live block failed");
        freed_blocks_.push_back(reinterpret_cast<uintptr_t>(blocks_[i].p));
        blocks_.erase(blocks_.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
    for (auto &s : c.scopes) ended_tokens_.push_back(s.token);
    te_context_destroy(c.h);
    dead_ctx_.push_back(c.h);
    c.live = false;
    c.scopes.clear();
    // The bookkeeping of stale slots that name this context: their handles are dead anyway.
    for (auto &b : bwd_)
      if (b.ctx == slot) b.ctx = -1;
    for (auto &r : res_)
      if (r.ctx == slot) r.ctx = -1;
  }

  te_context *ctx_of(int slot) const { return slot >= 0 ? ctx_[slot].h : nullptr; }
  bool ctx_live(int slot) const { return slot >= 0 && ctx_[slot].live; }

  // ---- recipes ----

  te_recipe *recipe_arg(bool &mf, bool allow_null = true) {
    uint8_t v = R.u8();
    if (v < 200) {
      const RecipeSlot &r = rec_[v % kRecipeSlots];
      if (r.refs) return r.h;
      if (!allow_null) mf = true;
      return nullptr;
    }
    if (v < 230 && !dead_rec_.empty()) return dead_rec_[R.pick(static_cast<uint32_t>(dead_rec_.size()))];  // may live on in a scope
    if (v < 245) {
      if (!allow_null) mf = true;
      return nullptr;
    }
    void *h = some_live_handle(1);
    if (h || !allow_null) mf = true;
    return static_cast<te_recipe *>(h);
  }

  void recipe_create() {
    const int slot = static_cast<int>(R.pick(kRecipeSlots));
    RecipeSlot &rs = rec_[slot];
    while (rs.refs) release_recipe(slot);
    static const int kKinds[5] = {TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING, TE_RECIPE_BLOCK_SCALING, 3, -1};
    const int kind = kKinds[R.pick(5)];
    te_recipe_options o;
    std::memset(&o, 0x5A, sizeof o);
    const std::vector<uint8_t> before = bytes_of(&o, sizeof o);
    te_recipe_kind k;
    set_enum(k, kind);
    te_status s = TE_CALL(te_recipe_options_init, &o, k);
    bool mf = false;
    if (kind < 0 || kind > 2) {
      FUZZ_ASSERT(s != TE_SUCCESS, "te_recipe_options_init accepted kind %d", kind);
      FUZZ_ASSERT(same_bytes(&o, before), "te_recipe_options_init failed but wrote *opts");
      te_recipe_options_init(&o, TE_RECIPE_DELAYED_SCALING);
    } else {
      FUZZ_ASSERT(s == TE_SUCCESS, "te_recipe_options_init failed for kind %d", kind);
      FUZZ_ASSERT(get_enum(o.kind) == kind && o.struct_size == sizeof o, "te_recipe_options_init: wrong kind/struct_size");
    }
    const int nmods = static_cast<int>(R.pick(4));
    for (int m = 0; m < nmods; ++m) {
      const uint32_t field = R.pick(12);
      const uint32_t v = R.pick(8);
      switch (field) {
        case 0: {
          static const int f[4] = {TE_FORMAT_HYBRID, TE_FORMAT_E4M3, 2, -1};
          set_enum(o.format, f[v % 4]);
          break;
        }
        case 1: {
          static const int32_t f[6] = {0, 1, 127, 128, -1, INT32_MAX};
          o.margin = f[v % 6];
          break;
        }
        case 2: {
          static const int32_t f[8] = {1, 2, 16, 65536, 65537, 0, -1, 1024};
          o.amax_history_len = f[v];
          break;
        }
        case 3: {
          static const int f[4] = {TE_AMAX_MAX, TE_AMAX_MOST_RECENT, 2, -1};
          set_enum(o.amax_algo, f[v % 4]);
          break;
        }
        case 4: o.reduce_amax = static_cast<int32_t>(v % 3); break;
        case 5: o.power_of_2_scales = static_cast<int32_t>(v % 3); break;
        case 6: {
          static const float f[8] = {0.0f, 1e-6f, -1.0f, INFINITY, NAN, -0.0f, 1e30f, 1e-45f};
          o.amax_epsilon = f[v];
          break;
        }
        case 7: o.fprop_split_accumulator = static_cast<int32_t>(v % 3); break;
        case 8: o.dgrad_split_accumulator = static_cast<int32_t>(v % 3); break;
        case 9: o.wgrad_split_accumulator = static_cast<int32_t>(v % 3); break;
        case 10: o.struct_size = v % 2 ? sizeof o - 4 : 0; break;
        default: {
          static const int f[4] = {TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING, 3, -1};
          set_enum(o.kind, f[v % 4]);
          break;
        }
      }
    }
    // What the header rejects, from the final values: enums and booleans out of range, a small
    // struct_size, and the ranges it gives for the fields the kind uses.
    auto is_bool = [](int32_t b) { return b == 0 || b == 1; };
    const int fk = get_enum(o.kind), ff = get_enum(o.format), fa = get_enum(o.amax_algo);
    if (o.struct_size < sizeof o || fk < 0 || fk > 2 || (ff != TE_FORMAT_HYBRID && ff != TE_FORMAT_E4M3) ||
        (fa != TE_AMAX_MAX && fa != TE_AMAX_MOST_RECENT) || !is_bool(o.reduce_amax) || !is_bool(o.power_of_2_scales) ||
        !is_bool(o.fprop_split_accumulator) || !is_bool(o.dgrad_split_accumulator) || !is_bool(o.wgrad_split_accumulator))
      mf = true;
    if (fk == TE_RECIPE_DELAYED_SCALING &&
        (o.margin < 0 || o.margin > 127 || o.amax_history_len < 1 || o.amax_history_len > 65536))
      mf = true;
    if ((fk == TE_RECIPE_CURRENT_SCALING || fk == TE_RECIPE_BLOCK_SCALING) &&
        !(o.amax_epsilon >= 0.0f && o.amax_epsilon < INFINITY))
      mf = true;
    const bool null_opts = R.u8() >= 245;
    const bool null_out = R.u8() >= 250;
    if (null_opts) mf = false;  // NULL options: the default delayed recipe
    if (null_out) mf = true;
    te_recipe *h = sentinel<te_recipe>();
    s = TE_CALL(te_recipe_create, null_out ? nullptr : &h, null_opts ? nullptr : &o);
    if (mf)
      FUZZ_ASSERT(s != TE_SUCCESS,
                  "te_recipe_create accepted invalid options: struct_size %zu kind %d format %d margin %d history %d "
                  "algo %d reduce %d pow2 %d epsilon %g splits %d %d %d",
                  o.struct_size, get_enum(o.kind), get_enum(o.format), o.margin, o.amax_history_len,
                  get_enum(o.amax_algo), o.reduce_amax, o.power_of_2_scales, static_cast<double>(o.amax_epsilon),
                  o.fprop_split_accumulator, o.dgrad_split_accumulator, o.wgrad_split_accumulator);
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(h == sentinel<te_recipe>(), "te_recipe_create failed but wrote *out");
      return;
    }
    rs.h = h;
    rs.refs = 1;
    FUZZ_ASSERT(te_recipe_key(h) != 0, "te_recipe_key of a live recipe is 0");
    FUZZ_ASSERT(te_recipe_describe(h) && te_recipe_describe(h)[0], "te_recipe_describe of a live recipe is empty");
    te_recipe_options got;
    std::memset(&got, 0, sizeof got);
    got.struct_size = sizeof got;
    FUZZ_ASSERT(TE_CALL(te_recipe_get_options, h, &got) == TE_SUCCESS, "te_recipe_get_options failed");
    if (!null_opts)
      FUZZ_ASSERT(get_enum(got.kind) == get_enum(o.kind) && get_enum(got.format) == get_enum(o.format),
                  "te_recipe_get_options: kind/format differ from the options given");
    check_recipe_keys();
  }

  static bool same_options(const te_recipe_options &a, const te_recipe_options &b) {
    return get_enum(a.kind) == get_enum(b.kind) && get_enum(a.format) == get_enum(b.format) && a.margin == b.margin &&
           a.amax_history_len == b.amax_history_len && get_enum(a.amax_algo) == get_enum(b.amax_algo) &&
           a.reduce_amax == b.reduce_amax && a.power_of_2_scales == b.power_of_2_scales &&
           std::memcmp(&a.amax_epsilon, &b.amax_epsilon, sizeof(float)) == 0 &&
           a.fprop_split_accumulator == b.fprop_split_accumulator &&
           a.dgrad_split_accumulator == b.dgrad_split_accumulator &&
           a.wgrad_split_accumulator == b.wgrad_split_accumulator;
  }

  // Equal options give equal keys; equal keys mean at least the same kind and format.
  void check_recipe_keys() {
    for (int i = 0; i < kRecipeSlots; ++i) {
      if (!rec_[i].refs) continue;
      for (int j = i + 1; j < kRecipeSlots; ++j) {
        if (!rec_[j].refs) continue;
        te_recipe_options a, b;
        std::memset(&a, 0, sizeof a);
        std::memset(&b, 0, sizeof b);
        a.struct_size = b.struct_size = sizeof a;
        if (te_recipe_get_options(rec_[i].h, &a) != TE_SUCCESS || te_recipe_get_options(rec_[j].h, &b) != TE_SUCCESS)
          violation("te_recipe_get_options failed on a live recipe");
        const uint64_t ka = te_recipe_key(rec_[i].h), kb = te_recipe_key(rec_[j].h);
        if (same_options(a, b)) FUZZ_ASSERT(ka == kb, "equal recipe options, different te_recipe_key");
        if (ka == kb)
          FUZZ_ASSERT(get_enum(a.kind) == get_enum(b.kind) && get_enum(a.format) == get_enum(b.format),
                      "te_recipe_key equal for recipes of different kind or format");
      }
    }
  }

  void release_recipe(int slot) {
    RecipeSlot &rs = rec_[slot];
    if (!rs.refs) return;
    te_recipe_release(rs.h);
    if (--rs.refs == 0) {
      dead_rec_.push_back(rs.h);
      rs.h = nullptr;
    }
  }

  void recipe_query() {
    uint8_t v = R.u8();
    te_recipe *h = nullptr;
    bool live = false;
    if (v < 200) {
      RecipeSlot &rs = rec_[v % kRecipeSlots];
      h = rs.h;
      live = rs.refs > 0;
    } else if (!dead_rec_.empty()) {
      h = dead_rec_[R.pick(static_cast<uint32_t>(dead_rec_.size()))];
    }
    const uint64_t key = te_recipe_key(h);
    const char *d = te_recipe_describe(h);
    FUZZ_ASSERT(d != nullptr, "te_recipe_describe returned NULL");
    if (!h) FUZZ_ASSERT(key == 0 && d[0] == 0, "te_recipe_key/describe of NULL: expected 0 and \"\"");
    te_recipe_options o;
    std::memset(&o, 0x77, sizeof o);
    const bool small = R.u8() >= 240;
    o.struct_size = small ? sizeof o - 8 : sizeof o;
    const std::vector<uint8_t> before = bytes_of(&o, sizeof o);
    te_status s = TE_CALL(te_recipe_get_options, h, &o);
    if (!h || small) FUZZ_ASSERT(s != TE_SUCCESS, "te_recipe_get_options accepted a NULL recipe or small struct");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(same_bytes(&o, before), "te_recipe_get_options failed but wrote *out");
      return;
    }
    if (!live) return;
    FUZZ_ASSERT(key != 0, "te_recipe_key of a live recipe is 0");
    // A recipe made from a recipe's own options has its key.
    te_recipe *twin = nullptr;
    FUZZ_ASSERT(TE_CALL(te_recipe_create, &twin, &o) == TE_SUCCESS, "te_recipe_create failed on te_recipe_get_options' output");
    FUZZ_ASSERT(te_recipe_key(twin) == key, "a recipe made from another's options has another te_recipe_key");
    FUZZ_ASSERT(std::strcmp(te_recipe_describe(twin), te_recipe_describe(h)) == 0,
                "a recipe made from another's options has another description");
    te_recipe_release(twin);
  }

  // ---- groups ----

  te_group *group_arg(bool &mf) {
    uint8_t v = R.u8();
    if (v < 150) return nullptr;
    if (v < 230) {
      GroupSlot &g = grp_[v % kGroupSlots];
      if (!g.live && g.h) mf = true;
      return g.h;
    }
    if (v < 245 && !dead_grp_.empty()) {
      mf = true;
      return dead_grp_[R.pick(static_cast<uint32_t>(dead_grp_.size()))];
    }
    void *h = some_live_handle(2);
    if (h) mf = true;
    return static_cast<te_group *>(h);
  }

  void group_create() {
    GroupSlot &g = grp_[R.pick(kGroupSlots)];
    if (g.live) {
      te_group_destroy(g.h);
      dead_grp_.push_back(g.h);
      g.live = false;
    }
    const bool null_out = R.u8() >= 250;
    te_group *h = sentinel<te_group>();
    te_status s = TE_CALL(te_group_create_single, null_out ? nullptr : &h);
    if (null_out) FUZZ_ASSERT(s != TE_SUCCESS, "te_group_create_single accepted NULL");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(h == sentinel<te_group>(), "te_group_create_single failed but wrote *out");
      return;
    }
    const uint64_t id = te_group_id(h);
    FUZZ_ASSERT(id != 0, "te_group_id of a live group is 0");
    for (uint64_t old : group_ids_) FUZZ_ASSERT(old != id, "te_group_id reused");
    group_ids_.push_back(id);
    FUZZ_ASSERT(te_group_rank(h) == 0 && te_group_size(h) == 1, "a single-rank group has rank %d size %d",
                te_group_rank(h), te_group_size(h));
    g.h = h;
    g.live = true;
  }

  // ---- autocast ----

  void check_autocast_state(int slot) {
    if (!ctx_live(slot)) return;
    te_autocast_state st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    FUZZ_ASSERT(TE_CALL(te_autocast_get_state, ctx_[slot].h, &st) == TE_SUCCESS, "te_autocast_get_state failed");
    const auto &sc = ctx_[slot].scopes;
    FUZZ_ASSERT(st.depth == static_cast<int32_t>(sc.size()), "autocast depth %d, expected %zu", st.depth, sc.size());
    if (sc.empty()) {
      FUZZ_ASSERT(st.enabled == 0 && st.calibrating == 0 && st.recipe == nullptr, "autocast state outside any scope");
    } else {
      FUZZ_ASSERT(st.enabled == sc.back().enabled && st.calibrating == sc.back().calibrating,
                  "innermost scope: enabled %d calibrating %d, expected %d %d", st.enabled, st.calibrating,
                  sc.back().enabled, sc.back().calibrating);
      FUZZ_ASSERT(st.recipe != nullptr && te_recipe_key(st.recipe) != 0, "innermost scope reports no live recipe");
      if (sc.back().recipe)
        FUZZ_ASSERT(st.recipe == sc.back().recipe, "te_autocast_get_state: the innermost scope's recipe is not the one it was given");
    }
  }

  void autocast_begin() {
    bool mf = false;
    int slot;
    te_context *ctx = ctx_arg(mf, slot);
    te_autocast_options o;
    std::memset(&o, 0x3C, sizeof o);
    FUZZ_ASSERT(TE_CALL(te_autocast_options_init, &o) == TE_SUCCESS, "te_autocast_options_init failed");
    FUZZ_ASSERT(o.enabled == 1 && o.calibrating == 0 && !o.recipe && !o.group, "te_autocast_options_init defaults");
    static const int32_t kEn[4] = {1, 0, 2, -1};
    static const int32_t kCal[4] = {0, 1, 3, -1};
    uint8_t e = R.u8();
    o.enabled = kEn[e < 200 ? 0 : e < 240 ? 1 : 2 + e % 2];
    uint8_t c = R.u8();
    o.calibrating = kCal[c < 220 ? 0 : c < 245 ? 1 : 2 + c % 2];
    mf |= (o.enabled != 0 && o.enabled != 1) || (o.calibrating != 0 && o.calibrating != 1);
    o.recipe = recipe_arg(mf);
    o.group = group_arg(mf);
    const uint8_t x = R.u8();
    if (x >= 250) { o.struct_size = sizeof o - 1; mf = true; }
    const bool null_opts = x >= 246 && x < 248, null_token = x >= 248 && x < 250;
    mf |= null_opts || null_token;
    if (ctx_live(slot) && ctx_[slot].scopes.size() >= TE_AUTOCAST_MAX_DEPTH) mf = true;
    te_autocast_token token = 0xDEADBEEFDEADBEEFull;
    if (tracing())
      std::fprintf(stderr, "  (enabled %d calibrating %d recipe %p group %p)\n", o.enabled, o.calibrating,
                   static_cast<const void *>(o.recipe), static_cast<const void *>(o.group));
    te_status s = TE_CALL(te_autocast_begin, ctx, null_opts ? nullptr : &o, null_token ? nullptr : &token);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_autocast_begin accepted what it must reject");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(token == 0xDEADBEEFDEADBEEFull, "te_autocast_begin failed but wrote *token");
      check_autocast_state(slot);
      return;
    }
    for (const Scope &sc : ctx_[slot].scopes) FUZZ_ASSERT(sc.token != token, "te_autocast_begin reissued an open token");
    ctx_[slot].scopes.push_back(Scope{token, o.enabled, o.calibrating, o.recipe});
    check_autocast_state(slot);
  }

  void autocast_end() {
    bool mf = false;
    int slot;
    te_context *ctx = ctx_arg(mf, slot);
    const std::vector<Scope> empty;
    const std::vector<Scope> &sc = ctx_live(slot) ? ctx_[slot].scopes : empty;
    const bool have_top = !sc.empty();
    te_autocast_token token = 0;
    const uint32_t how = R.pick(8);
    switch (how) {
      case 1:  // an open scope that is not the innermost
        if (sc.size() >= 2) token = sc[R.pick(static_cast<uint32_t>(sc.size() - 1))].token;
        break;
      case 2: {  // the other context's innermost
        const int other = slot < 0 ? 0 : 1 - slot;
        if (ctx_live(other) && !ctx_[other].scopes.empty()) token = ctx_[other].scopes.back().token;
        break;
      }
      case 3: token = R.u64(); break;
      case 4:
        if (!ended_tokens_.empty()) token = ended_tokens_[R.pick(static_cast<uint32_t>(ended_tokens_.size()))];
        break;
      case 5: token = 0; break;
      default:
        if (have_top) token = sc.back().token;
        break;
    }
    if (!have_top || token != sc.back().token) mf = true;
    te_status s = TE_CALL(te_autocast_end, ctx, token);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_autocast_end closed a scope its token does not name (how %u)", how);
    if (s == TE_SUCCESS) {
      ended_tokens_.push_back(token);
      if (ended_tokens_.size() > 64) ended_tokens_.erase(ended_tokens_.begin());
      ctx_[slot].scopes.pop_back();
      ++ctx_[slot].closed;
    }
    check_autocast_state(slot);
  }

  void autocast_query() {
    bool mf = false;
    int slot;
    te_context *ctx = ctx_arg(mf, slot);
    const uint32_t what = R.pick(4);
    if (what == 0) {
      te_autocast_state st;
      std::memset(&st, 0x11, sizeof st);
      const bool small = R.u8() >= 240;
      st.struct_size = small ? sizeof st - 4 : sizeof st;
      const std::vector<uint8_t> before = bytes_of(&st, sizeof st);
      te_status s = TE_CALL(te_autocast_get_state, ctx, &st);
      if (mf || small) FUZZ_ASSERT(s != TE_SUCCESS, "te_autocast_get_state accepted a bad ctx or struct_size");
      if (s != TE_SUCCESS) FUZZ_ASSERT(same_bytes(&st, before), "te_autocast_get_state failed but wrote *out");
      else check_autocast_state(slot);
    } else if (what == 1) {
      te_context_stats st;
      std::memset(&st, 0x22, sizeof st);
      const bool small = R.u8() >= 240;
      st.struct_size = small ? 0 : sizeof st;
      const std::vector<uint8_t> before = bytes_of(&st, sizeof st);
      te_status s = TE_CALL(te_context_get_stats, ctx, &st);
      if (mf || small) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_get_stats accepted a bad ctx or struct_size");
      if (s != TE_SUCCESS) FUZZ_ASSERT(same_bytes(&st, before), "te_context_get_stats failed but wrote *out");
      else
        FUZZ_ASSERT(st.scopes_closed == ctx_[slot].closed, "te_context_get_stats: scopes_closed %llu, expected %llu",
                    static_cast<unsigned long long>(st.scopes_closed), static_cast<unsigned long long>(ctx_[slot].closed));
    } else {
      te_status s = TE_CALL(te_autocast_flush_backward, ctx);
      if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_autocast_flush_backward accepted a bad ctx");
      check_autocast_state(slot);
    }
  }

  // ---- linears ----

  int64_t pick_features(bool &mf) {
    static const int64_t kFeat[8] = {16, 32, 48, 8, 64, 1, 24, 17};
    uint8_t v = R.u8();
    if (v < 240) return kFeat[v % 8];
    if (v < 244) { mf = true; return 0; }
    if (v < 248) { mf = true; return -16; }
    if (v < 252) return INT64_MAX;
    return int64_t{1} << 40;
  }

  void linear_create() {
    const int slot = static_cast<int>(R.pick(kLinearSlots));
    LinSlot &L = lin_[slot];
    if (L.live) {
      te_linear_destroy(L.h);  // backward contexts keep what they need
      dead_lin_.push_back(L.h);
      L.live = false;
    }
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    te_linear_options o;
    std::memset(&o, 0x6B, sizeof o);
    FUZZ_ASSERT(TE_CALL(te_linear_options_init, &o) == TE_SUCCESS, "te_linear_options_init failed");
    FUZZ_ASSERT(o.bias == 1 && get_enum(o.activation_dtype) == TE_DTYPE_BF16 && o.fuse_wgrad_accumulation == 0,
                "te_linear_options_init defaults");
    o.in_features = pick_features(mf);
    o.out_features = pick_features(mf);
    static const int32_t kB[3] = {1, 0, 2};
    uint8_t b = R.u8();
    o.bias = kB[b < 180 ? 0 : b < 250 ? 1 : 2];
    mf |= o.bias == 2;
    static const int kDt[5] = {TE_DTYPE_BF16, TE_DTYPE_F32, TE_DTYPE_F16, TE_DTYPE_E4M3, 9};
    uint8_t d = R.u8();
    const int dt = kDt[d < 150 ? 0 : d < 200 ? 1 : d < 245 ? 2 : 3 + d % 2];
    set_enum(o.activation_dtype, dt);
    mf |= dt > TE_DTYPE_BF16;
    uint8_t f = R.u8();
    o.fuse_wgrad_accumulation = f < 210 ? 0 : f < 250 ? 1 : 2;
    mf |= o.fuse_wgrad_accumulation == 2;
    const uint8_t x = R.u8();
    if (x >= 252) { o.struct_size = 8; mf = true; }
    const bool null_opts = x >= 248 && x < 250, null_out = x >= 250 && x < 252;
    mf |= null_opts || null_out;
    te_linear *h = sentinel<te_linear>();
    te_status s = TE_CALL(te_linear_create, null_out ? nullptr : &h, ctx, null_opts ? nullptr : &o);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_create accepted invalid arguments");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(h == sentinel<te_linear>(), "te_linear_create failed but wrote *out");
      return;
    }
    L.h = h;
    L.live = true;
    L.ctx = cs;
    L.cfg.in = o.in_features;
    L.cfg.out = o.out_features;
    L.cfg.bias = o.bias;
    L.cfg.dtype = dt;
    L.cfg.fuse = o.fuse_wgrad_accumulation;
    L.bufs = nullptr;
    if (L.cfg.small()) {
      all_bufs_.push_back(std::make_unique<LinBufs>());
      LinBufs &B = *all_bufs_.back();
      const size_t e = dtype_bytes(dt);
      const size_t in = static_cast<size_t>(L.cfg.in), out = static_cast<size_t>(L.cfg.out);
      B.x = Blob(kMaxTokens * in * e);
      B.w = Blob(out * in * e);
      B.b = Blob(out * e);
      B.main_grad = Blob(out * in * 4);
      Rng rng(R.u8() + 31u * serial_);
      for (size_t i = 0; i < kMaxTokens * in; ++i) store_hp(B.x.data(), dt, static_cast<int64_t>(i), rng.uniform(-2, 2));
      for (size_t i = 0; i < out * in; ++i) store_hp(B.w.data(), dt, static_cast<int64_t>(i), rng.uniform(-0.5f, 0.5f));
      for (size_t i = 0; i < out; ++i) store_hp(B.b.data(), dt, static_cast<int64_t>(i), rng.uniform(-0.5f, 0.5f));
      L.bufs = &B;
    }
  }

  void linear_destroy() {
    LinSlot &L = lin_[R.pick(kLinearSlots)];
    if (L.live) {
      te_linear_destroy(L.h);
      dead_lin_.push_back(L.h);
      L.live = false;
    } else if (L.h) {
      te_linear_destroy(L.h);  // destroyed before: a no-op
    }
  }

  // A linear argument: the slot's handle (live or stale), sometimes NULL or another type.
  te_linear *lin_arg(bool &mf, int &slot) {
    uint8_t v = R.u8();
    slot = -1;
    if (v < 245) {
      slot = v % kLinearSlots;
      if (!lin_[slot].live) mf = true;
      return lin_[slot].h;
    }
    mf = true;
    if (v < 250) return nullptr;
    if (!dead_lin_.empty() && v < 253) return dead_lin_[R.pick(static_cast<uint32_t>(dead_lin_.size()))];
    return static_cast<te_linear *>(some_live_handle(3));
  }

  // The layer's saved state, or empty when it cannot be read (dead layer or context).
  std::vector<uint8_t> layer_state(te_context *ctx, te_linear *lin) {
    size_t n = 0;
    if (te_linear_state_save(ctx, lin, nullptr, 0, &n) != TE_SUCCESS || n == 0 || n > (1u << 22)) return {};
    std::vector<uint8_t> buf(n);
    size_t n2 = 0;
    if (te_linear_state_save(ctx, lin, buf.data(), n, &n2) != TE_SUCCESS) violation("te_linear_state_save failed after a size query");
    FUZZ_ASSERT(n2 == n, "te_linear_state_save: size %zu after a query of %zu", n2, n);
    return buf;
  }

  // Whether a forward on context `cs` computes in FP8: 1 yes, 0 no (outside an enabled scope),
  // -1 either (enabled and calibrating: the header does not say which wins; TE computes in FP8).
  int fp8_scope(int cs) const {
    if (!ctx_live(cs) || ctx_[cs].scopes.empty()) return 0;
    const Scope &s = ctx_[cs].scopes.back();
    if (s.enabled != 1) return 0;
    return s.calibrating == 0 ? 1 : -1;
  }

  // Forward arguments for linear slot `ls` (or a 16x16 default when it names none): x, W, b, y
  // into the given tensors; mf when the call must fail.
  void forward_tensors(int ls, const LinCfg &cfg, LinBufs *bufs, int64_t &tokens, Tensor &x, Tensor &w, Tensor &b,
                       Tensor &y, bool &mf) {
    static const int64_t kTok[8] = {16, 32, 48, 1, 5, 64, 8, 17};
    tokens = kTok[R.pick(8)];
    const bool small = cfg.small() && bufs;
    const int64_t in = small ? cfg.in : 16, out = small ? cfg.out : 16;
    if (!small) mf = true;  // x and W cannot match the layer
    const int dt = cfg.dtype >= TE_DTYPE_F32 && cfg.dtype <= TE_DTYPE_BF16 ? cfg.dtype : TE_DTYPE_BF16;
    const bool three_d = tokens % 2 == 0 && R.u8() >= 230;
    Shape xs = three_d ? Shape{} : shape2(tokens, in), ys = three_d ? Shape{} : shape2(tokens, out);
    if (three_d) {
      xs.ndim = ys.ndim = 3;
      xs.d[0] = ys.d[0] = 2;
      xs.d[1] = ys.d[1] = tokens / 2;
      xs.d[2] = in;
      ys.d[2] = out;
    }
    bool odd = false;
    make(x, dt, xs);
    make(w, dt, shape2(out, in));
    make(b, dt, shape1(out));
    make(y, pick_dtype(dt, odd), ys);
    if (get_enum(y.t.dtype) != dt) mf = true;
    if (small) {  // x and W are the layer's parameters, which must outlive the residuals
      x.t.data = bufs->x.data();
      w.t.data = bufs->w.data();
      b.t.data = bufs->b.data();
    }
    const uint8_t p = R.u8();
    if (p >= 245 && in != out) {  // W transposed
      w.t.shape[0] = in;
      w.t.shape[1] = out;
      mf = true;
    } else if (p >= 240 && p < 245) {  // x's last dimension is not in_features
      x.t.shape[x.t.ndim - 1] = in + 1;
      mf = true;
    }
    maybe_malform(x);
    maybe_malform(w);
    maybe_malform(b);
    maybe_malform(y);
    (void)ls;
  }

  // Checks a successful forward_compute's residuals, reading every byte of the library's
  // storage they point to (ASan checks the sizes).
  void check_residuals(const te_linear_residuals &r, const LinCfg &cfg, int64_t tokens, int expect_fp8) {
    FUZZ_ASSERT(r.fp8 == 0 || r.fp8 == 1, "forward_compute: residuals.fp8 = %d", r.fp8);
    if (expect_fp8 >= 0)
      FUZZ_ASSERT(r.fp8 == expect_fp8, "forward_compute: residuals.fp8 = %d, expected %d", r.fp8, expect_fp8);
    FUZZ_ASSERT(r.internal != nullptr, "forward_compute succeeded without filling residuals->internal");
    if (!r.fp8) return;
    const te_tensor *ts[2] = {&r.input_t, &r.weight_t};
    const int64_t want[2][2] = {{cfg.in, tokens}, {cfg.in, cfg.out}};
    volatile uint8_t sink = 0;
    for (int k = 0; k < 2; ++k) {
      const te_tensor &t = *ts[k];
      FUZZ_ASSERT(t.ndim == 2 && t.shape[0] == want[k][0] && t.shape[1] == want[k][1],
                  "FP8 residual %d: shape [%lld, %lld], expected [%lld, %lld]", k, (long long)t.shape[0],
                  (long long)t.shape[1], (long long)want[k][0], (long long)want[k][1]);
      FUZZ_ASSERT(is_fp8(get_enum(t.dtype)) && t.data && t.scale_inv, "FP8 residual %d: not an FP8 tensor", k);
      const int sc = get_enum(t.scaling);
      FUZZ_ASSERT(sc >= 0 && sc <= 2, "FP8 residual %d: scaling %d", k, sc);
      const uint8_t *d = static_cast<const uint8_t *>(t.data);
      for (int64_t i = 0; i < t.shape[0] * t.shape[1]; ++i) sink = static_cast<uint8_t>(sink ^ d[i]);
      const int64_t ns = scale_count(sc, shape2(t.shape[0], t.shape[1]));
      for (int64_t i = 0; i < ns; ++i) {
        float f;
        std::memcpy(&f, t.scale_inv + i, sizeof f);
        sink = static_cast<uint8_t>(sink ^ static_cast<uint8_t>(f != f));
      }
    }
    (void)sink;
  }

  void clear_res_slot(int rs) {
    ResSlot &S = res_[rs];
    if (S.filled) {
      te_linear_residuals_release(&S.r);
      live_res_.erase(S.id);
      S.filled = false;
    }
  }

  void forward_compute() {
    const int rs = static_cast<int>(R.pick(kResSlots));  // first: seeds name it
    bool mf = false;
    int ls;
    te_linear *lh = lin_arg(mf, ls);
    LinCfg cfg;
    LinBufs *bufs = nullptr;
    int lctx = 0;
    if (ls >= 0 && lin_[ls].h) {
      cfg = lin_[ls].cfg;
      bufs = lin_[ls].bufs;
      lctx = lin_[ls].ctx;
    }
    int cs;
    te_context *ctx = ctx_arg(mf, cs, lctx);
    if (cs != lctx) mf = true;
    Tensor x, w, b, y;
    int64_t tokens;
    forward_tensors(ls, cfg, bufs, tokens, x, w, b, y, mf);
    te_linear_forward_args a;
    std::memset(&a, 0x44, sizeof a);
    FUZZ_ASSERT(TE_CALL(te_linear_forward_args_init, &a) == TE_SUCCESS, "te_linear_forward_args_init failed");
    FUZZ_ASSERT(!a.input && !a.weight && !a.bias && a.weight_unchanged == 0, "te_linear_forward_args_init defaults");
    a.input = tp(maybe_null(x, mf));
    a.weight = tp(maybe_null(w, mf));
    const uint8_t bb = R.u8();
    const bool flip_bias = bb >= 245;
    const bool give_bias = (cfg.bias == 1) != flip_bias;
    if (flip_bias) mf = true;
    a.bias = give_bias ? &b.t : nullptr;
    if (give_bias && b.malformed) mf = true;
    const uint8_t wu = R.u8();
    a.weight_unchanged = wu < 200 ? 0 : wu < 250 ? 1 : 2;
    mf |= a.weight_unchanged == 2;
    const uint8_t z = R.u8();
    if (z >= 252) { a.struct_size = sizeof a - 1; mf = true; }
    Tensor *py = maybe_null(y, mf);
    clear_res_slot(rs);
    ResSlot &S = res_[rs];
    std::memset(&S.r, 0x99, sizeof S.r);
    S.r.struct_size = sizeof S.r;
    const uint8_t q = R.u8();
    if (q >= 250) { S.r.struct_size = sizeof S.r - 8; mf = true; }
    const bool null_res = q >= 246 && q < 250;
    const bool null_args = q >= 244 && q < 246;
    mf |= null_res || null_args;
    const std::vector<uint8_t> rbefore = bytes_of(&S.r, sizeof S.r);
    y.snapshot();
    const bool check_state = ls >= 0 && lin_[ls].live && ctx_live(lctx);
    const std::vector<uint8_t> st_before = check_state ? layer_state(ctx_of(lctx), lh) : std::vector<uint8_t>();
    const int expect_fp8 = fp8_scope(cs);
    te_status s = TE_CALL(te_linear_forward_compute, ctx, lh, null_args ? nullptr : &a, py ? &py->t : nullptr,
                          null_res ? nullptr : &S.r);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_forward_compute accepted what it must reject");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(same_bytes(&S.r, rbefore), "te_linear_forward_compute failed but wrote *residuals");
      y.check_untouched("te_linear_forward_compute", "y");
      if (check_state)
        FUZZ_ASSERT(layer_state(ctx_of(lctx), lh) == st_before, "te_linear_forward_compute failed but changed the layer's state");
      return;
    }
    check_residuals(S.r, cfg, tokens, expect_fp8);
    S.filled = true;
    S.id = next_res_id_++;
    live_res_.insert(S.id);
    S.ctx = cs;
    S.lin = lh;
    S.cfg = cfg;
    S.tokens = tokens;
  }

  BwdSlot &fresh_bwd_slot(int &bs) {
    bs = static_cast<int>(R.pick(kBwdSlots));
    BwdSlot &B = bwd_[bs];
    if (B.live) {
      te_linear_backward_ctx_destroy(B.h);
      B.live = false;
    }
    return B;
  }

  void forward_save() {
    bool mf = false;
    const int rs = static_cast<int>(R.pick(kResSlots));
    ResSlot &S = res_[rs];
    te_linear_residuals empty;
    std::memset(&empty, 0, sizeof empty);
    empty.struct_size = sizeof empty;
    te_linear_residuals *pr = S.filled ? &S.r : &empty;
    if (!S.filled || !live_res_.count(S.id)) mf = true;  // empty, saved or released
    // The layer: the one that made the residuals, or another.
    te_linear *lh = S.lin;
    const uint8_t v = R.u8();
    if (v >= 230) {
      int ls;
      lh = lin_arg(mf, ls);
      if (lh != S.lin) mf = true;
    }
    if (!S.filled) mf = true;
    bool found_live = false;
    for (auto &L : lin_)
      if (L.live && L.h == lh) found_live = true;
    if (!found_live) mf = true;
    int cs;
    te_context *ctx = ctx_arg(mf, cs, S.filled ? S.ctx : 0);
    if (!S.filled || cs != S.ctx) mf = true;
    int bs;
    BwdSlot &B = fresh_bwd_slot(bs);
    const bool null_out = R.u8() >= 250;
    mf |= null_out;
    te_linear_backward_ctx *h = sentinel<te_linear_backward_ctx>();
    const std::vector<uint8_t> rbefore = bytes_of(pr, sizeof *pr);
    te_status s = TE_CALL(te_linear_forward_save, ctx, lh, pr, null_out ? nullptr : &h);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_forward_save accepted what it must reject (stale or foreign residuals?)");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(h == sentinel<te_linear_backward_ctx>(), "te_linear_forward_save failed but wrote *out");
      FUZZ_ASSERT(same_bytes(pr, rbefore), "te_linear_forward_save failed but changed *residuals");
      return;
    }
    FUZZ_ASSERT(S.r.internal == nullptr, "te_linear_forward_save left residuals->internal set");
    live_res_.erase(S.id);
    B.h = h;
    B.live = true;
    B.ctx = cs;
    B.lin = S.lin;
    B.cfg = S.cfg;
    B.bufs = nullptr;
    for (auto &L : lin_)
      if (L.h == S.lin) B.bufs = L.bufs;
    B.tokens = S.tokens;
    B.once_done = false;
  }

  void forward() {
    int bs;
    BwdSlot &B = fresh_bwd_slot(bs);  // first: seeds name it
    bool mf = false;
    int ls;
    te_linear *lh = lin_arg(mf, ls);
    LinCfg cfg;
    LinBufs *bufs = nullptr;
    int lctx = 0;
    if (ls >= 0 && lin_[ls].h) {
      cfg = lin_[ls].cfg;
      bufs = lin_[ls].bufs;
      lctx = lin_[ls].ctx;
    }
    int cs;
    te_context *ctx = ctx_arg(mf, cs, lctx);
    if (cs != lctx) mf = true;
    Tensor x, w, b, y;
    int64_t tokens;
    forward_tensors(ls, cfg, bufs, tokens, x, w, b, y, mf);
    te_linear_forward_args a;
    te_linear_forward_args_init(&a);
    a.input = tp(maybe_null(x, mf));
    a.weight = tp(maybe_null(w, mf));
    a.bias = cfg.bias == 1 ? &b.t : nullptr;
    if (cfg.bias == 1 && b.malformed) mf = true;
    a.weight_unchanged = R.u8() >= 200 ? 1 : 0;
    Tensor *py = maybe_null(y, mf);
    const bool null_out = R.u8() >= 250;
    mf |= null_out;
    y.snapshot();
    const bool check_state = ls >= 0 && lin_[ls].live && ctx_live(lctx);
    const std::vector<uint8_t> st_before = check_state ? layer_state(ctx_of(lctx), lh) : std::vector<uint8_t>();
    te_linear_backward_ctx *h = sentinel<te_linear_backward_ctx>();
    te_status s = TE_CALL(te_linear_forward, ctx, lh, &a, py ? &py->t : nullptr, null_out ? nullptr : &h);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_forward accepted what it must reject");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(h == sentinel<te_linear_backward_ctx>(), "te_linear_forward failed but wrote *out");
      y.check_untouched("te_linear_forward", "y");
      if (check_state)
        FUZZ_ASSERT(layer_state(ctx_of(lctx), lh) == st_before, "te_linear_forward failed but changed the layer's state");
      return;
    }
    B.h = h;
    B.live = true;
    B.ctx = cs;
    B.lin = lh;
    B.cfg = cfg;
    B.bufs = bufs;
    B.tokens = tokens;
    B.once_done = false;
  }

  void backward() {
    bool mf = false;
    const int bs = static_cast<int>(R.pick(kBwdSlots));
    BwdSlot &B = bwd_[bs];
    te_linear_backward_ctx *h = B.h;
    const uint8_t v = R.u8();
    if (v >= 245) h = static_cast<te_linear_backward_ctx *>(some_live_handle(4));
    if (!h || !B.live || h != B.h) mf = true;  // NULL, destroyed (stale) or another type
    if (B.once_done) mf = true;                // TE_BACKWARD_ONCE ran: INVALID_STATE
    int cs;
    te_context *ctx = ctx_arg(mf, cs, B.ctx < 0 ? 0 : B.ctx);
    if (cs != B.ctx) mf = true;
    const LinCfg &cfg = B.cfg;
    const bool small = cfg.small();
    const int64_t in = small ? cfg.in : 16, out = small ? cfg.out : 16;
    int64_t tokens = B.tokens;
    if (R.u8() >= 245) {
      tokens = tokens == 16 ? 32 : 16;
      mf = true;
    }
    const int dt = cfg.dtype >= TE_DTYPE_F32 && cfg.dtype <= TE_DTYPE_BF16 ? cfg.dtype : TE_DTYPE_BF16;
    Tensor dy, dx, dw, db;
    bool odd = false;
    make(dy, dt, shape2(tokens, out));
    make(dx, pick_dtype(dt, odd), shape2(tokens, in));
    make(dw, cfg.fuse == 1 ? TE_DTYPE_F32 : dt, shape2(out, in));
    make(db, dt, shape1(out));
    maybe_malform(dy);
    maybe_malform(dx);
    maybe_malform(dw);
    maybe_malform(db);
    const te_tensor *pdy = &dy.t;
    if (dy.malformed) mf = true;
    if (R.u8() >= 252) { pdy = nullptr; mf = true; }
    te_tensor *pdx = R.u8() >= 220 ? nullptr : &dx.t;
    te_tensor *pdw = R.u8() >= 220 ? nullptr : &dw.t;
    te_tensor *pdb = (cfg.bias == 1 && R.u8() < 220) ? &db.t : nullptr;
    if (cfg.bias != 1 && R.u8() >= 245) { pdb = &db.t; mf = true; }
    if ((pdx && dx.malformed) || (pdw && dw.malformed) || (pdb && db.malformed)) mf = true;
    if (pdx && get_enum(dx.t.dtype) != dt) mf = true;  // dx in another dtype than the layer's
    te_linear_backward_args a;
    std::memset(&a, 0x55, sizeof a);
    FUZZ_ASSERT(TE_CALL(te_linear_backward_args_init, &a) == TE_SUCCESS && a.flags == 0, "te_linear_backward_args_init");
    const uint32_t fl = R.pick(8);
    const te_linear_backward_args *pa = &a;
    bool once = false;
    switch (fl) {
      case 1: case 2: a.flags = TE_BACKWARD_ONCE; once = true; break;
      case 3: pa = nullptr; break;
      case 4: a.flags = 2; mf = true; break;
      case 5: a.flags = 0x80000001u; mf = true; break;
      case 6: a.struct_size = 0; mf = true; break;
      default: break;
    }
    dx.snapshot();
    dw.snapshot();
    db.snapshot();
    te_linear *lin = nullptr;
    for (auto &L : lin_)
      if (L.live && L.h == B.lin && L.ctx == B.ctx) lin = L.h;
    const bool check_state = lin && ctx_live(B.ctx);
    const std::vector<uint8_t> st_before = check_state ? layer_state(ctx_of(B.ctx), lin) : std::vector<uint8_t>();
    te_status s = TE_CALL(te_linear_backward, ctx, h, pdy, pdx, pdw, pdb, pa);
    if (mf)
      FUZZ_ASSERT(s != TE_SUCCESS,
                  "te_linear_backward accepted what it must reject: stale %d, once_done %d, handle %s, ctx slot %d "
                  "(made on %d), dy [%lld, %lld] (forward had %lld tokens), dx dtype %d (layer %d), dy/dx/dw/db "
                  "malformed %d%d%d%d given %d%d%d%d, layer bias %d, flags 0x%x, args %s",
                  !B.live, B.once_done, h == B.h ? "the slot's" : "another", cs, B.ctx, (long long)dy.t.shape[0],
                  (long long)dy.t.shape[1], (long long)B.tokens, get_enum(dx.t.dtype), dt, dy.malformed,
                  dx.malformed, dw.malformed, db.malformed, pdy != nullptr, pdx != nullptr, pdw != nullptr,
                  pdb != nullptr, cfg.bias, a.flags, pa ? (a.struct_size == sizeof a ? "given" : "small") : "NULL");
    if (s != TE_SUCCESS) {
      dx.check_untouched("te_linear_backward", "dx");
      dw.check_untouched("te_linear_backward", "dw");
      db.check_untouched("te_linear_backward", "db");
      if (check_state)
        FUZZ_ASSERT(layer_state(ctx_of(B.ctx), lin) == st_before, "te_linear_backward failed but changed the layer's state");
      return;
    }
    if (once) B.once_done = true;
  }

  void backward_destroy() {
    BwdSlot &B = bwd_[R.pick(kBwdSlots)];
    if (B.live) {
      te_linear_backward_ctx_destroy(B.h);
      B.live = false;  // the handle stays in the slot: later uses are stale
    } else if (B.h) {
      te_linear_backward_ctx_destroy(B.h);  // destroyed before: a no-op
    }
  }

  void residuals_release() {
    const uint8_t v = R.u8();
    if (v >= 250) {
      te_linear_residuals_release(nullptr);
      return;
    }
    ResSlot &S = res_[v % kResSlots];
    if (!S.filled) return;
    te_linear_residuals_release(&S.r);  // the owner, or a by-value copy of it
    live_res_.erase(S.id);
  }

  void residuals_copy() {
    const int src = static_cast<int>(R.pick(kResSlots)), dst = static_cast<int>(R.pick(kResSlots));
    if (src == dst || !res_[src].filled) return;
    clear_res_slot(dst);
    res_[dst] = res_[src];  // a by-value copy of the struct: both name the same residuals
  }

  // ---- state save/load ----

  void state_ops() {
    bool mf = false;
    int ls;
    te_linear *lh = lin_arg(mf, ls);
    const int lctx = ls >= 0 && lin_[ls].h ? lin_[ls].ctx : 0;
    int cs;
    te_context *ctx = ctx_arg(mf, cs, lctx);
    if (cs != lctx) mf = true;
    size_t need = 0x5EB7;
    te_status s = TE_CALL(te_linear_state_save, ctx, lh, nullptr, 0, &need);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_state_save accepted a bad handle");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(need == 0x5EB7, "te_linear_state_save failed but wrote *size");
      // The load must fail as well.
      uint8_t junk[64] = {'T', 'E', 'L', 'S', 1};
      FUZZ_ASSERT(TE_CALL(te_linear_state_load, ctx, lh, junk, sizeof junk) != TE_SUCCESS,
                  "te_linear_state_load accepted a bad handle");
      return;
    }
    FUZZ_ASSERT(need > 0 && need < (1u << 22), "te_linear_state_save: implausible size %zu", need);
    Blob saved(need);
    size_t got = 0;
    FUZZ_ASSERT(TE_CALL(te_linear_state_save, ctx, lh, saved.data(), need, &got) == TE_SUCCESS && got == need,
                "te_linear_state_save into %zu bytes failed", need);
    const std::vector<uint8_t> original = saved.snapshot();
    const uint32_t mode = R.pick(8);
    switch (mode) {
      case 0: {  // round trip (INVALID_STATE while an open scope or pending backward holds the states)
        const te_status ls0 = TE_CALL(te_linear_state_load, ctx, lh, saved.data(), need);
        FUZZ_ASSERT(ls0 == TE_SUCCESS || ls0 == TE_ERROR_INVALID_STATE,
                    "te_linear_state_load rejected what te_linear_state_save wrote (%s)", te_status_string(ls0));
        FUZZ_ASSERT(layer_state(ctx, lh) == original, "state save/load/save is not bit-exact");
        break;
      }
      case 1: {  // too small a buffer
        Blob small(need - 1);
        std::memset(small.data(), 0x61, small.size());
        const std::vector<uint8_t> sb = small.snapshot();
        size_t sz = 0x5EB7;
        FUZZ_ASSERT(TE_CALL(te_linear_state_save, ctx, lh, small.data(), need - 1, &sz) != TE_SUCCESS,
                    "te_linear_state_save accepted capacity %zu < %zu", need - 1, need);
        FUZZ_ASSERT(sz == 0x5EB7 && small.equals(sb), "te_linear_state_save failed but wrote its outputs");
        break;
      }
      case 2: case 3: {  // mutated bytes
        std::vector<uint8_t> m = original;
        const int k = 1 + static_cast<int>(R.pick(4));
        for (int i = 0; i < k; ++i) m[R.pick(static_cast<uint32_t>(m.size()))] = R.u8();
        if (R.u8() >= 128) {  // a float field set to a special value
          static const uint32_t kSpecial[6] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0, 0x80000000u, 1};
          const uint32_t bits = kSpecial[R.pick(6)];
          const size_t at = 4 * R.pick(static_cast<uint32_t>(m.size() / 4));
          std::memcpy(&m[at], &bits, 4);
        }
        load_and_check(ctx, lh, m, original);
        break;
      }
      case 4: {  // truncated
        const size_t n = R.pick(static_cast<uint32_t>(need));
        Blob t(n);
        if (n) std::memcpy(t.data(), original.data(), n);
        FUZZ_ASSERT(TE_CALL(te_linear_state_load, ctx, lh, t.data(), n) != TE_SUCCESS,
                    "te_linear_state_load accepted a state truncated to %zu of %zu bytes", n, need);
        FUZZ_ASSERT(layer_state(ctx, lh) == original, "a failed te_linear_state_load changed the layer's state");
        break;
      }
      case 5: {  // trailing bytes
        std::vector<uint8_t> m = original;
        const size_t extra = 1 + R.pick(16);
        for (size_t i = 0; i < extra; ++i) m.push_back(R.u8());
        load_and_check(ctx, lh, m, original);
        break;
      }
      case 6: {  // into another layer (maybe of another shape, maybe of another context)
        const int other = static_cast<int>(R.pick(kLinearSlots));
        const LinSlot &O = lin_[other];
        if (!O.live || !ctx_live(O.ctx)) break;
        const std::vector<uint8_t> before = layer_state(ctx_of(O.ctx), O.h);
        te_status ls2 = TE_CALL(te_linear_state_load, ctx_of(O.ctx), O.h, saved.data(), need);
        if (ls >= 0 && (O.cfg.in != lin_[ls].cfg.in || O.cfg.out != lin_[ls].cfg.out))
          FUZZ_ASSERT(ls2 != TE_SUCCESS, "te_linear_state_load accepted the state of a layer of another shape");
        if (ls2 == TE_SUCCESS)
          FUZZ_ASSERT(layer_state(ctx_of(O.ctx), O.h) == original, "state loaded into another layer does not save back");
        else
          FUZZ_ASSERT(layer_state(ctx_of(O.ctx), O.h) == before, "a failed te_linear_state_load changed the layer's state");
        break;
      }
      default: {  // NULL or empty buffers
        const bool null_buf = R.u8() >= 128;
        FUZZ_ASSERT(TE_CALL(te_linear_state_load, ctx, lh, null_buf ? nullptr : saved.data(), null_buf ? need : 0) != TE_SUCCESS,
                    "te_linear_state_load accepted a NULL or empty buffer");
        size_t sz = 1;
        FUZZ_ASSERT(TE_CALL(te_linear_state_save, ctx, lh, saved.data(), need, nullptr) != TE_SUCCESS,
                    "te_linear_state_save accepted size == NULL");
        (void)sz;
        break;
      }
    }
  }

  // Loads `m`: a success must save back bit for bit; a failure must change nothing.
  void load_and_check(te_context *ctx, te_linear *lh, const std::vector<uint8_t> &m, const std::vector<uint8_t> &original) {
    Blob buf(m.size());
    std::memcpy(buf.data(), m.data(), m.size());
    te_status s = TE_CALL(te_linear_state_load, ctx, lh, buf.data(), buf.size());
    FUZZ_ASSERT(buf.equals(m), "te_linear_state_load wrote into its input");
    if (s == TE_SUCCESS) {
      const std::vector<uint8_t> back = layer_state(ctx, lh);
      size_t at = 0;
      while (at < m.size() && at < back.size() && back[at] == m[at]) ++at;
      FUZZ_ASSERT(back == m,
                  "a state te_linear_state_load accepted does not save back bit for bit (%zu vs %zu bytes; first "
                  "difference at byte %zu)", back.size(), m.size(), at);
    }
    else
      FUZZ_ASSERT(layer_state(ctx, lh) == original, "a failed te_linear_state_load changed the layer's state");
  }

  void scaling_state() {
    bool mf = false;
    int ls;
    te_linear *lh = lin_arg(mf, ls);
    const int lctx = ls >= 0 && lin_[ls].h ? lin_[ls].ctx : 0;
    int cs;
    te_context *ctx = ctx_arg(mf, cs, lctx);
    if (cs != lctx) mf = true;
    static const int kRoles[5] = {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT, 3, -1};
    const int role = kRoles[R.pick(5)];
    mf |= role > 2 || role < 0;
    te_tensor_role r;
    set_enum(r, role);
    static const size_t kCaps[6] = {0, 1, 16, 1024, 2048, 3};
    const size_t cap = kCaps[R.pick(6)];
    const bool null_hist = R.u8() >= 200;
    Blob hist(cap * sizeof(float));
    std::memset(hist.data(), 0x7B, hist.size());
    te_scaling_state_info info;
    std::memset(&info, 0x7C, sizeof info);
    info.struct_size = sizeof info;
    const uint8_t v = R.u8();
    if (v >= 250) { info.struct_size = sizeof info - 4; mf = true; }
    const bool null_info = v >= 246 && v < 250;
    mf |= null_info;
    const std::vector<uint8_t> ib = bytes_of(&info, sizeof info), hb = hist.snapshot();
    te_status s = TE_CALL(te_linear_get_scaling_state, ctx, lh, r, null_info ? nullptr : &info,
                          null_hist ? nullptr : hist.floats(), cap);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_get_scaling_state accepted what it must reject");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(same_bytes(&info, ib) && hist.equals(hb), "te_linear_get_scaling_state failed but wrote its outputs");
      return;
    }
    FUZZ_ASSERT(info.amax_history_len >= 0 && info.amax_history_len <= 65536, "amax_history_len %d", info.amax_history_len);
    FUZZ_ASSERT(is_fp8(get_enum(info.fp8_dtype)), "scaling state dtype %d is not FP8", get_enum(info.fp8_dtype));
  }

  // ---- primitives ----

  te_quantize_options *quantize_opts(te_quantize_options &o, Blob &scale, Blob &amax, bool block, bool &mf) {
    FUZZ_ASSERT(TE_CALL(te_quantize_options_init, &o) == TE_SUCCESS, "te_quantize_options_init failed");
    const uint32_t mode = R.pick(8);
    scale = Blob(4);
    amax = Blob(4);
    switch (mode) {
      case 0: return nullptr;
      case 2: case 3: {
        static const float kS[8] = {1.0f, 448.0f, 0.0f, NAN, INFINITY, -2.0f, 1e-30f, 3e38f};
        const float v = kS[R.pick(8)];
        std::memcpy(scale.data(), &v, 4);
        o.scale = scale.floats();
        if (block) mf = true;
        break;
      }
      case 4: o.amax = amax.floats(); break;
      case 5: {
        static const float kE[6] = {1e-12f, -1.0f, INFINITY, NAN, 0.0f, 1e30f};
        const uint32_t k = R.pick(6);
        o.amax_epsilon = kE[k];
        if (k >= 1 && k <= 3) mf = true;
        break;
      }
      case 6: o.power_of_2_scales = static_cast<int32_t>(R.pick(3)); mf |= o.power_of_2_scales == 2; break;
      case 7: o.struct_size = 4; mf = true; break;
      default: break;
    }
    return &o;
  }

  void quantize() {
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    bool odd = false;
    const Shape s = gen_shape();
    Tensor x, out;
    const int xd = pick_dtype(TE_DTYPE_F32, odd), od = pick_dtype(TE_DTYPE_E4M3, odd);
    if (!(xd >= 0 && xd <= 2) || !is_fp8(od)) mf = true;
    make(x, xd, s);
    const int sc = pick_scaling();
    make(out, od, R.u8() >= 245 ? gen_shape() : s, sc);
    if (out.shape.numel() != x.shape.numel()) mf = true;
    maybe_malform(x);
    maybe_malform(out);
    if (is_fp8(od) && (sc < 0 || sc > 2)) mf = true;
    te_quantize_options o;
    Blob scale, amax;
    te_quantize_options *po = quantize_opts(o, scale, amax, is_fp8(od) && sc != 0, mf);
    const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
    Tensor *pout = maybe_null(out, mf);
    out.snapshot();
    const std::vector<uint8_t> ab = amax.snapshot();
    te_status st = TE_CALL(te_quantize, ctx, px, pout ? &pout->t : nullptr, po);
    if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_quantize accepted what it must reject");
    if (st != TE_SUCCESS) {
      out.check_untouched("te_quantize", "out");
      FUZZ_ASSERT(amax.equals(ab), "te_quantize failed but wrote opts->amax");
    }
  }

  void dequantize() {
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    bool odd = false;
    const Shape s = gen_shape();
    Tensor x, out;
    const int xd = pick_dtype(TE_DTYPE_E4M3, odd), od = pick_dtype(TE_DTYPE_F32, odd);
    if (!is_fp8(xd) || !(od >= 0 && od <= 2)) mf = true;
    const int sc = pick_scaling();
    if (is_fp8(xd) && (sc < 0 || sc > 2)) mf = true;
    make(x, xd, s, sc);
    make(out, od, R.u8() >= 245 ? gen_shape() : s);
    if (out.shape.numel() != x.shape.numel()) mf = true;
    maybe_malform(x);
    maybe_malform(out);
    const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
    Tensor *pout = maybe_null(out, mf);
    out.snapshot();
    te_status st = TE_CALL(te_dequantize, ctx, px, pout ? &pout->t : nullptr);
    if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_dequantize accepted what it must reject");
    if (st != TE_SUCCESS) out.check_untouched("te_dequantize", "out");
  }

  void cast_transpose() {
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    bool odd = false;
    Shape s = gen_shape();
    if (s.ndim != 2) s = shape2(s.rows(), s.cols());
    Tensor x, out, out_t;
    const int xd = pick_dtype(TE_DTYPE_BF16, odd), od = pick_dtype(TE_DTYPE_E4M3, odd);
    if (!(xd >= 0 && xd <= 2) || !is_fp8(od)) mf = true;
    const int sc = pick_scaling();
    if (is_fp8(od) && (sc < 0 || sc > 2)) mf = true;
    make(x, xd, s);
    make(out, od, s, sc);
    make(out_t, od, shape2(s.d[1], s.d[0]), sc);
    maybe_malform(x);
    maybe_malform(out);
    maybe_malform(out_t);
    te_quantize_options o;
    Blob scale, amax;
    te_quantize_options *po = quantize_opts(o, scale, amax, is_fp8(od) && sc != 0, mf);
    const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
    const uint32_t which = R.pick(4);  // 0, 1: both; 2: out only; 3: out_t only
    Tensor *po1 = which == 3 ? nullptr : maybe_null(out, mf, true);
    Tensor *po2 = which == 2 ? nullptr : maybe_null(out_t, mf, true);
    if (po1 && out.malformed) mf = true;
    if (po2 && out_t.malformed) mf = true;
    if (!po1 && !po2) mf = true;
    out.snapshot();
    out_t.snapshot();
    const std::vector<uint8_t> ab = amax.snapshot();
    te_status st = TE_CALL(te_cast_transpose, ctx, px, po1 ? &po1->t : nullptr, po2 ? &po2->t : nullptr, po);
    if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_cast_transpose accepted what it must reject");
    if (st != TE_SUCCESS) {
      out.check_untouched("te_cast_transpose", "out");
      out_t.check_untouched("te_cast_transpose", "out_t");
      FUZZ_ASSERT(amax.equals(ab), "te_cast_transpose failed but wrote opts->amax");
    }
  }

  void amax_op() {
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    bool odd = false;
    Tensor x;
    const int xd = pick_dtype(TE_DTYPE_F32, odd);
    if (!(xd >= 0 && xd <= 2)) mf = true;
    make(x, xd, gen_shape());
    maybe_malform(x);
    const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
    Blob a(4);
    const float sent = -12345.0f;
    std::memcpy(a.data(), &sent, 4);
    const bool null_out = R.u8() >= 250;
    mf |= null_out;
    te_status st = TE_CALL(te_amax, ctx, px, null_out ? nullptr : a.floats());
    if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_amax accepted what it must reject");
    if (st != TE_SUCCESS) {
      FUZZ_ASSERT(std::memcmp(a.data(), &sent, 4) == 0, "te_amax failed but wrote *amax");
    } else {
      float v;
      std::memcpy(&v, a.data(), 4);
      FUZZ_ASSERT(!(v < 0.0f), "te_amax returned a negative amax %g", static_cast<double>(v));
    }
  }

  void gemm() {
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    static const int64_t kG[8] = {16, 32, 48, 64, 1, 3, 17, 128};
    const int64_t m = kG[R.pick(8)], n = kG[R.pick(8)], k = kG[R.pick(8)];
    const uint32_t mode = R.pick(8);
    int ad, bd;
    switch (mode) {
      case 1: ad = bd = TE_DTYPE_BF16; break;
      case 2: ad = bd = TE_DTYPE_F32; break;
      case 3: ad = bd = TE_DTYPE_F16; break;
      case 4: ad = TE_DTYPE_E5M2; bd = TE_DTYPE_E4M3; break;
      case 5: ad = bd = TE_DTYPE_E5M2; mf = true; break;  // not both E5M2
      case 6: ad = TE_DTYPE_E4M3; bd = TE_DTYPE_BF16; mf = true; break;
      case 7: ad = TE_DTYPE_F32; bd = TE_DTYPE_BF16; mf = true; break;
      default: ad = bd = TE_DTYPE_E4M3; break;
    }
    const bool fp8 = is_fp8(ad);
    const uint8_t tv = R.u8();
    int ta = fp8 ? 0 : 0, tb = fp8 ? 1 : 0;
    if (tv >= 160) { ta = static_cast<int>(tv & 1); tb = static_cast<int>((tv >> 1) & 1); }
    if (tv >= 250) { ta = 2; mf = true; }
    if (fp8 && (ta != 0 || tb != 1)) mf = true;
    if (fp8 && (m % 16 || n % 16 || k % 16)) mf = true;
    bool odd = false;
    const int dd = pick_dtype(TE_DTYPE_F32, odd);
    if (!(dd >= 0 && dd <= 2)) mf = true;
    Tensor a, b, d, bias, gelu;
    const int sa = fp8 ? (R.u8() >= 200 ? TE_SCALING_BLOCK_1X128 : TE_SCALING_PER_TENSOR) : 0;
    const int sb = fp8 ? (sa == 0 ? 0 : (R.u8() >= 128 ? TE_SCALING_BLOCK_128X128 : TE_SCALING_BLOCK_1X128)) : 0;
    make(a, ad, ta == 1 ? shape2(k, m) : shape2(m, k), sa);
    make(b, bd, tb == 1 ? shape2(n, k) : shape2(k, n), sb);
    make(d, dd, shape2(m, n));
    make(bias, TE_DTYPE_F32, shape1(n));
    make(gelu, dd >= 0 && dd <= 2 ? dd : TE_DTYPE_F32, shape2(m, n));
    maybe_malform(a);
    maybe_malform(b);
    maybe_malform(d);
    te_gemm_options o;
    std::memset(&o, 0x12, sizeof o);
    FUZZ_ASSERT(TE_CALL(te_gemm_options_init, &o) == TE_SUCCESS, "te_gemm_options_init failed");
    o.transa = ta;
    o.transb = tb;
    const uint32_t ep = R.pick(6);
    set_enum(o.epilogue, ep < 4 ? static_cast<int>(ep) : (ep == 4 ? 0 : 9));
    if (ep == 5) mf = true;
    const bool has_bias = ep == 1 || ep == 3, has_gelu = ep == 2 || ep == 3;
    if (has_bias) {
      maybe_malform(bias);
      o.bias = R.u8() >= 250 ? nullptr : &bias.t;
      if (!o.bias || bias.malformed) mf = true;
    } else if (R.u8() >= 250) {
      o.bias = &bias.t;
      mf = true;
    }
    if (R.u8() >= 200) {
      o.gelu_input = &gelu.t;
      if (!has_gelu) mf = true;
    }
    const uint8_t acc = R.u8();
    o.accumulate = acc < 200 ? 0 : acc < 250 ? 1 : 2;
    mf |= o.accumulate == 2;
    o.use_split_accumulator = R.u8() >= 128 ? 1 : 0;
    const uint8_t z = R.u8();
    if (z >= 252) { o.struct_size = 0; mf = true; }
    const bool null_opts = z >= 240 && z < 252 && (ep == 0 || ep == 4) && !o.bias && !o.gelu_input && o.accumulate == 0 &&
                           ta == 0 && tb == 0;  // NULL options are these defaults
    const bool null_d = R.u8() >= 252;
    mf |= null_d;
    if (a.malformed || b.malformed || d.malformed) mf = true;
    d.snapshot();
    gelu.snapshot();
    te_status st = TE_CALL(te_gemm, ctx, &a.t, &b.t, null_d ? nullptr : &d.t, null_opts ? nullptr : &o);
    if (mf)
      FUZZ_ASSERT(st != TE_SUCCESS,
                  "te_gemm accepted what it must reject: m %lld n %lld k %lld, a %d b %d d %d, transa %d transb %d, "
                  "epilogue %d, bias %s, gelu_input %s, accumulate %d, malformed a/b/d/bias %d%d%d%d, opts %s, d %s",
                  (long long)m, (long long)n, (long long)k, ad, bd, dd, ta, tb, get_enum(o.epilogue),
                  o.bias ? "given" : "NULL", o.gelu_input ? "given" : "NULL", o.accumulate, a.malformed, b.malformed,
                  d.malformed, bias.malformed, null_opts ? "NULL" : "given", null_d ? "NULL" : "given");
    if (st != TE_SUCCESS) {
      d.check_untouched("te_gemm", "d");
      gelu.check_untouched("te_gemm", "opts->gelu_input");
    }
  }

  void activation(bool backward_pass) {
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    static const int kAct[5] = {TE_ACTIVATION_RELU, TE_ACTIVATION_GELU, TE_ACTIVATION_SWIGLU, 3, -1};
    const int act = kAct[R.pick(5)];
    if (act < 0 || act > 2) mf = true;
    te_activation ae;
    set_enum(ae, act);
    bool odd = false;
    const int xd = pick_dtype(TE_DTYPE_BF16, odd);
    if (!(xd >= 0 && xd <= 2)) mf = true;
    const Shape s = gen_shape();
    Shape ys = s;
    if (act == TE_ACTIVATION_SWIGLU) {
      if (s.cols() % 2) mf = true;
      ys.d[ys.ndim - 1] = std::max<int64_t>(1, s.cols() / 2);
    }
    const int yd = pick_dtype(xd, odd);
    if (yd != xd) mf = true;
    Tensor x, y, dx;
    make(x, xd, s);
    make(y, yd, R.u8() >= 245 ? gen_shape() : ys);
    if (y.shape.numel() != ys.numel()) mf = true;
    make(dx, xd, s);
    maybe_malform(x);
    maybe_malform(y);
    maybe_malform(dx);
    const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
    Tensor *py = maybe_null(y, mf);
    if (!backward_pass) {
      y.snapshot();
      te_status st = TE_CALL(te_activation_forward, ctx, ae, px, py ? &py->t : nullptr);
      if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_activation_forward accepted what it must reject");
      if (st != TE_SUCCESS) y.check_untouched("te_activation_forward", "y");
    } else {
      Tensor *pdx = maybe_null(dx, mf);
      dx.snapshot();
      te_status st = TE_CALL(te_activation_backward, ctx, ae, px, py ? &py->t : nullptr, pdx ? &pdx->t : nullptr);
      if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_activation_backward accepted what it must reject");
      if (st != TE_SUCCESS) dx.check_untouched("te_activation_backward", "dx");
    }
  }

  // ---- context memory ----

  void malloc_op() {
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    size_t n;
    const uint32_t mode = R.pick(8);
    switch (mode) {
      case 1: n = 0; mf = true; break;
      case 2: n = SIZE_MAX; break;
      case 3: n = SIZE_MAX - R.pick(128); break;
      case 4: n = size_t{1} << (41 + R.pick(22)); break;
      case 5: n = (SIZE_MAX >> 1) + 1 + R.pick(64); break;
      case 6: n = 1 + R.pick(65536); break;
      case 7: n = 64; break;
      default: n = 1 + R.pick(4096); break;
    }
    const bool null_out = R.u8() >= 250;
    mf |= null_out;
    void *p = sentinel<void>();
    te_status s = TE_CALL(te_context_malloc, ctx, n, null_out ? nullptr : &p);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_malloc accepted what it must reject (%zu bytes)", n);
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(p == sentinel<void>(), "te_context_malloc failed but wrote *out");
      return;
    }
    FUZZ_ASSERT(p != nullptr && reinterpret_cast<uintptr_t>(p) % 64 == 0, "te_context_malloc: %p is not 64-byte aligned", p);
    // No block of 2^47 bytes or more exists on x86-64 (nor one that wraps the address space):
    // such a "success" is a size computation that overflowed.
    FUZZ_ASSERT(n < (size_t{1} << 47) && n - 1 <= UINTPTR_MAX - reinterpret_cast<uintptr_t>(p),
                "te_context_malloc succeeded for %zu bytes (%p): a block that cannot exist", n, p);
    uint8_t *b = static_cast<uint8_t *>(p);
    // The block is ours: its first and last bytes (all of it when small) must be writable.
    if (n <= 65536) std::memset(b, 0xA5, n);
    b[0] = 1;
    b[n - 1] = 2;
    blocks_.push_back(Block{cs, b, n});
    for (size_t i = 0; i < freed_blocks_.size();)
      if (freed_blocks_[i] == reinterpret_cast<uintptr_t>(b)) freed_blocks_.erase(freed_blocks_.begin() + static_cast<long>(i));
      else ++i;
    if (blocks_.size() > 12) free_block(0);
  }

  void free_block(size_t i) {
    Block blk = blocks_[i];
    FUZZ_ASSERT(TE_CALL(te_context_free, ctx_[blk.ctx].h, blk.p) == TE_SUCCESS, "te_context_free of a live block failed");
    blocks_.erase(blocks_.begin() + static_cast<long>(i));
    freed_blocks_.push_back(reinterpret_cast<uintptr_t>(blk.p));
    if (freed_blocks_.size() > 32) freed_blocks_.erase(freed_blocks_.begin());
  }

  bool is_live_block(const void *p) const {
    for (const Block &b : blocks_)
      if (b.p == p) return true;
    return false;
  }

  void free_op() {
    const uint32_t how = R.pick(6);
    if (how == 0 || how == 5) {
      if (!blocks_.empty()) free_block(R.pick(static_cast<uint32_t>(blocks_.size())));
      return;
    }
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    void *p = nullptr;
    uint64_t local = 0;
    switch (how) {
      case 1: {  // another context's block
        for (const Block &b : blocks_)
          if (b.ctx != cs) { p = b.p; break; }
        if (!p) return;
        mf = true;
        break;
      }
      case 2: {  // freed before (and not handed out again)
        if (freed_blocks_.empty()) return;
        p = reinterpret_cast<void *>(freed_blocks_[R.pick(static_cast<uint32_t>(freed_blocks_.size()))]);
        if (is_live_block(p)) return;
        mf = true;
        break;
      }
      case 3: p = &local; mf = true; break;
      default: {  // inside a live block
        if (blocks_.empty()) return;
        const Block &b = blocks_[R.pick(static_cast<uint32_t>(blocks_.size()))];
        if (b.n < 2) return;
        p = b.p + 1 + R.pick(static_cast<uint32_t>(std::min<size_t>(b.n - 1, 4096)));
        mf = true;
        break;
      }
    }
    te_status s = TE_CALL(te_context_free, ctx, p);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_free accepted a pointer the context did not hand out (how %u)", how);
  }

  void copy_op() {
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    Blob src(256), dst(256);
    for (size_t i = 0; i < 256; ++i) src.data()[i] = static_cast<uint8_t>(i);
    size_t n = R.pick(257);
    void *d = dst.data();
    const void *s = src.data();
    for (const Block &b : blocks_)
      if (b.ctx == cs && R.u8() >= 128) {
        d = b.p;
        n = std::min(n, b.n);
        break;
      }
    static const int kKinds[5] = {TE_COPY_HOST_TO_DEVICE, TE_COPY_DEVICE_TO_HOST, TE_COPY_DEVICE_TO_DEVICE, 3, -1};
    const int kind = kKinds[R.pick(5)];
    if (kind < 0 || kind > 2) mf = true;
    te_copy_kind k;
    set_enum(k, kind);
    const uint8_t z = R.u8();
    if (z >= 250) { d = nullptr; mf = true; }
    else if (z >= 245) { s = nullptr; mf = true; }
    te_status st = TE_CALL(te_context_copy, ctx, d, s, n, k);
    if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_context_copy accepted what it must reject");
  }

  // ---- tensor getters ----

  void tensor_query() {
    Tensor x;
    bool odd = false;
    const int dt = pick_dtype(TE_DTYPE_E4M3, odd);
    const int sc = pick_scaling();
    make(x, dt, gen_shape(), sc);
    maybe_malform(x);
    Shape s;
    s.ndim = x.t.ndim;
    bool huge = false;
    if (R.u8() >= 200) {  // huge dimensions without data: only the shape arithmetic runs
      static const int64_t kH[6] = {INT64_MAX, INT64_MAX - 127, int64_t{1} << 62, int64_t{1} << 40, 3037000499ll, 129};
      x.t.ndim = 1 + static_cast<int>(R.pick(3));
      for (int i = 0; i < x.t.ndim; ++i) x.t.shape[i] = kH[R.pick(6)];
      huge = true;
    }
    s.ndim = x.t.ndim;
    for (int i = 0; i < TE_MAX_DIMS; ++i) s.d[i] = x.t.shape[i];
    const bool good = s.good();
    const int64_t n = te_tensor_numel(&x.t);
    // A count no tensor can have may read as 0 (the library caps tensors at some huge size).
    if (good)
      FUZZ_ASSERT(n == s.numel() || (n == 0 && s.numel() > (int64_t{1} << 47)), "te_tensor_numel: %lld, expected %lld",
                  (long long)n, (long long)s.numel());
    if (x.t.ndim < 1 || x.t.ndim > TE_MAX_DIMS) FUZZ_ASSERT(n == 0, "te_tensor_numel of ndim %d: %lld", x.t.ndim, (long long)n);
    FUZZ_ASSERT(te_tensor_numel(nullptr) == 0, "te_tensor_numel(NULL) != 0");
    int64_t count = -777;
    const bool null_count = R.u8() >= 250;
    te_status st = TE_CALL(te_tensor_scale_inv_count, null_count ? nullptr : &count, &x.t);
    const int xdt = get_enum(x.t.dtype), xsc = get_enum(x.t.scaling);
    const bool must_fail = null_count || !good || !is_fp8(xdt) || xsc < 0 || xsc > 2;
    if (must_fail) FUZZ_ASSERT(st != TE_SUCCESS, "te_tensor_scale_inv_count accepted a bad tensor");
    if (st != TE_SUCCESS) {
      FUZZ_ASSERT(count == -777, "te_tensor_scale_inv_count failed but wrote *count");
      return;
    }
    // The count of a tensor that exists (not one of the huge shapes) is the header's rule.
    __int128 rows = 1;
    for (int i = 0; i + 1 < s.ndim; ++i) rows *= s.d[i];
    const __int128 cols = s.d[s.ndim - 1];
    const __int128 bc = cols / 128 + (cols % 128 != 0), br = rows / 128 + (rows % 128 != 0);
    const __int128 want = xsc == 0 ? 1 : xsc == 1 ? rows * bc : br * bc;
    if (want <= INT64_MAX)
      FUZZ_ASSERT(count == static_cast<int64_t>(want), "te_tensor_scale_inv_count: %lld, expected %lld (huge %d)",
                  (long long)count, (long long)want, huge);
    else
      violation("te_tensor_scale_inv_count succeeded with a count beyond int64 (%lld)", (long long)count);
  }

  void context_misc() {
    bool mf = false;
    int cs;
    te_context *ctx = ctx_arg(mf, cs);
    switch (R.pick(6)) {
      case 0: {
        te_status s = TE_CALL(te_context_set_stream, ctx, nullptr);
        if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_set_stream accepted a bad ctx");
        else FUZZ_ASSERT(s == TE_SUCCESS, "te_context_set_stream(NULL) failed on a CPU context");
        break;
      }
      case 1: {
        te_status s = TE_CALL(te_context_set_stream, ctx, reinterpret_cast<void *>(uintptr_t{0x1000}));
        FUZZ_ASSERT(s != TE_SUCCESS, "te_context_set_stream accepted a stream on a CPU context");
        break;
      }
      case 2: {
        te_status s = TE_CALL(te_context_synchronize, ctx);
        if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_synchronize accepted a bad ctx");
        break;
      }
      case 3: {
        te_device d;
        std::memset(&d, 0x3E, sizeof d);
        const std::vector<uint8_t> b = bytes_of(&d, sizeof d);
        const bool null_out = R.u8() >= 200;
        te_status s = TE_CALL(te_context_get_device, ctx, null_out ? nullptr : &d);
        if (mf || null_out) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_get_device accepted bad arguments");
        if (s != TE_SUCCESS) FUZZ_ASSERT(same_bytes(&d, b), "te_context_get_device failed but wrote *out");
        break;
      }
      case 4: {
        te_status v;
        set_enum(v, static_cast<int>(R.u32()));
        const char *t = te_status_string(v);
        FUZZ_ASSERT(t && t[0], "te_status_string returned NULL or \"\"");
        FUZZ_ASSERT(te_version() == TE_VERSION_NUMBER, "te_version mismatch");
        break;
      }
      default: {  // options inits with NULL
        FUZZ_ASSERT(TE_CALL(te_context_options_init, nullptr) != TE_SUCCESS, "te_context_options_init(NULL)");
        FUZZ_ASSERT(TE_CALL(te_autocast_options_init, nullptr) != TE_SUCCESS, "te_autocast_options_init(NULL)");
        FUZZ_ASSERT(TE_CALL(te_linear_options_init, nullptr) != TE_SUCCESS, "te_linear_options_init(NULL)");
        FUZZ_ASSERT(TE_CALL(te_gemm_options_init, nullptr) != TE_SUCCESS, "te_gemm_options_init(NULL)");
        FUZZ_ASSERT(TE_CALL(te_quantize_options_init, nullptr) != TE_SUCCESS, "te_quantize_options_init(NULL)");
        break;
      }
    }
  }

  // A live handle passed as another type: every call must reject it; getters answer as for NULL.
  void wrong_handle() {
    void *h = some_live_handle(static_cast<int>(R.pick(5)));
    if (!h) return;
    const uint32_t fn = R.pick(8);
    bool is_ctx = false, is_rec = false, is_grp = false, is_lin = false, is_bwd = false;
    for (auto &s : ctx_) is_ctx |= s.live && s.h == h;
    for (auto &s : rec_) is_rec |= s.refs && s.h == h;
    for (auto &s : grp_) is_grp |= s.live && s.h == h;
    for (auto &s : lin_) is_lin |= s.live && s.h == h;
    for (auto &s : bwd_) is_bwd |= s.live && s.h == h;
    const int c0 = live_ctx_slot();
    te_context *ctx = c0 >= 0 ? ctx_[c0].h : nullptr;
    switch (fn) {
      case 0:
        if (!is_rec) {
          FUZZ_ASSERT(te_recipe_key(static_cast<te_recipe *>(h)) == 0, "te_recipe_key of a non-recipe handle is not 0");
          FUZZ_ASSERT(te_recipe_describe(static_cast<te_recipe *>(h))[0] == 0, "te_recipe_describe of a non-recipe handle");
          te_recipe_retain(static_cast<te_recipe *>(h));   // no-ops
          te_recipe_release(static_cast<te_recipe *>(h));
        }
        break;
      case 1:
        if (!is_grp)
          FUZZ_ASSERT(te_group_id(static_cast<te_group *>(h)) == 0 && te_group_rank(static_cast<te_group *>(h)) == 0 &&
                          te_group_size(static_cast<te_group *>(h)) == 1,
                      "group getters on a non-group handle");
        if (!is_grp) te_group_destroy(static_cast<te_group *>(h));  // a no-op
        break;
      case 2:
        if (!is_ctx) {
          te_autocast_options o;
          te_autocast_options_init(&o);
          te_autocast_token t = 7;
          FUZZ_ASSERT(TE_CALL(te_autocast_begin, static_cast<te_context *>(h), &o, &t) != TE_SUCCESS && t == 7,
                      "te_autocast_begin accepted a non-context handle");
          te_context_destroy(static_cast<te_context *>(h));  // a no-op
        }
        break;
      case 3:
        if (!is_lin) {
          te_linear_destroy(static_cast<te_linear *>(h));  // a no-op
          size_t n = 0;
          FUZZ_ASSERT(TE_CALL(te_linear_state_save, ctx, static_cast<te_linear *>(h), nullptr, 0, &n) != TE_SUCCESS,
                      "te_linear_state_save accepted a non-linear handle");
        }
        break;
      case 4:
        if (!is_bwd) {
          te_linear_backward_ctx_destroy(static_cast<te_linear_backward_ctx *>(h));  // a no-op
          Tensor dy;
          make(dy, TE_DTYPE_BF16, shape2(16, 16));
          FUZZ_ASSERT(TE_CALL(te_linear_backward, ctx, static_cast<te_linear_backward_ctx *>(h), &dy.t, nullptr, nullptr,
                              nullptr, nullptr) != TE_SUCCESS,
                      "te_linear_backward accepted a non-backward handle");
        }
        break;
      case 5:
        if (!is_ctx) {
          Tensor x;
          make(x, TE_DTYPE_F32, shape2(4, 4));
          float a = 0;
          FUZZ_ASSERT(TE_CALL(te_amax, static_cast<te_context *>(h), &x.t, &a) != TE_SUCCESS, "te_amax accepted a non-context handle");
        }
        break;
      case 6:
        if (!is_rec) {
          te_recipe_options o;
          std::memset(&o, 0, sizeof o);
          o.struct_size = sizeof o;
          FUZZ_ASSERT(TE_CALL(te_recipe_get_options, static_cast<te_recipe *>(h), &o) != TE_SUCCESS,
                      "te_recipe_get_options accepted a non-recipe handle");
        }
        break;
      default:
        if (!is_grp) {
          FUZZ_ASSERT(TE_CALL(te_group_abort, static_cast<te_group *>(h)) != TE_SUCCESS, "te_group_abort accepted a non-group handle");
        } else {
          FUZZ_ASSERT(TE_CALL(te_group_abort, static_cast<te_group *>(h)) != TE_SUCCESS,
                      "te_group_abort succeeded on a single-rank group (INVALID_STATE expected)");
        }
        break;
    }
  }

  // One training step on a linear: begin, forward, end, backward, destroy.
  void train_step() {
    const int ls = static_cast<int>(R.pick(kLinearSlots));
    LinSlot &L = lin_[ls];
    if (!L.live || !L.bufs || !ctx_live(L.ctx)) return;
    te_context *ctx = ctx_[L.ctx].h;
    bool mf = false;
    te_autocast_options o;
    te_autocast_options_init(&o);
    o.recipe = recipe_arg(mf);
    o.group = group_arg(mf);
    if (mf) return;
    te_autocast_token tok;
    if (TE_CALL(te_autocast_begin, ctx, &o, &tok) != TE_SUCCESS) return;
    ctx_[L.ctx].scopes.push_back(Scope{tok, 1, 0, o.recipe});
    const int64_t tokens = R.u8() >= 128 ? 32 : 16;
    const int dt = L.cfg.dtype;
    Tensor x, w, b, y;
    make(x, dt, shape2(tokens, L.cfg.in));
    make(w, dt, shape2(L.cfg.out, L.cfg.in));
    make(b, dt, shape1(L.cfg.out));
    make(y, dt, shape2(tokens, L.cfg.out));
    x.t.data = L.bufs->x.data();
    w.t.data = L.bufs->w.data();
    b.t.data = L.bufs->b.data();
    te_linear_forward_args a;
    te_linear_forward_args_init(&a);
    a.input = &x.t;
    a.weight = &w.t;
    a.bias = L.cfg.bias ? &b.t : nullptr;
    a.weight_unchanged = R.u8() >= 128 ? 1 : 0;
    int bs;
    BwdSlot &B = fresh_bwd_slot(bs);
    te_linear_backward_ctx *h = nullptr;
    te_status s = TE_CALL(te_linear_forward, ctx, L.h, &a, &y.t, &h);
    if (s == TE_SUCCESS) {
      B.h = h;
      B.live = true;
      B.ctx = L.ctx;
      B.lin = L.h;
      B.cfg = L.cfg;
      B.bufs = L.bufs;
      B.tokens = tokens;
      B.once_done = false;
    }
    if (TE_CALL(te_autocast_end, ctx, tok) == TE_SUCCESS) {
      ctx_[L.ctx].scopes.pop_back();
      ++ctx_[L.ctx].closed;
      ended_tokens_.push_back(tok);
    }
    check_autocast_state(L.ctx);
    if (s != TE_SUCCESS) return;
    Tensor dy, dx, dw, db;
    make(dy, dt, shape2(tokens, L.cfg.out));
    make(dx, dt, shape2(tokens, L.cfg.in));
    make(dw, L.cfg.fuse ? TE_DTYPE_F32 : dt, shape2(L.cfg.out, L.cfg.in));
    make(db, dt, shape1(L.cfg.out));
    te_linear_backward_args ba;
    te_linear_backward_args_init(&ba);
    const uint8_t v = R.u8();
    ba.flags = v >= 128 ? TE_BACKWARD_ONCE : 0;
    s = TE_CALL(te_linear_backward, ctx, h, &dy.t, &dx.t, &dw.t, L.cfg.bias ? &db.t : nullptr, &ba);
    if (s == TE_SUCCESS && ba.flags) {
      B.once_done = true;
      FUZZ_ASSERT(TE_CALL(te_linear_backward, ctx, h, &dy.t, &dx.t, &dw.t, L.cfg.bias ? &db.t : nullptr, &ba) ==
                      TE_ERROR_INVALID_STATE,
                  "a second backward after TE_BACKWARD_ONCE did not fail with INVALID_STATE");
    }
    if (R.u8() < 200) {
      te_linear_backward_ctx_destroy(h);
      B.live = false;
    }
  }

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
    all_bufs_.clear();
  }
};

}  // namespace fuzz
