// Reductions (sum, mean, max/min, arg*, var/std, logsumexp, norm): forward kernels and the raw
// backward kernels their autograd rules use. No autograd here; autograd/reduce_grad.cpp wires
// these into the public ops of autograd/ops.h.
//
// Every reduction is planned the same way: the kept dims become an "outer" loop (one output
// element each, in the output's contiguous order) and the reduced dims are coalesced into as
// few strided dims as possible. When they coalesce to one dim (the usual case: last dim, all
// elements of a contiguous tensor, any adjacent block) each output reads one strided slice in
// place; otherwise the slice is gathered into a small buffer first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/detail/wrapping.h"
#include "core/tensor.h"

namespace tandem::detail {

// Pairwise summation over load(begin .. begin+n): error grows with log(n) instead of n. The
// base case keeps 8 independent partial sums so the compiler can vectorise it. Integer sums wrap
// (core/detail/wrapping.h).
template <class Acc, class Load>
Acc pairwise_sum(int64_t begin, int64_t n, const Load& load) {
  constexpr int64_t kBase = 128;
  if (n <= kBase) {
    Acc s[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; ++k) s[k] = wrapping_add<Acc>(s[k], load(begin + i + k));
    Acc rest = Acc(0);
    for (; i < n; ++i) rest = wrapping_add<Acc>(rest, load(begin + i));
    const Acc low = wrapping_add<Acc>(wrapping_add<Acc>(s[0], s[1]), wrapping_add<Acc>(s[2], s[3]));
    const Acc high = wrapping_add<Acc>(wrapping_add<Acc>(s[4], s[5]), wrapping_add<Acc>(s[6], s[7]));
    return wrapping_add<Acc>(wrapping_add<Acc>(low, high), rest);
  }
  int64_t half = (n / 2 + 7) & ~int64_t(7);
  return wrapping_add<Acc>(pairwise_sum<Acc>(begin, half, load), pairwise_sum<Acc>(begin + half, n - half, load));
}

struct ReducePlan {
  std::vector<bool> reduced;  // per input dim
  Shape out_shape;            // the result's shape (keepdim applied)
  Shape keep_shape;           // input rank, 1 at reduced dims
  int64_t count = 1;          // elements reduced into each output
  int64_t out_numel = 1;
  bool keepdim = false;
  Shape outer_sizes;          // kept dims of size > 1, outermost first
  Strides outer_strides;      // their input strides (elements)
  Shape inner_sizes;          // reduced dims of size > 1, coalesced, outermost first
  Strides inner_strides;

