// DDP's advanced modes and the reducer rules behind them (static graph, several forwards before
// one backward, which backward is DDP's, grad mode off, a DDP driven from another thread), shared
// by test_ddp (threads backend) and test_ddp_mpi (mpirun). Each case runs on every rank and
// throws on a failed check; equivalence is against one process computing every rank's loss.
#pragma once

#include <atomic>
#include <map>
#include <thread>

#include "ddp_cases.h"

namespace ddp_cases {

// The reference's backward: every rank's loss (over `micro_batches` micro-batches each), summed,
// averaged over the W ranks, as DDP's average of the ranks' accumulated gradients.
inline void reference_backward(int W, int micro_batches, const std::function<Tensor(int r, int micro)>& loss_of) {
  Tensor total;
  for (int r = 0; r < W; ++r)
    for (int micro = 0; micro < micro_batches; ++micro) {
      Tensor l = loss_of(r, micro);
      total = total.defined() ? total + l : l;
    }
  (total / static_cast<double>(W)).backward();
}

// Every rank's loss of `forwards` forwards at `step`, summed, averaged over ranks: the reference.
inline void reference_step(Net& reference, optim::Optimizer& opt, int step, int W, int forwards,
                           const std::function<bool(int)>& uses_extra, Dtype dt = f64) {
  opt.zero_grad();
  reference.use_extra = uses_extra;
  reference_backward(W, forwards, [&](int r, int k) {
    reference.rank = r;
    return shard_loss(reference, step, r, dt, k);
  });
  opt.step();
}

// The Net with `never` frozen: the model for cases where every trained parameter gets a gradient.
inline std::shared_ptr<Net> make_net_without_never(Dtype dt, uint64_t seed = 7) {
  auto net = make_net(dt, seed);
  net->never->weight.requires_grad_(false);
  net->never->bias.requires_grad_(false);
  return net;
}

inline int64_t count_events(const std::vector<ReducerEvent>& ev, ReducerEvent::Kind kind) {
  return std::count_if(ev.begin(), ev.end(), [kind](const ReducerEvent& e) { return e.kind == kind; });
}

// static_graph: `forwards` forwards of the same module before one backward, over ten iterations;
// `never` is unused by every rank and, with find_unused, `extra` only on odd ranks. The first
// backward launches no bucket before its end, the run reduces exactly one used map, and the
// buckets are rebuilt.
inline void static_graph_equivalence(ProcessGroupPtr g, int forwards, bool find_unused, bool bucket_view) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("static_graph forwards={} find_unused={} bucket_view={} rank {}/{}", forwards,
                                       find_unused, bucket_view, R, W);
  auto uses_extra = [](int r) { return r % 2 == 1; };
  auto model = make_net(f64, R == 0 ? 7 : 50 + R);
  model->rank = R;
  model->use_extra = uses_extra;
  auto reference = make_net(f64, 7);
  DdpOptions o;
  o.static_graph = true;
  o.find_unused_parameters = find_unused;
  o.gradient_as_bucket_view = bucket_view;
  o.bucket_cap_mb = 1e-9;  // a bucket per parameter: launch order is visible
  DistributedDataParallel ddp(model, g, o);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  int64_t used_maps = 0;
  for (int step = 0; step < 10; ++step) {
    opt.zero_grad(/*set_to_none=*/!bucket_view);
    Tensor total;
    for (int k = 0; k < forwards; ++k) {
      int64_t first = ((step * 4 + k) * 16 + R) * kRowsPerRank;
      Tensor l = mse_loss(ddp(inputs(first, kRowsPerRank, 8, f64)), targets(first, kRowsPerRank, 4, f64));
      total = total.defined() ? total + l : l;
    }
    total.backward();
    ddp.check_reducer_finalized();
    const auto& ev = ddp.reducer_events();
    used_maps += count_events(ev, ReducerEvent::used_map_reduced);
    if (step == 0) {
      int64_t last_ready = -1, first_launch = -1;
      for (size_t i = 0; i < ev.size(); ++i) {
        if (ev[i].kind == ReducerEvent::grad_ready) last_ready = static_cast<int64_t>(i);
        if (ev[i].kind == ReducerEvent::bucket_launched && first_launch < 0) first_launch = static_cast<int64_t>(i);
      }
      expect(first_launch > last_ready, "{}: the first backward launched a bucket (event {}) before its end (event {})",
             what, first_launch, last_ready);
    }
    opt.step();
    reference_step(*reference, ref_opt, step, W, forwards, uses_extra);
  }
  expect(used_maps == 1, "{}: {} used-map allreduces in ten iterations, expected exactly 1", what, used_maps);
  expect_same_parameters(*model, *reference, 1e-12, what);
  expect(!model->never->weight.grad().defined(), "{}: a parameter no rank uses got a gradient", what);
  auto st = ddp.stats();
  expect(!st.rebuilt_bucket_bytes.empty(), "{}: buckets were not rebuilt", what);
  expect(st.iterations == 10, "{}: {} iterations", what, st.iterations);
}

