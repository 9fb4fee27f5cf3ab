// The CUDA backend's kernels against the CPU reference on the same inputs: bit for bit for every
// cast, quantization, amax, scale formula and scale update (and ReLU / SReLU); a tight float
// tolerance for the other activations (tanhf / expf may differ in the last ulp) and bias_grad
// (summation order).
// TE_GPU_TEST_QUICK=1 leaves out the largest shapes (for runs under compute-sanitizer).
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

bool quick() {
  const char *q = std::getenv("TE_GPU_TEST_QUICK");
  return q != nullptr && q[0] == '1';
}

struct Shape {
  int64_t rows, cols;
};

std::vector<Shape> shapes() {
  std::vector<Shape> s = {{1, 1},    {1, 7},    {7, 1},     {1, 300},   {300, 1},   {16, 16},   {128, 128},
                          {131, 257}, {129, 127}, {256, 384}, {48, 272}, {200, 96},  {1, 4096}, {4096, 1},
                          {257, 131}, {384, 512}};
  if (!quick()) s.push_back({1024, 4096});
  return s;
}

std::string name(Shape s) { return std::to_string(s.rows) + "x" + std::to_string(s.cols); }

// Random floats over many magnitudes, with the edge values sprinkled in when `specials`.
std::vector<float> random_floats(size_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-12, 12);
  std::uniform_int_distribution<int> pick(0, 63);
  const float edge[] = {NAN, -NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 500.0f, -70000.0f, 1e-40f, -1e-40f,
                        -0.0f, 0.0f, FLT_MIN, 448.0f, 464.0f, 57344.0f, 61440.0f, FLT_MAX, -FLT_MAX};
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::ldexp(normal(rng), expo(rng));
    if (specials && pick(rng) == 0) v[i] = edge[rng() % (sizeof edge / sizeof edge[0])];
  }
  return v;
}

// Host bytes of `v` in dtype t (F32 / F16 / BF16), via the reference conversions.
std::vector<uint8_t> to_bytes(const std::vector<float> &v, DType t) {
  std::vector<uint8_t> b(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) store_from_float(b.data(), t, static_cast<int64_t>(i), v[i]);
  return b;
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The same host data on both backends.
struct Twin {
  Twin(Backend &cpu, Backend &gpu, const std::vector<uint8_t> &host) : c(cpu, host), g(gpu, host) {}
  Twin(Backend &cpu, Backend &gpu, size_t bytes) : c(cpu, bytes), g(gpu, bytes) {}
  DeviceBuffer c, g;
};

template <class T>
std::vector<uint8_t> raw(const std::vector<T> &v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// First mismatch of two byte buffers, or "".
std::string first_diff(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b, size_t elem = 1) {
  if (a.size() != b.size()) return "size " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); i += elem) {
    if (std::memcmp(&a[i], &b[i], elem) != 0) {
      char text[160];
      uint32_t x = 0, y = 0;
      std::memcpy(&x, &a[i], elem);
      std::memcpy(&y, &b[i], elem);
      std::snprintf(text, sizeof text, "element %zu: cpu 0x%x gpu 0x%x (of %zu)", i / elem, x, y, a.size() / elem);
      return text;
    }
  }
  return "";
}

#define EXPECT_SAME_BYTES(twin, elem, what)                                                                  \
  do {                                                                                                       \
    const std::string d_ = first_diff((twin).c.read<uint8_t>(), (twin).g.read<uint8_t>(), (elem));         \
    EXPECT_EQ(d_, "") << what;                                                                              \
  } while (0)

const DType kInTypes[] = {DType::F32, DType::F16, DType::BF16};

class CudaKernels : public GpuTest {};

// ---- casts ---------------------------------------------------------------------------------

TEST_F(CudaKernels, CastTransposeMatchesCpu) {
  struct Outs {
    bool out, out_t;
    DType t, tt;
  };
  const Outs outs[] = {{true, true, DType::E4M3, DType::E4M3},
                       {true, true, DType::E5M2, DType::E5M2},
                       {true, true, DType::E4M3, DType::E5M2},
                       {true, false, DType::E5M2, DType::E5M2},
                       {false, true, DType::E4M3, DType::E4M3},
                       {false, false, DType::E4M3, DType::E4M3}};
  uint32_t seed = 1;
  for (Shape s : shapes()) {
    for (DType in : kInTypes) {
      for (const Outs &o : outs) {
        for (int variant = 0; variant < 2; ++variant) {  // 0: finite values, 1: edge values too
          if (s.rows * s.cols > 100000 && (o.t != o.tt || !o.out || variant == 0)) continue;
          const bool with_amax = (seed % 3) != 0;
          const size_t n = static_cast<size_t>(s.rows * s.cols);
          Twin x(*cpu, *gpu, to_bytes(random_floats(n, seed++, variant == 1), in));
          const float scale_values[] = {1.0f, 0.37f, 1024.0f, 3.5e-3f, 200.0f};
          Twin scale(*cpu, *gpu, raw(std::vector<float>{scale_values[seed % 5]}));
          Twin amax(*cpu, *gpu, raw(std::vector<float>{0.25f}));
          Twin out(*cpu, *gpu, n), out_t(*cpu, *gpu, n), si(*cpu, *gpu, 8), si_t(*cpu, *gpu, 8);
          for (int b = 0; b < 2; ++b) {
            Backend &be = b == 0 ? *cpu : *gpu;
            const Device dev = b == 0 ? kCpu : kGpu;
            auto pick = [&](Twin &t) { return b == 0 ? t.c.get() : t.g.get(); };
            TensorView xv = make_view(pick(x), in, dev, s.rows, s.cols);
            TensorView ov = make_view(pick(out), o.t, dev, s.rows, s.cols);
            ov.scale_inv = static_cast<float *>(pick(si));
            TensorView otv = make_view(pick(out_t), o.tt, dev, s.cols, s.rows);
            otv.scale_inv = static_cast<float *>(pick(si_t));
            be.cast_transpose(xv, static_cast<float *>(pick(scale)), with_amax ? static_cast<float *>(pick(amax)) : nullptr,
                              o.out ? &ov : nullptr, o.out_t ? &otv : nullptr);
          }
          const std::string what = name(s) + " in=" + dtype_name(in) + " out=" + (o.out ? dtype_name(o.t) : "-") +
                                   " out_t=" + (o.out_t ? dtype_name(o.tt) : "-") + " variant=" + std::to_string(variant);
          EXPECT_SAME_BYTES(out, 1, what << " out");
          EXPECT_SAME_BYTES(out_t, 1, what << " out_t");
          EXPECT_SAME_BYTES(si, 4, what << " scale_inv");
          EXPECT_SAME_BYTES(si_t, 4, what << " scale_inv_t");
          EXPECT_SAME_BYTES(amax, 4, what << " amax");
        }
      }
    }
  }
}

