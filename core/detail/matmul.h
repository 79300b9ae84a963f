// Matrix products (matmul, mm, bmm, linear, addmm): forward kernels and the GEMM-only backward
// kernels their autograd rules use. No autograd here (autograd/matmul_grad.cpp).
//
// Everything funnels into one strided batched GEMM. f32/f64 go to CBLAS (OpenBLAS); an operand
// whose rows or columns are unit-stride is passed with a leading dimension and a transpose flag
// instead of being copied, so x.matmul(w.t()) copies nothing. bf16 goes to oneDNN where the CPU
// has AVX512_BF16 (core/cpu/onednn.h); f16, and bf16 elsewhere, are computed through f32,
// integers with a plain loop. Tensors on another device take the same route up to the GEMM, which
// goes to that device's MatmulDeviceKernels (cuda/matmul.cu: cuBLAS).
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace tandem::detail {

// One operand of a batched GEMM: element strides of its batch dims (aligned with the batch
// shape, 0 where it is broadcast) and of its rows and columns.
struct MatOperand {
  const void* data = nullptr;  // element [0, ..., 0]
  Strides batch_strides;
  int64_t s0 = 0, s1 = 0;
  MatOperand transposed() const { return {data, batch_strides, s1, s0}; }
};

// C[i] = (accumulate ? C[i] : 0) + A[i] B[i] over every batch index i, A[i] being M x K and
// B[i] K x N. C's rows are contiguous (ldc = N); its batch strides may be 0, in which case the
// products of that dim are summed into it (C must then span c_numel elements to be zeroed).
// Batch dims that fold into M (B shared across the batch) or into K (C shared) become one GEMM.
// Every pointer is in `device`'s memory; non-CPU devices go to their MatmulDeviceKernels.
// One host GEMM, C (row stride ldc, unit column stride) = A·B, plus C when accumulate: A is M x K
// and B is K x N with any element strides (a transposed operand is swapped strides), through BLAS
// for f32 and f64. For CPU kernels that multiply tiles of their own (attention).
template <class T>
void host_gemm(int64_t M, int64_t N, int64_t K, const T* a, int64_t as0, int64_t as1, const T* b, int64_t bs0,
               int64_t bs1, T* c, int64_t ldc, bool accumulate, const char* op);

void batched_gemm(Device device, Dtype dtype, const Shape& batch, int64_t M, int64_t N, int64_t K,
                  const MatOperand& a, const MatOperand& b, void* c, const Strides& c_batch_strides, int64_t c_numel,
                  bool accumulate, const char* op);

// Host-side planning shared by batched_gemm and the device backends' GEMMs (cuda/matmul.cu), so
// every device reads operands and folds batches the same way.
//
// How a BLAS reads a row-major rows x cols matrix with element strides (s0, s1) in place: unit
// column stride -> untransposed, ld = s0; unit row stride -> transposed, ld = s1 (size-1 dims'
// strides are normalised first). False when neither: the caller copies the operand.
bool blas_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1, bool& transposed, int64_t& ld);
// True when some batch dim of C has stride 0: products of that dim are summed into one C[i].
bool sums_over_batch(const Shape& batch, const Strides& c_batch_strides);
// When a whole batch is one GEMM: into_rows, B shared by the batch and the batch dims of A and C
// continuing their rows (M * nb rows); into_contraction, C shared (summed over) and the batch dims
// of A and B continuing the contraction (K * nb terms); else none.
enum class BatchFold { none, into_rows, into_contraction };
BatchFold fold_batch(const Shape& batch, int64_t M, int64_t N, int64_t K, const MatOperand& a, const MatOperand& b,
                     const Strides& c_batch_strides);

// The GEMM of a non-CPU backend (registered with register_device_kernels). Same contract as
// batched_gemm; core has validated the operands and allocated C, and the call is ordered on the
// device's current stream.
struct MatmulDeviceKernels {
  virtual ~MatmulDeviceKernels() = default;
  virtual void batched_gemm(Device device, Dtype dtype, const Shape& batch, int64_t M, int64_t N, int64_t K,
                            const MatOperand& a, const MatOperand& b, void* c, const Strides& c_batch_strides,
                            int64_t c_numel, bool accumulate, const char* op) = 0;
};

Tensor matmul_kernel(const Tensor& a, const Tensor& b, const char* op = "matmul");
Tensor mm_kernel(const Tensor& a, const Tensor& b);
Tensor bmm_kernel(const Tensor& a, const Tensor& b);
Tensor linear_kernel(const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor addmm_kernel(const Tensor& bias, const Tensor& a, const Tensor& b);

// grad_a = g b^T and grad_b = a^T g, reduced over broadcast batch dims, shaped like a and b
// (undefined where not needed).
std::array<Tensor, 2> matmul_backward(const Tensor& g, const Tensor& a, const Tensor& b, bool need_a, bool need_b);
// grad_x = g W, grad_W = g^T x (one GEMM over the flattened leading dims), grad_b = sum of g
// over the leading dims.
std::array<Tensor, 3> linear_backward(const Tensor& g, const Tensor& x, const Tensor& weight, bool need_x,
                                      bool need_w, bool need_b);

}  // namespace tandem::detail