inline void static_graph_all(ProcessGroupPtr g) {
  for (int forwards : {1, 2, 3})
    for (bool find_unused : {false, true}) static_graph_equivalence(g, forwards, find_unused, false);
  static_graph_equivalence(g, 2, true, true);
}

// The graph changes at iteration 3 on the last rank only: `extra`, unused so far, starts being
// used, or, used so far, stops being used. That rank gets the static_graph error at the end
// of that backward; the others a timeout naming the collective, never a hang.
inline void static_graph_changes(ProcessGroupPtr g, bool start_using) {
  const int W = g->size(), R = g->rank();
  const int changer = W - 1;
  auto model = make_net(f64);
  model->rank = R;
  // start_using: extra is unused everywhere until the changer uses it from iteration 3 on.
  // Otherwise extra is used everywhere until the changer drops it at iteration 3.
  int step = 0;
  model->use_extra = [&](int r) { return start_using ? (r == changer && step >= 3) : !(r == changer && step >= 3); };
  DistributedDataParallel ddp(model, g, {.find_unused_parameters = true, .static_graph = true});
  std::string error;
  try {
    for (step = 0; step < 6; ++step) {
      model->zero_grad();
      shard_loss(ddp.module(), 0, 0, f64);  // not through DDP: harmless
      mse_loss(ddp(inputs(step * 8 + R, 4, 8, f64)), targets(step * 8 + R, 4, 4, f64)).backward();
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (W == 1 || R == changer) {
    expect(error.find("[ddp] the training graph changed in this iteration (parameter 'extra.") != std::string::npos &&
               error.find("static_graph does not allow") != std::string::npos,
           "rank {} (start_using={}): expected the static_graph error at iteration 3, got '{}' at step {}", R,
           start_using, error, step);
    expect(step == 3, "rank {}: the static_graph error came at step {}, not 3", R, step);
  } else {
    expect(error.find("timed out") != std::string::npos || error.find("failed") != std::string::npos ||
               error.find("broken") != std::string::npos,
           "rank {} (start_using={}): expected a timeout after the changer stopped, got '{}'", R, start_using, error);
  }
}

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

namespace ddp_cases {

// An embedding feeding an MLP: the embedding's allreduce is the one worth delaying.
struct EmbeddingMlp : nn::Module {
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::Linear> fc1, fc2;
  EmbeddingMlp() : Module("EmbeddingMlp") {
    emb = register_module("emb", std::make_shared<nn::Embedding>(20, 8));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 4));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(tanh((*fc1)((*emb)(x)))); }
};

inline std::shared_ptr<EmbeddingMlp> make_embedding_mlp(uint64_t seed) {
  manual_seed(seed);
  auto m = std::make_shared<EmbeddingMlp>();
  m->to(f64);
  return m;
}

inline Tensor token_batch(int step, int micro, int r) {
  std::vector<int64_t> v;
  for (int i = 0; i < 5; ++i) v.push_back((step * 7 + micro * 5 + r * 3 + i * 4) % 20);
  return from_vector(v);
}

inline Tensor embedding_loss(nn::Module& m, int step, int micro, int r) {
  int64_t first = ((step * 4 + micro) * 16 + r) * 5;
  return mse_loss(m(token_batch(step, micro, r)), targets(first, 5, 4, f64));
}

// The delayed parameters train exactly as one process would: both gradient modes, set_to_none
// either way, no_sync accumulation, every parameter delayed; one allreduce per iteration, on a
// group of its own.
inline void delayed_allreduce_equivalence(ProcessGroupPtr g, std::vector<std::string> delayed, std::string hook,
                                          bool bucket_view, bool set_to_none, int micro_batches) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("delayed {} hooked to {} bucket_view={} set_to_none={} micro={} rank {}/{}",
                                       fmt::join(delayed, ","), hook, bucket_view, set_to_none, micro_batches, R, W);
  auto model = make_embedding_mlp(R == 0 ? 3 : 30 + R);
  auto reference = make_embedding_mlp(3);
  DdpOptions o;
  o.gradient_as_bucket_view = bucket_view;
  o.delay_all_reduce_named_params = delayed;
  o.param_to_hook_all_reduce = hook;
  DistributedDataParallel ddp(model, g, o);
  expect(ddp.delayed_allreduce() != nullptr, "{}: no delayed allreduce", what);
  expect(ddp.delayed_allreduce()->group().name() != ddp.process_group().name(),
         "{}: the delayed allreduce runs on the main group {}", what, ddp.process_group().name());
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  constexpr int kSteps = 5;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad(set_to_none);
    for (int micro = 0; micro < micro_batches; ++micro) {
      if (micro + 1 < micro_batches) {
        auto guard = ddp.no_sync();
        ddp.call([&] { return embedding_loss(*model, step, micro, R); }).backward();
      } else {
        ddp.call([&] { return embedding_loss(*model, step, micro, R); }).backward();
      }
    }
    ddp.check_reducer_finalized();
    expect(ddp.delayed_allreduce()->launches() == step + 1, "{}: {} delayed allreduces after {} steps", what,
           ddp.delayed_allreduce()->launches(), step + 1);
    opt.step();
    ref_opt.zero_grad();
    reference_backward(W, micro_batches, [&](int r, int micro) { return embedding_loss(*reference, step, micro, r); });
    ref_opt.step();
  }
  expect_same_parameters(*model, *reference, 1e-12, what);
  for (const std::string& name : delayed) {
    Tensor grad = model->named_parameters().at(name).grad();
    expect(grad.defined(), "{}: {} has no gradient after backward", what, name);
  }
}