// Every FP8 code's value, the midpoints between neighbours (ties) and one ulp either side, values
// beyond the largest finite, denormals, zeros, infinities and NaNs, at scale 1.
TEST_F(CudaKernels, CastRoundingEdgesMatchCpu) {
  std::vector<float> v;
  for (DType t : {DType::E4M3, DType::E5M2}) {
    for (int c = 0; c < 0x7F; ++c) {
      const float a = fp8_to_float(static_cast<uint8_t>(c), t), b = fp8_to_float(static_cast<uint8_t>(c + 1), t);
      if (std::isnan(a) || std::isnan(b) || std::isinf(b)) continue;
      const float mid = 0.5f * (a + b);
      for (float x : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        v.push_back(x);
        v.push_back(-x);
      }
    }
  }
  for (float x : {NAN, -NAN, INFINITY, -INFINITY, 448.0f, 464.0f, 463.99f, 480.0f, 57344.0f, 61439.0f, 61440.0f,
                  1e38f, FLT_MAX, 1e-40f, FLT_MIN, 0x1p-10f, 0x1p-10f * 1.0001f, 0x1p-17f, 0x1p-17f * 1.0001f, 0.0f,
                  -0.0f})
    for (float s : {1.0f, -1.0f}) v.push_back(s * x);
  const int64_t n = static_cast<int64_t>(v.size());
  for (DType t : {DType::E4M3, DType::E5M2}) {
    Twin x(*cpu, *gpu, raw(v)), scale(*cpu, *gpu, raw(std::vector<float>{1.0f})), out(*cpu, *gpu, v.size()), si(*cpu, *gpu, 4);
    for (int b = 0; b < 2; ++b) {
      Backend &be = b == 0 ? *cpu : *gpu;
      const Device dev = b == 0 ? kCpu : kGpu;
      auto pick = [&](Twin &tw) { return b == 0 ? tw.c.get() : tw.g.get(); };
      TensorView xv = make_view(pick(x), DType::F32, dev, 1, n);
      TensorView ov = make_view(pick(out), t, dev, 1, n);
      ov.scale_inv = static_cast<float *>(pick(si));
      be.cast_transpose(xv, static_cast<float *>(pick(scale)), nullptr, &ov, nullptr);
    }
    EXPECT_SAME_BYTES(out, 1, dtype_name(t));
  }
}

// Current scaling: amax -> scale_from_amax -> cast_transpose, all on the device.
TEST_F(CudaKernels, CurrentScalingChainMatchesCpu) {
  uint32_t seed = 100;
  for (Shape s : shapes()) {
    for (DType in : kInTypes) {
      for (DType t : {DType::E4M3, DType::E5M2}) {
        for (int p2 = 0; p2 < 2; ++p2) {
          const size_t n = static_cast<size_t>(s.rows * s.cols);
          Twin x(*cpu, *gpu, to_bytes(random_floats(n, seed++, false), in));
          Twin amax(*cpu, *gpu, 4), scale(*cpu, *gpu, 4), sinv(*cpu, *gpu, 4), out(*cpu, *gpu, n), out_t(*cpu, *gpu, n), si(*cpu, *gpu, 4);
          for (int b = 0; b < 2; ++b) {
            Backend &be = b == 0 ? *cpu : *gpu;
            const Device dev = b == 0 ? kCpu : kGpu;
            auto f = [&](Twin &tw) { return static_cast<float *>(b == 0 ? tw.c.get() : tw.g.get()); };
            TensorView xv = make_view(b == 0 ? x.c.get() : x.g.get(), in, dev, s.rows, s.cols);
            be.amax(xv, f(amax), false);
            be.scale_from_amax(f(amax), f(scale), f(sinv), fp8_max(t), p2 == 1, 0.0f);
            TensorView ov = make_view(f(out), t, dev, s.rows, s.cols);
            ov.scale_inv = f(si);
            TensorView otv = make_view(f(out_t), t, dev, s.cols, s.rows);
            otv.scale_inv = f(si);
            be.cast_transpose(xv, f(scale), nullptr, &ov, &otv);
          }
          const std::string what = name(s) + " " + dtype_name(in) + "->" + dtype_name(t) + " p2=" + std::to_string(p2);
          EXPECT_SAME_BYTES(amax, 4, what << " amax");
          EXPECT_SAME_BYTES(scale, 4, what << " scale");
          EXPECT_SAME_BYTES(sinv, 4, what << " scale_inv");
          EXPECT_SAME_BYTES(out, 1, what << " out");
          EXPECT_SAME_BYTES(out_t, 1, what << " out_t");
          EXPECT_SAME_BYTES(si, 4, what << " out scale_inv");
        }
      }
    }
  }
}

TEST_F(CudaKernels, ScaleFromAmaxEdgesMatchCpu) {
  const float amaxes[] = {0.0f, -0.0f, 1e-45f, 1e-40f, 1e-38f, 1e-30f, 1e-12f, 0.001f, 1.0f, 3.0f, 448.0f, 1000.0f,
                          57344.0f, 1e30f, FLT_MAX, INFINITY, NAN, -1.0f, -INFINITY};
  const float epsilons[] = {0.0f, 1e-12f, 1.0f};
  for (float a : amaxes)
    for (float eps : epsilons)
      for (DType t : {DType::E4M3, DType::E5M2})
        for (int p2 = 0; p2 < 2; ++p2) {
          Twin amax(*cpu, *gpu, raw(std::vector<float>{a})), scale(*cpu, *gpu, 4), sinv(*cpu, *gpu, 4);
          cpu->scale_from_amax(amax.c.floats(), scale.c.floats(), sinv.c.floats(), fp8_max(t), p2 == 1, eps);
          gpu->scale_from_amax(amax.g.floats(), scale.g.floats(), sinv.g.floats(), fp8_max(t), p2 == 1, eps);
          const std::string what = "amax=" + std::to_string(a) + " eps=" + std::to_string(eps) + " " + dtype_name(t) +
                                   " p2=" + std::to_string(p2);
          EXPECT_SAME_BYTES(scale, 4, what);
          EXPECT_SAME_BYTES(sinv, 4, what);
        }
}

