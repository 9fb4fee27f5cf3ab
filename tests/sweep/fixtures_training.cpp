// The sweep's fixtures for te.h's training-step ops and checkpoints (te_add, te_split_columns,
// te_concat_columns, te_embedding_*, te_cross_entropy*, te_adamw_*, te_checkpoint_*), and the
// te_checkpoint handle type in the World. fixtures.cpp appends them to its table; the rules are
// the same (one VALID call each, the header's words wherever the generic rules need them).
//
// Functions that te.h declares before libte.so exports them are called here through their
// symbol (dlsym, like the generated invokers), so that the sweep links either way: their cases
// then fail as <function>__not_exported, not the build.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "sweep.h"

namespace sweep {

namespace {

using te_test::make_tensor;
using te_test::random_tensor;

const auto IA = TE_ERROR_INVALID_ARGUMENT;
const auto UNSUP = TE_ERROR_UNSUPPORTED;
const auto OOM = TE_ERROR_OUT_OF_MEMORY;

// ---- calls through the loaded library's symbols -------------------------------------------------

template <class F>
F exported(const char *name) {
  return reinterpret_cast<F>(const_cast<void *>(exported_symbol(name)));
}
template <class F, class... A>
te_status call_symbol(const char *name, A... a) {
  F f = exported<F>(name);
  return f ? f(a...) : TE_ERROR_UNSUPPORTED;
}
template <class F, class... A>
te_status call_exported(World &w, const char *name, A... a) {
  if (!exported_symbol(name)) {
    if (w.error.empty()) w.error = std::string(name) + " is not exported by libte.so";
    return TE_ERROR_UNSUPPORTED;
  }
  return call_symbol<F>(name, a...);
}
// SYM(te_checkpoint_count, ck, &n): the call with te.h's exact type, through the symbol
// (UNSUPPORTED while libte.so lacks it); CALL(w, ...) also records a missing symbol in w.error.
#define SYM(fn, ...) call_symbol<decltype(&::fn)>(#fn, __VA_ARGS__)
#define CALL(w, fn, ...) call_exported<decltype(&::fn)>(w, #fn, __VA_ARGS__)
#define OK(w, fn, ...) (w).ok(CALL(w, fn, __VA_ARGS__), #fn)

// Either outcome (the header leaves it open); a rejection must still name `name`.
Expect either(std::string why, std::string name) {
  Expect e = reject_or_accept(std::move(why));
  e.name = std::move(name);
  return e;
}

int get_int(te_module_kind k) {
  int v;
  std::memcpy(&v, &k, sizeof v);
  return v;
}

HostTensor &input(World &w, te_dtype dt, std::vector<int64_t> shape, uint32_t seed, float lo = -2, float hi = 2) {
  return w.keep(random_tensor(dt, std::move(shape), lo, hi, seed));
}
// Outputs start as the 0xA5 sentinel.
HostTensor &output(World &w, te_dtype dt, std::vector<int64_t> shape) { return w.keep(make_tensor(dt, std::move(shape))); }
HostTensor &i32(World &w, std::vector<int64_t> shape, const std::vector<int32_t> &v) {
  HostTensor &h = w.keep(make_tensor(TE_DTYPE_I32, std::move(shape), TE_SCALING_PER_TENSOR, 0));
  std::memcpy(h.bytes.data(), v.data(), std::min(h.bytes.size(), v.size() * sizeof(int32_t)));
  return h;
}
HostTensor &fp8(World &w, std::vector<int64_t> shape, uint32_t seed) {
  HostTensor &h = w.keep(make_tensor(TE_DTYPE_E4M3, std::move(shape)));
  for (size_t i = 0; i < h.bytes.size(); ++i) h.bytes[i] = static_cast<unsigned char>((seed * 131 + i * 29) % 0x7e);
  return h;
}
float f32_at(const void *p, int64_t i) {
  float f;
  std::memcpy(&f, static_cast<const unsigned char *>(p) + 4 * i, 4);
  return f;
}
std::string mismatch(const char *what, int64_t i, double got, double want) {
  std::ostringstream o;
  o << what << "[" << i << "] = " << got << ", expected " << want;
  return o.str();
}

// ---- tensor mutations of one element of an array argument (te_tensor *const *) -----------------
// The generic rules see such arrays as plain pointers (NULL only); these are the tensor mutations
// of sweep_main.cpp applied to element i, as extras.

struct ElemMutation {
  const char *name;
  std::function<void(te_tensor &)> apply;
};
const std::vector<ElemMutation> &elem_mutations() {
  static const std::vector<ElemMutation> m = {
      {"data_null", [](te_tensor &t) { t.data = nullptr; }},
      {"ndim_0", [](te_tensor &t) { t.ndim = 0; }},
      {"ndim_9", [](te_tensor &t) { t.ndim = TE_MAX_DIMS + 1; }},
      {"dim_0", [](te_tensor &t) { t.shape[0] = 0; }},
      {"dim_neg1", [](te_tensor &t) { t.shape[0] = -1; }},
      {"numel_overflow", [](te_tensor &t) { t.shape[0] = t.shape[1] = int64_t(1) << 40; }},
      {"numel_wraps", [](te_tensor &t) { t.shape[0] += static_cast<int64_t>(~uint64_t(0) / static_cast<uint64_t>(t.shape[1]) + 1); }},
      {"bytes_overflow", [](te_tensor &t) { t.shape[0] = static_cast<int64_t>((uint64_t(1) << 62) / static_cast<uint64_t>(t.shape[1])); }},
      {"dtype_neg1", [](te_tensor &t) { int v = -1; std::memcpy(&t.dtype, &v, sizeof v); }},
      {"dtype_99", [](te_tensor &t) { int v = 99; std::memcpy(&t.dtype, &v, sizeof v); }},
      {"dtype_bf16", [](te_tensor &t) { t.dtype = TE_DTYPE_BF16; }},
      {"device_type_7", [](te_tensor &t) { int v = 7; std::memcpy(&t.device.type, &v, sizeof v); }},
      {"device_type_neg1", [](te_tensor &t) { int v = -1; std::memcpy(&t.device.type, &v, sizeof v); }},
      {"device_index_neg1", [](te_tensor &t) { t.device.index = -1; }},
      {"device_cuda", [](te_tensor &t) { t.device.type = TE_DEVICE_CUDA; t.device.index = 0; }},
  };
  return m;
}

// Element `i` of a kept array of tensor pointers, replaced by a mutated copy (in a new array).
template <class P>
P **mutated_array(World &w, P *const *arr, size_t n, size_t i, const std::function<void(te_tensor &)> &f) {
  std::vector<P *> &copy = w.keep(std::vector<P *>(arr, arr + n));
  te_tensor &t = w.keep(te_tensor(*arr[i]));
  f(t);
  copy[i] = &t;
  return copy.data();
}

// Adds one extra per element mutation of element `i` of the array argument `arr` of A.
template <class A, class P>
Def<A> &array_element_extras(Def<A> &d, const std::string &arr, size_t i, P *const *A::*member, size_t n) {
  const std::string el = arr + "[" + std::to_string(i) + "]";
  for (const ElemMutation &m : elem_mutations()) {
    auto f = m.apply;
    d.extra(el + "_" + m.name,
            [member, n, i, f](World &w, A &a) { a.*member = mutated_array(w, a.*member, n, i, f); },
            invalid(el));
  }
  return d;
}

// ---- columns: x F32 [4, 24] = outputs [4, 8] | [4, 16] ------------------------------------------

std::vector<te_tensor *> &split_outputs(World &w, std::vector<std::vector<int64_t>> shapes, te_dtype dt = TE_DTYPE_F32) {
  std::vector<te_tensor *> &v = w.keep(std::vector<te_tensor *>());
  for (size_t i = 0; i < shapes.size(); ++i) {
    HostTensor &h = dt == TE_DTYPE_E4M3 ? fp8(w, shapes[i], 0) : output(w, dt, shapes[i]);
    if (dt == TE_DTYPE_E4M3) h.fill_byte(0xA5);
    w.watch(h.t.data, h.bytes.size(), "outputs[" + std::to_string(i) + "]");
    v.push_back(h.get());
  }
  return v;
}
std::vector<const te_tensor *> &concat_inputs(World &w, std::vector<std::vector<int64_t>> shapes,
                                              te_dtype dt = TE_DTYPE_F32) {
  std::vector<const te_tensor *> &v = w.keep(std::vector<const te_tensor *>());
  for (size_t i = 0; i < shapes.size(); ++i)
    v.push_back(dt == TE_DTYPE_E4M3 ? fp8(w, shapes[i], static_cast<uint32_t>(i + 1)).get()
                                    : input(w, dt, shapes[i], static_cast<uint32_t>(210 + i)).get());
  return v;
}

// Checks that `whole` [rows, C] is the parts side by side (bytes).
std::string same_columns(const te_tensor &whole, const te_tensor *const *parts, size_t n) {
  const size_t es = te_test::dtype_size(whole.dtype);
  int64_t rows = 1;
  for (int d = 0; d + 1 < whole.ndim; ++d) rows *= whole.shape[d];
  const size_t pitch = static_cast<size_t>(whole.shape[whole.ndim - 1]) * es;
  size_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t width = static_cast<size_t>(parts[i]->shape[parts[i]->ndim - 1]) * es;
    for (int64_t r = 0; r < rows; ++r)
      if (std::memcmp(static_cast<const char *>(whole.data) + r * pitch + off,
                      static_cast<const char *>(parts[i]->data) + r * width, width) != 0)
        return "part " + std::to_string(i) + " row " + std::to_string(r) + " differs from its columns of the whole";
    off += width;
  }
  return off == pitch ? "" : "the parts do not cover the whole";
}

// ---- embedding and cross-entropy data -----------------------------------------------------------

constexpr int64_t kVocab = 10, kDim = 8;
const std::vector<int32_t> kIds = {4, 0, 9, 4, 7, 2};                // [2, 3]
const std::vector<int32_t> kTargets = {3, 0, -100, 9, 5, 1};         // [6], one ignored
constexpr int64_t kCeRows = 6;

// ---- AdamW: one F32 [16, 16] parameter owned by the world's linear ------------------------------

constexpr int64_t kP = World::N;
HostTensor adamw_start(int which) {  // 0 param, 1 grad, 2 exp_avg, 3 exp_avg_sq
  static const float lo[4] = {-1, -1, -0.1f, 0}, hi[4] = {1, 1, 0.1f, 0.01f};
  return random_tensor(TE_DTYPE_F32, {kP, kP}, lo[which], hi[which], static_cast<uint32_t>(301 + which));
}
te_adamw_param &adamw_entry(World &w, bool owned) {
  te_adamw_param &p = w.keep(te_adamw_param{});
  OK(w, te_adamw_param_init, &p);
  p.param = w.keep(adamw_start(0)).get();
  p.grad = w.keep(adamw_start(1)).get();
  p.exp_avg = w.keep(adamw_start(2)).get();
  p.exp_avg_sq = w.keep(adamw_start(3)).get();
  p.model_weight = output(w, TE_DTYPE_F32, {kP, kP}).get();
  p.weight_decay = 1;
  if (owned) {
    p.owner_kind = TE_MODULE_LINEAR;
    p.owner = w.lin;
  }
  return p;
}
te_adamw_options &adamw_opts(World &w) {
  te_adamw_options &o = w.keep(te_adamw_options{});
  OK(w, te_adamw_options_init, &o);
  o.step = 3;
  o.grad_norm = &w.keep(-1.0f);
  return o;
}

// ---- checkpoints ----------------------------------------------------------------------------------

// A file path removed when the case's World goes (both worlds of a case use the same one).
struct TempPath {
  std::string path;
  ~TempPath() {
    if (!path.empty()) unlink(path.c_str());
  }
};
const char *temp_path(World &w, const char *tag) {
  static int serial = 0;
  TempPath &t = w.emplace<TempPath>();
  t.path = "/tmp/te_sweep_" + std::string(tag) + "_" + std::to_string(getpid()) + "_" + std::to_string(serial++) + ".ckpt";
  return t.path.c_str();
}
std::vector<unsigned char> &serialized(World &w, te_checkpoint *ck) {
  size_t n = 0;
  OK(w, te_checkpoint_serialize, ck, nullptr, 0, &n);
  std::vector<unsigned char> &b = w.keep(std::vector<unsigned char>(n));
  OK(w, te_checkpoint_serialize, ck, b.data(), n, &n);
  return b;
}
// A file holding `bytes` (which may be a damaged checkpoint).
const char *file_with(World &w, const std::vector<unsigned char> &bytes, const char *tag) {
  const char *p = temp_path(w, tag);
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char *>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) w.error = std::string("cannot write ") + p;
  return p;
}
// The world's checkpoint, serialised and changed by `m`.
std::vector<unsigned char> &damaged(World &w, std::function<void(std::vector<unsigned char> &)> m) {
  std::vector<unsigned char> &b = w.keep(std::vector<unsigned char>(serialized(w, w.ck)));
  m(b);
  return b;
}
const std::vector<unsigned char> kStateBytes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
std::string long_name(size_t n) { return std::string(n, 'n'); }

}  // namespace