inline void delayed_allreduce_all(ProcessGroupPtr g) {
  for (bool view : {false, true})
    for (bool none : {true, false}) delayed_allreduce_equivalence(g, {"emb.weight"}, "fc1.weight", view, none, 1);
  delayed_allreduce_equivalence(g, {"emb.weight"}, "fc2.weight", false, true, 3);  // no_sync accumulation
  delayed_allreduce_equivalence(g, {"emb.weight", "fc1.bias"}, "emb.weight", true, false, 1);
  // Every parameter delayed: no buckets at all.
  delayed_allreduce_equivalence(g, {"emb.weight", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}, "fc1.weight",
                                false, true, 2);
  // One option without the other, or a name DDP does not manage.
  auto model = make_embedding_mlp(3);
  auto error_of = [&](DdpOptions o) {
    try {
      DistributedDataParallel ddp(model, g, std::move(o));
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  DdpOptions only_names;
  only_names.delay_all_reduce_named_params = {"emb.weight"};
  std::string e1 = error_of(only_names);
  expect(e1.find("delay_all_reduce_named_params and param_to_hook_all_reduce go together") != std::string::npos,
         "names without a hook parameter: '{}'", e1);
  DdpOptions only_hook;
  only_hook.param_to_hook_all_reduce = "fc1.weight";
  std::string e2 = error_of(only_hook);
  expect(e2.find("go together") != std::string::npos, "a hook parameter without names: '{}'", e2);
  DdpOptions unknown;
  unknown.delay_all_reduce_named_params = {"emb.bias"};
  unknown.param_to_hook_all_reduce = "fc1.weight";
  std::string e3 = error_of(unknown);
  expect(e3.find("names 'emb.bias', which is not a parameter DDP manages") != std::string::npos, "unknown name: '{}'", e3);
  DdpOptions bad_hook;
  bad_hook.delay_all_reduce_named_params = {"emb.weight"};
  bad_hook.param_to_hook_all_reduce = "fc9.weight";
  std::string e4 = error_of(bad_hook);
  expect(e4.find("param_to_hook_all_reduce 'fc9.weight' is not a parameter of the module") != std::string::npos,
         "unknown hook parameter: '{}'", e4);
  DdpOptions all;
  all.delay_all_reduce_named_params = {"emb.weight", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  all.param_to_hook_all_reduce = "fc1.weight";
  DistributedDataParallel every(model, g, all);
  std::string e5;
  try {
    every.register_comm_hook(hooks::fp16_compress);
  } catch (const std::exception& e) {
    e5 = e.what();
  }
  expect(e5.find("[ddp] register_comm_hook: every parameter is delayed") != std::string::npos,
         "comm hook with every parameter delayed: '{}'", e5);
}

}  // namespace ddp_cases

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

namespace ddp_cases {

enum class MpMode { plain, no_sync, static_two_forwards };

// Native mixed precision against f32 training of one process: inside forward the parameters
// (frozen ones too, ignored ones not) are low precision and the output is; after backward every
// parameter and gradient is f32 and bitwise equal across ranks; NoGradGuard evaluation and
// state_dict see f32; 20 steps stay within the dtype's tolerance of the f32 run.
inline void mixed_precision_case(ProcessGroupPtr g, Dtype low, bool set_to_none, bool fp16_hook, MpMode mode) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("mixed precision {} set_to_none={} fp16_hook={} mode={} rank {}/{}", low,
                                       set_to_none, fp16_hook, static_cast<int>(mode), R, W);
  auto model = make_net(f32, 7);  // the same start everywhere: the ignored never.bias is not broadcast
  auto reference = make_net(f32, 7);
  for (auto* m : {model.get(), reference.get()}) {
    m->never->weight.requires_grad_(false);  // frozen: cast and restored
    m->never->bias.requires_grad_(false);
  }
  DdpOptions o;
  o.mixed_precision = MixedPrecision{.param_dtype = low};
  o.static_graph = mode == MpMode::static_two_forwards;
  o.ignored_parameters = {"never.bias"};  // ignored: never touched
  DistributedDataParallel ddp(model, g, o);
  if (fp16_hook) ddp.register_comm_hook(hooks::fp16_compress);
  std::string inside;
  auto hook = model->register_forward_pre_hook([&](nn::Module&) {
    if (model->fc1->weight.dtype() != low || model->never->weight.dtype() != low || model->never->bias.dtype() != f32)
      inside = fmt::format("inside forward: fc1.weight {}, never.weight {}, never.bias {}", model->fc1->weight.dtype(),
                           model->never->weight.dtype(), model->never->bias.dtype());
  });
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.05, .momentum = 0.9});
  const int forwards = mode == MpMode::static_two_forwards ? 2 : 1;
  const int micro_batches = mode == MpMode::no_sync ? 3 : 1;
  auto loss_of = [&](int step, int micro, int k) {
    int64_t first = ((step * 4 + micro + k) * 16 + R) * kRowsPerRank;
    Tensor out = ddp(inputs(first, kRowsPerRank, 8, f32));
    expect(out.dtype() == low, "{}: the output is {}, not {}", what, out.dtype(), low);
    return mse_loss(out.to(f32), targets(first, kRowsPerRank, 4, f32));
  };
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad(set_to_none);
    for (int micro = 0; micro < micro_batches; ++micro) {
      auto run = [&] {
        Tensor total;
        for (int k = 0; k < forwards; ++k) {
          Tensor l = loss_of(step, micro, k);
          total = total.defined() ? total + l : l;
        }
        total.backward();
      };
      if (micro + 1 < micro_batches) {
        auto guard = ddp.no_sync();
        run();
      } else {
        run();
      }
    }
    ddp.check_reducer_finalized();
    expect(inside.empty(), "{}: {}", what, inside);
    for (const auto& [name, p] : model->named_parameters()) {
      expect(p.dtype() == f32, "{}: after backward {} is {}", what, name, p.dtype());
      if (p.grad().defined()) expect(p.grad().dtype() == f32, "{}: {}'s gradient is {}", what, name, p.grad().dtype());
    }
    opt.step();
    // The reference: every rank's micro-batches and forwards, in f32.
    ref_opt.zero_grad();
    reference_backward(W, micro_batches * forwards, [&](int r, int i) {
      const int micro = i / forwards, k = i % forwards;
      int64_t first = ((step * 4 + micro + k) * 16 + r) * kRowsPerRank;
      return mse_loss((*reference)(inputs(first, kRowsPerRank, 8, f32)), targets(first, kRowsPerRank, 4, f32));
    });
    ref_opt.step();
  }
  // Bitwise equal across ranks (never.bias is ignored: not even broadcast at construction).
  for (const auto& [name, p] : model->named_parameters()) {
    if (name == "never.bias") continue;
    Tensor mine = p.detach().clone();
    Tensor root = mine.clone();
    g->broadcast(root, 0)->wait();
    expect(max_abs_diff(mine, root) == 0, "{}: {} differs from rank 0's", what, name);
  }
  // bf16 keeps 8 significant bits (f16 11): each step's gradient is off by ~2^-8 (2^-11) relative,
  // and 20 momentum steps of lr 0.05 on O(1) gradients move a parameter by at most ~1 in total.
  const double tol = low == bf16 ? 3e-2 : 5e-3;
  expect_same_parameters(*model, *reference, tol, what);
  {
    NoGradGuard ng;
    Tensor out = ddp(inputs(0, 4, 8, f32));
    expect(out.dtype() == low, "{}: NoGradGuard evaluation ran in {}", what, out.dtype());
  }
  expect(model->fc1->weight.dtype() == f32, "{}: after a NoGradGuard forward fc1.weight is {}", what,
         model->fc1->weight.dtype());
  for (const auto& [name, t] : model->state_dict())
    if (is_floating(t.dtype())) expect(t.dtype() == f32, "{}: state_dict has {} as {}", what, name, t.dtype());
}

