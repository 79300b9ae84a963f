#include "core/shape.h"

namespace tandem {

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) [[unlikely]]
      fail("[shape] shape {} is too large: its element count does not fit in 64 bits", shape);
  }
  return n;
}

Strides contiguous_strides(const Shape& shape) {
  Strides s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    // Checked: with a zero-sized dimension the element count fits while the others' product may not.
    if (i > 0 && __builtin_mul_overflow(acc, std::max<int64_t>(shape[i], 1), &acc)) [[unlikely]]
      fail("[shape] shape {} is too large: its strides do not fit in 64 bits", shape);
  }
  return s;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TANDEM_CHECK(da == db || da == 1 || db == 1, "[{}] shapes {} and {} cannot be broadcast", op, a, b);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = std::max<int64_t>(ndim, 1);
  TANDEM_CHECK(dim >= -n && dim < n, "[{}] dim {} out of range for a tensor with {} dims", op, dim, ndim);
  return dim < 0 ? dim + n : dim;
}

}  // namespace tandem
