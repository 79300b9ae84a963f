// What the tensor-op fuzzers (fuzz_ops, fuzz_seq_ops) share: the reader that turns input bytes into
// arguments (sizes, dims, indices, scalars, dtypes, shapes), and the shape arithmetic they bound
// their work with. Moved here unchanged from fuzz_ops.cpp: every input decodes as it did, so the
// committed corpora keep their meaning. Apart from fuzz_common.h (which every fuzzer includes,
// tandem.h or not) so that the byte-level fuzzers need not see tandem.h or a second Bytes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <optional>

#include "tandem.h"

namespace tandem_fuzz {

using namespace tandem;

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

class Bytes {
 public:
  Bytes(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool empty() const { return n_ == 0; }
  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  // One byte, always (also for k <= 1), so an input's bytes line up the same way whatever the stack holds.
  int64_t pick(int64_t k) {
    uint8_t v = u8();
    return k <= 1 ? 0 : v % k;
  }
  bool flag() { return u8() & 1; }

  // A size for a bounded shape: mostly 1..4, sometimes 0 or 5..8.
  int64_t small_size() {
    static constexpr int64_t table[] = {1, 2, 3, 4, 2, 3, 0, 5, 1, 6, 8, 4};
    return table[pick(std::size(table))];
  }
  // Any size, valid or not.
  int64_t wild_size() {
    static constexpr int64_t table[] = {-1,          -2,         kI64Min,     kI64Max,      int64_t{1} << 31,
                                        int64_t{1} << 32,        int64_t{1} << 62,          3037000500,
                                        int64_t{1} << 20,        0,          1,           2,            4097};
    return table[pick(std::size(table))];
  }
  // A dim argument for a tensor of `ndim` dims: mostly in [-ndim-1, ndim+1], sometimes wild.
  int64_t dim(int64_t ndim) {
    uint8_t v = u8();
    if (v >= 240) {
      static constexpr int64_t table[] = {kI64Min, kI64Max, int64_t{1} << 40, -(int64_t{1} << 40)};
      return table[v % std::size(table)];
    }
    return static_cast<int64_t>(v % (2 * ndim + 3)) - (ndim + 1);
  }
  // An index or offset argument: small, negative, or far out of range.
  int64_t index() {
    static constexpr int64_t table[] = {0, 1, 2, -1, 3, -2, 5, 0, 1, -7, 100, kI64Max, kI64Min,
                                        int64_t{1} << 31, -(int64_t{1} << 31) - 1, 4};
    return table[pick(std::size(table))];
  }
  double scalar() {
    static constexpr double table[] = {0,     1,      -1,   0.5,    2,     -2.5,   3,       7,
                                       1e30,  -1e30,  1e-30, 100,   65504, 1e300,  -0.0,    0.25,
                                       INFINITY, -INFINITY, NAN, 4};
    return table[pick(std::size(table))];
  }
  Scalar any_scalar() {
    double v = scalar();
    if (flag() && std::isfinite(v) && std::fabs(v) < 1e9) return Scalar(static_cast<int64_t>(v));
    return Scalar(v);
  }
  Dtype dtype() {
    static constexpr Dtype table[] = {f32, f64, f32, f16, bf16, i32, i64, boolean, f32, f64};
    return table[pick(std::size(table))];
  }
  Dtype floating_dtype() {
    static constexpr Dtype table[] = {f32, f64, f16, bf16};
    return table[pick(std::size(table))];
  }
  // A bounded shape: 0..4 dims of small sizes (at most 8^4 = kMaxNumel elements).
  Shape small_shape(int64_t max_dims = 4) {
    Shape s;
    int64_t n = pick(max_dims + 1);
    for (int64_t i = 0; i < n; ++i) s.push_back(small_size());
    return s;
  }
  // A shape for view-like ops: small sizes, -1 and occasionally wild ones.
  Shape view_shape() {
    Shape s;
    int64_t n = pick(5);
    for (int64_t i = 0; i < n; ++i) {
      uint8_t v = u8();
      s.push_back(v < 200 ? small_size() : v < 235 ? -1 : wild_size());
    }
    return s;
  }
  // A list of dims for reductions and permute.
  Shape dims(int64_t ndim) {
    Shape s;
    int64_t n = pick(4);
    for (int64_t i = 0; i < n; ++i) s.push_back(dim(ndim));
    return s;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

// The element count of `shape` when every size is non-negative and the product fits in int64.
inline std::optional<int64_t> true_numel(const Shape& shape) {
  int64_t n = 1;
  bool zero = false, overflow = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) zero = true;
    if (!overflow && __builtin_mul_overflow(n, d, &n)) overflow = true;
  }
  if (zero) return 0;
  if (overflow) return std::nullopt;
  return n;
}

// a * b for sizes (non-negative), kI64Max when it overflows.
inline int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kI64Max : r;
}

// The broadcast shape's element count (shapes that do not broadcast give the max per dim).
inline int64_t broadcast_numel(std::initializer_list<const Shape*> shapes) {
  size_t n = 0;
  for (const Shape* s : shapes) n = std::max(n, s->size());
  int64_t total = 1;
  for (size_t i = 0; i < n; ++i) {
    int64_t d = 1;
    for (const Shape* s : shapes) {
      if (i + s->size() >= n) d = std::max(d, (*s)[i + s->size() - n]);
    }
    if (__builtin_mul_overflow(total, d, &total)) return kI64Max;
  }
  return total;
}

}  // namespace tandem_fuzz
