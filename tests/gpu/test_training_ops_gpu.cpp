// Embedding and cross-entropy on the CUDA backend against the CPU reference, through the
// Backend interface (the core's validation is tested in tests/api).
// Embedding forward and backward: bit for bit (the backward's order is the definition: each row
// sums its tokens in increasing t in fp32), repeated ids, vocab 256 / 50257, 8192 tokens, dim
// 1024 BF16, rows of odd byte sizes, ids out of range (zero rows forward, skipped backward).
// Cross-entropy: loss and dlogits bit for bit too (both backends run training/cross_entropy_math.h's
// operations in the CUDA block's order, with its own exp); two GPU runs, in place and loss-only
// runs are bit-identical; all rows ignored, and an out-of-range target (NaN loss on CUDA).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/training_args.h"
#include "gpu/gpu_test_support.h"
#include "numerics/numerics.h"

namespace te::gpu_test {
namespace {

constexpr Device kCpu{DeviceType::CPU, 0};
constexpr Device kGpu{DeviceType::CUDA, 0};

template <class T>
std::vector<uint8_t> raw(const std::vector<T> &v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint8_t> to_bytes(const std::vector<float> &v, DType t) {
  std::vector<uint8_t> b(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) store_from_float(b.data(), t, static_cast<int64_t>(i), v[i]);
  return b;
}

std::vector<float> from_bytes(const std::vector<uint8_t> &b, DType t) {
  std::vector<float> v(b.size() / dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_float(b.data(), t, static_cast<int64_t>(i));
  return v;
}

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = u(rng);
  return v;
}

// Ids with heavy repeats (a third of the tokens on 4 ids), some rows unused, and `bad` of them
// out of range (negative or >= vocab).
std::vector<int32_t> skewed_ids(int64_t n, int64_t vocab, uint32_t seed, int bad = 0) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto &id : v) {
    const uint32_t r = rng();
    id = static_cast<int32_t>(r % 3 == 0 ? r % 4 : r % static_cast<uint32_t>(vocab > 8 ? vocab - 3 : vocab));
  }
  for (int i = 0; i < bad && i < n; ++i)
    v[static_cast<size_t>((i * 7919) % n)] = i % 2 ? static_cast<int32_t>(vocab + i) : -1 - i;
  return v;
}

// The same host bytes on both backends.
struct Twin {
  Twin(Backend &cpu, Backend &gpu, const std::vector<uint8_t> &host) : c(cpu, host), g(gpu, host) {}
  Twin(Backend &cpu, Backend &gpu, size_t bytes) : c(cpu, bytes), g(gpu, bytes) {}
  void *on(int b) const { return b == 0 ? c.get() : g.get(); }
  DeviceBuffer c, g;
};

std::string first_diff(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b, size_t elem) {
  if (a.size() != b.size()) return "size " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); i += elem) {
    if (std::memcmp(&a[i], &b[i], elem) == 0) continue;
    uint32_t x = 0, y = 0;
    std::memcpy(&x, &a[i], elem);
    std::memcpy(&y, &b[i], elem);
    char text[160];
    std::snprintf(text, sizeof text, "element %zu: cpu 0x%x gpu 0x%x (of %zu)", i / elem, x, y, a.size() / elem);
    return text;
  }
  return "";
}

struct EmbCase {
  int64_t vocab, dim, tokens;
  DType dt;
  int bad_ids;
};

std::string describe(const EmbCase &k) {
  return "vocab " + std::to_string(k.vocab) + " dim " + std::to_string(k.dim) + " tokens " + std::to_string(k.tokens) +
         " " + dtype_name(k.dt) + " bad ids " + std::to_string(k.bad_ids);
}

const EmbCase kEmbCases[] = {
    {256, 1024, 8192, DType::BF16, 0},   {50257, 1024, 8192, DType::BF16, 0}, {50257, 1024, 8192, DType::BF16, 9},
    {1000, 37, 513, DType::F16, 3},      {300, 64, 1000, DType::F32, 2},      {7, 3, 5, DType::F32, 0},
    {1024, 16384, 2048, DType::BF16, 0}, {1000003, 8, 3000, DType::F32, 1},
};

class TrainingOpsGpu : public GpuTest {};

