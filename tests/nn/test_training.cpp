// End to end: an MLP learns a 3-arm 2-D spiral (not linearly separable) to > 95% training
// accuracy with SGD + momentum and with AdamW, through Module, Linear, ReLU, cross_entropy,
// backward and the optimizers together. Each run takes well under a second.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "nn/nn.h"
#include "tandem.h"

using namespace tandem;

namespace {

constexpr int kClasses = 3;
constexpr int kPerClass = 200;

// The CS231n spiral: arm k at angle 4k + 4r (+ noise), radius r in [0, 1].
std::pair<Tensor, Tensor> spiral(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.2f);
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int k = 0; k < kClasses; ++k) {
    for (int i = 0; i < kPerClass; ++i) {
      float r = static_cast<float>(i) / (kPerClass - 1);
      float theta = 4.0f * static_cast<float>(k) + 4.0f * r + noise(rng);
      xs.push_back(r * std::sin(theta));
      xs.push_back(r * std::cos(theta));
      ys.push_back(k);
    }
  }
  return {from_vector<float>(xs, {kClasses * kPerClass, 2}), from_vector<int64_t>(ys)};
}

std::shared_ptr<nn::Sequential> mlp() {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(2, 64));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(64, 64));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(64, kClasses));
  return net;
}

double accuracy(nn::Module& net, const Tensor& x, const Tensor& y) {
  NoGradGuard guard;
  Tensor pred = argmax(net(x), 1);
  return mean(to_dtype(eq(pred, y), f32)).item<float>();
}

// Full-batch training; returns (first loss, last loss, accuracy).
std::tuple<double, double, double> train(optim::Optimizer& opt, nn::Module& net, int steps) {
  auto [x, y] = spiral(7);
  double first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(net(x), y);
    loss.backward();
    opt.step();
    last = loss.item<float>();
    if (s == 0) first = last;
  }
  return {first, last, accuracy(net, x, y)};
}

}  // namespace

TEST_CASE("training: MLP on a spiral with SGD + momentum", "[training]") {
  manual_seed(42);
  auto net = mlp();
  optim::SGD opt(net->parameters(), {.lr = 0.2, .momentum = 0.9});
  auto [first, last, acc] = train(opt, *net, 600);
  INFO("loss " << first << " -> " << last << ", accuracy " << acc);
  REQUIRE(first > 0.9);  // ~log(3) at the start: the model begins untrained
  REQUIRE(last < 0.2);
  REQUIRE(acc > 0.95);
}

TEST_CASE("training: MLP on a spiral with AdamW", "[training]") {
  manual_seed(43);
  auto net = mlp();
  optim::AdamW opt(net->parameters(), {.lr = 0.01, .weight_decay = 1e-4});
  auto [first, last, acc] = train(opt, *net, 400);
  INFO("loss " << first << " -> " << last << ", accuracy " << acc);
  REQUIRE(first > 0.9);
  REQUIRE(last < 0.2);
  REQUIRE(acc > 0.95);
}

TEST_CASE("training: a run survives a checkpoint round trip", "[training][safetensors]") {
  // Train 100 steps, checkpoint model and optimizer to safetensors, restore into fresh objects,
  // continue: the result equals 200 uninterrupted steps bit for bit.
  auto [x, y] = spiral(11);
  auto run = [&](bool checkpoint) {
    manual_seed(5);
    auto net = mlp();
    auto opt = std::make_unique<optim::AdamW>(net->parameters(), optim::AdamWOptions{.lr = 0.01});
    auto steps = [&](int n) {
      for (int s = 0; s < n; ++s) {
        opt->zero_grad();
        nn::cross_entropy((*net)(x), y).backward();
        opt->step();
      }
    };
    steps(100);
    if (checkpoint) {
      std::string dir = std::filesystem::temp_directory_path().string() + "/tandem_train_" + std::to_string(::getpid());
      std::filesystem::create_directories(dir);
      std::string model_path = dir + "/tandem_train_model.safetensors";
      std::string opt_path = dir + "/tandem_train_opt.safetensors";
      nn::save_model(*net, model_path);
      nn::save_optimizer(*opt, opt_path);
      manual_seed(99);  // a different init, overwritten by the checkpoint
      net = mlp();
      opt = std::make_unique<optim::AdamW>(net->parameters(), optim::AdamWOptions{.lr = 0.5});
      nn::load_model(*net, model_path);
      nn::load_optimizer(*opt, opt_path);
      std::filesystem::remove_all(dir);
    }
    steps(100);
    return net->state_dict();
  };
  auto straight = run(false);
  auto resumed = run(true);
  for (const auto& [name, t] : straight) {
    INFO(name);
    REQUIRE(resumed[name].equal(t));
  }
}
