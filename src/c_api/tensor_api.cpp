// tensor_api.cpp - the C API's tensor calls (sdalloc.h): dtypes, shaped allocations with
// overflow-checked sizes and contiguous strides, through the same boundary as c_api.cpp.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "c_api/boundary.hpp"
#include "c_api/c_pool.hpp"
#include "sdalloc/core/tensor.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/sdalloc.h"

using namespace sdalloc::c_api_detail;  // NOLINT(google-build-using-namespace)

namespace {

// The C enums and the C++ ones are the same numbers: the C API casts between them.
static_assert(SDALLOC_DTYPE_FP32 == static_cast<int>(sdalloc::DType::kFloat32));
static_assert(SDALLOC_DTYPE_FP16 == static_cast<int>(sdalloc::DType::kFloat16));
static_assert(SDALLOC_DTYPE_BF16 == static_cast<int>(sdalloc::DType::kBFloat16));
static_assert(SDALLOC_DTYPE_FP8_E4M3 == static_cast<int>(sdalloc::DType::kFloat8E4M3));
static_assert(SDALLOC_DTYPE_FP8_E5M2 == static_cast<int>(sdalloc::DType::kFloat8E5M2));
static_assert(SDALLOC_DTYPE_INT8 == static_cast<int>(sdalloc::DType::kInt8));
static_assert(SDALLOC_DTYPE_UINT8 == static_cast<int>(sdalloc::DType::kUInt8));
static_assert(SDALLOC_DTYPE_INT32 == static_cast<int>(sdalloc::DType::kInt32));
static_assert(SDALLOC_DTYPE_INT64 == static_cast<int>(sdalloc::DType::kInt64));
static_assert(SDALLOC_DTYPE_INT4_PACKED == static_cast<int>(sdalloc::DType::kInt4Packed));
static_assert(SDALLOC_DTYPE_FP64 == static_cast<int>(sdalloc::DType::kFloat64));
static_assert(SDALLOC_DTYPE_INT16 == static_cast<int>(sdalloc::DType::kInt16));
static_assert(SDALLOC_DTYPE_BOOL == static_cast<int>(sdalloc::DType::kBool));
static_assert(SDALLOC_MAX_DIMS >= 1);

// ------------------------------------------------------------------ tensors

// The byte size of a C tensor shape, with the checks only the C side needs (ndim range,
// NULL dims) before the C++ ones (dtype, negative dims, overflow).
std::size_t checked_nbytes(sdalloc::DType dtype, std::int32_t ndim, const std::int64_t* dims) {
  if (ndim < 0 || ndim > SDALLOC_MAX_DIMS) {
    throw sdalloc::InvalidArgument("ndim " + std::to_string(ndim) + " is out of range [0, " +
                                   std::to_string(SDALLOC_MAX_DIMS) + "]");
  }
  if (dims == nullptr && ndim > 0) {
    throw sdalloc::InvalidArgument("dims is NULL but ndim is " + std::to_string(ndim));
  }
  const std::span<const std::int64_t> shape(dims, dims == nullptr ? 0 : std::size_t(ndim));
  return sdalloc::tensor_nbytes(dtype, shape);
}

// Row-major contiguous strides in elements. Like PyTorch, a 0 dim counts as 1 here, so an
// empty tensor still gets distinct strides; that product can overflow even though the
// tensor has no elements, which is refused like any other overflowing shape.
void fill_contiguous_strides(sdalloc_tensor_t& tensor) {
  std::int64_t stride = 1;
  for (std::int32_t i = tensor.ndim - 1; i >= 0; --i) {
    tensor.strides[i] = stride;
    const std::int64_t extent = tensor.dims[i] == 0 ? 1 : tensor.dims[i];
    if (i > 0 && __builtin_mul_overflow(stride, extent, &stride)) {
      throw sdalloc::InvalidArgument(
          "tensor size overflows: the strides of this shape do not fit in int64_t");
    }
  }
}

}  // namespace

// ==================================================================== tensors

std::int32_t sdalloc_dtype_bits(sdalloc_dtype_t dtype) noexcept {
  return sdalloc::dtype_bits(dtype_of(dtype));
}

const char* sdalloc_dtype_name(sdalloc_dtype_t dtype) noexcept {
  // dtype_name returns views of string literals, so data() is NUL-terminated.
  return sdalloc::dtype_name(dtype_of(dtype)).data();
}

sdalloc_status_t sdalloc_tensor_nbytes(sdalloc_dtype_t dtype, std::int32_t ndim,
                                       const std::int64_t* dims, std::size_t* nbytes) noexcept {
  if (nbytes != nullptr) *nbytes = 0;
  return guarded(__func__, [&] {
    require(nbytes != nullptr, "nbytes is NULL");
    *nbytes = checked_nbytes(dtype_of(dtype), ndim, dims);
  });
}

sdalloc_status_t sdalloc_tensor_alloc(sdalloc_pool_t* pool, sdalloc_dtype_t dtype,
                                      std::int32_t ndim, const std::int64_t* dims,
                                      sdalloc_stream_t stream, sdalloc_tensor_t* out) noexcept {
  if (out != nullptr) std::memset(out, 0, sizeof *out);
  return guarded(__func__, [&] {
    sdalloc::AnyPool& handle_pool = pool_of(pool);
    require(out != nullptr, "out is NULL");
    sdalloc_tensor_t tensor;
    std::memset(&tensor, 0, sizeof tensor);
    tensor.nbytes = checked_nbytes(dtype_of(dtype), ndim, dims);
    tensor.dtype = dtype;  // a valid enumerator: checked_nbytes has accepted it
    tensor.ndim = ndim;
    tensor.stream = stream;
    for (std::int32_t i = 0; i < ndim; ++i) tensor.dims[i] = dims[i];
    fill_contiguous_strides(tensor);
    // Allocated last: nothing after it can throw, so a failure never leaks the memory.
    tensor.data = handle_pool.allocate(tensor.nbytes, sdalloc::kPoolRounding, stream_of(stream));
    pool->recorder.on_allocate(tensor.data, tensor.nbytes, stream_of(stream));
    *out = tensor;
  });
}

sdalloc_status_t sdalloc_tensor_free(sdalloc_pool_t* pool, sdalloc_tensor_t* tensor) noexcept {
  return guarded(__func__, [&] {
    sdalloc::AnyPool& handle_pool = pool_of(pool);
    require(tensor != nullptr, "tensor is NULL");
    pool->recorder.on_free(tensor->data, stream_of(tensor->stream));
    handle_pool.free(tensor->data, stream_of(tensor->stream));
    tensor->data = nullptr;
    tensor->nbytes = 0;
  });
}