TEST_F(TrainingOpsGpu, EmbeddingForwardIsBitIdenticalAndZeroesOutOfRangeIds) {
  for (const EmbCase &k : kEmbCases) {
    const std::vector<int32_t> ids = skewed_ids(k.tokens, k.vocab, 11, k.bad_ids);
    Twin table(*cpu, *gpu, to_bytes(uniform(static_cast<size_t>(k.vocab * k.dim), -2.0f, 2.0f, 3), k.dt));
    Twin idb(*cpu, *gpu, raw(ids));
    const size_t ybytes = static_cast<size_t>(k.tokens * k.dim) * dtype_size(k.dt);
    Twin y(*cpu, *gpu, std::vector<uint8_t>(ybytes, 0xA5));  // sentinel: every byte must be written
    for (int b = 0; b < 2; ++b) {
      const Device dev = b ? kGpu : kCpu;
      EmbeddingForwardArgs a;
      a.table = make_view(table.on(b), k.dt, dev, k.vocab, k.dim);
      a.ids = make_view(idb.on(b), DType::I32, dev, k.tokens, 1);
      a.y = make_view(y.on(b), k.dt, dev, k.tokens, k.dim);
      (b ? *gpu : *cpu).embedding_forward(a);
    }
    const std::vector<uint8_t> yc = y.c.read<uint8_t>(), yg = y.g.read<uint8_t>();
    EXPECT_EQ(first_diff(yc, yg, dtype_size(k.dt)), "") << describe(k);
    const size_t row = static_cast<size_t>(k.dim) * dtype_size(k.dt);
    for (size_t t = 0; t < ids.size(); ++t) {
      if (ids[t] >= 0 && ids[t] < k.vocab) continue;
      for (size_t i = 0; i < row; ++i) ASSERT_EQ(yg[t * row + i], 0) << describe(k) << " token " << t;
    }
  }
}

TEST_F(TrainingOpsGpu, EmbeddingBackwardIsBitIdenticalAndDeterministic) {
  for (const EmbCase &k : kEmbCases) {
    for (DType dyt : {k.dt, DType::F32}) {
      for (int accumulate = 0; accumulate <= 1; ++accumulate) {
        const std::vector<int32_t> ids = skewed_ids(k.tokens, k.vocab, 21 + accumulate, k.bad_ids);
        Twin idb(*cpu, *gpu, raw(ids));
        Twin dy(*cpu, *gpu, to_bytes(uniform(static_cast<size_t>(k.tokens * k.dim), -1.0f, 1.0f, 5), dyt));
        const std::vector<uint8_t> init =
            accumulate ? raw(uniform(static_cast<size_t>(k.vocab * k.dim), -3.0f, 3.0f, 6))
                       : std::vector<uint8_t>(static_cast<size_t>(k.vocab * k.dim) * 4, 0xA5);
        Twin dtable(*cpu, *gpu, init);
        for (int b = 0; b < 2; ++b) {
          const Device dev = b ? kGpu : kCpu;
          EmbeddingBackwardArgs a;
          a.ids = make_view(idb.on(b), DType::I32, dev, k.tokens, 1);
          a.dy = make_view(dy.on(b), dyt, dev, k.tokens, k.dim);
          a.dtable = make_view(dtable.on(b), DType::F32, dev, k.vocab, k.dim);
          a.accumulate = accumulate != 0;
          Backend &be = b ? *gpu : *cpu;
          ScratchPlan plan;
          be.plan_embedding_backward(a, &plan);
          be.reserve(plan);
          be.embedding_backward(a);
        }
        const std::vector<uint8_t> first = dtable.g.read<uint8_t>();
        EXPECT_EQ(first_diff(dtable.c.read<uint8_t>(), first, 4), "")
            << describe(k) << " dy " << dtype_name(dyt) << " accumulate " << accumulate;
        if (!accumulate) {  // a second GPU run over the result: the same bits again
          EmbeddingBackwardArgs a;
          a.ids = make_view(idb.g.get(), DType::I32, kGpu, k.tokens, 1);
          a.dy = make_view(dy.g.get(), dyt, kGpu, k.tokens, k.dim);
          a.dtable = make_view(dtable.g.get(), DType::F32, kGpu, k.vocab, k.dim);
          gpu->embedding_backward(a);
          EXPECT_EQ(first_diff(first, dtable.g.read<uint8_t>(), 4), "") << describe(k) << " rerun";
        }
      }
    }
  }
}

