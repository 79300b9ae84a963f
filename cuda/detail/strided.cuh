// Tensor geometry as the index, random and creation kernels take it (.cu only): sizes and
// element strides by value, up to kMaxDims dims, unravelled per element in row-major order.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace tandem::cuda::geom {

inline constexpr int kMaxDims = 16;

struct Dims {
  int nd = 0;
  int64_t size[kMaxDims] = {};
};
struct ElemStrides {
  int64_t s[kMaxDims] = {};
};

inline Dims dims_of(const Shape& shape, const char* op) {
  TANDEM_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "[{}] CUDA kernels take at most {} dims, got shape {}",
               op, kMaxDims, shape);
  Dims d;
  d.nd = static_cast<int>(shape.size());
  for (int i = 0; i < d.nd; ++i) d.size[i] = shape[static_cast<size_t>(i)];
  return d;
}
inline ElemStrides strides_of(const Strides& strides) {
  ElemStrides s;
  for (size_t i = 0; i < strides.size() && i < static_cast<size_t>(kMaxDims); ++i) s.s[i] = strides[i];
  return s;
}

// The element offset of logical (row-major) position `linear` under `strides`.
__host__ __device__ inline int64_t offset_of(int64_t linear, const Dims& dims, const ElemStrides& strides) {
  int64_t off = 0;
  for (int d = dims.nd - 1; d >= 0; --d) {
    const int64_t c = linear % dims.size[d];
    linear /= dims.size[d];
    off += c * strides.s[d];
  }
  return off;
}

// Unsigned storage types of each element size: copies and selects move bits, not values.
template <int kBytes> struct Bits;
template <> struct Bits<1> { using type = uint8_t; };
template <> struct Bits<2> { using type = uint16_t; };
template <> struct Bits<4> { using type = uint32_t; };
template <> struct Bits<8> { using type = uint64_t; };

// Calls f(Bits<n>::type{}) for the element size of `dtype`.
template <class F>
void dispatch_bits(Dtype dtype, F&& f) {
  switch (itemsize(dtype)) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    case 8: f(uint64_t{}); break;
    default: fail("[cuda] internal: no element type of {} bytes", itemsize(dtype));
  }
}

}  // namespace tandem::cuda::geom
