// Core value types: sizes, names, views and the scale_inv layout of te.h's te_scaling_mode.
#include <gtest/gtest.h>

#include <cstring>

#include "base/types.h"

namespace {

using te::DType;
using te::ScalingMode;

TEST(CoreTypes, SizesAndNames) {
  EXPECT_EQ(te::dtype_size(DType::F32), 4u);
  EXPECT_EQ(te::dtype_size(DType::F16), 2u);
  EXPECT_EQ(te::dtype_size(DType::BF16), 2u);
  EXPECT_EQ(te::dtype_size(DType::E4M3), 1u);
  EXPECT_EQ(te::dtype_size(DType::E5M2), 1u);
  EXPECT_STREQ(te::dtype_name(DType::F32), "F32");
  EXPECT_STREQ(te::dtype_name(DType::F16), "F16");
  EXPECT_STREQ(te::dtype_name(DType::BF16), "BF16");
  EXPECT_STREQ(te::dtype_name(DType::E4M3), "E4M3");
  EXPECT_STREQ(te::dtype_name(DType::E5M2), "E5M2");
  EXPECT_STREQ(te::device_name(te::DeviceType::CPU), "CPU");
  EXPECT_STREQ(te::device_name(te::DeviceType::CUDA), "CUDA");
}

TEST(CoreTypes, MakeViewIsATwoDimensionalMatrix) {
  float storage[6];
  const te::TensorView v = te::make_view(storage, DType::F32, te::Device{}, 2, 3);
  EXPECT_EQ(v.data, storage);
  EXPECT_EQ(v.ndim, 2);
  EXPECT_EQ(v.rows(), 2);
  EXPECT_EQ(v.cols(), 3);
  EXPECT_EQ(v.numel(), 6);
  EXPECT_EQ(v.bytes(), 24u);
  EXPECT_EQ(v.scale_inv, nullptr);
  EXPECT_EQ(v.scaling, ScalingMode::PerTensor);
}

TEST(CoreTypes, ScaleInvCount) {
  EXPECT_EQ(te::scale_inv_count(ScalingMode::PerTensor, 1000, 1000), 1);
  EXPECT_EQ(te::scale_inv_count(ScalingMode::Block1x128, 3, 128), 3);
  EXPECT_EQ(te::scale_inv_count(ScalingMode::Block1x128, 3, 129), 6);
  EXPECT_EQ(te::scale_inv_count(ScalingMode::Block1x128, 1, 1), 1);
  EXPECT_EQ(te::scale_inv_count(ScalingMode::Block128x128, 128, 128), 1);
  EXPECT_EQ(te::scale_inv_count(ScalingMode::Block128x128, 131, 257), 2 * 3);
  EXPECT_EQ(te::scale_inv_count(ScalingMode::Block128x128, 1, 1), 1);
}

}  // namespace
