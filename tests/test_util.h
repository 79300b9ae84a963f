// Helpers shared by the op tests.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include "tandem.h"

namespace test_util {

inline std::vector<double> vals(const tandem::Tensor& t) { return t.to_vector<double>(); }

// Element-wise closeness with a relative-plus-absolute tolerance; a NaN expectation needs a NaN.
inline void require_close(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-12) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    if (std::isnan(want[i])) {
      REQUIRE(std::isnan(got[i]));
    } else {
      REQUIRE(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
    }
  }
}

// Marks t as a leaf that requires grad and returns it.
inline tandem::Tensor leaf(const tandem::Tensor& t) {
  t.requires_grad_();
  return t;
}

inline void require_gradcheck(const std::function<tandem::Tensor(const tandem::TensorList&)>& fn,
                              const tandem::TensorList& in) {
  auto r = tandem::gradcheck(fn, in);
  INFO(r.report);
  REQUIRE(r.ok);
}

}  // namespace test_util
