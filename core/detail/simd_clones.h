// TANDEM_SIMD_CLONES: a hot loop built for AVX-512 (x86-64-v4), AVX2 and the baseline x86-64 and
// picked at load time by the CPU (GCC's target_clones); the library itself is built for the
// baseline. Empty (the baseline only) under ThreadSanitizer, whose runtime crashes in the clones'
// load-time ifunc resolver; under clang (the fuzzers' build), which refuses target_clones on
// function templates; and off x86-64. Used by core/cpu/simd_loops.cpp and the bucket reduction
// (dist/detail/reduce_kernels.h). Internal: not installed.
#pragma once

#include "core/detail/sanitizers.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !TANDEM_TSAN
#define TANDEM_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define TANDEM_SIMD_CLONES
#endif
