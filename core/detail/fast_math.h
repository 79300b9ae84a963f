// Branch-free f32 exp and erf for the CPU kernels' inner loops. glibc's expf/erff are calls the
// compiler cannot vectorise, and in a softmax or a GELU they cost more than the arithmetic
// around them; these are plain arithmetic and bit operations, so g++ vectorises the loops that
// call them (SSE2 at the baseline; the GELU and attention loops of core/cpu/simd_loops.cpp also
// as AVX2/AVX-512 clones, with the same bits). Host only: CUDA kernels use the device's expf/erff.
// Here rather than in core/cpu/: the GELU functors of core/detail/elementwise.h, which the CUDA
// kernels share, call it in their host path.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace tandem::detail {

// e^x as 2^n · e^r, r = x - n·ln 2 in [-ln2/2, ln2/2], with a degree-7 Taylor polynomial for e^r
// (relative error below 1e-7 over [-87, 88]). Exactly 0 below -87 (near where f32's normal range
// ends) and for -inf; NaN stays NaN. Inputs above 88 (+inf included) saturate at e^88 rather than
// overflow: the callers (softmax-like exponents, which are <= 0) never pass them.
inline float fast_exp(float x) {
  const float xc = x > 88.0f ? 88.0f : (x > -87.0f ? x : -87.0f);  // NaN lands on -87: no UB below
  const float t = xc * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest: 1.5·2^23 pushes the fraction out
  const float r = (xc - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  // Every value computed before the selects: a product inside a select's arm could trap, so g++
  // would keep the branch and not vectorise.
  const float v = p * two_n;
  const float low = x < -87.0f ? 0.0f : v;
  return x != x ? x : low;
}

// erf by Abramowitz & Stegun 7.1.26 (absolute error below 5e-7 evaluated in f32): the
// approximation PyTorch's vectorised CPU erf uses for f32 (its GELU included). Absolute, not
// relative: near 0 it is far from erf in relative terms, fine inside GELU (x · (1 + erf)) but not
// a general erf. NaN stays NaN, ±inf gives ±1.
inline float fast_erf(float x) {
  const float a = std::fabs(x);
  const float t = 1.0f / (0.3275911f * a + 1.0f);
  float r = 1.061405429f;
  r = r * t - 1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t - 0.284496736f;
  r = r * t + 0.254829592f;
  return std::copysign(1.0f - r * t * fast_exp(-a * a), x);
}

}  // namespace tandem::detail
