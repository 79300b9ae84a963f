// Parameter initialisation, as torch.nn.init: every function fills its tensor in place under
// no_grad (so it works on parameters that require grad) and returns it.
#pragma once

#include <optional>
#include <utility>

#include "core/tensor.h"

namespace tandem::nn::init {

enum class Nonlinearity { linear, conv1d, conv2d, conv3d, sigmoid, tanh, relu, leaky_relu, selu };
enum class FanMode { fan_in, fan_out };

// torch.nn.init.calculate_gain: 1 for linear/conv/sigmoid, 5/3 for tanh, sqrt(2) for relu,
// sqrt(2 / (1 + slope^2)) for leaky_relu (param = negative slope, default 0.01), 3/4 for selu.
double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param = std::nullopt);

// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field; needs >= 2 dims.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

const Tensor& uniform_(const Tensor& t, double a = 0, double b = 1);
const Tensor& normal_(const Tensor& t, double mean = 0, double std = 1);
const Tensor& constant_(const Tensor& t, double value);
const Tensor& zeros_(const Tensor& t);
const Tensor& ones_(const Tensor& t);
// Identity on a 2-D tensor (ones on the diagonal of a possibly rectangular matrix).
const Tensor& eye_(const Tensor& t);

// Glorot: std = gain * sqrt(2 / (fan_in + fan_out)); the uniform bound is sqrt(3) * std.
const Tensor& xavier_uniform_(const Tensor& t, double gain = 1);
const Tensor& xavier_normal_(const Tensor& t, double gain = 1);

// He: std = calculate_gain(nonlinearity, a) / sqrt(fan); the uniform bound is sqrt(3) * std.
const Tensor& kaiming_uniform_(const Tensor& t, double a = 0, FanMode mode = FanMode::fan_in,
                               Nonlinearity nonlinearity = Nonlinearity::leaky_relu);
const Tensor& kaiming_normal_(const Tensor& t, double a = 0, FanMode mode = FanMode::fan_in,
                              Nonlinearity nonlinearity = Nonlinearity::leaky_relu);

}  // namespace tandem::nn::init
