// The World of a sweep case: a CPU context with a recipe, a group, a linear that has taken one FP8
// step and its backward context; factories and probes for every handle type (the modules' own in
// fixtures.cpp, next to their fixtures); the state snapshot.
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "sweep.h"

namespace sweep {

// te_checkpoint (fixtures_training.cpp): known while libte.so exports its functions (they are
// called through dlsym there, so that the sweep links before the library has them).
bool checkpoint_handle_type(const std::string &t);
void *checkpoint_world_object(World &w);
void *checkpoint_make(World &w);
void checkpoint_destroy(void *h);
std::string checkpoint_probe(World &w, void *h);
std::string checkpoint_state(void *h);

Expect invalid(std::string name) {
  Expect e;
  e.name = std::move(name);
  return e;
}
Expect reject(std::vector<te_status> statuses, std::string why, std::string name) {
  Expect e;
  e.statuses = std::move(statuses);
  e.why = std::move(why);
  e.name = std::move(name);
  return e;
}
Expect accept(std::string why) {
  Expect e;
  e.kind = Expect::Accept;
  e.why = std::move(why);
  return e;
}
Expect reject_or_accept(std::string why) {
  Expect e;
  e.kind = Expect::RejectOrAccept;
  e.why = std::move(why);
  return e;
}
Expect no_crash(std::string why) {
  Expect e;
  e.kind = Expect::NoCrash;
  e.why = std::move(why);
  return e;
}
Expect returns_value(long long v, std::string why) {
  Expect e;
  e.kind = Expect::Returns;
  e.ret = Expect::Value;
  e.value = v;
  e.why = std::move(why);
  return e;
}
Expect returns_one_of(std::vector<long long> v, std::string why) {
  Expect e;
  e.kind = Expect::Returns;
  e.ret = Expect::OneOf;
  e.values = std::move(v);
  e.why = std::move(why);
  return e;
}
Expect returns_text(std::string s, std::string why) {
  Expect e;
  e.kind = Expect::Returns;
  e.ret = Expect::Text;
  e.text = std::move(s);
  e.why = std::move(why);
  return e;
}
Expect returns_null(std::string why) {
  Expect e;
  e.kind = Expect::Returns;
  e.ret = Expect::NullPointer;
  e.why = std::move(why);
  return e;
}
Expect returns_as_valid(std::string why) {
  Expect e;
  e.kind = Expect::Returns;
  e.ret = Expect::SameAsValid;
  e.why = std::move(why);
  return e;
}

bool World::ok(te_status s, const std::string &what) {
  if (s == TE_SUCCESS) return true;
  if (error.empty()) error = what + " returned " + te_status_string(s) + ": " + te_last_error();
  return false;
}

void *World::block(size_t n) {
  std::shared_ptr<void> p(std::calloc(1, n ? n : 1), std::free);
  objects_.push_back(p);
  return p.get();
}

void World::watch(const void *p, size_t n, std::string what) { extra_regions.push_back({p, n, std::move(what)}); }
void World::add_state(std::function<std::string()> f) { extra_state.push_back(std::move(f)); }
void World::post_check(std::function<std::string()> f) { post_checks.push_back(std::move(f)); }

namespace {

te_linear *new_linear(World &w, te_context *ctx, int64_t in, int64_t out) {
  te_linear_options o;
  std::memset(&o, 0, sizeof o);
  w.ok(te_linear_options_init(&o), "te_linear_options_init");
  o.in_features = in;
  o.out_features = out;
  o.bias = 1;
  o.activation_dtype = TE_DTYPE_F32;
  te_linear *l = nullptr;
  w.ok(te_linear_create(&l, ctx, &o), "te_linear_create");
  return l;
}

}  // namespace

bool World::build() {
  te_context_options co;
  std::memset(&co, 0, sizeof co);
  ok(te_context_options_init(&co), "te_context_options_init");
  co.use_default_device = 0;
  co.device.type = TE_DEVICE_CPU;
  co.device.index = 0;
  ok(te_context_create(&ctx, &co), "te_context_create");
  te_recipe_options ro;
  std::memset(&ro, 0, sizeof ro);
  ok(te_recipe_options_init(&ro, TE_RECIPE_DELAYED_SCALING), "te_recipe_options_init");
  ro.amax_history_len = 16;
  ok(te_recipe_create(&recipe, &ro), "te_recipe_create");
  ok(te_group_create_single(&group), "te_group_create_single");
  if (!error.empty()) return false;
  lin = new_linear(*this, ctx, N, N);
  lin_aux = new_linear(*this, ctx, N, N);
  x = te_test::random_tensor(TE_DTYPE_F32, {N, N}, -2, 2, 1);
  w = te_test::random_tensor(TE_DTYPE_F32, {N, N}, -1, 1, 2);
  b = te_test::random_tensor(TE_DTYPE_F32, {N}, -1, 1, 3);
  y = te_test::make_tensor(TE_DTYPE_F32, {N, N});
  dy = te_test::random_tensor(TE_DTYPE_F32, {N, N}, -1, 1, 4);
  dx = te_test::make_tensor(TE_DTYPE_F32, {N, N});
  dw = te_test::make_tensor(TE_DTYPE_F32, {N, N});
  db = te_test::make_tensor(TE_DTYPE_F32, {N});
  for (float &f : spare_scale_inv) f = 1.0f;
  // One FP8 step: forward in a scope, end it (scale update), backward (backward bucket update).
  te_autocast_options ao;
  std::memset(&ao, 0, sizeof ao);
  ok(te_autocast_options_init(&ao), "te_autocast_options_init");
  ao.recipe = recipe;
  ao.group = group;
  te_autocast_token t = 0;
  ok(te_autocast_begin(ctx, &ao, &t), "te_autocast_begin");
  te_linear_forward_args fa;
  std::memset(&fa, 0, sizeof fa);
  ok(te_linear_forward_args_init(&fa), "te_linear_forward_args_init");
  fa.input = x.get();
  fa.weight = w.get();
  fa.bias = b.get();
  ok(te_linear_forward(ctx, lin, &fa, y.get(), &bwd), "te_linear_forward (world)");
  ok(te_autocast_end(ctx, t), "te_autocast_end");
  ok(te_linear_backward(ctx, bwd, dy.get(), dx.get(), dw.get(), db.get(), nullptr), "te_linear_backward (world)");
  // One object of each module handle type made by the fixtures' factories (own() hands them to
  // the wrong-type mutations).
  for (const char *t : {"te_grouped_linear", "te_grouped_linear_backward_ctx", "te_layernorm_linear",
                        "te_layernorm_linear_backward_ctx", "te_layernorm_mlp", "te_layernorm_mlp_backward_ctx",
                        "te_attention", "te_attention_backward_ctx"})
    modules[t] = make(t);
  ck = static_cast<te_checkpoint *>(checkpoint_world_object(*this));
  // Outputs start as the sentinel again.
  y.fill_byte(0xA5);
  dx.fill_byte(0xA5);
  dw.fill_byte(0xA5);
  db.fill_byte(0xA5);
  return error.empty();
}

void begin_fp8_scope(World &w) {
  te_autocast_options o;
  std::memset(&o, 0, sizeof o);
  w.ok(te_autocast_options_init(&o), "te_autocast_options_init");
  o.recipe = w.recipe;
  te_autocast_token t = 0;
  w.ok(te_autocast_begin(w.ctx, &o, &t), "te_autocast_begin (fixture scope)");
}

// ---- handles ----------------------------------------------------------------------------------

// Handle types whose factories live with their fixtures (fixtures.cpp): the grouped linear's,
// and LayerNormLinear's / LayerNormMLP's.
bool grouped_handle_type(const std::string &t);
void *grouped_make(World &w, const std::string &t);
void grouped_destroy(const std::string &t, void *h);
std::string grouped_probe(World &w, const std::string &t, void *h);
bool layernorm_handle_type(const std::string &t);
void *layernorm_make(World &w, const std::string &t);
void layernorm_destroy(const std::string &t, void *h);
std::string layernorm_probe(World &w, const std::string &t, void *h);
bool attention_handle_type(const std::string &t);
void *attention_make(World &w, const std::string &t);
void attention_destroy(const std::string &t, void *h);
std::string attention_probe(World &w, const std::string &t, void *h);

bool World::knows_handle_type(const std::string &t) {
  return t == "te_context" || t == "te_recipe" || t == "te_group" || t == "te_linear" ||
         t == "te_linear_backward_ctx" || grouped_handle_type(t) || layernorm_handle_type(t) ||
         attention_handle_type(t) || checkpoint_handle_type(t);
}

void *World::own(const std::string &t) const {
  if (t == "te_context") return ctx;
  if (t == "te_recipe") return recipe;
  if (t == "te_group") return group;
  if (t == "te_linear") return lin;
  if (t == "te_linear_backward_ctx") return bwd;
  if (t == "te_checkpoint") return ck;
  auto m = modules.find(t);
  return m == modules.end() ? nullptr : m->second;
}

void *World::make(const std::string &t) {
  if (grouped_handle_type(t)) return grouped_make(*this, t);
  if (layernorm_handle_type(t)) return layernorm_make(*this, t);
  if (attention_handle_type(t)) return attention_make(*this, t);
  if (t == "te_checkpoint") return checkpoint_make(*this);
  if (t == "te_context") {
    te_context_options o;
    std::memset(&o, 0, sizeof o);
    ok(te_context_options_init(&o), "te_context_options_init");
    o.use_default_device = 0;
    o.device.type = TE_DEVICE_CPU;
    te_context *c = nullptr;
    ok(te_context_create(&c, &o), "te_context_create (factory)");
    return c;
  }
  if (t == "te_recipe") {
    te_recipe *r = nullptr;
    ok(te_recipe_create(&r, nullptr), "te_recipe_create (factory)");
    return r;
  }
  if (t == "te_group") {
    te_group *g = nullptr;
    ok(te_group_create_single(&g), "te_group_create_single (factory)");
    return g;
  }
  if (t == "te_linear") return new_linear(*this, ctx, N, N);
  if (t == "te_linear_backward_ctx") {
    // A high-precision forward of lin_aux (no scope of this context is touched).
    te_autocast_state st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    ok(te_autocast_get_state(ctx, &st), "te_autocast_get_state (factory)");
    te_autocast_options o;
    std::memset(&o, 0, sizeof o);
    ok(te_autocast_options_init(&o), "te_autocast_options_init");
    o.enabled = 0;
    te_autocast_token t = 0;
    if (st.depth > 0) ok(te_autocast_begin(ctx, &o, &t), "te_autocast_begin (factory, disabled)");
    HostTensor &yy = keep(te_test::make_tensor(TE_DTYPE_F32, {N, N}));
    te_linear_forward_args fa;
    std::memset(&fa, 0, sizeof fa);
    ok(te_linear_forward_args_init(&fa), "te_linear_forward_args_init");
    fa.input = x.get();
    fa.weight = w.get();
    fa.bias = b.get();
    te_linear_backward_ctx *bb = nullptr;
    ok(te_linear_forward(ctx, lin_aux, &fa, yy.get(), &bb), "te_linear_forward (factory)");
    if (st.depth > 0) ok(te_autocast_end(ctx, t), "te_autocast_end (factory)");
    return bb;
  }
  if (error.empty()) error = "World::make: no factory for handle type " + t;
  return nullptr;
}

void World::destroy(const std::string &t, void *h) {
  if (grouped_handle_type(t)) grouped_destroy(t, h);
  else if (layernorm_handle_type(t)) layernorm_destroy(t, h);
  else if (attention_handle_type(t)) attention_destroy(t, h);
  else if (t == "te_checkpoint") checkpoint_destroy(h);
  else if (t == "te_context") te_context_destroy(static_cast<te_context *>(h));
  else if (t == "te_recipe") te_recipe_release(static_cast<te_recipe *>(h));
  else if (t == "te_group") te_group_destroy(static_cast<te_group *>(h));
  else if (t == "te_linear") te_linear_destroy(static_cast<te_linear *>(h));
  else if (t == "te_linear_backward_ctx") te_linear_backward_ctx_destroy(static_cast<te_linear_backward_ctx *>(h));
}

std::string World::probe(const std::string &t, void *h) {
  auto bad = [](const char *call, te_status s) {
    return std::string(call) + " returned " + te_status_string(s) + ": " + te_last_error();
  };
  if (grouped_handle_type(t)) return grouped_probe(*this, t, h);
  if (layernorm_handle_type(t)) return layernorm_probe(*this, t, h);
  if (attention_handle_type(t)) return attention_probe(*this, t, h);
  if (t == "te_checkpoint") return checkpoint_probe(*this, h);
  if (t == "te_context") {
    te_device d{};
    te_status s = te_context_get_device(static_cast<te_context *>(h), &d);
    if (s != TE_SUCCESS) return bad("te_context_get_device", s);
    if (d.type != TE_DEVICE_CPU) return "te_context_get_device: not the CPU any more";
    return "";
  }
  if (t == "te_recipe") return te_recipe_key(static_cast<te_recipe *>(h)) ? "" : "te_recipe_key returned 0";
  if (t == "te_group") {
    if (!te_group_id(static_cast<te_group *>(h))) return "te_group_id returned 0";
    return te_group_size(static_cast<te_group *>(h)) == 1 ? "" : "te_group_size is not 1";
  }
  if (t == "te_linear") {
    size_t n = 0;
    te_status s = te_linear_state_save(ctx, static_cast<te_linear *>(h), nullptr, 0, &n);
    return s == TE_SUCCESS ? "" : bad("te_linear_state_save", s);
  }
  if (t == "te_linear_backward_ctx") {
    HostTensor &ddx = keep(te_test::make_tensor(TE_DTYPE_F32, {N, N}));
    te_status s = te_linear_backward(ctx, static_cast<te_linear_backward_ctx *>(h), dy.get(), ddx.get(), nullptr,
                                     nullptr, nullptr);
    return s == TE_SUCCESS ? "" : bad("te_linear_backward", s);
  }
  return "no probe for handle type " + t;
}

// ---- state ------------------------------------------------------------------------------------

std::string World::state() {
  std::ostringstream o;
  size_t n = 0;
  te_status s = te_linear_state_save(ctx, lin, nullptr, 0, &n);
  o << "lin state: ";
  if (s != TE_SUCCESS) {
    o << "te_linear_state_save failed: " << te_status_string(s) << "\n";
  } else {
    std::vector<unsigned char> buf(n);
    s = te_linear_state_save(ctx, lin, buf.data(), n, &n);
    if (s != TE_SUCCESS) o << "te_linear_state_save failed: " << te_status_string(s);
    static const char *hex = "0123456789abcdef";
    for (unsigned char c : buf) o << hex[c >> 4] << hex[c & 15];
    o << "\n";
  }
  te_autocast_state st;
  std::memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  s = te_autocast_get_state(ctx, &st);
  o << "autocast: " << te_status_string(s) << " enabled=" << st.enabled << " calibrating=" << st.calibrating
    << " depth=" << st.depth << " recipe_key=" << (st.recipe ? te_recipe_key(st.recipe) : 0) << "\n";
  te_context_stats cs;
  std::memset(&cs, 0, sizeof cs);
  cs.struct_size = sizeof cs;
  s = te_context_get_stats(ctx, &cs);
  o << "stats: " << te_status_string(s) << " scopes_closed=" << cs.scopes_closed << " bucket_updates="
    << cs.bucket_updates << " amax_reductions=" << cs.amax_reductions << " states_updated=" << cs.states_updated
    << "\n";
  te_device d{};
  s = te_context_get_device(ctx, &d);
  o << "device: " << te_status_string(s) << " " << d.type << ":" << d.index << "\n";
  o << "recipe: key=" << te_recipe_key(recipe) << " " << te_recipe_describe(recipe) << "\n";
  o << "group: size=" << te_group_size(group) << " rank=" << te_group_rank(group) << "\n";
  if (ck) o << "checkpoint: " << checkpoint_state(ck) << "\n";
  for (auto &f : extra_state) o << f() << "\n";
  return o.str();
}

}  // namespace sweep
