// Device helpers shared by the reduction and NN kernels (cuda/reduce.cu, cuda/nn_ops.cu):
// accumulator math overloads, warp/block reductions and vector loads.
#pragma once

#include <cstdint>
#include <limits>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace tandem::cuda {

__device__ inline float dexp(float x) { return expf(x); }
__device__ inline double dexp(double x) { return exp(x); }
__device__ inline float dlog(float x) { return logf(x); }
__device__ inline double dlog(double x) { return log(x); }
__device__ inline float dsqrt(float x) { return sqrtf(x); }
__device__ inline double dsqrt(double x) { return sqrt(x); }

template <class A>
__device__ inline bool dnan(A v) {
  if constexpr (std::numeric_limits<A>::has_quiet_NaN) {
    return v != v;
  } else {
    return false;
  }
}

template <class A>
__host__ __device__ constexpr A dinf() {
  return std::numeric_limits<A>::infinity();
}

struct SumFn {
  template <class A>
  __device__ A operator()(A a, A b) const { return a + b; }
};
// The max of values that are never NaN (the softmax max skips NaN inputs, as the CPU's does).
struct MaxFn {
  template <class A>
  __device__ A operator()(A a, A b) const { return b > a ? b : a; }
};

template <class A, class F>
__device__ inline A warp_reduce(A v, F f) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduces v over a 1-D block whose size is a multiple of 32; every thread gets the result.
// `scratch` holds 32 values; the leading barrier makes back-to-back calls safe.
template <class A, class F>
__device__ inline A block_reduce(A v, F f, A identity, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = warp_reduce(v, f);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : identity;
  return warp_reduce(v, f);
}

// V elements of T loaded or stored as one access (16 bytes when V * sizeof(T) == 16).
template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <class T, int V>
__device__ inline Vec<T, V> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}
template <class T, int V>
__device__ inline void store_vec(T* p, const Vec<T, V>& v) {
  *reinterpret_cast<Vec<T, V>*>(p) = v;
}

// Elements per 16-byte access.
template <class T>
inline constexpr int kVec16 = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace tandem::cuda
