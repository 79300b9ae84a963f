// End to end on the GPU: a small model trained a few steps on CUDA ends with the parameters the
// same model gets on the CPU, within f32 tolerance. The model goes through every op family:
// embedding (index), layer_norm and cross_entropy (nn_ops), linear (matmul, cuBLAS), gelu, relu,
// tanh, mul and add (elementwise), mean and amax (reductions), cat, dropout (Philox, the same
// masks on both devices), and the fused SGD / AdamW steps; the loss goes to the host each step.
//
// SGD trains in f32. AdamW trains in f64: its first steps move every weight by about
// lr * sign(grad), so in f32 a gradient within rounding of zero (|g| near eps = 1e-8, where CPU
// and GPU sums can disagree in sign) moves a weight by up to 2 lr apart on the two devices. In
// f64 the devices' gradients differ by ~1e-16 and the steps agree to ~1e-10, so the comparison
// can be tight (1e-8) and still fail on a wrong step (an f32 intermediate in the f64 kernel, a
// bias correction off by a step, a missing weight decay).
#include <catch2/catch.hpp>

#include <functional>
#include <memory>

#include "cuda_test_util.h"
#include "nn/nn.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::require_close;

namespace {

using cuda_test::kGPU;

constexpr int64_t kVocab = 40, kDim = 16, kHidden = 32, kClasses = 5, kBatch = 12, kSeq = 7;

class Classifier : public nn::Module {
 public:
  explicit Classifier(double dropout_p) : Module("Classifier"), p_(dropout_p) {
    emb = register_module("emb", std::make_shared<nn::Embedding>(kVocab, kDim));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{kDim}));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kDim, kHidden));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(2 * kHidden, kHidden));
    head = register_module("head", std::make_shared<nn::Linear>(kHidden, kClasses));
  }

  // tokens [batch, seq] (i64) -> logits [batch, classes]
  Tensor forward(const Tensor& tokens) override {
    Tensor h = (*norm)((*emb)(tokens));               // [B, T, D]
    h = gelu((*fc1)(h));                              // [B, T, H], a 3-D input to linear
    Tensor pooled = cat({mean(h, {1}), amax(h, {1})}, 1);  // [B, 2H]
    pooled = dropout(pooled, p_, is_training());
    Tensor z = relu((*fc2)(pooled));
    z = add(z, mul(tanh(z), 0.5));
    return (*head)(z);
  }

  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc1, fc2, head;

 private:
  double p_;
};

struct Run {
  nn::TensorDict params;
  std::vector<double> losses;
};

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(const TensorList&)>;

// Trains a fresh model (same init for the same seed: parameters are initialised on the CPU in
// f32, then cast to `dtype` and moved) for `steps` steps on `device`.
Run train(Device device, Dtype dtype, const MakeOpt& make_opt, double dropout_p, int steps) {
  manual_seed(1234);
  auto net = std::make_shared<Classifier>(dropout_p);
  net->to(dtype);
  net->to(device);
  Tensor tokens = randint(0, kVocab, {kBatch, kSeq}).to(device);
  Tensor labels = randint(0, kClasses, {kBatch}).to(device);
  auto opt = make_opt(net->parameters());
  manual_seed(99);  // the dropout stream starts alike on both devices
  Run run;
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    Tensor loss = nn::cross_entropy((*net)(tokens), labels);
    loss.backward();
    opt->step();
    run.losses.push_back(loss.to(kCPU).item<double>());  // item() reads CPU tensors only
  }
  run.params = net->state_dict();
  return run;
}

void require_same_training(Dtype dtype, const MakeOpt& make_opt, double dropout_p, int steps) {
  Run cpu = train(kCPU, dtype, make_opt, dropout_p, steps);
  Run gpu = train(kGPU, dtype, make_opt, dropout_p, steps);
  const double tol = dtype == f64 ? 1e-8 : 1e-4;
  INFO(dtype << ": cpu loss " << cpu.losses.front() << " -> " << cpu.losses.back() << ", gpu loss "
             << gpu.losses.front() << " -> " << gpu.losses.back());
  require_close(gpu.losses, cpu.losses, tol);
  REQUIRE(cpu.losses.back() < cpu.losses.front());  // it trains
  for (const auto& [name, t] : cpu.params) {
    INFO(name);
    const Tensor& g = gpu.params.at(name);
    REQUIRE(g.device() == kGPU);
    REQUIRE(g.dtype() == dtype);
    require_close(to_dtype(g.to(kCPU), f64).to_vector<double>(), to_dtype(t, f64).to_vector<double>(), tol);
  }
}

}  // namespace

TEST_CASE("cuda training: SGD with momentum on the GPU matches the CPU", "[cuda][training]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  require_same_training(
      f32,
      [](const TensorList& ps) {
        return std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
      },
      0.0, 8);
}

TEST_CASE("cuda training: AdamW on the GPU matches the CPU (f64)", "[cuda][training]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  require_same_training(
      f64, [](const TensorList& ps) { return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{.lr = 0.01}); },
      0.0, 8);
}

TEST_CASE("cuda training: with dropout (same Philox masks on both devices, f64)", "[cuda][training][random]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  require_same_training(
      f64, [](const TensorList& ps) { return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{.lr = 0.01}); },
      0.25, 6);
}
