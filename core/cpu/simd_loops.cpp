#include "core/cpu/simd_loops.h"

#include "core/detail/elementwise.h"
#include "core/detail/simd_clones.h"

namespace tandem::detail {

namespace {
// Blocks of 16 computed into a local buffer, then stored: every load of a block comes before its
// stores, so the block vectorises without alias checks even when the output is an input.
template <class F>
TANDEM_INLINE void blocked(float* out, int64_t n, const F& f) {
  constexpr int64_t kBlock = 16;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float tmp[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) tmp[k] = f(i + k);
    for (int64_t k = 0; k < kBlock; ++k) out[i + k] = tmp[k];
  }
  for (; i < n; ++i) out[i] = f(i);
}
}  // namespace

TANDEM_SIMD_CLONES void bf16_to_f32_n(const BFloat16* src, float* dst, int64_t n) {
  const auto* s = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(s[i]);
}

TANDEM_SIMD_CLONES void f32_to_bf16_n(const float* src, BFloat16* dst, int64_t n) {
  auto* d = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(src[i]);
}

TANDEM_SIMD_CLONES void gelu_f32_n(const float* x, float* y, int64_t n) {
  const Gelu f;
  blocked(y, n, [&](int64_t i) { return f(x[i]); });
}

TANDEM_SIMD_CLONES void gelu_grad_f32_n(const float* g, const float* x, float* out, int64_t n) {
  const GeluGradX f;
  blocked(out, n, [&](int64_t i) { return f(g[i], x[i]); });
}

TANDEM_SIMD_CLONES void exp_shifted_f32_n(float* x, float shift, int64_t n) {
  blocked(x, n, [&](int64_t i) { return fast_exp(x[i] - shift); });
}

}  // namespace tandem::detail
