// te_cross_entropy on the CPU against an fp64 log-softmax written here: loss and dlogits in
// F32/BF16/F16, logits near 1e4 (the max subtraction), ignore_index rows, all rows ignored,
// in place (dlogits == logits), grad_scale, dlogits NULL; bad input of every argument is
// refused naming the function and the argument, with loss and dlogits untouched.
#include "api_test_util.h"

namespace te_test {
namespace {

const te_dtype kFloatTypes[] = {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16};

HostTensor make_targets(std::vector<int64_t> shape, const std::vector<int32_t> &v) {
  HostTensor h = make_tensor(TE_DTYPE_I32, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(v.size()), h.numel());
  std::memcpy(h.bytes.data(), v.data(), std::min(h.bytes.size(), v.size() * sizeof(int32_t)));
  return h;
}

struct Reference {
  double loss = 0;
  std::vector<double> dlogits;
};

// fp64: loss = mean over counted rows of logsumexp(x) - x[target]; dlogits = grad_scale *
// (softmax - onehot) / count, ignored rows 0.
Reference reference(const HostTensor &logits, const std::vector<int32_t> &targets, int32_t ignore, double grad_scale) {
  const int64_t vocab = logits.cols(), n = logits.rows();
  Reference r;
  r.dlogits.assign(static_cast<size_t>(n * vocab), 0.0);
  int64_t count = 0;
  for (int32_t t : targets) count += t != ignore;
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = targets[static_cast<size_t>(i)];
    if (t == ignore) continue;
    double m = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) m = std::max(m, logits.at(i * vocab + j));
    double s = 0;
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(logits.at(i * vocab + j) - m);
    total += std::log(s) + m - logits.at(i * vocab + t);
    for (int64_t j = 0; j < vocab; ++j)
      r.dlogits[static_cast<size_t>(i * vocab + j)] =
          grad_scale * (std::exp(logits.at(i * vocab + j) - m) / s - (j == t ? 1.0 : 0.0)) / static_cast<double>(count);
  }
  r.loss = count ? total / static_cast<double>(count) : 0.0;
  return r;
}

