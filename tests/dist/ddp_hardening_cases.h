// DDP cases for ranks that must not silently diverge: usage under no_sync after a dropped
// forward, which backward the delayed allreduce follows, mixed precision's way back on a rank
// whose backward fires no gradient hook, globally unused delayed parameters, a second DDP built
// while the first lives, destruction with reductions in flight, inputs of `call` under mixed
// precision, several forwards before one backward without static_graph, and what
// check_reducer_finalized says after a failed backward. Shared by test_ddp (threads) and
// test_ddp_mpi (mpirun) through ddp_case_table.h; each case throws on a failed check, equivalence
// is against one process.
#pragma once

#include <optional>

#include "ddp_cases.h"
#include "ddp_delayed_cases.h"

namespace ddp_cases {

// With find_unused_parameters, each step runs a grad-mode forward it drops (a
// validation forward), then a no_sync micro-batch that alone uses `extra`, then a synchronised
// one without it. `extra`'s accumulated gradient must be averaged like every other one: the
// dropped forward used to hide the no_sync window from the used map, and the ranks drifted apart.
inline void no_sync_after_dropped_forward(ProcessGroupPtr g, bool bucket_view) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("no_sync after a dropped forward, bucket_view={} rank {}/{}", bucket_view, R, W);
  auto model = make_net(f64, R == 0 ? 7 : 40 + R);
  auto reference = make_net(f64, 7);
  bool extra_on = false;
  for (auto* m : {model.get(), reference.get()}) {
    m->never->weight.requires_grad_(false);
    m->never->bias.requires_grad_(false);
    m->use_extra = [&extra_on](int) { return extra_on; };
  }
  DdpOptions o;
  o.find_unused_parameters = true;
  o.gradient_as_bucket_view = bucket_view;
  o.bucket_cap_mb = 1e-9;
  DistributedDataParallel ddp(model, g, o);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad(/*set_to_none=*/!bucket_view);
    extra_on = false;
    { Tensor dropped = ddp(inputs(1000 + step * 4, 4, 8, f64)); }  // grad mode, never backwarded
    extra_on = true;
    {
      auto guard = ddp.no_sync();
      ddp.call([&] { return shard_loss(*model, step, R, f64, 0); }).backward();
    }
    extra_on = false;
    ddp.call([&] { return shard_loss(*model, step, R, f64, 1); }).backward();
    ddp.check_reducer_finalized();
    opt.step();
    ref_opt.zero_grad();
    reference_backward(W, 2, [&](int r, int micro) {
      extra_on = micro == 0;
      return shard_loss(*reference, step, r, f64, micro);
    });
    ref_opt.step();
  }
  expect_same_parameters(*model, *reference, 1e-10, what);
}

// Several forwards before one backward without static_graph (a contrastive loss):
// allowed with find_unused_parameters=false, as in PyTorch; each parameter's hook fires once.
inline void two_forwards_without_static_graph(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("two forwards without static_graph, rank {}/{}", R, W);
  auto model = make_net_without_never(f64, R == 0 ? 7 : 60 + R);
  auto reference = make_net_without_never(f64, 7);
  DistributedDataParallel ddp(model, g, {.bucket_cap_mb = 1e-9});
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  auto pair_loss = [](const Tensor& z1, const Tensor& z2) { return ((z1 - z2) * (z1 - z2)).mean() + z1.mean(); };
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    int64_t first = ((step * 4) * 16 + R) * kRowsPerRank;
    Tensor z1 = ddp(inputs(first, kRowsPerRank, 8, f64));
    Tensor z2 = ddp(inputs(first + 500, kRowsPerRank, 8, f64));
    pair_loss(z1, z2).backward();
    ddp.check_reducer_finalized();
    int64_t ready = 0;
    for (const auto& e : ddp.reducer_events()) ready += e.kind == ReducerEvent::grad_ready;
    expect(ready == 6, "{}: {} gradient-ready events, expected one per parameter (6)", what, ready);
    opt.step();
    ref_opt.zero_grad();
    reference_backward(W, 1, [&](int r, int) {
      const int64_t f = ((step * 4) * 16 + r) * kRowsPerRank;
      return pair_loss((*reference)(inputs(f, kRowsPerRank, 8, f64)), (*reference)(inputs(f + 500, kRowsPerRank, 8, f64)));
    });
    ref_opt.step();
  }
  expect_same_parameters(*model, *reference, 1e-10, what);
  // With find_unused_parameters (no static_graph) it stays an error: two_forwards_need_static_graph.
}

