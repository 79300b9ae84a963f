// 2-byte floating types: IEEE binary16 (Half) and bfloat16 (BFloat16).
//
// Conversions from float round to nearest, ties to even, and keep NaN (quiet), infinities and
// subnormals. Arithmetic goes through float: kernels accumulate these types in f32.
//
// Host code converts with the software routines below. Device code (nvcc's device pass) converts
// finite values with the hardware instructions (__float2half_rn, __half2float, __float2bfloat16_rn,
// __bfloat162float of cuda_fp16.h/cuda_bf16.h), which round to nearest even as the software does,
// so both give the same bits for every finite input, overflow to Inf and subnormals included.
// Inf and NaN take the software path on both: the hardware may give a canonical NaN where the
// software keeps the NaN's sign and payload (tests/test_cuda_elementwise.cpp checks the bits).
// The layout stays a 2-byte struct of raw bits; a CPU-only build includes no CUDA header
// (cuda_fp16.h is included under nvcc only).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "core/macros.h"

namespace tandem {

namespace detail {
TANDEM_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
TANDEM_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TANDEM_HOST_DEVICE inline uint16_t float_to_half_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u));
  }
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));  // finite: round to nearest even, as below
#else
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to Inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Add 0.5 so the FPU does the round-to-nearest-even of the subnormal mantissa for us.
    float magic = bits_float(0x3f000000u);  // 0.5
    float v = bits_float(abs) + magic;
    return static_cast<uint16_t>(sign | (float_bits(v) - 0x3f000000u));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // re-bias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (abs >> 13));
#endif
}

TANDEM_HOST_DEVICE inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // Inf/NaN
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));  // finite halves are exact in float
#else
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // subnormal: value = mant * 2^-24
    float v = static_cast<float>(mant) * bits_float(0x33800000u);
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
#endif
}

TANDEM_HOST_DEVICE inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  const uint32_t quiet_nan = (x >> 16) | 0x40u;  // keeps the sign and the payload's top bits
#if defined(__CUDA_ARCH__)
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(quiet_nan);
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));  // round to nearest even, as below
#else
  // Round to nearest even; a select, not an early return, so loops of conversions vectorise
  // (the bf16 casts, the bf16 bucket reduction of dist/detail/reduce_kernels.h).
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
#endif
}

TANDEM_HOST_DEVICE inline float bf16_bits_to_float(uint16_t b) {
#if defined(__CUDA_ARCH__)
  if ((b & 0x7fffu) <= 0x7f80u) return __bfloat162float(__ushort_as_bfloat16(b));  // not NaN: exact
#endif
  return bits_float(static_cast<uint32_t>(b) << 16);
}
}  // namespace detail

struct Half {
  uint16_t bits = 0;
  Half() = default;
  TANDEM_HOST_DEVICE Half(float f) : bits(detail::float_to_half_bits(f)) {}  // NOLINT: implicit like float
  TANDEM_HOST_DEVICE operator float() const { return detail::half_bits_to_float(bits); }
  TANDEM_HOST_DEVICE static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  TANDEM_HOST_DEVICE BFloat16(float f) : bits(detail::float_to_bf16_bits(f)) {}  // NOLINT
  TANDEM_HOST_DEVICE operator float() const { return detail::bf16_bits_to_float(bits); }
  TANDEM_HOST_DEVICE static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

}  // namespace tandem
