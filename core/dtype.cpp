#include "core/dtype.h"

#include <optional>
#include <ostream>

#include "core/tensor.h"

namespace tandem {

namespace {
int rank_of(Dtype d) {
  switch (d) {
    case boolean: return 0;
    case i32: return 1;
    case i64: return 2;
    case f16: return 3;
    case bf16: return 3;
    case f32: return 4;
    case f64: return 5;
  }
  return 0;
}
}  // namespace

Dtype promote_types(Dtype a, Dtype b) {
  if (a == b) return a;
  if ((a == f16 && b == bf16) || (a == bf16 && b == f16)) return f32;
  return rank_of(a) >= rank_of(b) ? a : b;
}

void check_scalar_fits(double value, Dtype d, const char* op) {
  // Conversion truncates toward zero: i32 takes (-2^31 - 1, 2^31), i64 [-2^63, 2^63).
  bool fits = true;
  if (d == i32) fits = value > -2147483649.0 && value < 2147483648.0;
  if (d == i64) fits = value >= -9223372036854775808.0 && value < 9223372036854775808.0;
  TANDEM_CHECK(fits, "[{}] value {} cannot be converted to {} without overflow", op, value, d);
}

std::ostream& operator<<(std::ostream& os, Dtype d) { return os << dtype_name(d); }

namespace detail {

namespace {
// PyTorch's combine_categories: the higher-priority result wins unless the lower one is of a
// higher category.
std::optional<Dtype> combine(std::optional<Dtype> higher, std::optional<Dtype> lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (is_floating(*higher)) return *higher;
  if (*higher == boolean || is_floating(*lower)) return promote_types(*higher, *lower);
  return *higher;
}
struct TypeState {
  std::optional<Dtype> dimensioned, zero_dim, wrapped;
  void add(const Tensor& t) {
    auto& slot = t.dim() > 0 ? dimensioned : zero_dim;
    slot = slot ? promote_types(*slot, t.dtype()) : t.dtype();
  }
  void add(const Scalar& s) {
    Dtype d = s.integral ? i64 : kDefaultFloat;
    wrapped = wrapped ? promote_types(*wrapped, d) : d;
  }
  Dtype result() const { return combine(dimensioned, combine(zero_dim, wrapped)).value_or(kDefaultFloat); }
};
}  // namespace

Dtype result_type(const Tensor& a, const Tensor& b) {
  if (a.dtype() == b.dtype()) return a.dtype();
  TypeState s;
  s.add(a);
  s.add(b);
  return s.result();
}

Dtype result_type(const Tensor& a, const Scalar& sc) {
  // Fast exits: the common float-tensor-and-any-number and int-tensor-and-int cases.
  if (is_floating(a.dtype()) || (sc.integral && is_integral(a.dtype()))) return a.dtype();
  TypeState s;
  s.add(a);
  s.add(sc);
  return s.result();
}

Dtype result_type(const Tensor& a, const Tensor& b, const Tensor& c) {
  TypeState s;
  s.add(a);
  s.add(b);
  s.add(c);
  return s.result();
}

bool can_cast(Dtype from, Dtype to) {
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != boolean && to == boolean) return false;
  return true;
}

}  // namespace detail

}  // namespace tandem