// Another computation shares the delayed embedding and is backwarded between
// DDP's forward and DDP's backward: the delayed allreduce belongs to DDP's backward, not to the
// first one that fires its hooks. (Its gradient, the same on every rank, is part of .grad then.)
inline void delayed_follows_ddps_backward(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("delayed allreduce follows DDP's backward, rank {}/{}", R, W);
  auto model = make_embedding_mlp(R == 0 ? 3 : 30 + R);
  auto reference = make_embedding_mlp(3);
  DdpOptions o;
  o.delay_all_reduce_named_params = {"emb.weight"};
  o.param_to_hook_all_reduce = "emb.weight";
  DistributedDataParallel ddp(model, g, o);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  auto side_loss = [](nn::Module& m) {
    const Tensor w = m.named_parameters().at("emb.weight");
    return (w * w).sum() * 0.01;
  };
  for (int step = 0; step < 4; ++step) {
    opt.zero_grad();
    Tensor out = ddp.call([&] { return embedding_loss(*model, step, 0, R); });
    side_loss(*model).backward();  // not DDP's backward: it must not reduce
    out.backward();
    ddp.check_reducer_finalized();
    expect(ddp.delayed_allreduce()->launches() == step + 1, "{}: {} delayed allreduces after {} steps", what,
           ddp.delayed_allreduce()->launches(), step + 1);
    opt.step();
    ref_opt.zero_grad();
    side_loss(*reference).backward();
    reference_backward(W, 1, [&](int r, int) { return embedding_loss(*reference, step, 0, r); });
    ref_opt.step();
  }
  expect_same_parameters(*model, *reference, 1e-10, what);
}

// A dropped grad-mode forward, then a no_sync micro-batch that reaches the hook
// parameter but no delayed one: nothing is reduced in no_sync, and the next forward goes on.
struct GatedEmbedding : nn::Module {
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::Linear> fc1, fc2;
  bool embed = true;
  GatedEmbedding() : Module("GatedEmbedding") {
    emb = register_module("emb", std::make_shared<nn::Embedding>(20, 8));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 4));
  }
  // Without the embedding, constant features (on the tokens' device, in the layers' dtype).
  Tensor forward(const Tensor& tokens) override {
    Tensor h = embed ? (*emb)(tokens) : ones({tokens.size(0), 8}, TensorOptions(fc1->weight.dtype(), tokens.device()));
    return (*fc2)(tanh((*fc1)(h)));
  }
};

inline void delayed_after_dropped_forward(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("delayed allreduce after a dropped forward, rank {}/{}", R, W);
  auto make = [](uint64_t seed) {
    manual_seed(seed);
    auto m = std::make_shared<GatedEmbedding>();
    m->to(f64);
    return m;
  };
  auto model = make(R == 0 ? 5 : 50 + R);
  auto reference = make(5);
  DdpOptions o;
  o.delay_all_reduce_named_params = {"emb.weight"};
  o.param_to_hook_all_reduce = "fc1.weight";
  DistributedDataParallel ddp(model, g, o);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  for (int step = 0; step < 4; ++step) {
    opt.zero_grad();
    { Tensor dropped = ddp(token_batch(step, 9, R)); }
    model->embed = false;
    {
      auto guard = ddp.no_sync();
      ddp.call([&] { return embedding_loss(*model, step, 0, R); }).backward();
    }
    model->embed = true;
    ddp.call([&] { return embedding_loss(*model, step, 1, R); }).backward();
    ddp.check_reducer_finalized();
    opt.step();
    ref_opt.zero_grad();
    reference_backward(W, 2, [&](int r, int micro) {
      reference->embed = micro == 1;
      return embedding_loss(*reference, step, micro, r);
    });
    ref_opt.step();
  }
  expect(ddp.delayed_allreduce()->launches() == 4, "{}: {} delayed allreduces in 4 steps", what,
         ddp.delayed_allreduce()->launches());
  expect_same_parameters(*model, *reference, 1e-10, what);
}

