// tensor_size.cpp - dtype widths and overflow-checked tensor byte sizes.
//
// The byte count is numel * bits / 8 rounded up; packed sub-byte types (int4: two values
// per byte) are the only ones that round. Every multiplication is checked with
// __builtin_mul_overflow, because shapes come from untrusted input and a wrapped product
// would under-allocate.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/tensor.hpp"

namespace sdalloc {
namespace {

std::string shape_text(std::span<const std::int64_t> dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i != 0) text += ", ";
    text += std::to_string(dims[i]);
  }
  return text + "]";
}

}  // namespace

int dtype_bits(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64:
      return 64;
    case DType::kFloat32:
    case DType::kInt32:
      return 32;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16:
      return 16;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return 8;
    case DType::kInt4Packed:
      return 4;
  }
  return 0;  // not a DType (a value cast from C or read from a file)
}

std::string_view dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat8E4M3:
      return "fp8_e4m3";
    case DType::kFloat8E5M2:
      return "fp8_e5m2";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kInt4Packed:
      return "int4_packed";
    case DType::kFloat64:
      return "fp64";
    case DType::kInt16:
      return "int16";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

std::size_t tensor_numel(std::span<const std::int64_t> dims) {
  // Negative dims are errors even next to a 0 dim, and a 0 dim makes the tensor empty even
  // if the other dims alone would overflow: check both before multiplying.
  bool empty = false;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      throw InvalidArgument("dims[" + std::to_string(i) + "] is negative (" +
                            std::to_string(dims[i]) + ") in shape " + shape_text(dims));
    }
    if (dims[i] == 0) empty = true;
  }
  if (empty) return 0;
  std::size_t numel = 1;
  for (const std::int64_t dim : dims) {
    if (static_cast<std::uint64_t>(dim) > SIZE_MAX ||
        __builtin_mul_overflow(numel, static_cast<std::size_t>(dim), &numel)) {
      throw InvalidArgument("tensor size overflows: the element count of shape " +
                            shape_text(dims) + " does not fit in size_t");
    }
  }
  return numel;
}

std::size_t tensor_nbytes(DType dtype, std::span<const std::int64_t> dims) {
  const int bits = dtype_bits(dtype);
  if (bits == 0) {
    throw InvalidArgument("unknown dtype " + std::to_string(static_cast<std::int32_t>(dtype)));
  }
  const std::size_t numel = tensor_numel(dims);
  if (bits % 8 != 0) {
    // Sub-byte packing: ceil(numel * bits / 8) in a form that cannot overflow for bits < 8.
    const auto ubits = static_cast<std::size_t>(bits);
    return numel / 8 * ubits + (numel % 8 * ubits + 7) / 8;
  }
  std::size_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<std::size_t>(bits / 8), &nbytes)) {
    throw InvalidArgument("tensor size overflows: shape " + shape_text(dims) + " of " +
                          std::string(dtype_name(dtype)) + " needs more than SIZE_MAX bytes");
  }
  return nbytes;
}

}  // namespace sdalloc
