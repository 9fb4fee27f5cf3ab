// Threads over the public API (te/te.h and libte.so only), as the header's thread-safety rules
// allow: a context (and its linears and backward contexts) per thread; recipes shared by all
// threads, created on the main thread; groups read-only after creation; te_last_error() per
// thread. Run under the `tsan` preset (ThreadSanitizer), where any data race fails the test; in
// every other preset the same checks run without it.
//
//  - TrainingSteps: N threads, each with its own context and te_linear, run training steps
//    (autocast begin, forward, end, backward, destroy) with recipes created on the main thread,
//    half of them with a group shared by all threads in their scopes;
//    every output (y, dx, dw, db each step, the final saved state) equals, bit for bit, what the
//    same work gives when run alone on the main thread.
//  - RecipeChurn: threads create, retain and release recipes at once, with options equal across
//    threads and options that differ: equal options <=> equal te_recipe_key (and description),
//    the shared recipes survive every retain/release pair.
//  - Groups: te_group_create_single / te_group_destroy in threads, each group used by its
//    thread's autocast scopes; ids are unique across threads.
//  - LastError: each thread fails a different function, waits until all have, and still reads
//    its own message; a thread that never failed reads "".
#include <gtest/gtest.h>
#include <te/te.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 4;

#define ASSERT_OK(call)                                                                         \
  do {                                                                                          \
    te_status s_ = (call);                                                                      \
    ASSERT_EQ(s_, TE_SUCCESS) << #call << ": " << te_status_string(s_) << ": " << te_last_error(); \
  } while (0)

// Every thread waits until all have arrived (reusable).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

// Runs fn(i) on n threads, started together; failures inside are gtest failures of this test.
void run_threads(int n, const std::function<void(int)> &fn) {
  std::vector<std::thread> ts;
  ts.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ts.emplace_back(fn, i);
  for (auto &t : ts) t.join();
}

te_context *make_cpu_context() {
  te_context_options o;
  te_context_options_init(&o);
  o.use_default_device = 0;
  o.device.type = TE_DEVICE_CPU;
  o.device.index = 0;
  te_context *c = nullptr;
  EXPECT_EQ(te_context_create(&c, &o), TE_SUCCESS) << te_last_error();
  return c;
}

te_recipe_options options_of(te_recipe_kind kind, int history = 0, int margin = 0, te_amax_algo algo = TE_AMAX_MAX,
                             te_format format = TE_FORMAT_HYBRID) {
  te_recipe_options o;
  EXPECT_EQ(te_recipe_options_init(&o, kind), TE_SUCCESS);
  if (history > 0) o.amax_history_len = history;
  o.margin = margin;
  o.amax_algo = algo;
  if (kind != TE_RECIPE_BLOCK_SCALING) o.format = format;
  return o;
}

te_recipe *make_recipe(const te_recipe_options &o) {
  te_recipe *r = nullptr;
  EXPECT_EQ(te_recipe_create(&r, &o), TE_SUCCESS) << te_last_error();
  return r;
}

uint32_t next_rand(uint64_t &s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return static_cast<uint32_t>(s >> 16);
}

// One thread's training: everything it computes, as bytes.
struct Workload {
  int index;
  const te_recipe *recipe;
  const te_group *group;  // NULL or a group shared by several threads
  int64_t in, out, tokens;
  int steps;
};

struct Outputs {
  std::vector<std::vector<uint8_t>> per_step;  // y, dx, dw, db of each step, in that order
  std::vector<uint8_t> state;                  // te_linear_state_save at the end
  std::string error;                           // the first failure, if any
};

std::vector<float> random_floats(uint64_t &s, size_t n, float scale) {
  std::vector<float> v(n);
  for (float &f : v) f = scale * (static_cast<float>(next_rand(s) & 0xFFFF) / 32768.0f - 1.0f);
  return v;
}

