// Elementwise reductions used by the backends: pairwise (acc = op(acc, x)) for ring algorithms and
// MPI user ops, and many-way (out = op over ranks) for the threads backend. f16/bf16 are combined
// in float one element at a time, so no full-size upcast copy is ever made.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "core/detail/simd_clones.h"
#include "dist/process_group.h"

namespace tandem::dist::detail {

template <class T>
inline auto combine(acc_t<T> a, acc_t<T> b, ReduceOp op) -> acc_t<T> {
  if constexpr (std::is_same_v<T, bool>) {
    return (op == ReduceOp::sum || op == ReduceOp::max) ? (a || b) : (a && b);
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return a + b;
      case ReduceOp::product: return a * b;
      case ReduceOp::min: return std::min(a, b);
      case ReduceOp::max: return std::max(a, b);
    }
    return a;
  }
}

// acc[i] = op(acc[i], src[i]). One switch outside the loop so each loop vectorises; built three
// times, for AVX-512 (x86-64-v4), AVX2 and the baseline, and picked at load time by the CPU (GCC's
// target_clones): this loop is the ring allreduce's arithmetic and the MPI user op's (bf16, f16),
// and the baseline's SSE2 version is slower than Open MPI's own AVX reduction. AVX-512's wider
// integer shifts and packs make the bf16 loop 1.4x faster than AVX2's (128 Ki elements, in cache).
// The baseline only where core/detail/simd_clones.h builds no clones (ThreadSanitizer, clang).
template <class T>
TANDEM_SIMD_CLONES void reduce_into(T* acc, const T* src, int64_t n, ReduceOp op) {
  using A = acc_t<T>;
  auto loop = [&](auto f) {
    for (int64_t i = 0; i < n; ++i) acc[i] = static_cast<T>(f(static_cast<A>(acc[i]), static_cast<A>(src[i])));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (op == ReduceOp::sum || op == ReduceOp::max) {
      for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] || src[i];
    } else {
      for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] && src[i];
    }
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: loop([](A a, A b) { return a + b; }); break;
      case ReduceOp::product: loop([](A a, A b) { return a * b; }); break;
      case ReduceOp::min: loop([](A a, A b) { return b < a ? b : a; }); break;
      case ReduceOp::max: loop([](A a, A b) { return b > a ? b : a; }); break;
    }
  }
}

// out[i] = op over k of srcs[k][i] (then / count for avg), accumulated in acc_t. out may alias one
// of the sources.
template <class T>
void reduce_many(T* out, const T* const* srcs, int count, int64_t n, ReduceOp op) {
  using A = acc_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    A acc = static_cast<A>(srcs[0][i]);
    for (int k = 1; k < count; ++k) acc = combine<T>(acc, static_cast<A>(srcs[k][i]), op);
    if constexpr (!std::is_same_v<T, bool>) {
      if (op == ReduceOp::avg) acc = acc / static_cast<A>(count);
    }
    out[i] = static_cast<T>(acc);
  }
}

// p[i] /= divisor (avg after a sum); floating types only.
template <class T>
void divide_by(T* p, int64_t n, int divisor) {
  if constexpr (std::is_floating_point_v<acc_t<T>>) {
    using A = acc_t<T>;
    const A d = static_cast<A>(divisor);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<A>(p[i]) / d);
  }
}

}  // namespace tandem::dist::detail
