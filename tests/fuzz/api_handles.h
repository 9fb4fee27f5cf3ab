// fuzz_api_sequence's operations on contexts, recipes, groups and autocast scopes
// (api_program.h), each checked against the program's model of them.
#pragma once

#include "api_program.h"

namespace fuzz {

// ---- contexts ----

inline void Program::create_context(int slot, int mode) {
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
inline void Program::destroy_context(int slot) {
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
  moe_drop_context(slot);
  ln_drop_context(slot);
  attn_drop_context(slot);
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

// ---- recipes ----

inline te_recipe *Program::recipe_arg(bool &mf, bool allow_null) {
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

inline void Program::recipe_create() {
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


// Equal options give equal keys; equal keys mean at least the same kind and format.
inline void Program::check_recipe_keys() {
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

inline void Program::release_recipe(int slot) {
  RecipeSlot &rs = rec_[slot];
  if (!rs.refs) return;
  te_recipe_release(rs.h);
  if (--rs.refs == 0) {
    dead_rec_.push_back(rs.h);
    rs.h = nullptr;
  }
}

inline void Program::recipe_query() {
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

inline te_group *Program::group_arg(bool &mf) {
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

inline void Program::group_create() {
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

inline void Program::check_autocast_state(int slot) {
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

inline void Program::autocast_begin() {
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

inline void Program::autocast_end() {
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

inline void Program::autocast_query() {
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

}  // namespace fuzz
