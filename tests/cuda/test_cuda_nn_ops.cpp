// CUDA NN ops (cuda/nn_ops.cu) against the CPU: softmax/log_softmax over every dim, layer norm
// with and without affine parameters, dropout masks, forward and backward, in f32/f64/f16/bf16,
// over row lengths that take each kernel path (warp per row, block per row with the row cached
// in shared memory, block per row reading global memory, unvectorisable lengths).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "core/detail/nn_ops.h"
#include "core/random.h"
#include "cuda_test_util.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::leaf;
using Catch::Contains;
using Catch::StartsWith;

namespace {

using cuda_test::check_op;
using cuda_test::kGPU;
using cuda_test::random;
using cuda_test::require_match;

// Softmax and layer norm reduce over rows: looser than the defaults.
constexpr cuda_test::Tolerances tol_for{.f64 = 1e-10, .f16 = 2e-3, .bf16 = 1.6e-2};

const Dtype kFloats[] = {f32, f64, f16, bf16};

}  // namespace

TEST_CASE("cuda softmax and log_softmax match the CPU over every dim", "[cuda][nn_ops]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : kFloats) {
    INFO("dtype " << dt);
    const double tol = tol_for(dt) * 2;
    Tensor x = random({3, 5, 7}, dt, 3);
    for (int64_t dim : {-1, 0, 1}) {
      INFO("dim " << dim);
      check_op([dim](const TensorList& t) { return softmax(t[0], dim); }, {x}, tol);
      check_op([dim](const TensorList& t) { return log_softmax(t[0], dim); }, {x}, tol);
    }
    // A non-contiguous input is made contiguous first.
    check_op([](const TensorList& t) { return softmax(t[0].transpose(0, 2), -1); }, {x}, tol);
  }
}

TEST_CASE("cuda softmax rows take every kernel path", "[cuda][nn_ops]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  // warp per row (vectorised and not), block per row cached, block per row uncached (> 48 KiB).
  const Shape shapes[] = {{64, 10}, {33, 1024}, {5, 1031}, {8, 3000}, {4, 8192}, {3, 20000}, {2, 20001}};
  for (Dtype dt : {f32, bf16, f16}) {
    for (const Shape& s : shapes) {
      INFO("dtype " << dt << " shape " << fmt::format("{}", s));
      const double tol = tol_for(dt) * 2;
      Tensor x = random(s, dt, 4);
      check_op([](const TensorList& t) { return softmax(t[0], 1); }, {x}, tol);
      check_op([](const TensorList& t) { return log_softmax(t[0], 1); }, {x}, tol);
    }
  }
}

TEST_CASE("cuda layer_norm matches the CPU forward and backward", "[cuda][nn_ops]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : kFloats) {
    INFO("dtype " << dt);
    const double tol = tol_for(dt) * 8;
    Tensor x = random({4, 8, 64}, dt, 2), w = random({64}, dt), b = random({64}, dt);
    check_op([](const TensorList& t) { return layer_norm(t[0], {64}, t[1], t[2]); }, {x, w, b}, tol);
    check_op([](const TensorList& t) { return layer_norm(t[0], {64}); }, {x}, tol);
    check_op([](const TensorList& t) { return layer_norm(t[0], {64}, t[1]); }, {x, w}, tol);
    Tensor w2 = random({8, 64}, dt), b2 = random({8, 64}, dt);
    check_op([](const TensorList& t) { return layer_norm(t[0], {8, 64}, t[1], t[2], 1e-3); }, {x, w2, b2}, tol);
  }
  // Row lengths for each path; many rows so the weight/bias sums split over blocks.
  const Shape shapes[] = {{300, 7}, {1000, 1024}, {17, 3001}, {6, 8192}, {3, 20000}};
  for (Dtype dt : {f32, bf16}) {
    for (const Shape& s : shapes) {
      INFO("dtype " << dt << " shape " << fmt::format("{}", s));
      const double tol = tol_for(dt) * 8;
      Tensor x = random(s, dt, 3), w = random({s[1]}, dt), b = random({s[1]}, dt);
      check_op([n = s[1]](const TensorList& t) { return layer_norm(t[0], {n}, t[1], t[2]); }, {x, w, b},
               tol * (dt == f32 ? 10 : 1));
    }
  }
}

