#include "nn/layers.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/init.h"

namespace tandem::nn {

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

// ---- BatchNorm1d ----

BatchNorm1d::BatchNorm1d(int64_t num_features, BatchNormOptions options)
    : Module("BatchNorm1d"), num_features(num_features), options(options) {
  TANDEM_CHECK(num_features > 0, "[BatchNorm1d] num_features must be positive, got {}", num_features);
  TANDEM_CHECK(!options.momentum || (*options.momentum >= 0 && *options.momentum <= 1),
               "[BatchNorm1d] momentum must be in [0, 1], got {}", options.momentum.value_or(0));
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

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats)
    : BatchNorm1d(num_features, BatchNormOptions{eps, momentum, affine, track_running_stats}) {}

Tensor BatchNorm1d::running_mean() const {
  return options.track_running_stats ? own_buffers().at("running_mean") : Tensor();
}
Tensor BatchNorm1d::running_var() const {
  return options.track_running_stats ? own_buffers().at("running_var") : Tensor();
}
Tensor BatchNorm1d::num_batches_tracked() const {
  return options.track_running_stats ? own_buffers().at("num_batches_tracked") : Tensor();
}

void BatchNorm1d::reset_running_stats() {
  if (!options.track_running_stats) return;
  NoGradGuard guard;
  running_mean().zero_();
  running_var().fill_(1.0);
  num_batches_tracked().zero_();
}

void BatchNorm1d::reset_parameters() {
  reset_running_stats();
  if (options.affine) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor BatchNorm1d::forward(const Tensor& input) {
  TANDEM_CHECK((input.dim() == 2 || input.dim() == 3) && input.size(1) == num_features,
               "[BatchNorm1d] expected input of shape [N, {0}] or [N, {0}, L], got {1}", num_features, input.shape());
  TANDEM_CHECK(input.is_floating_point(), "[BatchNorm1d] expected a floating input, got {}", input.dtype());
  // Statistics reduce over every dim but the channel dim; they broadcast back as [C] against
  // [N, C] and as [C, 1] against [N, C, L].
  Shape reduce_dims = input.dim() == 2 ? Shape{0} : Shape{0, 2};
  Shape stat_shape = input.dim() == 2 ? Shape{num_features} : Shape{num_features, 1};
  const bool use_batch_stats = is_training() || !options.track_running_stats;

  Tensor normalized;
  if (use_batch_stats) {
    const int64_t n = input.numel() / num_features;
    TANDEM_CHECK(!is_training() || n > 1,
                 "[BatchNorm1d] expected more than 1 value per channel when training, got input of shape {}",
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

std::string BatchNorm1d::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine={}, track_running_stats={}", num_features, options.eps,
                     options.momentum ? fmt::format("{}", *options.momentum) : "None", options.affine,
                     options.track_running_stats);
}

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

std::shared_ptr<Module> Sequential::operator[](int64_t index) const {
  const auto n = static_cast<int64_t>(layers_.size());
  TANDEM_CHECK(index >= -n && index < n, "[Sequential] index {} out of range for {} layers", index, n);
  return layers_[index < 0 ? index + n : index];
}

}  // namespace tandem::nn
