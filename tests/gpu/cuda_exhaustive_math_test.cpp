// The activation kernels' fast paths (activation_math.cuh's map_sigmoid, activation_tile.cuh's
// round_unit) give the bits of the definitions they stand for, for every float input: the fused
// casts, the amax pass and the unfused activation kernels may then take either.
#include <gtest/gtest.h>

#include <string>

#include "backends/backend.h"
#include "gpu/exhaustive_math.h"

namespace te::gpu_test {
namespace {

class CudaExhaustiveMath : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no usable CUDA GPU or no CUDA backend in this build";
  }
};

TEST_F(CudaExhaustiveMath, SigmoidEqualsTheDivisionForEveryFloat) {
  ExhaustiveResult r;
  std::string error;
  ASSERT_TRUE(exhaustive_sigmoid(&r, &error)) << error;
  EXPECT_EQ(r.mismatches, 0u) << "first differing x bits 0x" << std::hex << r.first_bits;
}

TEST_F(CudaExhaustiveMath, RoundUnitEqualsRoundToForEveryFloat) {
  for (DType t : {DType::BF16, DType::F16}) {
    ExhaustiveResult r;
    std::string error;
    ASSERT_TRUE(exhaustive_round_unit(t, &r, &error)) << error;
    EXPECT_EQ(r.mismatches, 0u) << dtype_name(t) << ": first differing input bits 0x" << std::hex << r.first_bits;
  }
}

}  // namespace
}  // namespace te::gpu_test
