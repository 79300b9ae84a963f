// The built-in layers: Linear, Embedding, LayerNorm, BatchNorm1d/2d, Conv2d, the pooling layers,
// Flatten, Dropout, the activations and Sequential. Construction and initialisation follow
// PyTorch, so a model built here starts from the same distribution as its PyTorch twin.
#pragma once

#include <concepts>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace tandem::nn {

// y = x W^T + b. weight [out, in] ~ kaiming_uniform(a = sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in));
// bias [out] ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  void reset_parameters();
  std::string extra_repr() const override;

  int64_t in_features, out_features;
  Tensor weight;
  Tensor bias;  // undefined without bias

 protected:
  void parameter_replaced(const std::string& name, const Tensor& tensor) override;
};

// Rows of weight [num_embeddings, embedding_dim] ~ N(0, 1) picked by integer indices.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override;
  void reset_parameters();
  std::string extra_repr() const override;

  int64_t num_embeddings, embedding_dim;
  Tensor weight;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& tensor) override;
};

// Normalises over the trailing `normalized_shape` dims; weight ones, bias zeros.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  void reset_parameters();
  std::string extra_repr() const override;

  Shape normalized_shape;
  double eps;
  bool elementwise_affine;
  Tensor weight, bias;  // undefined without elementwise_affine

 protected:
  void parameter_replaced(const std::string& name, const Tensor& tensor) override;
};

struct BatchNormOptions {
  double eps = 1e-5;
  // Weight of the new batch statistic in the running average; nullopt means a cumulative
  // average (1 / num_batches_tracked), as momentum=None in PyTorch.
  std::optional<double> momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

// Batch normalisation per channel (dim 1) over every other dim, the part BatchNorm1d and
// BatchNorm2d share. Training normalises with the batch statistics (biased variance) and updates
// the running mean and the running *unbiased* variance; eval normalises with the running
// statistics when they are tracked.
// Buffers: running_mean [C] (zeros), running_var [C] (ones), num_batches_tracked (0-dim i64).
class BatchNormBase : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  void reset_running_stats();
  void reset_parameters();
  std::string extra_repr() const override;

  // The buffers, read from the module's slots (set_buffer replaces them).
  Tensor running_mean() const;
  Tensor running_var() const;
  Tensor num_batches_tracked() const;

  int64_t num_features;
  BatchNormOptions options;
  Tensor weight, bias;  // undefined without affine

 protected:
  BatchNormBase(std::string type_name, int64_t num_features, BatchNormOptions options);
  void parameter_replaced(const std::string& name, const Tensor& tensor) override;
  // Throws "[BatchNorm1d] expected input of shape ..." unless the input's rank and channels fit.
  virtual void check_input(const Tensor& input) const = 0;
};

// Inputs [N, C] or [N, C, L]: statistics over N (and L).
class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {});
  BatchNorm1d(int64_t num_features, double eps, std::optional<double> momentum = 0.1, bool affine = true,
              bool track_running_stats = true);

 protected:
  void check_input(const Tensor& input) const override;
};

// Inputs [N, C, H, W]: statistics over N, H and W.
class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {});
  BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum = 0.1, bool affine = true,
              bool track_running_stats = true);

 protected:
  void check_input(const Tensor& input) const override;
};

// y = conv2d(x, weight, bias) over inputs [N, C, H, W] or [C, H, W]. weight
// [out_channels, in_channels / groups, kh, kw] ~ kaiming_uniform(a = sqrt(5)); bias
// [out_channels] ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in_channels / groups * kh * kw.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1, Size2 padding = 0,
         Size2 dilation = 1, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& input) override;
  void reset_parameters();
  std::string extra_repr() const override;

  int64_t in_channels, out_channels;
  Size2 kernel_size, stride, padding, dilation;
  int64_t groups;
  Tensor weight;
  Tensor bias;  // undefined without bias

 protected:
  void parameter_replaced(const std::string& name, const Tensor& tensor) override;
};

// max_pool2d as a module; stride defaults to kernel_size.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                     Size2 dilation = 1, bool ceil_mode = false);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Size2 kernel_size, stride, padding, dilation;
  bool ceil_mode;
};

