// The models of the tools: the benchmark MLP (in-hidden-hidden-out, ReLU, cross-entropy, SGD with
// momentum 0.9) on a fixed random batch, shared by bench_cpu and train; train's Fashion-MNIST
// models (the CNN of the main job and the 784-256-128-10 MLP), their seeds and default recipes,
// which bench_train repeats; and the conv benchmark of bench_cpu and bench_train.
#pragma once

#include <memory>

#include "nn/nn.h"
#include "tandem.h"

inline std::shared_ptr<tandem::nn::Sequential> make_mlp(int64_t in, int64_t hidden, int64_t out, int hidden_layers = 2) {
  using namespace tandem::nn;
  auto model = std::make_shared<Sequential>();
  int64_t width = in;
  for (int i = 0; i < hidden_layers; ++i) {
    model->push_back(std::make_shared<Linear>(width, hidden));
    model->push_back(std::make_shared<ReLU>());
    width = hidden;
  }
  model->push_back(std::make_shared<Linear>(width, out));
  return model;
}

// Two conv + pool blocks and two linear layers: [N, 1, 28, 28] -> [N, 10] logits.
inline std::shared_ptr<tandem::nn::Sequential> make_fmnist_cnn(int64_t channels = 32) {
  using namespace tandem::nn;
  auto model = std::make_shared<Sequential>();
  model->push_back(std::make_shared<Conv2d>(1, channels, 3, 1, 1));
  model->push_back(std::make_shared<ReLU>());
  model->push_back(std::make_shared<MaxPool2d>(2));  // 14x14
  model->push_back(std::make_shared<Conv2d>(channels, 2 * channels, 3, 1, 1));
  model->push_back(std::make_shared<ReLU>());
  model->push_back(std::make_shared<MaxPool2d>(2));  // 7x7
  model->push_back(std::make_shared<Flatten>());
  model->push_back(std::make_shared<Linear>(2 * channels * 7 * 7, 128));
  model->push_back(std::make_shared<ReLU>());
  model->push_back(std::make_shared<Linear>(128, 10));
  return model;
}

// [N, 28, 28] -> flatten -> 256 -> 128 -> 10 logits.
inline std::shared_ptr<tandem::nn::Sequential> make_fmnist_mlp() {
  using namespace tandem::nn;
  auto model = std::make_shared<Sequential>();
  model->push_back(std::make_shared<Flatten>());
  model->push_back(std::make_shared<Linear>(784, 256));
  model->push_back(std::make_shared<ReLU>());
  model->push_back(std::make_shared<Linear>(256, 128));
  model->push_back(std::make_shared<ReLU>());
  model->push_back(std::make_shared<Linear>(128, 10));
  return model;
}

// train's seeds, from its --seed: the initial weights (manual_seed just before the model is
// built) and the loader's shuffle. bench_train builds the same model and order for its peer.
inline uint64_t train_init_seed(uint64_t seed) { return seed + 7; }
inline uint64_t train_loader_seed(uint64_t seed) { return seed + 1000; }

// What train does when not told otherwise (SGD with momentum 0.9, per-rank batch 64, the schedule
// stepped per step): on Fashion-MNIST the main job's recipe (tools/train.sh) for the CNN, and the
// MLP's; the synthetic set's for tests. bench_train's PyTorch peer repeats the CNN's.
struct TrainRecipe {
  int64_t epochs;
  double lr;
  const char* lr_schedule;  // constant, cosine or step
  int64_t warmup_steps;
};
inline constexpr TrainRecipe kFmnistCnnRecipe{.epochs = 8, .lr = 0.05, .lr_schedule = "cosine", .warmup_steps = 0};
inline constexpr TrainRecipe kFmnistMlpRecipe{.epochs = 8, .lr = 0.05, .lr_schedule = "cosine", .warmup_steps = 0};
inline constexpr TrainRecipe kSyntheticRecipe{.epochs = 3, .lr = 0.05, .lr_schedule = "constant", .warmup_steps = 0};
inline constexpr int64_t kFmnistBatch = 64;
inline constexpr double kSgdMomentum = 0.9;

// One forward and backward of nn::Conv2d(32, 64, 3, padding 1) on a 64x32x28x28 input, gradients
// cleared first (as the PyTorch peer does): bench_cpu's and bench_train's conv2d_fwd_bwd.
struct ConvBench {
  tandem::nn::Conv2d conv{32, 64, 3, 1, 1};
  tandem::Tensor x = tandem::randn({64, 32, 28, 28}).requires_grad_();
  void step() {
    conv.zero_grad(true);
    x.set_grad(tandem::Tensor());
    tandem::sum(conv(x)).backward();
  }
};

struct MlpBench {
  std::shared_ptr<tandem::nn::Sequential> model;
  std::unique_ptr<tandem::optim::SGD> opt;
  tandem::Tensor x, y;

  MlpBench(int64_t batch, int64_t in, int64_t hidden, int64_t out) {
    model = make_mlp(in, hidden, out);
    opt = std::make_unique<tandem::optim::SGD>(model->parameters(), tandem::optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
    x = tandem::randn({batch, in});
    y = tandem::randint(0, out, {batch});
  }
  float step() {
    opt->zero_grad(true);
    tandem::Tensor loss = tandem::nn::cross_entropy((*model)(x), y);
    loss.backward();
    opt->step();
    return loss.item<float>();
  }
};
