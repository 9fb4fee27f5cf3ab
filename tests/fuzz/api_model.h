// The vocabulary of fuzz_api_sequence's programs (api_program.h): the operations, the slots of
// each handle type, and shapes and tensors in exactly-sized memory, well-formed or broken in the
// ways the header says every call must reject.
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
  OP_NORM_FORWARD,
  OP_NORM_BACKWARD,
  OP_GROUPED_CREATE,
  OP_GROUPED_DESTROY,
  OP_GROUPED_FORWARD,
  OP_GROUPED_BACKWARD,
  OP_GROUPED_BACKWARD_DESTROY,
  OP_GROUPED_STATE,
  OP_LN_CREATE,
  OP_LN_DESTROY,
  OP_LN_FORWARD,
  OP_LN_BACKWARD,
  OP_LN_BACKWARD_DESTROY,
  OP_LN_STATE,
  OP_CR_SIZE,
  OP_CR_FORWARD,
  OP_CR_BACKWARD,
  OP_CR_DESTROY,
  OP_ATTN_CREATE,
  OP_ATTN_DESTROY,
  OP_ATTN_FORWARD,
  OP_ATTN_BACKWARD,
  OP_ATTN_BACKWARD_DESTROY,
  OP_ATTN_CALLER,
  OP_ATTN_STATE,
  OP_ROPE,
  OP_ADD,
  OP_COLUMNS,
  OP_EMBEDDING,
  OP_CROSS_ENTROPY,
  OP_ADAMW,
  OP_CHECKPOINT,
  OP_COUNT
};

inline const char *op_name(uint8_t op) {
  static const char *const kNames[OP_COUNT] = {
      "nop", "ctx_create", "ctx_destroy", "recipe_create", "recipe_retain", "recipe_release", "recipe_query",
      "group_create", "group_destroy", "group_query", "autocast_begin", "autocast_end", "autocast_query",
      "linear_create", "linear_destroy", "forward_compute", "forward_save", "forward", "backward", "backward_destroy",
      "residuals_release", "residuals_copy", "state", "scaling_state", "quantize", "dequantize", "cast_transpose",
      "amax", "gemm", "activation_forward", "activation_backward", "malloc", "free", "copy", "tensor_query",
      "context_misc", "wrong_handle", "train_step", "norm_forward", "norm_backward",
      "grouped_create", "grouped_destroy", "grouped_forward", "grouped_backward", "grouped_backward_destroy",
      "grouped_state", "ln_create", "ln_destroy", "ln_forward", "ln_backward", "ln_backward_destroy", "ln_state",
      "cr_size", "cr_forward", "cr_backward", "cr_destroy", "attn_create", "attn_destroy", "attn_forward",
      "attn_backward", "attn_backward_destroy", "attn_caller", "attn_state", "rope", "add", "columns", "embedding",
      "cross_entropy", "adamw", "checkpoint"};
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

}  // namespace fuzz
