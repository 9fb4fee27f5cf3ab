// The bad-input sweep harness. For every TE_API function of te.h (sweep_api.cpp, generated from
// the header) it takes the fixture's valid call (fixtures.cpp) and makes one GoogleTest case per
// mutation of one argument, chosen by the argument's parsed type:
//
//   pointer                  -> NULL (unless the fixture quotes the header allowing NULL)
//   handle                   -> each handle of another type, a destroyed one (destroyed, then an
//                               object of the same type made again), a zeroed 64-byte block, a
//                               freed 64-byte block (reading it is a use-after-free under ASan)
//   options struct           -> struct_size 0 and sizeof - 1; its fields by their types
//   enum (param or field)    -> -1 and INT32_MAX
//   0/1 boolean              -> 2
//   size_t                   -> SIZE_MAX
//   te_tensor (param/field)  -> data NULL, ndim 0 / TE_MAX_DIMS+1, a dim 0 / -1, dims whose
//                               element count overflows int64 ({2^40, 2^40}) or wraps to the valid
//                               count, byte sizes that overflow or wrap, dtype -1 / 99 / a valid
//                               but wrong one, device type 7 / -1 / CUDA, device index -1, FP8
//                               without scale_inv, scaling -1 / 99
//
// Every case runs in a forked child (SWEEP_NO_FORK=1 runs in-process, for a debugger), which
// builds two identical worlds: in the first it makes the valid call (the reference result), in
// the second the bad call, then checks the status, te_last_error(), that watched outputs and the
// library state are unchanged, that objects passed as wrong-type or re-created handles still
// work, and that the valid call then gives the reference result. A crash, a sanitizer report or
// a hang fails only that case, saying in which stage it happened.
#include <fcntl.h>
#include <fnmatch.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "sweep.h"

// Sanitizer defaults for this program: a huge allocation request returns NULL (the library must
// turn it into OUT_OF_MEMORY) instead of aborting the process.
// (Visible: the project compiles with -fvisibility=hidden, and the sanitizer runtimes look these up
// dynamically.)
extern "C" __attribute__((visibility("default"), used)) const char *__asan_default_options() {
  return "allocator_may_return_null=1:detect_leaks=0";
}
extern "C" __attribute__((visibility("default"), used)) const char *__ubsan_default_options() {
  return "print_stacktrace=1";
}

namespace sweep {
namespace {

// ---- lookups ----------------------------------------------------------------------------------

const FunctionInfo *find_function(const std::string &name) {
  for (const FunctionInfo &f : header_functions())
    if (name == f.name) return &f;
  return nullptr;
}
const Fixture *find_fixture(const std::string &name) {
  for (const Fixture &f : fixtures())
    if (f.function == name) return &f;
  return nullptr;
}
const StructInfo *struct_at(int i) {
  return i >= 0 && static_cast<size_t>(i) < header_structs().size ? &header_structs().data[i] : nullptr;
}
const StructInfo *find_struct(const std::string &name) {
  for (const StructInfo &s : header_structs())
    if (name == s.name) return &s;
  return nullptr;
}
bool is_init_function(const std::string &fn) {
  return fn.size() > 5 && fn.compare(fn.size() - 5, 5, "_init") == 0;
}
bool has_context_param(const FunctionInfo &fi) {
  for (size_t i = 0; i < fi.nparams; ++i)
    if (fi.params[i].kind == ParamKind::Handle && std::string(fi.params[i].base) == "te_context") return true;
  return false;
}

template <class T>
T load(const void *p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void store(void *p, T v) {
  std::memcpy(p, &v, sizeof v);
}

std::string gtest_safe(const std::string &s) {
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '-' && i + 1 < s.size() && s[i + 1] == '>') {
      o += '_';
      ++i;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
      o += c;
    } else {
      o += '_';
    }
  }
  return o;
}

// ---- mutations --------------------------------------------------------------------------------

enum class M {
  Null, WrongType, Destroyed, Garbage, GarbageFreed, StructSize0, StructSizeSmall, EnumNeg1, EnumLarge, Bool2, SizeMax,
  DataNull, Ndim0, NdimTooMany, Dim0, DimNeg1, NumelOverflow, NumelWraps, BytesOverflow, BytesWraps,
  DtypeNeg1, Dtype99, DtypeWrong, DeviceType7, DeviceTypeNeg1, DeviceIndexNeg1, DeviceCuda, NoScaleInv,
  ScalingNeg1, Scaling99,
};

const char *mutation_name(M m) {
  switch (m) {
    case M::Null: return "null";
    case M::WrongType: return "wrong_type";
    case M::Destroyed: return "destroyed";
    case M::Garbage: return "garbage";
    case M::GarbageFreed: return "garbage_freed";
    case M::StructSize0: return "struct_size_0";
    case M::StructSizeSmall: return "struct_size_small";
    case M::EnumNeg1: return "enum_neg1";
    case M::EnumLarge: return "enum_large";
    case M::Bool2: return "bool_2";
    case M::SizeMax: return "size_max";
    case M::DataNull: return "data_null";
    case M::Ndim0: return "ndim_0";
    case M::NdimTooMany: return "ndim_9";
    case M::Dim0: return "dim_0";
    case M::DimNeg1: return "dim_neg1";
    case M::NumelOverflow: return "numel_overflow";
    case M::NumelWraps: return "numel_wraps";
    case M::BytesOverflow: return "bytes_overflow";
    case M::BytesWraps: return "bytes_wraps";
    case M::DtypeNeg1: return "dtype_neg1";
    case M::Dtype99: return "dtype_99";
    case M::DtypeWrong: return "dtype_wrong";
    case M::DeviceType7: return "device_type_7";
    case M::DeviceTypeNeg1: return "device_type_neg1";
    case M::DeviceIndexNeg1: return "device_index_neg1";
    case M::DeviceCuda: return "device_cuda";
    case M::NoScaleInv: return "no_scale_inv";
    case M::ScalingNeg1: return "scaling_neg1";
    case M::Scaling99: return "scaling_99";
  }
  return "?";
}

// What a handle type is called in case names: "te_linear_backward_ctx" -> "linear_backward_ctx".
std::string short_type(const std::string &t) { return t.compare(0, 3, "te_") == 0 ? t.substr(3) : t; }

struct Case {
  enum Type { Valid, Mutation, Extra, Problem, Skipped } type = Mutation;
  std::string function, id, test_name;
  int param = -1, field = -1;  // field: index into the param's struct fields, -1 = the param
  std::string path;            // "ctx", "args->input", "opts->device.type"
  M m = M::Null;
  std::string other_type;      // WrongType
  int extra = -1;
  Expect expect;
  std::string message;         // Problem / Skipped
};

// dtype and shape helpers for the tensor mutations.
bool pow2(uint64_t v) { return v && !(v & (v - 1)); }
uint64_t rest_of(const TensorDecl &d) {
  uint64_t r = 1;
  for (size_t i = 1; i < d.shape.size(); ++i) r *= static_cast<uint64_t>(d.shape[i]);
  return r;
}
bool applies(M m, const TensorDecl &d, bool has_ctx) {
  const bool fp8 = d.dtype == TE_DTYPE_E4M3 || d.dtype == TE_DTYPE_E5M2;
  const size_t elem = te_test::dtype_size(d.dtype);
  switch (m) {
    case M::NumelWraps: return d.shape.size() >= 2 && pow2(rest_of(d)) && rest_of(d) >= 2;
    case M::BytesOverflow: return elem > 1;
    case M::BytesWraps: return elem > 1 && pow2(rest_of(d) * elem) && rest_of(d) * elem >= 4;
    case M::NoScaleInv: case M::ScalingNeg1: case M::Scaling99: return fp8;
    case M::DeviceCuda: return has_ctx;
    default: return true;
  }
}
const M kTensorMutations[] = {
    M::DataNull, M::Ndim0, M::NdimTooMany, M::Dim0, M::DimNeg1, M::NumelOverflow, M::NumelWraps,
    M::BytesOverflow, M::BytesWraps, M::DtypeNeg1, M::Dtype99, M::DtypeWrong, M::DeviceType7,
    M::DeviceTypeNeg1, M::DeviceIndexNeg1, M::DeviceCuda, M::NoScaleInv, M::ScalingNeg1, M::Scaling99,
};

struct CaseBuilder {
  const FunctionInfo &fi;
  const Fixture &f;
  std::vector<Case> &out;

