// CUDA binary ops: arithmetic, comparisons and logic, tensor-tensor and tensor-scalar (the scalar
// is an immediate operand of the same kernels), out of place and in place (out = self).
#include "cuda/detail/elementwise.cuh"

namespace tandem::cuda::ew_impl {

using namespace tandem::detail;  // the functors

void binary(Binary op, const Tensor& out, const Operand& a, const Operand& b, const Scalar& alpha, Dtype dtype) {
  const char* name = op_name(op);
  TANDEM_DISPATCH_ALL(dtype, name, [&] {
    using T = scalar_t;
    using C = acc_t<T>;
    const std::array<Operand, 2> ab{a, b};
    switch (op) {
      case Binary::add: launch<T, T, T>(name, out, ab, Add<C>{static_cast<C>(alpha.value)}); break;
      case Binary::sub:
        if constexpr (!std::is_same_v<T, bool>) launch<T, T, T>(name, out, ab, Sub<C>{static_cast<C>(alpha.value)});
        break;
      case Binary::mul: launch<T, T, T>(name, out, ab, Mul{}); break;
      case Binary::div:
        if constexpr (std::is_floating_point_v<C>) launch<T, T, T>(name, out, ab, Div{});
        break;
      case Binary::maximum: launch<T, T, T>(name, out, ab, Maximum{}); break;
      case Binary::minimum: launch<T, T, T>(name, out, ab, Minimum{}); break;
      case Binary::pow:
        if constexpr (!std::is_same_v<T, bool>) launch<T, T, T>(name, out, ab, Pow{});
        break;
      case Binary::eq: launch<bool, T, T>(name, out, ab, Eq{}); break;
      case Binary::ne: launch<bool, T, T>(name, out, ab, Ne{}); break;
      case Binary::lt: launch<bool, T, T>(name, out, ab, Lt{}); break;
      case Binary::le: launch<bool, T, T>(name, out, ab, Le{}); break;
      case Binary::gt: launch<bool, T, T>(name, out, ab, Gt{}); break;
      case Binary::ge: launch<bool, T, T>(name, out, ab, Ge{}); break;
      case Binary::logical_and: launch<bool, T, T>(name, out, ab, LogicalAnd{}); break;
      case Binary::logical_or: launch<bool, T, T>(name, out, ab, LogicalOr{}); break;
      case Binary::logical_xor: launch<bool, T, T>(name, out, ab, LogicalXor{}); break;
    }
  });
}

}  // namespace tandem::cuda::ew_impl
