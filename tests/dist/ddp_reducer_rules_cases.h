// The reducer rules behind DDP's modes: several synchronised forwards before one backward need
// static_graph under find_unused_parameters, "used" means the parameter's hook fired, which
// backward is DDP's, grad mode off, a DDP driven from another thread, requires_grad that differs
// across ranks, a forward after remove_autograd_hooks. Shared by test_ddp (threads backend) and
// test_ddp_mpi (mpirun) through ddp_case_table.h; each case runs on every rank and throws on a
// failed check; equivalence is against one process computing every rank's loss.
#pragma once

#include <string>
#include <thread>

#include "ddp_cases.h"

namespace ddp_cases {

// With a dynamic find_unused_parameters (no static_graph), a backward over two synchronised
// forwards is an error suggesting static_graph (without find_unused it is allowed:
// two_forwards_without_static_graph).
inline void two_forwards_need_static_graph(ProcessGroupPtr g) {
  auto model = make_net_without_never(f64);
  DistributedDataParallel ddp(model, g, {.find_unused_parameters = true});
  Tensor a = ddp(inputs(0, 4, 8, f64)).sum();
  Tensor b = ddp(inputs(4, 4, 8, f64)).sum();
  std::string error;
  try {
    (a + b).backward();
  } catch (const std::exception& e) {
    error = e.what();
  }
  expect(error.find("reaches the outputs of 2 synchronised forwards") != std::string::npos &&
             error.find("static_graph=true") != std::string::npos &&
             error.find("find_unused_parameters") != std::string::npos,
         "two forwards with find_unused_parameters, without static_graph: got '{}'", error);
  // The iteration was dropped before any gradient: DDP goes on.
  model->zero_grad();
  mse_loss(ddp(inputs(8, 4, 8, f64)), targets(8, 4, 4, f64)).backward();
  ddp.check_reducer_finalized();
}

// Passes its input through but returns no gradient for it: the parameters before it are reached
// by the backward, yet their hooks never fire.
struct NoGradThrough : autograd::Function<NoGradThrough> {
  static Tensor forward(autograd::AutogradContext&, const Tensor& x) { return x * 1.0; }
  static TensorList backward(autograd::AutogradContext&, const TensorList&) { return {Tensor()}; }
};
struct Blocked : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  Blocked() : Module("Blocked") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 4));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(NoGradThrough::apply(tanh((*fc1)(x)))); }
};

// "Used" is "its hook fired": with find_unused_parameters a reachable parameter that gets no
// gradient does not stall the reduction, and keeps .grad none.
inline void reachable_without_gradient(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  manual_seed(11);
  auto model = std::make_shared<Blocked>();
  model->to(f64);
  manual_seed(11);
  auto reference = std::make_shared<Blocked>();
  reference->to(f64);
  DistributedDataParallel ddp(model, g, {.find_unused_parameters = true});
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    mse_loss(ddp(inputs(step * 16 + R * 4, 4, 8, f64)), targets(step * 16 + R * 4, 4, 4, f64)).backward();
    ddp.check_reducer_finalized();
    opt.step();
    ref_opt.zero_grad();
    reference_backward(W, 1, [&](int r, int) {
      return mse_loss((*reference)(inputs(step * 16 + r * 4, 4, 8, f64)), targets(step * 16 + r * 4, 4, 4, f64));
    });
    ref_opt.step();
  }
  expect(!model->fc1->weight.grad().defined(), "fc1 got no gradient anywhere, but its .grad is defined");
  expect_same_parameters(*model, *reference, 1e-12, fmt::format("reachable without gradient, rank {}", R));
}

// The last rank freezes one parameter: construction fails naming it, on every rank.
inline void requires_grad_mismatch(ProcessGroupPtr g) {
  if (g->size() == 1) return;
  auto model = make_net(f64);
  if (g->rank() == g->size() - 1) model->extra->bias.requires_grad_(false);
  std::string error;
  try {
    DistributedDataParallel ddp(model, g, {.find_unused_parameters = true});
  } catch (const std::exception& e) {
    error = e.what();
  }
  expect(error.find("[ddp] the model differs across ranks") != std::string::npos &&
             error.find("extra.bias") != std::string::npos && error.find("requires_grad=false") != std::string::npos,
         "rank {}: requires_grad mismatch gave '{}'", g->rank(), error);
}

