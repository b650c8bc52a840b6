// boundary.hpp - what every C API entry point (c_api.cpp, tensor_api.cpp) runs through
// (internal): guarded() turns whatever a body throws into a status and the thread's message;
// and the small checks and conversions of C arguments.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "c_api/c_pool.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/tensor.hpp"
#include "sdalloc/sdalloc.h"

namespace sdalloc::c_api_detail {

// ------------------------------------------------------------------ errors

constexpr std::size_t kMessageCapacity = 1024;
// Constant-initialised POD: no TLS guard, no allocation, cannot throw.
inline thread_local char t_last_error[kMessageCapacity] = "";

inline sdalloc_status_t fail(const char* function, sdalloc_status_t status,
                             const char* message) noexcept {
  std::snprintf(t_last_error, kMessageCapacity, "%s: %s", function, message);
  return status;
}

// Runs body and turns whatever it throws into a status. The most specific sdalloc errors
// are caught first; OutOfMemory before Error, since it derives from it.
template <typename Body>
sdalloc_status_t guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return SDALLOC_SUCCESS;
  } catch (const sdalloc::OutOfMemory& e) {
    return fail(function, SDALLOC_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const sdalloc::InvalidArgument& e) {
    return fail(function, SDALLOC_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const sdalloc::InvalidPointer& e) {
    return fail(function, SDALLOC_ERROR_INVALID_POINTER, e.what());
  } catch (const std::bad_alloc&) {
    return fail(function, SDALLOC_ERROR_OUT_OF_MEMORY,
                "out of host memory for sdalloc's own bookkeeping (std::bad_alloc)");
  } catch (const std::exception& e) {
    return fail(function, SDALLOC_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(function, SDALLOC_ERROR_INTERNAL, "unknown exception (not a std::exception)");
  }
}

inline void require(bool condition, const char* what) {
  if (!condition) throw sdalloc::InvalidArgument(what);
}

inline sdalloc::AnyPool& pool_of(sdalloc_pool_t* pool) {
  require(pool != nullptr, "pool is NULL");
  return *pool->pool;
}

inline sdalloc::Stream stream_of(sdalloc_stream_t stream) {
  return sdalloc::Stream::from_native(stream);
}

// The integer a C caller passed in an enum type. C lets any int travel in an enum; in C++
// a value outside the enumerators' range is undefined behaviour to load (UBSan reports it),
// so enums that come from C are read through their object representation and checked as
// integers.
template <typename Enum>
std::int32_t raw_value(const Enum& value) noexcept {
  static_assert(sizeof(Enum) == sizeof(std::int32_t), "C enums are int-sized");
  std::int32_t raw = 0;
  std::memcpy(&raw, &value, sizeof raw);
  return raw;
}

// DType has a fixed underlying type, so every int32 is a valid DType value (perhaps not
// one of its enumerators, which dtype_bits() answers with 0).
inline sdalloc::DType dtype_of(const sdalloc_dtype_t& dtype) noexcept {
  return static_cast<sdalloc::DType>(raw_value(dtype));
}

// The *_config_init_sized functions: writes the first struct_size bytes of `full` (the
// defaults) to `out`, and struct_size as what was written, so a caller's shorter, older
// struct gets its own fields and no more; nothing when out is NULL or struct_size cannot
// hold struct_size itself.
template <class Config>
void copy_defaults(const Config& full, Config* out, std::size_t struct_size) noexcept {
  if (out == nullptr || struct_size < sizeof out->struct_size) return;
  Config sized = full;
  sized.struct_size = std::min(struct_size, sizeof full);
  std::memcpy(out, &sized, sized.struct_size);
}

}  // namespace sdalloc::c_api_detail
