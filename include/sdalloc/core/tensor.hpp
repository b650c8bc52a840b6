// sdalloc/core/tensor.hpp - element types and the byte size of a dense tensor.
//
// A front end that allocates tensors (the C API's sdalloc_tensor_alloc, the runtime
// adapters) needs one answer to "how many bytes is a [2, 4, 64, 64] bf16 tensor?", and that
// answer must never wrap around: a shape read from a model file or a request is untrusted,
// and a product of dims that overflows would silently allocate a few bytes for a huge
// tensor. tensor_nbytes() checks every multiplication and throws instead.
//
// Sub-byte types are packed: INT4_PACKED holds two values per byte, so its size is
// ceil(numel / 2) bytes. A shape with no dims is a scalar (1 element); a shape with a 0 dim
// has no elements and 0 bytes, whatever its other dims.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace sdalloc {

// Values are the C API's sdalloc_dtype_t (sdalloc.h): never renumber, only append.
enum class DType : std::int32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat8E4M3 = 3,
  kFloat8E5M2 = 4,
  kInt8 = 5,
  kUInt8 = 6,
  kInt32 = 7,
  kInt64 = 8,
  kInt4Packed = 9,
  kFloat64 = 10,
  kInt16 = 11,
  kBool = 12,
};

// Bits one element occupies (4 for kInt4Packed); 0 for a value that is not a DType.
int dtype_bits(DType dtype) noexcept;

// Short name used in messages and tables: "fp32", "bf16", "int4_packed"; "unknown" for a
// value that is not a DType.
std::string_view dtype_name(DType dtype) noexcept;

// Product of dims: 1 for no dims, 0 if any dim is 0. Throws InvalidArgument naming the dim
// if one is negative, or saying the element count overflows.
std::size_t tensor_numel(std::span<const std::int64_t> dims);

// Bytes of a dense tensor: ceil(numel * bits / 8). Throws InvalidArgument for an unknown
// dtype, a negative dim, or a size that overflows std::size_t (the message says so and
// shows the shape).
std::size_t tensor_nbytes(DType dtype, std::span<const std::int64_t> dims);

}  // namespace sdalloc
