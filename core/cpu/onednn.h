// What Tandem runs on oneDNN (Debian's libdnnl-dev, 2.6, what PyTorch 1.13 uses on the CPU):
//
// bf16 GEMM through oneDNN's matmul primitive: on a CPU with AVX512_BF16 it multiplies bf16
// directly (VDPBF16PS, f32 accumulation) at over twice the f32 sgemm's rate, where the portable
// route converts both operands to f32 around one sgemm. PyTorch's CPU bf16 matmul is the same
// oneDNN kernel. Built only when CMake finds oneDNN (Debian's libdnnl-dev); everything else in
// core reaches it through onednn_bf16_gemm, which says whether it ran.
//
// f32 GEMM through the same primitive where OpenBLAS runs no AVX-512 kernel on an AVX-512 CPU
// (onednn_f32_gemm: Debian's OpenBLAS 0.3.21 takes AMD Zen 4/5 for Haswell). Its results do not
// depend on the intra-op thread count (OpenBLAS's do, at 1 vs 2 threads, for most shapes).
//
// f32 convolution (conv2d forward, and its input and weight gradients) through oneDNN's direct
// convolution kernels (jit:avx512_core on an AVX-512 CPU), which run on blocked channel layouts:
// the plain NCHW operands are reordered in and out on every call, as PyTorch's CPU convolution
// does, and the whole still beats im2col + sgemm by about a quarter at one thread. Each call says
// whether it ran; the caller keeps im2col + GEMM for what oneDNN does not take (f64, half
// precision through f32 is the caller's, empty shapes, a geometry oneDNN rejects).
#pragma once

#include <cstdint>

#include "core/detail/conv.h"
#include "core/half.h"

namespace tandem::detail {

// Whether onednn_bf16_gemm will run: oneDNN is built in, the CPU has AVX512_BF16 (checked at run
// time, once), and TANDEM_ONEDNN is not 0 (the switch that forces the portable route).
bool onednn_bf16_available();

// C (row stride ldc, unit column stride) = A·B, plus C when accumulate, rounded to bf16 once from
// the f32 sum. A is M x K, B is K x N; each needs a unit row or column stride (blas_layout).
// Returns false, computing nothing, when oneDNN is unavailable or has no bf16 kernel for these
// operands; the caller then takes the portable route. Errors during execution throw.
bool onednn_bf16_gemm(int64_t M, int64_t N, int64_t K, const BFloat16* a, int64_t as0, int64_t as1,
                      const BFloat16* b, int64_t bs0, int64_t bs1, BFloat16* c, int64_t ldc, bool accumulate,
                      const char* op);

// f32 GEMM through oneDNN's matmul primitive where it beats OpenBLAS: the CPU has AVX-512 but
// OpenBLAS does not run one of its AVX-512 kernels on it (0.3.21 takes AMD's Zen 4 and 5 for
// Haswell), checked once; TANDEM_ONEDNN=0 keeps OpenBLAS. The same contract as onednn_bf16_gemm:
// false, computing nothing, when oneDNN is not preferred or has no kernel for these operands.
bool onednn_f32_gemm_preferred();
bool onednn_f32_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t as0, int64_t as1, const float* b,
                     int64_t bs0, int64_t bs1, float* c, int64_t ldc, bool accumulate, const char* op);

// Whether the oneDNN convolutions may run: oneDNN is built in and TANDEM_ONEDNN is not 0.
bool onednn_conv_available();
// How many convolution calls (forward, or one backward) this thread ran on oneDNN: what the tests
// check to know the fast path ran.
int64_t onednn_conv_runs();

// y [N, O, OH, OW] = conv2d(x [N, C, H, W], w [O, C / groups, kh, kw]) + bias (nullable), every
// operand contiguous f32. False, computing nothing, when oneDNN does not take this geometry.
bool onednn_conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w, const float* bias, float* y);
// The gradients of that convolution for gy [N, O, OH, OW]: gx [N, C, H, W] and gw [O, C / groups,
// kh, kw], each skipped when null (the bias gradient is the caller's). False, computing nothing,
// when oneDNN does not take one of the asked gradients.
bool onednn_conv2d_backward(const Conv2dGeometry& g, const float* gy, const float* x, const float* w, float* gx,
                            float* gw);

}  // namespace tandem::detail