  Expect default_expect(const std::string &path) const {
    if (fi.ret == ReturnKind::Void) return no_crash("void: nothing to report");
    if (fi.ret == ReturnKind::Value) return f.getter_default;
    return invalid(path);
  }

  void add(Case c) {
    c.function = fi.name;
    if (c.type == Case::Mutation) c.id = c.path + ":" + mutation_name(c.m) + (c.other_type.empty() ? "" : "_" + short_type(c.other_type));
    if (c.type == Case::Mutation || c.type == Case::Extra) {
      for (auto &s : f.skip)
        if (fnmatch(s.first.c_str(), c.id.c_str(), 0) == 0) {
          c.type = Case::Skipped;
          c.message = s.second;
          break;
        }
    }
    if (c.type == Case::Mutation) {
      c.expect = default_expect(c.path);
      for (auto &e : f.expect)
        if (fnmatch(e.first.c_str(), c.id.c_str(), 0) == 0) {
          c.expect = e.second;
          break;
        }
      if (c.expect.name.empty()) c.expect.name = c.path;
    }
    c.test_name = gtest_safe(std::string(fi.name) + "__" + c.id);
    out.push_back(std::move(c));
  }

  void pointer_null(int p, int field, const std::string &path) {
    auto it = f.null_ok.find(path);
    if (it != f.null_ok.end()) {
      Case c;
      c.type = Case::Skipped;
      c.param = p;
      c.field = field;
      c.path = path;
      c.id = path + ":null";
      c.message = "NULL is allowed: \"" + it->second + "\"";
      add(c);
      return;
    }
    Case c;
    c.param = p;
    c.field = field;
    c.path = path;
    c.m = M::Null;
    add(c);
  }

  void handle(int p, int field, const std::string &path, const std::string &type) {
    pointer_null(p, field, path);
    for (const char *other : header_handle_types()) {
      if (type == other) continue;
      Case c;
      c.param = p;
      c.field = field;
      c.path = path;
      c.m = M::WrongType;
      c.other_type = other;
      if (!World::knows_handle_type(other)) {
        // Reported once, as handle_type_<type>__no_factory, rather than in every case.
        c.type = Case::Skipped;
        c.id = path + ":" + mutation_name(M::WrongType) + "_" + short_type(other);
        c.message = std::string("the world has no ") + other + " yet (see handle_type_" + other + "__no_factory)";
      }
      add(c);
    }
    for (M m : {M::Destroyed, M::Garbage, M::GarbageFreed}) {
      Case c;
      c.param = p;
      c.field = field;
      c.path = path;
      c.m = m;
      add(c);
    }
  }

  void scalar(int p, int field, const std::string &path, M m) {
    Case c;
    c.param = p;
    c.field = field;
    c.path = path;
    c.m = m;
    add(c);
  }

  void tensor(int p, int field, const std::string &path) {
    pointer_null(p, field, path);
    if (fi.ret == ReturnKind::Void) return;
    auto d = f.tensors.find(path);
    if (d == f.tensors.end()) return;  // reported by check_fixture
    for (M m : kTensorMutations)
      if (applies(m, d->second, has_context_param(fi))) scalar(p, field, path, m);
  }

