// Elementwise add and strided block copies: the glue between modules (residuals, QKV splits).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_convert.h"

namespace te {

namespace {

// a + b with x86's NaN rules made explicit (the compiler may swap a commutative add's operands):
// the first NaN operand, quietened; inf + -inf is the default NaN 0xFFC00000. CUDA matches it.
float add_x86(float a, float b) {
  uint32_t ba, bb;
  std::memcpy(&ba, &a, 4);
  std::memcpy(&bb, &b, 4);
  uint32_t q;
  if ((ba & 0x7FFFFFFFu) > 0x7F800000u) q = ba | 0x00400000u;
  else if ((bb & 0x7FFFFFFFu) > 0x7F800000u) q = bb | 0x00400000u;
  else {
    const float r = a + b;
    if (r == r) return r;
    q = 0xFFC00000u;
  }
  float out;
  std::memcpy(&out, &q, 4);
  return out;
}

}  // namespace

void CpuBackend::add(const TensorView &a, const TensorView &b, const TensorView &y) {
  // Chunks of floats so that y may alias a or b: each chunk is read whole before it is written.
  constexpr int64_t kChunk = 4096;
  float fa[kChunk], fb[kChunk];
  const int64_t n = y.numel();
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t m = std::min(kChunk, n - off);
    cpu::load_floats(a.data, a.dtype, off, m, fa);
    cpu::load_floats(b.data, b.dtype, off, m, fb);
    for (int64_t i = 0; i < m; ++i) fa[i] = add_x86(fa[i], fb[i]);
    cpu::store_floats(fa, m, y.data, y.dtype, off);
  }
}

void CpuBackend::copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                         size_t rows) {
  auto *d = static_cast<unsigned char *>(dst);
  const auto *s = static_cast<const unsigned char *>(src);
  for (size_t r = 0; r < rows; ++r) std::memcpy(d + r * dst_pitch, s + r * src_pitch, width);
}

}  // namespace te
