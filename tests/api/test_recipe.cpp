// Recipes: defaults, validation, keys (equal options <=> equal keys), describe strings,
// reference counting and NULL tolerance.
#include <atomic>
#include <cfloat>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "api_test_util.h"

using namespace te_test;

namespace {

void expect_options_equal(const te_recipe_options &a, const te_recipe_options &b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.format, b.format);
  EXPECT_EQ(a.margin, b.margin);
  EXPECT_EQ(a.amax_history_len, b.amax_history_len);
  EXPECT_EQ(a.amax_algo, b.amax_algo);
  EXPECT_EQ(a.reduce_amax, b.reduce_amax);
  EXPECT_EQ(a.power_of_2_scales, b.power_of_2_scales);
  EXPECT_EQ(float_to_bits(a.amax_epsilon), float_to_bits(b.amax_epsilon));
  EXPECT_EQ(a.fprop_split_accumulator, b.fprop_split_accumulator);
  EXPECT_EQ(a.dgrad_split_accumulator, b.dgrad_split_accumulator);
  EXPECT_EQ(a.wgrad_split_accumulator, b.wgrad_split_accumulator);
}

// te_recipe_options_init(kind) over a garbage-filled struct, and the fields every kind sets:
// struct_size, kind, format, power_of_2_scales, amax_epsilon 0 and the split accumulators
// (fprop off, dgrad and wgrad on).
void init_and_check_common(te_recipe_options *o, te_recipe_kind kind, te_format format, int pow2) {
  std::memset(o, 0x5A, sizeof *o);
  ASSERT_TE_OK(te_recipe_options_init(o, kind));
  EXPECT_EQ(o->struct_size, sizeof(te_recipe_options));
  EXPECT_EQ(o->kind, kind);
  EXPECT_EQ(o->format, format);
  EXPECT_EQ(o->power_of_2_scales, pow2);
  EXPECT_EQ(o->amax_epsilon, 0.0f);
  EXPECT_EQ(o->fprop_split_accumulator, 0);
  EXPECT_EQ(o->dgrad_split_accumulator, 1);
  EXPECT_EQ(o->wgrad_split_accumulator, 1);
}

TEST(Recipe, OptionsInitDelayedDefaults) {
  te_recipe_options o;
  ASSERT_NO_FATAL_FAILURE(init_and_check_common(&o, TE_RECIPE_DELAYED_SCALING, TE_FORMAT_HYBRID, 0));
  EXPECT_EQ(o.margin, 0);
  EXPECT_EQ(o.amax_history_len, 1024);
  EXPECT_EQ(o.amax_algo, TE_AMAX_MAX);
  EXPECT_EQ(o.reduce_amax, 1);
}

TEST(Recipe, OptionsInitCurrentDefaults) {
  te_recipe_options o;
  ASSERT_NO_FATAL_FAILURE(init_and_check_common(&o, TE_RECIPE_CURRENT_SCALING, TE_FORMAT_HYBRID, 0));
  EXPECT_EQ(o.reduce_amax, 1);
  // Fields that do not apply keep valid values (a created recipe must accept its own defaults).
  EXPECT_GE(o.margin, 0);
  EXPECT_GE(o.amax_history_len, 1);
}

TEST(Recipe, OptionsInitBlockDefaults) {
  te_recipe_options o;
  ASSERT_NO_FATAL_FAILURE(init_and_check_common(&o, TE_RECIPE_BLOCK_SCALING, TE_FORMAT_E4M3, 1));
}

TEST(Recipe, DefaultsOfEveryKindAreAccepted) {
  for (te_recipe_kind k : {TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING, TE_RECIPE_BLOCK_SCALING}) {
    te_recipe_options o = recipe_defaults(k);
    RecipePtr r = make_recipe(o);
    ASSERT_NE(r, nullptr) << "kind " << k;
    te_recipe_options back;
    std::memset(&back, 0, sizeof back);
    back.struct_size = sizeof back;
    ASSERT_TE_OK(te_recipe_get_options(r.get(), &back));
    expect_options_equal(o, back);
    EXPECT_EQ(back.struct_size, sizeof back);
  }
}

