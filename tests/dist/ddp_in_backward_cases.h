// The optimizer in backward under DDP (optim::apply_optimizer_in_backward, then DDP): equal to one
// process taking plain steps, for SGD, Adam and AdamW, with no_sync, static_graph, unused
// parameters, a comm hook and ignored parameters; the error of applying it after DDP. Shared by
// test_ddp (threads backend) and test_ddp_mpi (mpirun) through ddp_case_table.h; each case runs on
// every rank and throws on a failed check; equivalence is against one process computing every
// rank's loss.
#pragma once

#include <memory>
#include <string>

#include "ddp_cases.h"

namespace ddp_cases {

struct InBackwardCase {
  optim::OptimizerSpec spec;
  std::string name;
  bool keep_grads = false;
  bool find_unused = false;
  bool static_graph = false;
  bool bucket_view = false;
  int micro_batches = 1;  // the first ones under no_sync
};

inline std::unique_ptr<optim::Optimizer> plain_optimizer(const optim::OptimizerSpec& spec, const TensorList& params) {
  if (auto* s = std::get_if<optim::SGDOptions>(&spec)) return std::make_unique<optim::SGD>(params, *s);
  if (auto* a = std::get_if<optim::AdamOptions>(&spec)) return std::make_unique<optim::Adam>(params, *a);
  return std::make_unique<optim::AdamW>(params, std::get<optim::AdamWOptions>(spec));
}

// DDP with the optimizer in backward equals one process taking plain steps on the mean loss,
// over 8 steps, with a learning-rate change half way; nothing is stepped inside no_sync; the
// managed .grad are none afterwards (kept with keep_grads); a parameter no rank uses is never
// stepped (its optimizer state stays empty).
inline void in_backward_equivalence(ProcessGroupPtr g, const InBackwardCase& c) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("optimizer in backward {} keep_grads={} find_unused={} static={} view={} "
                                       "micro={} rank {}/{}",
                                       c.name, c.keep_grads, c.find_unused, c.static_graph, c.bucket_view,
                                       c.micro_batches, R, W);
  const bool unused_ok = c.find_unused || c.static_graph;
  auto uses_extra = [unused_ok](int r) { return !unused_ok || r % 2 == 1; };
  auto model = make_net(f64, R == 0 ? 7 : 70 + R);
  model->rank = R;
  model->use_extra = uses_extra;
  auto reference = make_net(f64, 7);
  if (!unused_ok)
    for (auto* m : {model.get(), reference.get()}) {
      m->never->weight.requires_grad_(false);
      m->never->bias.requires_grad_(false);
    }
  TensorList trainable;
  for (const Tensor& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  auto in_backward = optim::apply_optimizer_in_backward(c.spec, trainable, {.keep_grads = c.keep_grads});
  DdpOptions o;
  o.find_unused_parameters = c.find_unused;
  o.static_graph = c.static_graph;
  o.gradient_as_bucket_view = c.bucket_view;
  o.bucket_cap_mb = 1e-9;
  DistributedDataParallel ddp(model, g, o);
  expect(ddp.stats().optimizer_in_backward, "{}: stats do not show the optimizer in backward", what);
  auto ref_opt = plain_optimizer(c.spec, reference->parameters());
  for (int step = 0; step < 8; ++step) {
    if (step == 4) {
      in_backward->set_lr(in_backward->lr() / 2);
      ref_opt->set_lr(ref_opt->lr() / 2);
    }
    if (c.keep_grads) model->zero_grad(/*set_to_none=*/!c.bucket_view);
    for (int micro = 0; micro < c.micro_batches; ++micro) {
      if (micro + 1 < c.micro_batches) {
        Tensor before = model->fc1->weight.detach().clone();
        auto guard = ddp.no_sync();
        ddp.call([&] { return shard_loss(*model, step, R, f64, micro); }).backward();
        expect(max_abs_diff(before, model->fc1->weight) == 0, "{}: a parameter was stepped inside no_sync", what);
      } else {
        ddp.call([&] { return shard_loss(*model, step, R, f64, micro); }).backward();
      }
    }
    ddp.check_reducer_finalized();
    for (const auto& name : ddp.parameter_names()) {
      const bool defined = model->named_parameters().at(name).grad().defined();
      if (!c.keep_grads)
        expect(!defined, "{}: {}'s .grad is defined after its step", what, name);
    }
    reference_step(*reference, *ref_opt, step, W, c.micro_batches, uses_extra);
  }
  expect_same_parameters(*model, *reference, 1e-12, what);
  if (unused_ok) {
    const Tensor& never = model->never->weight;
    expect(in_backward->optimizer_for(never).state(never) == nullptr ||
               in_backward->optimizer_for(never).state(never)->buffers.empty(),
           "{}: a parameter no rank uses was stepped", what);
  }
}

inline void in_backward_all(ProcessGroupPtr g) {
  const optim::SGDOptions sgd_m{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  in_backward_equivalence(g, {sgd_m, "SGD nesterov"});
  in_backward_equivalence(g, {optim::SGDOptions{.lr = 0.1, .momentum = 0.5, .dampening = 0.1}, "SGD dampening",
                              /*keep_grads=*/true});
  in_backward_equivalence(g, {optim::AdamOptions{.lr = 0.01, .weight_decay = 0.01}, "Adam"});
  in_backward_equivalence(g, {optim::AdamWOptions{.lr = 0.01}, "AdamW", false, /*find_unused=*/true});
  in_backward_equivalence(g, {sgd_m, "SGD", false, /*find_unused=*/true, false, /*bucket_view=*/true});
  in_backward_equivalence(g, {sgd_m, "SGD", false, false, /*static_graph=*/true});
  // no_sync backwards before the first synchronised one do not count as static_graph's first
  // iteration (its record comes from the synchronised backward).
  in_backward_equivalence(g, {sgd_m, "SGD", false, false, /*static_graph=*/true, false, /*micro=*/3});
  in_backward_equivalence(g, {optim::AdamWOptions{.lr = 0.01}, "AdamW", false, false, false, false, /*micro=*/3});
}

// With a comm hook (fp16 compression) the step reads the hook's result: equal to DDP with the
// same hook and a plain step(). Ignored parameters are stepped locally; applying after DDP fails.
inline void in_backward_hook_and_errors(ProcessGroupPtr g) {
  const int R = g->rank();
  const optim::SGDOptions sgd{.lr = 0.1, .momentum = 0.9};
  auto a = make_net(f32, 7), b = make_net(f32, 7);
  for (auto* m : {a.get(), b.get()}) {
    m->never->weight.requires_grad_(false);
    m->never->bias.requires_grad_(false);
  }
  TensorList trainable;
  for (const Tensor& p : a->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  auto in_backward = optim::apply_optimizer_in_backward(sgd, trainable);
  DistributedDataParallel ddp_a(a, g, {.ignored_parameters = {"fc2.bias"}});
  DistributedDataParallel ddp_b(b, g, {.ignored_parameters = {"fc2.bias"}});
  ddp_a.register_comm_hook(hooks::fp16_compress);
  ddp_b.register_comm_hook(hooks::fp16_compress);
  optim::SGD opt_b(b->parameters(), sgd);
  for (int step = 0; step < 4; ++step) {
    ddp_a.call([&] { return shard_loss(*a, step, R, f32); }).backward();
    opt_b.zero_grad();
    ddp_b.call([&] { return shard_loss(*b, step, R, f32); }).backward();
    opt_b.step();
  }
  expect_same_parameters(*a, *b, 0, fmt::format("in backward with fp16_compress, rank {}", R));
  expect(!a->fc2->bias.grad().defined(), "the ignored parameter was not stepped locally (its .grad is still there)");
  auto fresh = make_net(f64);
  DistributedDataParallel ddp_c(fresh, g, {.find_unused_parameters = true});
  std::string error;
  try {
    optim::apply_optimizer_in_backward(sgd, fresh->parameters());
  } catch (const std::exception& e) {
    error = e.what();
  }
  expect(error.find("is managed by DistributedDataParallel: apply the optimizer in backward before wrapping") !=
             std::string::npos,
         "applied after DDP: '{}'", error);
}

}  // namespace ddp_cases
