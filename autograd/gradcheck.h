// Finite-difference gradient check in f64.
#pragma once

#include <functional>
#include <string>

#include "core/tensor.h"

namespace tandem {

struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0;
  std::string report;  // the worst element: input, index, analytical, numerical
  explicit operator bool() const { return ok; }
};

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  int projections = 2;  // random output cotangents checked
  uint64_t seed = 1234;
};

// Checks d(fn)/d(inputs) for every input that requires grad (f64 inputs expected) by comparing
// v^T J from backward with central differences of v^T fn, for random cotangents v.
GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& fn, const TensorList& inputs,
                          GradcheckOptions opts = {});

}  // namespace tandem
