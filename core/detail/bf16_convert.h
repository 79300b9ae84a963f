// Runs of bf16 <-> f32 conversions for the CPU loops (core/detail/elementwise_loops.h): bitwise
// the scalar conversions of core/half.h (round to nearest even, NaN kept quiet with its sign and
// payload, subnormals kept), built for AVX-512, AVX2 and the baseline and picked at load time.
// The baseline build's SSE2 has no 32-to-16-bit pack, so a bf16 loop spent most of its time
// shuffling: a bf16 cast or divided copy took 2.6x the time of the f32 one on half the bytes.
// Internal: not installed.
#pragma once

#include <cstdint>

#include "core/half.h"

namespace tandem::detail {

void bf16_to_f32_n(const BFloat16* src, float* dst, int64_t n);
void f32_to_bf16_n(const float* src, BFloat16* dst, int64_t n);

}  // namespace tandem::detail
