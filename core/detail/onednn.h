// bf16 GEMM through oneDNN's matmul primitive: on a CPU with AVX512_BF16 it multiplies bf16
// directly (VDPBF16PS, f32 accumulation) at over twice the f32 sgemm's rate, where the portable
// route converts both operands to f32 around one sgemm. PyTorch's CPU bf16 matmul is the same
// oneDNN kernel. Built only when CMake finds oneDNN (Debian's libdnnl-dev); everything else in
// core reaches it through onednn_bf16_gemm, which says whether it ran.
#pragma once

#include <cstdint>

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

}  // namespace tandem::detail
