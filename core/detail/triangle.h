// The triangles of a matrix, tril and triu: the forward computation (also their backward, which
// applies the same mask to the gradient) and the device table. Everything here validates its
// arguments and throws "[tril] ..." / "[triu] ..." errors; nothing here records on the tape
// (autograd/triangle_grad.cpp does that).
//
// Its own family rather than a member of the index one: it reads no index tensor and needs none of
// that family's range checks; what it shares with masked_fill (keep or zero each element) is a
// two-line loop, while the position test, which is what the kernels are about, is its own.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem::detail {

// Which side of the diagonal is kept. Element (i, j) of a matrix lies on diagonal j - i: 0 is the
// main diagonal, positive ones above it, negative ones below.
//   lower (tril): keeps j - i <= diagonal;  upper (triu): keeps j - i >= diagonal.
enum class Triangle : uint8_t { lower, upper };

inline const char* triangle_op_name(Triangle which) { return which == Triangle::lower ? "tril" : "triu"; }

// A new contiguous tensor of a's shape and dtype: a's elements on the kept side of `diagonal` in
// each matrix of its last two dims (batched over the leading ones), zero elsewhere. Any dtype,
// any strides, any diagonal (one past either corner keeps everything or nothing). Throws
// "[tril] input must have at least 2 dims ..." for fewer.
Tensor triangle(const Tensor& a, int64_t diagonal, Triangle which);

// ---- device kernels ----
// The table a device backend registers (cuda/triangle.cu) with register_device_kernels. Core has
// validated the arguments and allocated `out`: contiguous, a's shape and dtype, at least 2 dims and
// at least one element, on a's device. `a` has any strides. Zero means all-zero bits, which is
// zero (or false) in every dtype.
struct TriangleDeviceKernels {
  virtual ~TriangleDeviceKernels() = default;
  virtual void triangle(const Tensor& out, const Tensor& a, int64_t diagonal, Triangle which) = 0;
};

}  // namespace tandem::detail
