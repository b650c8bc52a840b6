// tensor_size_test.cpp - dtype widths and overflow-checked tensor sizes (sdalloc/core/tensor.hpp).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/tensor.hpp"

namespace {

using sdalloc::DType;
using Shape = std::vector<std::int64_t>;

// The what() of the InvalidArgument that tensor_nbytes throws, or "" if it does not throw.
std::string nbytes_error(DType dtype, const Shape& dims) {
  try {
    sdalloc::tensor_nbytes(dtype, dims);
  } catch (const sdalloc::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(TensorSize, WidthsOfEveryDType) {
  EXPECT_EQ(sdalloc::dtype_bits(DType::kFloat64), 64);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kInt64), 64);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kFloat32), 32);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kInt32), 32);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kFloat16), 16);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kBFloat16), 16);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kInt16), 16);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kFloat8E4M3), 8);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kFloat8E5M2), 8);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kInt8), 8);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kUInt8), 8);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kBool), 8);
  EXPECT_EQ(sdalloc::dtype_bits(DType::kInt4Packed), 4);
  EXPECT_EQ(sdalloc::dtype_bits(static_cast<DType>(13)), 0);
  EXPECT_EQ(sdalloc::dtype_bits(static_cast<DType>(-1)), 0);
  EXPECT_EQ(sdalloc::dtype_name(DType::kBFloat16), "bf16");
  EXPECT_EQ(sdalloc::dtype_name(static_cast<DType>(13)), "unknown");
}

TEST(TensorSize, NumelIsTheProductOfDims) {
  EXPECT_EQ(sdalloc::tensor_numel(Shape{}), 1U);  // scalar
  EXPECT_EQ(sdalloc::tensor_numel(Shape{2, 4, 64, 64}), 32768U);
  EXPECT_EQ(sdalloc::tensor_numel(Shape{7, 0, 3}), 0U);
}

TEST(TensorSize, NbytesOfAStableDiffusionLatent) {
  // [batch 2, 4 channels, 64 x 64] in fp16 and bf16 is 64 KiB; fp32 twice that.
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kFloat16, Shape{2, 4, 64, 64}), 65536U);
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kBFloat16, Shape{2, 4, 64, 64}), 65536U);
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kFloat32, Shape{2, 4, 64, 64}), 131072U);
}

TEST(TensorSize, PackedInt4RoundsUpToWholeBytes) {
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kInt4Packed, Shape{}), 1U);
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kInt4Packed, Shape{1}), 1U);
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kInt4Packed, Shape{2}), 1U);
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kInt4Packed, Shape{3, 3}), 5U);
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kInt4Packed, Shape{4096, 4096}), 8U << 20);
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kInt4Packed, Shape{0, 3}), 0U);
}

TEST(TensorSize, EmptyDimWinsOverAnOverflowingProduct) {
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kFloat32, Shape{1LL << 40, 1LL << 40, 0}), 0U);
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kFloat32, Shape{0, 1LL << 40, 1LL << 40}), 0U);
}

TEST(TensorSize, NegativeDimIsRejectedByIndex) {
  EXPECT_EQ(nbytes_error(DType::kFloat32, Shape{2, -1}),
            "dims[1] is negative (-1) in shape [2, -1]");
  // Even next to a 0 dim: a negative extent is a bug in the caller, not an empty tensor.
  EXPECT_NE(nbytes_error(DType::kFloat32, Shape{0, -1}), "");
}

TEST(TensorSize, ElementCountOverflowIsRejected) {
  const std::string error = nbytes_error(DType::kInt8, Shape{1LL << 40, 1LL << 40});
  EXPECT_NE(error.find("tensor size overflows"), std::string::npos) << error;
  EXPECT_NE(error.find("[1099511627776, 1099511627776]"), std::string::npos) << error;
}

TEST(TensorSize, ByteCountOverflowIsRejectedButExactFitsAreNot) {
  // 2^61 elements: 2^61 bytes in int8, 2^64 bytes in fp64 (one more than SIZE_MAX).
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kInt8, Shape{1LL << 61}), std::size_t{1} << 61);
  const std::string error = nbytes_error(DType::kFloat64, Shape{1LL << 61});
  EXPECT_NE(error.find("tensor size overflows"), std::string::npos) << error;
  EXPECT_NE(error.find("fp64"), std::string::npos) << error;
  // The largest int64 dim in fp32 is 2^65 bytes; in packed int4 it fits.
  EXPECT_NE(nbytes_error(DType::kFloat32, Shape{INT64_MAX}), "");
  EXPECT_EQ(sdalloc::tensor_nbytes(DType::kInt4Packed, Shape{INT64_MAX}), std::size_t{1} << 62);
}

TEST(TensorSize, UnknownDTypeIsRejected) {
  EXPECT_EQ(nbytes_error(static_cast<DType>(42), Shape{2}), "unknown dtype 42");
}

}  // namespace
