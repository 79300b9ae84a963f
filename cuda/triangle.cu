// CUDA kernel of the triangle family (core/detail/triangle.h): tril and triu, forward and backward
// (the backward is the same op on the gradient). One thread per output element: it finds its
// row and column, and copies the input element or writes zero. Elements move as bits (one kernel
// per element size, not per dtype): all-zero bits are zero in every dtype.
#include "core/detail/kernel_tables.h"
#include "core/detail/triangle.h"
#include "cuda/detail/launch.h"
#include "cuda/detail/strided.cuh"

namespace tandem::cuda {

namespace {

using detail::Triangle;
using namespace geom;

// Element e of a contiguous [..., rows, cols] output lies on diagonal col - row; kept when that is
// <= diagonal (lower) or >= diagonal (upper). col - row lies in (-rows, cols): no overflow for
// any diagonal.
__device__ inline bool kept(int64_t e, int64_t rows, int64_t cols, int64_t diagonal, bool lower) {
  const int64_t col = e % cols, row = (e / cols) % rows;
  const int64_t d = col - row;
  return lower ? d <= diagonal : d >= diagonal;
}

template <class E>
__global__ void triangle_contiguous_kernel(E* out, const E* a, int64_t rows, int64_t cols, int64_t diagonal, bool lower,
                                           int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = kept(e, rows, cols, diagonal, lower) ? a[e] : E(0);
}

// `a` of any strides: its element is found by unravelling e (only where it is kept).
template <class E>
__global__ void triangle_strided_kernel(E* out, const E* a, Dims dims, ElemStrides a_st, int64_t rows, int64_t cols,
                                        int64_t diagonal, bool lower, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = kept(e, rows, cols, diagonal, lower) ? a[offset_of(e, dims, a_st)] : E(0);
}

class CudaTriangleKernels final : public detail::TriangleDeviceKernels {
 public:
  void triangle(const Tensor& out, const Tensor& a, int64_t diagonal, Triangle which) override {
    const char* op = detail::triangle_op_name(which);
    const int64_t n = out.numel();
    if (n == 0) return;
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    const int64_t rows = a.size(-2), cols = a.size(-1);
    const bool lower = which == Triangle::lower;
    const bool contiguous = a.is_contiguous();
    Dims dims;
    ElemStrides a_st;
    if (!contiguous) {  // (the contiguous kernel takes any number of dims)
      dims = dims_of(a.shape(), op);
      a_st = strides_of(a.strides());
    }
    dispatch_bits(a.dtype(), [&](auto tag) {
      using E = decltype(tag);
      auto* o = static_cast<E*>(out.data_ptr());
      const auto* x = static_cast<const E*>(a.data_ptr());
      if (contiguous) {
        triangle_contiguous_kernel<E><<<blocks_for(n), kBlockThreads, 0, stream>>>(o, x, rows, cols, diagonal, lower, n);
        TANDEM_CUDA_CHECK_LAUNCH("triangle_contiguous_kernel");
      } else {
        triangle_strided_kernel<E><<<blocks_for(n), kBlockThreads, 0, stream>>>(o, x, dims, a_st, rows, cols, diagonal,
                                                                                lower, n);
        TANDEM_CUDA_CHECK_LAUNCH("triangle_strided_kernel");
      }
    });
  }
};

}  // namespace

void install_triangle_kernels() {
  static CudaTriangleKernels table;
  register_device_kernels<detail::TriangleDeviceKernels>(DeviceType::cuda, &table);
}

}  // namespace tandem::cuda
