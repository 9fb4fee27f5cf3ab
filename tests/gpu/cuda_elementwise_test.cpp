// te_add's and te_split/concat_columns' backend calls on CUDA against the CPU reference: add bit
// for bit (NaN payloads included), strided block copies byte for byte.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/gpu_test_support.h"
#include "numerics/numerics.h"

namespace te::gpu_test {
namespace {

TensorView view(void *data, DType t, Device d, int64_t n) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.ndim = 1;
  v.shape[0] = n;
  v.device = d;
  return v;
}

class CudaElementwise : public GpuTest {};

TEST_F(CudaElementwise, AddMatchesTheCpuBitForBit) {
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    for (int64_t n : {1, 255, 4096, 1 << 20}) {
      const size_t es = dtype_size(t), bytes = static_cast<size_t>(n) * es;
      std::vector<unsigned char> a(bytes), b(bytes);
      std::mt19937 rng(static_cast<uint32_t>(n) + static_cast<uint32_t>(t));
      for (auto &c : a) c = static_cast<unsigned char>(rng());
      for (auto &c : b) c = static_cast<unsigned char>(rng());  // random bits: NaNs and infs included
      std::vector<unsigned char> want(bytes);
      cpu->add(view(a.data(), t, {DeviceType::CPU, 0}, n), view(b.data(), t, {DeviceType::CPU, 0}, n),
               view(want.data(), t, {DeviceType::CPU, 0}, n));
      DeviceBuffer da(*gpu, a), db(*gpu, b), dy(*gpu, bytes);
      const Device g{DeviceType::CUDA, 0};
      gpu->add(view(da.get(), t, g, n), view(db.get(), t, g, n), view(dy.get(), t, g, n));
      std::vector<unsigned char> got = dy.read<unsigned char>();
      ASSERT_EQ(got, want) << "dtype " << static_cast<int>(t) << " n " << n;
      // In place (y = a).
      gpu->add(view(da.get(), t, g, n), view(db.get(), t, g, n), view(da.get(), t, g, n));
      ASSERT_EQ(da.read<unsigned char>(), want);
    }
  }
}

TEST_F(CudaElementwise, Copy2dMovesTheColumnBlock) {
  const size_t rows = 1000, src_pitch = 3 * 512, width = 512, dst_pitch = 512;
  std::vector<unsigned char> src(rows * src_pitch);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 13 + 5);
  DeviceBuffer ds(*gpu, src), dd(*gpu, rows * dst_pitch);
  gpu->copy_2d(dd.get(), dst_pitch, static_cast<unsigned char *>(ds.get()) + width, src_pitch, width, rows);
  std::vector<unsigned char> got = dd.read<unsigned char>();
  for (size_t r = 0; r < rows; ++r)
    ASSERT_EQ(0, std::memcmp(&got[r * dst_pitch], &src[r * src_pitch + width], width)) << "row " << r;
}

}  // namespace
}  // namespace te::gpu_test
