// sdalloc/core/errors.hpp - the typed errors every sdalloc component throws.
//
// All errors derive from sdalloc::Error (itself a std::runtime_error), so one catch clause
// handles them all. Every operation that throws leaves the object it was called on unchanged
// and usable: a failed allocate reserves nothing, a rejected free frees nothing.
//
//   OutOfMemory      the request cannot be met: the resource refused even after the pool
//                    released its cached memory. The message and the fields say how big the
//                    request was and what the pool held at that moment.
//   InvalidArgument  the call itself is wrong: alignment not a power of two, a size that
//                    does not match the allocation, a bad configuration.
//   InvalidPointer   a pointer the pool does not own as a live allocation: never handed
//                    out, already freed (double free), or an interior pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace sdalloc {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
};

class InvalidPointer : public Error {
 public:
  explicit InvalidPointer(const std::string& what, const void* ptr = nullptr)
      : Error(what), pointer(ptr) {}
  const void* pointer;
};

// What a pool held when a request failed. Fields a layer does not know are 0 (a plain
// resource does not know "live"; an unlimited resource has capacity 0 = unknown).
struct OutOfMemoryInfo {
  std::size_t requested = 0;     // bytes asked for
  std::size_t live = 0;          // bytes in live allocations (as requested)
  std::size_t reserved = 0;      // bytes held from the resource below
  std::size_t largest_free = 0;  // largest free block the pool could have handed out
  std::size_t capacity = 0;      // limit of the resource below, 0 if unknown or none
};

class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& what, const OutOfMemoryInfo& details)
      : Error(what), info(details) {}
  // Builds the standard message: "out of memory: <where> could not allocate ... (live ...,
  // reserved ..., largest free block ..., capacity ...)", sizes shown in bytes and MiB.
  static OutOfMemory describe(const std::string& where, const OutOfMemoryInfo& info,
                              const std::string& detail = {});
  OutOfMemoryInfo info;
};

// Human-readable size, e.g. "2262839808 B (2158.0 MiB)". Used in every error message.
std::string format_bytes(std::size_t bytes);
// Only the rounded figure: "512 B", "4.0 KiB", "20.0 MiB", "8.0 GiB" (the largest binary
// unit the value reaches), for names and tables where the exact count would be noise.
std::string format_size(std::size_t bytes);
// As format_size, with `gib_decimals` digits (0 to 9) after the point when the unit is GiB:
// "2.11 GiB" for a report comparing peaks of a few GiB. format_size(b) is format_size(b, 1).
std::string format_size(std::size_t bytes, int gib_decimals);
// Exactly, in the largest binary unit (up to EiB) that divides it: "0 B", "64 B", "4 KiB",
// "3 MiB", "1536 KiB"; for sizes that are round by construction (page sizes, size classes).
std::string format_exact_size(std::uint64_t bytes);

}  // namespace sdalloc
