// topk: the k largest (or smallest) elements along a dim and their indices. The forward and its
// CPU kernel are here; autograd/topk_grad.cpp records the backward (the gradient scattered back
// to the selected indices), cuda/topk.cu registers the device kernel.
//
// The order. Every element gets an unsigned key (topk_key below) whose ascending order is the
// order topk returns elements in; equal keys go by the lower index first. NaN ranks above every
// number, as in PyTorch (first when largest, last when smallest), and -0 equals +0. The CPU and
// the device rank by the same keys, so they select and order the same elements, ties included.
// With sorted=false the selected elements come in the order of their indices: PyTorch leaves
// that order unspecified; ours is deterministic and the same on every device.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/half.h"
#include "core/macros.h"
#include "core/tensor.h"

namespace tandem::detail {

// ---- the order ----
// The key type of T: 64 bits for f64 and i64, 32 bits for the rest (f16/bf16 rank as f32).
template <class T>
using topk_key_t = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;

// Unsigned keys in the ascending order of the values: flipping the sign bit of a non-negative
// float (and every bit of a negative one) makes unsigned order the numeric order.
TANDEM_HOST_DEVICE inline uint32_t ascending_key(float v) {
  if (v != v) return 0xffffffffu;  // NaN (any payload): above +inf
  if (v == 0.0f) v = 0.0f;         // -0 ranks as +0
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
TANDEM_HOST_DEVICE inline uint64_t ascending_key(double v) {
  if (v != v) return ~uint64_t{0};
  if (v == 0.0) v = 0.0;
  uint64_t b;
  std::memcpy(&b, &v, 8);
  return (b >> 63) ? ~b : (b | (uint64_t{1} << 63));
}
TANDEM_HOST_DEVICE inline uint32_t ascending_key(int32_t v) { return static_cast<uint32_t>(v) ^ 0x80000000u; }
TANDEM_HOST_DEVICE inline uint64_t ascending_key(int64_t v) {
  return static_cast<uint64_t>(v) ^ (uint64_t{1} << 63);
}

// The rank key of v: ascending for the smallest, its complement for the largest.
template <class T>
TANDEM_HOST_DEVICE inline topk_key_t<T> topk_key(T v, bool largest) {
  using Acc = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;
  const topk_key_t<T> k = ascending_key(static_cast<Acc>(v));
  return largest ? static_cast<topk_key_t<T>>(~k) : k;
}

// ---- the op ----
// Values (a's dtype) and i64 indices, a's shape with k along dim; a 0-dim input (one element,
// dim 0 or -1) takes k 0 or 1 and gives 0-dim results, as in PyTorch. Throws "[topk] ..." for an
// undefined or bool input, a dim out of range, or k outside [0, size of dim]. Records nothing.
std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted);

// ---- device kernels ----
// The table a device backend registers (cuda/topk.cu). Core has validated the arguments and
// allocated the outputs: `values` and `indices` are contiguous, with a's shape but k along dim.
// a has at least one dim (a 0-dim input comes as a 1-D view), any strides, no empty dim, and
// 1 <= k <= a.size(dim). The kernel gives the CPU's result: the same elements, in the same order.
struct TopkDeviceKernels {
  virtual ~TopkDeviceKernels() = default;
  virtual void topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted, const Tensor& values,
                    const Tensor& indices) = 0;
};

}  // namespace tandem::detail