inline void mixed_precision_all(ProcessGroupPtr g) {
  for (Dtype low : {bf16, f16})
    for (bool none : {true, false})
      for (bool hook : {false, true})
        for (MpMode mode : {MpMode::plain, MpMode::no_sync, MpMode::static_two_forwards})
          mixed_precision_case(g, low, none, hook, mode);
}

// A side stream that runs nothing until it is waited for, as a slow device stream would: a module
// that read its parameters before waiting for its cast batch would see the previous iteration's
// (or, at first, uninitialised) shadows. Batches run in order, as on a stream.
struct DeferredSideStream final : SideStream {
  std::vector<std::function<void()>> queued;
  size_t ran = 0;
  std::vector<std::string>& log;
  explicit DeferredSideStream(std::vector<std::string>& l) : log(l) {}
  void follow_current() override { log.push_back("follow"); }
  size_t run(const std::function<void()>& fn) override {
    queued.push_back(fn);
    return queued.size() - 1;
  }
  void make_current_wait(size_t marker) override {
    while (ran <= marker) queued.at(ran++)();
    log.push_back(fmt::format("wait {}", marker));
  }
  void reset_markers() override {
    while (ran < queued.size()) queued[ran++]();  // a batch no module waited for still ran
    queued.clear();
    ran = 0;
  }
};

