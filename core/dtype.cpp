#include "core/dtype.h"

#include <ostream>

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

}  // namespace tandem