// find_unused_parameters with bf16 mixed precision; on odd ranks the output does not
// depend on any parameter (the input requires grad, so the backward is still DDP's). Those ranks
// fire no gradient hook, yet their parameters must come back to the f32 masters, with the
// averaged gradients, and every rank must hold the same parameters after its steps.
struct Bypass : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  bool bypass = false;
  Bypass() : Module("Bypass") { fc = register_module("fc", std::make_shared<nn::Linear>(8, 4)); }
  Tensor forward(const Tensor& x) override { return bypass ? x.narrow(1, 0, 4) * 2.0 : (*fc)(x); }
};

inline void mixed_precision_rank_without_hooks(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("bf16 mixed precision, no hook on odd ranks, rank {}/{}", R, W);
  manual_seed(11);
  auto model = std::make_shared<Bypass>();
  model->bypass = R % 2 == 1;
  manual_seed(11);
  auto plain = std::make_shared<Bypass>();  // f32 DDP: what mixed precision approximates
  plain->bypass = model->bypass;
  DdpOptions o;
  o.find_unused_parameters = true;
  DistributedDataParallel f32_ddp(plain, g, o);
  o.mixed_precision = MixedPrecision{.param_dtype = bf16};
  DistributedDataParallel ddp(model, g, o);
  optim::SGD opt(model->parameters(), {.lr = 0.05});
  optim::SGD plain_opt(plain->parameters(), {.lr = 0.05});
  for (int step = 0; step < 4; ++step) {
    int64_t first = ((step * 4) * 16 + R) * kRowsPerRank;
    opt.zero_grad();
    Tensor x = inputs(first, kRowsPerRank, 8, f32).requires_grad_();
    mse_loss(ddp(x).to(f32), targets(first, kRowsPerRank, 4, f32)).backward();
    ddp.check_reducer_finalized();
    for (const auto& [name, p] : model->named_parameters()) {
      expect(p.dtype() == f32, "{}: after backward {} is {} (the shadow)", what, name, p.dtype());
      expect(!p.grad().defined() || p.grad().dtype() == f32, "{}: {}'s gradient is {}", what, name, p.grad().dtype());
    }
    opt.step();
    plain_opt.zero_grad();
    Tensor y = inputs(first, kRowsPerRank, 8, f32).requires_grad_();
    mse_loss(f32_ddp(y), targets(first, kRowsPerRank, 4, f32)).backward();
    plain_opt.step();
  }
  for (const auto& [name, p] : model->named_parameters()) {
    Tensor mine = p.detach().clone();
    Tensor root = mine.clone();
    g->broadcast(root, 0)->wait();
    expect(max_abs_diff(mine, root) == 0, "{}: {} differs from rank 0's", what, name);
  }
  expect_same_parameters(*model, *plain, 2e-2, what);
}

// A delayed parameter no rank uses is not stepped by the optimizer in backward and
// keeps .grad none (find_unused_parameters), as a bucketed one; under static_graph a delayed
// parameter used on some ranks only is no error either (zeros from the others).
inline void delayed_globally_unused(ProcessGroupPtr g, bool static_graph) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("delayed never.* unused everywhere, static_graph={} rank {}/{}", static_graph,
                                       R, W);
  auto uses_extra = [](int r) { return r % 2 == 1; };
  auto model = make_net(f64, R == 0 ? 7 : 80 + R);
  model->rank = R;
  model->use_extra = uses_extra;
  auto reference = make_net(f64, 7);
  const optim::SGDOptions sgd{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.05};
  TensorList all;
  for (const Tensor& p : model->parameters()) all.push_back(p);
  auto in_backward = optim::apply_optimizer_in_backward(sgd, all);
  DdpOptions o;
  o.find_unused_parameters = !static_graph;
  o.static_graph = static_graph;
  o.delay_all_reduce_named_params = {"never.weight", "never.bias", "extra.weight"};
  o.param_to_hook_all_reduce = "fc1.weight";
  DistributedDataParallel ddp(model, g, o);
  const Tensor never_before = model->never->weight.detach().clone();
  optim::SGD ref_opt(reference->parameters(), sgd);
  for (int step = 0; step < 4; ++step) {
    ddp.call([&] { return shard_loss(*model, step, R, f64); }).backward();
    ddp.check_reducer_finalized();
    reference_step(*reference, ref_opt, step, W, 1, uses_extra);
  }
  expect(max_abs_diff(model->never->weight, never_before) == 0, "{}: never.weight was stepped", what);
  expect(!model->never->weight.grad().defined(), "{}: never.weight got a gradient", what);
  const Tensor& never = model->never->weight;
  expect(in_backward->optimizer_for(never).state(never) == nullptr ||
             in_backward->optimizer_for(never).state(never)->buffers.empty(),
         "{}: never.weight has optimizer state", what);
  expect_same_parameters(*model, *reference, 1e-10, what);
}

