// Host tensors for the CPU backend tests: owned storage plus a TensorView over it, and fp64
// helpers to fill and read them.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/backend.h"
#include "numerics/numerics.h"

namespace te_test {

struct HostTensor {
  std::vector<uint8_t> storage;
  std::vector<float> scale_inv;
  te::TensorView view;

  HostTensor(te::DType dtype, int64_t rows, int64_t cols,
             te::ScalingMode scaling = te::ScalingMode::PerTensor)
      : storage(static_cast<size_t>(rows * cols) * te::dtype_size(dtype)) {
    view = te::make_view(storage.data(), dtype, te::Device{}, rows, cols);
    if (te::is_fp8(dtype)) {
      scale_inv.assign(static_cast<size_t>(te::scale_inv_count(scaling, rows, cols)), NAN);
      view.scale_inv = scale_inv.data();
      view.scaling = scaling;
    }
  }
  HostTensor(const HostTensor &) = delete;
  HostTensor &operator=(const HostTensor &) = delete;

  int64_t rows() const { return view.rows(); }
  int64_t cols() const { return view.cols(); }
  // High-precision element as stored, widened.
  float get(int64_t r, int64_t c) const { return te::load_as_float(view.data, view.dtype, r * cols() + c); }
  void set(int64_t r, int64_t c, float v) { te::store_from_float(view.data, view.dtype, r * cols() + c, v); }
  uint8_t code(int64_t r, int64_t c) const { return storage[static_cast<size_t>(r * cols() + c)]; }
  te::TensorView *ptr() { return &view; }
};

// Fills with values whose magnitudes span several binades (so FP8 rounding is exercised),
// stored in the tensor's dtype.
inline void fill_random(HostTensor &t, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t r = 0; r < t.rows(); ++r) {
    for (int64_t c = 0; c < t.cols(); ++c) t.set(r, c, scale * normal(rng));
  }
}

}  // namespace te_test