  void build() {
    {
      Case v;
      v.type = Case::Valid;
      v.id = "valid";
      add(v);
    }
    for (size_t i = 0; i < fi.nparams; ++i) {
      const ParamInfo &p = fi.params[i];
      const int pi = static_cast<int>(i);
      const std::string name = p.name;
      const bool is_void = fi.ret == ReturnKind::Void;
      switch (p.kind) {
        case ParamKind::Handle: handle(pi, -1, name, p.base); break;
        case ParamKind::OutHandle: case ParamKind::Struct: case ParamKind::Pointer: pointer_null(pi, -1, name); break;
        case ParamKind::Tensor:
          if (f.filled.count(name)) pointer_null(pi, -1, name);
          else tensor(pi, -1, name);
          break;
        case ParamKind::Options: {
          pointer_null(pi, -1, name);
          if (is_void || is_init_function(fi.name)) break;
          scalar(pi, -1, name, M::StructSize0);
          scalar(pi, -1, name, M::StructSizeSmall);
          if (!p.const_target) break;  // filled by the library: its fields are outputs
          const StructInfo *s = struct_at(p.struct_index);
          for (size_t j = 0; s && j < s->nfields; ++j) {
            const FieldInfo &fd = s->fields[j];
            const int fj = static_cast<int>(j);
            const std::string path = name + "->" + fd.path;
            switch (fd.kind) {
              case FieldKind::Handle: handle(pi, fj, path, fd.base); break;
              case FieldKind::Tensor: tensor(pi, fj, path); break;
              case FieldKind::Pointer: pointer_null(pi, fj, path); break;
              case FieldKind::Enum:
                scalar(pi, fj, path, M::EnumNeg1);
                scalar(pi, fj, path, M::EnumLarge);
                break;
              case FieldKind::Int: case FieldKind::UInt: {
                auto it = int_fields().find(std::string(s->name) + "." + fd.path);
                if (it != int_fields().end() && it->second.first) scalar(pi, fj, path, M::Bool2);
                break;
              }
              default: break;  // struct_size (above), sizes, floats, arrays: the fixture's extras
            }
          }
          break;
        }
        case ParamKind::Enum:
          if (is_void) break;
          scalar(pi, -1, name, M::EnumNeg1);
          scalar(pi, -1, name, M::EnumLarge);
          break;
        case ParamKind::Int: case ParamKind::UInt: {
          auto it = f.ints.find(name);
          if (!is_void && it != f.ints.end() && it->second.first) scalar(pi, -1, name, M::Bool2);
          break;
        }
        case ParamKind::Size:
          if (!is_void) scalar(pi, -1, name, M::SizeMax);
          break;
        default: break;  // int64, uint64, float: the fixture's extras
      }
    }
    for (size_t k = 0; k < f.extras.size(); ++k) {
      Case c;
      c.type = Case::Extra;
      c.extra = static_cast<int>(k);
      c.id = "extra:" + f.extras[k].name;
      c.expect = f.extras[k].expect;
      add(c);
    }
  }
};

// Consistency of a fixture with the header, checked without running anything.
std::vector<std::string> check_fixture(const FunctionInfo &fi, const Fixture &f) {
  std::vector<std::string> errs;
  if (f.args_size != fi.args_size) errs.push_back("fixture args struct size differs from the header's");
  if (fi.ret == ReturnKind::Value && !f.has_getter_default && fi.nparams)
    errs.push_back("getter without its documented result for bad arguments (.getter(...))");
  std::set<std::string> paths, tensor_paths, int_paths;
  for (size_t i = 0; i < fi.nparams; ++i) {
    const ParamInfo &p = fi.params[i];
    paths.insert(p.name);
    if (p.kind == ParamKind::Tensor && !f.filled.count(p.name)) tensor_paths.insert(p.name);
    if (p.kind == ParamKind::Int || p.kind == ParamKind::UInt || p.kind == ParamKind::Int64 ||
        p.kind == ParamKind::UInt64 || p.kind == ParamKind::Float)
      int_paths.insert(p.name);
    if (p.kind == ParamKind::Options && p.const_target) {
      const StructInfo *s = struct_at(p.struct_index);
      for (size_t j = 0; s && j < s->nfields; ++j) {
        std::string path = std::string(p.name) + "->" + s->fields[j].path;
        paths.insert(path);
        if (s->fields[j].kind == FieldKind::Tensor) tensor_paths.insert(path);
        if ((s->fields[j].kind == FieldKind::Int || s->fields[j].kind == FieldKind::UInt) &&
            !int_fields().count(std::string(s->name) + "." + s->fields[j].path))
          errs.push_back("int field " + std::string(s->name) + "." + s->fields[j].path +
                         " is not classified (a 0/1 boolean or not) in int_fields() of fixtures.cpp");
      }
    }
  }
  for (auto &n : f.null_ok)
    if (!paths.count(n.first)) errs.push_back("null_ok names '" + n.first + "', not a parameter or field");
  for (auto &n : f.tensors)
    if (!tensor_paths.count(n.first)) errs.push_back("tensor '" + n.first + "' is not a tensor parameter or field");
  for (auto &n : tensor_paths)
    if (!f.tensors.count(n)) errs.push_back("tensor '" + n + "' has no declaration (.tensor(path, dtype, shape))");
  for (auto &n : int_paths)
    if (!f.ints.count(n))
      errs.push_back("scalar parameter '" + n + "' is not classified (.boolean / .not_boolean with the header's words)");
  for (auto &n : f.ints)
    if (!int_paths.count(n.first)) errs.push_back("ints names '" + n.first + "', not an integer parameter");
  for (auto &n : f.wrong_dtype)
    if (!f.tensors.count(n.first)) errs.push_back("wrong_dtype names '" + n.first + "', not a declared tensor");
  for (auto &n : f.inout)
    if (!paths.count(n)) errs.push_back("inout names '" + n + "', not a parameter");
  for (auto &n : f.filled)
    if (!paths.count(n)) errs.push_back("filled names '" + n + "', not a parameter");
  for (auto &n : f.output_varies)
    if (!paths.count(n.first)) errs.push_back("output_varies names '" + n.first + "', not a parameter");
  return errs;
}

std::vector<Case> build_cases() {
  std::vector<Case> out;
  for (const FunctionInfo &fi : header_functions()) {
    const Fixture *f = find_fixture(fi.name);
    if (!exported_symbol(fi.name)) {
      // Nothing to call: the function's cases would all be vacuous. Its fixture (or the lack of
      // one) is still reported below, so neither gap hides the other.
      Case c;
      c.type = Case::Problem;
      c.function = fi.name;
      c.id = "not_exported";
      c.test_name = gtest_safe(std::string(fi.name) + "__not_exported");
      c.message = std::string(fi.name) + " is declared in te.h but libte.so does not export it";
      out.push_back(c);
      if (f) {
        std::vector<std::string> errs = check_fixture(fi, *f);
        for (size_t k = 0; k < errs.size(); ++k) {
          Case e;
          e.type = Case::Problem;
          e.function = fi.name;
          e.id = "fixture_problem_" + std::to_string(k);
          e.test_name = gtest_safe(std::string(fi.name) + "__" + e.id);
          e.message = std::string(fi.name) + ": " + errs[k];
          out.push_back(e);
        }
        continue;
      }
    }
    if (!f) {
      Case c;
      c.type = Case::Problem;
      c.function = fi.name;
      c.id = "no_fixture";
      c.test_name = gtest_safe(std::string(fi.name) + "__no_fixture");
      c.message = std::string(fi.name) + " is declared in te.h but has no sweep fixture: add its valid call "
                  "to tests/sweep/fixtures.cpp";
      out.push_back(c);
      continue;
    }
    std::vector<std::string> errs = check_fixture(fi, *f);
    for (size_t k = 0; k < errs.size(); ++k) {
      Case c;
      c.type = Case::Problem;
      c.function = fi.name;
      c.id = "fixture_problem_" + std::to_string(k);
      c.test_name = gtest_safe(std::string(fi.name) + "__" + c.id);
      c.message = std::string(fi.name) + ": " + errs[k];
      out.push_back(c);
    }
    CaseBuilder{fi, *f, out}.build();
  }
  for (const Fixture &f : fixtures())
    if (!find_function(f.function)) {
      Case c;
      c.type = Case::Problem;
      c.function = f.function;
      c.id = "not_in_header";
      c.test_name = gtest_safe(f.function + "__not_in_header");
      c.message = "fixtures.cpp has a fixture for " + f.function + ", which te.h does not declare";
      out.push_back(c);
    }
  for (const char *t : header_handle_types())
    if (!World::knows_handle_type(t)) {
      Case c;
      c.type = Case::Problem;
      c.function = t;
      c.id = "no_factory";
      c.test_name = gtest_safe(std::string("handle_type_") + t + "__no_factory");
      c.message = std::string("handle type ") + t + " (te.h) has no factory and probe in tests/sweep/world.cpp";
      out.push_back(c);
    }
  return out;
}

// ---- running one case (in the child) ---------------------------------------------------------

int g_report_fd = 2;

void report(const char *tag, const std::string &text) {
  std::string line = std::string(tag) + " ";
  for (char c : text) line += c == '\n' ? '\x1f' : c;  // one record per line
  line += '\n';
  ssize_t r = ::write(g_report_fd, line.data(), line.size());
  (void)r;
}
void fail(const std::string &text) { report("FAIL", text); }
// Stages carry the child's stderr size when they begin, so that a sanitizer report that does not
// end the process can be placed in the stage that printed it.
void stage(const std::string &text) {
  std::fflush(stderr);
  const off_t at = lseek(2, 0, SEEK_END);
  report("STAGE", std::to_string(static_cast<long long>(at < 0 ? 0 : at)) + " " + text);
}

std::string hex_preview(const unsigned char *p, size_t n) {
  std::ostringstream o;
  static const char *hex = "0123456789abcdef";
  for (size_t i = 0; i < n && i < 24; ++i) o << hex[p[i] >> 4] << hex[p[i] & 15];
  if (n > 24) o << "...";
  return o.str();
}

int64_t numel_of(const te_tensor &t) {
  if (t.ndim < 1 || t.ndim > TE_MAX_DIMS) return 0;
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// Memory a failed call must leave alone, and what the valid call's result consists of.
struct Region {
  void *p;
  size_t n;
  std::string what;
  enum Norm { Bytes, Handle, StructOut } norm = Bytes;
  const StructInfo *s = nullptr;
  bool sentinel = false;     // a pure output: filled with 0xA5 before the call
  size_t keep_prefix = 0;    // bytes kept when filling (struct_size)
};

void tensor_regions(const te_tensor *t, const std::string &what, std::vector<Region> &out) {
  if (!t || !t->data) return;
  const int64_t n = numel_of(*t);
  const int dt = static_cast<int>(t->dtype);
  if (n <= 0 || dt < 0 || dt > TE_DTYPE_E5M2) return;
  out.push_back({t->data, static_cast<size_t>(n) * te_test::dtype_size(t->dtype), what + "->data"});
  if (te_test::is_fp8(t->dtype) && t->scale_inv) {
    int64_t cnt = 0;
    if (te_tensor_scale_inv_count(&cnt, t) == TE_SUCCESS && cnt > 0)
      out.push_back({t->scale_inv, static_cast<size_t>(cnt) * sizeof(float), what + "->scale_inv"});
  }
}

std::vector<Region> collect_regions(World &w, const FunctionInfo &fi, const Fixture &f, unsigned char *args) {
  std::vector<Region> out;
  for (size_t i = 0; i < fi.nparams; ++i) {
    const ParamInfo &p = fi.params[i];
    const bool pointer = p.kind == ParamKind::Handle || p.kind == ParamKind::OutHandle || p.kind == ParamKind::Tensor ||
                         p.kind == ParamKind::Options || p.kind == ParamKind::Struct || p.kind == ParamKind::Pointer;
    if (!pointer) continue;
    void *v = load<void *>(args + p.offset);
    if (!v) continue;
    const std::string name = p.name;
    if (p.const_target) {
      if (p.kind != ParamKind::Options) continue;
      // Outputs reachable through an input struct (te_gemm_options::gelu_input, te_quantize_options::amax).
      const StructInfo *s = struct_at(p.struct_index);
      for (size_t j = 0; s && j < s->nfields; ++j) {
        const FieldInfo &fd = s->fields[j];
        if (fd.const_target || (fd.kind != FieldKind::Tensor && fd.kind != FieldKind::Pointer)) continue;
        void *fv = load<void *>(static_cast<unsigned char *>(v) + fd.offset);
        if (!fv) continue;
        if (fd.kind == FieldKind::Tensor) tensor_regions(static_cast<te_tensor *>(fv), name + "->" + fd.path, out);
        else if (fd.kind == FieldKind::Pointer && fd.pointee_size) out.push_back({fv, fd.pointee_size, name + "->" + fd.path});
      }
      continue;
    }
    switch (p.kind) {
      case ParamKind::OutHandle: {
        Region r{v, sizeof(void *), name, Region::Handle};
        r.sentinel = true;
        out.push_back(r);
        break;
      }
      case ParamKind::Tensor:
        if (f.filled.count(name)) {
          Region r{v, sizeof(te_tensor), name, Region::StructOut, find_struct("te_tensor"), true};
          out.push_back(r);
        } else {
          tensor_regions(static_cast<te_tensor *>(v), name, out);
        }
        break;
      case ParamKind::Options: case ParamKind::Struct: {
        const StructInfo *s = struct_at(p.struct_index);
        if (!s) break;
        Region r{v, s->size, name, Region::StructOut, s};
        r.sentinel = !f.inout.count(name);
        r.keep_prefix = (p.kind == ParamKind::Options && !is_init_function(fi.name)) ? sizeof(size_t) : 0;
        out.push_back(r);
        break;
      }
      case ParamKind::Pointer:
        if (p.pointee_size) {
          Region r{v, p.pointee_size, name, std::strstr(p.type, "**") ? Region::Handle : Region::Bytes};
          r.sentinel = true;
          out.push_back(r);
        }
        break;
      default: break;
    }
  }
  for (auto &r : w.extra_regions) out.push_back({const_cast<void *>(r.p), r.n, r.what});
  for (Region &r : out)
    if (f.output_varies.count(r.what)) r.norm = Region::Handle;  // compared as set / NULL only
  return out;
}

void fill_sentinels(std::vector<Region> &rs) {
  for (Region &r : rs)
    if (r.sentinel && r.n > r.keep_prefix)
      std::memset(static_cast<unsigned char *>(r.p) + r.keep_prefix, 0xA5, r.n - r.keep_prefix);
}

std::vector<std::vector<unsigned char>> snapshot(const std::vector<Region> &rs) {
  std::vector<std::vector<unsigned char>> s;
  for (const Region &r : rs) {
    const auto *p = static_cast<const unsigned char *>(r.p);
    s.emplace_back(p, p + r.n);
  }
  return s;
}

// A region's content with pointers and handles reduced to "set"/"NULL" (they differ between worlds).
void digest_struct(const unsigned char *p, const StructInfo *s, std::ostringstream &o) {
  for (size_t j = 0; j < s->nfields; ++j) {
    const FieldInfo &fd = s->fields[j];
    o << fd.path << "=";
    if (fd.kind == FieldKind::Handle || fd.kind == FieldKind::Tensor || fd.kind == FieldKind::Pointer) {
      o << (load<void *>(p + fd.offset) ? "set" : "NULL");
    } else if (fd.kind == FieldKind::TensorValue) {
      o << "{";
      digest_struct(p + fd.offset, find_struct("te_tensor"), o);
      o << "}";
    } else {
      o << hex_preview(p + fd.offset, fd.size);
    }
    o << ";";
  }
}
std::string digest_region(const Region &r) {
  std::ostringstream o;
  const auto *p = static_cast<const unsigned char *>(r.p);
  if (r.norm == Region::Handle) {
    o << (load<void *>(p) ? "set" : "NULL");
  } else if (r.norm == Region::StructOut && r.s) {
    digest_struct(p, r.s, o);
  } else {
    for (size_t i = 0; i < r.n; ++i) o << static_cast<int>(p[i]) << ",";
  }
  return o.str();
}

std::string digest_result(const FunctionInfo &fi, const CallResult &r, bool with_value) {
  std::ostringstream o;
  if (fi.ret == ReturnKind::Status) o << te_status_string(r.status);
  if (r.has_value && with_value) o << r.value;
  if (r.has_text) o << '"' << (r.text ? r.text : "(NULL)") << '"';
  if (r.has_pointer) o << (r.pointer ? "set" : "NULL");
  return o.str();
}

std::string describe_result(const FunctionInfo &fi, const CallResult &r) {
  std::ostringstream o;
  if (fi.ret == ReturnKind::Status) o << te_status_string(r.status);
  else if (r.has_value) o << r.value;
  else if (r.has_text) o << '"' << (r.text ? r.text : "(NULL)") << '"';
  else if (r.has_pointer) o << r.pointer;
  else o << "(void)";
  return o.str();
}

struct Probes {
  std::vector<std::pair<std::string, void *>> alive;  // (type, object) that must still work
  std::vector<std::string> alive_why;
  std::vector<std::pair<void *, size_t>> zero;        // garbage blocks that must stay zero
  std::string note;
};

// Applies the case's mutation to `args` (a copy of the valid call's). Returns "" or a fixture problem.
std::string apply_mutation(World &w, const FunctionInfo &fi, const Fixture &f, const Case &c, unsigned char *args,
                           Probes &pr) {
  const ParamInfo &p = fi.params[c.param];
  unsigned char *slot = args + p.offset;
  unsigned char *target = slot;
  const FieldInfo *fd = nullptr;
  const StructInfo *s = struct_at(p.struct_index);
  auto copy_struct = [&]() -> unsigned char * {
    void *sp = load<void *>(slot);
    if (!sp || !s) return nullptr;
    auto *copy = static_cast<unsigned char *>(w.block(s->size));
    std::memcpy(copy, sp, s->size);
    store<void *>(slot, copy);
    return copy;
  };
  if (c.field >= 0) {
    fd = &s->fields[c.field];
    unsigned char *copy = copy_struct();
    if (!copy) return "the valid call passes NULL for '" + std::string(p.name) + "'";
    target = copy + fd->offset;
  }
  const std::string handle_type = fd ? fd->base : p.base;
  switch (c.m) {
    case M::Null: store<void *>(target, nullptr); return "";
    case M::WrongType: {
      void *o = w.own(c.other_type);
      if (!o) return "the world has no " + c.other_type;
      store<void *>(target, o);
      pr.alive.push_back({c.other_type, o});
      pr.alive_why.push_back("the world's " + c.other_type + " passed as " + handle_type);
      return "";
    }
    case M::Destroyed: {
      void *old = w.make(handle_type);
      if (!old) return "could not make a " + handle_type + ": " + w.error;
      w.destroy(handle_type, old);
      void *fresh = w.make(handle_type);
      if (!fresh) return "could not make a " + handle_type + ": " + w.error;
      store<void *>(target, old);
      pr.alive.push_back({handle_type, fresh});
      pr.alive_why.push_back("the " + handle_type + " made after destroying the one passed");
      pr.note = old == fresh ? "the new object has the destroyed handle's value" : "";
      return "";
    }
    case M::Garbage: {
      void *g = w.block(64);
      store<void *>(target, g);
      pr.zero.push_back({g, 64});
      return "";
    }
    case M::GarbageFreed: {
      // Never a handle, and not readable: under AddressSanitizer any dereference of it is a
      // reported use-after-free (handles must be resolved without reading the caller's value).
      void *g = std::malloc(64);
      const uintptr_t value = reinterpret_cast<uintptr_t>(g);
      std::free(g);
      store<uintptr_t>(target, value);
      return "";
    }
    case M::StructSize0: case M::StructSizeSmall: {
      unsigned char *copy = copy_struct();
      if (!copy) return "the valid call passes NULL for '" + std::string(p.name) + "'";
      store<size_t>(copy, c.m == M::StructSize0 ? 0 : s->size - 1);
      return "";
    }
    case M::EnumNeg1: case M::EnumLarge: case M::Bool2: {
      if ((fd ? fd->size : p.size) != sizeof(int32_t)) return "not a 32-bit value";
      store<int32_t>(target, c.m == M::EnumNeg1 ? -1 : c.m == M::EnumLarge ? INT32_MAX : 2);
      return "";
    }
    case M::SizeMax: store<size_t>(target, SIZE_MAX); return "";
    default: break;
  }
  // Tensor mutations: a copy of the tensor, changed.
  te_tensor *tp = load<te_tensor *>(target);
  if (!tp) return "the valid call passes NULL for '" + c.path + "'";
  auto *t = static_cast<te_tensor *>(w.block(sizeof(te_tensor)));
  *t = *tp;
  store<te_tensor *>(target, t);
  auto decl = f.tensors.find(c.path);
  if (decl == f.tensors.end()) return "no declaration for tensor '" + c.path + "'";
  uint64_t rest = 1;
  for (int i = 1; i < t->ndim; ++i) rest *= static_cast<uint64_t>(t->shape[i]);
  const uint64_t elem = te_test::dtype_size(t->dtype);
  switch (c.m) {
    case M::DataNull: t->data = nullptr; break;
    case M::Ndim0: t->ndim = 0; break;
    case M::NdimTooMany:
      t->ndim = TE_MAX_DIMS + 1;
      break;
    case M::Dim0: t->shape[0] = 0; break;
    case M::DimNeg1: t->shape[0] = -1; break;
    case M::NumelOverflow:
      if (t->ndim < 2) t->ndim = 2;
      t->shape[0] = t->shape[1] = int64_t(1) << 40;
      break;
    case M::NumelWraps:  // the product is the valid count modulo 2^64
      t->shape[0] += static_cast<int64_t>((~uint64_t(0) / rest) + 1);
      break;
    case M::BytesOverflow:  // about 2^62 elements: the count fits int64, its bytes do not
      t->shape[0] = static_cast<int64_t>((uint64_t(1) << 62) / rest);
      break;
    case M::BytesWraps:  // the byte size is the valid one modulo 2^64
      t->shape[0] += static_cast<int64_t>((~uint64_t(0) / (rest * elem)) + 1);
      break;
    case M::DtypeNeg1: store<int32_t>(&t->dtype, -1); break;
    case M::Dtype99: store<int32_t>(&t->dtype, 99); break;
    case M::DtypeWrong: {
      auto it = f.wrong_dtype.find(c.path);
      te_dtype d = it != f.wrong_dtype.end() ? it->second
                   : t->dtype == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32;
      t->dtype = d;
      if (te_test::is_fp8(d) && !te_test::is_fp8(tp->dtype)) {
        t->scale_inv = w.spare_scale_inv;
        t->scaling = TE_SCALING_PER_TENSOR;
      }
      pr.note = std::string("dtype ") + te_test::dtype_name(tp->dtype) + " -> " + te_test::dtype_name(d);
      break;
    }
    case M::DeviceType7: store<int32_t>(&t->device.type, 7); break;
    case M::DeviceTypeNeg1: store<int32_t>(&t->device.type, -1); break;
    case M::DeviceIndexNeg1: t->device.index = -1; break;
    case M::DeviceCuda: t->device.type = TE_DEVICE_CUDA; t->device.index = 0; break;
    case M::NoScaleInv: t->scale_inv = nullptr; break;
    case M::ScalingNeg1: store<int32_t>(&t->scaling, -1); break;
    case M::Scaling99: store<int32_t>(&t->scaling, 99); break;
    default: return "unknown mutation";
  }
  if (c.m == M::NumelWraps || c.m == M::BytesWraps || c.m == M::BytesOverflow || c.m == M::NumelOverflow) {
    std::ostringstream o;
    o << "shape {";
    for (int i = 0; i < t->ndim; ++i) o << (i ? ", " : "") << t->shape[i];
    o << "}";
    pr.note = o.str();
  }
  (void)decl;
  return "";
}

// The valid call's arguments must match the fixture's declarations.
std::vector<std::string> check_valid_args(const FunctionInfo &fi, const Fixture &f, const unsigned char *args) {
  std::vector<std::string> errs;
  auto check_tensor = [&](const te_tensor *t, const std::string &path) {
    auto d = f.tensors.find(path);
    if (d == f.tensors.end()) return;
    bool same = t->dtype == d->second.dtype && t->ndim == static_cast<int32_t>(d->second.shape.size());
    for (int i = 0; same && i < t->ndim; ++i) same = t->shape[i] == d->second.shape[static_cast<size_t>(i)];
    if (!same) errs.push_back("tensor '" + path + "' differs from its declaration");
  };
  for (size_t i = 0; i < fi.nparams; ++i) {
    const ParamInfo &p = fi.params[i];
    const bool pointer = p.kind == ParamKind::Handle || p.kind == ParamKind::OutHandle || p.kind == ParamKind::Tensor ||
                         p.kind == ParamKind::Options || p.kind == ParamKind::Struct || p.kind == ParamKind::Pointer;
    if (!pointer) continue;
    void *v = load<void *>(args + p.offset);
    if (!v) {
      if (!f.null_ok.count(p.name))
        errs.push_back(std::string("the valid call passes NULL for '") + p.name +
                       "' and the fixture quotes no header words allowing it (null_ok)");
      continue;
    }
    if (p.kind == ParamKind::Tensor && !f.filled.count(p.name)) check_tensor(static_cast<te_tensor *>(v), p.name);
    if (p.kind == ParamKind::Options && p.const_target) {
      const StructInfo *s = struct_at(p.struct_index);
      for (size_t j = 0; s && j < s->nfields; ++j) {
        const FieldInfo &fd = s->fields[j];
        if (fd.kind != FieldKind::Tensor && fd.kind != FieldKind::Handle && fd.kind != FieldKind::Pointer) continue;
        std::string path = std::string(p.name) + "->" + fd.path;
        void *fv = load<void *>(static_cast<unsigned char *>(v) + fd.offset);
        if (!fv) {
          if (!f.null_ok.count(path))
            errs.push_back("the valid call passes NULL for '" + path + "' and the fixture quotes no header words allowing it");
          continue;
        }
        if (fd.kind == FieldKind::Tensor) check_tensor(static_cast<te_tensor *>(fv), path);
      }
    }
  }
  return errs;
}

void prime_last_error(const std::string &fn) {
  if (fn == "te_context_get_device") (void)te_recipe_options_init(nullptr, TE_RECIPE_DELAYED_SCALING);
  else (void)te_context_get_device(nullptr, nullptr);
}

// Does the message name the argument? `names` is a path ("args->input") or alternatives
// ("a|b"). Messages follow te.h's "<function>: argument '<name>': <expected vs. got>"; the
// <name> quoted first must be the path or a part of it ("args->input->data", "x->shape[0]"),
// so a message blaming another argument that merely mentions this one does not count. A message
// without that form must at least contain the path as a whole identifier.
bool names_argument(const std::string &msg, const std::string &names) {
  std::string quoted;
  const size_t a = msg.find("argument '");
  if (a != std::string::npos) {
    const size_t b = a + 10, e = msg.find('\'', b);
    if (e != std::string::npos) quoted = msg.substr(b, e - b);
  }
  size_t start = 0;
  while (start <= names.size()) {
    size_t bar = names.find('|', start);
    std::string n = names.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    if (!n.empty()) {
      if (a == std::string::npos) {
        if (te_test::contains_identifier(msg, n)) return true;
      } else if (quoted.compare(0, n.size(), n) == 0) {
        const char next = quoted.size() > n.size() ? quoted[n.size()] : '\0';
        if (next == '\0' || next == '-' || next == '.' || next == '[') return true;
      }
    }
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return false;
}

struct ValidRun {
  CallResult result;
  std::string digest;
  std::vector<std::string> parts;
};

// Digest of the valid call's observable result: return value, watched outputs, library state.
std::vector<std::string> digest_parts(World &w, const FunctionInfo &fi, const Fixture &f, const CallResult &r,
                                      const std::vector<Region> &regions) {
  std::vector<std::string> parts;
  parts.push_back("result: " + digest_result(fi, r, !f.result_varies));
  for (const Region &rg : regions) parts.push_back(rg.what + ": " + digest_region(rg));
  parts.push_back("state: " + w.state());
  return parts;
}

bool nccl_available() {
  te_nccl_id id;
  return te_nccl_get_unique_id(&id) == TE_SUCCESS;
}

void run_case(const Case &c) {
  const FunctionInfo &fi = *find_function(c.function);
  const Fixture &f = *find_fixture(c.function);
  const std::string fn = fi.name;
  if (f.needs == "no_nccl" && nccl_available()) {
    report("SKIP", "this build has NCCL: the fixture's valid call is only meaningful without it");
    return;
  }

  // World B: the reference valid call.
  stage("building the reference world");
  World wb;
  if (!wb.build()) return fail("world setup failed: " + wb.error);
  std::vector<unsigned char> args_b(fi.args_size, 0);
  stage("fixture setup (reference world)");
  f.setup(wb, args_b.data());
  if (!wb.error.empty()) return fail("fixture setup failed: " + wb.error);
  for (auto &e : check_valid_args(fi, f, args_b.data())) fail("fixture problem: " + e);
  stage("watched outputs (reference world)");
  std::vector<Region> regions_b = collect_regions(wb, fi, f, args_b.data());
  fill_sentinels(regions_b);
  stage("the valid call (reference world)");
  CallResult rb = fi.invoke(args_b.data());
  const std::string rb_error = fi.ret == ReturnKind::Status && rb.status != TE_SUCCESS ? te_last_error() : "";
  bool valid_ok = fi.ret != ReturnKind::Status;
  for (te_status s : f.valid) valid_ok = valid_ok || rb.status == s;
  if (!valid_ok)
    return fail("the fixture's valid call returned " + describe_result(fi, rb) + " (te_last_error: \"" + rb_error +
                "\"); the sweep needs a valid call to mutate");
  if (f.check) {
    stage("the fixture's check of the valid call");
    std::string e = f.check(wb, args_b.data(), rb);
    if (!e.empty()) fail("valid call: " + e);
  }
  stage("digest of the valid call (reference world)");
  std::vector<std::string> ref = digest_parts(wb, fi, f, rb, regions_b);
  if (c.type == Case::Valid) return;

  // World A: the bad call, then the valid call.
  stage("building the world of the bad call");
  World wa;
  if (!wa.build()) return fail("world setup failed: " + wa.error);
  std::vector<unsigned char> args_a(fi.args_size, 0);
  f.setup(wa, args_a.data());
  if (!wa.error.empty()) return fail("fixture setup failed: " + wa.error);
  std::vector<Region> regions = collect_regions(wa, fi, f, args_a.data());
  std::vector<unsigned char> bad(args_a);
  Probes pr;
  Expect ex = c.expect;
  stage("making the mutation");
  if (c.type == Case::Extra) {
    f.extras[static_cast<size_t>(c.extra)].mutate(wa, bad.data());
  } else {
    std::string e = apply_mutation(wa, fi, f, c, bad.data(), pr);
    if (!e.empty()) return fail("fixture problem: " + e);
  }
  if (!wa.error.empty()) return fail("setting up the mutation failed: " + wa.error);
  if (ex.name.empty()) ex.name = c.path;
  fill_sentinels(regions);
  auto before = snapshot(regions);
  stage("state snapshot before the bad call");
  const std::string state0 = wa.state();

  prime_last_error(fn);
  stage("THE BAD CALL (" + c.id + ")" + (pr.note.empty() ? "" : " [" + pr.note + "]"));
  CallResult r = fi.invoke(bad.data());
  const std::string msg = fi.ret == ReturnKind::Status ? te_last_error() : "";
  stage("checking the bad call's outcome");
  const std::string ctx_note = pr.note.empty() ? "" : " [" + pr.note + "]";

  bool rejected = true;  // the checks of a rejected call apply
  switch (ex.kind) {
    case Expect::Reject: case Expect::RejectOrAccept: {
      if (ex.kind == Expect::RejectOrAccept && r.status == rb.status) {
        rejected = false;
        break;
      }
      bool want = false;
      for (te_status s : ex.statuses) want = want || r.status == s;
      if (!want) {
        std::string ws;
        for (te_status s : ex.statuses) ws += std::string(ws.empty() ? "" : " or ") + te_status_string(s);
        fail(std::string(r.status == TE_SUCCESS ? "ACCEPTED the bad argument: " : "wrong status: ") + "returned " +
             te_status_string(r.status) + ", expected " + ws + (ex.why.empty() ? "" : " (\"" + ex.why + "\")") +
             ctx_note + (r.status == TE_SUCCESS ? "" : "; te_last_error: \"" + msg + "\""));
        if (r.status == TE_SUCCESS) rejected = false;
      }
      if (r.status != TE_SUCCESS) {
        const std::string prefix = fn + ":";
        if (msg.compare(0, prefix.size(), prefix) != 0)
          fail("te_last_error does not start with \"" + prefix + "\": \"" + msg + "\"");
        else if (r.status == TE_ERROR_INVALID_ARGUMENT && !names_argument(msg, ex.name))
          fail("te_last_error does not name the argument '" + ex.name + "': \"" + msg + "\"" + ctx_note);
      }
      break;
    }
    case Expect::Accept:
      rejected = false;
      if (r.status != rb.status)
        fail(std::string("returned ") + te_status_string(r.status) + ", expected the valid call's " +
             te_status_string(rb.status) + " (\"" + ex.why + "\"); te_last_error: \"" + msg + "\"");
      break;
    case Expect::NoCrash: break;
    case Expect::Returns: {
      std::string got = describe_result(fi, r);
      switch (ex.ret) {
        case Expect::SameAsValid:
          if (digest_result(fi, r, true) != digest_result(fi, rb, true))
            fail("returned " + got + ", expected the valid call's " + describe_result(fi, rb) + " (\"" + ex.why + "\")" + ctx_note);
          break;
        case Expect::Value:
          if (!r.has_value || r.value != ex.value)
            fail("returned " + got + ", expected " + std::to_string(ex.value) + " (\"" + ex.why + "\")" + ctx_note);
          break;
        case Expect::OneOf: {
          bool any = false;
          std::string vs;
          for (long long v : ex.values) {
            any = any || (r.has_value && r.value == v);
            vs += (vs.empty() ? "" : " or ") + std::to_string(v);
          }
          if (!any) fail("returned " + got + ", expected " + vs + " (\"" + ex.why + "\")" + ctx_note);
          break;
        }
        case Expect::Text:
          if (!r.has_text || !r.text || ex.text != r.text)
            fail("returned " + got + ", expected \"" + ex.text + "\" (\"" + ex.why + "\")" + ctx_note);
          break;
        case Expect::NullPointer:
          if (r.pointer || r.text)
            fail("returned " + got + ", expected NULL (\"" + ex.why + "\")" + ctx_note);
          break;
      }
      break;
    }
  }
  if (rejected) {
    for (size_t i = 0; i < regions.size(); ++i) {
      const auto *p = static_cast<const unsigned char *>(regions[i].p);
      if (std::memcmp(p, before[i].data(), regions[i].n) != 0) {
        size_t at = 0;
        while (at < regions[i].n && p[at] == before[i][at]) ++at;
        fail("output '" + regions[i].what + "' written by the failed call (first change at byte " + std::to_string(at) +
             ": " + hex_preview(before[i].data() + at, regions[i].n - at) + " -> " +
             hex_preview(p + at, regions[i].n - at) + ")");
      }
    }
    stage("state snapshot after the bad call");
    const std::string state1 = wa.state();
    if (state1 != state0) {
      std::istringstream a(state0), b(state1);
      std::string la, lb;
      while (std::getline(a, la) && std::getline(b, lb))
        if (la != lb) {
          fail("library state changed by the failed call: \"" + la.substr(0, 200) + "\" -> \"" + lb.substr(0, 200) + "\"");
          break;
        }
    }
  }
  for (auto &z : pr.zero) {
    const auto *p = static_cast<const unsigned char *>(z.first);
    for (size_t i = 0; i < z.second; ++i)
      if (p[i]) {
        fail("the garbage block passed as a handle was written to");
        break;
      }
  }
  stage("post checks of the mutation");
  for (auto &pc : wa.post_checks) {
    std::string e = pc();
    if (!e.empty()) fail(e);
  }

  // The valid call after the bad one gives the reference result.
  stage("the valid call after the bad one");
  CallResult ra = fi.invoke(args_a.data());
  const std::string ra_error = fi.ret == ReturnKind::Status && ra.status != TE_SUCCESS ? te_last_error() : "";
  stage("digest of the valid call after the bad one");
  std::vector<std::string> got = digest_parts(wa, fi, f, ra, regions);
  if (got.size() != ref.size()) {
    fail("internal: digests of different shapes");
  } else {
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != ref[i]) {
        fail("the valid call after the bad one differs from a fresh world's: " + got[i].substr(0, 300) +
             " vs " + ref[i].substr(0, 300) + (ra_error.empty() ? "" : " (te_last_error: \"" + ra_error + "\")"));
        break;
      }
  }
  stage("probing the objects the bad call was given");
  for (size_t i = 0; i < pr.alive.size(); ++i) {
    std::string e = wa.probe(pr.alive[i].first, pr.alive[i].second);
    if (!e.empty()) fail(pr.alive_why[i] + " no longer works: " + e);
  }
  stage("done");
}

// ---- the forked runner (parent) --------------------------------------------------------------

std::string read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The lines of a sanitizer report worth reading: its headline and the first frames.
std::string sanitizer_excerpt(const std::string &err) {
  std::istringstream in(err);
  std::string line, out;
  int frames = 0, lines = 0;
  bool in_report = false;
  while (std::getline(in, line) && lines < 40) {
    bool head = line.find("ERROR: AddressSanitizer") != std::string::npos ||
                line.find("runtime error:") != std::string::npos ||
                line.find("ERROR: LeakSanitizer") != std::string::npos ||
                line.find("AddressSanitizer:DEADLYSIGNAL") != std::string::npos ||
                line.find("SUMMARY:") != std::string::npos;
    if (head) {
      in_report = true;
      frames = 0;
    }
    bool frame = line.find("    #") == 0;
    if (head || (in_report && frame && frames < 8) ||
        (in_report && (line.find("is located") != std::string::npos || line.find("freed by thread") != std::string::npos ||
                       line.find("previously allocated") != std::string::npos))) {
      out += line + "\n";
      ++lines;
      if (frame) ++frames;
    }
  }
  return out;
}

struct ChildOutcome {
  std::vector<std::string> failures;
  std::string skip;
};

ChildOutcome run_forked(const Case &c) {
  ChildOutcome oc;
  if (std::getenv("SWEEP_NO_FORK")) {
    char path[] = "/tmp/te_sweep_XXXXXX";
    int fd = mkstemp(path);
    g_report_fd = fd;
    run_case(c);
    g_report_fd = 2;
    close(fd);
    std::string rep = read_file(path);
    unlink(path);
    std::istringstream in(rep);
    std::string line;
    while (std::getline(in, line)) {
      if (line.compare(0, 5, "FAIL ") == 0) oc.failures.push_back(line.substr(5));
      if (line.compare(0, 5, "SKIP ") == 0) oc.skip = line.substr(5);
    }
    return oc;
  }
  char rpath[] = "/tmp/te_sweep_report_XXXXXX", epath[] = "/tmp/te_sweep_stderr_XXXXXX";
  int rfd = mkstemp(rpath), efd = mkstemp(epath);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(efd, 2);
    g_report_fd = rfd;
    run_case(c);
    std::fflush(stderr);
    _exit(0);
  }
  int status = 0;
  const int timeout_s = std::getenv("SWEEP_TIMEOUT") ? std::atoi(std::getenv("SWEEP_TIMEOUT")) : 60;
  bool timed_out = false;
  for (int waited_ms = 0;; waited_ms += 5) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (waited_ms > timeout_s * 1000) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    struct timespec ts {0, 5 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
  close(rfd);
  close(efd);
  const std::string rep = read_file(rpath), err = read_file(epath);
  unlink(rpath);
  unlink(epath);
  std::string last_stage = "(before any stage)", report_stage = last_stage;
  size_t first_report = std::string::npos;
  for (const char *head : {"ERROR: AddressSanitizer", "runtime error:", "AddressSanitizer:DEADLYSIGNAL"})
    first_report = std::min(first_report, err.find(head));
  std::istringstream in(rep);
  std::string line;
  while (std::getline(in, line)) {
    for (char &ch : line)
      if (ch == '\x1f') ch = '\n';
    if (line.compare(0, 5, "FAIL ") == 0) {
      oc.failures.push_back(line.substr(5));
    } else if (line.compare(0, 6, "STAGE ") == 0) {
      const size_t sp = line.find(' ', 6);
      const long long at = std::atoll(line.substr(6, sp - 6).c_str());
      last_stage = sp == std::string::npos ? "" : line.substr(sp + 1);
      if (first_report == std::string::npos || static_cast<size_t>(at) <= first_report) report_stage = last_stage;
    } else if (line.compare(0, 5, "SKIP ") == 0) {
      oc.skip = line.substr(5);
    }
  }
  const std::string excerpt = sanitizer_excerpt(err);
  if (timed_out) {
    oc.failures.push_back("HANG: killed after " + std::to_string(timeout_s) + " s in stage: " + last_stage);
  } else if (WIFSIGNALED(status)) {
    oc.failures.push_back("CRASH: killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) +
                          ") in stage: " + last_stage + (excerpt.empty() ? "" : "\n" + excerpt));
  } else if (WEXITSTATUS(status) != 0) {
    oc.failures.push_back("CRASH: exited with status " + std::to_string(WEXITSTATUS(status)) + " in stage: " + last_stage +
                          (excerpt.empty() ? "\n" + err.substr(0, 2000) : "\n" + excerpt));
  } else if (!excerpt.empty()) {
    oc.failures.push_back("SANITIZER report in stage: " + report_stage + "\n" + excerpt);
  }
  return oc;
}

const std::vector<Case> &all_cases() {
  static const std::vector<Case> cases = build_cases();
  return cases;
}

}  // namespace

// ---- GoogleTest -------------------------------------------------------------------------------

class Sweep : public ::testing::TestWithParam<size_t> {};

TEST_P(Sweep, Case) {
  const Case &c = all_cases()[GetParam()];
  switch (c.type) {
    case Case::Problem: FAIL() << c.message;
    case Case::Skipped: GTEST_SKIP() << c.function << " " << c.id << ": " << c.message;
    default: break;
  }
  std::string what = c.function + " " + c.id;
  if (c.type != Case::Valid) {
    what += " -> expect ";
    switch (c.expect.kind) {
      case Expect::Reject:
        for (size_t i = 0; i < c.expect.statuses.size(); ++i)
          what += std::string(i ? "/" : "") + te_status_string(c.expect.statuses[i]);
        what += " naming '" + (c.expect.name.empty() ? c.path : c.expect.name) + "'";
        break;
      case Expect::Accept: what += "acceptance"; break;
      case Expect::RejectOrAccept: what += "rejection or acceptance"; break;
      case Expect::NoCrash: what += "no effect"; break;
      case Expect::Returns: what += "the documented result"; break;
    }
    if (!c.expect.why.empty()) what += " (te.h: \"" + c.expect.why + "\")";
  }
  SCOPED_TRACE(what);
  ChildOutcome oc = run_forked(c);
  if (!oc.skip.empty()) GTEST_SKIP() << oc.skip;
  for (auto &f : oc.failures) ADD_FAILURE() << c.function << " / " << c.id << ": " << f;
}

INSTANTIATE_TEST_SUITE_P(Api, Sweep, ::testing::Range<size_t>(0, all_cases().size()),
                         [](const ::testing::TestParamInfo<size_t> &i) { return all_cases()[i.param].test_name; });

// Summary tests that need no library call: the sweep covers the whole header.
TEST(SweepCoverage, EveryHeaderFunctionHasAFixture) {
  for (const FunctionInfo &fi : header_functions())
    EXPECT_NE(find_fixture(fi.name), nullptr) << fi.name << " (te.h) has no sweep fixture in tests/sweep/fixtures.cpp";
}

TEST(SweepCoverage, EveryHeaderFunctionIsExported) {
  for (const FunctionInfo &fi : header_functions())
    EXPECT_NE(exported_symbol(fi.name), nullptr) << fi.name << " (te.h) is not exported by libte.so";
}

TEST(SweepCoverage, EveryFixtureIsConsistentWithTheHeader) {
  for (const FunctionInfo &fi : header_functions())
    if (const Fixture *f = find_fixture(fi.name))
      for (auto &e : check_fixture(fi, *f)) ADD_FAILURE() << fi.name << ": " << e;
  for (const Fixture &f : fixtures())
    EXPECT_NE(find_function(f.function), nullptr) << "fixture for " << f.function << ", which te.h does not declare";
  for (const char *t : header_handle_types())
    EXPECT_TRUE(World::knows_handle_type(t)) << "handle type " << t << " has no factory in tests/sweep/world.cpp";
}

TEST(SweepCoverage, CaseNamesAreUnique) {
  std::set<std::string> seen;
  for (const Case &c : all_cases()) EXPECT_TRUE(seen.insert(c.test_name).second) << "duplicate case " << c.test_name;
  std::printf("[ sweep    ] %zu functions, %zu cases\n", header_functions().size, all_cases().size());
}

}  // namespace sweep
