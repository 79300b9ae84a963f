// CUDA convolution and pooling (cuda/conv.cu, cuda/pool.cu, conv2d's GEMMs through cuBLAS) against the CPU:
// forward and the gradient of every input, in f32/f64/f16/bf16, over the shapes that take each
// path (grouped, strided, dilated, padded, 1x1 read in place), plus the modules on the device and
// the device checks.
#include <catch2/catch.hpp>

#include "core/detail/pool.h"  // the raw pooling kernels, compared on both devices
#include "cuda_test_util.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using Catch::Contains;

namespace {

using cuda_test::check_op;
using cuda_test::kGPU;
using cuda_test::random;

// conv2d sums C kh kw products per output: looser than the elementwise defaults. cuBLAS runs
// f32 without TF32 unless asked to, so f32 stays tight.
constexpr cuda_test::Tolerances tol_for{.f64 = 1e-10, .f32 = 1e-4, .f16 = 1e-2, .bf16 = 5e-2};

const Dtype kFloats[] = {f32, f64, f16, bf16};

struct ConvCase {
  Shape x, w;
  bool bias;
  Size2 stride, padding, dilation;
  int64_t groups;
};

const ConvCase kConvCases[] = {
    {{2, 3, 9, 8}, {4, 3, 3, 3}, true, 1, 1, 1, 1},
    {{2, 4, 9, 8}, {6, 2, 3, 2}, true, {2, 1}, {1, 2}, {1, 2}, 2},
    {{3, 8, 6, 6}, {5, 8, 1, 1}, true, 1, 0, 1, 1},  // 1x1: the input is its own column matrix
    {{2, 4, 7, 7}, {4, 1, 3, 3}, false, 2, 1, 1, 4},  // depthwise
    {{1, 3, 12, 10}, {2, 3, 5, 3}, true, {3, 2}, {2, 0}, {1, 2}, 1},
};

}  // namespace

TEST_CASE("cuda conv2d matches the CPU forward and backward", "[cuda][conv]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : kFloats) {
    for (const ConvCase& c : kConvCases) {
      INFO("dtype " << dt << " x " << fmt::format("{}", c.x) << " w " << fmt::format("{}", c.w) << " groups "
                    << c.groups);
      TensorList in{random(c.x, dt), random(c.w, dt, 0.3)};
      if (c.bias) in.push_back(random({c.w[0]}, dt));
      check_op(
          [&c](const TensorList& t) {
            return conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups);
          },
          in, tol_for(dt));
    }
  }
  // Unbatched and non-contiguous inputs.
  check_op([](const TensorList& t) { return conv2d(t[0], t[1], t[2], 1, 1); },
           {random({3, 8, 8}, f32), random({4, 3, 3, 3}, f32), random({4}, f32)}, tol_for(f32));
  check_op([](const TensorList& t) { return conv2d(t[0].transpose(2, 3), t[1], Tensor(), 2, 1); },
           {random({2, 3, 7, 9}, f32), random({4, 3, 3, 3}, f32)}, tol_for(f32));
}

