#include "nn/init.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace tandem::nn::init {

double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param) {
  switch (nonlinearity) {
    case Nonlinearity::linear:
    case Nonlinearity::conv1d:
    case Nonlinearity::conv2d:
    case Nonlinearity::conv3d:
    case Nonlinearity::sigmoid:
      return 1.0;
    case Nonlinearity::tanh:
      return 5.0 / 3.0;
    case Nonlinearity::relu:
      return std::sqrt(2.0);
    case Nonlinearity::leaky_relu: {
      double slope = param.value_or(0.01);
      return std::sqrt(2.0 / (1.0 + slope * slope));
    }
    case Nonlinearity::selu:
      return 3.0 / 4.0;
  }
  fail("[init] unknown nonlinearity");
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  TANDEM_CHECK(t.dim() >= 2,
               "[init] fan in and fan out cannot be computed for a tensor with fewer than 2 dims (shape {})",
               t.shape());
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

namespace {
int64_t fan_for(const Tensor& t, FanMode mode) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  int64_t fan = mode == FanMode::fan_in ? fan_in : fan_out;
  TANDEM_CHECK(fan > 0, "[init] kaiming init of a tensor with a zero fan (shape {})", t.shape());
  return fan;
}
void check_floating(const Tensor& t, const char* fn) {
  TANDEM_CHECK(t.defined(), "[init] {}: undefined tensor", fn);
  TANDEM_CHECK(t.is_floating_point(), "[init] {}: expected a floating tensor, got {}", fn, t.dtype());
}
}  // namespace

const Tensor& uniform_(const Tensor& t, double a, double b) {
  check_floating(t, "uniform_");
  TANDEM_CHECK(a <= b, "[init] uniform_: lower bound {} exceeds upper bound {}", a, b);
  NoGradGuard guard;
  tandem::uniform_(t, a, b);
  return t;
}

const Tensor& normal_(const Tensor& t, double mean, double std) {
  check_floating(t, "normal_");
  TANDEM_CHECK(std >= 0, "[init] normal_: std must be non-negative, got {}", std);
  NoGradGuard guard;
  tandem::normal_(t, mean, std);
  return t;
}

const Tensor& constant_(const Tensor& t, double value) {
  TANDEM_CHECK(t.defined(), "[init] constant_: undefined tensor");
  NoGradGuard guard;
  tandem::fill_(t, value);
  return t;
}

const Tensor& zeros_(const Tensor& t) { return constant_(t, 0.0); }
const Tensor& ones_(const Tensor& t) { return constant_(t, 1.0); }

const Tensor& eye_(const Tensor& t) {
  TANDEM_CHECK(t.defined() && t.dim() == 2, "[init] eye_: expected a 2-D tensor, got shape {}",
               t.defined() ? t.shape() : Shape{});
  NoGradGuard guard;
  tandem::zero_(t);
  int64_t n = std::min(t.size(0), t.size(1));
  for (int64_t i = 0; i < n; ++i) tandem::fill_(t.select(0, i).select(0, i), 1.0);
  return t;
}

const Tensor& xavier_uniform_(const Tensor& t, double gain) {
  check_floating(t, "xavier_uniform_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  double a = std::sqrt(3.0) * std;
  return init::uniform_(t, -a, a);
}

const Tensor& xavier_normal_(const Tensor& t, double gain) {
  check_floating(t, "xavier_normal_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  return init::normal_(t, 0.0, std);
}

const Tensor& kaiming_uniform_(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity) {
  check_floating(t, "kaiming_uniform_");
  double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan_for(t, mode)));
  double bound = std::sqrt(3.0) * std;
  return init::uniform_(t, -bound, bound);
}

const Tensor& kaiming_normal_(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity) {
  check_floating(t, "kaiming_normal_");
  double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan_for(t, mode)));
  return init::normal_(t, 0.0, std);
}

}  // namespace tandem::nn::init