TEST_F(TrainingOpsGpu, EmbeddingBackwardSumsOneHotRowInTokenOrder) {
  // Every token on one id: a segment of 8192 summed in order (the sort must be stable).
  const int64_t vocab = 5, dim = 300, tokens = 8192;
  std::vector<int32_t> ids(static_cast<size_t>(tokens), 3);
  Twin idb(*cpu, *gpu, raw(ids));
  // Values of mixed magnitudes, so that another order gives other bits.
  std::vector<float> dv = uniform(static_cast<size_t>(tokens * dim), -1.0f, 1.0f, 9);
  for (size_t i = 0; i < dv.size(); i += 3) dv[i] *= 4096.0f;
  Twin dy(*cpu, *gpu, raw(dv));
  Twin dtable(*cpu, *gpu, static_cast<size_t>(vocab * dim) * 4);
  for (int b = 0; b < 2; ++b) {
    const Device dev = b ? kGpu : kCpu;
    EmbeddingBackwardArgs a;
    a.ids = make_view(idb.on(b), DType::I32, dev, tokens, 1);
    a.dy = make_view(dy.on(b), DType::F32, dev, tokens, dim);
    a.dtable = make_view(dtable.on(b), DType::F32, dev, vocab, dim);
    (b ? *gpu : *cpu).embedding_backward(a);
  }
  EXPECT_EQ(first_diff(dtable.c.read<uint8_t>(), dtable.g.read<uint8_t>(), 4), "");
}

struct CeCase {
  int64_t rows, vocab;
  DType dt;
  float grad_scale;
  float center;  // logits = center + uniform(-8, 8)
};

std::string describe(const CeCase &k) {
  return std::to_string(k.rows) + "x" + std::to_string(k.vocab) + " " + dtype_name(k.dt) + " grad_scale " +
         std::to_string(k.grad_scale) + " center " + std::to_string(k.center);
}

const CeCase kCeCases[] = {
    {64, 50257, DType::BF16, 1.0f, 0.0f}, {5, 262144, DType::F32, 1.0f, 0.0f},  {1000, 1000, DType::F16, 0.5f, 0.0f},
    {3, 7, DType::F32, 2.0f, 0.0f},       {8, 32000, DType::F32, 1.0f, 1e4f},  {8, 32000, DType::BF16, 1.0f, 1e4f},
    {100000, 64, DType::BF16, 1.0f, 0.0f},
};

double unit(DType t) { return t == DType::F32 ? std::ldexp(1.0, -23) : t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

// Targets: every 5th ignored (-100), the rest in range; `invalid` puts vocab at row 1.
std::vector<int32_t> make_targets(int64_t rows, int64_t vocab, uint32_t seed, bool all_ignored = false, bool invalid = false) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i)
    t[static_cast<size_t>(i)] = (all_ignored || i % 5 == 2) ? -100 : static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  if (invalid && rows > 1) t[1] = static_cast<int32_t>(vocab);
  return t;
}

struct CeRun {
  float loss;
  std::vector<uint8_t> dlogits;
};

// Runs the cross-entropy on backend b (0 CPU, 1 GPU); in_place writes dlogits over the logits.
CeRun run_ce(Backend &be, int b, const CeCase &k, const std::vector<uint8_t> &logits, const std::vector<int32_t> &targets,
             bool want_grad, bool in_place) {
  const Device dev = b ? kGpu : kCpu;
  DeviceBuffer lb(be, logits), tb(be, raw(targets)), loss(be, raw(std::vector<float>{-7.0f}));
  DeviceBuffer db(be, std::vector<uint8_t>(logits.size(), 0xA5));
  CrossEntropyArgs a;
  a.logits = make_view(lb.get(), k.dt, dev, k.rows, k.vocab);
  a.targets = make_view(tb.get(), DType::I32, dev, k.rows, 1);
  a.loss = loss.floats();
  if (want_grad) a.dlogits = make_view(in_place ? lb.get() : db.get(), k.dt, dev, k.rows, k.vocab);
  a.grad_scale = k.grad_scale;
  ScratchPlan plan;
  be.plan_cross_entropy(a, &plan);
  be.reserve(plan);
  be.cross_entropy(a);
  CeRun r;
  r.loss = loss.read<float>()[0];
  if (want_grad) r.dlogits = in_place ? lb.read<uint8_t>() : db.read<uint8_t>();
  return r;
}

