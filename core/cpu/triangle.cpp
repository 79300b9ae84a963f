#include "core/detail/triangle.h"

#include <algorithm>
#include <cstring>

#include "core/detail/iter.h"
#include "core/detail/kernel_tables.h"

namespace tandem::detail {

namespace {

// clamp(s + k, 0, n) for a row number s >= 0 and any diagonal k, without forming s + k where it
// would overflow (k may be anywhere in int64).
int64_t clamp_sum(int64_t s, int64_t k, int64_t n) {
  if (k >= n) return n;
  if (k <= -s) return 0;
  return std::min(s + k, n);
}

// One matrix: out (contiguous rows of `cols`) from `in` (row stride rs, column stride cs, in
// elements). Row i keeps columns [lo, hi) and zeroes the rest. A stride is only ever multiplied
// by an index below its size: the stride of a size-1 dim may be anything.
template <class E>
void triangle_matrix(E* out, const E* a, int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t diagonal,
                     Triangle which) {
  for (int64_t i = 0; i < rows; ++i, out += cols) {
    const E* in = a + i * rs;
    const int64_t lo = which == Triangle::lower ? 0 : clamp_sum(i, diagonal, cols);
    const int64_t hi = which == Triangle::lower ? clamp_sum(i + 1, diagonal, cols) : cols;
    if (lo >= hi) {
      std::memset(out, 0, static_cast<size_t>(cols) * sizeof(E));
      continue;
    }
    if (lo > 0) std::memset(out, 0, static_cast<size_t>(lo) * sizeof(E));
    if (cs == 1) {
      std::memcpy(out + lo, in + lo, static_cast<size_t>(hi - lo) * sizeof(E));
    } else {
      for (int64_t j = lo; j < hi; ++j) out[j] = in[j * cs];
    }
    if (hi < cols) std::memset(out + hi, 0, static_cast<size_t>(cols - hi) * sizeof(E));
  }
}

// Calls f(E{}) with an unsigned type of a's element size: the kernel moves bits, and all-zero bits
// are zero in every dtype, so one instance serves every dtype of that size.
template <class F>
void dispatch_element_size(Dtype dtype, const char* op, F&& f) {
  switch (itemsize(dtype)) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    case 8: f(uint64_t{}); break;
    default: fail("[{}] internal: no element type of {} bytes", op, itemsize(dtype));
  }
}

void triangle_cpu(const Tensor& out, const Tensor& a, int64_t diagonal, Triangle which, const char* op) {
  const int64_t nd = a.dim();
  const int64_t rows = a.size(nd - 2), cols = a.size(nd - 1);
  const int64_t rs = a.stride(nd - 2), cs = a.stride(nd - 1);
  // The leading (batch) dims: one matrix per position, walked by the iterator's runs.
  Shape batch = a.shape();
  Strides in_st = a.strides();
  batch.resize(batch.size() - 2);
  in_st.resize(in_st.size() - 2);
  Strides out_st(batch.size());
  int64_t step = rows * cols;
  for (size_t d = batch.size(); d-- > 0;) {
    out_st[d] = step;
    step *= batch[d];
  }
  const int64_t isz = static_cast<int64_t>(a.element_size());
  dispatch_element_size(a.dtype(), op, [&](auto tag) {
    using E = decltype(tag);
    strided_loop<2>(batch, {out_st, in_st}, {static_cast<char*>(out.data_ptr()), static_cast<char*>(a.data_ptr())},
                    {isz, isz}, [&](const StridedRun<2>& r) {
                      char* o = r.ptr[0];
                      const char* x = r.ptr[1];
                      for (int64_t m = 0; m < r.n; ++m, o += r.stride[0], x += r.stride[1])
                        triangle_matrix<E>(reinterpret_cast<E*>(o), reinterpret_cast<const E*>(x), rows, cols, rs, cs,
                                           diagonal, which);
                    });
  });
}

}  // namespace

Tensor triangle(const Tensor& a, int64_t diagonal, Triangle which) {
  const char* op = triangle_op_name(which);
  TANDEM_CHECK(a.defined(), "[{}] input is an undefined tensor", op);
  TANDEM_CHECK(a.dim() >= 2, "[{}] input must have at least 2 dims (a matrix or a batch of matrices), got shape {}",
               op, a.shape());
  Tensor out = make_empty(a.shape(), a.dtype(), a.device(), op);
  // Nothing to write; and an empty tensor's strides, which may be anything, must not be followed.
  if (out.numel() == 0) return out;
  if (!a.is_cpu()) [[unlikely]] {
    device_kernels<TriangleDeviceKernels>(a.device(), op).triangle(out, a, diagonal, which);
    return out;
  }
  triangle_cpu(out, a, diagonal, which, op);
  return out;
}

}  // namespace tandem::detail
