// Which sanitizer this translation unit is built under, as 0/1 macros for GCC (__SANITIZE_*__)
// and clang (__has_feature). Internal: not installed. Code that must behave differently under one
// (an allocation cache that would hide a use after free, a load-time ifunc resolver TSan crashes
// in, bounds on RSS that a quarantine breaks) tests these, never the compilers' spellings.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define TANDEM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TANDEM_ASAN 1
#endif
#endif
#ifndef TANDEM_ASAN
#define TANDEM_ASAN 0
#endif

#if defined(__SANITIZE_THREAD__)
#define TANDEM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TANDEM_TSAN 1
#endif
#endif
#ifndef TANDEM_TSAN
#define TANDEM_TSAN 0
#endif