  // var/std's divisor, max(0, count - correction), in floating point: any int64 correction is
  // accepted (negative ones too, as in PyTorch), and the difference must not overflow int64.
  double var_denominator(int64_t correction) const {
    return std::max(0.0, static_cast<double>(count) - static_cast<double>(correction));
  }
};

// Wraps and validates `dims` ("[op] dim 1 appears more than once in dims [1, -1]"); an empty
// list reduces every dim, as in PyTorch.
ReducePlan plan_reduction(const Tensor& a, const Shape& dims, bool keepdim, const char* op);
ReducePlan plan_full_reduction(const Tensor& a, const char* op);
// The same reduction (dims, keepdim) planned for another tensor of the same shape.
ReducePlan replan(const Tensor& t, const ReducePlan& like);

// `r` (the result of a reduction planned by `plan`) viewed with the input's rank: reduced dims
// become size-1 dims, so for_each_run over the input shape broadcasts it.
Tensor keepdim_view(const Tensor& r, const ReducePlan& plan);

// Result dtype of sum: i64 for integers and bool, the input dtype for floats.
Dtype sum_dtype(Dtype in);

// ---- forward kernels ----
Tensor sum_kernel(const Tensor& a, const ReducePlan& plan);
Tensor mean_kernel(const Tensor& a, const ReducePlan& plan);  // floating inputs only
// Sums `g` down to `shape` (which g broadcasts from): the reduction of broadcast gradients.
Tensor sum_to_shape(const Tensor& g, const Shape& shape, const char* op);
enum class Extreme { max, min };
// amax/amin: NaN propagates. Throws for empty reductions.
Tensor extreme_kernel(const Tensor& a, const ReducePlan& plan, Extreme which, const char* op);
// Values and i64 indices (first occurrence; a NaN wins) of the extreme over the plan's
// reduced dims, indices counted in the row-major order of those dims.
std::pair<Tensor, Tensor> extreme_with_index_kernel(const Tensor& a, const ReducePlan& plan, Extreme which,
                                                    bool want_values, const char* op);
Tensor var_kernel(const Tensor& a, const ReducePlan& plan, int64_t correction, bool take_sqrt);
Tensor logsumexp_kernel(const Tensor& a, const ReducePlan& plan);
Tensor norm_kernel(const Tensor& a, const ReducePlan& plan);

// ---- backward kernels (all return a fresh contiguous tensor of a's shape) ----
// g (shaped like the reduction's result) broadcast back over the reduced dims, times scale.
Tensor expand_grad(const Tensor& g, const ReducePlan& plan, const Shape& in_shape, double scale);
// amax/amin/full max/min: g split evenly among the elements equal to the result.
Tensor extreme_grad(const Tensor& g, const Tensor& a, const Tensor& result, const ReducePlan& plan);
// max/min over one dim: g placed at the saved indices, zero elsewhere.
Tensor index_grad(const Tensor& g, const Tensor& indices, const ReducePlan& plan, const Shape& in_shape,
                  int64_t dim);
// var: g * 2 (x - mean) / (N - c); std: g (x - mean) / ((N - c) std), and 0 where std == 0 (a
// constant slice), as in PyTorch. N - c is clamped at 0, as in the forward.
Tensor var_grad(const Tensor& g, const Tensor& a, const Tensor& result, const ReducePlan& plan, int64_t correction,
                bool is_std);
// logsumexp: g * exp(x - result).
Tensor logsumexp_grad(const Tensor& g, const Tensor& a, const Tensor& result, const ReducePlan& plan);
// norm: g * x / norm (zero where the norm is zero, the subgradient PyTorch picks).
Tensor norm_grad(const Tensor& g, const Tensor& a, const Tensor& result, const ReducePlan& plan);

// ---- device kernels ----
// The raw work of the kernels above for tensors on a device; a backend registers one (CUDA:
// cuda/reduce.cu). Core has validated the arguments and allocated every output (contiguous, the
// dtype the CPU kernel gives) before it calls these; inputs may be strided.
enum class ReduceOp : uint8_t { sum, mean, amax, amin, var, std, logsumexp, norm };
// Elementwise backward steps, out = f(in0, in1, in2) with the inputs broadcast to out's shape:
//   scale:         in0 * p                       (g)
//   extreme_mask:  in0 == in1 (or both NaN) ? 1 : 0 (x, result)
//   extreme_split: in0 != 0 ? in1 / in2 : 0      (mask, g, count)
//   var_factor:    in0 * 2 / p                   (g; p = N - correction)
//   std_factor:    in1 == 0 ? 0 : in0 / (p * in1) (g, result)
//   center_scale:  in2 * (in0 - in1)             (x, mean, factor)
//   logsumexp:     in2 * exp(in0 - in1)          (x, result, g)
//   norm:          in1 == 0 ? 0 : in2 * in0 / in1 (x, result, g)
enum class ReduceGradOp : uint8_t { scale, extreme_mask, extreme_split, var_factor, std_factor, center_scale, logsumexp, norm };

struct ReduceDeviceKernels {
  virtual ~ReduceDeviceKernels() = default;
  // out (plan.out_shape) = the reduction `op` of a; `correction` is var/std's.
  virtual void reduce(ReduceOp op, const Tensor& a, const ReducePlan& plan, const Tensor& out, int64_t correction) = 0;
  // values (may be undefined) and indices of the extreme, with the CPU's tie and NaN rules.
  virtual void extreme_with_index(const Tensor& a, const ReducePlan& plan, Extreme which, const Tensor& values,
                                  const Tensor& indices) = 0;
  // Floating dtypes; in1/in2 may be undefined where `op` does not read them.
  virtual void pointwise_grad(ReduceGradOp op, const Tensor& out, const Tensor& in0, const Tensor& in1,
                              const Tensor& in2, double p) = 0;
  // Zeroes out (contiguous) and stores g at out[keep position + index * dim_stride]; `out_keep`
  // is out viewed with plan.keep_shape, g_keep and index_keep the keepdim views.
  virtual void index_grad(const Tensor& out, const Tensor& out_keep, const Tensor& g_keep, const Tensor& index_keep,
                          int64_t dim_stride) = 0;
};

}  // namespace tandem::detail
