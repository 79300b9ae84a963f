// Hot contiguous CPU loops built for AVX-512, AVX2 and the baseline and picked at load time
// (GCC's target_clones): the library itself is built for the baseline x86-64, whose SSE2 is 4
// floats wide and has no 32-to-16-bit pack. core/cpu/elementwise_loops.h routes to them.
//
// - bf16 <-> f32 conversion runs, bitwise the scalar conversions of core/half.h (round to
//   nearest even, NaN kept quiet with its sign and payload, subnormals kept): a bf16 cast or
//   divided copy took 2.6x the time of the f32 one on half the bytes at SSE2.
// - exact GELU and its gradient in f32 (the vectorisable erf and exp of core/detail/fast_math.h),
//   a fifth of a GPT step at SSE2 width, and the attention kernels' exponentials. The file is compiled with -ffp-contract=off, so the
//   AVX2/AVX-512 clones make the same IEEE operations as the baseline (no fused multiply-adds):
//   the same bits on every CPU.
// Internal: not installed.
#pragma once

#include <cstdint>

#include "core/half.h"

namespace tandem::detail {

void bf16_to_f32_n(const BFloat16* src, float* dst, int64_t n);
void f32_to_bf16_n(const float* src, BFloat16* dst, int64_t n);

// y[i] = Gelu{}(x[i]); out[i] = GeluGradX{}(g[i], x[i]) (core/detail/elementwise.h's functors).
// The output may be one of the inputs (in place), not otherwise overlap them.
void gelu_f32_n(const float* x, float* y, int64_t n);
void gelu_grad_f32_n(const float* g, const float* x, float* out, int64_t n);
// x[i] = fast_exp(x[i] - shift) in place: the attention kernels' softmax weights.
void exp_shifted_f32_n(float* x, float shift, int64_t n);

}  // namespace tandem::detail
