// Amax, scales, casts and block quantization on the CPU. Every code is float_to_fp8(x * scale)
// from numerics.h, so these results are the definition the CUDA kernels are checked against.
#include <algorithm>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_convert.h"

namespace te {

namespace {

constexpr int64_t kBlock = 128;         // block edge of both block-scaling modes
constexpr int64_t kChunk = 1024;        // floats converted at a time by streaming loops
constexpr int64_t kTransposeTile = 32;  // rows encoded before they are written transposed

int64_t blocks_of(int64_t n) { return (n + kBlock - 1) / kBlock; }

void encode_scaled(const float *x, int64_t n, float scale, DType t, uint8_t *codes) {
  if (t == DType::E4M3) {
    for (int64_t j = 0; j < n; ++j) codes[j] = float_to_e4m3(x[j] * scale);
  } else {
    for (int64_t j = 0; j < n; ++j) codes[j] = float_to_e5m2(x[j] * scale);
  }
}

// The scale of one block, and the scale_inv stored for it.
struct BlockScale {
  float scale;
  float scale_inv;
};

BlockScale block_scale(float amax, DType t, bool power_of_2, float epsilon) {
  const float scale = compute_scale_from_amax(amax, fp8_max(t), power_of_2, epsilon);
  return {scale, 1.0f / scale};
}

}  // namespace

void CpuBackend::amax(const TensorView &x, float *amax, bool accumulate) {
  float chunk[kChunk];
  float m = 0.0f;
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    cpu::load_floats(x.data, x.dtype, i, len, chunk);
    m = cpu::nan_max(m, cpu::abs_max(chunk, len));
  }
  *amax = accumulate ? cpu::nan_max(*amax, m) : m;
}

void CpuBackend::scale_from_amax(const float *amax, float *scale, float *scale_inv, float fp8_max,
                                 bool power_of_2, float epsilon) {
  const float s = compute_scale_from_amax(*amax, fp8_max, power_of_2, epsilon);
  *scale = s;
  *scale_inv = 1.0f / s;
}

// The plan_* functions list exactly the blocks the kernels below take.
void CpuBackend::plan_cast_transpose(const TensorView &x, const TensorView *out, const TensorView *out_t,
                                     ScratchPlan *plan) const {
  plan->add(static_cast<size_t>(x.cols()) * sizeof(float));
  const bool transpose_from_out = out != nullptr && out_t != nullptr && out->dtype == out_t->dtype;
  if (out_t != nullptr && !transpose_from_out) plan->add(static_cast<size_t>(kTransposeTile * x.cols()));
}

void CpuBackend::plan_block_quantize(const TensorView &x, ScratchPlan *plan) const {
  plan->add(static_cast<size_t>(kBlock * x.cols()) * sizeof(float));
}

void CpuBackend::plan_dequantize(const TensorView &x, ScratchPlan *plan) const {
  plan->add(static_cast<size_t>(x.cols()) * sizeof(float));
}

void CpuBackend::cast_transpose(const TensorView &x, const float *scale, float *amax_accum,
                                TensorView *out, TensorView *out_t) {
  const int64_t rows = x.rows(), cols = x.cols();
  const float s = *scale;
  Buffer row_floats(this, static_cast<size_t>(cols) * sizeof(float));
  // out_t is written from row-major codes of a tile of rows: out itself when it holds the same
  // dtype, else a scratch tile.
  const bool transpose_from_out = out != nullptr && out_t != nullptr && out->dtype == out_t->dtype;
  Buffer code_tile;
  if (out_t != nullptr && !transpose_from_out) {
    code_tile = Buffer(this, static_cast<size_t>(kTransposeTile * cols));
  }
  float m = 0.0f;
  for (int64_t r0 = 0; r0 < rows; r0 += kTransposeTile) {
    const int64_t tile_rows = std::min(kTransposeTile, rows - r0);
    for (int64_t i = 0; i < tile_rows; ++i) {
      const int64_t r = r0 + i;
      float *xf = row_floats.floats();
      cpu::load_floats(x.data, x.dtype, r * cols, cols, xf);
      if (amax_accum != nullptr) m = cpu::nan_max(m, cpu::abs_max(xf, cols));
      if (out != nullptr) encode_scaled(xf, cols, s, out->dtype, static_cast<uint8_t *>(out->data) + r * cols);
      if (code_tile.get() != nullptr) {
        encode_scaled(xf, cols, s, out_t->dtype, static_cast<uint8_t *>(code_tile.get()) + i * cols);
      }
    }
    if (out_t != nullptr) {
      const uint8_t *tile = transpose_from_out ? static_cast<const uint8_t *>(out->data) + r0 * cols
                                               : static_cast<const uint8_t *>(code_tile.get());
      uint8_t *dst = static_cast<uint8_t *>(out_t->data);
      for (int64_t c = 0; c < cols; ++c) {
        for (int64_t i = 0; i < tile_rows; ++i) dst[c * rows + r0 + i] = tile[i * cols + c];
      }
    }
  }
  const float scale_inv = 1.0f / s;
  if (out != nullptr) out->scale_inv[0] = scale_inv;
  if (out_t != nullptr) out_t->scale_inv[0] = scale_inv;
  if (amax_accum != nullptr) *amax_accum = cpu::nan_max(*amax_accum, m);
}

