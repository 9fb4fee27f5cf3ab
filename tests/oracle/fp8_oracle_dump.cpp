// Writes libte's float -> FP8 conversions for a large set of inputs, so that an independent
// implementation (ml_dtypes, see compare_fp8_ml_dtypes.py) can check them bit for bit.
//
// Output (binary, little-endian), one 6-byte record per input:
//   uint32 float bits | uint8 float_to_e4m3 | uint8 float_to_e5m2
// Inputs: the value of every code of both formats, every midpoint between neighbouring codes
// and the floats one ulp either side of it, edge values (zeros, subnormals, max, beyond max,
// infinities, NaNs, FLT_MAX), and a few hundred thousand random floats.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "numerics/numerics.h"

namespace {

float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

void add_with_neighbours(std::vector<float> &in, float x) {
  in.push_back(x);
  in.push_back(std::nextafter(x, -INFINITY));
  in.push_back(std::nextafter(x, INFINITY));
}

std::vector<float> make_inputs() {
  std::vector<float> in;
  for (te::DType t : {te::DType::E4M3, te::DType::E5M2}) {
    for (int c = 0; c < 256; ++c) {
      const float v = te::fp8_to_float(static_cast<uint8_t>(c), t);
      in.push_back(v);
      if (!std::isfinite(v)) continue;
      // Midpoint to the next code away from zero (and, for the largest code, to where the next
      // code would be: the saturation boundary).
      const int mag = c & 0x7F;
      const float sign = (c & 0x80) ? -1.0f : 1.0f;
      const float here = std::fabs(v);
      float next;
      if (mag + 1 <= 0x7F && std::isfinite(te::fp8_to_float(static_cast<uint8_t>(mag + 1), t))) {
        next = te::fp8_to_float(static_cast<uint8_t>(mag + 1), t);
      } else {
        next = here + (here - te::fp8_to_float(static_cast<uint8_t>(mag - 1), t));
      }
      add_with_neighbours(in, sign * (here + next) / 2);  // exact: one bit more than a code
      add_with_neighbours(in, sign * here);
    }
  }
  const float edges[] = {0.0f, -0.0f, FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX,
                         INFINITY, -INFINITY, NAN, -NAN, 448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f,
                         65536.0f, 1e10f, -1e10f, 0x1p-10f, 0x1p-17f, 0x1p-9f, 0x1p-16f, 0x1.8p-10f};
  for (float e : edges) add_with_neighbours(in, e);
  in.push_back(from_bits(0x7F800001u));  // signalling NaN
  in.push_back(from_bits(0xFFFFFFFFu));

  std::mt19937 rng(20240601);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> log2_mag(-22.0f, 19.0f);  // around both formats' ranges
  for (int i = 0; i < 150000; ++i) in.push_back(from_bits(any_bits(rng)));
  for (int i = 0; i < 150000; ++i) {
    const float m = std::exp2(log2_mag(rng));
    in.push_back((i & 1) ? -m : m);
  }
  return in;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_FILE\n", argv[0]);
    return 2;
  }
  const std::vector<float> inputs = make_inputs();
  std::FILE *f = std::fopen(argv[1], "wb");
  if (f == nullptr) {
    std::perror(argv[1]);
    return 1;
  }
  for (float x : inputs) {
    uint8_t record[6];
    std::memcpy(record, &x, 4);  // the project targets little-endian hosts only
    record[4] = te::float_to_e4m3(x);
    record[5] = te::float_to_e5m2(x);
    if (std::fwrite(record, 1, sizeof record, f) != sizeof record) {
      std::perror("fwrite");
      std::fclose(f);
      return 1;
    }
  }
  if (std::fclose(f) != 0) {
    std::perror("fclose");
    return 1;
  }
  std::printf("%zu inputs written to %s\n", inputs.size(), argv[1]);
  return 0;
}