inline std::vector<std::string>& side_stream_log() {
  thread_local std::vector<std::string> log;  // one per rank thread
  return log;
}

// Sets the deferred side stream for every ParamShadows made in its scope.
struct DeferredCasts {
  DeferredCasts() {
    set_side_stream_factory_for_tests([](Device) {
      auto s = std::make_unique<DeferredSideStream>(side_stream_log());
      last() = s.get();
      return s;
    });
  }
  ~DeferredCasts() { set_side_stream_factory_for_tests(nullptr); }
  static DeferredSideStream*& last() {
    thread_local DeferredSideStream* s = nullptr;
    return s;
  }
};

// With the casts on a side stream each module waits for its own batch in its pre-forward hook,
// no earlier: inside fc1's forward only fc1's batch has run, inside fc2's the first two. Each
// module then reads exactly its masters cast to the low dtype, and training still tracks f32.
inline void mixed_precision_side_stream(ProcessGroupPtr g) {
  const std::string what = fmt::format("mixed precision on a side stream, rank {}/{}", g->rank(), g->size());
  auto model = make_net(f32, 7);
  DdpOptions o;
  o.mixed_precision = MixedPrecision{.param_dtype = bf16};
  o.find_unused_parameters = true;  // `never` takes no part
  DistributedDataParallel ddp(model, g, o);
  DeferredSideStream* side = DeferredCasts::last();
  expect(side != nullptr, "{}: DDP made no side stream", what);
  std::map<std::string, Tensor> masters;
  std::string wrong;
  std::vector<HookHandle> checks;
  const std::vector<std::pair<std::string, std::shared_ptr<nn::Linear>>> layers = {
      {"fc1", model->fc1}, {"fc2", model->fc2}, {"extra", model->extra}};
  for (size_t k = 0; k < layers.size(); ++k) {
    checks.push_back(layers[k].second->register_forward_pre_hook([&, k](nn::Module& m) {
      if (side->ran != k + 1)
        wrong = fmt::format("inside {}'s forward {} cast batches had run, not {}", layers[k].first, side->ran, k + 1);
      for (const auto& [name, p] : m.named_parameters()) {
        const Tensor want = masters.at(layers[k].first + "." + name).to(bf16);
        if (p.dtype() != bf16 || max_abs_diff(p, want) != 0)
          wrong = fmt::format("inside {}'s forward {} is not its master in bf16", layers[k].first, name);
      }
    }));
  }
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int step = 0; step < 4 && wrong.empty(); ++step) {
    for (const auto& [name, p] : model->named_parameters()) masters[name] = p.detach().clone();
    side_stream_log().clear();
    opt.zero_grad();
    int64_t first = (step * 16 + g->rank()) * kRowsPerRank;
    mse_loss(ddp(inputs(first, kRowsPerRank, 8, f32)).to(f32), targets(first, kRowsPerRank, 4, f32)).backward();
    opt.step();
    const std::vector<std::string> want = {"follow", "wait 0", "wait 1", "wait 2"};  // fc1, fc2, extra
    expect(side_stream_log() == want, "{}: side stream calls {}, want {}", what, fmt::join(side_stream_log(), ", "),
           fmt::join(want, ", "));
  }
  expect(wrong.empty(), "{}: {}", what, wrong);
}

