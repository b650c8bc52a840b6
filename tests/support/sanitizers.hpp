// sanitizers.hpp - which sanitizer a test is built with, as constants (GCC's __SANITIZE_*__
// macros, clang's __has_feature), so a test says what differs there in ordinary code.
#pragma once

// __has_feature where the compiler has it (clang; GCC from 14), false elsewhere.
#if defined(__has_feature)
#define SDALLOC_TEST_HAS_FEATURE(feature) __has_feature(feature)
#else
#define SDALLOC_TEST_HAS_FEATURE(feature) 0
#endif

namespace sdalloc::test {

#if defined(__SANITIZE_ADDRESS__) || SDALLOC_TEST_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

#if defined(__SANITIZE_THREAD__) || SDALLOC_TEST_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

// The two that put shadow memory behind every access (several times slower) and replace
// some system calls (mlock does nothing and succeeds under both).
inline constexpr bool kAddressOrThreadSanitizer = kAddressSanitizer || kThreadSanitizer;

}  // namespace sdalloc::test

#undef SDALLOC_TEST_HAS_FEATURE