TEST_CASE("cuda pooling matches the CPU forward and backward", "[cuda][conv][pool]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : kFloats) {
    INFO("dtype " << dt);
    const double tol = tol_for(dt);
    Tensor x = random({2, 3, 11, 10}, dt);
    check_op([](const TensorList& t) { return max_pool2d(t[0], 2); }, {x}, tol);
    check_op([](const TensorList& t) { return max_pool2d(t[0], 3, 2, 1, 1, true); }, {x}, tol);
    check_op([](const TensorList& t) { return max_pool2d(t[0], {3, 2}, Size2{1, 2}, {1, 0}, {2, 1}); }, {x}, tol);
    check_op([](const TensorList& t) { return avg_pool2d(t[0], 3, 2, 1); }, {x}, tol);
    check_op([](const TensorList& t) { return avg_pool2d(t[0], 3, 2, 1, true, false); }, {x}, tol);
    check_op([](const TensorList& t) { return avg_pool2d(t[0], {2, 3}, Size2{2, 1}, {1, 0}, false, true, 4); }, {x},
             tol);
    check_op([](const TensorList& t) { return adaptive_avg_pool2d(t[0], {3, 4}); }, {x}, tol);
    check_op([](const TensorList& t) { return adaptive_avg_pool2d(t[0], {13, 17}); }, {x}, tol);  // upsampling
    check_op([](const TensorList& t) { return adaptive_avg_pool2d(t[0], 1); }, {x}, tol);
  }
  // Ties: the same first maximum (and so the same indices and gradients) on both devices.
  Tensor ties = to_dtype(randint(0, 3, {2, 2, 9, 9}), f32);
  auto [yc, ic] = max_pool2d_with_indices(ties, 3, 2, 1);
  auto [yd, id] = max_pool2d_with_indices(ties.to(kGPU), 3, 2, 1);
  cuda_test::require_match(yd, yc, 0);
  cuda_test::require_match(id, ic, 0);
  check_op([](const TensorList& t) { return max_pool2d(t[0], 3, 1, 1); }, {ties}, 0);
}

TEST_CASE("cuda conv modules train like the CPU ones", "[cuda][conv][nn]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(3);
  auto make = [] {
    manual_seed(4);
    return std::make_shared<nn::Sequential>(nn::Conv2d(3, 8, 3, 1, 1), nn::BatchNorm2d(8), nn::ReLU(),
                                            nn::MaxPool2d(2), nn::Conv2d(8, 8, 3, 2, 1, 1, 2), nn::ReLU(),
                                            nn::AvgPool2d(2), nn::AdaptiveAvgPool2d(1), nn::Flatten(),
                                            nn::Linear(8, 4));
  };
  auto cpu = make(), gpu = make();
  gpu->to(kGPU);
  optim::SGD opt_cpu(cpu->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  optim::SGD opt_gpu(gpu->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  Tensor x = random({6, 3, 16, 16}, f32), y = randint(0, 4, {6});
  for (int step = 0; step < 3; ++step) {
    opt_cpu.zero_grad();
    opt_gpu.zero_grad();
    Tensor lc = nn::cross_entropy((*cpu)(x), y);
    Tensor lg = nn::cross_entropy((*gpu)(x.to(kGPU)), y.to(kGPU));
    REQUIRE(lg.to(kCPU).item<float>() == Approx(lc.item<float>()).epsilon(1e-4));
    lc.backward();
    lg.backward();
    auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
    for (const auto& [name, p] : pc) {
      INFO("step " << step << ", gradient of " << name);
      cuda_test::require_match(pg.at(name).grad(), p.grad(), 1e-3);
    }
    opt_cpu.step();
    opt_gpu.step();
  }
  auto bc = cpu->named_buffers(), bg = gpu->named_buffers();
  for (const auto& [name, b] : bc) {
    INFO("buffer " << name);
    cuda_test::require_match(bg.at(name), b, 1e-4);
  }
}

TEST_CASE("cuda conv2d and pooling reject tensors on different devices", "[cuda][conv]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor x = random({1, 3, 8, 8}, f32).to(kGPU);
  REQUIRE_THROWS_WITH(conv2d(x, random({4, 3, 3, 3}, f32)),
                      Contains("[conv2d] tensors are on different devices: input on cuda:0, weight on cpu"));
  REQUIRE_THROWS_WITH(conv2d(x, random({4, 3, 3, 3}, f32).to(kGPU), random({4}, f32)),
                      Contains("[conv2d] tensors are on different devices: input on cuda:0, bias on cpu"));
  auto [y, idx] = max_pool2d_with_indices(x, 2);
  REQUIRE_THROWS_WITH(detail::max_pool2d_backward_kernel(y.to(kCPU), idx, x, detail::Pool2dArgs{2}),
                      Contains("different devices"));
}