TEST_F(TrainingOpsGpu, CrossEntropyIsBitIdenticalToTheCpu) {
  for (const CeCase &k : kCeCases) {
    std::vector<float> lv = uniform(static_cast<size_t>(k.rows * k.vocab), -8.0f, 8.0f, 17);
    for (auto &x : lv) x += k.center;
    const std::vector<uint8_t> logits = to_bytes(lv, k.dt);
    const std::vector<int32_t> targets = make_targets(k.rows, k.vocab, 4);
    int64_t count = 0;
    for (int32_t t : targets) count += t != -100;
    const CeRun c = run_ce(*cpu, 0, k, logits, targets, true, false);
    const CeRun g = run_ce(*gpu, 1, k, logits, targets, true, false);
    // Bit for bit: the same operations in the same order (training/cross_entropy_math.h).
    uint32_t lc, lg;
    std::memcpy(&lc, &c.loss, 4), std::memcpy(&lg, &g.loss, 4);
    EXPECT_EQ(lc, lg) << describe(k) << ": loss cpu " << c.loss << " gpu " << g.loss;
    EXPECT_EQ(first_diff(c.dlogits, g.dlogits, dtype_size(k.dt)), "") << describe(k);
    // And near the CPU within a tight tolerance in any case (a diagnostic when the bits differ).
    const double factor = std::fabs(k.grad_scale) / static_cast<double>(count);
    EXPECT_NEAR(g.loss, c.loss, 1e-6 * std::fabs(c.loss) + 1e-6) << describe(k);
    const std::vector<float> dc = from_bytes(c.dlogits, k.dt), dg = from_bytes(g.dlogits, k.dt);
    for (size_t i = 0; i < dc.size(); ++i)
      ASSERT_NEAR(dg[i], dc[i], 1e-6 * factor + unit(k.dt) * std::fabs(dc[i]) + (k.dt == DType::F16 ? 6e-8 : 0.0))
          << describe(k) << " element " << i;
    // Deterministic: a second GPU run, an in-place run and a loss-only run give the same bits.
    const CeRun g2 = run_ce(*gpu, 1, k, logits, targets, true, false);
    const CeRun gi = run_ce(*gpu, 1, k, logits, targets, true, true);
    const CeRun gl = run_ce(*gpu, 1, k, logits, targets, false, false);
    EXPECT_EQ(first_diff(g.dlogits, g2.dlogits, dtype_size(k.dt)), "") << describe(k) << " rerun";
    EXPECT_EQ(first_diff(g.dlogits, gi.dlogits, dtype_size(k.dt)), "") << describe(k) << " in place";
    uint32_t b1, b2, b3, b4;
    std::memcpy(&b1, &g.loss, 4), std::memcpy(&b2, &g2.loss, 4), std::memcpy(&b3, &gi.loss, 4), std::memcpy(&b4, &gl.loss, 4);
    EXPECT_TRUE(b1 == b2 && b1 == b3 && b1 == b4) << describe(k);
  }
}

TEST_F(TrainingOpsGpu, CrossEntropyAllIgnoredAndInvalidTargets) {
  const CeCase k{6, 1000, DType::BF16, 1.0f, 0.0f};
  const std::vector<uint8_t> logits = to_bytes(uniform(static_cast<size_t>(k.rows * k.vocab), -3.0f, 3.0f, 2), k.dt);
  {
    const CeRun g = run_ce(*gpu, 1, k, logits, make_targets(k.rows, k.vocab, 1, true), true, false);
    EXPECT_EQ(g.loss, 0.0f);
    EXPECT_FALSE(std::signbit(g.loss));
    for (uint8_t byte : g.dlogits) ASSERT_EQ(byte, 0);
  }
  {
    // A target outside [0, vocab) on CUDA: that row's loss is NaN, so the mean is NaN; the other
    // rows' gradients are as the CPU computes them with the row's target counted.
    const std::vector<int32_t> bad = make_targets(k.rows, k.vocab, 3, false, true);
    const CeRun g = run_ce(*gpu, 1, k, logits, bad, true, false);
    EXPECT_TRUE(std::isnan(g.loss));
    std::vector<int32_t> fixed = bad;
    fixed[1] = 0;
    const CeRun c = run_ce(*cpu, 0, k, logits, fixed, true, false);
    const std::vector<float> dc = from_bytes(c.dlogits, k.dt), dg = from_bytes(g.dlogits, k.dt);
    for (int64_t r = 0; r < k.rows; ++r)
      for (int64_t j = 0; j < k.vocab; ++j) {
        const size_t i = static_cast<size_t>(r * k.vocab + j);
        if (r == 1) ASSERT_TRUE(std::isnan(dg[i])) << j;
        else ASSERT_EQ(dg[i], dc[i]) << r << " " << j;
      }
  }
}

}  // namespace
}  // namespace te::gpu_test
