// Strided indexing for device kernels: maps the linear index of an output element (row-major
// over the output's shape) to the element offset of each operand, the operands broadcast to the
// output's shape with arbitrary (also zero) strides.
//
// The host coalesces the dims first (drops size-1 dims, merges neighbours that are contiguous for
// every operand), so the common cases reach the device as one or two dims. Division by the dim
// sizes uses a multiply-and-shift divider while all linear indices fit in 31 bits.
#pragma once

#include <array>
#include <cstdint>

#include "core/detail/iter.h"
#include "core/macros.h"
#include "core/tensor.h"

// `#pragma unroll` for the device pass only (the host compiler warns about it).
#if defined(__CUDA_ARCH__)
#define TANDEM_UNROLL _Pragma("unroll")
#else
#define TANDEM_UNROLL
#endif

namespace tandem::cuda {

// The most dims, after coalescing, a device kernel indexes; beyond it ops fail with a clear error.
inline constexpr int kMaxDims = 12;

// n / d for 0 <= n, d < 2^31 by a multiply-high and a shift (Granlund and Montgomery, as in
// PyTorch's IntDivider): shift = ceil(log2 d), magic = floor(2^32 (2^shift - d) / d) + 1.
struct IntDivider {
  uint32_t divisor = 1;
  uint32_t magic = 1;
  uint32_t shift = 0;

  IntDivider() = default;
  explicit IntDivider(uint32_t d) : divisor(d) {
    shift = 0;
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  TANDEM_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    uint32_t t = __umulhi(n, magic);
#else
    uint32_t t = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return (t + n) >> shift;  // t + n < 2^32 since n < 2^31
  }
};

template <int N>
struct Offsets {
  int64_t v[N];
};

// N operands (the output first); strides are in elements, dims innermost first.
template <int N>
struct OffsetCalc {
  int dims = 0;
  bool use32 = true;  // every linear index < 2^31: the IntDivider path
  int64_t size[kMaxDims];
  IntDivider divider[kMaxDims];
  int64_t stride[kMaxDims][N];

  TANDEM_HOST_DEVICE Offsets<N> get(int64_t linear) const {
    Offsets<N> o;
TANDEM_UNROLL
    for (int j = 0; j < N; ++j) o.v[j] = 0;
    if (use32) {
      uint32_t rem = static_cast<uint32_t>(linear);
TANDEM_UNROLL
      for (int d = 0; d < kMaxDims; ++d) {
        if (d == dims) break;
        uint32_t q = divider[d].div(rem);
        int64_t idx = static_cast<int64_t>(rem - q * divider[d].divisor);
        rem = q;
TANDEM_UNROLL
        for (int j = 0; j < N; ++j) o.v[j] += idx * stride[d][j];
      }
    } else {
      int64_t rem = linear;
TANDEM_UNROLL
      for (int d = 0; d < kMaxDims; ++d) {
        if (d == dims) break;
        int64_t q = rem / size[d];
        int64_t idx = rem - q * size[d];
        rem = q;
TANDEM_UNROLL
        for (int j = 0; j < N; ++j) o.v[j] += idx * stride[d][j];
      }
    }
    return o;
  }

  // One dim (or none) with stride 1 for the output and 1 or 0 (a broadcast single element) for
  // every other operand: the contiguous kernels apply.
  bool is_flat() const {
    if (dims == 0) return true;
    if (dims > 1 || stride[0][0] != 1) return false;
    for (int j = 1; j < N; ++j)
      if (stride[0][j] != 0 && stride[0][j] != 1) return false;
    return true;
  }
  // Whether operand j reads one element for every output element (stride 0 throughout).
  bool is_broadcast_scalar(int j) const {
    for (int d = 0; d < dims; ++d)
      if (stride[d][j] != 0) return false;
    return true;
  }
};

// The calculator for `shape` over operands broadcast to it; a null operand (an immediate value)
// gets stride 0. Throws "[op] ..." when more than kMaxDims dims remain after coalescing.
template <int N>
OffsetCalc<N> make_offset_calc(const Shape& shape, const std::array<const Tensor*, N>& ts, const char* op) {
  const size_t nd = shape.size();
  std::array<Strides, N> st;
  for (int j = 0; j < N; ++j) st[j] = ts[j] ? broadcast_strides(*ts[j], shape) : Strides(nd, 0);
  OffsetCalc<N> c;
  int64_t numel = 1;
  for (size_t k = nd; k-- > 0;) {
    numel *= shape[k];
    if (shape[k] == 1) continue;
    if (c.dims > 0) {
      bool merge = true;
      for (int j = 0; j < N; ++j)
        if (st[j][k] != c.stride[c.dims - 1][j] * c.size[c.dims - 1]) merge = false;
      if (merge) {
        c.size[c.dims - 1] *= shape[k];
        continue;
      }
    }
    TANDEM_CHECK(c.dims < kMaxDims,
                 "[{}] CUDA kernels index at most {} dims after merging contiguous ones; shape {} has more", op,
                 kMaxDims, shape);
    c.size[c.dims] = shape[k];
    for (int j = 0; j < N; ++j) c.stride[c.dims][j] = st[j][k];
    ++c.dims;
  }
  c.use32 = numel <= (int64_t{1} << 31) - 1;
  for (int d = 0; d < c.dims; ++d) c.divider[d] = c.use32 ? IntDivider(static_cast<uint32_t>(c.size[d])) : IntDivider();
  return c;
}

}  // namespace tandem::cuda
