// The models of the tools: the benchmark MLP (in-hidden-hidden-out, ReLU, cross-entropy, SGD with
// momentum 0.9) on a fixed random batch, shared by bench_cpu and train, and train's Fashion-MNIST
// models (the CNN of the main job and the 784-256-128-10 MLP).
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