TEST(Recipe, OptionsInitBadArguments) {
  te_recipe_options o;
  std::memset(&o, 0x5A, sizeof o);
  te_recipe_options before = o;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_options_init", "kind",
                 te_recipe_options_init(&o, static_cast<te_recipe_kind>(3)));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_options_init", "kind",
                 te_recipe_options_init(&o, static_cast<te_recipe_kind>(-1)));
  EXPECT_EQ(std::memcmp(&o, &before, sizeof o), 0);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_options_init", "opts",
                 te_recipe_options_init(nullptr, TE_RECIPE_DELAYED_SCALING));
}

TEST(Recipe, NullOptionsMeanDefaultDelayed) {
  te_recipe *r = nullptr;
  ASSERT_TE_OK(te_recipe_create(&r, nullptr));
  RecipePtr owned(r);
  RecipePtr d = make_recipe(TE_RECIPE_DELAYED_SCALING);
  EXPECT_EQ(te_recipe_key(r), te_recipe_key(d.get()));
  EXPECT_STREQ(te_recipe_describe(r), te_recipe_describe(d.get()));
  te_recipe_options back;
  back.struct_size = sizeof back;
  ASSERT_TE_OK(te_recipe_get_options(r, &back));
  expect_options_equal(back, recipe_defaults(TE_RECIPE_DELAYED_SCALING));
}

// ---- validation ------------------------------------------------------------------------------

struct BadField {
  const char *name;  // the argument the message must name
  std::function<void(te_recipe_options &)> apply;
};

TEST(Recipe, CreateRejectsOutOfRangeFields) {
  const float inf = INFINITY;
  std::vector<BadField> bad = {
      {"struct_size", [](te_recipe_options &o) { o.struct_size = 0; }},
      {"struct_size", [](te_recipe_options &o) { o.struct_size = sizeof(te_recipe_options) - 1; }},
      {"struct_size", [](te_recipe_options &o) { o.struct_size = sizeof(size_t); }},
      {"kind", [](te_recipe_options &o) { o.kind = static_cast<te_recipe_kind>(3); }},
      {"kind", [](te_recipe_options &o) { o.kind = static_cast<te_recipe_kind>(-1); }},
      {"format", [](te_recipe_options &o) { o.format = static_cast<te_format>(2); }},
      {"format", [](te_recipe_options &o) { o.format = static_cast<te_format>(-1); }},
      {"margin", [](te_recipe_options &o) { o.margin = -1; }},
      {"margin", [](te_recipe_options &o) { o.margin = 128; }},
      {"amax_history_len", [](te_recipe_options &o) { o.amax_history_len = 0; }},
      {"amax_history_len", [](te_recipe_options &o) { o.amax_history_len = -5; }},
      {"amax_history_len", [](te_recipe_options &o) { o.amax_history_len = 65537; }},
      {"amax_algo", [](te_recipe_options &o) { o.amax_algo = static_cast<te_amax_algo>(2); }},
      {"amax_algo", [](te_recipe_options &o) { o.amax_algo = static_cast<te_amax_algo>(-1); }},
      {"reduce_amax", [](te_recipe_options &o) { o.reduce_amax = 2; }},
      {"reduce_amax", [](te_recipe_options &o) { o.reduce_amax = -1; }},
      {"power_of_2_scales", [](te_recipe_options &o) { o.power_of_2_scales = 2; }},
      {"amax_epsilon", [](te_recipe_options &o) { o.amax_epsilon = -1.0f; }},
      {"amax_epsilon", [](te_recipe_options &o) { o.amax_epsilon = -1e-30f; }},
      {"amax_epsilon", [](te_recipe_options &o) { o.amax_epsilon = NAN; }},
      {"amax_epsilon", [inf](te_recipe_options &o) { o.amax_epsilon = inf; }},
      {"fprop_split_accumulator", [](te_recipe_options &o) { o.fprop_split_accumulator = 2; }},
      {"dgrad_split_accumulator", [](te_recipe_options &o) { o.dgrad_split_accumulator = 7; }},
      {"wgrad_split_accumulator", [](te_recipe_options &o) { o.wgrad_split_accumulator = -1; }},
  };
  for (te_recipe_kind k : {TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING, TE_RECIPE_BLOCK_SCALING}) {
    for (const BadField &b : bad) {
      SCOPED_TRACE(std::string(b.name) + " kind " + std::to_string(k));
      te_recipe_options o = recipe_defaults(k);
      b.apply(o);
      te_recipe *sentinel = reinterpret_cast<te_recipe *>(0x9999);
      te_recipe *r = sentinel;
      EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_create", b.name, te_recipe_create(&r, &o));
      EXPECT_EQ(r, sentinel);
    }
  }
  te_recipe_options o = recipe_defaults();
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_create", "out", te_recipe_create(nullptr, &o));
}

