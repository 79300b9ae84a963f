// The benchmark MLP (in-hidden-hidden-out, ReLU, cross-entropy, SGD with momentum 0.9) on a
// fixed random batch, shared by bench_cpu and the training tools.
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