TEST_F(CudaKernels, AmaxMatchesCpu) {
  uint32_t seed = 200;
  for (Shape s : shapes()) {
    for (DType in : kInTypes) {
      for (int variant = 0; variant < 4; ++variant) {  // finite | edge values | one inf | one NaN
        const size_t n = static_cast<size_t>(s.rows * s.cols);
        std::vector<float> v = random_floats(n + 1, seed++, variant == 1);
        if (variant == 2) v[seed % n] = -INFINITY;
        if (variant == 3) v[seed % n] = NAN;
        for (int offset = 0; offset < 2; ++offset) {  // 1: an unaligned start (scalar path)
          for (int acc = 0; acc < 2; ++acc) {
            Twin x(*cpu, *gpu, to_bytes(v, in)), amax(*cpu, *gpu, raw(std::vector<float>{acc ? 0.5f : 123.0f}));
            const size_t esize = dtype_size(in);
            for (int b = 0; b < 2; ++b) {
              Backend &be = b == 0 ? *cpu : *gpu;
              void *base = b == 0 ? x.c.get() : x.g.get();
              TensorView xv = make_view(static_cast<char *>(base) + offset * esize, in, b == 0 ? kCpu : kGpu, s.rows, s.cols);
              be.amax(xv, b == 0 ? amax.c.floats() : amax.g.floats(), acc == 1);
            }
            EXPECT_SAME_BYTES(amax, 4, name(s) << " " << dtype_name(in) << " variant=" << variant << " offset=" << offset
                                               << " acc=" << acc);
          }
        }
      }
    }
  }
}

// ---- block quantization ------------------------------------------------------------------------

int64_t blocks128(int64_t n) { return (n + 127) / 128; }

