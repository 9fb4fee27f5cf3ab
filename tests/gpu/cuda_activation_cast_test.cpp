// Casts whose input is an activation's output or gradient (QuantizeItem::source): CUDA computes
// the activation inside the delayed-scaling cast, the block quantization, and current scaling's
// amax pass and cast. Its codes, scale_inv, amax and scale must be the bytes of the activation
// made into a buffer and cast after it (Backend's default, run on the same GPU: bit for bit for
// every activation), and of the CPU reference where the activation itself is bit-identical across
// backends (ReLU, SReLU). The bias gradient taken in the same pass is summed
// in another order than bias_grad: within fp32 rounding.
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_support.h"
#include "numerics/numerics.h"

namespace te::gpu_test {
namespace {

constexpr Device kCpu{DeviceType::CPU, 0};
constexpr Device kGpu{DeviceType::CUDA, 0};

struct SourceCase {
  QuantizeItem::Kind kind;  // Delayed, Current or Block (1x128 both ways)
  Activation act;
  bool backward;
  DType dtype;
  int64_t rows, cols;  // x's shape
  bool dbias = false;
  bool nans = true;  // NaNs in the inputs (current scaling: a NaN amax makes every code NaN)
  bool plain = false;  // no source: x is read (pre's bytes as x; a non-gated forward's shape)
  ScalingMode mode() const { return kind == QuantizeItem::Kind::Block ? ScalingMode::Block1x128 : ScalingMode::PerTensor; }
};

const char *act_name(Activation a) {
  switch (a) {
    case Activation::ReLU: return "relu";
    case Activation::GELU: return "gelu";
    case Activation::SwiGLU: return "swiglu";
    case Activation::GeGLU: return "geglu";
    case Activation::SReLU: return "srelu";
  }
  return "?";
}

std::vector<uint8_t> random_bytes(size_t n, DType t, uint32_t seed, bool nans) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<uint8_t> b(n * dtype_size(t));
  for (size_t i = 0; i < n; ++i) {
    float v = normal(rng);
    if (nans && i % 97 == 5) v = NAN;  // a NaN propagates to a NaN code and a NaN amax
    if (i % 89 == 7) v = -0.0f;
    store_from_float(b.data(), t, static_cast<int64_t>(i), v);
  }
  return b;
}

// The buffers of one case on one backend.
struct Side {
  Side(Backend &be, const SourceCase &c, const std::vector<uint8_t> &pre_host, const std::vector<uint8_t> &grad_host)
      : pre(be, pre_host),
        grad(be, grad_host),
        out(be, size_t(c.rows * c.cols)),
        out_t(be, size_t(c.rows * c.cols)),
        sinv(be, sizeof(float) * size_t(scale_inv_count(c.mode(), c.rows, c.cols))),
        sinv_t(be, sizeof(float) * size_t(scale_inv_count(c.mode(), c.cols, c.rows))),
        // Delayed: amax to accumulate into, scale, scale copy; current: amax, scale, scale_inv out.
        state(be, std::vector<float>{0.25f, 6.0f, -1.0f}),
        db(be, size_t(c.cols) * dtype_size(c.dtype)) {}
  DeviceBuffer pre, grad, out, out_t, sinv, sinv_t, state, db;
  TensorView out_view, out_t_view;  // the item's outputs (item_of)
};

// The case's item on `dev`, writing into s.
QuantizeItem item_of(Device dev, const SourceCase &c, Side &s) {
  const bool gated = is_gated(c.act);
  const int64_t pre_cols = gated && !c.backward ? 2 * c.cols : c.cols;
  const int64_t grad_cols = gated ? c.cols / 2 : c.cols;
  s.out_view = make_view(s.out.get(), DType::E4M3, dev, c.rows, c.cols);
  s.out_t_view = make_view(s.out_t.get(), DType::E4M3, dev, c.cols, c.rows);
  s.out_view.scale_inv = s.sinv.floats();
  s.out_t_view.scale_inv = s.sinv_t.floats();
  s.out_view.scaling = s.out_t_view.scaling = c.mode();
  QuantizeItem q;
  q.kind = c.kind;
  q.block_mode = c.mode();
  if (c.plain) {
    q.x = make_view(s.pre.get(), c.dtype, dev, c.rows, c.cols);
  } else {
    q.x = make_view(nullptr, c.dtype, dev, c.rows, c.cols);
    q.source.act = c.act;
    q.source.backward = c.backward;
    q.source.pre = make_view(s.pre.get(), c.dtype, dev, c.rows, pre_cols);
    if (c.backward) q.source.grad = make_view(s.grad.get(), c.dtype, dev, c.rows, grad_cols);
  }
  q.out = &s.out_view;
  q.out_t = &s.out_t_view;
  if (c.kind == QuantizeItem::Kind::Current) {
    q.amax_out = s.state.floats();
    q.scale_out = s.state.floats() + 1;
    q.scale_inv_out = s.state.floats() + 2;
    q.fp8_max = 448.0f;
  } else {
    q.scale = s.state.floats() + 1;
    q.amax_accum = s.state.floats();
    q.scale_copy = s.state.floats() + 2;
  }
  if (c.dbias) {
    q.dbias = make_view(s.db.get(), c.dtype, dev, c.cols, 1);
    q.dbias.ndim = 1;
  }
  return q;
}

// Runs the case's item on `be` through `run` (fused or the default).
template <class Run>
void run_case(Device dev, const SourceCase &c, Side &s, Run &&run) {
  const QuantizeItem q = item_of(dev, c, s);
  run(&q);
}

// The host bytes of pre and grad for a case.
struct CaseInputs {
  std::vector<uint8_t> pre, grad;
  CaseInputs(const SourceCase &c, uint32_t seed) {
    const bool gated = is_gated(c.act);
    const int64_t pre_cols = gated && !c.backward ? 2 * c.cols : c.cols;
    const int64_t grad_cols = gated ? c.cols / 2 : c.cols;
    pre = random_bytes(size_t(c.rows * pre_cols), c.dtype, seed, c.nans);
    grad = random_bytes(size_t(c.rows * grad_cols), c.dtype, seed + 1000, c.nans);
  }
};

std::string describe(const SourceCase &c) {
  using K = QuantizeItem::Kind;
  const char *kind = c.kind == K::Block ? "block " : c.kind == K::Current ? "current " : "delayed ";
  return std::string(kind) + act_name(c.act) +
         (c.backward ? " backward " : " forward ") + dtype_name(c.dtype) + " " +
         std::to_string(c.rows) + "x" + std::to_string(c.cols) + (c.dbias ? " +dbias" : "") + (c.plain ? " plain" : "");
}

void expect_same(const DeviceBuffer &a, const DeviceBuffer &b, const std::string &what) {
  const std::vector<uint8_t> x = a.read<uint8_t>(), y = b.read<uint8_t>();
  size_t bad = 0, first = x.size();
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " bytes differ, the first at byte " << first;
}

class CudaActivationCast : public GpuTest {};

TEST_F(CudaActivationCast, FusedEqualsActivationThenCast) {
  using K = QuantizeItem::Kind;
  ASSERT_TRUE(gpu->fuses_activation_cast(K::Delayed));
  ASSERT_TRUE(gpu->fuses_activation_cast(K::Current));
  ASSERT_TRUE(gpu->fuses_activation_cast(K::Block));
  std::vector<SourceCase> cases;
  const Activation acts[] = {Activation::ReLU, Activation::GELU, Activation::SwiGLU, Activation::GeGLU,
                             Activation::SReLU};
  for (K kind : {K::Delayed, K::Current, K::Block})
    for (Activation a : acts)
      for (bool bwd : {false, true}) {
        const bool nans = kind != K::Current;
        cases.push_back({kind, a, bwd, DType::BF16, 256, 384, bwd, nans});  // full tiles, vector loads
        cases.push_back({kind, a, bwd, DType::BF16, 131, 200, bwd, nans});  // ragged tiles; gated halves of 100
        cases.push_back({kind, a, bwd, DType::F32, 128, 160, false, nans});  // halves of 80 (not a multiple of 128)
        cases.push_back({kind, a, bwd, DType::F16, 32, 64, bwd, nans});     // one row of tiles: dbias written directly
        // Gated halves of whole tiles (256): the backward's tiles of d a and d b are cast in pairs,
        // full and with ragged rows.
        cases.push_back({kind, a, bwd, DType::BF16, 256, 512, bwd, nans});
        cases.push_back({kind, a, bwd, DType::F16, 200, 512, bwd, nans});
        cases.push_back({kind, a, bwd, DType::F32, 128, 256, false, nans});  // F32: pairs, block's alone
        if (kind == K::Current) {
          // More tiles than amax blocks (each block takes several), and a NaN amax.
          cases.push_back({kind, a, bwd, DType::BF16, 2304, 2048, false, false});
          cases.push_back({kind, a, bwd, DType::BF16, 256, 384, false, true});
        }
      }
  uint32_t seed = 11;
  for (const SourceCase &c : cases) {
    const std::string what = describe(c);
    const CaseInputs in(c, seed++);
    Side fused(*gpu, c, in.pre, in.grad), made(*gpu, c, in.pre, in.grad), ref(*cpu, c, in.pre, in.grad);
    run_case(kGpu, c, fused, [&](const QuantizeItem *q) { gpu->quantize_many(q, 1); });
    run_case(kGpu, c, made, [&](const QuantizeItem *q) { gpu->Backend::quantize_many(q, 1); });
    run_case(kCpu, c, ref, [&](const QuantizeItem *q) { cpu->quantize_many(q, 1); });
    expect_same(fused.out, made.out, what + " out");
    expect_same(fused.out_t, made.out_t, what + " out_t");
    expect_same(fused.sinv, made.sinv, what + " scale_inv");
    expect_same(fused.sinv_t, made.sinv_t, what + " scale_inv of out_t");
    expect_same(fused.state, made.state, what + " amax / scale / scale copy");
    if (c.act == Activation::ReLU || c.act == Activation::SReLU) {
      expect_same(fused.out, ref.out, what + " out vs the CPU");
      expect_same(fused.out_t, ref.out_t, what + " out_t vs the CPU");
      expect_same(fused.sinv, ref.sinv, what + " scale_inv vs the CPU");
      expect_same(fused.sinv_t, ref.sinv_t, what + " scale_inv of out_t vs the CPU");
      expect_same(fused.state, ref.state, what + " state vs the CPU");
    }
    if (c.dbias) {
      const std::vector<uint8_t> a = fused.db.read<uint8_t>(), b = made.db.read<uint8_t>();
      int bad = 0;
      for (int64_t col = 0; col < c.cols; ++col) {
        const double va = load_as_float(a.data(), c.dtype, col), vb = load_as_float(b.data(), c.dtype, col);
        if (std::isnan(va) && std::isnan(vb)) continue;  // a NaN in the column
        const double tol = 1e-3 * (std::fabs(vb) + 1.0) + 0.0079 * std::fabs(vb);
        if (!(std::fabs(va - vb) <= tol) && bad++ < 3)
          ADD_FAILURE() << what << " dbias[" << col << "]: fused " << va << " bias_grad " << vb;
      }
    }
  }
}

// Items of several classes of source (and plain ones) in one quantize_many call: CUDA splits them
// into launches of one class each, and every item's bytes are those of the item quantized alone.
TEST_F(CudaActivationCast, MixedClassesInOneCallEqualEachAlone) {
  using K = QuantizeItem::Kind;
  for (K kind : {K::Delayed, K::Current, K::Block}) {
    const std::vector<SourceCase> cases = {
        {kind, Activation::GELU, false, DType::BF16, 256, 384, false, false, true},   // plain
        {kind, Activation::SwiGLU, false, DType::BF16, 256, 384, false, false},       // gated forward
        {kind, Activation::GELU, true, DType::BF16, 131, 200, true, false},           // backward, dbias
        {kind, Activation::GELU, false, DType::BF16, 300, 256, false, false, true},   // plain
    };
    std::vector<CaseInputs> ins;
    std::vector<std::unique_ptr<Side>> together, alone;
    std::vector<QuantizeItem> items;
    for (size_t i = 0; i < cases.size(); ++i) {
      ins.emplace_back(cases[i], 500 + static_cast<uint32_t>(i));
      together.push_back(std::make_unique<Side>(*gpu, cases[i], ins[i].pre, ins[i].grad));
      alone.push_back(std::make_unique<Side>(*gpu, cases[i], ins[i].pre, ins[i].grad));
    }
    for (size_t i = 0; i < cases.size(); ++i) items.push_back(item_of(kGpu, cases[i], *together[i]));
    gpu->quantize_many(items.data(), static_cast<int>(items.size()));
    for (size_t i = 0; i < cases.size(); ++i)
      run_case(kGpu, cases[i], *alone[i], [&](const QuantizeItem *q) { gpu->quantize_many(q, 1); });
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::string what = "item " + std::to_string(i) + " (" + describe(cases[i]) + ")";
      expect_same(together[i]->out, alone[i]->out, what + " out");
      expect_same(together[i]->out_t, alone[i]->out_t, what + " out_t");
      expect_same(together[i]->sinv, alone[i]->sinv, what + " scale_inv");
      expect_same(together[i]->sinv_t, alone[i]->sinv_t, what + " scale_inv of out_t");
      expect_same(together[i]->state, alone[i]->state, what + " state");
      expect_same(together[i]->db, alone[i]->db, what + " dbias");
    }
  }
}

}  // namespace
}  // namespace te::gpu_test
