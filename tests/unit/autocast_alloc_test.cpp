// Autocast begin/end must never allocate: counted through a replaced global operator new (the
// core allocates only through it; the CPU backend's cache is warmed up first).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "context/context.h"
#include "modules/linear/linear.h"

namespace {
std::atomic<long> g_allocations{0};
}

// Every replaceable (non-aligned) form, so that new and delete always pair up (ASan checks).
void *operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void *p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void *operator new[](std::size_t n) { return operator new(n); }
void *operator new(std::size_t n, const std::nothrow_t &) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void *operator new[](std::size_t n, const std::nothrow_t &t) noexcept { return operator new(n, t); }
void operator delete(void *p) noexcept { std::free(p); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }
void operator delete[](void *p, std::size_t) noexcept { std::free(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { std::free(p); }

namespace te {
namespace {

TEST(AutocastAllocation, BeginEndPairsNeverAllocate) {
  Context ctx(Device{});
  Recipe *recipe = Recipe::create(RecipeOptions::defaults(RecipeKind::Delayed));
  Autocast &ac = ctx.autocast();
  for (int i = 0; i < 4; ++i) ac.end(ac.begin(true, false, recipe, nullptr));  // warm-up
  long before = g_allocations.load();
  for (int i = 0; i < 1000; ++i) {
    uint64_t outer = ac.begin(false, false, recipe, nullptr);
    uint64_t inner = ac.begin(true, false, recipe, nullptr);
    ac.end(inner);
    ac.end(outer);
  }
  EXPECT_EQ(g_allocations.load() - before, 0);
  recipe->release();
}

TEST(AutocastAllocation, ScopeEndWithUpdatesDoesNotAllocateAfterWarmUp) {
  Context ctx(Device{});
  Recipe *recipe = Recipe::create(RecipeOptions::defaults(RecipeKind::Delayed));
  LinearOptions o;
  o.in_features = 16;
  o.out_features = 16;
  o.bias = false;
  o.activation_dtype = DType::F32;
  Linear lin(ctx, o);
  std::vector<float> x(16 * 16, 0.5f), w(16 * 16, 0.25f), y(16 * 16);
  LinearForwardArgs args;
  args.input = make_view(x.data(), DType::F32, Device{}, 16, 16);
  args.weight = make_view(w.data(), DType::F32, Device{}, 16, 16);
  TensorView yv = make_view(y.data(), DType::F32, Device{}, 16, 16);
  Autocast &ac = ctx.autocast();
  // The update of a forward-only pass is deferred at its end and enqueued by the next begin:
  // both are counted.
  auto step = [&](long *scope_allocations) {
    long before = g_allocations.load();
    uint64_t t = ac.begin(true, false, recipe, nullptr);
    long begin_allocations = g_allocations.load() - before;
    SavedPtr saved;
    linear_forward_compute(ctx, lin, args, yv, saved, nullptr, nullptr);
    before = g_allocations.load();
    ac.end(t);  // one bucket update
    if (scope_allocations) *scope_allocations = begin_allocations + g_allocations.load() - before;
  };
  step(nullptr);
  step(nullptr);
  long allocations = -1;
  step(&allocations);
  EXPECT_EQ(allocations, 0);
  ac.settle();
  EXPECT_EQ(ctx.stats().bucket_updates, 3u);
  EXPECT_EQ(ctx.stats().update_launches, 3u);
  recipe->release();
}

TEST(LinearAllocation, TrainingStepDoesNotAllocateAfterWarmUp) {
  // forward + save + backward + destroy, inside a scope, with every output: after two warm-up
  // steps the CPU backend's cache, the bucket pools and the object pools serve everything.
  Context ctx(Device{});
  Recipe *recipe = Recipe::create(RecipeOptions::defaults(RecipeKind::Delayed));
  LinearOptions o;
  o.in_features = 32;
  o.out_features = 16;
  o.activation_dtype = DType::F32;
  Linear lin(ctx, o);
  std::vector<float> x(32 * 32, 0.5f), w(16 * 32, 0.25f), b(16, 0.1f), y(32 * 16), dy(32 * 16, 0.01f),
      dx(32 * 32), dw(16 * 32), db(16);
  const Device cpu{};
  LinearForwardArgs args;
  args.input = make_view(x.data(), DType::F32, cpu, 32, 32);
  args.weight = make_view(w.data(), DType::F32, cpu, 16, 32);
  args.bias = make_view(b.data(), DType::F32, cpu, 1, 16);
  args.bias.ndim = 1;
  args.bias.shape[0] = 16;
  LinearBackwardArgs bargs;
  bargs.dy = make_view(dy.data(), DType::F32, cpu, 32, 16);
  bargs.dx = make_view(dx.data(), DType::F32, cpu, 32, 32);
  bargs.dw = make_view(dw.data(), DType::F32, cpu, 16, 32);
  bargs.db = args.bias;
  bargs.db.data = db.data();
  bargs.once = true;
  auto step = [&] {
    Autocast &ac = ctx.autocast();
    uint64_t t = ac.begin(true, false, recipe, nullptr);
    LinearBackwardCtx *bwd = linear_pool(ctx).acquire_backward_ctx(ctx);
    linear_forward_compute(ctx, lin, args, make_view(y.data(), DType::F32, cpu, 32, 16), bwd->saved, nullptr, nullptr);
    ac.end(t);
    linear_backward(ctx, *bwd, bargs);
    linear_pool(ctx).release(bwd);
  };
  step();
  step();
  long before = g_allocations.load();
  for (int i = 0; i < 10; ++i) step();
  EXPECT_EQ(g_allocations.load() - before, 0);
  EXPECT_EQ(ctx.stats().bucket_updates, 24u);  // a forward and a backward bucket per step
  EXPECT_EQ(ctx.stats().update_launches, 12u);  // ... in one launch: the forward's was deferred
  recipe->release();
}

}  // namespace
}  // namespace te