te_tensor f32_tensor(void *data, int64_t rows, int64_t cols) {
  te_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = TE_DTYPE_F32;
  t.device.type = TE_DEVICE_CPU;
  if (rows == 0) {
    t.ndim = 1;
    t.shape[0] = cols;
  } else {
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
  }
  return t;
}

#define WL_CHECK(call)                                                                                 \
  do {                                                                                                 \
    te_status s_ = (call);                                                                             \
    if (s_ != TE_SUCCESS) {                                                                            \
      out.error = std::string(#call) + ": " + te_status_string(s_) + ": " + te_last_error();          \
      goto done;                                                                                       \
    }                                                                                                  \
  } while (0)

// The same function runs on a worker thread and, for the reference, on the main thread.
Outputs run_workload(const Workload &w) {
  Outputs out;
  uint64_t seed = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(w.index + 1);
  std::vector<float> weight = random_floats(seed, static_cast<size_t>(w.out * w.in), 0.5f);
  std::vector<float> bias = random_floats(seed, static_cast<size_t>(w.out), 0.5f);
  te_context *ctx = make_cpu_context();
  te_linear *lin = nullptr;
  te_linear_options lo;
  te_linear_options_init(&lo);
  lo.in_features = w.in;
  lo.out_features = w.out;
  lo.activation_dtype = TE_DTYPE_F32;
  if (!ctx) {
    out.error = "no context";
    return out;
  }
  WL_CHECK(te_linear_create(&lin, ctx, &lo));
  for (int step = 0; step < w.steps; ++step) {
    std::vector<float> x = random_floats(seed, static_cast<size_t>(w.tokens * w.in), 1.0f + static_cast<float>(step));
    std::vector<float> dy = random_floats(seed, static_cast<size_t>(w.tokens * w.out), 1.0f);
    std::vector<float> y(static_cast<size_t>(w.tokens * w.out)), dx(static_cast<size_t>(w.tokens * w.in)),
        dw(static_cast<size_t>(w.out * w.in)), db(static_cast<size_t>(w.out));
    te_tensor tx = f32_tensor(x.data(), w.tokens, w.in), tw = f32_tensor(weight.data(), w.out, w.in),
              tb = f32_tensor(bias.data(), 0, w.out), ty = f32_tensor(y.data(), w.tokens, w.out),
              tdy = f32_tensor(dy.data(), w.tokens, w.out), tdx = f32_tensor(dx.data(), w.tokens, w.in),
              tdw = f32_tensor(dw.data(), w.out, w.in), tdb = f32_tensor(db.data(), 0, w.out);
    te_autocast_options ao;
    te_autocast_options_init(&ao);
    ao.recipe = w.recipe;
    ao.group = w.group;
    te_autocast_token tok = 0;
    te_linear_forward_args fa;
    te_linear_forward_args_init(&fa);
    fa.input = &tx;
    fa.weight = &tw;
    fa.bias = &tb;
    fa.weight_unchanged = 0;  // the SGD step below changes W
    te_linear_backward_ctx *bwd = nullptr;
    te_linear_backward_args ba;
    te_linear_backward_args_init(&ba);
    ba.flags = TE_BACKWARD_ONCE;
    WL_CHECK(te_autocast_begin(ctx, &ao, &tok));
    WL_CHECK(te_linear_forward(ctx, lin, &fa, &ty, &bwd));
    WL_CHECK(te_autocast_end(ctx, tok));
    WL_CHECK(te_linear_backward(ctx, bwd, &tdy, &tdx, &tdw, &tdb, &ba));
    te_linear_backward_ctx_destroy(bwd);
    for (const std::vector<float> *v : {&y, &dx, &dw, &db}) {
      std::vector<uint8_t> bytes(v->size() * sizeof(float));
      std::memcpy(bytes.data(), v->data(), bytes.size());
      out.per_step.push_back(std::move(bytes));
    }
    // A plain SGD step, so that later steps see new weights (and the weight cache refreshes).
    for (size_t i = 0; i < weight.size(); ++i) weight[i] -= 0.01f * dw[i];
  }
  {
    size_t n = 0;
    WL_CHECK(te_linear_state_save(ctx, lin, nullptr, 0, &n));
    out.state.resize(n);
    WL_CHECK(te_linear_state_save(ctx, lin, out.state.data(), n, &n));
  }
done:
  te_linear_destroy(lin);
  te_context_destroy(ctx);
  return out;
}

class Threads : public ::testing::Test {
 protected:
  void SetUp() override {
    recipes_.push_back(make_recipe(options_of(TE_RECIPE_DELAYED_SCALING)));
    recipes_.push_back(make_recipe(options_of(TE_RECIPE_DELAYED_SCALING, 16, 1, TE_AMAX_MOST_RECENT)));
    recipes_.push_back(make_recipe(options_of(TE_RECIPE_CURRENT_SCALING)));
    recipes_.push_back(make_recipe(options_of(TE_RECIPE_BLOCK_SCALING)));
    for (te_recipe *r : recipes_) ASSERT_NE(r, nullptr);
  }
  void TearDown() override {
    for (te_recipe *r : recipes_) te_recipe_release(r);
  }
  std::vector<te_recipe *> recipes_;
};

TEST_F(Threads, TrainingStepsMatchSingleThreaded) {
  // Two threads per recipe: the recipes (and so their reference counts) are shared.
  // Half of them put a group shared by all threads (created here) in their scopes.
  const int n = 2 * static_cast<int>(recipes_.size());
  te_group *shared_group = nullptr;
  ASSERT_OK(te_group_create_single(&shared_group));
  std::vector<Workload> work;
  for (int i = 0; i < n; ++i)
    work.push_back(Workload{i, recipes_[static_cast<size_t>(i) % recipes_.size()], i % 2 ? shared_group : nullptr, 64,
                            32 + 16 * (i % 2), 32, 4});
  std::vector<Outputs> threaded(static_cast<size_t>(n));
  Barrier start(n);
  run_threads(n, [&](int i) {
    start.wait();
    threaded[static_cast<size_t>(i)] = run_workload(work[static_cast<size_t>(i)]);
  });
  for (int i = 0; i < n; ++i) {
    const Outputs alone = run_workload(work[static_cast<size_t>(i)]);
    const Outputs &t = threaded[static_cast<size_t>(i)];
    ASSERT_EQ(t.error, "") << "thread " << i;
    ASSERT_EQ(alone.error, "") << "reference " << i;
    ASSERT_EQ(t.per_step.size(), alone.per_step.size());
    for (size_t k = 0; k < t.per_step.size(); ++k) {
      static const char *const kNames[4] = {"y", "dx", "dw", "db"};
      EXPECT_TRUE(t.per_step[k] == alone.per_step[k])
          << "thread " << i << " (" << te_recipe_describe(work[static_cast<size_t>(i)].recipe) << "), step " << k / 4
          << ": " << kNames[k % 4] << " differs from the single-threaded run";
    }
    EXPECT_TRUE(t.state == alone.state) << "thread " << i << ": the saved FP8 state differs from the single-threaded run";
  }
  te_group_destroy(shared_group);
}

TEST_F(Threads, RecipeChurn) {
  // Variants equal across threads; variants differ from each other in a field that changes
  // numerics, so their keys must differ.
  const std::vector<te_recipe_options> variants = {
      options_of(TE_RECIPE_DELAYED_SCALING),
      options_of(TE_RECIPE_DELAYED_SCALING, 16),
      options_of(TE_RECIPE_DELAYED_SCALING, 16, 2),
      options_of(TE_RECIPE_DELAYED_SCALING, 16, 2, TE_AMAX_MOST_RECENT),
      options_of(TE_RECIPE_DELAYED_SCALING, 0, 0, TE_AMAX_MAX, TE_FORMAT_E4M3),
      options_of(TE_RECIPE_CURRENT_SCALING),
      options_of(TE_RECIPE_CURRENT_SCALING, 0, 0, TE_AMAX_MAX, TE_FORMAT_E4M3),
      options_of(TE_RECIPE_BLOCK_SCALING),
  };
  const size_t nv = variants.size();
  constexpr int kRounds = 100;
  // keys[thread][variant], descriptions likewise (from every round: they must all agree).
  std::vector<std::vector<std::set<uint64_t>>> keys(kThreads, std::vector<std::set<uint64_t>>(nv));
  std::vector<std::vector<std::set<std::string>>> descs(kThreads, std::vector<std::set<std::string>>(nv));
  std::vector<std::string> errors(kThreads);
  const std::vector<uint64_t> shared_keys = [&] {
    std::vector<uint64_t> k;
    for (te_recipe *r : recipes_) k.push_back(te_recipe_key(r));
    return k;
  }();
  Barrier start(kThreads);
  run_threads(kThreads, [&](int t) {
    start.wait();
    std::vector<te_recipe *> held;
    for (int round = 0; round < kRounds; ++round) {
      const size_t v = static_cast<size_t>(round * (t + 1) + t) % nv;
      te_recipe *r = nullptr;
      if (te_recipe_create(&r, &variants[v]) != TE_SUCCESS) {
        errors[static_cast<size_t>(t)] = te_last_error();
        break;
      }
      keys[static_cast<size_t>(t)][v].insert(te_recipe_key(r));
      descs[static_cast<size_t>(t)][v].insert(te_recipe_describe(r));
      te_recipe_options back;
      std::memset(&back, 0, sizeof back);
      back.struct_size = sizeof back;
      if (te_recipe_get_options(r, &back) != TE_SUCCESS) errors[static_cast<size_t>(t)] = te_last_error();
      // Extra references, dropped out of order; shared recipes retained and released meanwhile.
      te_recipe_retain(r);
      held.push_back(r);
      held.push_back(r);
      te_recipe *shared = recipes_[static_cast<size_t>(round + t) % recipes_.size()];
      te_recipe_retain(shared);
      if (te_recipe_key(shared) != shared_keys[static_cast<size_t>(round + t) % recipes_.size()] ||
          te_recipe_describe(shared)[0] == '\0')
        errors[static_cast<size_t>(t)] = "a shared recipe's key or description changed";
      te_recipe_release(shared);
      if (held.size() >= 6) {
        std::rotate(held.begin(), held.begin() + 3, held.end());
        for (int k = 0; k < 3; ++k) {
          te_recipe_release(held.back());
          held.pop_back();
        }
      }
    }
    for (te_recipe *r : held) te_recipe_release(r);
  });
  for (int t = 0; t < kThreads; ++t) ASSERT_EQ(errors[static_cast<size_t>(t)], "") << "thread " << t;
  // Equal options -> one key and one description, whichever thread made them.
  std::vector<uint64_t> key_of(nv, 0);
  for (size_t v = 0; v < nv; ++v) {
    std::set<uint64_t> all;
    std::set<std::string> all_desc;
    for (int t = 0; t < kThreads; ++t) {
      all.insert(keys[static_cast<size_t>(t)][v].begin(), keys[static_cast<size_t>(t)][v].end());
      all_desc.insert(descs[static_cast<size_t>(t)][v].begin(), descs[static_cast<size_t>(t)][v].end());
    }
    ASSERT_EQ(all.size(), 1u) << "variant " << v << ": equal options gave " << all.size() << " keys";
    EXPECT_EQ(all_desc.size(), 1u) << "variant " << v << ": equal options gave " << all_desc.size() << " descriptions";
    key_of[v] = *all.begin();
    EXPECT_NE(key_of[v], 0u);
  }
  // Different options -> different keys.
  for (size_t a = 0; a < nv; ++a)
    for (size_t b = a + 1; b < nv; ++b) EXPECT_NE(key_of[a], key_of[b]) << "variants " << a << " and " << b;
  // The shared recipes are intact and keep their keys.
  for (size_t i = 0; i < recipes_.size(); ++i) EXPECT_EQ(te_recipe_key(recipes_[i]), shared_keys[i]);
}

TEST_F(Threads, GroupsCreatedAndDestroyedInThreads) {
  constexpr int kGroups = 12;
  std::vector<std::vector<uint64_t>> ids(kThreads);
  std::vector<std::string> errors(kThreads);
  Barrier start(kThreads);
  run_threads(kThreads, [&](int t) {
    start.wait();
    te_context *ctx = make_cpu_context();
    std::string &err = errors[static_cast<size_t>(t)];
    for (int k = 0; k < kGroups && err.empty(); ++k) {
      te_group *g = nullptr;
      if (te_group_create_single(&g) != TE_SUCCESS) {
        err = te_last_error();
        break;
      }
      ids[static_cast<size_t>(t)].push_back(te_group_id(g));
      if (te_group_rank(g) != 0 || te_group_size(g) != 1) err = "a single-rank group reports another rank or size";
      // The group in a scope of this thread's context, with a shared recipe.
      te_autocast_options o;
      te_autocast_options_init(&o);
      o.recipe = recipes_[static_cast<size_t>(k + t) % recipes_.size()];
      o.group = g;
      te_autocast_token tok = 0;
      if (te_autocast_begin(ctx, &o, &tok) != TE_SUCCESS || te_autocast_end(ctx, tok) != TE_SUCCESS)
        err = te_last_error();
      te_group_destroy(g);
    }
    te_context_destroy(ctx);
  });
  std::set<uint64_t> all;
  size_t count = 0;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(errors[static_cast<size_t>(t)], "") << "thread " << t;
    for (uint64_t id : ids[static_cast<size_t>(t)]) {
      EXPECT_NE(id, 0u);
      all.insert(id);
      ++count;
    }
  }
  EXPECT_EQ(all.size(), count) << "group ids repeat across threads";
}