TEST(Recipe, CreateAcceptsRangeLimits) {
  std::vector<std::function<void(te_recipe_options &)>> ok = {
      [](te_recipe_options &o) { o.margin = 0; },
      [](te_recipe_options &o) { o.margin = 127; },
      [](te_recipe_options &o) { o.amax_history_len = 1; },
      [](te_recipe_options &o) { o.amax_history_len = 65536; },
      [](te_recipe_options &o) { o.amax_epsilon = 0.0f; },
      [](te_recipe_options &o) { o.amax_epsilon = 1e-12f; },
      [](te_recipe_options &o) { o.amax_epsilon = FLT_MAX; },
      [](te_recipe_options &o) { o.amax_algo = TE_AMAX_MOST_RECENT; },
      [](te_recipe_options &o) { o.format = TE_FORMAT_E4M3; },
  };
  for (size_t i = 0; i < ok.size(); ++i) {
    te_recipe_options o = recipe_defaults();
    ok[i](o);
    te_recipe *r = nullptr;
    EXPECT_TE_OK(te_recipe_create(&r, &o)) << "case " << i;
    te_recipe_release(r);
  }
}

TEST(Recipe, LargerStructSizeIsAccepted) {
  // A newer caller's struct has appended fields: struct_size >= v1 size is fine.
  struct Bigger {
    te_recipe_options v1;
    int64_t future[4];
  } big;
  std::memset(&big, 0, sizeof big);
  ASSERT_TE_OK(te_recipe_options_init(&big.v1, TE_RECIPE_DELAYED_SCALING));
  big.v1.struct_size = sizeof big;
  te_recipe *r = nullptr;
  ASSERT_TE_OK(te_recipe_create(&r, &big.v1));
  RecipePtr owned(r);
  RecipePtr d = make_recipe();
  EXPECT_EQ(te_recipe_key(r), te_recipe_key(d.get()));
}

// ---- keys and descriptions -------------------------------------------------------------------

