#include "nn/layers.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/init.h"

namespace tandem::nn {

namespace {
// What the layers' parameter_replaced share: point the member named `name` at `tensor`.
void rebind(const std::string& name, const Tensor& tensor, Tensor& weight, Tensor* bias) {
  if (name == "weight") weight = tensor;
  if (name == "bias" && bias) *bias = tensor;
}
}  // namespace

// ---- Linear ----

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Module("Linear"), in_features(in_features), out_features(out_features) {
  TANDEM_CHECK(in_features >= 0 && out_features >= 0, "[Linear] features must be non-negative, got in={} out={}",
               in_features, out_features);
  weight = register_parameter("weight", empty({out_features, in_features}));
  if (bias) this->bias = register_parameter("bias", empty({out_features}));
  reset_parameters();
}

void Linear::reset_parameters() {
  // PyTorch's Linear.reset_parameters: kaiming_uniform(a = sqrt(5)) gives U(-1/sqrt(fan_in),
  // 1/sqrt(fan_in)) for the weight, and the bias uses the same bound.
  if (in_features > 0) {
    init::kaiming_uniform_(weight, std::sqrt(5.0));
  } else {
    init::zeros_(weight);
  }
  if (bias.defined()) {
    double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& input) {
  TANDEM_CHECK(input.dim() >= 1 && input.size(-1) == in_features,
               "[Linear] expected input with last dim {} (in_features), got shape {}", in_features, input.shape());
  return linear(input, weight, bias);
}

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features, out_features, bias.defined());
}

void Linear::parameter_replaced(const std::string& name, const Tensor& tensor) {
  rebind(name, tensor, weight, &bias);
}

// ---- Embedding ----

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : Module("Embedding"), num_embeddings(num_embeddings), embedding_dim(embedding_dim) {
  TANDEM_CHECK(num_embeddings > 0 && embedding_dim > 0,
               "[Embedding] num_embeddings and embedding_dim must be positive, got {} and {}", num_embeddings,
               embedding_dim);
  weight = register_parameter("weight", empty({num_embeddings, embedding_dim}));
  reset_parameters();
}

void Embedding::reset_parameters() { init::normal_(weight, 0.0, 1.0); }

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices); }

std::string Embedding::extra_repr() const { return fmt::format("{}, {}", num_embeddings, embedding_dim); }

void Embedding::parameter_replaced(const std::string& name, const Tensor& tensor) {
  rebind(name, tensor, weight, nullptr);
}

// ---- LayerNorm ----

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine)
    : Module("LayerNorm"), normalized_shape(std::move(normalized_shape)), eps(eps),
      elementwise_affine(elementwise_affine) {
  TANDEM_CHECK(!this->normalized_shape.empty(), "[LayerNorm] normalized_shape must have at least one dim");
  if (elementwise_affine) {
    weight = register_parameter("weight", empty(this->normalized_shape));
    bias = register_parameter("bias", empty(this->normalized_shape));
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (!elementwise_affine) return;
  init::ones_(weight);
  init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& input) { return layer_norm(input, normalized_shape, weight, bias, eps); }

std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", normalized_shape, eps, elementwise_affine);
}

void LayerNorm::parameter_replaced(const std::string& name, const Tensor& tensor) {
  rebind(name, tensor, weight, &bias);
}

// ---- BatchNorm1d, BatchNorm2d ----

BatchNormBase::BatchNormBase(std::string type_name, int64_t num_features, BatchNormOptions options)
    : Module(std::move(type_name)), num_features(num_features), options(options) {
  TANDEM_CHECK(num_features > 0, "[{}] num_features must be positive, got {}", this->type_name(), num_features);
  TANDEM_CHECK(!options.momentum || (*options.momentum >= 0 && *options.momentum <= 1),
               "[{}] momentum must be in [0, 1], got {}", this->type_name(), options.momentum.value_or(0));
  if (options.affine) {
    weight = register_parameter("weight", empty({num_features}));
    bias = register_parameter("bias", empty({num_features}));
  }
  if (options.track_running_stats) {
    register_buffer("running_mean", zeros({num_features}));
    register_buffer("running_var", ones({num_features}));
    register_buffer("num_batches_tracked", zeros({}, i64));
  }
  reset_parameters();
}

