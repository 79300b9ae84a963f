// Fused optimizer steps on CUDA against the CPU rules (which follow torch.optim): SGD with every
// option, Adam and AdamW with and without AMSGrad, in f32, f64, f16 and bf16, over many
// parameters (several launches), with skipped, empty and non-contiguous parameters, differing
// step counts, and a state dict moved between the devices.
#include <catch2/catch.hpp>

#include <functional>

#include "cuda_test_util.h"
#include "nn/nn.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::require_close;

namespace {

using cuda_test::kGPU;

// Several steps of rounded updates: f16 and bf16 looser than the defaults.
constexpr cuda_test::Tolerances tol_for{.f16 = 3e-3, .bf16 = 2e-2};

// The same parameters on the CPU and on the GPU.
struct Params {
  TensorList cpu, gpu;
};

Params make_params(const std::vector<Shape>& shapes, Dtype dtype) {
  Params ps;
  for (const Shape& s : shapes) {
    Tensor v = to_dtype(randn(s), dtype);
    ps.cpu.push_back(test_util::leaf(v.clone()));
    ps.gpu.push_back(test_util::leaf(v.to(kGPU)));
  }
  return ps;
}

// Sets the same random gradient on both (none where `skip` says so), `steps` times stepping both.
template <class Opt, class Options>
void check_steps(const std::vector<Shape>& shapes, Dtype dtype, const Options& options, int steps = 4,
                 std::function<bool(int step, size_t param)> skip = {}) {
  Params ps = make_params(shapes, dtype);
  Opt cpu(ps.cpu, options), gpu(ps.gpu, options);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (skip && skip(s, i)) {
        ps.cpu[i].set_grad(Tensor());
        ps.gpu[i].set_grad(Tensor());
        continue;
      }
      Tensor g = to_dtype(randn(shapes[i]), dtype);
      ps.cpu[i].set_grad(g);
      ps.gpu[i].set_grad(g.to(kGPU));
    }
    cpu.step();
    gpu.step();
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    INFO("parameter " << i << " shape " << shape_str(shapes[i]) << " " << dtype);
    REQUIRE(ps.gpu[i].device() == kGPU);
    require_close(to_dtype(ps.gpu[i].detach().to(kCPU), f64).to_vector<double>(),
                  to_dtype(ps.cpu[i].detach(), f64).to_vector<double>(), tol_for(dtype));
  }
  // The state matches too (momentum buffers, moments).
  const nn::TensorDict sc = cpu.state_dict(), sg = gpu.state_dict();
  for (const auto& item : sc) {
    const std::string& name = item.first;
    INFO(name);
    REQUIRE(sg.contains(name));
    const Tensor got = to_dtype(sg.at(name).to(kCPU), f64), want = to_dtype(item.second, f64);
    require_close(got.to_vector<double>(), want.to_vector<double>(), tol_for(dtype) * 10);
  }
}

const std::vector<Shape> kShapes = {{7, 5}, {5}, {3, 4, 6}, {1}, {1000}};

}  // namespace

TEST_CASE("cuda SGD: every option matches the CPU", "[cuda][optim]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(1);
  const std::vector<optim::SGDOptions> variants = {
      {.lr = 0.1},
      {.lr = 0.1, .weight_decay = 0.01},
      {.lr = 0.1, .momentum = 0.9},
      {.lr = 0.1, .momentum = 0.9, .dampening = 0.3, .weight_decay = 0.05},
      {.lr = 0.05, .momentum = 0.8, .weight_decay = 0.02, .nesterov = true},
      {.lr = 0.1, .momentum = 0.9, .maximize = true},
  };
  for (Dtype dtype : {f32, f64, f16, bf16}) {
    for (size_t v = 0; v < variants.size(); ++v) {
      INFO("variant " << v << " " << dtype);
      check_steps<optim::SGD>(kShapes, dtype, variants[v]);
    }
  }
}

TEST_CASE("cuda Adam and AdamW: every option matches the CPU", "[cuda][optim]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(2);
  const std::vector<optim::AdamOptions> adam = {
      {.lr = 0.01},
      {.lr = 0.01, .weight_decay = 0.1},
      {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .amsgrad = true},
      {.lr = 0.01, .maximize = true},
  };
  const std::vector<optim::AdamWOptions> adamw = {
      {.lr = 0.01},
      {.lr = 0.01, .weight_decay = 0.1, .amsgrad = true},
      {.lr = 0.003, .beta1 = 0.5, .weight_decay = 0, .maximize = true},
  };
  for (Dtype dtype : {f32, f64, f16, bf16}) {
    for (size_t v = 0; v < adam.size(); ++v) {
      INFO("Adam variant " << v << " " << dtype);
      check_steps<optim::Adam>(kShapes, dtype, adam[v]);
    }
    for (size_t v = 0; v < adamw.size(); ++v) {
      INFO("AdamW variant " << v << " " << dtype);
      check_steps<optim::AdamW>(kShapes, dtype, adamw[v]);
    }
  }
}

