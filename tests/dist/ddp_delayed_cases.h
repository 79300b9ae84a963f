// DDP's delayed allreduce (delay_all_reduce_named_params, param_to_hook_all_reduce): the delayed
// parameters train as one process would, on a group of their own, also on ranks that give them no
// gradient; the options' errors. Shared by test_ddp (threads backend) and test_ddp_mpi (mpirun)
// through ddp_case_table.h; each case runs on every rank and throws on a failed check; equivalence
// is against one process computing every rank's loss.
#pragma once

#include <string>
#include <vector>

#include "ddp_cases.h"

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

inline std::shared_ptr<EmbeddingMlp> make_embedding_mlp(uint64_t seed) { return seeded_f64<EmbeddingMlp>(seed); }

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