BatchNorm1d::BatchNorm1d(int64_t num_features, BatchNormOptions options)
    : BatchNormBase("BatchNorm1d", num_features, options) {}

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats)
    : BatchNorm1d(num_features, BatchNormOptions{eps, momentum, affine, track_running_stats}) {}

void BatchNorm1d::check_input(const Tensor& input) const {
  TANDEM_CHECK((input.dim() == 2 || input.dim() == 3) && input.size(1) == num_features,
               "[BatchNorm1d] expected input of shape [N, {0}] or [N, {0}, L], got {1}", num_features, input.shape());
}

BatchNorm2d::BatchNorm2d(int64_t num_features, BatchNormOptions options)
    : BatchNormBase("BatchNorm2d", num_features, options) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats)
    : BatchNorm2d(num_features, BatchNormOptions{eps, momentum, affine, track_running_stats}) {}

void BatchNorm2d::check_input(const Tensor& input) const {
  TANDEM_CHECK(input.dim() == 4 && input.size(1) == num_features,
               "[BatchNorm2d] expected input of shape [N, {}, H, W], got {}", num_features, input.shape());
}

Tensor BatchNormBase::running_mean() const {
  return options.track_running_stats ? own_buffers().at("running_mean") : Tensor();
}
Tensor BatchNormBase::running_var() const {
  return options.track_running_stats ? own_buffers().at("running_var") : Tensor();
}
Tensor BatchNormBase::num_batches_tracked() const {
  return options.track_running_stats ? own_buffers().at("num_batches_tracked") : Tensor();
}

void BatchNormBase::reset_running_stats() {
  if (!options.track_running_stats) return;
  NoGradGuard guard;
  running_mean().zero_();
  running_var().fill_(1.0);
  num_batches_tracked().zero_();
}

void BatchNormBase::reset_parameters() {
  reset_running_stats();
  if (options.affine) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor BatchNormBase::forward(const Tensor& input) {
  check_input(input);
  TANDEM_CHECK(input.is_floating_point(), "[{}] expected a floating input, got {}", type_name(), input.dtype());
  // Statistics reduce over every dim but the channel dim; they broadcast back as [C, 1, ...]
  // (one 1 per trailing dim) against [N, C, ...].
  Shape reduce_dims{0};
  Shape stat_shape{num_features};
  for (int64_t d = 2; d < input.dim(); ++d) {
    reduce_dims.push_back(d);
    stat_shape.push_back(1);
  }
  const bool use_batch_stats = is_training() || !options.track_running_stats;

  Tensor normalized;
  if (use_batch_stats) {
    const int64_t n = input.numel() / num_features;
    TANDEM_CHECK(!is_training() || n > 1,
                 "[{}] expected more than 1 value per channel when training, got input of shape {}", type_name(),
                 input.shape());
    Tensor mean_b = mean(input, reduce_dims);
    Tensor centered = input - mean_b.view(stat_shape);
    Tensor var_b = mean(centered * centered, reduce_dims);  // biased, as used for normalising
    normalized = centered * rsqrt(var_b + options.eps).view(stat_shape);
    if (is_training() && options.track_running_stats) {
      NoGradGuard guard;
      Tensor tracked = num_batches_tracked();
      tracked.add_(Scalar(int64_t{1}));
      double m = options.momentum ? *options.momentum : 1.0 / static_cast<double>(tracked.item<int64_t>());
      Tensor rm = running_mean(), rv = running_var();
      // The running variance is the unbiased estimate (PyTorch's choice), hence n / (n - 1).
      Tensor unbiased = var_b.detach() * (static_cast<double>(n) / static_cast<double>(n - 1));
      rm.mul_(1.0 - m).add_(to_dtype(mean_b.detach(), rm.dtype()), m);
      rv.mul_(1.0 - m).add_(to_dtype(unbiased, rv.dtype()), m);
    }
  } else {
    Tensor rm = to_dtype(running_mean(), input.dtype()).view(stat_shape);
    Tensor rv = to_dtype(running_var(), input.dtype()).view(stat_shape);
    normalized = (input - rm) * rsqrt(rv + options.eps);
  }
  if (options.affine) normalized = normalized * weight.view(stat_shape) + bias.view(stat_shape);
  return normalized;
}

std::string BatchNormBase::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine={}, track_running_stats={}", num_features, options.eps,
                     options.momentum ? fmt::format("{}", *options.momentum) : "None", options.affine,
                     options.track_running_stats);
}