TEST_F(CudaKernels, BlockQuantizeMatchesCpu) {
  uint32_t seed = 300;
  struct Outs {
    bool out, out_t;
    DType t, tt;
  };
  const Outs outs[] = {{true, true, DType::E4M3, DType::E4M3},
                       {true, true, DType::E5M2, DType::E4M3},
                       {true, false, DType::E4M3, DType::E4M3},
                       {false, true, DType::E5M2, DType::E5M2}};
  for (Shape s : shapes()) {
    for (DType in : kInTypes) {
      for (ScalingMode mode : {ScalingMode::Block1x128, ScalingMode::Block128x128}) {
        for (const Outs &o : outs) {
          for (int p2 = 0; p2 < 2; ++p2) {
            for (float eps : {0.0f, 1e-3f}) {
              const bool big = s.rows * s.cols > 100000;
              if (big && (o.t != o.tt || eps != 0.0f)) continue;
              const int variant = seed % 3;  // 0 finite, 1 edge values, 2 finite with zero blocks
              const size_t n = static_cast<size_t>(s.rows * s.cols);
              std::vector<float> v = random_floats(n, seed++, variant == 1);
              if (variant == 2)
                for (size_t i = 0; i < n && i < 3000; ++i) v[i] = 0.0f;
              Twin x(*cpu, *gpu, to_bytes(v, in)), out(*cpu, *gpu, n), out_t(*cpu, *gpu, n);
              const size_t ns = static_cast<size_t>(
                  mode == ScalingMode::Block1x128 ? s.rows * blocks128(s.cols) : blocks128(s.rows) * blocks128(s.cols));
              const size_t ns_t = static_cast<size_t>(
                  mode == ScalingMode::Block1x128 ? s.cols * blocks128(s.rows) : blocks128(s.rows) * blocks128(s.cols));
              Twin si(*cpu, *gpu, ns * 4), si_t(*cpu, *gpu, ns_t * 4);
              for (int b = 0; b < 2; ++b) {
                Backend &be = b == 0 ? *cpu : *gpu;
                const Device dev = b == 0 ? kCpu : kGpu;
                auto pick = [&](Twin &tw) { return b == 0 ? tw.c.get() : tw.g.get(); };
                TensorView xv = make_view(pick(x), in, dev, s.rows, s.cols);
                TensorView ov = make_view(pick(out), o.t, dev, s.rows, s.cols);
                ov.scale_inv = static_cast<float *>(pick(si));
                ov.scaling = mode;
                TensorView otv = make_view(pick(out_t), o.tt, dev, s.cols, s.rows);
                otv.scale_inv = static_cast<float *>(pick(si_t));
                otv.scaling = mode;
                be.block_quantize(xv, mode, p2 == 1, eps, o.out ? &ov : nullptr, o.out_t ? &otv : nullptr);
              }
              const std::string what = name(s) + " " + dtype_name(in) + (mode == ScalingMode::Block1x128 ? " 1x128" : " 128x128") +
                                       " out=" + (o.out ? dtype_name(o.t) : "-") + " out_t=" + (o.out_t ? dtype_name(o.tt) : "-") +
                                       " p2=" + std::to_string(p2) + " eps=" + std::to_string(eps) +
                                       " variant=" + std::to_string(variant);
              EXPECT_SAME_BYTES(out, 1, what << " out");
              EXPECT_SAME_BYTES(out_t, 1, what << " out_t");
              EXPECT_SAME_BYTES(si, 4, what << " scale_inv");
              EXPECT_SAME_BYTES(si_t, 4, what << " scale_inv_t");
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaKernels, DequantizeMatchesCpu) {
  std::mt19937 rng(400);
  for (Shape s : shapes()) {
    if (s.rows * s.cols > 100000) continue;
    for (DType t : {DType::E4M3, DType::E5M2}) {
      for (ScalingMode mode : {ScalingMode::PerTensor, ScalingMode::Block1x128, ScalingMode::Block128x128}) {
        for (DType od : kInTypes) {
          const size_t n = static_cast<size_t>(s.rows * s.cols);
          std::vector<uint8_t> codes(n);
          for (auto &c : codes) c = static_cast<uint8_t>(rng());  // every code, NaNs included
          const size_t ns = static_cast<size_t>(mode == ScalingMode::PerTensor ? 1
                                                : mode == ScalingMode::Block1x128 ? s.rows * blocks128(s.cols)
                                                                                  : blocks128(s.rows) * blocks128(s.cols));
          std::vector<float> sinv(ns);
          const float special[] = {0.0f, INFINITY, 1e-30f, 1e30f, NAN};
          for (size_t i = 0; i < ns; ++i)
            sinv[i] = (rng() % 16 == 0) ? special[rng() % 5] : std::ldexp(1.0f + (rng() % 1000) / 999.0f, int(rng() % 30) - 15);
          Twin x(*cpu, *gpu, codes), si(*cpu, *gpu, raw(sinv)), out(*cpu, *gpu, n * dtype_size(od));
          for (int b = 0; b < 2; ++b) {
            Backend &be = b == 0 ? *cpu : *gpu;
            const Device dev = b == 0 ? kCpu : kGpu;
            TensorView xv = make_view(b == 0 ? x.c.get() : x.g.get(), t, dev, s.rows, s.cols);
            xv.scale_inv = b == 0 ? si.c.floats() : si.g.floats();
            xv.scaling = mode;
            TensorView ov = make_view(b == 0 ? out.c.get() : out.g.get(), od, dev, s.rows, s.cols);
            be.dequantize(xv, ov);
          }
          EXPECT_SAME_BYTES(out, dtype_size(od), name(s) << " " << dtype_name(t) << " mode=" << int(mode) << " -> "
                                                         << dtype_name(od));
        }
      }
    }
  }
}

// ---- scaling-state maintenance -------------------------------------------------------------------

TEST_F(CudaKernels, ScaleUpdateAndGatherMatchCpu) {
  std::mt19937 rng(500);
  const int lens[] = {1, 2, 31, 1024, 257};
  // Each parameter block: <= 16 items the tiny one, 17 and 100 the small one, 200 the large one;
  // 700: more than one launch.
  for (int n_items : {1, 7, 16, 17, 100, 200, 700}) {
    for (int with_reduced = 0; with_reduced < 2; ++with_reduced) {
      // All states in one block of memory per backend: [history | scale | scale_inv] each.
      std::vector<int> len(n_items), off(n_items);
      int total = 0;
      for (int i = 0; i < n_items; ++i) {
        len[i] = lens[rng() % 5];
        off[i] = total;
        total += len[i] + 2;
      }
      std::vector<float> host(static_cast<size_t>(total));
      const float special[] = {0.0f, NAN, INFINITY, 1e-45f, 1e-30f, 1e30f, -1.0f, -0.0f};
      for (int i = 0; i < n_items; ++i) {
        const int kind = static_cast<int>(rng() % 6);  // 0: all zero, 1: with specials, else plain
        for (int j = 0; j < len[i]; ++j) {
          float h = std::ldexp(1.0f + (rng() % 1000) / 999.0f, int(rng() % 40) - 20);
          if (kind == 0) h = 0.0f;
          if (kind == 1 && rng() % 4 == 0) h = special[rng() % 8];
          host[off[i] + j] = h;
        }
        if (kind == 1 && rng() % 2) host[off[i]] = special[rng() % 3];  // NaN / inf / 0 as the latest
        host[off[i] + len[i]] = (rng() % 4 == 0) ? 1.0f : std::ldexp(1.0f, int(rng() % 10));  // scale
        host[off[i] + len[i] + 1] = 1.0f / host[off[i] + len[i]];
      }
      std::vector<float> reduced(static_cast<size_t>(n_items));
      for (auto &r : reduced) r = (rng() % 8 == 0) ? special[rng() % 3] : std::ldexp(1.0f, int(rng() % 20) - 5);
      // Odd items keep their current amax in a slot apart (as AmaxSlots gives states), even ones
      // in history[0].
      std::vector<float> slot_host(static_cast<size_t>(n_items));
      for (int i = 0; i < n_items; ++i) slot_host[i] = host[off[i]] * 0.5f;
      Twin state(*cpu, *gpu, raw(host)), red(*cpu, *gpu, raw(reduced)), packed(*cpu, *gpu, static_cast<size_t>(n_items) * 4);
      Twin slots(*cpu, *gpu, raw(slot_host));
      for (int b = 0; b < 2; ++b) {
        Backend &be = b == 0 ? *cpu : *gpu;
        float *base = b == 0 ? state.c.floats() : state.g.floats();
        float *slot_base = b == 0 ? slots.c.floats() : slots.g.floats();
        std::vector<ScaleUpdateItem> items(static_cast<size_t>(n_items));
        for (int i = 0; i < n_items; ++i) {
          ScaleUpdateItem &it = items[i];
          it.history = base + off[i];
          it.amax = i % 2 ? slot_base + i : it.history;
          it.scale = base + off[i] + len[i];
          it.scale_inv = base + off[i] + len[i] + 1;
          it.len = len[i];
          // Margins up to 127 over amaxes up to 1e30 underflow the scale: both clamp to kMinScale.
          it.margin = i % 11 == 10 ? 100 + i % 28 : static_cast<int>(i % 3) - (i % 5 == 4 ? 1 : 0);
          it.algo = i % 2 ? AmaxAlgo::MostRecent : AmaxAlgo::Max;
          it.fp8_max = i % 3 ? kE4M3Max : kE5M2Max;
        }
        be.gather_amax(items.data(), n_items, b == 0 ? packed.c.floats() : packed.g.floats());
        const float *r = with_reduced ? (b == 0 ? red.c.floats() : red.g.floats()) : nullptr;
        be.scale_update(items.data(), n_items, r);
        be.scale_update(items.data(), n_items, nullptr);  // a second step on the rolled history
      }
      EXPECT_SAME_BYTES(packed, 4, "gather n=" << n_items);
      EXPECT_SAME_BYTES(state, 4, "update n=" << n_items << " reduced=" << with_reduced);
      EXPECT_SAME_BYTES(slots, 4, "slots n=" << n_items << " reduced=" << with_reduced);
    }
  }
}

TEST_F(CudaKernels, FillFloats) {
  for (size_t n : {size_t(1), size_t(1000), size_t(1) << 20}) {
    Twin d(*cpu, *gpu, n * 4);
    cpu->fill_floats(d.c.floats(), -3.25f, n);
    gpu->fill_floats(d.g.floats(), -3.25f, n);
    EXPECT_SAME_BYTES(d, 4, n);
  }
}

// GroupedLinear's padding: row blocks copied and zero rows after them, in one launch per 32
// segments; rows of 16-byte, 4-byte and odd sizes, base pointers off alignment, an empty segment,
// and more segments than one launch takes. dst starts as 0xAB bytes: rows no segment writes keep them.
TEST_F(CudaKernels, CopyRowSegmentsMatchesCpu) {
  std::mt19937 rng(11);
  for (size_t row_bytes : {size_t(64), size_t(48), size_t(12), size_t(7)}) {
    for (size_t offset : {size_t(0), size_t(4), size_t(1)}) {
      if (offset % 4 && row_bytes % 4 == 0) continue;
      std::vector<RowSegment> segs;
      int64_t src_row = 0, dst_row = 0;
      for (int i = 0; i < 40; ++i) {
        RowSegment g;
        g.src_row = src_row;
        g.dst_row = dst_row + 1;  // one row left alone before each segment
        g.rows = i == 5 ? 0 : static_cast<int64_t>(rng() % 40);
        g.zero_rows = row_bytes % 4 || offset % 4 ? 0 : static_cast<int64_t>(rng() % 16);  // CPU: aligned fills
        src_row += g.rows;
        dst_row = g.dst_row + g.rows + g.zero_rows;
        segs.push_back(g);
      }
      std::vector<uint8_t> src(static_cast<size_t>(src_row) * row_bytes + offset);
      std::vector<uint8_t> dst(static_cast<size_t>(dst_row) * row_bytes + offset, 0xAB);
      for (auto &b : src) b = static_cast<uint8_t>(rng());
      Twin s(*cpu, *gpu, src), d(*cpu, *gpu, dst);
      auto at = [&](const DeviceBuffer &b) { return static_cast<uint8_t *>(b.get()) + offset; };
      const int n = static_cast<int>(segs.size());
      cpu->copy_row_segments(at(d.c), at(s.c), row_bytes, segs.data(), n);
      gpu->copy_row_segments(at(d.g), at(s.g), row_bytes, segs.data(), n);
      EXPECT_SAME_BYTES(d, 1, "row_bytes " << row_bytes << " offset " << offset);
      // The CPU result is the definition: copied rows, zero rows, untouched rows.
      const std::vector<uint8_t> got = d.c.read<uint8_t>();
      for (const RowSegment &g : segs) {
        const size_t at = offset + static_cast<size_t>(g.dst_row) * row_bytes;
        const uint8_t *from = &src[offset + static_cast<size_t>(g.src_row) * row_bytes];
        ASSERT_EQ(std::memcmp(&got[at], from, g.rows * row_bytes), 0);
        for (size_t k = 0; k < g.zero_rows * row_bytes; ++k) ASSERT_EQ(got[at + g.rows * row_bytes + k], 0);
        ASSERT_EQ(got[at - row_bytes], 0xAB);
      }
    }
  }
}

// GroupedLinear's gradients of experts without tokens: ranges of any size (0, under 16 bytes,
// odd, large) at any offset, more than one launch takes (32). The buffer starts as 0xAB bytes:
// the bytes between ranges keep them.
TEST_F(CudaKernels, ZeroManyMatchesCpu) {
  std::mt19937 rng(12);
  std::vector<std::pair<size_t, size_t>> spans;  // offset, bytes
  size_t at = 3;
  for (int i = 0; i < 45; ++i) {
    const size_t sizes[] = {0, 1, 2, 5, 15, 16, 17, 31, 64, 100, 1000, 4099};
    const size_t bytes = i == 44 ? size_t(300000) : sizes[rng() % 12];
    spans.push_back({at, bytes});
    at += bytes + 1 + rng() % 7;  // a gap that stays 0xAB
  }
  const std::vector<uint8_t> init(at + 16, 0xAB);
  Twin d(*cpu, *gpu, init);
  auto ranges_in = [&](const DeviceBuffer &b) {
    std::vector<ByteRange> r;
    for (auto [off, bytes] : spans) r.push_back(ByteRange{static_cast<uint8_t *>(b.get()) + off, bytes});
    return r;
  };
  const std::vector<ByteRange> rc = ranges_in(d.c), rg = ranges_in(d.g);
  cpu->zero_many(rc.data(), static_cast<int>(rc.size()));
  gpu->zero_many(rg.data(), static_cast<int>(rg.size()));
  EXPECT_SAME_BYTES(d, 1, "zero_many");
  std::vector<uint8_t> want = init;
  for (auto [off, bytes] : spans) std::memset(&want[off], 0, bytes);
  EXPECT_EQ(d.c.read<uint8_t>(), want);
}

// ---- activations and bias_grad (tolerance) ------------------------------------------------------

// Element-wise closeness: within 1e-5 relative + 1e-5 absolute (a last-ulp difference of tanhf
// is amplified where GELU cancels), or for 16-bit types within 1 unit of the last place (such a
// difference may flip a rounding).
::testing::AssertionResult close(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b, DType t, double rel = 1e-5) {
  const size_t esize = dtype_size(t), n = a.size() / esize;
  for (size_t i = 0; i < n; ++i) {
    const float x = load_as_float(a.data(), t, static_cast<int64_t>(i)), y = load_as_float(b.data(), t, static_cast<int64_t>(i));
    if (std::isnan(x) && std::isnan(y)) continue;
    if (x == y) continue;
    bool ok = std::fabs(x - y) <= rel * std::fabs(x) + 1e-5;
    if (!ok && t != DType::F32) {
      uint16_t p, q;
      std::memcpy(&p, &a[i * 2], 2);
      std::memcpy(&q, &b[i * 2], 2);
      ok = (p ^ q) < 0x8000 && std::abs(int(p) - int(q)) <= 1;
    }
    if (!ok) return ::testing::AssertionFailure() << "element " << i << ": cpu " << x << " gpu " << y;
  }
  return ::testing::AssertionSuccess();
}

TEST_F(CudaKernels, ActivationsCloseToCpu) {
  uint32_t seed = 600;
  for (Shape s : {Shape{1, 2}, Shape{3, 130}, Shape{64, 1000}, Shape{257, 66}}) {
    for (DType t : kInTypes) {
      for (Activation act : {Activation::ReLU, Activation::GELU, Activation::SwiGLU, Activation::GeGLU, Activation::SReLU}) {
        const size_t n = static_cast<size_t>(s.rows * s.cols);
        const int64_t ycols = is_gated(act) ? s.cols / 2 : s.cols;
        const size_t ny = static_cast<size_t>(s.rows * ycols);
        std::vector<float> xv = random_floats(n, seed++, false), gv = random_floats(ny, seed++, false);
        for (auto &x : xv) x = std::fmod(x, 20.0f);  // the interesting range of GELU / SiLU
        for (auto &g : gv) g = std::fmod(g, 4.0f);
        Twin x(*cpu, *gpu, to_bytes(xv, t)), dy(*cpu, *gpu, to_bytes(gv, t)), y(*cpu, *gpu, ny * dtype_size(t)), dx(*cpu, *gpu, n * dtype_size(t));
        for (int b = 0; b < 2; ++b) {
          Backend &be = b == 0 ? *cpu : *gpu;
          const Device dev = b == 0 ? kCpu : kGpu;
          auto pick = [&](Twin &tw) { return b == 0 ? tw.c.get() : tw.g.get(); };
          TensorView xvw = make_view(pick(x), t, dev, s.rows, s.cols), yv = make_view(pick(y), t, dev, s.rows, ycols);
          TensorView dyv = make_view(pick(dy), t, dev, s.rows, ycols), dxv = make_view(pick(dx), t, dev, s.rows, s.cols);
          be.activation_forward(act, xvw, yv);
          be.activation_backward(act, xvw, dyv, dxv);
        }
        EXPECT_TRUE(close(y.c.read<uint8_t>(), y.g.read<uint8_t>(), t)) << name(s) << " " << dtype_name(t) << " act " << int(act) << " fwd";
        EXPECT_TRUE(close(dx.c.read<uint8_t>(), dx.g.read<uint8_t>(), t)) << name(s) << " " << dtype_name(t) << " act " << int(act) << " bwd";
        if (act == Activation::ReLU || act == Activation::SReLU) {  // no transcendental: bit for bit
          EXPECT_SAME_BYTES(y, dtype_size(t), name(s) << " " << dtype_name(t) << " act " << int(act) << " fwd");
          EXPECT_SAME_BYTES(dx, dtype_size(t), name(s) << " " << dtype_name(t) << " act " << int(act) << " bwd");
        }
      }
    }
  }
}

TEST_F(CudaKernels, BiasGradCloseToCpu) {
  uint32_t seed = 700;
  for (Shape s : {Shape{1, 1}, Shape{1, 300}, Shape{300, 1}, Shape{131, 257}, Shape{4096, 64}, Shape{2048, 1000}}) {
    for (DType t : kInTypes) {
      const size_t n = static_cast<size_t>(s.rows * s.cols);
      std::vector<float> v = random_floats(n, seed++, false);
      for (auto &x : v) x = std::fmod(x, 8.0f);
      const std::vector<uint8_t> bytes = to_bytes(v, t);
      Twin dy(*cpu, *gpu, bytes), db(*cpu, *gpu, static_cast<size_t>(s.cols) * 4);
      for (int b = 0; b < 2; ++b) {
        Backend &be = b == 0 ? *cpu : *gpu;
        const Device dev = b == 0 ? kCpu : kGpu;
        be.bias_grad(make_view(b == 0 ? dy.c.get() : dy.g.get(), t, dev, s.rows, s.cols),
                     make_view(b == 0 ? db.c.get() : db.g.get(), DType::F32, dev, 1, s.cols));
      }
      // Sums in another order: compare against the sum of magnitudes' rounding budget.
      std::vector<float> c = db.c.read<float>(), g = db.g.read<float>();
      for (int64_t j = 0; j < s.cols; ++j) {
        double mag = 0;
        for (int64_t r = 0; r < s.rows; ++r) mag += std::fabs(load_as_float(bytes.data(), t, r * s.cols + j));
        ASSERT_LE(std::fabs(c[j] - g[j]), 2e-5 * mag + 1e-30) << name(s) << " " << dtype_name(t) << " col " << j;
      }
    }
  }
}

// bias_grad_many: each output the bits of bias_grad on its own, whether it shared a launch (one
// band of rows, 16-byte vectors: BF16 and F16 alike) or went alone (many rows, odd widths, F32,
// a misaligned start); more than one launch's worth of tensors; empty ones left alone.
TEST_F(CudaKernels, BiasGradManyMatchesSingle) {
  struct Item {
    int64_t rows, cols;
    DType t, db_t;
    size_t offset;  // elements into dy's buffer (1: not 16-byte aligned)
  };
  std::vector<Item> items;
  std::mt19937 rng(31);
  for (int i = 0; i < 41; ++i) {
    const int64_t rows[] = {0, 1, 5, 16, 63, 64};
    const int64_t cols[] = {8, 64, 256, 264, 1000};
    items.push_back({rows[rng() % 6], cols[rng() % 5], i % 3 ? DType::BF16 : DType::F16,
                     i % 4 ? DType::F32 : DType::BF16, 0});
  }
  items.push_back({4096, 64, DType::BF16, DType::F32, 0});  // several bands
  items.push_back({9, 300, DType::BF16, DType::F32, 0});    // not whole vectors
  items.push_back({9, 64, DType::F32, DType::F32, 0});
  items.push_back({9, 64, DType::BF16, DType::F32, 1});
  items.push_back({7, 0, DType::BF16, DType::F32, 0});
  uint32_t seed = 900;
  std::vector<std::unique_ptr<DeviceBuffer>> dy, db_many, db_one;
  std::vector<TensorView> dys, dbs, dbs_one;
  for (const Item &it : items) {
    const size_t n = static_cast<size_t>(it.rows * it.cols);
    std::vector<uint8_t> bytes = to_bytes(random_floats(n + it.offset, seed++, false), it.t);
    dy.push_back(std::make_unique<DeviceBuffer>(*gpu, bytes));
    // Two bytes past the output: untouched, and an empty tensor's output keeps all of it.
    const std::vector<uint8_t> init(static_cast<size_t>(it.cols) * dtype_size(it.db_t) + 2, 0xA5);
    db_many.push_back(std::make_unique<DeviceBuffer>(*gpu, init));
    db_one.push_back(std::make_unique<DeviceBuffer>(*gpu, init));
    void *x = static_cast<uint8_t *>(dy.back()->get()) + it.offset * dtype_size(it.t);
    dys.push_back(make_view(x, it.t, kGpu, it.rows, it.cols));
    dbs.push_back(make_view(db_many.back()->get(), it.db_t, kGpu, 1, it.cols));
    dbs_one.push_back(make_view(db_one.back()->get(), it.db_t, kGpu, 1, it.cols));
  }
  gpu->bias_grad_many(dys.data(), dbs.data(), static_cast<int>(items.size()));
  for (size_t i = 0; i < items.size(); ++i) gpu->bias_grad(dys[i], dbs_one[i]);
  int shared = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item &it = items[i];
    EXPECT_EQ(db_many[i]->read<uint8_t>(), db_one[i]->read<uint8_t>())
        << "item " << i << ": " << it.rows << " x " << it.cols << " " << dtype_name(it.t);
    shared += it.rows <= 64 && it.cols % 8 == 0 && it.offset == 0 && it.t != DType::F32 && it.cols > 0;
  }
  EXPECT_GT(shared, 32);  // more than one launch's worth
}

// ---- bandwidth (informational) ----------------------------------------------------------------

TEST_F(CudaKernels, CastTransposeBandwidth) {
  if (quick()) GTEST_SKIP() << "quick mode";
  const int64_t rows = 16384, cols = 4096;
  const size_t n = static_cast<size_t>(rows * cols);
  Buffer x(gpu.get(), n * 2), out(gpu.get(), n), out_t(gpu.get(), n), copy_dst(gpu.get(), n * 2);
  DeviceBuffer f(*gpu, raw(std::vector<float>{1.0f, 0.0f, 0.0f, 0.0f}));
  gpu->fill_floats(x.floats(), 0.75f, n / 2);  // bf16 pairs of a harmless value
  TensorView xv = make_view(x.get(), DType::BF16, kGpu, rows, cols);
  TensorView ov = make_view(out.get(), DType::E4M3, kGpu, rows, cols), otv = make_view(out_t.get(), DType::E4M3, kGpu, cols, rows);
  ov.scale_inv = f.floats() + 2;
  otv.scale_inv = f.floats() + 2;
  cudaStream_t stream = static_cast<cudaStream_t>(gpu->stream());
  cudaEvent_t e0, e1;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  auto time_ms = [&](auto &&fn) {
    for (int i = 0; i < 3; ++i) fn();
    cudaEventRecord(e0, stream);
    constexpr int kIters = 20;
    for (int i = 0; i < kIters; ++i) fn();
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms / kIters;
  };
  const float ct = time_ms([&] { gpu->cast_transpose(xv, f.floats(), f.floats() + 1, &ov, &otv); });
  const float cp = time_ms([&] { gpu->copy(copy_dst.get(), x.get(), n * 2); });
  const double ct_gbs = 4.0 * n / (ct * 1e6), cp_gbs = 4.0 * n / (cp * 1e6);
  std::printf("[bandwidth] cast_transpose bf16 %lldx%lld -> e4m3 + e4m3^T + amax: %.3f ms, %.0f GB/s; "
              "device copy of the input: %.3f ms, %.0f GB/s; ratio %.1f%%\n",
              static_cast<long long>(rows), static_cast<long long>(cols), ct, ct_gbs, cp, cp_gbs, 100.0 * ct_gbs / cp_gbs);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  EXPECT_GT(ct_gbs, 0.5 * cp_gbs);
}


// Backend::quantize_many: CUDA batches runs of items into one launch (current scaling: an amax
// pass and the casts); the bytes must equal the CPU's per-tensor calls in order (the default).
struct ManyCase {
  QuantizeItem::Kind kind;
  DType in, out;
  Shape shape;
  bool want_row, want_col;
  ScalingMode block_mode = ScalingMode::Block1x128;
  bool specials = false;
  DType dbias = DType::I32;  // I32: no bias gradient; else its dtype
};

void check_quantize_many(Backend &cpu, Backend &gpu, const std::vector<ManyCase> &cases, uint32_t seed) {
  struct Bufs {
    std::unique_ptr<Twin> x, out, out_t, sinv, sinv_t, state;  // state: amax_accum, scale, amax_out, scale_out, scale_inv_out
    std::unique_ptr<Twin> db;
    std::vector<float> col_abs;  // sum over rows of |x|, for the bias gradient's tolerance
  };
  std::vector<Bufs> bufs(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const ManyCase &c = cases[i];
    const size_t n = static_cast<size_t>(c.shape.rows * c.shape.cols);
    const ScalingMode mode = c.kind == QuantizeItem::Kind::Block ? c.block_mode : ScalingMode::PerTensor;
    Bufs &b = bufs[i];
    const std::vector<float> xv = random_floats(n, seed + uint32_t(i), c.specials);
    b.x = std::make_unique<Twin>(cpu, gpu, to_bytes(xv, c.in));
    if (c.dbias != DType::I32) {
      b.db = std::make_unique<Twin>(cpu, gpu, size_t(c.shape.cols) * dtype_size(c.dbias));
      b.col_abs.assign(size_t(c.shape.cols), 0.0f);
      for (size_t e = 0; e < n; ++e) b.col_abs[e % size_t(c.shape.cols)] += std::fabs(xv[e]);
    }
    b.out = std::make_unique<Twin>(cpu, gpu, n);
    b.out_t = std::make_unique<Twin>(cpu, gpu, n);
    b.sinv = std::make_unique<Twin>(cpu, gpu, 4 * size_t(scale_inv_count(mode, c.shape.rows, c.shape.cols)));
    b.sinv_t = std::make_unique<Twin>(cpu, gpu, 4 * size_t(scale_inv_count(mode, c.shape.cols, c.shape.rows)));
    // A delayed scale of 3 and an amax history value of 0.5 to max-accumulate into.
    b.state = std::make_unique<Twin>(cpu, gpu, raw(std::vector<float>{0.5f, 3.0f, -1.0f, -1.0f, -1.0f}));
  }
  for (int side = 0; side < 2; ++side) {
    Backend &be = side == 0 ? cpu : gpu;
    const Device dev = side == 0 ? kCpu : kGpu;
    auto ptr = [&](const std::unique_ptr<Twin> &t) { return side == 0 ? t->c.get() : t->g.get(); };
    std::vector<TensorView> outs(cases.size()), outs_t(cases.size());
    std::vector<QuantizeItem> items(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      const ManyCase &c = cases[i];
      Bufs &b = bufs[i];
      const ScalingMode mode = c.kind == QuantizeItem::Kind::Block ? c.block_mode : ScalingMode::PerTensor;
      float *st = static_cast<float *>(ptr(b.state));
      QuantizeItem &q = items[i];
      q.kind = c.kind;
      q.x = make_view(ptr(b.x), c.in, dev, c.shape.rows, c.shape.cols);
      outs[i] = make_view(ptr(b.out), c.out, dev, c.shape.rows, c.shape.cols);
      outs[i].scale_inv = static_cast<float *>(ptr(b.sinv)), outs[i].scaling = mode;
      outs_t[i] = make_view(ptr(b.out_t), c.out, dev, c.shape.cols, c.shape.rows);
      outs_t[i].scale_inv = static_cast<float *>(ptr(b.sinv_t)), outs_t[i].scaling = mode;
      q.out = c.want_row ? &outs[i] : nullptr;
      q.out_t = c.want_col ? &outs_t[i] : nullptr;
      q.scale = st + 1, q.amax_accum = st;
      q.amax_out = st + 2, q.scale_out = st + 3, q.scale_inv_out = st + 4;
      q.fp8_max = fp8_max(c.out);
      q.block_mode = c.block_mode;
      q.power_of_2 = (i % 2) == 1;
      if (b.db) {
        q.dbias = make_view(ptr(b.db), c.dbias, dev, c.shape.cols, 1);
        q.dbias.ndim = 1;
      }
    }
    if (side == 0) cpu.Backend::quantize_many(items.data(), int(items.size()));
    else be.quantize_many(items.data(), int(items.size()));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const ManyCase &c = cases[i];
    const std::string what = "item " + std::to_string(i) + " kind " + std::to_string(int(c.kind)) + " " +
                             name(c.shape) + " " + dtype_name(c.in) + "->" + dtype_name(c.out);
    if (c.want_row) EXPECT_SAME_BYTES(*bufs[i].out, 1, what << " out");
    if (c.want_col) EXPECT_SAME_BYTES(*bufs[i].out_t, 1, what << " out_t");
    EXPECT_SAME_BYTES(*bufs[i].sinv, 4, what << " scale_inv");
    EXPECT_SAME_BYTES(*bufs[i].sinv_t, 4, what << " scale_inv of out_t");
    EXPECT_SAME_BYTES(*bufs[i].state, 4, what << " amax / scale state");
    if (bufs[i].db) {  // sums in another order: within fp32 rounding of the sum of |x|
      const std::vector<uint8_t> dc = bufs[i].db->c.read<uint8_t>(), dg = bufs[i].db->g.read<uint8_t>();
      int bad = 0;
      for (int64_t col = 0; col < c.shape.cols; ++col) {
        const double vc = load_as_float(dc.data(), c.dbias, col), vg = load_as_float(dg.data(), c.dbias, col);
        const double tol = 1e-5 * bufs[i].col_abs[size_t(col)] + (c.dbias == DType::F32 ? 0.0 : 0.0079 * std::fabs(vc)) + 1e-30;
        if (!(std::fabs(vc - vg) <= tol) && bad++ < 3) ADD_FAILURE() << what << " dbias[" << col << "]: cpu " << vc << " gpu " << vg;
      }
    }
  }
}

TEST_F(CudaKernels, QuantizeManyMatchesCpu) {
  using K = QuantizeItem::Kind;
  const DType B = DType::BF16, F = DType::F32, E4 = DType::E4M3, E5 = DType::E5M2;
  // Runs broken by kind, input dtype and output formats, a tile-ragged tensor, NaN/inf inputs.
  check_quantize_many(*cpu, *gpu,
                      {{K::Delayed, B, E4, {131, 257}, true, true},
                       {K::Delayed, B, E4, {256, 384}, true, true},
                       {K::Delayed, B, E4, {16, 16}, true, false},
                       {K::Current, B, E4, {1, 7}, true, true},
                       {K::Current, B, E4, {384, 512}, true, true, ScalingMode::Block1x128, true},
                       {K::Current, F, E5, {129, 127}, true, true},
                       {K::Block, B, E4, {256, 384}, true, true, ScalingMode::Block1x128},
                       {K::Block, B, E4, {200, 96}, true, true, ScalingMode::Block128x128},
                       {K::Current, B, E4, {48, 272}, false, true},
                       {K::Delayed, F, E5, {1, 4096}, true, true, ScalingMode::Block1x128, true}},
                      500);
  // More items of one kind than one launch takes (kMaxCastItems = 4): two launches.
  std::vector<ManyCase> current, delayed;
  for (int i = 0; i < 6; ++i) {
    current.push_back({K::Current, B, E4, {int64_t(16 + 16 * i), int64_t(128 + 48 * i)}, true, true});
    delayed.push_back({K::Delayed, B, E4, {int64_t(128 * (i + 1)), 256}, true, true});
  }
  check_quantize_many(*cpu, *gpu, current, 600);
  check_quantize_many(*cpu, *gpu, delayed, 700);
  // Bias gradients in the casts: one row of tiles (direct, BF16 and F32), several (partials),
  // every kind, and an empty x (zeros).
  check_quantize_many(*cpu, *gpu,
                      {{K::Delayed, B, E5, {48, 272}, true, true, ScalingMode::Block1x128, false, B},
                       {K::Delayed, B, E5, {300, 130}, true, true, ScalingMode::Block1x128, false, DType::F32},
                       {K::Current, F, E4, {129, 257}, true, true, ScalingMode::Block1x128, false, DType::F32},
                       {K::Current, B, E4, {1024, 384}, true, true, ScalingMode::Block1x128, false, B},
                       {K::Block, B, E4, {384, 256}, true, true, ScalingMode::Block1x128, false, B},
                       {K::Block, B, E4, {100, 200}, false, true, ScalingMode::Block1x128, false, DType::F32}},
                      900);
  // A large tensor: more amax blocks than partial slots (each block then strides further).
  check_quantize_many(*cpu, *gpu, {{K::Current, B, E4, {4096, 4096}, true, true}, {K::Current, B, E4, {64, 4096}, true, true}}, 800);
}

}  // namespace
}  // namespace te::gpu_test