// Each of the 11 fields after struct_size, changed alone to another valid value.
std::vector<std::pair<const char *, std::function<void(te_recipe_options &)>>> single_field_changes() {
  return {
      {"kind", [](te_recipe_options &o) {
         o.kind = o.kind == TE_RECIPE_DELAYED_SCALING ? TE_RECIPE_CURRENT_SCALING : TE_RECIPE_DELAYED_SCALING;
       }},
      {"format", [](te_recipe_options &o) {
         o.format = o.format == TE_FORMAT_HYBRID ? TE_FORMAT_E4M3 : TE_FORMAT_HYBRID;
       }},
      {"margin", [](te_recipe_options &o) { o.margin = o.margin == 3 ? 4 : 3; }},
      {"amax_history_len", [](te_recipe_options &o) { o.amax_history_len = o.amax_history_len == 16 ? 17 : 16; }},
      {"amax_algo", [](te_recipe_options &o) {
         o.amax_algo = o.amax_algo == TE_AMAX_MAX ? TE_AMAX_MOST_RECENT : TE_AMAX_MAX;
       }},
      {"reduce_amax", [](te_recipe_options &o) { o.reduce_amax = 1 - o.reduce_amax; }},
      {"power_of_2_scales", [](te_recipe_options &o) { o.power_of_2_scales = 1 - o.power_of_2_scales; }},
      {"amax_epsilon", [](te_recipe_options &o) { o.amax_epsilon = o.amax_epsilon == 0.0f ? 1e-6f : 0.0f; }},
      {"fprop_split_accumulator", [](te_recipe_options &o) { o.fprop_split_accumulator = 1 - o.fprop_split_accumulator; }},
      {"dgrad_split_accumulator", [](te_recipe_options &o) { o.dgrad_split_accumulator = 1 - o.dgrad_split_accumulator; }},
      {"wgrad_split_accumulator", [](te_recipe_options &o) { o.wgrad_split_accumulator = 1 - o.wgrad_split_accumulator; }},
  };
}

TEST(RecipeKey, EachFieldAloneChangesTheKeyForEveryKind) {
  auto changes = single_field_changes();
  ASSERT_EQ(changes.size(), 11u);
  for (te_recipe_kind k : {TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING, TE_RECIPE_BLOCK_SCALING}) {
    te_recipe_options base = recipe_defaults(k);
    RecipePtr rb = make_recipe(base);
    ASSERT_NE(rb, nullptr);
    uint64_t base_key = te_recipe_key(rb.get());
    EXPECT_NE(base_key, 0u);
    std::map<uint64_t, std::string> keys = {{base_key, "base"}};
    std::set<std::string> descs = {te_recipe_describe(rb.get())};
    for (auto &c : changes) {
      SCOPED_TRACE(std::string(c.first) + " kind " + std::to_string(k));
      te_recipe_options o = base;
      c.second(o);
      RecipePtr r = make_recipe(o);
      ASSERT_NE(r, nullptr);
      uint64_t key = te_recipe_key(r.get());
      EXPECT_NE(key, 0u);
      auto ins = keys.emplace(key, c.first);
      EXPECT_TRUE(ins.second) << "key of '" << c.first << "' equals the key of '" << ins.first->second << "'";
      std::string d = te_recipe_describe(r.get());
      EXPECT_TRUE(descs.insert(d).second) << "describe string not changed by " << c.first << ": " << d;
      // The round trip through get_options gives the changed value back.
      te_recipe_options back;
      back.struct_size = sizeof back;
      ASSERT_TE_OK(te_recipe_get_options(r.get(), &back));
      expect_options_equal(back, o);
    }
  }
}

TEST(RecipeKey, EqualOptionsGiveEqualKeysAcrossHandles) {
  for (te_recipe_kind k : {TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING, TE_RECIPE_BLOCK_SCALING}) {
    te_recipe_options o = recipe_defaults(k);
    o.margin = 5;
    o.amax_epsilon = 0.25f;
    RecipePtr a = make_recipe(o);
    // A second handle built from a separately initialised copy, with another struct_size
    // (struct_size is not an option).
    struct Bigger { te_recipe_options v1; int32_t extra; } big;
    std::memset(&big, 0, sizeof big);
    big.v1 = recipe_defaults(k);
    big.v1.margin = 5;
    big.v1.amax_epsilon = 0.25f;
    big.v1.struct_size = sizeof big;
    te_recipe *b = nullptr;
    ASSERT_TE_OK(te_recipe_create(&b, &big.v1));
    RecipePtr owned_b(b);
    ASSERT_NE(a.get(), b);
    EXPECT_EQ(te_recipe_key(a.get()), te_recipe_key(b));
    EXPECT_STREQ(te_recipe_describe(a.get()), te_recipe_describe(b));
  }
}