// A second DDP built while the first still lives, after the first's
// remove_autograd_hooks() (and a backward of the first that threw), trains exactly as a DDP that
// is the only one; then the first one's destructor changes nothing.
enum class SecondMode { in_backward, mixed_precision, both, delayed_in_backward };
inline void second_ddp_while_first_lives(ProcessGroupPtr g, SecondMode mode) {
  const int R = g->rank();
  const std::string what = fmt::format("second DDP while the first lives, mode {} rank {}", static_cast<int>(mode), R);
  const bool in_bwd = mode != SecondMode::mixed_precision;
  auto make = [] { return make_net_without_never(f64, 7); };
  auto a = make(), b = make();
  const optim::SGDOptions sgd{.lr = 0.1, .momentum = 0.9};
  DdpOptions o;
  o.bucket_cap_mb = 1e-9;
  if (mode == SecondMode::mixed_precision || mode == SecondMode::both) o.mixed_precision = MixedPrecision{.param_dtype = bf16};
  if (mode == SecondMode::delayed_in_backward) {
    o.delay_all_reduce_named_params = {"fc1.weight"};
    o.param_to_hook_all_reduce = "fc1.weight";
  }
  auto trainable = [](nn::Module& m) {
    TensorList t;
    for (const Tensor& p : m.parameters())
      if (p.requires_grad()) t.push_back(p);
    return t;
  };
  std::shared_ptr<optim::InBackwardOptimizers> in_a, in_b;
  if (in_bwd) {
    in_a = optim::apply_optimizer_in_backward(sgd, trainable(*a));
    in_b = optim::apply_optimizer_in_backward(sgd, trainable(*b));
  }
  // a: a first DDP whose backward throws before any gradient, detached, still alive.
  auto first = std::make_unique<DistributedDataParallel>(a, g, o);
  Tensor out = (*first)(inputs(R * 4, 4, 8, f64));
  auto bomb = register_hook(out, [](const Tensor&) -> Tensor { throw std::runtime_error("boom in backward"); });
  bool threw = false;
  try {
    mse_loss(out.to(f64), targets(R * 4, 4, 4, f64)).backward();
  } catch (const std::exception&) {
    threw = true;
  }
  expect(threw, "{}: the failing backward did not throw", what);
  first->remove_autograd_hooks();
  for (const auto& [name, p] : a->named_parameters())
    expect(p.dtype() == f64, "{}: after remove_autograd_hooks {} is {}", what, name, p.dtype());
  std::unique_ptr<DistributedDataParallel> second;
  try {
    second = std::make_unique<DistributedDataParallel>(a, g, o);
  } catch (const std::exception& e) {
    expect(false, "{}: the second DDP could not be built: {}", what, e.what());
  }
  auto only = std::make_unique<DistributedDataParallel>(b, g, o);
  std::optional<optim::SGD> opt_a, opt_b;
  if (!in_bwd) {
    opt_a.emplace(a->parameters(), sgd);
    opt_b.emplace(b->parameters(), sgd);
  }
  auto train = [&](int steps) {
    for (int step = 0; step < steps; ++step) {
      if (!in_bwd) {
        opt_a->zero_grad();
        opt_b->zero_grad();
      }
      const int64_t first_row = ((step * 4) * 16 + R) * kRowsPerRank;
      for (DistributedDataParallel* d : {second.get(), only.get()}) {
        mse_loss((*d)(inputs(first_row, kRowsPerRank, 8, f64)).to(f64), targets(first_row, kRowsPerRank, 4, f64))
            .backward();
        d->check_reducer_finalized();
      }
      if (!in_bwd) {
        opt_a->step();
        opt_b->step();
      }
    }
  };
  train(3);
  expect_same_parameters(*a, *b, 0, what);
  first.reset();  // touches nothing
  expect_same_parameters(*a, *b, 0, what + " (after the first DDP is destroyed)");
  train(2);
  expect_same_parameters(*a, *b, 0, what + " (training on after the first DDP is destroyed)");
}