// The tolerance of one dlogits element of dtype dt: a few ulps of the stored value, relative to
// the largest gradient of the row (softmax - onehot is computed in fp32 then rounded once).
double unit(te_dtype dt) {
  return dt == TE_DTYPE_F32 ? std::ldexp(1.0, -23) : dt == TE_DTYPE_BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

void expect_matches(const HostTensor &dlogits, const Reference &ref, const char *what) {
  const te_dtype dt = dlogits.t.dtype;
  for (int64_t i = 0; i < dlogits.numel(); ++i) {
    const double want = ref.dlogits[static_cast<size_t>(i)];
    const double got = dlogits.at(i);
    // Relative error of expf(x - m) / s in fp32 ~ |x - m| * 2^-24 plus a few ulps: 64 fp32
    // ulps covers |x - m| up to ~40; then one rounding to dt. F16 adds its subnormal spacing.
    const double tol = std::fabs(want) * (unit(dt) + 64 * std::ldexp(1.0, -24)) + (dt == TE_DTYPE_F16 ? 6e-8 : 1e-30);
    ASSERT_NEAR(got, want, tol) << what << " " << dtype_name(dt) << " element " << i;
  }
}

te_cross_entropy_options options(int32_t ignore = -100, float grad_scale = 1.0f) {
  te_cross_entropy_options o;
  std::memset(&o, 0xCD, sizeof o);
  EXPECT_TE_OK(te_cross_entropy_options_init(&o));
  o.ignore_index = ignore;
  o.grad_scale = grad_scale;
  return o;
}

class CrossEntropy : public CpuContextTest {};

TEST_F(CrossEntropy, OptionsInitSetsTheDocumentedDefaults) {
  te_cross_entropy_options o;
  std::memset(&o, 0xCD, sizeof o);
  ASSERT_TE_OK(te_cross_entropy_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.ignore_index, -100);
  EXPECT_EQ(o.grad_scale, 1.0f);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_cross_entropy_options_init", "opts", te_cross_entropy_options_init(nullptr));
}

TEST_F(CrossEntropy, MatchesFp64LogSoftmaxInEveryDtype) {
  const int64_t n = 9, vocab = 1000;
  std::vector<int32_t> targets = {3, -100, 999, 0, 512, -100, 7, 7, 998};
  for (te_dtype dt : kFloatTypes) {
    for (float gs : {1.0f, 0.25f, -3.0f}) {
      HostTensor logits = random_tensor(dt, {n, vocab}, -8.0f, 8.0f, 31);
      HostTensor tg = make_targets({n}, targets);
      HostTensor loss = make_tensor(TE_DTYPE_F32, {1});
      HostTensor dlogits = make_tensor(dt, {n, vocab});
      const te_cross_entropy_options o = options(-100, gs);
      ASSERT_TE_OK(te_cross_entropy(ctx_, &o, logits.get(), tg.get(), loss.get(), dlogits.get()));
      const Reference ref = reference(logits, targets, -100, gs);
      EXPECT_NEAR(loss.at(0), ref.loss, 1e-5 * std::fabs(ref.loss)) << dtype_name(dt);
      expect_matches(dlogits, ref, "dlogits");
      for (int64_t j = 0; j < vocab; ++j) ASSERT_EQ(dlogits.at(1 * vocab + j), 0.0) << "ignored row";
    }
  }
}

TEST_F(CrossEntropy, IsStableForLogitsNear1e4) {
  const int64_t n = 4, vocab = 300;
  std::vector<int32_t> targets = {0, 150, 299, 42};
  for (te_dtype dt : kFloatTypes) {
    HostTensor logits = make_tensor(dt, {n, vocab});
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> u(-20.0f, 20.0f);
    // F16 tops out at 65504: 1e4 fits (spacing 8 there), so the spread is coarser but exact.
    for (int64_t i = 0; i < logits.numel(); ++i) logits.set(i, (i % 2 ? 1e4f : -1e4f) * (i % 3 == 0 ? 1.0f : 0.999f) + u(gen));
    HostTensor tg = make_targets({n}, targets);
    HostTensor loss = make_tensor(TE_DTYPE_F32, {1});
    HostTensor dlogits = make_tensor(dt, {n, vocab});
    ASSERT_TE_OK(te_cross_entropy(ctx_, nullptr, logits.get(), tg.get(), loss.get(), dlogits.get()));
    const Reference ref = reference(logits, targets, -100, 1.0);
    ASSERT_TRUE(std::isfinite(loss.at(0))) << dtype_name(dt);
    EXPECT_NEAR(loss.at(0), ref.loss, 1e-5 * std::fabs(ref.loss) + 1e-6) << dtype_name(dt);
    // |x - m| reaches 2e4 here: expf(x - m) of such a term is 0 in both, and the terms that
    // matter have |x - m| < 40 (the tolerance's assumption) only when they are near the max.
    for (int64_t i = 0; i < dlogits.numel(); ++i) {
      const double want = ref.dlogits[static_cast<size_t>(i)];
      ASSERT_NEAR(dlogits.at(i), want, std::fabs(want) * (unit(dt) + 1e-3) + (dt == TE_DTYPE_F16 ? 6e-8 : 1e-30)) << dtype_name(dt) << " " << i;
    }
  }
}

TEST_F(CrossEntropy, AllIgnoredGivesLossZeroAndZeroGradients) {
  HostTensor logits = random_tensor(TE_DTYPE_BF16, {3, 17}, -2.0f, 2.0f, 5);
  HostTensor tg = make_targets({3}, {5, 5, 5});
  HostTensor loss = make_tensor(TE_DTYPE_F32, {1});
  HostTensor dlogits = make_tensor(TE_DTYPE_BF16, {3, 17});  // sentinel bytes: must be overwritten
  const te_cross_entropy_options o = options(5);  // ignore_index may be a valid class
  ASSERT_TE_OK(te_cross_entropy(ctx_, &o, logits.get(), tg.get(), loss.get(), dlogits.get()));
  EXPECT_EQ(float_to_bits(static_cast<float>(loss.at(0))), 0u);
  for (int64_t i = 0; i < dlogits.numel(); ++i) ASSERT_EQ(dlogits.at(i), 0.0) << i;
}

TEST_F(CrossEntropy, CustomIgnoreIndexAndLeadingShape) {
  // logits [2, 3, vocab] with targets [2, 3]; ignore_index = 4 (a class) and -100 counts.
  const int64_t vocab = 40;
  const std::vector<int32_t> targets = {4, 0, -100, 39, 4, 12};  // -100 is out of range here: refused
  HostTensor logits = random_tensor(TE_DTYPE_F32, {2, 3, vocab}, -4.0f, 4.0f, 8);
  HostTensor tg = make_targets({2, 3}, targets);
  HostTensor loss = make_tensor(TE_DTYPE_F32, {1});
  HostTensor dlogits = make_tensor(TE_DTYPE_F32, {2, 3, vocab});
  const te_cross_entropy_options o = options(4, 2.0f);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_cross_entropy", "targets",
                 te_cross_entropy(ctx_, &o, logits.get(), tg.get(), loss.get(), dlogits.get()));
  std::vector<int32_t> ok = targets;
  ok[2] = 1;
  HostTensor tg2 = make_targets({2, 3}, ok);
  ASSERT_TE_OK(te_cross_entropy(ctx_, &o, logits.get(), tg2.get(), loss.get(), dlogits.get()));
  const Reference ref = reference(logits, ok, 4, 2.0);
  EXPECT_NEAR(loss.at(0), ref.loss, 1e-5 * std::fabs(ref.loss));
  expect_matches(dlogits, ref, "dlogits");
}

