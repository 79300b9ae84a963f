// DDP on CUDA tensors: over nccl (a world of one on one GPU) and over the mpi backend with CUDA
// tensors staged through host memory ("[cuda_mpi]": CTest runs those under mpirun -np 2, two ranks
// sharing the GPU). Both must end where one process training on the CPU ends.
#include <catch2/catch.hpp>

#include "../dist/ddp_cases.h"
#include "../dist/ddp_hardening_cases.h"
#include "cuda_test_util.h"
#include "dist/nccl/nccl.h"

using namespace tandem;
using namespace tandem::dist;
using namespace ddp_cases;
using nn::mse_loss;

namespace {

// Trains a Net copy on `device` with DDP over `g` (every rank on its shard) and a CPU reference on
// the mean of every rank's loss; compares the parameters.
// With `compress`, the buckets go over the wire in f16 (hooks::fp16_compress), within 2e-3.
void cuda_equivalence(ProcessGroupPtr g, bool bucket_view, bool find_unused, bool compress = false) {
  const int W = g->size(), R = g->rank();
  const Device dev = Device::cuda(cuda::current_device());
  auto uses_extra = [find_unused](int r) { return !find_unused || r % 2 == 1; };
  auto model = make_net(f32, 7);
  auto reference = make_net(f32, 7);
  for (auto* m : {model.get(), reference.get()}) {
    m->use_extra = uses_extra;
    if (!find_unused) {
      m->never->weight.requires_grad_(false);
      m->never->bias.requires_grad_(false);
    }
  }
  model->rank = R;
  model->to(dev);
  DdpOptions o;
  o.bucket_cap_mb = 0.0005;  // several buckets
  o.gradient_as_bucket_view = bucket_view;
  o.find_unused_parameters = find_unused;
  DistributedDataParallel ddp(model, g, o);
  if (compress) ddp.register_comm_hook(hooks::fp16_compress);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad(!bucket_view);
    int64_t first = ((step * 4) * 16 + R) * kRowsPerRank;
    mse_loss(ddp(inputs(first, kRowsPerRank, 8, f32).to(dev)), targets(first, kRowsPerRank, 4, f32).to(dev)).backward();
    ddp.check_reducer_finalized();
    opt.step();
    reference_step(*reference, ref_opt, step, W, 1, uses_extra, f32);
  }
  auto got = model->named_parameters();
  for (const auto& [name, want] : reference->named_parameters()) {
    double d = max_abs_diff(got.at(name).to(kCPU), want);
    INFO(name << " (bucket_view " << bucket_view << ", find_unused " << find_unused << ", compress " << compress
              << ", rank " << R << ")");
    CHECK(d < (compress ? 5e-3 : 1e-4));  // f16 gradients: ~2e-3 per step, 5 steps of momentum 0.9
    CHECK(got.at(name).device() == dev);
  }
  if (find_unused) CHECK_FALSE(model->never->weight.grad().defined());
}

// Mixed precision (bf16 shadows of f32 masters) and the optimizer in backward on CUDA tensors,
// against f32 training of one process on the CPU.
void cuda_modes(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const Device dev = Device::cuda(cuda::current_device());
  for (bool mixed : {true, false}) {
    auto model = make_net(f32, 7);
    auto reference = make_net(f32, 7);
    for (auto* m : {model.get(), reference.get()}) {
      m->never->weight.requires_grad_(false);
      m->never->bias.requires_grad_(false);
    }
    model->to(dev);
    std::shared_ptr<optim::InBackwardOptimizers> in_backward;
    if (!mixed) {
      TensorList trainable;
      for (const Tensor& p : model->parameters())
        if (p.requires_grad()) trainable.push_back(p);
      in_backward = optim::apply_optimizer_in_backward(optim::SGDOptions{.lr = 0.1, .momentum = 0.9}, trainable);
    }
    DdpOptions o;
    o.bucket_cap_mb = 0.0005;
    if (mixed) o.mixed_precision = MixedPrecision{.param_dtype = bf16};
    DistributedDataParallel ddp(model, g, o);
    optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 5; ++step) {
      if (mixed) opt.zero_grad();
      int64_t first = ((step * 4) * 16 + R) * kRowsPerRank;
      Tensor out = ddp(inputs(first, kRowsPerRank, 8, f32).to(dev));
      if (mixed) CHECK(out.dtype() == bf16);
      mse_loss(out.to(f32), targets(first, kRowsPerRank, 4, f32).to(dev)).backward();
      ddp.check_reducer_finalized();
      if (mixed) {
        CHECK(model->fc1->weight.dtype() == f32);
        opt.step();
      } else {
        CHECK_FALSE(model->fc1->weight.grad().defined());
      }
      reference_step(*reference, ref_opt, step, W, 1, [](int) { return true; }, f32);
    }
    auto got = model->named_parameters();
    for (const auto& [name, want] : reference->named_parameters()) {
      INFO(name << (mixed ? " (bf16 mixed precision)" : " (SGD in backward)") << ", rank " << R);
      CHECK(max_abs_diff(got.at(name).to(kCPU), want) < (mixed ? 3e-2 : 1e-4));
      CHECK(got.at(name).device() == dev);
    }
  }
}