inline void second_ddp_all(ProcessGroupPtr g) {
  for (SecondMode m : {SecondMode::in_backward, SecondMode::mixed_precision, SecondMode::both,
                       SecondMode::delayed_in_backward})
    second_ddp_while_first_lives(g, m);
}

// Mixed precision with the optimizer in backward: a backward that throws after a
// bucket was launched, then DDP destroyed at once. The bucket's continuation (upcast, step) must
// be finished before anything it calls goes away (ASan reads the rest).
inline void destroy_with_reduction_in_flight(ProcessGroupPtr g) {
  const int R = g->rank();
  for (int round = 0; round < 5; ++round) {
    auto model = make_net_without_never(f32, 7);
    TensorList trainable;
    for (const Tensor& p : model->parameters())
      if (p.requires_grad()) trainable.push_back(p);
    auto in_backward = optim::apply_optimizer_in_backward(optim::SGDOptions{.lr = 0.1, .momentum = 0.9}, trainable);
    DdpOptions o;
    o.bucket_cap_mb = 1e-9;
    o.mixed_precision = MixedPrecision{.param_dtype = bf16};
    auto ddp = std::make_unique<DistributedDataParallel>(model, g, o);
    // The gradient reaches h after every parameter's: every bucket is launched, and its
    // continuation (upcast, step) may still run on the communication thread when backward throws.
    Tensor x = inputs(R * 4, 4, 8, f32).requires_grad_();
    Tensor h = x * 1.0;
    auto bomb = register_hook(h, [](const Tensor&) -> Tensor { throw std::runtime_error("boom after a launch"); });
    bool threw = false;
    try {
      mse_loss((*ddp)(h).to(f32), targets(R * 4, 4, 4, f32)).backward();
    } catch (const std::exception&) {
      threw = true;
    }
    expect(threw, "destroy with a reduction in flight: the backward did not throw");
    ddp.reset();
    for (const auto& [name, p] : model->named_parameters())
      expect(p.dtype() == f32, "destroy with a reduction in flight: {} is {} after DDP went", name, p.dtype());
  }
}

// A delayed parameter that holds an f32 .grad when a bf16 mixed-precision DDP is built keeps it
// (the buffer's bf16 view is never attached under mixed precision), and the next synchronised
// backward adds the averaged gradient to it, as an f32 DDP does.
inline void delayed_grad_kept_under_mixed_precision(ProcessGroupPtr g) {
  const int R = g->rank();
  const std::string what = fmt::format("delayed parameter with a .grad at construction, bf16, rank {}", R);
  auto mp = make_embedding_mlp(3), plain = make_embedding_mlp(3);
  for (auto* m : {mp.get(), plain.get()}) {
    m->to(f32);
    m->emb->weight.set_grad(full({20, 8}, 0.25, f32));
  }
  DdpOptions o;
  o.delay_all_reduce_named_params = {"emb.weight"};
  o.param_to_hook_all_reduce = "emb.weight";
  DistributedDataParallel plain_ddp(plain, g, o);
  o.mixed_precision = MixedPrecision{.param_dtype = bf16};
  DistributedDataParallel ddp(mp, g, o);
  const Tensor kept = mp->emb->weight.grad();
  expect(kept.dtype() == f32, "{}: .grad became {} at construction", what, kept.dtype());
  expect(kept.min().item<float>() == 0.25f && kept.max().item<float>() == 0.25f, "{}: .grad changed at construction",
         what);
  for (auto* d : {&ddp, &plain_ddp}) {
    nn::Module& m = d->module();
    d->call([&] { return mse_loss(m(token_batch(0, 0, R)).to(f32), targets(R * 5, 5, 4, f32)); }).backward();
    d->check_reducer_finalized();
  }
  expect(mp->emb->weight.grad().dtype() == f32, "{}: .grad is {} after backward", what, mp->emb->weight.grad().dtype());
  const double d = max_abs_diff(mp->emb->weight.grad(), plain->emb->weight.grad());
  expect(d < 2e-2, "{}: .grad differs from f32 DDP's by {}", what, d);
}