// Buffers live in buffer_dtype; gradient_as_bucket_view with a reduce dtype other than the
// masters' is a construction error.
inline void mixed_precision_buffers_and_errors(ProcessGroupPtr g) {
  manual_seed(5);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(8, 6));
  m->push_back(std::make_shared<nn::BatchNorm1d>(6));
  m->push_back(std::make_shared<nn::Linear>(6, 4));
  DdpOptions o;
  o.mixed_precision = MixedPrecision{.param_dtype = bf16, .buffer_dtype = bf16};
  DistributedDataParallel ddp(m, g, o);
  std::string inside;
  auto hook = m->register_forward_pre_hook([&](nn::Module& mod) {
    Tensor rm = mod.buffer("1.running_mean");
    if (rm.dtype() != bf16) inside = fmt::format("running_mean is {}", rm.dtype());
  });
  mse_loss(ddp(inputs(g->rank() * 5, 5, 8, f32)).to(f32), targets(0, 5, 4, f32)).backward();
  ddp.check_reducer_finalized();
  expect(inside.empty(), "buffer_dtype: {}", inside);
  auto m2 = make_net(f32);
  DdpOptions bad;
  bad.mixed_precision = MixedPrecision{.param_dtype = bf16};
  bad.gradient_as_bucket_view = true;
  bad.find_unused_parameters = true;
  std::string error;
  try {
    DistributedDataParallel d(m2, g, bad);
  } catch (const std::exception& e) {
    error = e.what();
  }
  expect(error.find("gradient_as_bucket_view needs buckets in the masters' dtype") != std::string::npos,
         "bucket view with bf16 buckets: '{}'", error);
  auto error_of = [&](std::shared_ptr<nn::Module> m, MixedPrecision mp) {
    try {
      DistributedDataParallel d(std::move(m), g, {.find_unused_parameters = true, .mixed_precision = mp});
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e1 = error_of(make_net(f32), MixedPrecision{.param_dtype = f32});
  expect(e1.find("[ddp] mixed_precision.param_dtype must be f16 or bf16, got f32") != std::string::npos,
         "param_dtype f32: '{}'", e1);
  std::string e2 = error_of(make_net(f32), MixedPrecision{.param_dtype = bf16, .reduce_dtype = i32});
  expect(e2.find("[ddp] mixed_precision.reduce_dtype must be f16, bf16 or f32") != std::string::npos,
         "reduce_dtype i32: '{}'", e2);
  std::string e3 = error_of(make_net(f32), MixedPrecision{.param_dtype = bf16, .buffer_dtype = i64});
  expect(e3.find("[ddp] mixed_precision.buffer_dtype must be a floating dtype") != std::string::npos,
         "buffer_dtype i64: '{}'", e3);
  std::string e4 = error_of(make_net(bf16), MixedPrecision{.param_dtype = bf16});
  expect(e4.find("[ddp] mixed_precision keeps f32 (or f64) masters, but parameter 'fc1.weight' is bf16") !=
             std::string::npos,
         "bf16 masters: '{}'", e4);
}

}  // namespace ddp_cases

