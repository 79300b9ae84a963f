// The one way integer tensor elements accumulate outside the elementwise functors (sums, column
// sums, scatter_add, index_add, embedding's backward, integer matmul): wrapping on overflow, as PyTorch's CPU kernels do, but in unsigned
// arithmetic, where wrapping is defined. A signed overflow is undefined behaviour in C++ (UBSan
// reports it, and the optimiser may assume it never happens); the unsigned add compiles to the
// same instruction and vectorises the same, so the bits and the speed are unchanged.
#pragma once

#include <type_traits>

namespace tandem::detail {

template <class T>
inline T wrapping_add(T a, T b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <class T>
inline T wrapping_mul(T a, T b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    static_assert(sizeof(T) >= sizeof(int), "narrower types would promote to int and overflow there");
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

}  // namespace tandem::detail
