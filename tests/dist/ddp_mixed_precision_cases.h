// DDP's native mixed precision (DdpOptions::mixed_precision): low-precision shadows of f32 masters
// against f32 training of one process (plain, no_sync, static_graph, with a comm hook), its casts
// on a side stream, its buffers and option errors, and mixed precision with the optimizer in
// backward and with delayed-allreduce parameters. Shared by test_ddp (threads backend) and
// test_ddp_mpi (mpirun) through ddp_case_table.h; each case runs on every rank and throws on a
// failed check; equivalence is against one process computing every rank's loss.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ddp_delayed_cases.h"

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
