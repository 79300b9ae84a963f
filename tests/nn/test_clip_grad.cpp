// nn::utils::clip_grad_norm_: totals and clipped gradients against PyTorch's (1.13, numbers pasted
// below), the infinity norm and other orders, parameters without gradients, non-finite totals,
// half-precision gradients, the error with an optimizer in backward, and DDP on the threads
// backend: clipping after DDP's backward equals clipping in single-process training.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using Catch::Contains;
using nn::utils::clip_grad_norm_;
using test_util::require_close;
using test_util::vals;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Three parameters: a [2, 3] and a [4] with the gradients below, and a [2, 2] without one.
struct Params {
  Tensor a, b, none;
  TensorList list() const { return {a, b, none}; }
};

Params make_params(Dtype dt = f64) {
  Params p;
  p.a = zeros({2, 3}, dt).requires_grad_();
  p.b = zeros({4}, dt).requires_grad_();
  p.none = zeros({2, 2}, dt).requires_grad_();
  p.a.set_grad(from_vector<double>({0.5, -1.25, 2.0, 3.0, -0.75, 1.5}, {2, 3}).to(dt));
  p.b.set_grad(from_vector<double>({-2.5, 0.25, 4.0, -1.0}).to(dt));
  return p;
}

}  // namespace

// The references: torch.nn.utils.clip_grad_norm_ on the same gradients, e.g.
//   /usr/bin/python3 -c 'import torch; p1 = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True);
//     p1.grad = torch.tensor([[0.5, -1.25, 2.0], [3.0, -0.75, 1.5]], dtype=torch.float64); p2 = ...;
//     print(torch.nn.utils.clip_grad_norm_([p1, p2, p3], 1.0, 2.0).item(), p1.grad, p2.grad)'
TEST_CASE("clip_grad_norm_: the 2-norm of all gradients, clipped to max_norm, as PyTorch", "[clip_grad]") {
  Params p = make_params();
  const double total = clip_grad_norm_(p.list(), 1.0);
  // sqrt(0.25 + 1.5625 + 4 + 9 + 0.5625 + 2.25 + 6.25 + 0.0625 + 16 + 1) = sqrt(40.9375)
  REQUIRE(total == Approx(6.398241946034863).epsilon(1e-15));
  require_close(vals(p.a.grad()), {0.0781464543027178, -0.1953661357567945, 0.3125858172108712, 0.4688787258163068,
                                   -0.1172196814540767, 0.2344393629081534});
  require_close(vals(p.b.grad()), {-0.390732271513589, 0.0390732271513589, 0.6251716344217424, -0.1562929086054356});
  REQUIRE_FALSE(p.none.grad().defined());  // skipped, and left without a gradient
  // The clipped gradients now have norm max_norm (less the 1e-6 of the coefficient's guard).
  REQUIRE(clip_grad_norm_(p.list(), 1.0) == Approx(1.0).epsilon(1e-6));

  // A max_norm above the total changes nothing, and still returns the total.
  Params q = make_params();
  REQUIRE(clip_grad_norm_(q.list(), 100.0) == Approx(6.398241946034863).epsilon(1e-15));
  REQUIRE(vals(q.a.grad()) == std::vector<double>{0.5, -1.25, 2.0, 3.0, -0.75, 1.5});
  REQUIRE(vals(q.b.grad()) == std::vector<double>{-2.5, 0.25, 4.0, -1.0});

  // f32 gradients: PyTorch's f32 total 6.398241996765137 and its clipped gradients, to f32 rounding.
  Params f = make_params(f32);
  REQUIRE(clip_grad_norm_(f.list(), 1.0) == Approx(6.398241996765137).epsilon(1e-6));
  REQUIRE(f.a.grad().dtype() == f32);
  require_close(vals(f.a.grad()), {0.07814645767211914, -0.19536614418029785, 0.31258583068847656,
                                   0.46887874603271484, -0.11721968650817871, 0.23443937301635742},
                1e-6);
  require_close(vals(f.b.grad()), {-0.3907322883605957, 0.03907322883605957, 0.6251716613769531,
                                   -0.15629291534423828},
                1e-6);
}