// ---- the te_checkpoint handle type in the World (world.cpp hands it over) -----------------------

bool checkpoint_handle_type(const std::string &t) {
  return t == "te_checkpoint" && exported_symbol("te_checkpoint_create") != nullptr;
}

void *checkpoint_world_object(World &w) {
  if (!exported_symbol("te_checkpoint_create")) return nullptr;
  te_checkpoint *ck = nullptr;
  OK(w, te_checkpoint_create, &ck);
  OK(w, te_checkpoint_put_tensor, ck, w.ctx, "weight", input(w, TE_DTYPE_F32, {4, 8}, 331).get());
  OK(w, te_checkpoint_put_tensor, ck, w.ctx, "ids", i32(w, {3}, {1, 2, 3}).get());
  OK(w, te_checkpoint_put_bytes, ck, "state", kStateBytes.data(), kStateBytes.size());
  return ck;
}

void *checkpoint_make(World &w) {
  te_checkpoint *ck = nullptr;
  OK(w, te_checkpoint_create, &ck);
  const unsigned char b[3] = {7, 8, 9};
  OK(w, te_checkpoint_put_bytes, ck, "made", b, sizeof b);
  return ck;
}

void checkpoint_destroy(void *h) {
  if (auto f = exported<decltype(&::te_checkpoint_destroy)>("te_checkpoint_destroy")) f(static_cast<te_checkpoint *>(h));
}

std::string checkpoint_probe(World &w, void *h) {
  size_t n = 0;
  te_status s = CALL(w, te_checkpoint_count, static_cast<const te_checkpoint *>(h), &n);
  if (s != TE_SUCCESS) return std::string("te_checkpoint_count returned ") + te_status_string(s) + ": " + te_last_error();
  return n >= 1 ? "" : "te_checkpoint_count: the checkpoint lost its records";
}

// Its names and serialised bytes.
std::string checkpoint_state(void *h) {
  const te_checkpoint *ck = static_cast<const te_checkpoint *>(h);
  std::ostringstream o;
  size_t n = 0;
  te_status s = SYM(te_checkpoint_count, ck, &n);
  o << te_status_string(s) << " count=" << n << " names=";
  for (size_t i = 0; s == TE_SUCCESS && i < n; ++i) {
    const char *name = nullptr;
    if (SYM(te_checkpoint_name, ck, i, &name) == TE_SUCCESS && name) o << name << ",";
  }
  size_t bytes = 0;
  s = SYM(te_checkpoint_serialize, ck, nullptr, 0, &bytes);
  std::vector<unsigned char> b(bytes);
  if (s == TE_SUCCESS) s = SYM(te_checkpoint_serialize, ck, b.data(), bytes, &bytes);
  o << " serialized " << te_status_string(s) << " ";
  static const char *hex = "0123456789abcdef";
  for (unsigned char c : b) o << hex[c >> 4] << hex[c & 15];
  return o.str();
}