namespace ddp_cases {

// The optimizer in backward under mixed precision steps the f32 masters with the upcast averaged
// gradient: the same parameters as mixed-precision DDP + step(), bitwise.
inline void in_backward_mixed_precision(ProcessGroupPtr g, Dtype low, bool find_unused) {
  const int R = g->rank();
  const std::string what = fmt::format("in backward with {} mixed precision, find_unused={}, rank {}", low,
                                       find_unused, R);
  const optim::AdamWOptions adamw{.lr = 0.01};
  auto a = make_net(f32, 7), b = make_net(f32, 7);
  for (auto* m : {a.get(), b.get()}) {
    m->rank = R;
    m->use_extra = [find_unused](int r) { return !find_unused || r % 2 == 1; };
    if (!find_unused) {
      m->never->weight.requires_grad_(false);
      m->never->bias.requires_grad_(false);
    }
  }
  TensorList trainable;
  for (const Tensor& p : a->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  auto in_backward = optim::apply_optimizer_in_backward(adamw, trainable);
  DdpOptions o;
  o.mixed_precision = MixedPrecision{.param_dtype = low};
  o.find_unused_parameters = find_unused;
  o.bucket_cap_mb = 1e-9;
  DistributedDataParallel ddp_a(a, g, o);
  DistributedDataParallel ddp_b(b, g, o);
  optim::AdamW opt_b(b->parameters(), adamw);
  for (int step = 0; step < 5; ++step) {
    int64_t first = ((step * 4) * 16 + R) * kRowsPerRank;
    mse_loss(ddp_a(inputs(first, kRowsPerRank, 8, f32)).to(f32), targets(first, kRowsPerRank, 4, f32)).backward();
    ddp_a.check_reducer_finalized();
    for (const auto& [name, p] : a->named_parameters()) {
      expect(p.dtype() == f32, "{}: {} is {} after backward", what, name, p.dtype());
      expect(!p.grad().defined(), "{}: {} kept its gradient after its step", what, name);
    }
    opt_b.zero_grad();
    mse_loss(ddp_b(inputs(first, kRowsPerRank, 8, f32)).to(f32), targets(first, kRowsPerRank, 4, f32)).backward();
    opt_b.step();
  }
  expect_same_parameters(*a, *b, 0, what);
}

inline void in_backward_mixed_precision_all(ProcessGroupPtr g) {
  for (Dtype low : {bf16, f16})
    for (bool find_unused : {false, true}) in_backward_mixed_precision(g, low, find_unused);
}

}  // namespace ddp_cases

namespace ddp_cases {

// Delayed-allreduce parameters under mixed precision: the embedding's gradient is reduced in
// bf16 on its own group and lands, upcast, in the f32 master's .grad, like every other one.
inline void delayed_with_mixed_precision(ProcessGroupPtr g, int micro_batches, bool in_backward) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("delayed + bf16 mixed precision, micro={} in_backward={} rank {}/{}",
                                       micro_batches, in_backward, R, W);
  auto model = make_embedding_mlp(3);
  auto reference = make_embedding_mlp(3);
  for (auto* m : {model.get(), reference.get()}) m->to(f32);
  const optim::SGDOptions sgd{.lr = 0.1, .momentum = 0.9};
  std::shared_ptr<optim::InBackwardOptimizers> ib;
  if (in_backward) ib = optim::apply_optimizer_in_backward(sgd, model->parameters());
  DdpOptions o;
  o.delay_all_reduce_named_params = {"emb.weight"};
  o.param_to_hook_all_reduce = "fc1.weight";
  o.mixed_precision = MixedPrecision{.param_dtype = bf16};
  DistributedDataParallel ddp(model, g, o);
  optim::SGD opt(model->parameters(), sgd);
  optim::SGD ref_opt(reference->parameters(), sgd);
  auto loss_of = [&](nn::Module& m, int step, int micro, int r, bool low) {
    int64_t first = ((step * 4 + micro) * 16 + r) * 5;
    Tensor out = low ? ddp(token_batch(step, micro, r)).to(f32) : m(token_batch(step, micro, r));
    return mse_loss(out, targets(first, 5, 4, f32));
  };
  for (int step = 0; step < 5; ++step) {
    if (!in_backward) opt.zero_grad();
    for (int micro = 0; micro < micro_batches; ++micro) {
      if (micro + 1 < micro_batches) {
        auto guard = ddp.no_sync();
        loss_of(*model, step, micro, R, true).backward();
      } else {
        loss_of(*model, step, micro, R, true).backward();
      }
    }
    ddp.check_reducer_finalized();
    const Tensor& emb = model->emb->weight;
    expect(emb.dtype() == f32, "{}: emb.weight is {} after backward", what, emb.dtype());
    if (in_backward) {
      expect(!emb.grad().defined(), "{}: emb.weight kept its gradient after its step", what);
    } else {
      expect(emb.grad().defined() && emb.grad().dtype() == f32, "{}: emb.weight's gradient is missing or not f32",
             what);
      opt.step();
    }
    ref_opt.zero_grad();
    reference_backward(W, micro_batches, [&](int r, int micro) { return loss_of(*reference, step, micro, r, false); });
    ref_opt.step();
  }
  expect_same_parameters(*model, *reference, 3e-2, what);  // bf16: see mixed_precision_case
  for (const auto& [name, p] : model->named_parameters()) {
    Tensor mine = p.detach().clone(), root = mine.clone();
    g->broadcast(root, 0)->wait();
    expect(max_abs_diff(mine, root) == 0, "{}: {} differs from rank 0's", what, name);
  }
}

inline void delayed_with_mixed_precision_all(ProcessGroupPtr g) {
  delayed_with_mixed_precision(g, 1, false);
  delayed_with_mixed_precision(g, 3, false);
  delayed_with_mixed_precision(g, 1, true);
}

}  // namespace ddp_cases