TEST_F(CrossEntropy, InPlaceAndLossOnlyGiveTheSameBits) {
  const int64_t n = 6, vocab = 257;
  const std::vector<int32_t> targets = {1, 256, -100, 0, 100, 100};
  for (te_dtype dt : kFloatTypes) {
    HostTensor logits = random_tensor(dt, {n, vocab}, -6.0f, 6.0f, 12);
    HostTensor tg = make_targets({n}, targets);
    HostTensor loss = make_tensor(TE_DTYPE_F32, {1});
    HostTensor dlogits = make_tensor(dt, {n, vocab});
    ASSERT_TE_OK(te_cross_entropy(ctx_, nullptr, logits.get(), tg.get(), loss.get(), dlogits.get()));
    HostTensor loss_only = make_tensor(TE_DTYPE_F32, {1});
    ASSERT_TE_OK(te_cross_entropy(ctx_, nullptr, logits.get(), tg.get(), loss_only.get(), nullptr));
    EXPECT_TRUE(bitwise_equal(loss, loss_only)) << dtype_name(dt);
    HostTensor inplace = logits.clone();
    HostTensor loss_in = make_tensor(TE_DTYPE_F32, {1});
    ASSERT_TE_OK(te_cross_entropy(ctx_, nullptr, inplace.get(), tg.get(), loss_in.get(), inplace.get()));
    EXPECT_TRUE(bitwise_equal(inplace, dlogits)) << dtype_name(dt);
    EXPECT_TRUE(bitwise_equal(loss_in, loss)) << dtype_name(dt);
  }
}

