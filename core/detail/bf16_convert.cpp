#include "core/detail/bf16_convert.h"

#include "core/detail/sanitizers.h"

namespace tandem::detail {

// Clones for AVX-512 (x86-64-v4: vpmovdw narrows 16 lanes at once), AVX2 and the baseline, by
// GCC's target_clones. Not under ThreadSanitizer (its runtime crashes in the load-time ifunc
// resolver, see dist/detail/reduce_kernels.h) nor clang (the fuzzers' build): the baseline there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !TANDEM_TSAN
#define TANDEM_CONVERT_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define TANDEM_CONVERT_CLONES
#endif

TANDEM_CONVERT_CLONES void bf16_to_f32_n(const BFloat16* src, float* dst, int64_t n) {
  const auto* s = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(s[i]);
}

TANDEM_CONVERT_CLONES void f32_to_bf16_n(const float* src, BFloat16* dst, int64_t n) {
  auto* d = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(src[i]);
}

}  // namespace tandem::detail
