// Shape and strides: small inline vectors of int64 (no heap allocation up to 6 dims), and the
// shape arithmetic every op shares (numel, contiguous strides, broadcasting, dim wrapping).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"

namespace tandem {

class SmallDims {
 public:
  static constexpr size_t kInline = 6;
  SmallDims() = default;
  SmallDims(std::initializer_list<int64_t> v) { assign(v.begin(), v.size()); }
  SmallDims(const std::vector<int64_t>& v) { assign(v.data(), v.size()); }  // NOLINT
  explicit SmallDims(size_t n, int64_t fill = 0) {
    resize(n);
    std::fill(begin(), end(), fill);
  }
  SmallDims(const SmallDims& o) { assign(o.data(), o.size()); }
  SmallDims(SmallDims&& o) noexcept { move_from(o); }
  SmallDims& operator=(const SmallDims& o) {
    if (this != &o) assign(o.data(), o.size());
    return *this;
  }
  SmallDims& operator=(SmallDims&& o) noexcept {
    if (this != &o) {
      release();
      move_from(o);
    }
    return *this;
  }
  ~SmallDims() { release(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t* data() { return heap_ ? heap_ : inline_; }
  const int64_t* data() const { return heap_ ? heap_ : inline_; }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t* begin() { return data(); }
  int64_t* end() { return data() + size_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  int64_t back() const { return data()[size_ - 1]; }
  int64_t& back() { return data()[size_ - 1]; }

  void resize(size_t n, int64_t fill = 0) {
    if (n > capacity()) grow(n);
    for (size_t i = size_; i < n; ++i) data()[i] = fill;
    size_ = n;
  }
  void push_back(int64_t v) {
    if (size_ == capacity()) grow(size_ * 2);
    data()[size_++] = v;
  }
  void insert(size_t pos, int64_t v) {
    push_back(0);
    int64_t* d = data();
    for (size_t i = size_ - 1; i > pos; --i) d[i] = d[i - 1];
    d[pos] = v;
  }
  void erase(size_t pos) {
    int64_t* d = data();
    for (size_t i = pos; i + 1 < size_; ++i) d[i] = d[i + 1];
    --size_;
  }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  bool operator==(const SmallDims& o) const {
    return size_ == o.size_ && std::equal(begin(), end(), o.begin());
  }

 private:
  size_t capacity() const { return heap_ ? cap_ : kInline; }
  void assign(const int64_t* src, size_t n) {
    resize(n);
    if (n > 0) std::memcpy(data(), src, n * sizeof(int64_t));  // an empty source may be nullptr
  }
  void grow(size_t n) {
    n = std::max<size_t>(n, kInline * 2);
    auto* fresh = new int64_t[n];
    std::memcpy(fresh, data(), size_ * sizeof(int64_t));
    delete[] heap_;
    heap_ = fresh;
    cap_ = n;
  }
  void release() {
    delete[] heap_;
    heap_ = nullptr;
  }
  void move_from(SmallDims& o) {
    size_ = o.size_;
    if (o.heap_) {
      heap_ = o.heap_;
      cap_ = o.cap_;
      o.heap_ = nullptr;
    } else {
      std::memcpy(inline_, o.inline_, size_ * sizeof(int64_t));
    }
    o.size_ = 0;
  }
  int64_t inline_[kInline];
  int64_t* heap_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
};

using Shape = SmallDims;
using Strides = SmallDims;

// Product of the dims; throws "[shape] ... too large" when it does not fit in int64.
int64_t numel_of(const Shape& shape);
inline int64_t checked_mul(int64_t a, int64_t b, const char* op) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    fail("[{}] size overflow: {} * {} does not fit in 64 bits", op, a, b);
  return r;
}

// The address rule. Byte offsets are formed only for elements a kernel visits: a tensor with
// elements keeps every one of them inside its storage, so its offset and the strides of its dims of
// two or more elements, times anything bounded by its extent, fit in int64. An empty tensor's sizes,
// strides and offset may be anything up to INT64_MAX (views of it compute them with overflow
// checks), and so may the stride of a dim of one element: those are never multiplied. Hence:
// - `Tensor::data_ptr()` of an empty tensor is its storage's start, whatever its offset;
// - a kernel returns before any geometry (strides times sizes, row folding, GEMM batch folding)
//   when its result or an operand it walks is empty (`strided_loop`, the reduction plans, the
//   index walks, the GEMMs);
// - the step along one dim is `dim_step_bytes` (core/tensor.h), never `stride * itemsize` by hand.
Strides contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"

// NumPy broadcasting; throws "[op] shapes [..] and [..] cannot be broadcast".
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Wraps a possibly negative dim into [0, ndim); throws "[op] dim d out of range for a
// tensor with n dims". A 0-dim tensor accepts dims 0 and -1, as in PyTorch.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

}  // namespace tandem

template <> struct fmt::formatter<tandem::SmallDims> : fmt::formatter<std::string> {
  auto format(const tandem::SmallDims& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(tandem::shape_str(s), ctx);
  }
};

namespace tandem {

// Two sizes of a 2-D window or output, height then width. One value stands for both, as with
// PyTorch's int-or-tuple arguments: conv2d(x, w, b, /*stride=*/2) or conv2d(x, w, b, {2, 1}).
struct Size2 {
  int64_t h = 0, w = 0;
  constexpr Size2(int64_t v) : h(v), w(v) {}  // NOLINT: implicit, as PyTorch's ExpandingArray
  constexpr Size2(int64_t h, int64_t w) : h(h), w(w) {}
  bool operator==(const Size2&) const = default;
};

}  // namespace tandem

template <>
struct fmt::formatter<tandem::Size2> : fmt::formatter<std::string_view> {
  auto format(const tandem::Size2& s, format_context& ctx) const {
    return fmt::format_to(ctx.out(), "[{}, {}]", s.h, s.w);
  }
};