TEST_CASE("clip_grad_norm_: infinity norm and other orders, as PyTorch", "[clip_grad]") {
  // norm_type inf: the largest |element| (4), max_norm 2.
  Params p = make_params();
  REQUIRE(clip_grad_norm_(p.list(), 2.0, kInf) == 4.0);
  require_close(vals(p.a.grad()), {0.24999993750001562, -0.624999843750039, 0.9999997500000625, 1.4999996250000938,
                                   -0.37499990625002344, 0.7499998125000469});
  require_close(vals(p.b.grad()),
                {-1.249999687500078, 0.12499996875000781, 1.999999500000125, -0.49999987500003124});
  // norm_type 1: the sum of |elements| (9 + 7.75), max_norm 5.
  Params one = make_params();
  REQUIRE(clip_grad_norm_(one.list(), 5.0, 1.0) == Approx(16.75).epsilon(1e-15));
  require_close(vals(one.a.grad()), {0.1492537224326136, -0.373134306081534, 0.5970148897304544, 0.8955223345956815,
                                     -0.22388058364892038, 0.44776116729784077});
  require_close(vals(one.b.grad()), {-0.746268612163068, 0.0746268612163068, 1.1940297794609087, -0.2985074448652272});
  // norm_type 3, max_norm 4.5.
  Params three = make_params();
  REQUIRE(clip_grad_norm_(three.list(), 4.5, 3.0) == Approx(4.953103179522205).epsilon(1e-14));
  require_close(vals(three.a.grad()), {0.4542605845647776, -1.135651461411944, 1.8170423382591103, 2.7255635073886655,
                                       -0.6813908768471664, 1.3627817536943327});
  require_close(vals(three.b.grad()), {-2.271302922823888, 0.2271302922823888, 3.6340846765182206, -0.9085211691295552});
}

TEST_CASE("clip_grad_norm_: parameters without gradients, a single tensor, named parameters", "[clip_grad]") {
  // No gradient anywhere: 0, nothing changes.
  Tensor w = zeros({3}, f64).requires_grad_();
  REQUIRE(clip_grad_norm_(TensorList{w}, 1.0) == 0.0);
  REQUIRE(clip_grad_norm_(TensorList{}, 1.0) == 0.0);
  REQUIRE_FALSE(w.grad().defined());
  // One tensor: the overload PyTorch has for it.
  w.set_grad(from_vector<double>({3, 0, 4}));
  REQUIRE(clip_grad_norm_(w, 2.5) == Approx(5.0).epsilon(1e-15));
  require_close(vals(w.grad()), {3 * 2.5 / (5 + 1e-6), 0, 4 * 2.5 / (5 + 1e-6)});
  // An empty gradient adds nothing, also to the infinity norm (which has no maximum of nothing).
  Tensor e = zeros({0, 3}, f64).requires_grad_();
  e.set_grad(zeros({0, 3}, f64));
  w.set_grad(from_vector<double>({3, 0, -4}));
  REQUIRE(clip_grad_norm_(TensorList{e, w}, 10.0, kInf) == 4.0);
  e.set_grad(zeros({0, 3}, f64));
  REQUIRE(clip_grad_norm_(TensorList{e}, 1.0, kInf) == 0.0);
  // A module's named parameters: gradients from a real backward, clipped like the list.
  manual_seed(5);
  nn::Sequential net(nn::Linear(4, 3), nn::Tanh(), nn::Linear(3, 2));
  net.to(f64);
  Tensor x = randn({6, 4}, f64), y = randn({6, 2}, f64);
  nn::mse_loss(net(x), y).backward();
  double want = 0;
  for (const Tensor& p : net.parameters()) want += (p.grad() * p.grad()).sum().item<double>();
  want = std::sqrt(want);
  std::vector<std::vector<double>> before;
  for (const Tensor& p : net.parameters()) before.push_back(vals(p.grad()));
  REQUIRE(clip_grad_norm_(net.named_parameters(), want / 4) == Approx(want).epsilon(1e-14));
  size_t i = 0;
  for (const Tensor& p : net.parameters()) {
    std::vector<double> scaled = before[i++];
    for (double& v : scaled) v *= (want / 4) / (want + 1e-6);
    require_close(vals(p.grad()), scaled);
  }
}

