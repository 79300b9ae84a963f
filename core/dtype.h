// Element types, their sizes and names, PyTorch's type promotion, and dtype dispatch.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string_view>

#include "core/error.h"
#include "core/half.h"

namespace tandem {

enum class Dtype : uint8_t { f32, f64, f16, bf16, i32, i64, boolean };
using enum Dtype;  // tandem::f32, tandem::i64, ... (the boolean type is tandem::boolean)

inline constexpr int kNumDtypes = 7;

constexpr size_t itemsize(Dtype d) {
  switch (d) {
    case f32: case i32: return 4;
    case f64: case i64: return 8;
    case f16: case bf16: return 2;
    case boolean: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(Dtype d) {
  switch (d) {
    case f32: return "f32";
    case f64: return "f64";
    case f16: return "f16";
    case bf16: return "bf16";
    case i32: return "i32";
    case i64: return "i64";
    case boolean: return "bool";
  }
  return "?";
}

constexpr bool is_floating(Dtype d) { return d == f32 || d == f64 || d == f16 || d == bf16; }
constexpr bool is_integral(Dtype d, bool include_bool = false) {
  return d == i32 || d == i64 || (include_bool && d == boolean);
}

// PyTorch's promotion lattice restricted to Tandem's dtypes: bool < ints < floats; among floats
// the wider wins, and f16 with bf16 gives f32.
Dtype promote_types(Dtype a, Dtype b);

// Refuses a value that no element of integer dtype d can hold (NaN, an infinity, or out of its
// range): "[op] value inf cannot be converted to i32 without overflow", as PyTorch does for the
// Scalars it stores (full, fill_, masked_fill, clamp bounds, arange and linspace bounds);
// converting it would be undefined behaviour. Floating and bool dtypes take any value.
void check_scalar_fits(double value, Dtype d, const char* op);

class Tensor;
struct Scalar;
namespace detail {
// PyTorch's result type: dimensioned tensors outrank 0-dim tensors, which outrank Scalars; a
// lower-ranked operand only matters when its category (bool < integer < floating) is higher. A
// floating Scalar counts as the default float (f32), an integral one as i64.
Dtype result_type(const Tensor& a, const Tensor& b);
Dtype result_type(const Tensor& a, const Scalar& s);
Dtype result_type(const Tensor& a, const Tensor& b, const Tensor& c);
// PyTorch's canCast: no floating -> integral, no non-bool -> bool.
bool can_cast(Dtype from, Dtype to);
}  // namespace detail

// Dtype of `default float` results (mean of an integer tensor is an error, as in PyTorch; this is
// used by ops such as division that promote integers to the default float type).
inline constexpr Dtype kDefaultFloat = f32;

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr Dtype value = f32; };
template <> struct dtype_of<double> { static constexpr Dtype value = f64; };
template <> struct dtype_of<Half> { static constexpr Dtype value = f16; };
template <> struct dtype_of<BFloat16> { static constexpr Dtype value = bf16; };
template <> struct dtype_of<int32_t> { static constexpr Dtype value = i32; };
template <> struct dtype_of<int64_t> { static constexpr Dtype value = i64; };
template <> struct dtype_of<bool> { static constexpr Dtype value = boolean; };
template <class T> inline constexpr Dtype dtype_v = dtype_of<T>::value;

// The type arithmetic on T is carried out in: f32 for the 2-byte floats, T otherwise.
template <class T> struct acc_type { using type = T; };
template <> struct acc_type<Half> { using type = float; };
template <> struct acc_type<BFloat16> { using type = float; };
template <class T> using acc_t = typename acc_type<T>::type;

std::ostream& operator<<(std::ostream& os, Dtype d);  // in namespace tandem, so lookup finds it

}  // namespace tandem

template <> struct fmt::formatter<tandem::Dtype> : fmt::formatter<std::string_view> {
  auto format(tandem::Dtype d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(tandem::dtype_name(d), ctx);
  }
};

// TANDEM_DISPATCH_*(dtype, "op", body): runs body with scalar_t bound to the C++ type of dtype.
#define TANDEM_DISPATCH_CASE(DT, T, ...) \
  case ::tandem::Dtype::DT: {            \
    using scalar_t = T;                  \
    __VA_ARGS__();                       \
    break;                               \
  }

#define TANDEM_DISPATCH_FLOATING(dtype, op, ...)                                              \
  [&] {                                                                                       \
    switch (dtype) {                                                                          \
      TANDEM_DISPATCH_CASE(f32, float, __VA_ARGS__)                                           \
      TANDEM_DISPATCH_CASE(f64, double, __VA_ARGS__)                                          \
      TANDEM_DISPATCH_CASE(f16, ::tandem::Half, __VA_ARGS__)                                  \
      TANDEM_DISPATCH_CASE(bf16, ::tandem::BFloat16, __VA_ARGS__)                             \
      default: ::tandem::fail("[{}] expected a floating dtype, got {}", op, dtype);           \
    }                                                                                         \
  }()

#define TANDEM_DISPATCH_NUMERIC(dtype, op, ...)                                               \
  [&] {                                                                                       \
    switch (dtype) {                                                                          \
      TANDEM_DISPATCH_CASE(f32, float, __VA_ARGS__)                                           \
      TANDEM_DISPATCH_CASE(f64, double, __VA_ARGS__)                                          \
      TANDEM_DISPATCH_CASE(f16, ::tandem::Half, __VA_ARGS__)                                  \
      TANDEM_DISPATCH_CASE(bf16, ::tandem::BFloat16, __VA_ARGS__)                             \
      TANDEM_DISPATCH_CASE(i32, int32_t, __VA_ARGS__)                                         \
      TANDEM_DISPATCH_CASE(i64, int64_t, __VA_ARGS__)                                         \
      default: ::tandem::fail("[{}] expected a numeric (non-bool) dtype, got {}", op, dtype); \
    }                                                                                         \
  }()

#define TANDEM_DISPATCH_ALL(dtype, op, ...)                                                   \
  [&] {                                                                                       \
    switch (dtype) {                                                                          \
      TANDEM_DISPATCH_CASE(f32, float, __VA_ARGS__)                                           \
      TANDEM_DISPATCH_CASE(f64, double, __VA_ARGS__)                                          \
      TANDEM_DISPATCH_CASE(f16, ::tandem::Half, __VA_ARGS__)                                  \
      TANDEM_DISPATCH_CASE(bf16, ::tandem::BFloat16, __VA_ARGS__)                             \
      TANDEM_DISPATCH_CASE(i32, int32_t, __VA_ARGS__)                                         \
      TANDEM_DISPATCH_CASE(i64, int64_t, __VA_ARGS__)                                         \
      TANDEM_DISPATCH_CASE(boolean, bool, __VA_ARGS__)                                        \
      default: ::tandem::fail("[{}] unknown dtype", op);                                      \
    }                                                                                         \
  }()
