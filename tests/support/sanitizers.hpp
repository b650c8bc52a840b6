// sanitizers.hpp - which sanitizer a test is built with, as constants (GCC's __SANITIZE_*__
// macros, clang's __has_feature), so a test says what differs there in ordinary code.
#pragma once

namespace sdalloc::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

// The two that put shadow memory behind every access (several times slower) and replace
// some system calls (mlock does nothing and succeeds under both).
inline constexpr bool kAddressOrThreadSanitizer = kAddressSanitizer || kThreadSanitizer;

}  // namespace sdalloc::test
