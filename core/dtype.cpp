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

std::ostream& operator<<(std::ostream& os, Dtype d) { return os << dtype_name(d); }

}  // namespace tandem
