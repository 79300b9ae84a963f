// train: trains an MLP classifier on a built-in synthetic dataset and reports the final loss
// and held-out accuracy. Single process for now (the DDP issue turns it into an mpirun job).
//
//   train [--hidden 256] [--layers 2] [--batch 128] [--steps 600] [--lr 0.05] [--optimizer sgd|adamw]
//
// The data: `classes` Gaussian clusters in `features` dims, centres drawn once from the seed,
// with noise; the classes overlap only slightly, so a small MLP reaches > 97% held-out accuracy.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "bench_common.h"
#include "mlp.h"
#include "tandem.h"

using namespace tandem;

namespace {

struct Dataset {
  Tensor x, y;
};

Dataset make_blobs(int64_t n, int64_t features, int64_t classes, double noise, uint64_t seed) {
  manual_seed(seed);
  Tensor centres = randn({classes, features}) * 2.0;  // same centres for train and test
  manual_seed(seed + 1 + static_cast<uint64_t>(n));
  Tensor y = randint(0, classes, {n});
  Tensor x = index_select(centres, 0, y) + randn({n, features}) * noise;
  return {x, y};
}

// A permutation of [0, n) from the (seeded) Philox stream: indices sorted by uniform keys.
Tensor shuffled_indices(int64_t n) {
  std::vector<float> keys = rand({n}).to_vector<float>();
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
  return from_vector(idx);
}

// One line of progress: a bar on a terminal (redrawn in place), plain lines otherwise.
void progress(int64_t step, int64_t steps, double loss, double samples_per_s, double eta_s, bool tty) {
  if (tty) {
    int width = 30, filled = static_cast<int>(width * step / std::max<int64_t>(steps, 1));
    std::fprintf(stdout, "\r[%.*s%*s] step %lld/%lld  loss %.4f  %.0f samples/s  ETA %.1fs", filled,
                 "##############################", width - filled, "", static_cast<long long>(step),
                 static_cast<long long>(steps), loss, samples_per_s, eta_s);
    if (step == steps) std::fputc('\n', stdout);
  } else {
    std::fprintf(stdout, "step %lld/%lld loss %.4f %.0f samples/s ETA %.1fs\n", static_cast<long long>(step),
                 static_cast<long long>(steps), loss, samples_per_s, eta_s);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train an MLP on a built-in synthetic classification set"};
  int64_t hidden = 256, layers = 2, batch = 128, steps = 600, features = 32, classes = 10, train_n = 16384;
  double lr = 0.05, noise = 2.5, target = 0.95;
  uint64_t seed = 0;
  std::string optimizer = "sgd";
  int threads = 0;
  app.add_option("--hidden", hidden, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--layers", layers, "hidden layers")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "learning rate")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "sgd (momentum 0.9) or adamw")->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--features", features, "input features")->check(CLI::PositiveNumber);
  app.add_option("--classes", classes, "classes")->check(CLI::Range(2, 1000));
  app.add_option("--samples", train_n, "training samples")->check(CLI::PositiveNumber);
  app.add_option("--noise", noise, "cluster noise (std)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "seed for data and initialisation");
  app.add_option("--threads", threads, "intra-op threads (default: cores / ranks on the node)");
  app.add_option("--target", target, "accuracy the run must reach (exit status 1 if not)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (threads > 0) set_num_threads(threads);
    Dataset train = make_blobs(train_n, features, classes, noise, seed);
    Dataset test = make_blobs(4096, features, classes, noise, seed);
    manual_seed(seed + 7);
    auto model = make_mlp(features, hidden, classes, static_cast<int>(layers));
    std::unique_ptr<optim::Optimizer> opt;
    if (optimizer == "sgd") {
      opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = lr, .momentum = 0.9});
    } else {
      opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = lr});
    }
    std::fprintf(stdout, "train: %lld samples, %lld features, %lld classes; MLP %lldx%lld, batch %lld, %lld steps, %s lr %g\n",
                 static_cast<long long>(train_n), static_cast<long long>(features), static_cast<long long>(classes),
                 static_cast<long long>(layers), static_cast<long long>(hidden), static_cast<long long>(batch),
                 static_cast<long long>(steps), optimizer.c_str(), lr);
    bool tty = isatty(fileno(stdout));
    int64_t report_every = std::max<int64_t>(1, steps / (tty ? 100 : 10));
    double t0 = bench::now_s();
    double loss_value = 0;
    int64_t epoch = 0, cursor = train_n;
    Tensor order;
    for (int64_t step = 1; step <= steps; ++step) {
      if (cursor + batch > train_n) {  // reshuffle each epoch, dropping the last partial batch
        manual_seed(seed + 1000 + static_cast<uint64_t>(epoch++));
        order = shuffled_indices(train_n);
        cursor = 0;
      }
      Tensor idx = narrow(order, 0, cursor, batch);
      cursor += batch;
      Tensor xb = index_select(train.x, 0, idx), yb = index_select(train.y, 0, idx);
      opt->zero_grad(true);
      Tensor loss = nn::cross_entropy((*model)(xb), yb);
      loss.backward();
      opt->step();
      if (step % report_every == 0 || step == steps) {
        loss_value = loss.item<double>();
        double elapsed = bench::now_s() - t0;
        progress(step, steps, loss_value, step * batch / elapsed, elapsed / step * (steps - step), tty);
      }
    }
    NoGradGuard ng;
    model->eval();
    Tensor logits = (*model)(test.x);
    double test_loss = nn::cross_entropy(logits, test.y).item<double>();
    double accuracy = mean(eq(argmax(logits, 1), test.y).to(f32)).item<double>();
    std::fprintf(stdout, "final: train loss %.4f, test loss %.4f, test accuracy %.2f%% (target %.0f%%) in %.2fs\n",
                 loss_value, test_loss, accuracy * 100, target * 100, bench::now_s() - t0);
    return accuracy >= target ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 2;
  }
}