TEST_CASE("clip_grad_norm_: a non-finite total, with and without error_if_nonfinite", "[clip_grad]") {
  // PyTorch: a NaN gradient gives a NaN total and, without the error, NaN gradients everywhere;
  // an infinite one gives an infinite total, a zero coefficient, and inf * 0 = NaN where it was.
  Params p = make_params();
  p.b.grad().data_ptr<double>()[2] = std::nan("");
  REQUIRE_THROWS_WITH(clip_grad_norm_(p.list(), 1.0, 2.0, /*error_if_nonfinite=*/true),
                      "[clip_grad_norm_] the total norm of order 2 of the gradients is nan, so they cannot be clipped "
                      "(pass error_if_nonfinite = false to scale them by it anyway)");
  REQUIRE(vals(p.a.grad()) == std::vector<double>{0.5, -1.25, 2.0, 3.0, -0.75, 1.5});  // untouched by the error
  REQUIRE(std::isnan(clip_grad_norm_(p.list(), 1.0, kInf)));  // the infinity norm sees the NaN too
  for (double v : vals(p.a.grad())) REQUIRE(std::isnan(v));

  Params q = make_params();
  q.b.grad().data_ptr<double>()[2] = kInf;
  REQUIRE_THROWS_WITH(clip_grad_norm_(q.list(), 1.0, kInf, true), Contains("of order inf of the gradients is inf"));
  REQUIRE(clip_grad_norm_(q.list(), 1.0) == kInf);
  REQUIRE(vals(q.a.grad()) == std::vector<double>(6, 0.0));
  const std::vector<double> b = vals(q.b.grad());
  REQUIRE(b[0] == 0.0);
  REQUIRE(b[1] == 0.0);
  REQUIRE(std::isnan(b[2]));
  REQUIRE(b[3] == 0.0);
}

TEST_CASE("clip_grad_norm_: half-precision gradients are measured in f32 and scaled in place", "[clip_grad]") {
  // 300 in f16: its square (9e4) is past f16's range; the norm must still be 500.
  Tensor h = zeros({2}, f16).requires_grad_();
  h.set_grad(from_vector<double>({300, 400}).to(f16));
  REQUIRE(clip_grad_norm_(h, 50.0) == Approx(500.0).epsilon(1e-6));
  REQUIRE(h.grad().dtype() == f16);
  require_close(vals(h.grad()), {30, 40}, 1e-3);
  Tensor bh = zeros({3}, bf16).requires_grad_();
  bh.set_grad(from_vector<double>({1, -2, 2}).to(bf16));
  REQUIRE(clip_grad_norm_(bh, 100.0, kInf) == 2.0);
  REQUIRE(vals(bh.grad()) == std::vector<double>{1, -2, 2});
}

TEST_CASE("clip_grad_norm_: invalid arguments are errors", "[clip_grad]") {
  Params p = make_params();
  REQUIRE_THROWS_WITH(clip_grad_norm_(p.list(), 1.0, 0.0),
                      "[clip_grad_norm_] norm_type must be positive (a p-norm) or infinity, got 0");
  REQUIRE_THROWS_WITH(clip_grad_norm_(p.list(), 1.0, -kInf),
                      "[clip_grad_norm_] norm_type must be positive (a p-norm) or infinity, got -inf");
  REQUIRE_THROWS_WITH(clip_grad_norm_(p.list(), -1.0), "[clip_grad_norm_] max_norm must be non-negative, got -1");
  REQUIRE_THROWS_WITH(clip_grad_norm_(TensorList{p.a, Tensor()}, 1.0),
                      "[clip_grad_norm_] parameter 1 is an undefined tensor");
  REQUIRE(vals(p.a.grad()) == std::vector<double>{0.5, -1.25, 2.0, 3.0, -0.75, 1.5});
}