// Mixed precision's casts run on a side stream, and each layer's forward waits for its own batch:
// inside every layer's forward (a pre-forward hook registered after DDP's, reading on the current
// stream) its parameters are exactly this step's masters in bf16. The layers are large enough that
// a missing wait would read shadows still being written, or last step's.
void cuda_side_stream_casts(ProcessGroupPtr g) {
  const Device dev = Device::cuda(cuda::current_device());
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>();
  std::vector<std::shared_ptr<nn::Linear>> layers;
  for (int i = 0; i < 4; ++i) {
    layers.push_back(std::make_shared<nn::Linear>(1024, 1024));
    model->push_back(layers.back());
  }
  model->to(dev);
  DdpOptions o;
  o.mixed_precision = MixedPrecision{.param_dtype = bf16};
  DistributedDataParallel ddp(model, g, o);
  std::vector<Tensor> masters(layers.size());
  std::vector<double> diffs(layers.size(), -1);
  std::vector<HookHandle> checks;
  for (size_t k = 0; k < layers.size(); ++k)
    checks.push_back(layers[k]->register_forward_pre_hook([&, k](nn::Module&) {
      diffs[k] = max_abs_diff(layers[k]->weight.to(kCPU), masters[k]);
    }));
  optim::SGD opt(model->parameters(), {.lr = 0.5});
  for (int step = 0; step < 4; ++step) {
    for (size_t k = 0; k < layers.size(); ++k) masters[k] = layers[k]->weight.detach().to(bf16).to(kCPU);
    opt.zero_grad();
    Tensor x = randn({64, 1024}).to(dev);
    pow(ddp(x).to(f32), 2).mean().backward();
    opt.step();
    for (size_t k = 0; k < layers.size(); ++k) {
      INFO("step " << step << ", layer " << k << ", rank " << g->rank());
      CHECK(diffs[k] == 0);
    }
  }
}