// avg_pool2d as a module; stride defaults to kernel_size.
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                     bool ceil_mode = false, bool count_include_pad = true,
                     std::optional<int64_t> divisor_override = std::nullopt);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Size2 kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;
  std::optional<int64_t> divisor_override;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Size2 output_size;
};

// Flattens dims start_dim..end_dim into one (a view when the strides allow).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t start_dim, end_dim;
};

// Zeroes elements with probability p in training (scaling the rest by 1 / (1 - p)); identity in eval.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  double p;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& input) override;
};

// Exact erf GELU, or the tanh approximation (approximate = "tanh" in PyTorch).
class GELU : public Module {
 public:
  explicit GELU(bool tanh_approximation = false) : Module("GELU"), tanh_approximation(tanh_approximation) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  bool tanh_approximation;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& input) override;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& input) override;
};

namespace detail {
template <class T>
struct is_module_ptr : std::false_type {};
template <class M>
struct is_module_ptr<std::shared_ptr<M>> : std::bool_constant<std::is_base_of_v<Module, M>> {};

// A module value Sequential can take ownership of: an rvalue (a temporary or std::move(m)),
// moved into a new shared_ptr. A module lvalue is refused: Sequential can neither share an
// object it does not own nor copy a module (see Module's copy constructor); pass std::move(m)
// or a std::shared_ptr.
template <class T>
concept MovableModuleValue = std::derived_from<std::remove_cvref_t<T>, Module> && !std::is_lvalue_reference_v<T> &&
                             !std::is_const_v<std::remove_reference_t<T>> &&
                             std::move_constructible<std::remove_cvref_t<T>>;

// What Sequential's constructor and push_back take: a shared_ptr to a module (shared with the
// caller) or a movable module value.
template <class T>
concept SequentialItem = is_module_ptr<std::remove_cvref_t<T>>::value || MovableModuleValue<T>;
}  // namespace detail

// Chains its children: forward(x) = child_n(...child_1(child_0(x))). Children are named
// "0", "1", ... in order; each call goes through operator(), so the children's hooks run.
//   nn::Sequential seq(nn::Linear(784, 256), nn::ReLU(), fc);   // fc: a shared_ptr, shared
// Called with several inputs, seq(x, mask), the first runs through the chain and the others go,
// after it, to every child that takes several inputs (a stack of TransformerEncoderLayers gets
// its masks; a Linear between them gets x alone).
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);
  // Module values are moved into new shared_ptrs; shared_ptrs are shared.
  template <detail::SequentialItem... Ms>
    requires(sizeof...(Ms) > 0)
  explicit Sequential(Ms&&... modules) : Sequential() {
    (push_back(std::forward<Ms>(modules)), ...);
  }

  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    TANDEM_CHECK(module != nullptr, "[Sequential] push_back of a null module");
    register_module(std::to_string(layers_.size()), module);
    layers_.push_back(module);
    return module;
  }
  // Moves the module value into a new shared_ptr, which it returns.
  template <detail::MovableModuleValue M>
  std::shared_ptr<std::remove_cvref_t<M>> push_back(M&& module) {
    return push_back(std::make_shared<std::remove_cvref_t<M>>(std::move(module)));
  }

  Tensor forward(const Tensor& input) override;
  Tensor forward_inputs(const TensorList& inputs) override;
  size_t max_inputs() const override;  // the most any child takes
  size_t size() const { return layers_.size(); }
  bool empty() const { return layers_.empty(); }
  // Negative indices count from the end, as in Python.
  std::shared_ptr<Module> operator[](int64_t index) const;
  template <class M>
  std::shared_ptr<M> at(int64_t index) const {
    auto typed = std::dynamic_pointer_cast<M>((*this)[index]);
    TANDEM_CHECK(typed != nullptr, "[Sequential] layer {} is a {}, not the requested type", index,
                 (*this)[index]->type_name());
    return typed;
  }
  auto begin() const { return layers_.begin(); }
  auto end() const { return layers_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

}  // namespace tandem::nn