TEST_CASE("cuda dropout draws the CPU's mask for the same seed", "[cuda][nn_ops]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : {f32, bf16}) {
    Tensor x = random({37, 129}, dt);
    const PhiloxState s = get_rng_state();
    Tensor xc = leaf(x.clone());
    Tensor yc = dropout(xc, 0.3, true);
    set_rng_state(s);
    Tensor xd = leaf(x.to(kGPU).detach());
    Tensor yd = dropout(xd, 0.3, true);
    require_match(yd, yc, 0);
    Tensor w = random(yc.shape(), dt);
    yc.backward(w);
    yd.backward(w.to(kGPU));
    require_match(xd.grad(), xc.grad(), 0);
  }
  Tensor x = random({10}, f32).to(kGPU);
  REQUIRE(equal(dropout(x, 0.5, false), x));
  REQUIRE(equal(dropout(x, 1.0, true).to(kCPU), zeros({10})));
}

TEST_CASE("cuda nn ops reject tensors on different devices", "[cuda][nn_ops]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor x = random({4, 16}, f32).to(kGPU);
  Tensor w = random({16}, f32);
  REQUIRE_THROWS_WITH(layer_norm(x, {16}, w), Contains("cpu"));
  Tensor y = softmax(x, 1);
  REQUIRE_THROWS_WITH(detail::softmax_backward_kernel(random({4, 16}, f32), y, 1, false, "softmax_backward"),
                      Contains("different devices"));
  REQUIRE_THROWS_WITH(detail::dropout_kernel(x, rand({4, 16}), 0.5), Contains("different devices"));
}

TEST_CASE("cuda fused cross_entropy matches the CPU's composed one", "[cuda][nn_ops]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  struct Case {
    Shape logits;
    bool weighted;
    double smoothing;
    nn::Reduction reduction;
  };
  const Case cases[] = {
      {{16, 10}, false, 0.0, nn::Reduction::mean},  {{16, 10}, true, 0.0, nn::Reduction::sum},
      {{16, 10}, true, 0.1, nn::Reduction::mean},   {{16, 10}, false, 0.2, nn::Reduction::none},
      {{4, 7, 3, 2}, true, 0.05, nn::Reduction::mean}, {{5, 3000}, true, 0.1, nn::Reduction::mean},
      {{7}, false, 0.1, nn::Reduction::sum},
  };
  for (Dtype dt : {f32, bf16, f64}) {
    for (const Case& c : cases) {
      INFO("dtype " << dt << " logits " << fmt::format("{}", c.logits) << " weighted " << c.weighted
                    << " smoothing " << c.smoothing << " reduction " << static_cast<int>(c.reduction));
      const int64_t classes = c.logits.size() == 1 ? c.logits[0] : c.logits[1];
      Shape tshape;
      if (c.logits.size() > 1) {
        tshape.push_back(c.logits[0]);
        for (size_t d = 2; d < c.logits.size(); ++d) tshape.push_back(c.logits[d]);
      }
      Tensor target = randint(0, classes, tshape, i64);
      if (target.numel() > 2) {
        Tensor flat = target.reshape({-1});
        flat.narrow(0, 1, 1).fill_(Scalar(int64_t{-100}));  // one ignored row
      }
      Tensor weight = c.weighted ? (rand({classes}) + 0.5).to(dt) : Tensor();
      const double tol = tol_for(dt) * (dt == bf16 ? 4 : 10);
      check_op(
          [&](const TensorList& t) {
            nn::CrossEntropyOptions o;
            o.reduction = c.reduction;
            o.label_smoothing = c.smoothing;
            if (weight.defined()) o.weight = t[0].is_cpu() ? weight : weight.to(kGPU);
            return nn::cross_entropy(t[0], t[0].is_cpu() ? target : target.to(kGPU), o);
          },
          {random(c.logits, dt, 2)}, tol);
    }
  }
}