// fuzz_seq_ops found that an expanded gradient failed in mul_ after the gradients before it had
// been scaled: now every gradient is checked first, and nothing is scaled when one cannot be.
TEST_CASE("clip_grad_norm_: a gradient that cannot be scaled in place is an error, and no gradient is scaled",
          "[clip_grad][fuzz]") {
  Params p = make_params();
  const std::vector<double> a_before = vals(p.a.grad());
  Tensor b = zeros({3}).requires_grad_();
  b.set_grad(full({1}, 100.0).expand({3}));  // strides [0]: one element behind three
  REQUIRE_THROWS_WITH(clip_grad_norm_(TensorList{p.a, b}, 1.0),
                      Catch::StartsWith("[clip_grad_norm_] parameter 1's gradient (shape [3], strides [0]) is an "
                                        "expanded view"));
  REQUIRE(vals(p.a.grad()) == a_before);
  Tensor c = zeros({2}, i64);
  c.set_grad(ones({2}, i64));
  REQUIRE_THROWS_WITH(clip_grad_norm_(TensorList{p.a, c}, 1.0),
                      "[clip_grad_norm_] parameter 1 has i64 gradient; only floating gradients can be clipped");
  REQUIRE(vals(p.a.grad()) == a_before);
}

TEST_CASE("clip_grad_norm_ with an optimizer in backward is an error naming the parameter", "[clip_grad][in_backward]") {
  manual_seed(9);
  nn::Sequential net(nn::Linear(4, 3), nn::ReLU(), nn::Linear(3, 2));
  net.to(f64);
  auto in_backward = optim::apply_optimizer_in_backward(optim::SGDOptions{.lr = 0.1}, {net.parameters()[2]});
  nn::mse_loss(net(randn({5, 4}, f64)), randn({5, 2}, f64)).backward();
  // The stepped parameter's gradient is gone already: the call must not pass as "no gradient".
  REQUIRE_FALSE(net.parameters()[2].grad().defined());
  const Tensor first_grad = net.parameters()[0].grad().clone();
  REQUIRE_THROWS_WITH(clip_grad_norm_(net.named_parameters(), 1e-3),
                      Contains("[clip_grad_norm_] parameter 2.weight (shape [2, 3]) has an optimizer in backward") &&
                          Contains("clip_grad_norm_(), step()"));
  REQUIRE_THROWS_WITH(clip_grad_norm_(net.parameters(), 1e-3),
                      Contains("[clip_grad_norm_] parameter 2 (shape [2, 3]) has an optimizer in backward"));
  REQUIRE(net.parameters()[0].grad().equal(first_grad));  // checked before anything was scaled
  // Once the optimizers are removed the parameter is an ordinary one again.
  in_backward->remove();
  const double total = clip_grad_norm_(net.parameters(), 1e-3);
  REQUIRE(total > 1e-3);
  REQUIRE(clip_grad_norm_(net.parameters(), 1e-3) == Approx(1e-3 * total / (total + 1e-6)).epsilon(1e-12));
}

namespace {

// Row i of a deterministic [rows, cols] batch, the same on every rank and in the reference.
Tensor rows_of(int64_t first, int64_t rows, int64_t cols, double phase) {
  std::vector<double> v;
  for (int64_t i = first; i < first + rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(std::sin(0.37 * static_cast<double>(i) + 1.3 * j + phase));
  return from_vector(v, {rows, cols});
}

std::shared_ptr<nn::Sequential> make_net() {
  manual_seed(21);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(4, 6));
  net->push_back(std::make_shared<nn::Tanh>());
  net->push_back(std::make_shared<nn::Linear>(6, 3));
  net->to(f64);
  return net;
}

constexpr int kRanks = 2, kSteps = 4;
constexpr int64_t kRows = 3;  // per rank and step
constexpr double kMaxNorm = 0.05;

// Rank r's loss at `step` (rank r reads rows (step * kRanks + r) * kRows onwards).
Tensor shard_loss(nn::Module& model, int step, int r) {
  const int64_t first = (step * kRanks + r) * kRows;
  return nn::mse_loss(model(rows_of(first, kRows, 4, 0.0)), rows_of(first, kRows, 3, 0.5));
}

dist::ProcessGroupPtr borrow(dist::ProcessGroup& g) { return dist::ProcessGroupPtr(std::shared_ptr<void>(), &g); }

}  // namespace