// Under mixed precision the floating tensors `call` passes to its callable are cast
// to param_dtype (as PyTorch casts every floating argument); others are passed as they are.
inline void call_casts_inputs(ProcessGroupPtr g) {
  auto model = make_net_without_never(f32, 7);
  DdpOptions o;
  o.mixed_precision = MixedPrecision{.param_dtype = bf16};
  DistributedDataParallel ddp(model, g, o);
  Tensor x = inputs(0, 4, 8, f32), idx = from_vector<int64_t>({0, 1, 2, 3});
  Dtype seen_x = f32, seen_idx = f32;
  Tensor out = ddp.call(
      [&](const Tensor& a, const Tensor& i) {
        seen_x = a.dtype();
        seen_idx = i.dtype();
        return (*model)(a).index_select(0, i);
      },
      x, idx);
  expect(seen_x == bf16, "call under bf16 mixed precision passed a {} input", seen_x);
  expect(seen_idx == i64, "call passed the integer input as {}", seen_idx);
  expect(out.dtype() == bf16, "call's layers computed in {}", out.dtype());
  mse_loss(out.to(f32), targets(0, 4, 4, f32)).backward();
  ddp.check_reducer_finalized();
  expect(model->fc1->weight.dtype() == f32, "after backward fc1.weight is {}", model->fc1->weight.dtype());
}

// Right after a backward that threw, check_reducer_finalized says so (and the next forward starts
// afresh), rather than blaming parameters for receiving no gradient: whether it threw after every
// gradient hook fired, or right after DDP adopted it (find_unused_parameters has then marked the
// parameters it does not reach ready already, and launched their buckets). Training then goes
// on, a no_sync micro-batch first, exactly as one process would. (The ranks fail at the same point
// of the same graph: a backward that throws after different collectives on different ranks leaves
// the group out of step, which the next collective reports.)
inline void check_after_failed_backward(ProcessGroupPtr g, bool before_hooks) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("after a failed backward (before_hooks={}), rank {}/{}", before_hooks, R, W);
  auto model = make_net(f64, 7), reference = make_net(f64, 7);  // `never` is unused everywhere
  model->rank = R;
  DistributedDataParallel ddp(model, g, {.bucket_cap_mb = 1e-9, .find_unused_parameters = true});
  {
    Tensor x = inputs(R * 4, 4, 8, f64).requires_grad_();
    Tensor h = x * 1.0;
    Tensor out = ddp(h);
    auto bomb = register_hook(before_hooks ? out : h, [](const Tensor&) -> Tensor { throw std::runtime_error("boom"); });
    try {
      mse_loss(out, targets(R * 4, 4, 4, f64)).backward();
    } catch (const std::exception&) {
    }
  }
  std::string error;
  try {
    ddp.check_reducer_finalized();
  } catch (const std::exception& e) {
    error = e.what();
  }
  expect(error.find("[ddp] the last backward failed") != std::string::npos &&
             error.find("received no gradient") == std::string::npos,
         "{}: check_reducer_finalized said '{}'", what, error);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    {
      auto guard = ddp.no_sync();
      ddp.call([&] { return shard_loss(*model, step, R, f64, 0); }).backward();
    }
    ddp.call([&] { return shard_loss(*model, step, R, f64, 1); }).backward();
    ddp.check_reducer_finalized();
    opt.step();
    ref_opt.zero_grad();
    reference_backward(W, 2, [&](int r, int micro) {
      reference->rank = r;
      return shard_loss(*reference, step, r, f64, micro);
    });
    ref_opt.step();
  }
  expect_same_parameters(*model, *reference, 1e-10, what);
}