namespace ddp_cases {

// On odd ranks the embedding (delayed, and its own hook parameter) gets no gradient at all:
// with find_unused_parameters those ranks still issue the delayed allreduce (with zeros),
// joined to the backward DDP adopted, so nobody waits for it.
struct SometimesEmbedded : nn::Module {
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::Linear> fc;
  int rank = 0;
  SometimesEmbedded() : Module("SometimesEmbedded") {
    emb = register_module("emb", std::make_shared<nn::Embedding>(20, 8));
    fc = register_module("fc", std::make_shared<nn::Linear>(8, 4));
  }
  Tensor forward(const Tensor& tokens) override {
    if (rank % 2 == 1) return (*fc)(ones({tokens.size(0), 8}, TensorOptions(fc->weight.dtype())));
    return (*fc)((*emb)(tokens));
  }
};

inline void delayed_unused_on_some_ranks(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  manual_seed(8);
  auto model = std::make_shared<SometimesEmbedded>();
  model->to(f64);
  manual_seed(8);
  auto reference = std::make_shared<SometimesEmbedded>();
  reference->to(f64);
  model->rank = R;
  DdpOptions o;
  o.find_unused_parameters = true;
  o.delay_all_reduce_named_params = {"emb.weight"};
  o.param_to_hook_all_reduce = "emb.weight";
  DistributedDataParallel ddp(model, g, o);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    mse_loss(ddp(token_batch(step, 0, R)), targets(step * 16 + R, 5, 4, f64)).backward();
    ddp.check_reducer_finalized();
    opt.step();
    ref_opt.zero_grad();
    reference_backward(W, 1, [&](int r, int) {
      reference->rank = r;
      return mse_loss((*reference)(token_batch(step, 0, r)), targets(step * 16 + r, 5, 4, f64));
    });
    ref_opt.step();
  }
  expect(ddp.delayed_allreduce()->launches() == 3, "rank {}: {} delayed allreduces in 3 steps", R,
         ddp.delayed_allreduce()->launches());
  expect_same_parameters(*model, *reference, 1e-12, fmt::format("delayed, unused on odd ranks, rank {}", R));
}

}  // namespace ddp_cases