void CpuBackend::block_quantize(const TensorView &x, ScalingMode mode, bool power_of_2,
                                float epsilon, TensorView *out, TensorView *out_t) {
  const int64_t rows = x.rows(), cols = x.cols();
  const int64_t col_blocks = blocks_of(cols), row_blocks = blocks_of(rows);
  // One band of up to 128 rows at a time: every block of either output lies inside one band.
  Buffer band(this, static_cast<size_t>(kBlock * cols) * sizeof(float));
  float *xf = band.floats();
  for (int64_t rb = 0; rb < row_blocks; ++rb) {
    const int64_t r0 = rb * kBlock;
    const int64_t band_rows = std::min(kBlock, rows - r0);
    cpu::load_floats(x.data, x.dtype, r0 * cols, band_rows * cols, xf);

    if (mode == ScalingMode::Block1x128) {
      if (out != nullptr) {
        uint8_t *codes = static_cast<uint8_t *>(out->data);
        for (int64_t i = 0; i < band_rows; ++i) {
          const int64_t r = r0 + i;
          for (int64_t cb = 0; cb < col_blocks; ++cb) {
            const int64_t c0 = cb * kBlock, len = std::min(kBlock, cols - c0);
            const float *blk = xf + i * cols + c0;
            const BlockScale bs = block_scale(cpu::abs_max(blk, len), out->dtype, power_of_2, epsilon);
            out->scale_inv[r * col_blocks + cb] = bs.scale_inv;
            encode_scaled(blk, len, bs.scale, out->dtype, codes + r * cols + c0);
          }
        }
      }
      if (out_t != nullptr) {
        // Row c of x^T, columns r0.. of this band: one 1x128 block of out_t per column of x.
        uint8_t *codes = static_cast<uint8_t *>(out_t->data);
        float column[kBlock];
        for (int64_t c = 0; c < cols; ++c) {
          for (int64_t i = 0; i < band_rows; ++i) column[i] = xf[i * cols + c];
          const BlockScale bs = block_scale(cpu::abs_max(column, band_rows), out_t->dtype, power_of_2, epsilon);
          out_t->scale_inv[c * row_blocks + rb] = bs.scale_inv;
          encode_scaled(column, band_rows, bs.scale, out_t->dtype, codes + c * rows + r0);
        }
      }
      continue;
    }

    // 128x128 tiles: one amax per tile, shared by out and the transposed grid of out_t.
    for (int64_t cb = 0; cb < col_blocks; ++cb) {
      const int64_t c0 = cb * kBlock, len = std::min(kBlock, cols - c0);
      float tile_amax = 0.0f;
      for (int64_t i = 0; i < band_rows; ++i) tile_amax = cpu::nan_max(tile_amax, cpu::abs_max(xf + i * cols + c0, len));
      if (out != nullptr) {
        const BlockScale bs = block_scale(tile_amax, out->dtype, power_of_2, epsilon);
        out->scale_inv[rb * col_blocks + cb] = bs.scale_inv;
        uint8_t *codes = static_cast<uint8_t *>(out->data);
        for (int64_t i = 0; i < band_rows; ++i) {
          encode_scaled(xf + i * cols + c0, len, bs.scale, out->dtype, codes + (r0 + i) * cols + c0);
        }
      }
      if (out_t != nullptr) {
        const BlockScale bs = block_scale(tile_amax, out_t->dtype, power_of_2, epsilon);
        out_t->scale_inv[cb * row_blocks + rb] = bs.scale_inv;
        uint8_t *codes = static_cast<uint8_t *>(out_t->data);
        float column[kBlock];
        for (int64_t c = c0; c < c0 + len; ++c) {
          for (int64_t i = 0; i < band_rows; ++i) column[i] = xf[i * cols + c];
          encode_scaled(column, band_rows, bs.scale, out_t->dtype, codes + c * rows + r0);
        }
      }
    }
  }
}

void CpuBackend::dequantize(const TensorView &x, const TensorView &out) {
  const int64_t rows = x.rows(), cols = x.cols();
  const int64_t col_blocks = blocks_of(cols);
  const cpu::Fp8DecodeTable &table = cpu::decode_table(x.dtype);
  const uint8_t *codes = static_cast<const uint8_t *>(x.data);
  Buffer row_floats(this, static_cast<size_t>(cols) * sizeof(float));
  float *row = row_floats.floats();
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t *src = codes + r * cols;
    for (int64_t cb = 0; cb < col_blocks; ++cb) {
      float scale_inv = x.scale_inv[0];  // per-tensor
      if (x.scaling == ScalingMode::Block1x128) scale_inv = x.scale_inv[r * col_blocks + cb];
      if (x.scaling == ScalingMode::Block128x128) scale_inv = x.scale_inv[(r / kBlock) * col_blocks + cb];
      const int64_t c_end = std::min(cols, (cb + 1) * kBlock);
      for (int64_t c = cb * kBlock; c < c_end; ++c) row[c] = table.value[src[c]] * scale_inv;
    }
    cpu::store_floats(row, cols, out.data, out.dtype, r * cols);
  }
}

}  // namespace te