// Mixed precision after a backward that threw (the way back it queued is dropped with it): the
// next forward starts from the masters, and training goes on exactly as a DDP that never failed,
// with delayed parameters too, a no_sync micro-batch first.
inline void mixed_precision_after_failed_backward(ProcessGroupPtr g, bool delayed) {
  const int R = g->rank();
  const std::string what = fmt::format("bf16 after a failed backward, delayed={}, rank {}", delayed, R);
  auto a = make_net_without_never(f64, 7), b = make_net_without_never(f64, 7);
  DdpOptions o;
  o.bucket_cap_mb = 1e-9;
  o.mixed_precision = MixedPrecision{.param_dtype = bf16};
  if (delayed) {
    o.delay_all_reduce_named_params = {"fc1.weight"};
    o.param_to_hook_all_reduce = "fc2.weight";
  }
  DistributedDataParallel da(a, g, o), db(b, g, o);
  {
    // DDP adopts the backward and queues the way back; then the backward throws and drops it.
    Tensor out = da(inputs(R * 4, 4, 8, f64));
    auto bomb = register_hook(out, [](const Tensor&) -> Tensor { throw std::runtime_error("boom"); });
    try {
      mse_loss(out.to(f64), targets(R * 4, 4, 4, f64)).backward();
    } catch (const std::exception&) {
    }
  }
  optim::SGD opt_a(a->parameters(), {.lr = 0.1}), opt_b(b->parameters(), {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    for (auto [d, opt] : {std::pair{&da, &opt_a}, std::pair{&db, &opt_b}}) {
      opt->zero_grad();
      const int64_t first = ((step * 4) * 16 + R) * kRowsPerRank;
      {
        auto guard = d->no_sync();
        mse_loss((*d)(inputs(first, 4, 8, f64)).to(f64), targets(first, 4, 4, f64)).backward();
      }
      mse_loss((*d)(inputs(first + 4, 4, 8, f64)).to(f64), targets(first + 4, 4, 4, f64)).backward();
      d->check_reducer_finalized();
      opt->step();
    }
    for (const auto& [name, p] : a->named_parameters())
      expect(p.dtype() == f64, "{}: after step {} {} is {}", what, step, name, p.dtype());
  }
  expect_same_parameters(*a, *b, 0, what);
}

// Under mixed precision, another computation through a delayed parameter, backwarded between
// DDP's forward and DDP's backward, does not take the way back mid-iteration: DDP's backward
// still runs on the shadows and its reduction lands in the masters, as an f32 DDP's does.
inline void mixed_precision_side_backward(ProcessGroupPtr g) {
  const int R = g->rank();
  const std::string what = fmt::format("bf16 with a side backward, rank {}", R);
  auto mp = make_embedding_mlp(3), plain = make_embedding_mlp(3);
  DdpOptions o;
  o.delay_all_reduce_named_params = {"emb.weight"};
  o.param_to_hook_all_reduce = "emb.weight";
  DistributedDataParallel plain_ddp(plain, g, o);
  o.mixed_precision = MixedPrecision{.param_dtype = bf16};
  DistributedDataParallel ddp(mp, g, o);
  for (auto* d : {&ddp, &plain_ddp}) {
    nn::Module& m = d->module();
    m.zero_grad();
    Tensor out = d->call([&] { return mse_loss(m(token_batch(0, 0, R)).to(f64), targets(R * 5, 5, 4, f64)); });
    const Tensor w = m.named_parameters().at("emb.weight");
    ((w * w).sum() * 0.01).backward();
    out.backward();
    d->check_reducer_finalized();
  }
  for (const auto& [name, p] : mp->named_parameters()) {
    expect(p.dtype() == f64, "{}: {} is {} after backward", what, name, p.dtype());
    const double d = max_abs_diff(p.grad(), plain->named_parameters().at(name).grad());
    expect(d < 2e-2, "{}: {}'s gradient differs from f64 DDP's by {}", what, name, d);
  }
}

// static_graph: a delayed parameter that starts receiving a gradient after the first iteration is
// the static_graph error on the rank that sees it (the others time out), as a bucketed one.
inline void delayed_static_graph_changes(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const int changer = W - 1;
  auto model = make_net(f64);
  model->rank = R;
  model->extra->bias.requires_grad_(false);  // only the delayed extra.weight changes
  int step = 0;
  model->use_extra = [&](int r) { return r == changer && step >= 2; };
  DdpOptions o;
  o.static_graph = true;
  o.delay_all_reduce_named_params = {"extra.weight"};
  o.param_to_hook_all_reduce = "fc1.weight";
  DistributedDataParallel ddp(model, g, o);
  std::string error;
  try {
    for (step = 0; step < 4; ++step) {
      model->zero_grad();
      mse_loss(ddp(inputs(step * 8 + R, 4, 8, f64)), targets(step * 8 + R, 4, 4, f64)).backward();
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (R == changer) {
    expect(error.find("the training graph changed in this iteration (delayed-allreduce parameter 'extra.weight'") !=
               std::string::npos,
           "rank {}: expected the static_graph error, got '{}' at step {}", R, error, step);
    expect(step == 2, "rank {}: the error came at step {}, not 2", R, step);
  } else {
    expect(!error.empty(), "rank {}: no error after the changer failed", R);
  }
}

}  // namespace ddp_cases