void BatchNormBase::parameter_replaced(const std::string& name, const Tensor& tensor) {
  rebind(name, tensor, weight, &bias);
}

// ---- Conv2d and pooling ----

namespace {
std::string pair_str(Size2 s) { return fmt::format("({}, {})", s.h, s.w); }
}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride, Size2 padding,
               Size2 dilation, int64_t groups, bool bias)
    : Module("Conv2d"), in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size),
      stride(stride), padding(padding), dilation(dilation), groups(groups) {
  TANDEM_CHECK(in_channels > 0 && out_channels > 0, "[Conv2d] channels must be positive, got in={} out={}",
               in_channels, out_channels);
  TANDEM_CHECK(groups > 0, "[Conv2d] groups must be positive, got {}", groups);
  TANDEM_CHECK(in_channels % groups == 0 && out_channels % groups == 0,
               "[Conv2d] groups {} must divide in_channels {} and out_channels {}", groups, in_channels, out_channels);
  TANDEM_CHECK(kernel_size.h > 0 && kernel_size.w > 0, "[Conv2d] kernel_size must be positive, got {}", kernel_size);
  TANDEM_CHECK(stride.h > 0 && stride.w > 0, "[Conv2d] stride must be positive, got {}", stride);
  TANDEM_CHECK(padding.h >= 0 && padding.w >= 0, "[Conv2d] padding must be non-negative, got {}", padding);
  TANDEM_CHECK(dilation.h > 0 && dilation.w > 0, "[Conv2d] dilation must be positive, got {}", dilation);
  weight = register_parameter("weight", empty({out_channels, in_channels / groups, kernel_size.h, kernel_size.w}));
  if (bias) this->bias = register_parameter("bias", empty({out_channels}));
  reset_parameters();
}

void Conv2d::reset_parameters() {
  // PyTorch's _ConvNd.reset_parameters: kaiming_uniform(a = sqrt(5)) for the weight, and the
  // bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in_channels / groups * kh * kw.
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double fan_in = static_cast<double>(init::calculate_fan_in_and_fan_out(weight).first);
    const double bound = 1.0 / std::sqrt(fan_in);
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  TANDEM_CHECK((input.dim() == 4 || input.dim() == 3) && input.size(-3) == in_channels,
               "[Conv2d] expected input [N, {0}, H, W] or [{0}, H, W] (in_channels {0}), got {1}", in_channels,
               input.shape());
  return conv2d(input, weight, bias, stride, padding, dilation, groups);
}

std::string Conv2d::extra_repr() const {
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", in_channels, out_channels, pair_str(kernel_size),
                              pair_str(stride));
  if (padding != Size2(0)) s += fmt::format(", padding={}", pair_str(padding));
  if (dilation != Size2(1)) s += fmt::format(", dilation={}", pair_str(dilation));
  if (groups != 1) s += fmt::format(", groups={}", groups);
  if (!bias.defined()) s += ", bias=False";
  return s;
}

void Conv2d::parameter_replaced(const std::string& name, const Tensor& tensor) {
  rebind(name, tensor, weight, &bias);
}

MaxPool2d::MaxPool2d(Size2 kernel_size, std::optional<Size2> stride, Size2 padding, Size2 dilation, bool ceil_mode)
    : Module("MaxPool2d"), kernel_size(kernel_size), stride(stride.value_or(kernel_size)), padding(padding),
      dilation(dilation), ceil_mode(ceil_mode) {}

Tensor MaxPool2d::forward(const Tensor& input) {
  return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode);
}