TEST_F(CrossEntropy, RefusesBadInputNamingItAndWritesNothing) {
  const char *fn = "te_cross_entropy";
  const int64_t n = 3, vocab = 10;
  HostTensor logits = random_tensor(TE_DTYPE_F16, {n, vocab}, -1.0f, 1.0f, 1);
  HostTensor tg = make_targets({n}, {0, 9, -100});
  HostTensor loss = make_tensor(TE_DTYPE_F32, {1});
  HostTensor dlogits = make_tensor(TE_DTYPE_F16, {n, vocab});
  const HostTensor loss0 = loss.clone(), d0 = dlogits.clone();
  const te_cross_entropy_options o = options();
  auto call = [&](const te_cross_entropy_options *opts, const te_tensor *l, const te_tensor *t, te_tensor *lo,
                  te_tensor *d) { return te_cross_entropy(ctx_, opts, l, t, lo, d); };

  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "ctx", te_cross_entropy(nullptr, &o, logits.get(), tg.get(), loss.get(), dlogits.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "logits", call(&o, nullptr, tg.get(), loss.get(), dlogits.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "targets", call(&o, logits.get(), nullptr, loss.get(), dlogits.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "loss", call(&o, logits.get(), tg.get(), nullptr, dlogits.get()));
  {
    te_cross_entropy_options small = o;
    small.struct_size = sizeof small - 1;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "opts", call(&small, logits.get(), tg.get(), loss.get(), dlogits.get()));
    small.struct_size = 0;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "opts", call(&small, logits.get(), tg.get(), loss.get(), dlogits.get()));
    for (float gs : {INFINITY, -INFINITY, NAN}) {
      te_cross_entropy_options g = o;
      g.grad_scale = gs;
      EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "grad_scale", call(&g, logits.get(), tg.get(), loss.get(), dlogits.get()));
    }
  }
  {
    HostTensor li = make_targets({n, vocab}, std::vector<int32_t>(static_cast<size_t>(n * vocab), 0));
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "logits", call(&o, li.get(), tg.get(), loss.get(), nullptr));
    HostTensor l8 = make_tensor(TE_DTYPE_E4M3, {n, vocab});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "logits", call(&o, l8.get(), tg.get(), loss.get(), nullptr));
    te_tensor lc = logits.t;
    lc.device.type = TE_DEVICE_CUDA;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "logits", call(&o, &lc, tg.get(), loss.get(), nullptr));
  }
  {
    HostTensor tf = make_tensor(TE_DTYPE_F32, {n});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "targets", call(&o, logits.get(), tf.get(), loss.get(), dlogits.get()));
    HostTensor t4 = make_targets({4}, {0, 1, 2, 3});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "targets", call(&o, logits.get(), t4.get(), loss.get(), dlogits.get()));
    te_tensor tc = tg.t;
    tc.device.type = TE_DEVICE_CUDA;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "targets", call(&o, logits.get(), &tc, loss.get(), dlogits.get()));
  }
  {
    HostTensor l2 = make_tensor(TE_DTYPE_F32, {2});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "loss", call(&o, logits.get(), tg.get(), l2.get(), dlogits.get()));
    HostTensor lb = make_tensor(TE_DTYPE_BF16, {1});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "loss", call(&o, logits.get(), tg.get(), lb.get(), dlogits.get()));
    te_tensor lc = loss.t;
    lc.device.type = TE_DEVICE_CUDA;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "loss", call(&o, logits.get(), tg.get(), &lc, dlogits.get()));
  }
  {
    HostTensor df = make_tensor(TE_DTYPE_F32, {n, vocab});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dlogits", call(&o, logits.get(), tg.get(), loss.get(), df.get()));
    HostTensor ds = make_tensor(TE_DTYPE_F16, {vocab, n});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dlogits", call(&o, logits.get(), tg.get(), loss.get(), ds.get()));
    HostTensor d3 = make_tensor(TE_DTYPE_F16, {1, n, vocab});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dlogits", call(&o, logits.get(), tg.get(), loss.get(), d3.get()));
    te_tensor dc = dlogits.t;
    dc.device.type = TE_DEVICE_CUDA;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dlogits", call(&o, logits.get(), tg.get(), loss.get(), &dc));
  }
  {  // memory shared where it must not be: dlogits partly over logits, the loss inside an input
    te_tensor dpart = dlogits.t;
    dpart.data = logits.bytes.data() + 2;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dlogits", call(&o, logits.get(), tg.get(), loss.get(), &dpart));
    te_tensor lin = loss.t;
    lin.data = logits.bytes.data() + 8;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "loss", call(&o, logits.get(), tg.get(), &lin, nullptr));
    lin.data = dlogits.bytes.data();
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "loss", call(&o, logits.get(), tg.get(), &lin, dlogits.get()));
    lin.data = tg.bytes.data();
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "loss", call(&o, logits.get(), tg.get(), &lin, dlogits.get()));
  }
  // Targets outside [0, vocab) that are not ignore_index: refused naming the token.
  for (int32_t bad : {-1, 10, -101, INT32_MAX}) {
    HostTensor bt = make_targets({n}, {0, bad, -100});
    prime_last_error(fn);
    EXPECT_EQ(call(&o, logits.get(), bt.get(), loss.get(), dlogits.get()), TE_ERROR_INVALID_ARGUMENT);
    const std::string msg = last_error();
    EXPECT_TRUE(contains_identifier(msg, fn) && contains_identifier(msg, "targets")) << msg;
    EXPECT_NE(msg.find("token 1"), std::string::npos) << msg;
  }
  // The bad value is fine once it is the ignore_index.
  {
    HostTensor bt = make_targets({n}, {0, -7, -7});
    const te_cross_entropy_options ig = options(-7);
    HostTensor l = make_tensor(TE_DTYPE_F32, {1});
    EXPECT_TE_OK(call(&ig, logits.get(), bt.get(), l.get(), nullptr));
  }
  EXPECT_TRUE(bitwise_equal(loss, loss0));
  EXPECT_TRUE(bitwise_equal(dlogits, d0));
}

}  // namespace
}  // namespace te_test
