// The bad-input sweep: what a fixture (tests/sweep/fixtures.cpp) gives the harness
// (tests/sweep/sweep_main.cpp), and the World every case runs in.
//
// For every TE_API function of te.h (parsed at build time by gen_sweep.py), a fixture builds a
// VALID call. The harness then makes one bad call per mutation of one argument, chosen from the
// argument's parsed type (NULL pointers, wrong-type / destroyed / garbage handles, struct_size,
// enums, booleans, malformed tensors, SIZE_MAX sizes), plus the fixture's hand-written extras,
// and checks the documented contract: the status, te_last_error() naming the function and the
// argument, outputs and library state untouched, and the same valid call still giving the same
// result afterwards. Each case runs in a forked child, so a crash fails only that case.
#pragma once

#include <te/te.h>

#include "api_test_util.h"  // tests/api: HostTensor, make_tensor, random_tensor
#include "sweep_api.h"      // generated: sweep::args::<function>
#include "sweep_model.h"

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace sweep {

using te_test::HostTensor;

// ---- expectations -----------------------------------------------------------------------------

struct Expect {
  enum Kind {
    Reject,          // a status from `statuses`; the message names `name` (INVALID_ARGUMENT)
    Accept,          // the mutated call is valid after all: it must return the valid call's status
    RejectOrAccept,  // either of the two (where the header leaves it open)
    NoCrash,         // void functions: nothing observable may happen
    Returns,         // getters that cannot fail: the documented value
  };
  Kind kind = Reject;
  std::vector<te_status> statuses{TE_ERROR_INVALID_ARGUMENT};
  std::string name;  // the argument the message must name; "" = the mutated path
  std::string why;   // the header's words for anything but the default
  // Returns:
  enum ReturnCheck { SameAsValid, Value, OneOf, Text, NullPointer } ret = SameAsValid;
  long long value = 0;
  std::vector<long long> values;  // OneOf
  std::string text;
};

// INVALID_ARGUMENT (the default for te_status functions) naming `name` ("" = the mutated path).
Expect invalid(std::string name = "");
// Another status class, or several, with the header's words.
Expect reject(std::vector<te_status> statuses, std::string why, std::string name = "");
Expect accept(std::string why);
Expect reject_or_accept(std::string why);
Expect no_crash(std::string why = "");
Expect returns_value(long long v, std::string why);
Expect returns_one_of(std::vector<long long> v, std::string why);
Expect returns_text(std::string s, std::string why);
Expect returns_null(std::string why);
Expect returns_as_valid(std::string why);

// ---- the world --------------------------------------------------------------------------------

// Objects every case may use. The linear `lin` has taken one FP8 step (forward in a scope with
// `recipe`, backward), so its scaling states hold values that a bad call could disturb; `bwd` is
// that step's backward context (still callable). Factories make fresh objects for the handle
// mutations ("destroyed": make, destroy, make another of the same type, pass the first).
struct World {
  static constexpr int64_t N = 16;
  te_context *ctx = nullptr;
  te_recipe *recipe = nullptr;  // delayed scaling, amax_history_len 16
  te_group *group = nullptr;    // single-rank
  te_linear *lin = nullptr;     // [16 -> 16], F32, bias
  te_linear *lin_aux = nullptr; // same shape; backward contexts of the factories come from it
  te_linear_backward_ctx *bwd = nullptr;
  // Records "weight" (F32 [4, 8]), "ids" (I32 [3]) and "state" (12 bytes); NULL while libte.so
  // does not export te_checkpoint_create (its state is part of state()).
  te_checkpoint *ck = nullptr;
  // The world's object of each module handle type whose factory lives in fixtures.cpp
  // (te_grouped_linear, te_layernorm_linear, ... and their backward contexts), made by build().
  std::map<std::string, void *> modules;
  HostTensor x, w, b, y, dy, dx, dw, db;  // lin's: x, W [16,16], b [16], y, dy, dx, dW, db
  float spare_scale_inv[4096];            // scale_inv storage for tensors mutated to FP8

  std::string error;  // the first failure while building the world or a fixture

  // Builds everything above; false (with `error`) when a valid setup call fails.
  bool build();
  // Records a failed setup call (returns s == TE_SUCCESS).
  bool ok(te_status s, const std::string &what);

  // Keeps a value alive (at a stable address) until the case ends.
  template <class T>
  T &keep(T v) {
    auto p = std::make_shared<T>(std::move(v));
    objects_.push_back(p);
    return *p;
  }
  // A default-constructed T made in place (for types holding pointers into themselves).
  template <class T>
  T &emplace() {
    auto p = std::make_shared<T>();
    objects_.push_back(p);
    return *p;
  }
  // Named values a fixture's setup leaves for its extras (e.g. a second scope's token).
  std::map<std::string, uint64_t> values;
  // A zeroed heap block of `n` bytes, alive until the case ends.
  void *block(size_t n);

  // Output memory the generic rules cannot see (void * buffers, arrays): compared around the
  // bad call, and part of the valid call's result.
  void watch(const void *p, size_t n, std::string what);
  // More library state to compare before/after the bad call (e.g. a second linear's state).
  void add_state(std::function<std::string()> f);
  // A check run after the bad call ("" = fine).
  void post_check(std::function<std::string()> f);

  // Handles by type name ("te_context", ...): the world's own object, and factories.
  void *own(const std::string &type) const;
  void *make(const std::string &type);
  void destroy(const std::string &type, void *h);
  std::string probe(const std::string &type, void *h);  // "" when h is alive and works
  static bool knows_handle_type(const std::string &type);

  // The state a bad call must not change: lin's saved state, ctx's autocast state, stats and
  // device, and everything add_state registered.
  std::string state();

  struct Region {
    const void *p;
    size_t n;
    std::string what;
  };
  std::vector<Region> extra_regions;
  std::vector<std::function<std::string()>> extra_state, post_checks;

 private:
  std::vector<std::shared_ptr<void>> objects_;
};

// Opens an enabled autocast scope with the world's recipe (fixtures that want the FP8 path).
void begin_fp8_scope(World &w);

// ---- fixtures ---------------------------------------------------------------------------------

struct TensorDecl {
  te_dtype dtype;
  std::vector<int64_t> shape;
};

struct ExtraCase {
  std::string name;
  std::function<void(World &, void *args)> mutate;
  Expect expect;
};

struct Fixture {
  std::string function;
  size_t args_size = 0;
  std::function<void(World &, void *args)> setup;
  std::vector<te_status> valid{TE_SUCCESS};  // statuses the valid call may return
  std::string valid_why;
  std::map<std::string, std::string> null_ok;            // path -> header's words
  std::map<std::string, std::pair<bool, std::string>> ints;  // int param -> (is a 0/1 boolean, why)
  std::map<std::string, TensorDecl> tensors;             // tensor path -> dtype and shape
  std::map<std::string, te_dtype> wrong_dtype;           // tensor path -> a valid-but-wrong dtype
  std::set<std::string> inout;    // non-const struct params that are read (no sentinel fill)
  std::set<std::string> filled;   // te_tensor * params written whole, as a struct (no data)
  std::map<std::string, std::string> output_varies;  // outputs that differ between worlds -> why
  std::vector<std::pair<std::string, Expect>> expect;    // "path:mutation" glob -> expectation
  std::vector<std::pair<std::string, std::string>> skip; // "path:mutation" glob -> why
  std::vector<ExtraCase> extras;
  bool has_getter_default = false;
  Expect getter_default;          // Value functions: the documented "NULL" result
  bool result_varies = false;     // the valid call's result differs between worlds
  std::string result_varies_why;
  std::string needs;              // "no_nccl": cases skip where te_nccl_get_unique_id works
  std::function<std::string(World &, const void *args, const CallResult &)> check;
};

template <class A>
struct Def {
  Fixture f;
  explicit Def(std::function<void(World &, A &)> s) {
    f.function = A::kFunction;
    f.args_size = sizeof(A);
    f.setup = [s](World &w, void *p) { s(w, *static_cast<A *>(p)); };
  }
  Def &valid(std::vector<te_status> s, std::string why) { f.valid = std::move(s); f.valid_why = std::move(why); return *this; }
  Def &null_ok(std::string path, std::string why) { f.null_ok[std::move(path)] = std::move(why); return *this; }
  Def &boolean(std::string path, std::string why = "0 or 1") { f.ints[std::move(path)] = {true, std::move(why)}; return *this; }
  Def &not_boolean(std::string path, std::string why) { f.ints[std::move(path)] = {false, std::move(why)}; return *this; }
  Def &tensor(std::string path, te_dtype dt, std::vector<int64_t> shape) { f.tensors[std::move(path)] = {dt, std::move(shape)}; return *this; }
  Def &wrong_dtype(std::string path, te_dtype dt) { f.wrong_dtype[std::move(path)] = dt; return *this; }
  Def &inout(std::string path) { f.inout.insert(std::move(path)); return *this; }
  Def &filled(std::string path) { f.filled.insert(std::move(path)); return *this; }
  Def &output_varies(std::string path, std::string why) { f.output_varies[std::move(path)] = std::move(why); return *this; }
  Def &expect(std::string glob, Expect e) { f.expect.emplace_back(std::move(glob), std::move(e)); return *this; }
  Def &skip(std::string glob, std::string why) { f.skip.emplace_back(std::move(glob), std::move(why)); return *this; }
  Def &extra(std::string name, std::function<void(World &, A &)> m, Expect e = invalid()) {
    f.extras.push_back({std::move(name), [m](World &w, void *p) { m(w, *static_cast<A *>(p)); }, std::move(e)});
    return *this;
  }
  Def &getter(Expect e) { f.has_getter_default = true; f.getter_default = std::move(e); return *this; }
  Def &result_varies(std::string why) { f.result_varies = true; f.result_varies_why = std::move(why); return *this; }
  Def &needs(std::string what) { f.needs = std::move(what); return *this; }
  Def &check(std::function<std::string(World &, const A &, const CallResult &)> c) {
    f.check = [c](World &w, const void *p, const CallResult &r) { return c(w, *static_cast<const A *>(p), r); };
    return *this;
  }
  operator Fixture() const { return f; }  // NOLINT: the table is a list of Def<...>{...}
};

// The training-step and checkpoint fixtures (fixtures_training.cpp), appended to the table.
void add_training_fixtures(std::vector<Fixture> &t);

// The fixture table (fixtures.cpp), and the classification of the int fields of the header's
// options structs ("te_recipe_options.margin" -> (is a 0/1 boolean, why)).
const std::vector<Fixture> &fixtures();
const std::map<std::string, std::pair<bool, std::string>> &int_fields();

}  // namespace sweep