std::string MaxPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}, dilation={}, ceil_mode={}", pair_str(kernel_size),
                     pair_str(stride), pair_str(padding), pair_str(dilation), ceil_mode);
}

AvgPool2d::AvgPool2d(Size2 kernel_size, std::optional<Size2> stride, Size2 padding, bool ceil_mode,
                     bool count_include_pad, std::optional<int64_t> divisor_override)
    : Module("AvgPool2d"), kernel_size(kernel_size), stride(stride.value_or(kernel_size)), padding(padding),
      ceil_mode(ceil_mode), count_include_pad(count_include_pad), divisor_override(divisor_override) {}

Tensor AvgPool2d::forward(const Tensor& input) {
  return avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
}

std::string AvgPool2d::extra_repr() const {
  std::string s = fmt::format("kernel_size={}, stride={}, padding={}", pair_str(kernel_size), pair_str(stride),
                              pair_str(padding));
  if (ceil_mode) s += ", ceil_mode=True";
  if (!count_include_pad) s += ", count_include_pad=False";
  if (divisor_override) s += fmt::format(", divisor_override={}", *divisor_override);
  return s;
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 output_size) : Module("AdaptiveAvgPool2d"), output_size(output_size) {
  TANDEM_CHECK(output_size.h > 0 && output_size.w > 0, "[AdaptiveAvgPool2d] output_size must be positive, got {}",
               output_size);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) { return adaptive_avg_pool2d(input, output_size); }

std::string AdaptiveAvgPool2d::extra_repr() const { return fmt::format("output_size={}", pair_str(output_size)); }

Flatten::Flatten(int64_t start_dim, int64_t end_dim) : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {}

Tensor Flatten::forward(const Tensor& input) { return flatten(input, start_dim, end_dim); }

std::string Flatten::extra_repr() const { return fmt::format("start_dim={}, end_dim={}", start_dim, end_dim); }

// ---- Dropout and activations ----

Dropout::Dropout(double p) : Module("Dropout"), p(p) {
  TANDEM_CHECK(p >= 0 && p <= 1, "[Dropout] probability must be in [0, 1], got {}", p);
}

Tensor Dropout::forward(const Tensor& input) { return dropout(input, p, is_training()); }
std::string Dropout::extra_repr() const { return fmt::format("p={}", p); }

Tensor ReLU::forward(const Tensor& input) { return relu(input); }
Tensor GELU::forward(const Tensor& input) { return gelu(input, tanh_approximation); }
std::string GELU::extra_repr() const { return tanh_approximation ? "approximate='tanh'" : ""; }
Tensor Tanh::forward(const Tensor& input) { return tanh(input); }
Tensor Sigmoid::forward(const Tensor& input) { return sigmoid(input); }

// ---- Sequential ----

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) : Sequential() {
  for (const auto& m : modules) push_back(m);
}

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) : Sequential() {
  for (const auto& m : modules) push_back(m);
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& layer : layers_) x = (*layer)(x);
  return x;
}

Tensor Sequential::forward_inputs(const TensorList& inputs) {
  TANDEM_CHECK(!inputs.empty() && inputs.size() <= max_inputs(), "[Sequential] takes 1 to {} inputs, got {}",
               max_inputs(), inputs.size());
  Tensor x = inputs[0];
  for (const auto& layer : layers_) {
    if (layer->max_inputs() == 1) {
      x = (*layer)(x);
      continue;
    }
    TensorList in{x};
    in.insert(in.end(), inputs.begin() + 1, inputs.end());
    x = layer->call(in);
  }
  return x;
}

size_t Sequential::max_inputs() const {
  size_t most = 1;
  for (const auto& layer : layers_) most = std::max(most, layer->max_inputs());
  return most;
}

std::shared_ptr<Module> Sequential::operator[](int64_t index) const {
  const auto n = static_cast<int64_t>(layers_.size());
  TANDEM_CHECK(index >= -n && index < n, "[Sequential] index {} out of range for {} layers", index, n);
  return layers_[index < 0 ? index + n : index];
}

}  // namespace tandem::nn
