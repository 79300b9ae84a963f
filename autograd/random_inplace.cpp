// The public in-place random fills: the autograd check, the core kernel, the version bump.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/random.h"

namespace tandem {

const Tensor& uniform_(const Tensor& self, double lo, double hi) {
  autograd::check_inplace(self, "uniform_");
  detail::fill_uniform(self, lo, hi, "uniform_");
  self.bump_version();
  return self;
}

const Tensor& normal_(const Tensor& self, double mean, double std) {
  autograd::check_inplace(self, "normal_");
  detail::fill_normal(self, mean, std, "normal_");
  self.bump_version();
  return self;
}

}  // namespace tandem