TEST(RecipeKey, DescribeIsCanonicalAndStable) {
  RecipePtr d = make_recipe(TE_RECIPE_DELAYED_SCALING);
  const char *s = te_recipe_describe(d.get());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(std::string(s).rfind("delayed_scaling(", 0), 0u) << s;
  EXPECT_NE(std::string(s).find("HYBRID"), std::string::npos) << s;
  // Cached: the same pointer every time, no formatting on the hot path.
  EXPECT_EQ(te_recipe_describe(d.get()), s);
  RecipePtr c = make_recipe(TE_RECIPE_CURRENT_SCALING);
  RecipePtr b = make_recipe(TE_RECIPE_BLOCK_SCALING);
  std::string sc = te_recipe_describe(c.get()), sb = te_recipe_describe(b.get());
  EXPECT_FALSE(sc.empty());
  EXPECT_FALSE(sb.empty());
  EXPECT_NE(sc, s);
  EXPECT_NE(sb, s);
  EXPECT_NE(sb, sc);
  // Margin is visible in a delayed recipe's description.
  te_recipe_options o = recipe_defaults();
  o.margin = 42;
  RecipePtr m = make_recipe(o);
  EXPECT_NE(std::string(te_recipe_describe(m.get())).find("42"), std::string::npos)
      << te_recipe_describe(m.get());
}

TEST(RecipeKey, HundredThousandDistinctRecipesHaveDistinctKeys) {
  // Random options over every field; options are deduplicated first (by their exact values), so
  // the number of distinct keys must equal the number of distinct option sets.
  std::mt19937_64 gen(20240611);
  using Opt = std::tuple<int, int, int, int, int, int, int, uint32_t, int, int, int>;
  std::set<Opt> seen;
  std::vector<te_recipe_options> all;
  const size_t target = 100000;
  while (all.size() < target) {
    te_recipe_options o = recipe_defaults(static_cast<te_recipe_kind>(gen() % 3));
    o.format = static_cast<te_format>(gen() % 2);
    o.margin = static_cast<int32_t>(gen() % 128);
    o.amax_history_len = static_cast<int32_t>(1 + gen() % 65536);
    o.amax_algo = static_cast<te_amax_algo>(gen() % 2);
    o.reduce_amax = static_cast<int32_t>(gen() % 2);
    o.power_of_2_scales = static_cast<int32_t>(gen() % 2);
    // Non-negative finite floats of many magnitudes (exact bit patterns; no -0).
    o.amax_epsilon = (gen() % 4 == 0) ? 0.0f : bits_to_float(static_cast<uint32_t>(gen() % 0x7F000000u) + 1u);
    o.fprop_split_accumulator = static_cast<int32_t>(gen() % 2);
    o.dgrad_split_accumulator = static_cast<int32_t>(gen() % 2);
    o.wgrad_split_accumulator = static_cast<int32_t>(gen() % 2);
    Opt key{o.kind, o.format, o.margin, o.amax_history_len, o.amax_algo, o.reduce_amax,
            o.power_of_2_scales, float_to_bits(o.amax_epsilon), o.fprop_split_accumulator,
            o.dgrad_split_accumulator, o.wgrad_split_accumulator};
    if (seen.insert(key).second) all.push_back(o);
  }
  std::map<uint64_t, size_t> keys;
  size_t failures = 0, collisions = 0, zero = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    te_recipe *r = nullptr;
    if (te_recipe_create(&r, &all[i]) != TE_SUCCESS) {
      if (failures++ < 3) ADD_FAILURE() << "create failed: " << last_error();
      continue;
    }
    uint64_t k = te_recipe_key(r);
    zero += k == 0;
    auto ins = keys.emplace(k, i);
    if (!ins.second && collisions++ < 3)
      ADD_FAILURE() << "recipes " << ins.first->second << " and " << i << " share key " << k;
    te_recipe_release(r);
  }
  EXPECT_EQ(failures, 0u);
  EXPECT_EQ(collisions, 0u);
  EXPECT_EQ(zero, 0u);
  EXPECT_EQ(keys.size(), target);
  // Re-creating (after the originals were freed) gives the same keys: keys depend on options
  // only, not on handles or creation order.
  for (size_t i = 0; i < all.size(); i += 997) {
    RecipePtr r = make_recipe(all[i]);
    auto it = keys.find(te_recipe_key(r.get()));
    ASSERT_NE(it, keys.end());
    EXPECT_EQ(it->second, i);
  }
}