// An embedding some ranks skip on some steps, its gradient reduced by the delayed allreduce (on a
// child group: over nccl a second communicator) with find_unused_parameters. The delayed allreduce
// must be issued at the same point on every rank, after the buckets' collectives: launched
// mid-backward on one rank and at the end on another, two communicators can be ordered
// differently on two GPUs, which NCCL documents as a possible deadlock (likelier with
// CUDA_DEVICE_MAX_CONNECTIONS=1, which tools/ci/gpu-check.sh sets for this case). 50 steps against
// one process on the CPU.
void cuda_delayed_sometimes_used(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const Device dev = Device::cuda(cuda::current_device());
  auto uses = [](int step, int r) { return (step + r) % 3 != 0; };
  manual_seed(12);
  auto model = std::make_shared<GatedEmbedding>();  // tests/dist/ddp_hardening_cases.h
  manual_seed(12);
  auto reference = std::make_shared<GatedEmbedding>();
  model->to(dev);
  DdpOptions o;
  o.find_unused_parameters = true;
  o.delay_all_reduce_named_params = {"emb.weight"};
  o.param_to_hook_all_reduce = "emb.weight";
  o.bucket_cap_mb = 0.0005;
  DistributedDataParallel ddp(model, g, o);
  optim::SGD opt(model->parameters(), {.lr = 0.05});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.05});
  auto tokens = [](int step, int r) {
    std::vector<int64_t> v;
    for (int i = 0; i < 5; ++i) v.push_back((step * 7 + r * 3 + i * 4) % 20);
    return from_vector(v);
  };
  for (int step = 0; step < 50; ++step) {
    opt.zero_grad();
    model->embed = uses(step, R);
    mse_loss(ddp(tokens(step, R).to(dev)), targets(step * 16 + R, 5, 4, f32).to(dev)).backward();
    ddp.check_reducer_finalized();
    opt.step();
    ref_opt.zero_grad();
    Tensor total;
    for (int r = 0; r < W; ++r) {
      reference->embed = uses(step, r);
      Tensor l = mse_loss((*reference)(tokens(step, r)), targets(step * 16 + r, 5, 4, f32));
      total = total.defined() ? total + l : l;
    }
    (total / static_cast<double>(W)).backward();
    ref_opt.step();
  }
  CHECK(ddp.delayed_allreduce()->launches() == 50);
  auto got = model->named_parameters();
  for (const auto& [name, want] : reference->named_parameters()) {
    INFO(name << ", rank " << R);
    CHECK(max_abs_diff(got.at(name).to(kCPU), want) < 1e-4);
  }
}

// dist::init runs once per process: both mpi cases share its world.
ProcessGroupPtr staged_mpi_world() {
  static ProcessGroupPtr world = init(InitOptions{"mpi", std::chrono::seconds(60), {}});
  return world;
}

}  // namespace

TEST_CASE("ddp cuda: mixed precision and optimizer in backward over nccl, a world of one", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  InitOptions io;
  io.timeout = std::chrono::seconds(60);
  cuda_modes(make_nccl_world(io));
}

TEST_CASE("ddp cuda: mixed precision casts on a side stream, waited for by each layer before it reads", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  InitOptions io;
  io.timeout = std::chrono::seconds(60);
  cuda_side_stream_casts(make_nccl_world(io));
}

TEST_CASE("ddp cuda: over nccl, a world of one, equals CPU training", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  InitOptions io;
  io.timeout = std::chrono::seconds(60);
  ProcessGroupPtr g = make_nccl_world(io);
  for (bool view : {false, true})
    for (bool unused : {false, true}) cuda_equivalence(g, view, unused);
}

// The compress hook's cast back runs on the group's step stream, which DDP joins: before, it ran on
// the watchdog thread's current stream, unordered with a training loop on a stream of its own. (At
// world size 1 a lost cast back would leave the unrounded gradient, so this checks the path works
// on a user's stream; the ordering itself is the step stream's test in test_cuda_nccl.)
TEST_CASE("ddp cuda: fp16_compress over nccl, training on a stream of the user's, equals CPU training", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  InitOptions io;
  io.timeout = std::chrono::seconds(60);
  ProcessGroupPtr g = make_nccl_world(io);
  cuda::Stream user = cuda::Stream::create(cuda::current_device());
  cuda::StreamGuard guard(user);
  for (bool view : {false, true}) cuda_equivalence(g, view, /*find_unused=*/false, /*compress=*/true);
}

TEST_CASE("ddp cuda: over mpi with CUDA tensors staged through the host", "[cuda][cuda_mpi]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  ProcessGroupPtr world = staged_mpi_world();
  for (bool view : {false, true})
    for (bool unused : {false, true}) cuda_equivalence(world, view, unused);
}

TEST_CASE("ddp cuda: mixed precision and optimizer in backward over mpi with staged CUDA tensors",
          "[cuda][cuda_mpi]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  cuda_modes(staged_mpi_world());
}

TEST_CASE("ddp cuda: delayed allreduce with a sometimes-used embedding, 50 steps", "[cuda][cuda_mpi]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  cuda_delayed_sometimes_used(staged_mpi_world());
}

TEST_CASE("ddp cuda: delayed allreduce on its own nccl communicator, a world of one, 50 steps", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  InitOptions io;
  io.timeout = std::chrono::seconds(60);
  cuda_delayed_sometimes_used(make_nccl_world(io));
}