TEST_CASE("cuda cross_entropy and nll_loss: a training step's loss does not sync the host", "[cuda][nn_ops][sync]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(31);
  const Tensor target = from_vector<int64_t>({1, -100, 4, 0, 2, 3}).to(kGPU);  // one ignored row
  const Tensor weight = (rand({5}) + 0.5).to(kGPU);
  Tensor weight_leaf = weight.detach();
  weight_leaf.requires_grad_();  // a weight that needs a gradient: the composed nll_loss path
  Tensor x = random({6, 5}, f32).to(kGPU);
  x.requires_grad_();
  auto step = [&] {
    nn::CrossEntropyOptions plain;  // mean over the kept rows: divides by a device-side count
    nn::CrossEntropyOptions smoothed;
    smoothed.weight = weight;
    smoothed.label_smoothing = 0.1;
    nn::CrossEntropyOptions composed;
    composed.weight = weight_leaf;
    Tensor loss = nn::cross_entropy(x, target, plain) + nn::cross_entropy(x, target, smoothed) +
                  nn::cross_entropy(x, target, composed) + nn::nll_loss(log_softmax(x, 1), target);
    loss.backward();
    return loss;
  };
  (void)step();  // first use of each kernel and of the device's error record
  cuda::synchronize(0);
  const uint64_t before = cuda::host_sync_count();
  Tensor loss = step();
  REQUIRE(cuda::host_sync_count() == before);
  REQUIRE(std::isfinite(loss.to(kCPU).item<double>()));
  REQUIRE(cuda::host_sync_count() == before + 1);
}

TEST_CASE("cuda cross_entropy and nll_loss: out-of-range targets raise at the next sync", "[cuda][nn_ops][errors]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(32);
  const Tensor xc = random({4, 5}, f32);
  const Tensor bad = from_vector<int64_t>({1, 7, -100, 9});  // 5 classes: 7 and 9 are out of range
  const Tensor good = from_vector<int64_t>({1, 4, -100, 0});
  std::string cpu_nll;
  try {
    nn::nll_loss(log_softmax(xc, 1), bad);
  } catch (const Error& e) {
    cpu_nll = e.what();
  }
  REQUIRE(cpu_nll == "[nll_loss] target 7 is out of bounds for 5 classes (expected 0..4 or ignore_index -100)");
  const Tensor badg = bad.to(kGPU), goodg = good.to(kGPU);
  Tensor x = xc.to(kGPU);
  x.requires_grad_();

  // The fused kernel: the op and its backward return, skipping the bad rows; the next sync raises.
  Tensor loss;
  REQUIRE_NOTHROW(loss = nn::cross_entropy(x, badg));
  REQUIRE_NOTHROW(loss.backward());
  REQUIRE_THROWS_WITH(
      loss.to(kCPU),
      "[cross_entropy] target 7 is out of bounds for 5 classes (expected 0..4 or ignore_index -100); detected on "
      "cuda:0 at the next synchronisation (a copy to the host), after the op had returned");
  // The composed path (nll_loss on the device): its own check, the CPU's text.
  Tensor nll = nn::nll_loss(log_softmax(x, 1), badg);
  REQUIRE_THROWS_WITH(cuda::synchronize(0), StartsWith(cpu_nll) && Contains("(cuda::synchronize)"));
  REQUIRE_NOTHROW(nll.to(kCPU));  // reported once

  // The device stays usable: good targets give the CPU's loss and gradient.
  Tensor xcl = xc.clone();
  xcl.requires_grad_();
  Tensor x2 = xc.to(kGPU);
  x2.requires_grad_();
  Tensor want = nn::cross_entropy(xcl, good), got = nn::cross_entropy(x2, goodg);
  want.backward();
  got.backward();
  require_match(got, want, 1e-5);
  require_match(x2.grad(), xcl.grad(), 1e-5);
}
