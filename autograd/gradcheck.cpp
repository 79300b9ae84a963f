#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace tandem {

namespace {
// v . y as a double, for a random cotangent v of y's shape.
double project(const Tensor& y, const std::vector<double>& v) {
  auto yv = y.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < yv.size(); ++i) s += yv[i] * v[i];
  return s;
}
}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& fn, const TensorList& inputs,
                          GradcheckOptions opts) {
  GradcheckResult result;
  for (const auto& in : inputs) {
    if (in.defined() && in.requires_grad())
      TANDEM_CHECK(in.dtype() == f64, "[gradcheck] inputs that require grad must be f64, got {} (shape {})",
                   in.dtype(), in.shape());
  }
  Tensor y0;
  {
    NoGradGuard ng;
    y0 = fn(inputs);
  }
  TANDEM_CHECK(y0.defined() && y0.is_floating_point(), "[gradcheck] the function must return a floating tensor");
  uint64_t state = opts.seed;
  auto next_uniform = [&state] {  // splitmix64: the check must not disturb the user's generator
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0;
  };

  for (int p = 0; p < opts.projections; ++p) {
    std::vector<double> v(static_cast<size_t>(y0.numel()));
    for (auto& x : v) x = next_uniform();
    Tensor vt = from_vector(v, y0.shape()).to(y0.dtype());

    // Analytical: one backward with cotangent v.
    TensorList leaves;
    for (const auto& in : inputs) {
      if (!in.defined() || !in.requires_grad()) {
        leaves.push_back(in);
        continue;
      }
      Tensor leaf = in.detach();
      {
        NoGradGuard ng;
        leaf = clone(leaf);
      }
      leaf.requires_grad_(true);
      leaves.push_back(leaf);
    }
    Tensor y = fn(leaves);
    bool any = false;
    for (const auto& l : leaves) any |= l.defined() && l.requires_grad();
    if (!any) fail("[gradcheck] no input requires grad");
    if (y.requires_grad()) y.backward(vt);

    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& leaf = leaves[i];
      if (!leaf.defined() || !leaf.requires_grad()) continue;
      Tensor g = leaf.grad();
      std::vector<double> analytical = g.defined() ? g.to_vector<double>() : std::vector<double>(leaf.numel(), 0.0);
      // Numerical: central differences of v . fn, perturbing one element at a time.
      Tensor x = leaves[i].detach();
      double* data = x.data_ptr<double>();
      TANDEM_CHECK(x.is_contiguous(), "[gradcheck] internal: perturbed input must be contiguous");
      for (int64_t k = 0; k < x.numel(); ++k) {
        double orig = data[k];
        TensorList args = leaves;
        args[i] = x;
        double plus, minus;
        {
          NoGradGuard ng;
          data[k] = orig + opts.eps;
          plus = project(fn(args), v);
          data[k] = orig - opts.eps;
          minus = project(fn(args), v);
          data[k] = orig;
        }
        double numerical = (plus - minus) / (2 * opts.eps);
        double err = std::abs(numerical - analytical[k]);
        bool bad = !(err <= opts.atol + opts.rtol * std::abs(numerical));
        if (err > result.max_abs_error || std::isnan(err) || (bad && result.ok)) {
          result.max_abs_error = std::isnan(err) ? INFINITY : std::max(err, result.max_abs_error);
          result.report = fmt::format("input {} (shape {}) element {}: analytical {:.10g}, numerical {:.10g}, "
                                      "error {:.3g}",
                                      i, x.shape(), k, analytical[k], numerical, err);
        }
        if (bad) result.ok = false;
      }
    }
  }
  if (result.ok && result.report.empty()) result.report = "all gradients match";
  return result;
}

}  // namespace tandem