// ---- reference counting and NULL tolerance -------------------------------------------------

TEST(RecipeRefcount, RetainRelease) {
  te_recipe *r = nullptr;
  ASSERT_TE_OK(te_recipe_create(&r, nullptr));
  uint64_t key = te_recipe_key(r);
  std::string desc = te_recipe_describe(r);
  EXPECT_EQ(te_recipe_retain(r), r);
  EXPECT_EQ(te_recipe_retain(r), r);
  te_recipe_release(r);
  te_recipe_release(r);
  // One reference left: still alive (ASan reports a use-after-free otherwise).
  EXPECT_EQ(te_recipe_key(r), key);
  EXPECT_EQ(std::string(te_recipe_describe(r)), desc);
  te_recipe_release(r);  // freed here (LeakSanitizer reports it otherwise)
}

TEST(RecipeRefcount, ConcurrentRetainReleaseIsSafe) {
  te_recipe *r = nullptr;
  ASSERT_TE_OK(te_recipe_create(&r, nullptr));
  uint64_t key = te_recipe_key(r);
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        te_recipe *x = te_recipe_retain(r);
        if (x != r || te_recipe_key(x) != key) bad++;
        te_recipe_release(x);
      }
    });
  for (auto &t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(te_recipe_key(r), key);
  te_recipe_release(r);
}

TEST(RecipeRefcount, NullTolerance) {
  EXPECT_EQ(te_recipe_key(nullptr), 0u);
  const char *d = te_recipe_describe(nullptr);
  ASSERT_NE(d, nullptr);
  EXPECT_STREQ(d, "");
  te_recipe_release(nullptr);
  EXPECT_EQ(te_recipe_retain(nullptr), nullptr);
}

TEST(Recipe, GetOptionsBadArguments) {
  RecipePtr r = make_recipe();
  te_recipe_options o;
  std::memset(&o, 0x6B, sizeof o);
  o.struct_size = 0;
  te_recipe_options before = o;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_get_options", "struct_size",
                 te_recipe_get_options(r.get(), &o));
  EXPECT_EQ(std::memcmp(&o, &before, sizeof o), 0);
  o.struct_size = sizeof(te_recipe_options) - 4;
  before = o;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_get_options", "struct_size",
                 te_recipe_get_options(r.get(), &o));
  EXPECT_EQ(std::memcmp(&o, &before, sizeof o), 0);
  o.struct_size = sizeof o;
  before = o;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_get_options", "r", te_recipe_get_options(nullptr, &o));
  EXPECT_EQ(std::memcmp(&o, &before, sizeof o), 0);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_get_options", "out", te_recipe_get_options(r.get(), nullptr));
}

TEST(Recipe, SharedAcrossThreads) {
  // Recipes are immutable and may be read from several threads at once.
  RecipePtr r = make_recipe(TE_RECIPE_CURRENT_SCALING);
  uint64_t key = te_recipe_key(r.get());
  std::string desc = te_recipe_describe(r.get());
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        te_recipe_options o;
        o.struct_size = sizeof o;
        if (te_recipe_get_options(r.get(), &o) != TE_SUCCESS || o.kind != TE_RECIPE_CURRENT_SCALING) bad++;
        if (te_recipe_key(r.get()) != key || desc != te_recipe_describe(r.get())) bad++;
        // Creating equal recipes concurrently interns to the same key.
        te_recipe *x = nullptr;
        if (te_recipe_create(&x, &o) != TE_SUCCESS || te_recipe_key(x) != key) bad++;
        te_recipe_release(x);
      }
    });
  for (auto &t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