TEST_F(Threads, LastErrorIsPerThread) {
  // Thread t fails function kFns[t] (the last thread never fails), then all wait; each must still
  // read its own message, after a successful call of its own too.
  static const char *const kFns[kThreads] = {"te_context_get_device", "te_recipe_create", "te_autocast_begin", nullptr};
  constexpr int kRounds = 20;
  std::vector<std::string> problem(kThreads);
  Barrier failed(kThreads), checked(kThreads);
  run_threads(kThreads, [&](int t) {
    std::string &p = problem[static_cast<size_t>(t)];
    for (int round = 0; round < kRounds; ++round) {
      switch (t) {
        case 0: (void)te_context_get_device(nullptr, nullptr); break;
        case 1: {
          te_recipe_options o = options_of(TE_RECIPE_DELAYED_SCALING);
          o.margin = -1 - round;
          te_recipe *r = nullptr;
          (void)te_recipe_create(&r, &o);
          break;
        }
        case 2: {
          te_autocast_token tok;
          (void)te_autocast_begin(nullptr, nullptr, &tok);
          break;
        }
        default: (void)te_version(); break;
      }
      failed.wait();  // every thread has made its call
      te_recipe_options o;
      (void)te_recipe_options_init(&o, TE_RECIPE_CURRENT_SCALING);  // succeeds: the message stays
      const std::string msg = te_last_error();
      if (p.empty()) {
        if (kFns[t]) {
          const std::string prefix = std::string(kFns[t]) + ":";
          if (msg.compare(0, prefix.size(), prefix) != 0) p = "round " + std::to_string(round) + ": read \"" + msg + "\"";
          // Thread 1's message names this round's margin, not another round's.
          if (t == 1 && msg.find(std::to_string(-1 - round)) == std::string::npos)
            p = "round " + std::to_string(round) + ": te_recipe_create's message lacks margin " +
                std::to_string(-1 - round) + ": \"" + msg + "\"";
        } else if (!msg.empty()) {
          p = "round " + std::to_string(round) + ": a thread that never failed read \"" + msg + "\"";
        }
      }
      checked.wait();  // nobody fails again before every thread has read its message
    }
  });
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(problem[static_cast<size_t>(t)], "") << "thread " << t;
}

}  // namespace