void add_training_fixtures(std::vector<Fixture> &t) {
  // ---- te_add: a, b, y F32 [4, 32] ------------------------------------------------------------
  t.push_back(Def<args::te_add>([](World &w, args::te_add &a) {
                a.ctx = w.ctx;
                a.a = input(w, TE_DTYPE_F32, {4, 32}, 201).get();
                a.b = input(w, TE_DTYPE_F32, {4, 32}, 202).get();
                a.y = output(w, TE_DTYPE_F32, {4, 32}).get();
              })
                  .tensor("a", TE_DTYPE_F32, {4, 32})
                  .tensor("b", TE_DTYPE_F32, {4, 32})
                  .tensor("y", TE_DTYPE_F32, {4, 32})
                  // F32 -> BF16 would blame b (a's dtype is the reference): an FP8 a is itself wrong.
                  .wrong_dtype("a", TE_DTYPE_E4M3)
                  .extra("b_other_shape", [](World &w, args::te_add &a) { a.b = input(w, TE_DTYPE_F32, {4, 16}, 203).get(); },
                         invalid("b"))
                  .extra("y_same_count_other_shape",
                         [](World &w, args::te_add &a) { a.y = output(w, TE_DTYPE_F32, {32, 4}).get(); },
                         reject({IA}, "a, b, y of one dtype (F32/F16/BF16) and one shape", "y"))
                  .extra("all_i32",
                         [](World &w, args::te_add &a) {
                           a.a = i32(w, {4, 32}, {1, 2}).get();
                           a.b = i32(w, {4, 32}, {3, 4}).get();
                           a.y = output(w, TE_DTYPE_I32, {4, 32}).get();
                         },
                         reject({IA}, "F32/F16/BF16", "a"))
                  .extra("all_e4m3",
                         [](World &w, args::te_add &a) {
                           a.a = fp8(w, {4, 32}, 1).get();
                           a.b = fp8(w, {4, 32}, 2).get();
                           a.y = fp8(w, {4, 32}, 3).get();
                         },
                         reject({IA}, "F32/F16/BF16", "a"))
                  .extra("all_bf16",
                         [](World &w, args::te_add &a) {
                           a.a = input(w, TE_DTYPE_BF16, {4, 32}, 204).get();
                           a.b = input(w, TE_DTYPE_BF16, {4, 32}, 205).get();
                           a.y = output(w, TE_DTYPE_BF16, {4, 32}).get();
                         },
                         accept("a, b, y of one dtype (F32/F16/BF16)"))
                  .extra("all_f16_3d",
                         [](World &w, args::te_add &a) {
                           a.a = input(w, TE_DTYPE_F16, {2, 2, 32}, 206).get();
                           a.b = input(w, TE_DTYPE_F16, {2, 2, 32}, 207).get();
                           a.y = output(w, TE_DTYPE_F16, {2, 2, 32}).get();
                         },
                         accept("a, b, y of one dtype (F32/F16/BF16) and one shape"))
                  .extra("y_is_a",
                         [](World &w, args::te_add &a) {
                           HostTensor &c = input(w, TE_DTYPE_F32, {4, 32}, 201);
                           a.a = c.get();
                           a.y = c.get();
                         },
                         accept("y may be a or b (in place)"))
                  .extra("y_is_b",
                         [](World &w, args::te_add &a) {
                           HostTensor &c = input(w, TE_DTYPE_F32, {4, 32}, 202);
                           a.b = c.get();
                           a.y = c.get();
                         },
                         accept("y may be a or b (in place)"))
                  .check([](World &, const args::te_add &a, const CallResult &) -> std::string {
                    for (int64_t i = 0; i < 4 * 32; ++i) {
                      const float want = f32_at(a.a->data, i) + f32_at(a.b->data, i);
                      if (f32_at(a.y->data, i) != want) return mismatch("y", i, f32_at(a.y->data, i), want);
                    }
                    return "";
                  }));

  // ---- te_split_columns / te_concat_columns ---------------------------------------------------
  {
    const char *cols_words = "x [rows, c_0 + ... + c_{n-1}] ... outputs[i] [rows, c_i]";
    const char *any_shape = "the same leading shape as x, or any shape of rows * c_i elements whose last dimension is c_i";
    Def<args::te_split_columns> split([](World &w, args::te_split_columns &a) {
      a.ctx = w.ctx;
      a.x = input(w, TE_DTYPE_F32, {4, 24}, 220).get();
      a.outputs = split_outputs(w, {{4, 8}, {4, 16}}).data();
      a.n = 2;
    });
    split.tensor("x", TE_DTYPE_F32, {4, 24})
        // Every dtype is valid for x ("any, FP8 included"): another one mismatches the outputs.
        .expect("x:dtype_wrong", reject({IA}, "One dtype throughout", "x|outputs"))
        .extra("n_0", [](World &, args::te_split_columns &a) { a.n = 0; }, reject({IA}, "1 <= n <= 64", "n"))
        .extra("n_65",
               [](World &w, args::te_split_columns &a) {
                 std::vector<te_tensor *> &v = w.keep(std::vector<te_tensor *>(65, a.outputs[0]));
                 a.outputs = v.data();
                 a.n = 65;
               },
               reject({IA}, "1 <= n <= 64", "n"))
        .extra("n_1_columns_short", [](World &, args::te_split_columns &a) { a.n = 1; },
               reject({IA}, cols_words, "outputs"))
        .extra("outputs_1_null",
               [](World &w, args::te_split_columns &a) {
                 std::vector<te_tensor *> &v = w.keep(std::vector<te_tensor *>(a.outputs, a.outputs + 2));
                 v[1] = nullptr;
                 a.outputs = v.data();
               },
               invalid("outputs[1]"))
        .extra("outputs_1_other_rows",
               [](World &w, args::te_split_columns &a) {
                 a.outputs = mutated_array(w, a.outputs, 2, 1, [](te_tensor &t) { t.shape[0] = 2; });
               },
               reject({IA}, cols_words, "outputs[1]"))
        .extra("outputs_1_columns_short",
               [](World &w, args::te_split_columns &a) {
                 a.outputs = mutated_array(w, a.outputs, 2, 1, [](te_tensor &t) { t.shape[1] = 12; });
               },
               reject({IA}, cols_words, "outputs"))
        .extra("outputs_1_flat",
               [](World &w, args::te_split_columns &a) {
                 a.outputs = mutated_array(w, a.outputs, 2, 1, [](te_tensor &t) {
                   t.ndim = 1;
                   t.shape[0] = 64;
                 });
               },
               reject({IA}, any_shape, "outputs"))
        .extra("outputs_1_e4m3",
               [](World &w, args::te_split_columns &a) {
                 a.outputs = mutated_array(w, a.outputs, 2, 1, [&w](te_tensor &t) {
                   t.dtype = TE_DTYPE_E4M3;
                   t.scale_inv = w.spare_scale_inv;
                 });
               },
               reject({IA}, "One dtype throughout", "outputs[1]"))
        .extra("outputs_1_overlaps_x",
               [](World &w, args::te_split_columns &a) {
                 const te_tensor *x = a.x;
                 a.outputs = mutated_array(w, a.outputs, 2, 1, [x](te_tensor &t) { t.data = x->data; });
               },
               reject({IA}, "outputs must not overlap x", "outputs[1]"))
        .extra("outputs_overlap_each_other",
               [](World &w, args::te_split_columns &a) {
                 void *p0 = a.outputs[0]->data;
                 a.outputs = mutated_array(w, a.outputs, 2, 1, [p0](te_tensor &t) { t.data = p0; });
               },
               either("te.h forbids overlapping x only; outputs overlapping each other leave the result undefined (either "
                      "outcome passes)", "outputs[1]"))
        .extra("outputs_1_leading_shape_2x2",
               [](World &w, args::te_split_columns &a) {
                 a.outputs = mutated_array(w, a.outputs, 2, 1, [](te_tensor &t) {
                   t.ndim = 3;
                   t.shape[0] = 2;
                   t.shape[1] = 2;
                   t.shape[2] = 16;
                 });
               },
               accept(any_shape))
        .extra("x_3d",
               [](World &w, args::te_split_columns &a) {
                 a.x = input(w, TE_DTYPE_F32, {2, 2, 24}, 221).get();
                 a.outputs = split_outputs(w, {{2, 2, 8}, {2, 2, 16}}).data();
               },
               accept("any leading shape; rows = product of the leading dimensions"))
        .extra("all_e4m3",
               [](World &w, args::te_split_columns &a) {
                 a.x = fp8(w, {4, 24}, 5).get();
                 a.outputs = split_outputs(w, {{4, 8}, {4, 16}}, TE_DTYPE_E4M3).data();
               },
               accept("One dtype throughout (any, FP8 included: bytes are moved, scale_inv is not touched)"))
        .extra("all_i32",
               [](World &w, args::te_split_columns &a) {
                 a.x = i32(w, {4, 24}, {1, 2, 3}).get();
                 a.outputs = split_outputs(w, {{4, 8}, {4, 16}}, TE_DTYPE_I32).data();
               },
               accept("One dtype throughout (any, FP8 included)"))
        .extra("n_64",
               [](World &w, args::te_split_columns &a) {
                 a.x = input(w, TE_DTYPE_F32, {2, 64}, 222).get();
                 std::vector<std::vector<int64_t>> shapes(64, std::vector<int64_t>{2, 1});
                 a.outputs = split_outputs(w, shapes).data();
                 a.n = 64;
               },
               accept("1 <= n <= 64"))
        .check([](World &, const args::te_split_columns &a, const CallResult &) {
          return same_columns(*a.x, a.outputs, a.n);
        });
    array_element_extras(split, "outputs", 1, &args::te_split_columns::outputs, 2);
    t.push_back(split);

    Def<args::te_concat_columns> concat([](World &w, args::te_concat_columns &a) {
      a.ctx = w.ctx;
      a.inputs = concat_inputs(w, {{4, 8}, {4, 16}}).data();
      a.n = 2;
      a.y = output(w, TE_DTYPE_F32, {4, 24}).get();
    });
    concat.tensor("y", TE_DTYPE_F32, {4, 24})
        .expect("y:dtype_wrong", reject({IA}, "One dtype throughout", "y|inputs"))
        .extra("n_0", [](World &, args::te_concat_columns &a) { a.n = 0; }, reject({IA}, "1 <= n <= 64", "n"))
        .extra("n_65",
               [](World &w, args::te_concat_columns &a) {
                 std::vector<const te_tensor *> &v = w.keep(std::vector<const te_tensor *>(65, a.inputs[0]));
                 a.inputs = v.data();
                 a.n = 65;
               },
               reject({IA}, "1 <= n <= 64", "n"))
        .extra("n_1_columns_short", [](World &, args::te_concat_columns &a) { a.n = 1; },
               reject({IA}, "concat_columns is its inverse", "inputs"))
        .extra("inputs_1_null",
               [](World &w, args::te_concat_columns &a) {
                 std::vector<const te_tensor *> &v = w.keep(std::vector<const te_tensor *>(a.inputs, a.inputs + 2));
                 v[1] = nullptr;
                 a.inputs = v.data();
               },
               invalid("inputs[1]"))
        .extra("inputs_1_other_rows",
               [](World &w, args::te_concat_columns &a) {
                 a.inputs = mutated_array(w, a.inputs, 2, 1, [](te_tensor &t) { t.shape[0] = 2; });
               },
               invalid("inputs[1]"))
        .extra("inputs_1_e4m3",
               [](World &w, args::te_concat_columns &a) {
                 a.inputs = mutated_array(w, a.inputs, 2, 1, [&w](te_tensor &t) {
                   t.dtype = TE_DTYPE_E4M3;
                   t.scale_inv = w.spare_scale_inv;
                 });
               },
               reject({IA}, "One dtype throughout", "inputs[1]"))
        .extra("y_overlaps_inputs_0",
               [](World &w, args::te_concat_columns &a) {
                 HostTensor &big = output(w, TE_DTYPE_F32, {4, 24});
                 std::vector<const te_tensor *> &v = w.keep(std::vector<const te_tensor *>(a.inputs, a.inputs + 2));
                 te_tensor &in0 = w.keep(te_tensor(*a.inputs[0]));
                 std::memcpy(big.bytes.data(), in0.data, 4 * 8 * 4);
                 in0.data = big.bytes.data();
                 v[0] = &in0;
                 a.inputs = v.data();
                 a.y = big.get();
               },
               reject({IA}, "outputs must not overlap x (concat_columns is its inverse)", "inputs[0]|y"))
        .extra("y_leading_shape_2x2",
               [](World &w, args::te_concat_columns &a) { a.y = output(w, TE_DTYPE_F32, {2, 2, 24}).get(); },
               accept("any leading shape; rows = product of the leading dimensions"))
        .extra("all_bf16",
               [](World &w, args::te_concat_columns &a) {
                 a.inputs = concat_inputs(w, {{4, 8}, {4, 16}}, TE_DTYPE_BF16).data();
                 a.y = output(w, TE_DTYPE_BF16, {4, 24}).get();
               },
               accept("One dtype throughout"))
        .extra("all_e4m3",
               [](World &w, args::te_concat_columns &a) {
                 a.inputs = concat_inputs(w, {{4, 8}, {4, 16}}, TE_DTYPE_E4M3).data();
                 a.y = fp8(w, {4, 24}, 9).get();
               },
               accept("One dtype throughout (any, FP8 included)"))
        .check([](World &, const args::te_concat_columns &a, const CallResult &) {
          return same_columns(*a.y, a.inputs, a.n);
        });
    array_element_extras(concat, "inputs", 1, &args::te_concat_columns::inputs, 2);
    t.push_back(concat);
  }

  // ---- embedding: table F32 [10, 8], ids I32 [2, 3], y F32 [2, 3, 8] ----------------------------
  {
    const char *range_words = "An id outside [0, vocab): the CPU refuses the call (INVALID_ARGUMENT naming the position, "
                              "nothing written)";
    auto with_id = [](int32_t v) {
      return [v](World &w, auto &a) {
        std::vector<int32_t> ids = kIds;
        ids[4] = v;
        a.ids = i32(w, {2, 3}, ids).get();
      };
    };
    t.push_back(
        Def<args::te_embedding_forward>([](World &w, args::te_embedding_forward &a) {
          a.ctx = w.ctx;
          a.table = input(w, TE_DTYPE_F32, {kVocab, kDim}, 230).get();
          a.ids = i32(w, {2, 3}, kIds).get();
          a.y = output(w, TE_DTYPE_F32, {2, 3, kDim}).get();
        })
            .tensor("table", TE_DTYPE_F32, {kVocab, kDim})
            .tensor("ids", TE_DTYPE_I32, {2, 3})
            .tensor("y", TE_DTYPE_F32, {2, 3, kDim})
            .wrong_dtype("table", TE_DTYPE_E4M3)  // BF16 would be a valid table (y then mismatches)
            .extra("id_neg1", with_id(-1), reject({IA}, range_words, "ids"))
            .extra("id_vocab", with_id(static_cast<int32_t>(kVocab)), reject({IA}, range_words, "ids"))
            .extra("id_int_min", with_id(INT32_MIN), reject({IA}, range_words, "ids"))
            .extra("id_int_max", with_id(INT32_MAX), reject({IA}, range_words, "ids"))
            .extra("y_flat_rows",
                   [](World &w, args::te_embedding_forward &a) { a.y = output(w, TE_DTYPE_F32, {6, kDim}).get(); },
                   accept("ids' shape followed by dim (or any shape of n * dim elements whose last dimension is dim)"))
            .extra("y_1d", [](World &w, args::te_embedding_forward &a) { a.y = output(w, TE_DTYPE_F32, {6 * kDim}).get(); },
                   reject({IA}, "any shape of n * dim elements whose last dimension is dim", "y"))
            .extra("y_other_dim",
                   [](World &w, args::te_embedding_forward &a) { a.y = output(w, TE_DTYPE_F32, {2, 3, kDim + 1}).get(); },
                   invalid("y"))
            .extra("y_other_tokens",
                   [](World &w, args::te_embedding_forward &a) { a.y = output(w, TE_DTYPE_F32, {2, 4, kDim}).get(); },
                   invalid("y"))
            .extra("table_1d",
                   [](World &w, args::te_embedding_forward &a) { a.table = input(w, TE_DTYPE_F32, {kVocab * kDim}, 231).get(); },
                   reject({IA}, "table: F32/F16/BF16 [vocab, dim]", "table"))
            .extra("table_bf16_y_bf16",
                   [](World &w, args::te_embedding_forward &a) {
                     a.table = input(w, TE_DTYPE_BF16, {kVocab, kDim}, 232).get();
                     a.y = output(w, TE_DTYPE_BF16, {2, 3, kDim}).get();
                   },
                   accept("table: F32/F16/BF16; y: the table's dtype"))
            .extra("table_f16_y_f32",
                   [](World &w, args::te_embedding_forward &a) {
                     a.table = input(w, TE_DTYPE_F16, {kVocab, kDim}, 233).get();
                   },
                   reject({IA}, "y: the table's dtype", "y|table"))
            .extra("ids_1d",
                   [](World &w, args::te_embedding_forward &a) {
                     a.ids = i32(w, {6}, kIds).get();
                     a.y = output(w, TE_DTYPE_F32, {6, kDim}).get();
                   },
                   accept("ids: I32 of any shape (n tokens, e.g. [batch, seq])"))
            .check([](World &, const args::te_embedding_forward &a, const CallResult &) -> std::string {
              for (int64_t t = 0; t < 6; ++t)
                for (int64_t d = 0; d < kDim; ++d) {
                  const float want = f32_at(a.table->data, kIds[static_cast<size_t>(t)] * kDim + d);
                  if (f32_at(a.y->data, t * kDim + d) != want) return mismatch("y", t * kDim + d, f32_at(a.y->data, t * kDim + d), want);
                }
              return "";
            }));
    t.push_back(
        Def<args::te_embedding_backward>([](World &w, args::te_embedding_backward &a) {
          a.ctx = w.ctx;
          a.ids = i32(w, {2, 3}, kIds).get();
          a.dy = input(w, TE_DTYPE_F32, {2, 3, kDim}, 234).get();
          a.dtable = output(w, TE_DTYPE_F32, {kVocab, kDim}).get();
          a.accumulate = 0;
        })
            .tensor("ids", TE_DTYPE_I32, {2, 3})
            .tensor("dy", TE_DTYPE_F32, {2, 3, kDim})
            .tensor("dtable", TE_DTYPE_F32, {kVocab, kDim})
            .boolean("accumulate", "zeroed first unless accumulate = 1")
            .wrong_dtype("dy", TE_DTYPE_E4M3)  // BF16 is a valid dy
            .extra("id_neg1", with_id(-1), reject({IA}, "Ids out of range: as the forward (CPU: INVALID_ARGUMENT)", "ids"))
            .extra("id_vocab", with_id(static_cast<int32_t>(kVocab)),
                   reject({IA}, "Ids out of range: as the forward (CPU: INVALID_ARGUMENT)", "ids"))
            .extra("id_int_min", with_id(INT32_MIN), reject({IA}, "Ids out of range: as the forward", "ids"))
            .extra("accumulate_1", [](World &, args::te_embedding_backward &a) { a.accumulate = 1; },
                   accept("zeroed first unless accumulate = 1"))
            .extra("dtable_bf16",
                   [](World &w, args::te_embedding_backward &a) { a.dtable = output(w, TE_DTYPE_BF16, {kVocab, kDim}).get(); },
                   reject({IA}, "dtable: F32 [vocab, dim]", "dtable"))
            .extra("dy_bf16",
                   [](World &w, args::te_embedding_backward &a) { a.dy = input(w, TE_DTYPE_BF16, {2, 3, kDim}, 235).get(); },
                   accept("dy: F32/F16/BF16"))
            .extra("dy_flat_rows",
                   [](World &w, args::te_embedding_backward &a) { a.dy = input(w, TE_DTYPE_F32, {6, kDim}, 236).get(); },
                   accept("dy: F32/F16/BF16, n * dim elements, last dimension dim"))
            .extra("dy_other_dim",
                   [](World &w, args::te_embedding_backward &a) { a.dy = input(w, TE_DTYPE_F32, {2, 3, kDim + 1}, 237).get(); },
                   reject({IA}, "n * dim elements, last dimension dim", "dy|dtable"))
            .extra("dy_other_tokens",
                   [](World &w, args::te_embedding_backward &a) { a.dy = input(w, TE_DTYPE_F32, {7, kDim}, 238).get(); },
                   reject({IA}, "n * dim elements", "dy"))
            .check([](World &, const args::te_embedding_backward &a, const CallResult &) -> std::string {
              // Each row sums its tokens in increasing t, in fp32, from zero.
              std::vector<float> want(static_cast<size_t>(kVocab * kDim), 0.0f);
              for (int64_t t = 0; t < 6; ++t)
                for (int64_t d = 0; d < kDim; ++d) want[static_cast<size_t>(kIds[static_cast<size_t>(t)] * kDim + d)] += f32_at(a.dy->data, t * kDim + d);
              for (int64_t i = 0; i < kVocab * kDim; ++i)
                if (f32_at(a.dtable->data, i) != want[static_cast<size_t>(i)])
                  return mismatch("dtable", i, f32_at(a.dtable->data, i), want[static_cast<size_t>(i)]);
              return "";
            }));
  }

  // ---- cross-entropy: logits F32 [6, 10], targets I32 [6] (one ignored), loss F32 [1] ------------
  t.push_back(Def<args::te_cross_entropy_options_init>([](World &w, args::te_cross_entropy_options_init &a) {
                a.opts = &w.keep(te_cross_entropy_options{});
              }).check([](World &, const args::te_cross_entropy_options_init &a, const CallResult &) -> std::string {
    if (a.opts->struct_size != sizeof(te_cross_entropy_options)) return "struct_size is not sizeof";
    if (a.opts->ignore_index != -100) return "ignore_index is not the default -100";
    return a.opts->grad_scale == 1.0f ? "" : "grad_scale is not the default 1";
  }));
  {
    auto opts_with = [](std::function<void(te_cross_entropy_options &)> m) {
      return [m](World &w, args::te_cross_entropy &a) {
        te_cross_entropy_options &o = w.keep(*a.opts);
        m(o);
        a.opts = &o;
      };
    };
    auto with_target = [](int32_t v) {
      return [v](World &w, args::te_cross_entropy &a) {
        std::vector<int32_t> tg = kTargets;
        tg[3] = v;
        a.targets = i32(w, {kCeRows}, tg).get();
      };
    };
    const char *target_words = "A target outside [0, vocab) other than ignore_index: CPU INVALID_ARGUMENT naming the token";
    t.push_back(
        Def<args::te_cross_entropy>([](World &w, args::te_cross_entropy &a) {
          a.ctx = w.ctx;
          te_cross_entropy_options &o = w.keep(te_cross_entropy_options{});
          OK(w, te_cross_entropy_options_init, &o);
          o.grad_scale = 0.5f;
          a.opts = &o;
          a.logits = input(w, TE_DTYPE_F32, {kCeRows, kVocab}, 240, -3, 3).get();
          a.targets = i32(w, {kCeRows}, kTargets).get();
          a.loss = output(w, TE_DTYPE_F32, {1}).get();
          a.dlogits = output(w, TE_DTYPE_F32, {kCeRows, kVocab}).get();
        })
            .tensor("logits", TE_DTYPE_F32, {kCeRows, kVocab})
            .tensor("targets", TE_DTYPE_I32, {kCeRows})
            .tensor("loss", TE_DTYPE_F32, {1})
            .tensor("dlogits", TE_DTYPE_F32, {kCeRows, kVocab})
            .null_ok("opts", "opts may be NULL")
            .null_ok("dlogits", "dlogits: NULL (loss only, e.g. validation)")
            .wrong_dtype("logits", TE_DTYPE_E4M3)  // BF16 logits are valid (dlogits then mismatch)
            .extra("opts_null", [](World &, args::te_cross_entropy &a) { a.opts = nullptr; }, accept("opts may be NULL"))
            .extra("dlogits_null", [](World &, args::te_cross_entropy &a) { a.dlogits = nullptr; },
                   accept("dlogits: NULL (loss only, e.g. validation)"))
            .extra("dlogits_is_logits",
                   [](World &w, args::te_cross_entropy &a) {
                     HostTensor &c = input(w, TE_DTYPE_F32, {kCeRows, kVocab}, 240, -3, 3);
                     a.logits = c.get();
                     a.dlogits = c.get();
                   },
                   accept("may be logits itself (in place)"))
            .extra("target_vocab", with_target(static_cast<int32_t>(kVocab)), reject({IA}, target_words, "targets"))
            .extra("target_neg1", with_target(-1), reject({IA}, target_words, "targets"))
            .extra("target_int_min", with_target(INT32_MIN), reject({IA}, target_words, "targets"))
            .extra("target_int_max", with_target(INT32_MAX), reject({IA}, target_words, "targets"))
            .extra("all_ignored",
                   [](World &w, args::te_cross_entropy &a) {
                     a.targets = i32(w, {kCeRows}, std::vector<int32_t>(kCeRows, -100)).get();
                   },
                   accept("count = 0 gives loss 0 and zero dlogits"))
            .extra("ignore_index_is_a_class",
                   [](World &w, args::te_cross_entropy &a) {
                     te_cross_entropy_options &o = w.keep(*a.opts);
                     o.ignore_index = 3;  // token 2's -100 is then a target out of range: it becomes a 3 too
                     a.opts = &o;
                     std::vector<int32_t> tg = kTargets;
                     tg[2] = 3;
                     a.targets = i32(w, {kCeRows}, tg).get();
                   },
                   accept("mean over the tokens whose target is not ignore_index"))
            .extra("ignore_index_a_class_minus_100_left",
                   [](World &w, args::te_cross_entropy &a) {
                     te_cross_entropy_options &o = w.keep(*a.opts);
                     o.ignore_index = 3;
                     a.opts = &o;
                   },
                   reject({IA}, "A target outside [0, vocab) other than ignore_index: CPU INVALID_ARGUMENT", "targets"))
            .extra("grad_scale_nan", opts_with([](te_cross_entropy_options &o) { o.grad_scale = NAN; }),
                   either("te.h bounds no grad_scale (the implementation refuses non-finite ones)", "opts->grad_scale"))
            .extra("grad_scale_inf", opts_with([](te_cross_entropy_options &o) { o.grad_scale = INFINITY; }),
                   either("te.h bounds no grad_scale (the implementation refuses non-finite ones)", "opts->grad_scale"))
            .extra("targets_7",
                   [](World &w, args::te_cross_entropy &a) {
                     std::vector<int32_t> tg = kTargets;
                     tg.push_back(1);
                     a.targets = i32(w, {kCeRows + 1}, tg).get();
                   },
                   reject({IA}, "targets: I32, n elements", "targets"))
            .extra("targets_2d",
                   [](World &w, args::te_cross_entropy &a) { a.targets = i32(w, {2, 3}, kTargets).get(); },
                   accept("targets: I32, n elements"))
            .extra("logits_3d",
                   [](World &w, args::te_cross_entropy &a) {
                     a.logits = input(w, TE_DTYPE_F32, {2, 3, kVocab}, 241).get();
                     a.dlogits = output(w, TE_DTYPE_F32, {2, 3, kVocab}).get();
                   },
                   accept("logits: F32/F16/BF16 [n, vocab] (or [..., vocab])"))
            .extra("loss_2",
                   [](World &w, args::te_cross_entropy &a) { a.loss = output(w, TE_DTYPE_F32, {2}).get(); },
                   reject({IA}, "loss: F32, one element", "loss"))
            .extra("loss_1x1",
                   [](World &w, args::te_cross_entropy &a) { a.loss = output(w, TE_DTYPE_F32, {1, 1}).get(); },
                   accept("loss: F32, one element"))
            .extra("dlogits_transposed",
                   [](World &w, args::te_cross_entropy &a) { a.dlogits = output(w, TE_DTYPE_F32, {kVocab, kCeRows}).get(); },
                   reject({IA}, "dlogits: logits' dtype and shape", "dlogits"))
            .extra("bf16_logits_and_dlogits",
                   [](World &w, args::te_cross_entropy &a) {
                     a.logits = input(w, TE_DTYPE_BF16, {kCeRows, kVocab}, 242).get();
                     a.dlogits = output(w, TE_DTYPE_BF16, {kCeRows, kVocab}).get();
                   },
                   accept("logits: F32/F16/BF16; dlogits: logits' dtype"))
            .extra("bf16_logits_f32_dlogits",
                   [](World &w, args::te_cross_entropy &a) { a.logits = input(w, TE_DTYPE_BF16, {kCeRows, kVocab}, 243).get(); },
                   reject({IA}, "dlogits: logits' dtype and shape", "dlogits|logits"))
            .check([](World &, const args::te_cross_entropy &a, const CallResult &) -> std::string {
              double loss = 0;
              int count = 0;
              std::vector<double> d(static_cast<size_t>(kCeRows * kVocab), 0.0);
              for (int64_t r = 0; r < kCeRows; ++r) {
                const int32_t tg = kTargets[static_cast<size_t>(r)];
                if (tg == -100) continue;
                ++count;
                double mx = -1e300, s = 0;
                for (int64_t v = 0; v < kVocab; ++v) mx = std::max(mx, (double)f32_at(a.logits->data, r * kVocab + v));
                for (int64_t v = 0; v < kVocab; ++v) s += std::exp((double)f32_at(a.logits->data, r * kVocab + v) - mx);
                loss += mx + std::log(s) - f32_at(a.logits->data, r * kVocab + tg);
                for (int64_t v = 0; v < kVocab; ++v)
                  d[static_cast<size_t>(r * kVocab + v)] =
                      std::exp((double)f32_at(a.logits->data, r * kVocab + v) - mx) / s - (v == tg ? 1.0 : 0.0);
              }
              loss /= count;
              const double got = f32_at(a.loss->data, 0);
              if (!(std::fabs(got - loss) <= 1e-5 * std::max(1.0, std::fabs(loss)))) return mismatch("loss", 0, got, loss);
              for (int64_t i = 0; i < kCeRows * kVocab; ++i) {
                const double want = 0.5 * d[static_cast<size_t>(i)] / count, g = f32_at(a.dlogits->data, i);
                if (!(std::fabs(g - want) <= 1e-6)) return mismatch("dlogits", i, g, want);
              }
              return "";
            }));
  }

  // ---- AdamW ------------------------------------------------------------------------------------
  t.push_back(Def<args::te_adamw_param_init>([](World &w, args::te_adamw_param_init &a) {
                a.param = &w.keep(te_adamw_param{});
              }).check([](World &, const args::te_adamw_param_init &a, const CallResult &) -> std::string {
    const te_adamw_param &p = *a.param;
    if (p.struct_size != sizeof(te_adamw_param)) return "struct_size is not sizeof";
    if (p.param || p.grad || p.exp_avg || p.exp_avg_sq || p.model_weight || p.owner) return "a pointer is not NULL";
    if (p.weight_decay != 1) return "weight_decay is not the default 1";
    return get_int(p.owner_kind) == TE_MODULE_NONE ? "" : "owner_kind is not the default TE_MODULE_NONE";
  }));
  t.push_back(Def<args::te_adamw_options_init>([](World &w, args::te_adamw_options_init &a) {
                a.opts = &w.keep(te_adamw_options{});
              }).check([](World &, const args::te_adamw_options_init &a, const CallResult &) -> std::string {
    const te_adamw_options &o = *a.opts;
    if (o.struct_size != sizeof(te_adamw_options)) return "struct_size is not sizeof";
    if (o.lr != 1e-3f || o.beta1 != 0.9f || o.beta2 != 0.999f || o.eps != 1e-8f || o.weight_decay != 0.01f)
      return "lr / betas / eps / weight_decay are not te.h's defaults";
    if (o.step != 1 || o.max_grad_norm != 0.0f || o.grad_norm) return "step / max_grad_norm / grad_norm are not te.h's defaults";
    return "";
  }));
  {
    using A = args::te_adamw_step;
    auto opts_with = [](std::function<void(te_adamw_options &)> m) {
      return [m](World &w, A &a) {
        te_adamw_options &o = w.keep(*a.opts);
        m(o);
        a.opts = &o;
      };
    };
    auto param_with = [](std::function<void(World &, te_adamw_param &)> m) {
      return [m](World &w, A &a) {
        te_adamw_param &p = w.keep(*a.params);
        m(w, p);
        a.params = &p;
      };
    };
    // Two entries: the fixture's, and a second one (a bias-like [16] vector, no owner) that `m` edits.
    auto two_with = [](std::function<void(World &, te_adamw_param *)> m) {
      return [m](World &w, A &a) {
        std::vector<te_adamw_param> &v = w.keep(std::vector<te_adamw_param>(2, *a.params));
        te_adamw_param &q = v[1];
        q.param = input(w, TE_DTYPE_F32, {kP}, 311, -1, 1).get();
        q.grad = input(w, TE_DTYPE_F32, {kP}, 312, -1, 1).get();
        q.exp_avg = input(w, TE_DTYPE_F32, {kP}, 313, -0.1f, 0.1f).get();
        q.exp_avg_sq = input(w, TE_DTYPE_F32, {kP}, 314, 0, 0.01f).get();
        q.model_weight = nullptr;
        q.weight_decay = 0;
        q.owner_kind = TE_MODULE_NONE;
        q.owner = nullptr;
        m(w, v.data());
        a.params = v.data();
        a.count = 2;
      };
    };
    // An accepted step updates its tensors and its owner's FP8 weight cache: accepted variants work
    // on copies (the same values) and, for the world's linear, a fresh one, so that the valid call
    // after them starts where a fresh world's does.
    auto detach = [](World &w, A &a) {
      te_adamw_options &o = w.keep(*a.opts);
      o.grad_norm = &w.keep(-1.0f);
      a.opts = &o;
      te_adamw_param &p = adamw_entry(w, false);
      p.owner_kind = a.params->owner_kind;
      p.owner = a.params->owner == w.lin ? w.make("te_linear") : a.params->owner;
      a.params = &p;
    };
    auto accepted = [detach](std::function<void(World &, A &)> m) {
      return [detach, m](World &w, A &a) {
        detach(w, a);
        m(w, a);
      };
    };
    const char *range_words = "options out of range: lr < 0, betas outside [0, 1), eps <= 0, step < 1, weight_decay < 0";
    const char *owner_words = "an owner of the wrong kind or whose weight shape differs";
    Def<A> d([](World &w, A &a) {
      a.ctx = w.ctx;
      a.opts = &adamw_opts(w);
      a.params = &adamw_entry(w, true);
      a.count = 1;
    });
    d.tensor("params->param", TE_DTYPE_F32, {kP, kP})
        .tensor("params->grad", TE_DTYPE_F32, {kP, kP})
        .tensor("params->exp_avg", TE_DTYPE_F32, {kP, kP})
        .tensor("params->exp_avg_sq", TE_DTYPE_F32, {kP, kP})
        .tensor("params->model_weight", TE_DTYPE_F32, {kP, kP})
        .null_ok("opts->grad_norm", "optional device float ... Default NULL")
        .null_ok("params->model_weight", "optional (NULL)")
        .null_ok("params->owner", "the module handle of owner_kind, or NULL")
        .wrong_dtype("params->grad", TE_DTYPE_E4M3)          // F16 and BF16 grads are valid
        .wrong_dtype("params->model_weight", TE_DTYPE_E4M3)  // so are such model weights
        .expect("count:size_max", reject({IA}, "params is an array of count entries (SIZE_MAX of them fit no memory)",
                                         "count"));
    // The library names entries as "params[0].<field>" (te.h's "params[0].struct_size").
    for (const char *f : {"struct_size", "param", "grad", "exp_avg", "exp_avg_sq", "model_weight", "weight_decay",
                          "owner_kind", "owner", "owner_gemm"})
      d.expect(std::string("params->") + f + ":*", invalid(std::string("params[0].") + f + "|params->" + f));
    d.expect("params:struct_size_*", invalid("params[0].struct_size|params"))
        .extra("lr_neg", opts_with([](te_adamw_options &o) { o.lr = -1e-3f; }), reject({IA}, range_words, "opts->lr"))
        .extra("lr_nan", opts_with([](te_adamw_options &o) { o.lr = NAN; }), reject({IA}, range_words, "opts->lr"))
        .extra("lr_0", accepted(opts_with([](te_adamw_options &o) { o.lr = 0; })), accept("lr < 0 is out of range; 0 is not"))
        .extra("beta1_1", opts_with([](te_adamw_options &o) { o.beta1 = 1.0f; }), reject({IA}, range_words, "opts->beta1"))
        .extra("beta1_neg", opts_with([](te_adamw_options &o) { o.beta1 = -0.1f; }), reject({IA}, range_words, "opts->beta1"))
        .extra("beta1_0", accepted(opts_with([](te_adamw_options &o) { o.beta1 = 0.0f; })), accept("betas in [0, 1)"))
        .extra("beta2_1", opts_with([](te_adamw_options &o) { o.beta2 = 1.0f; }), reject({IA}, range_words, "opts->beta2"))
        .extra("beta2_nan", opts_with([](te_adamw_options &o) { o.beta2 = NAN; }), reject({IA}, range_words, "opts->beta2"))
        .extra("eps_0", opts_with([](te_adamw_options &o) { o.eps = 0.0f; }), reject({IA}, range_words, "opts->eps"))
        .extra("eps_neg", opts_with([](te_adamw_options &o) { o.eps = -1e-8f; }), reject({IA}, range_words, "opts->eps"))
        .extra("step_0", opts_with([](te_adamw_options &o) { o.step = 0; }), reject({IA}, range_words, "opts->step"))
        .extra("step_int64_min", opts_with([](te_adamw_options &o) { o.step = INT64_MIN; }),
               reject({IA}, range_words, "opts->step"))
        .extra("step_int64_max", accepted(opts_with([](te_adamw_options &o) { o.step = INT64_MAX; })),
               accept("step: this update's number, 1-based (any >= 1)"))
        .extra("weight_decay_neg", opts_with([](te_adamw_options &o) { o.weight_decay = -0.01f; }),
               reject({IA}, range_words, "opts->weight_decay"))
        .extra("max_grad_norm_1", accepted(opts_with([](te_adamw_options &o) { o.max_grad_norm = 1.0f; })),
               accept("> 0: scale every gradient by min(1, max_grad_norm / (norm + 1e-6))"))
        .extra("max_grad_norm_neg", opts_with([](te_adamw_options &o) { o.max_grad_norm = -1.0f; }),
               either("'> 0: clip ... Default 0: off': te.h does not say what a negative one is", "opts->max_grad_norm"))
        .extra("grad_norm_null", accepted(opts_with([](te_adamw_options &o) { o.grad_norm = nullptr; })),
               accept("grad_norm: optional ... Default NULL"))
        .extra("grad_norm_inside_param",
               [](World &w, A &a) {  // the float the step writes lies inside params[0].param
                 te_adamw_options &o = w.keep(*a.opts);
                 o.grad_norm = static_cast<float *>(a.params->param->data) + 3;
                 a.opts = &o;
               },
               reject({IA}, "a tensor given twice (grad_norm's float inside param's memory)", "opts->grad_norm|params[0]"))
        .extra("count_0", [](World &, A &a) { a.count = 0; },
               either("te.h does not say what an empty list does (nothing to update)", "count"))
        .extra("opts_struct_size_0", opts_with([](te_adamw_options &o) { o.struct_size = 0; }), invalid("opts"))
        // One entry's tensors.
        .extra("param_bf16", param_with([](World &w, te_adamw_param &p) { p.param = input(w, TE_DTYPE_BF16, {kP, kP}, 320).get(); }),
               reject({IA}, "param: F32 master weights", "params[0].param"))
        .extra("exp_avg_bf16", param_with([](World &w, te_adamw_param &p) { p.exp_avg = input(w, TE_DTYPE_BF16, {kP, kP}, 321).get(); }),
               reject({IA}, "exp_avg: F32 first moment", "params[0].exp_avg"))
        .extra("exp_avg_sq_f16",
               param_with([](World &w, te_adamw_param &p) { p.exp_avg_sq = input(w, TE_DTYPE_F16, {kP, kP}, 322).get(); }),
               reject({IA}, "exp_avg_sq: F32 second moment", "params[0].exp_avg_sq"))
        .extra("grad_bf16", accepted(param_with([](World &w, te_adamw_param &p) { p.grad = input(w, TE_DTYPE_BF16, {kP, kP}, 323).get(); })),
               accept("grad: F32, F16 or BF16"))
        .extra("model_weight_bf16",
               accepted(param_with([](World &w, te_adamw_param &p) { p.model_weight = output(w, TE_DTYPE_BF16, {kP, kP}).get(); })),
               accept("model_weight: F32/F16/BF16 copy of the new param"))
        .extra("model_weight_null", accepted(param_with([](World &, te_adamw_param &p) { p.model_weight = nullptr; })),
               accept("model_weight: optional (NULL)"))
        .extra("grad_fewer_elements",
               param_with([](World &w, te_adamw_param &p) { p.grad = input(w, TE_DTYPE_F32, {kP, kP - 1}, 324).get(); }),
               reject({IA}, "the same number of elements", "params[0].grad"))
        .extra("exp_avg_more_elements",
               param_with([](World &w, te_adamw_param &p) { p.exp_avg = input(w, TE_DTYPE_F32, {kP + 1, kP}, 325).get(); }),
               reject({IA}, "the same number of elements", "params[0].exp_avg"))
        .extra("exp_avg_flat",
               accepted(param_with([](World &w, te_adamw_param &p) { p.exp_avg = input(w, TE_DTYPE_F32, {kP * kP}, 326, -0.1f, 0.1f).get(); })),
               accept("every tensor ... has the same number of elements"))
        .extra("exp_avg_is_param", param_with([](World &, te_adamw_param &p) { p.exp_avg = p.param; }),
               reject({IA}, "a tensor given twice", "params[0]"))
        .extra("model_weight_is_grad",
               param_with([](World &, te_adamw_param &p) { p.model_weight = const_cast<te_tensor *>(p.grad); }),
               reject({IA}, "a tensor given twice", "params[0]"))
        .extra("exp_avg_sq_overlaps_exp_avg",
               param_with([](World &w, te_adamw_param &p) {
                 te_tensor &c = w.keep(te_tensor(*p.exp_avg_sq));  // half a row after exp_avg
                 HostTensor &room = w.keep(make_tensor(TE_DTYPE_F32, {kP * kP + 8}, TE_SCALING_PER_TENSOR, 0));
                 te_tensor &m = w.keep(te_tensor(*p.exp_avg));
                 m.data = room.bytes.data();
                 c.data = room.bytes.data() + 4 * 8;
                 p.exp_avg = &m;
                 p.exp_avg_sq = &c;
               }),
               reject({IA}, "a tensor given twice (their memory overlaps)", "params[0]"))
        .extra("weight_decay_0", accepted(param_with([](World &, te_adamw_param &p) { p.weight_decay = 0; })),
               accept("0: not (norms, biases, embeddings if wanted)"))
        // Owners.
        .extra("owner_kind_none_with_owner", param_with([](World &, te_adamw_param &p) { p.owner_kind = TE_MODULE_NONE; }),
               reject({IA}, "owner: the module handle of owner_kind, or NULL", "params[0].owner|params[0].owner_kind"))
        .extra("owner_kind_lnl_given_linear",
               param_with([](World &, te_adamw_param &p) { p.owner_kind = TE_MODULE_LAYERNORM_LINEAR; }),
               reject({IA}, owner_words, "params[0].owner"))
        .extra("owner_kind_mlp_given_linear",
               param_with([](World &, te_adamw_param &p) {
                 p.owner_kind = TE_MODULE_LAYERNORM_MLP;
                 p.owner_gemm = TE_MLP_FC1;
               }),
               reject({IA}, owner_words, "params[0].owner"))
        .extra("owner_context", param_with([](World &w, te_adamw_param &p) { p.owner = w.ctx; }),
               reject({IA}, owner_words, "params[0].owner"))
        .extra("owner_recipe", param_with([](World &w, te_adamw_param &p) { p.owner = w.recipe; }),
               reject({IA}, owner_words, "params[0].owner"))
        .extra("owner_destroyed",
               param_with([](World &w, te_adamw_param &p) {
                 void *old = w.make("te_linear");
                 w.destroy("te_linear", old);
                 w.make("te_linear");
                 p.owner = old;
               }),
               reject({IA}, "the module handle of owner_kind", "params[0].owner"))
        .extra("owner_garbage", param_with([](World &w, te_adamw_param &p) { p.owner = w.block(64); }),
               reject({IA}, "the module handle of owner_kind", "params[0].owner"))
        .extra("owner_garbage_freed",
               param_with([](World &, te_adamw_param &p) {
                 void *g = std::malloc(64);
                 const uintptr_t v = reinterpret_cast<uintptr_t>(g);
                 std::free(g);
                 p.owner = reinterpret_cast<const void *>(v);
               }),
               reject({IA}, "the module handle of owner_kind", "params[0].owner"))
        .extra("owner_other_context",
               param_with([](World &w, te_adamw_param &p) {
                 te_context *c2 = static_cast<te_context *>(w.make("te_context"));
                 te_linear_options o;
                 w.ok(te_linear_options_init(&o), "te_linear_options_init");
                 o.in_features = kP;
                 o.out_features = kP;
                 o.activation_dtype = TE_DTYPE_F32;
                 te_linear *l = nullptr;
                 w.ok(te_linear_create(&l, c2, &o), "te_linear_create (other context)");
                 p.owner = l;
               }),
               reject({IA}, "Every tensor lives on the context's device (the owner: the module of another context)",
                      "params[0].owner"))
        .extra("owner_weight_shape_differs",
               param_with([](World &w, te_adamw_param &p) {
                 p.param = input(w, TE_DTYPE_F32, {kP / 2, 2 * kP}, 327).get();
               }),
               reject({IA}, owner_words, "params[0].param|params[0].owner"))
        .extra("owner_layernorm_linear",
               accepted(param_with([](World &w, te_adamw_param &p) {
                 p.owner_kind = TE_MODULE_LAYERNORM_LINEAR;
                 p.owner = w.modules["te_layernorm_linear"];
               })),
               accept("TE_MODULE_LAYERNORM_LINEAR: owner: te_layernorm_linear * (the world's is [16 -> 16])"))
        .extra("owner_mlp_fc1",
               accepted(param_with([](World &w, te_adamw_param &p) {
                 p.owner_kind = TE_MODULE_LAYERNORM_MLP;
                 p.owner = w.modules["te_layernorm_mlp"];
                 p.owner_gemm = TE_MLP_FC1;
               })),
               accept("TE_MODULE_LAYERNORM_MLP: owner: te_layernorm_mlp *, owner_gemm: te_mlp_gemm (fc1 [16, 16])"))
        .extra("owner_mlp_gemm_2",
               param_with([](World &w, te_adamw_param &p) {
                 p.owner_kind = TE_MODULE_LAYERNORM_MLP;
                 p.owner = w.modules["te_layernorm_mlp"];
                 p.owner_gemm = 2;
               }),
               reject({IA}, "owner_gemm: TE_MLP_FC1 / TE_MLP_FC2 for a te_layernorm_mlp", "params[0].owner_gemm"))
        .extra("owner_mlp_gemm_neg1",
               param_with([](World &w, te_adamw_param &p) {
                 p.owner_kind = TE_MODULE_LAYERNORM_MLP;
                 p.owner = w.modules["te_layernorm_mlp"];
                 p.owner_gemm = -1;
               }),
               reject({IA}, "owner_gemm: TE_MLP_FC1 / TE_MLP_FC2 for a te_layernorm_mlp", "params[0].owner_gemm"))
        // Two entries.
        .extra("two_entries", accepted(two_with([](World &, te_adamw_param *) {})), accept("params is an array of count entries"))
        .extra("two_entries_second_struct_size_differs",
               two_with([](World &, te_adamw_param *v) { v[1].struct_size = sizeof(te_adamw_param) - 8; }),
               reject({IA}, "all entries carry the same struct_size", "params[1]"))
        .extra("two_entries_param_given_twice", two_with([](World &, te_adamw_param *v) { v[1] = v[0]; v[1].owner = nullptr; }),
               reject({IA}, "a tensor given twice", "params"))
        .extra("two_entries_second_param_is_first_exp_avg",
               two_with([](World &w, te_adamw_param *v) {
                 v[1].param = v[0].exp_avg;
                 v[1].grad = input(w, TE_DTYPE_F32, {kP, kP}, 330).get();
                 v[1].exp_avg = w.keep(adamw_start(2)).get();
                 v[1].exp_avg_sq = w.keep(adamw_start(3)).get();
               }),
               reject({IA}, "a tensor given twice", "params"))
        .extra("two_entries_shared_grad",
               accepted(two_with([](World &w, te_adamw_param *v) {
                 v[1].param = w.keep(adamw_start(0)).get();
                 v[1].grad = v[0].grad;
                 v[1].exp_avg = w.keep(adamw_start(2)).get();
                 v[1].exp_avg_sq = w.keep(adamw_start(3)).get();
               })),
               either("'a tensor given twice' is refused; te.h does not say whether a gradient read by two params is "
                      "(the implementation allows it)", "params[1].grad"))
        .extra("two_entries_second_grad_cuda",
               two_with([](World &w, te_adamw_param *v) {
                 te_tensor &g = w.keep(te_tensor(*v[1].grad));
                 g.device.type = TE_DEVICE_CUDA;
                 v[1].grad = &g;
               }),
               reject({IA}, "Every tensor lives on the context's device", "params[1].grad"))
        .extra("two_entries_second_owner_same_linear",
               two_with([](World &w, te_adamw_param *v) {
                 v[1].param = w.keep(adamw_start(0)).get();
                 v[1].grad = w.keep(adamw_start(1)).get();
                 v[1].exp_avg = w.keep(adamw_start(2)).get();
                 v[1].exp_avg_sq = w.keep(adamw_start(3)).get();
                 v[1].owner_kind = TE_MODULE_LINEAR;
                 v[1].owner = w.lin;
               }),
               either("te.h does not say whether one module weight may own two params (the implementation refuses it)",
                      "params[1].owner"))
        // Clipping with a non-finite gradient norm skips the whole update.
        .extra("nan_grad_with_clipping",
               [](World &w, A &a) {
                 te_adamw_options &o = w.keep(*a.opts);
                 o.max_grad_norm = 1.0f;
                 a.opts = &o;
                 te_adamw_param &p = w.keep(*a.params);
                 HostTensor &g = w.keep(adamw_start(1));
                 g.set(5, NAN);
                 p.grad = g.get();
                 a.params = &p;
                 const te_tensor *param = p.param, *m = p.exp_avg, *v = p.exp_avg_sq;
                 std::vector<unsigned char> before;
                 for (const te_tensor *x : {param, m, v}) {
                   const auto *b = static_cast<const unsigned char *>(x->data);
                   before.insert(before.end(), b, b + 4 * kP * kP);
                 }
                 w.post_check([param, m, v, before]() -> std::string {
                   size_t at = 0;
                   for (const te_tensor *x : {param, m, v}) {
                     if (std::memcmp(x->data, before.data() + at, 4 * kP * kP) != 0)
                       return "a non-finite norm must skip the whole update (nothing changes), but a tensor changed";
                     at += 4 * kP * kP;
                   }
                   return "";
                 });
               },
               accept("a non-finite norm skips the whole update (nothing changes)"))
        .check([](World &w, const A &a, const CallResult &) -> std::string {
          // PyTorch's AdamW in fp64 from the same starting values (step 3, decay on, no clipping).
          const te_adamw_options &o = *a.opts;
          const HostTensor p0 = adamw_start(0), g = adamw_start(1), m0 = adamw_start(2), v0 = adamw_start(3);
          const te_adamw_param &e = a.params[0];
          double norm = 0;
          for (int64_t i = 0; i < kP * kP; ++i) norm += g.at(i) * g.at(i);
          norm = std::sqrt(norm);
          if (!(std::fabs(*o.grad_norm - norm) <= 1e-5 * norm)) return mismatch("grad_norm", 0, *o.grad_norm, norm);
          const double bc1 = 1 - std::pow((double)o.beta1, (double)o.step), bc2 = 1 - std::pow((double)o.beta2, (double)o.step);
          for (int64_t i = 0; i < kP * kP; ++i) {
            double p = p0.at(i);
            p -= (double)o.lr * o.weight_decay * p;
            const double m = o.beta1 * m0.at(i) + (1 - (double)o.beta1) * g.at(i);
            const double v = o.beta2 * v0.at(i) + (1 - (double)o.beta2) * g.at(i) * g.at(i);
            p -= o.lr * (m / bc1) / (std::sqrt(v / bc2) + o.eps);
            if (!(std::fabs(f32_at(e.exp_avg->data, i) - m) <= 1e-6)) return mismatch("exp_avg", i, f32_at(e.exp_avg->data, i), m);
            if (!(std::fabs(f32_at(e.exp_avg_sq->data, i) - v) <= 1e-7 + 1e-5 * v))
              return mismatch("exp_avg_sq", i, f32_at(e.exp_avg_sq->data, i), v);
            if (!(std::fabs(f32_at(e.param->data, i) - p) <= 2e-6)) return mismatch("param", i, f32_at(e.param->data, i), p);
            if (std::memcmp(static_cast<const char *>(e.param->data) + 4 * i,
                            static_cast<const char *>(e.model_weight->data) + 4 * i, 4) != 0)
              return mismatch("model_weight (F32: the new param exactly)", i, f32_at(e.model_weight->data, i),
                              f32_at(e.param->data, i));
          }
          (void)w;
          return "";
        });
    t.push_back(d);
  }

  // ---- checkpoints ------------------------------------------------------------------------------
  const char *names_words = "Names are 1..255 bytes, unique in a checkpoint";
  t.push_back(Def<args::te_checkpoint_create>([](World &w, args::te_checkpoint_create &a) {
                a.out = &w.keep(static_cast<te_checkpoint *>(nullptr));
              })
                  .check([](World &w, const args::te_checkpoint_create &a, const CallResult &) -> std::string {
                    size_t n = 99;
                    if (CALL(w, te_checkpoint_count, *a.out, &n) != TE_SUCCESS || n != 0) return "a new checkpoint is not empty";
                    checkpoint_destroy(*a.out);
                    return "";
                  }));
  t.push_back(Def<args::te_checkpoint_destroy>([](World &w, args::te_checkpoint_destroy &a) {
    a.ck = static_cast<te_checkpoint *>(w.make("te_checkpoint"));
  }));
  {
    using A = args::te_checkpoint_put_tensor;
    t.push_back(
        Def<A>([](World &w, A &a) {
          a.ck = w.ck;
          a.ctx = w.ctx;
          a.name = "w2";
          a.t = input(w, TE_DTYPE_F32, {4, 8}, 340).get();
        })
            .tensor("t", TE_DTYPE_F32, {4, 8})
            .wrong_dtype("t", TE_DTYPE_E4M3)  // every high-precision dtype is storable
            .expect("t:dtype_wrong", reject({IA}, "FP8 tensors are refused: store their high-precision source", "t"))
            .extra("name_empty", [](World &, A &a) { a.name = ""; }, reject({IA}, names_words, "name"))
            .extra("name_256_bytes", [](World &w, A &a) { a.name = w.keep(long_name(256)).c_str(); },
                   reject({IA}, names_words, "name"))
            .extra("name_255_bytes",
                   [](World &w, A &a) {
                     a.ck = static_cast<te_checkpoint *>(checkpoint_world_object(w));  // a copy: it changes
                     a.name = w.keep(long_name(255)).c_str();
                   },
                   accept(names_words))
            .extra("name_299_bytes_in_a_block",
                   [](World &w, A &a) {
                     char *b = static_cast<char *>(w.block(300));
                     std::memset(b, 'x', 299);
                     a.name = b;
                   },
                   reject({IA}, names_words, "name"))
            .extra("replaces_weight",
                   [](World &w, A &a) {
                     a.ck = static_cast<te_checkpoint *>(checkpoint_world_object(w));  // a copy: it changes
                     a.name = "weight";
                   },
                   accept("Adds (or replaces) record `name`"))
            .extra("replaces_byte_record",
                   [](World &w, A &a) {
                     a.ck = static_cast<te_checkpoint *>(checkpoint_world_object(w));
                     a.name = "state";
                   },
                   accept("Adds (or replaces) record `name`"))
            .extra("t_i32", [](World &w, A &a) { a.t = i32(w, {2, 3}, kIds).get(); },
                   accept("a copy of t's data with its dtype and shape (FP8 tensors are refused)"))
            .extra("t_bf16_3d", [](World &w, A &a) { a.t = input(w, TE_DTYPE_BF16, {2, 2, 3}, 341).get(); },
                   accept("a copy of t's data with its dtype and shape"))
            .extra("t_e5m2",
                   [](World &w, A &a) {
                     HostTensor &h = fp8(w, {4, 8}, 4);
                     h.t.dtype = TE_DTYPE_E5M2;
                     a.t = h.get();
                   },
                   reject({IA}, "FP8 tensors are refused", "t"))
            .check([](World &w, const A &a, const CallResult &) -> std::string {
              HostTensor back = make_tensor(TE_DTYPE_F32, {4, 8});
              if (CALL(w, te_checkpoint_get_tensor, a.ck, a.ctx, "w2", back.get()) != TE_SUCCESS)
                return std::string("te_checkpoint_get_tensor after put: ") + te_last_error();
              return std::memcmp(back.bytes.data(), a.t->data, back.bytes.size()) == 0 ? "" : "the record is not t's data";
            }));
  }
  {
    using A = args::te_checkpoint_put_bytes;
    t.push_back(
        Def<A>([](World &w, A &a) {
          a.ck = w.ck;
          a.name = "step";
          static const unsigned char b[5] = {1, 0, 0, 0, 42};
          a.data = b;
          a.size = sizeof b;
        })
            .expect("size:size_max", reject({IA, OOM}, "a copy of size bytes at data: no buffer holds SIZE_MAX bytes", "size|data"))
            .extra("name_empty", [](World &, A &a) { a.name = ""; }, reject({IA}, names_words, "name"))
            .extra("name_256_bytes", [](World &w, A &a) { a.name = w.keep(long_name(256)).c_str(); },
                   reject({IA}, names_words, "name"))
            .extra("size_0", [](World &, A &a) { a.size = 0; }, accept("byte strings (an empty one is a byte string)"))
            .extra("data_null_size_0",
                   [](World &, A &a) {
                     a.data = nullptr;
                     a.size = 0;
                   },
                   either("te.h does not say whether NULL with size 0 is an empty byte string", "data"))
            .extra("replaces_tensor_record",
                   [](World &w, A &a) {
                     a.ck = static_cast<te_checkpoint *>(checkpoint_world_object(w));  // a copy: it changes
                     a.name = "weight";
                   },
                   accept("Adds (or replaces) record `name`"))
            .check([](World &w, const A &a, const CallResult &) -> std::string {
              unsigned char back[8] = {};
              size_t n = 0;
              if (CALL(w, te_checkpoint_get_bytes, a.ck, "step", back, sizeof back, &n) != TE_SUCCESS)
                return std::string("te_checkpoint_get_bytes after put: ") + te_last_error();
              return n == a.size && std::memcmp(back, a.data, n) == 0 ? "" : "the record is not the bytes put";
            }));
  }
  {
    using A = args::te_checkpoint_get_tensor;
    const char *get_words = "INVALID_ARGUMENT (no such record, a byte record, dtype or shape differs: named in the message)";
    t.push_back(
        Def<A>([](World &w, A &a) {
          a.ck = w.ck;
          a.ctx = w.ctx;
          a.name = "weight";
          a.t = output(w, TE_DTYPE_F32, {4, 8}).get();
        })
            .tensor("t", TE_DTYPE_F32, {4, 8})
            .extra("no_such_record", [](World &, A &a) { a.name = "nope"; }, reject({IA}, get_words, "name"))
            .extra("byte_record", [](World &, A &a) { a.name = "state"; }, reject({IA}, get_words, "name"))
            .extra("name_empty", [](World &, A &a) { a.name = ""; }, reject({IA}, names_words, "name"))
            .extra("t_transposed", [](World &w, A &a) { a.t = output(w, TE_DTYPE_F32, {8, 4}).get(); },
                   reject({IA}, get_words, "t"))
            .extra("t_flat", [](World &w, A &a) { a.t = output(w, TE_DTYPE_F32, {32}).get(); },
                   reject({IA}, "t, which must have the stored dtype and shape", "t"))
            .extra("t_i32_of_f32_record", [](World &w, A &a) { a.t = output(w, TE_DTYPE_I32, {4, 8}).get(); },
                   reject({IA}, get_words, "t"))
            .extra("ids_record",
                   [](World &w, A &a) {
                     a.name = "ids";
                     a.t = output(w, TE_DTYPE_I32, {3}).get();
                   },
                   accept("Copies record `name` into t, which must have the stored dtype and shape"))
            .check([](World &, const A &a, const CallResult &) -> std::string {
              HostTensor want = random_tensor(TE_DTYPE_F32, {4, 8}, -2, 2, 331);
              return std::memcmp(want.bytes.data(), a.t->data, want.bytes.size()) == 0 ? "" : "t is not the stored weight";
            }));
  }
  {
    using A = args::te_checkpoint_get_bytes;
    const char *cap_words = "A capacity below the length: INVALID_ARGUMENT, *size set, buf untouched";
    t.push_back(
        Def<A>([](World &w, A &a) {
          a.ck = w.ck;
          a.name = "state";
          a.buf = w.block(kStateBytes.size());
          a.capacity = kStateBytes.size();
          a.size = &w.keep(size_t(0));
          w.watch(a.buf, kStateBytes.size(), "buf");
        })
            .expect("capacity:size_max", accept("capacity is the caller's buffer size: the record fits"))
            .extra("size_query",
                   [](World &, A &a) {
                     a.buf = nullptr;
                     a.capacity = 0;
                   },
                   accept("buf may be NULL with capacity 0 to ask for it"))
            .extra("capacity_short",
                   [](World &w, A &a) {
                     a.capacity -= 1;
                     // *size is set on this failure (te.h): a size the watched outputs do not include.
                     size_t *s = &w.keep(size_t(0));
                     a.size = s;
                     w.post_check([s]() -> std::string {
                       return *s == kStateBytes.size() ? "" : "a short capacity must still set *size to the length";
                     });
                   },
                   reject({IA}, cap_words, "capacity"))
            .extra("capacity_larger",
                   [](World &w, A &a) {
                     a.buf = w.block(64);
                     a.capacity = 64;
                   },
                   accept("Copies byte record `name` into buf (capacity bytes)"))
            .extra("tensor_record", [](World &, A &a) { a.name = "weight"; },
                   reject({IA}, "byte record `name`", "name"))
            .extra("no_such_record", [](World &, A &a) { a.name = "nope"; }, reject({IA}, "byte record `name`", "name"))
            .check([](World &, const A &a, const CallResult &) -> std::string {
              if (*a.size != kStateBytes.size()) return "*size is not the record's length";
              return std::memcmp(a.buf, kStateBytes.data(), kStateBytes.size()) == 0 ? "" : "buf is not the record";
            }));
  }
  {
    using A = args::te_checkpoint_record_info;
    const char *info_words = "Errors: INVALID_ARGUMENT (NULL ck/name/is_tensor/size, no such record); the outputs are "
                             "then untouched";
    t.push_back(
        Def<A>([](World &w, A &a) {
          a.ck = w.ck;
          a.name = "weight";
          a.is_tensor = &w.keep(int32_t(0));
          a.shape = &w.keep(te_tensor{});
          a.size = &w.keep(size_t(0));
        })
            .filled("shape")
            .null_ok("shape", "shape may be NULL")
            .extra("shape_null", [](World &, A &a) { a.shape = nullptr; }, accept("shape may be NULL"))
            .extra("byte_record", [](World &, A &a) { a.name = "state"; },
                   accept("0 for a byte record (*shape untouched)"))
            .extra("no_such_record", [](World &, A &a) { a.name = "nope"; }, reject({IA}, info_words, "name"))
            .extra("name_empty", [](World &, A &a) { a.name = ""; }, reject({IA}, names_words, "name"))
            .check([](World &, const A &a, const CallResult &) -> std::string {
              const te_tensor &s = *a.shape;
              if (*a.is_tensor != 1) return "*is_tensor is not 1 for a tensor record";
              if (s.dtype != TE_DTYPE_F32 || s.ndim != 2 || s.shape[0] != 4 || s.shape[1] != 8)
                return "*shape is not the record's F32 [4, 8]";
              if (s.data || s.scale_inv || s.device.type != TE_DEVICE_CPU) return "*shape: data and scale_inv NULL, a CPU device";
              return *a.size == 4 * 8 * 4 ? "" : "*size is not the payload's 128 bytes";
            }));
  }
  t.push_back(Def<args::te_checkpoint_count>([](World &w, args::te_checkpoint_count &a) {
                a.ck = w.ck;
                a.count = &w.keep(size_t(0));
              }).check([](World &, const args::te_checkpoint_count &a, const CallResult &) {
    return *a.count == 3 ? "" : "the world's checkpoint has 3 records";
  }));
  t.push_back(Def<args::te_checkpoint_name>([](World &w, args::te_checkpoint_name &a) {
                a.ck = w.ck;
                a.index = 2;
                a.name = &w.keep(static_cast<const char *>(nullptr));
              })
                  .extra("index_count", [](World &, args::te_checkpoint_name &a) { a.index = 3; },
                         reject({IA}, "The name of record `index` (0..count-1)", "index"))
                  .check([](World &, const args::te_checkpoint_name &a, const CallResult &) -> std::string {
                    const std::string n = *a.name ? *a.name : "";
                    return n == "weight" || n == "ids" || n == "state" ? "" : "not a record of the world's checkpoint: " + n;
                  }));
  {
    using A = args::te_checkpoint_write;
    t.push_back(
        Def<A>([](World &w, A &a) {
          a.ck = w.ck;
          a.path = temp_path(w, "write");
        })
            .extra("path_empty", [](World &, A &a) { a.path = ""; }, invalid("path"))
            .extra("path_in_missing_directory", [](World &, A &a) { a.path = "/nonexistent_te_sweep_dir/x.ckpt"; },
                   invalid("path"))
            .extra("path_is_a_directory", [](World &, A &a) { a.path = "/tmp"; }, invalid("path"))
            .check([](World &w, const A &a, const CallResult &) -> std::string {
              te_checkpoint *back = nullptr;
              if (CALL(w, te_checkpoint_read, &back, a.path) != TE_SUCCESS)
                return std::string("te_checkpoint_read of the written file: ") + te_last_error();
              const std::string s0 = checkpoint_state(const_cast<te_checkpoint *>(a.ck)), s1 = checkpoint_state(back);
              checkpoint_destroy(back);
              return s0 == s1 ? "" : "the file read back is not the checkpoint written";
            }));
  }
  {
    using A = args::te_checkpoint_read;
    const char *refused = "a truncated or corrupted file is refused (INVALID_ARGUMENT naming what is wrong) and nothing "
                          "is returned";
    auto file = [](std::function<void(std::vector<unsigned char> &)> m, const char *tag) {
      return [m, tag](World &w, A &a) { a.path = file_with(w, damaged(w, m), tag); };
    };
    t.push_back(
        Def<A>([](World &w, A &a) {
          a.out = &w.keep(static_cast<te_checkpoint *>(nullptr));
          a.path = file_with(w, serialized(w, w.ck), "read");
        })
            .extra("path_empty", [](World &, A &a) { a.path = ""; }, invalid("path"))
            .extra("missing_file", [](World &, A &a) { a.path = "/nonexistent_te_sweep_dir/x.ckpt"; }, invalid("path"))
            .extra("a_directory", [](World &, A &a) { a.path = "/tmp"; }, invalid("path"))
            .extra("empty_file", file([](std::vector<unsigned char> &v) { v.clear(); }, "empty"), reject({IA}, refused, "path"))
            .extra("truncated", file([](std::vector<unsigned char> &v) { v.pop_back(); }, "trunc"), reject({IA}, refused, "path"))
            .extra("half", file([](std::vector<unsigned char> &v) { v.resize(v.size() / 2); }, "half"),
                   reject({IA}, refused, "path"))
            .extra("bad_magic", file([](std::vector<unsigned char> &v) { v[0] ^= 0x20; }, "magic"), reject({IA}, refused, "path"))
            .extra("payload_flipped", file([](std::vector<unsigned char> &v) { v[v.size() / 2] ^= 0x01; }, "flip"),
                   reject({IA}, refused, "path"))
            .extra("checksum_flipped", file([](std::vector<unsigned char> &v) { v.back() ^= 0x80; }, "crc"),
                   reject({IA}, refused, "path"))
            .extra("trailing_byte", file([](std::vector<unsigned char> &v) { v.push_back(0); }, "trail"),
                   reject({IA}, refused, "path"))
            .check([](World &w, const A &a, const CallResult &) -> std::string {
              const std::string s0 = checkpoint_state(w.ck), s1 = checkpoint_state(*a.out);
              checkpoint_destroy(*a.out);
              return s0 == s1 ? "" : "the checkpoint read is not the one written";
            }));
  }
  {
    using A = args::te_checkpoint_serialize;
    t.push_back(
        Def<A>([](World &w, A &a) {
          a.ck = w.ck;
          size_t n = 0;
          OK(w, te_checkpoint_serialize, w.ck, nullptr, 0, &n);
          a.buf = w.block(n);
          a.capacity = n;
          a.size = &w.keep(size_t(0));
          w.watch(a.buf, n, "buf");
        })
            .expect("capacity:size_max", accept("capacity is the caller's buffer size: the checkpoint fits"))
            .extra("size_query",
                   [](World &, A &a) {
                     a.buf = nullptr;
                     a.capacity = 0;
                   },
                   accept("serialise into buf (NULL/0 asks for *size)"))
            .extra("null_buf_with_capacity", [](World &, A &a) { a.buf = nullptr; },
                   reject({IA}, "NULL/0 asks for *size (NULL with a capacity is neither)", "buf"))
            .extra("capacity_short",
                   [](World &w, A &a) {
                     a.capacity -= 1;
                     size_t *s = &w.keep(size_t(0));
                     a.size = s;
                   },
                   invalid("capacity"))
            .check([](World &w, const A &a, const CallResult &) -> std::string {
              te_checkpoint *back = nullptr;
              if (CALL(w, te_checkpoint_deserialize, &back, a.buf, *a.size) != TE_SUCCESS)
                return std::string("te_checkpoint_deserialize of the bytes: ") + te_last_error();
              const std::string s0 = checkpoint_state(const_cast<te_checkpoint *>(a.ck)), s1 = checkpoint_state(back);
              checkpoint_destroy(back);
              return s0 == s1 ? "" : "the bytes do not deserialise to the checkpoint";
            }));
  }
  {
    using A = args::te_checkpoint_deserialize;
    const char *refused = "parse a buffer (checked as a file is): a truncated or corrupted file is refused "
                          "(INVALID_ARGUMENT naming what is wrong)";
    auto bytes = [](std::function<void(std::vector<unsigned char> &)> m) {
      return [m](World &w, A &a) {
        const auto *p = static_cast<const unsigned char *>(a.buf);
        std::vector<unsigned char> &c = w.keep(std::vector<unsigned char>(p, p + a.size));
        m(c);
        a.buf = c.data();
        a.size = c.size();
      };
    };
    t.push_back(
        Def<A>([](World &w, A &a) {
          a.out = &w.keep(static_cast<te_checkpoint *>(nullptr));
          std::vector<unsigned char> &b = serialized(w, w.ck);
          a.buf = b.data();
          a.size = b.size();
        })
            .expect("size:size_max", either("size is the buffer's length: the header bounds nothing but truncation and corruption", "size|buf"))
            .extra("size_0", [](World &, A &a) { a.size = 0; }, reject({IA}, refused, "buf|size"))
            .extra("truncated", bytes([](std::vector<unsigned char> &v) { v.pop_back(); }), reject({IA}, refused, "buf|size"))
            .extra("only_magic", bytes([](std::vector<unsigned char> &v) { v.resize(6); }), reject({IA}, refused, "buf|size"))
            .extra("bad_magic", bytes([](std::vector<unsigned char> &v) { v[1] ^= 0x01; }), reject({IA}, refused, "buf"))
            .extra("other_version", bytes([](std::vector<unsigned char> &v) { v[6] ^= 0x40; }),
                   reject({IA, UNSUP}, "Reading checks the magic, the version, every length and the checksum", "buf"))
            .extra("payload_flipped", bytes([](std::vector<unsigned char> &v) { v[v.size() / 2] ^= 0x10; }),
                   reject({IA}, refused, "buf"))
            .extra("checksum_flipped", bytes([](std::vector<unsigned char> &v) { v[v.size() - 2] ^= 0x01; }),
                   reject({IA}, refused, "buf"))
            .extra("trailing_byte", bytes([](std::vector<unsigned char> &v) { v.push_back(0); }),
                   reject({IA}, refused, "buf|size"))
            .extra("all_ff", bytes([](std::vector<unsigned char> &v) { std::fill(v.begin() + 6, v.end(), 0xFF); }),
                   reject({IA, UNSUP}, refused, "buf"))
            .check([](World &w, const A &a, const CallResult &) -> std::string {
              const std::string s0 = checkpoint_state(w.ck), s1 = checkpoint_state(*a.out);
              checkpoint_destroy(*a.out);
              return s0 == s1 ? "" : "the checkpoint parsed is not the one serialised";
            }));
  }
}

}  // namespace sweep