// Built on the rank's thread, trained and destroyed on another: find_unused still sees the
// backward start, and nothing dangles afterwards.
inline void driven_from_another_thread(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  auto uses_extra = [](int r) { return r % 2 == 1; };
  auto model = make_net(f64);
  model->rank = R;
  model->use_extra = uses_extra;
  auto reference = make_net(f64);
  auto ddp = std::make_unique<DistributedDataParallel>(model, g, DdpOptions{.find_unused_parameters = true});
  std::string error;
  std::thread worker([&] {
    try {
      optim::SGD opt(model->parameters(), {.lr = 0.1});
      optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        ddp->call([&] { return shard_loss(*model, step, R, f64); }).backward();
        ddp->check_reducer_finalized();
        opt.step();
        reference_step(*reference, ref_opt, step, W, 1, uses_extra);
      }
      ddp.reset();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  worker.join();
  expect(error.empty(), "rank {}: DDP driven from another thread: {}", R, error);
  expect_same_parameters(*model, *reference, 1e-12, fmt::format("another thread, rank {}", R));
  // The destroyed DDP left no observer behind: a local backward here must not touch it.
  model->zero_grad();
  shard_loss(*model, 0, R, f64).backward();
}

// Rank 0 alone evaluates under NoGradGuard (also right when the one bucket rebuild is due):
// no collective, so nobody waits; then both ranks train on.
inline void rank0_evaluates_without_grad(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  auto model = make_net_without_never(f64);
  auto reference = make_net_without_never(f64);
  DistributedDataParallel ddp(model, g, {.bucket_cap_mb = 1e-9});
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    if (R == 0) {
      NoGradGuard ng;
      for (int k = 0; k < 3; ++k) ddp(inputs(k, 4, 8, f64));
    }
    opt.zero_grad();
    shard_loss(ddp.module(), step, R, f64);
    mse_loss(ddp(inputs(((step * 4) * 16 + R) * kRowsPerRank, kRowsPerRank, 8, f64)),
             targets(((step * 4) * 16 + R) * kRowsPerRank, kRowsPerRank, 4, f64))
        .backward();
    ddp.check_reducer_finalized();
    opt.step();
    reference_step(*reference, ref_opt, step, W, 1, [](int) { return true; });
  }
  expect_same_parameters(*model, *reference, 1e-12, fmt::format("rank-0 evaluation, rank {}", R));
}

// Only the backward of a synchronised forward's output is DDP's: a backward through another
// model that shares the parameters is not adopted; a forward never backwarded is forgiven; a
// backward that threw leaves the next iteration intact.
inline void which_backward_is_ddps(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  auto model = make_net_without_never(f64);
  auto reference = make_net_without_never(f64);
  DistributedDataParallel ddp(model, g, {});
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  for (int step = 0; step < 4; ++step) {
    // A forward in grad mode that is never backwarded: forgiven.
    ddp(inputs(100 + step, 4, 8, f64));
    if (step == 1) {
      // A backward that throws half way (every rank): the next iteration still reduces.
      Tensor out = ddp(inputs(200, 4, 8, f64));
      auto bomb = register_hook(out, [](const Tensor&) -> Tensor { throw std::runtime_error("boom"); });
      bool threw = false;
      try {
        out.sum().backward();
      } catch (const std::exception&) {
        threw = true;
      }
      expect(threw, "the bomb did not go off");
    }
    opt.zero_grad();
    Tensor out = ddp(inputs(((step * 4) * 16 + R) * kRowsPerRank, kRowsPerRank, 8, f64));
    // Another model sharing fc1 and fc2 (not through DDP), backwarded before DDP's own backward.
    {
      Tensor other = (*model->fc2)(tanh((*model->fc1)(inputs(300, 4, 8, f64)))).sum();
      other.backward();
      expect(count_events(ddp.reducer_events(), ReducerEvent::backward_started) == 0,
             "rank {}: DDP adopted a backward that does not reach its forward's output", R);
      opt.zero_grad();
    }
    mse_loss(out, targets(((step * 4) * 16 + R) * kRowsPerRank, kRowsPerRank, 4, f64)).backward();
    ddp.check_reducer_finalized();
    opt.step();
    reference_step(*reference, ref_opt, step, W, 1, [](int) { return true; });
  }
  expect_same_parameters(*model, *reference, 1e-12, fmt::format("which backward, rank {}", R));
}

// A forward after remove_autograd_hooks fails at once on the rank that calls it, before any
// broadcast (a peer that does not call it must not be waited for).
inline void forward_after_removal_fails_first(ProcessGroupPtr g) {
  auto model = make_net(f64);
  DistributedDataParallel ddp(model, g, {.find_unused_parameters = true});
  ddp.remove_autograd_hooks();
  if (g->rank() != 0) return;
  std::string error;
  try {
    ddp(inputs(0, 4, 8, f64));
  } catch (const std::exception& e) {
    error = e.what();
  }
  expect(error.find("[ddp] the autograd hooks were removed") != std::string::npos, "got '{}'", error);
}

inline void reducer_rules(ProcessGroupPtr g) {
  two_forwards_need_static_graph(g);
  reachable_without_gradient(g);
  requires_grad_mismatch(g);
  driven_from_another_thread(g);
  rank0_evaluates_without_grad(g);
  which_backward_is_ddps(g);
  forward_after_removal_fails_first(g);
}

}  // namespace ddp_cases