TEST_CASE("cuda optimizers: many parameters, skipped and empty ones, differing step counts", "[cuda][optim]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(3);
  // 130 parameters: three launches of the multi-tensor kernel; a big one beside tiny ones.
  std::vector<Shape> shapes;
  for (int i = 0; i < 130; ++i) shapes.push_back(i % 17 == 0 ? Shape{1 << 16} : Shape{i % 5 + 1, 3});
  shapes.push_back({0, 4});
  // Parameter i has no gradient at step s when (i + s) % 7 == 0: it keeps its value that step,
  // and for Adam its step count (so its bias corrections) lags the others'.
  auto skip = [](int s, size_t i) { return (i + s) % 7 == 0; };
  check_steps<optim::SGD>(shapes, f32, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}, 5, skip);
  check_steps<optim::AdamW>(shapes, f32, optim::AdamWOptions{.lr = 0.01, .amsgrad = true}, 5, skip);
  check_steps<optim::Adam>(shapes, bf16, optim::AdamOptions{.lr = 0.01, .weight_decay = 0.01}, 5, skip);
}

TEST_CASE("cuda optimizers: parameters on several dtypes in one group", "[cuda][optim]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(4);
  Tensor a = test_util::leaf(randn({4, 3}).to(kGPU)), b = test_util::leaf(to_dtype(randn({5}), bf16).to(kGPU));
  Tensor ca = test_util::leaf(a.detach().to(kCPU)), cb = test_util::leaf(b.detach().to(kCPU));
  optim::AdamW gpu({a, b}, {.lr = 0.01}), cpu({ca, cb}, {.lr = 0.01});
  for (int s = 0; s < 3; ++s) {
    Tensor ga = randn({4, 3}), gb = to_dtype(randn({5}), bf16);
    a.set_grad(ga.to(kGPU));
    b.set_grad(gb.to(kGPU));
    ca.set_grad(ga);
    cb.set_grad(gb);
    gpu.step();
    cpu.step();
  }
  require_close(a.detach().to(kCPU).to_vector<double>(), ca.detach().to_vector<double>(), tol_for(f32));
  require_close(to_dtype(b.detach().to(kCPU), f64).to_vector<double>(), to_dtype(cb.detach(), f64).to_vector<double>(),
                tol_for(bf16));
}

TEST_CASE("cuda optimizers: a non-contiguous parameter takes the general path", "[cuda][optim]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(5);
  Tensor base = randn({4, 6});
  Tensor p = base.to(kGPU).t();  // a non-contiguous leaf
  p.requires_grad_();
  Tensor cp = test_util::leaf(base.t().contiguous());
  REQUIRE_FALSE(p.is_contiguous());
  optim::SGD gpu({p}, {.lr = 0.1, .momentum = 0.9}), cpu({cp}, {.lr = 0.1, .momentum = 0.9});
  for (int s = 0; s < 3; ++s) {
    Tensor g = randn({6, 4});
    p.set_grad(g.to(kGPU));
    cp.set_grad(g);
    gpu.step();
    cpu.step();
  }
  require_close(p.detach().to(kCPU).contiguous().to_vector<double>(), cp.detach().to_vector<double>(), tol_for(f32));
}

TEST_CASE("cuda optimizers: a state dict moves between CPU and GPU and training continues alike", "[cuda][optim]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(6);
  Params ps = make_params({{8, 3}, {3}}, f32);
  optim::AdamW cpu(ps.cpu, {.lr = 0.01}), gpu(ps.gpu, {.lr = 0.01});
  auto step_both = [&] {
    for (size_t i = 0; i < ps.cpu.size(); ++i) {
      Tensor g = randn(ps.cpu[i].shape());
      ps.cpu[i].set_grad(g);
      ps.gpu[i].set_grad(g.to(kGPU));
    }
    cpu.step();
    gpu.step();
  };
  step_both();
  step_both();
  // Reload the CPU optimizer's state into the GPU one: its buffers land on the GPU.
  gpu.load_state_dict(cpu.state_dict());
  REQUIRE(gpu.state(ps.gpu[0])->buffers.at("exp_avg").device() == kGPU);
  step_both();
  for (size_t i = 0; i < ps.cpu.size(); ++i) {
    require_close(ps.gpu[i].detach().to(kCPU).to_vector<double>(), ps.cpu[i].detach().to_vector<double>(),
                  tol_for(f32));
  }
}