TEST_CASE("clip_grad_norm_ after DDP's backward equals clipping in one process", "[clip_grad][ddp]") {
  for (bool bucket_view : {false, true}) {
    INFO("gradient_as_bucket_view " << bucket_view);
    // Each rank: DDP's backward (gradients averaged), clip, SGD step. Results are read on this thread.
    std::vector<std::vector<double>> totals(kRanks);
    std::vector<TensorList> params(kRanks);
    dist::ThreadsOptions o;
    o.timeout = std::chrono::seconds(60);
    dist::run_threads(
        kRanks,
        [&](dist::ProcessGroup& g) {
          const int r = g.rank();
          auto model = make_net();
          dist::DistributedDataParallel ddp(model, borrow(g), {.gradient_as_bucket_view = bucket_view});
          optim::SGD opt(model->parameters(), {.lr = 0.5, .momentum = 0.9});
          for (int step = 0; step < kSteps; ++step) {
            opt.zero_grad(/*set_to_none=*/!bucket_view);
            const int64_t first = (step * kRanks + r) * kRows;
            nn::mse_loss(ddp(rows_of(first, kRows, 4, 0.0)), rows_of(first, kRows, 3, 0.5)).backward();
            totals[static_cast<size_t>(r)].push_back(clip_grad_norm_(model->named_parameters(), kMaxNorm));
            opt.step();
          }
          for (const Tensor& p : model->parameters()) params[static_cast<size_t>(r)].push_back(p.detach().clone());
        },
        o);

    // One process: the mean of every rank's loss, the same clip and step.
    auto reference = make_net();
    optim::SGD opt(reference->parameters(), {.lr = 0.5, .momentum = 0.9});
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      Tensor total_loss = shard_loss(*reference, step, 0);
      for (int r = 1; r < kRanks; ++r) total_loss = total_loss + shard_loss(*reference, step, r);
      (total_loss / static_cast<double>(kRanks)).backward();
      const double total = clip_grad_norm_(reference->parameters(), kMaxNorm);
      REQUIRE(total > kMaxNorm);  // every step clips: the check means something
      for (int r = 0; r < kRanks; ++r) {
        INFO("rank " << r << ", step " << step);
        REQUIRE(totals[static_cast<size_t>(r)][static_cast<size_t>(step)] == Approx(total).epsilon(1e-12));
      }
      opt.step();
    }
    const TensorList want = reference->parameters();
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < want.size(); ++i) {
        INFO("rank " << r << ", parameter " << i);
        require_close(vals(params[static_cast<size_t>(r)][i]), vals(want[i]), 1e-12);
      }
    }
  }
}

TEST_CASE("clip_grad_norm_ under DDP with an optimizer in backward is an error", "[clip_grad][ddp][in_backward]") {
  std::string message;
  dist::run_threads(1, [&](dist::ProcessGroup& g) {
    auto model = make_net();
    auto in_backward = optim::apply_optimizer_in_backward(optim::SGDOptions{.lr = 0.1}, model->parameters());
    dist::DistributedDataParallel ddp(model, borrow(g));
    nn::mse_loss(ddp(rows_of(0, kRows, 4, 0.0)), rows_of(0, kRows, 3, 0.5)).backward();
    try {
      clip_grad_norm_(model->named_parameters(), kMaxNorm);
    } catch (const Error& e) {
      message = e.what();
    }
  });
  REQUIRE_THAT(message, Contains("[clip_grad_norm_] parameter 0.weight (shape [6, 4]) has an optimizer in backward"));
}
