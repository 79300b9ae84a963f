// ZeroRedundancyOptimizer (dist/zero.h): ZeRO stage 1 behind DDP. Two DDP models on one group,
// the same start and data: one stepped by ZeRO, one by the plain optimizer; after every step their
// parameters must agree to 1e-12 in f64 (the same arithmetic per parameter), the state sharded
// across ranks must add up to the plain optimizer's, and the consolidated state dict must be the
// plain optimizer's and load back at this number of ranks whatever number wrote it.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp_cases.h"
#include "ddp_in_backward_cases.h"  // plain_optimizer
#include "ddp_join_cases.h"

namespace ddp_cases {

inline std::string spec_name(const optim::OptimizerSpec& spec) {
  return std::visit(
      [](const auto& o) -> std::string {
        using O = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<O, optim::SGDOptions>) {
          return "SGD";
        } else if constexpr (std::is_same_v<O, optim::AdamOptions>) {
          return o.amsgrad ? "Adam(amsgrad)" : "Adam";
        } else {
          return "AdamW";
        }
      },
      spec);
}

inline void expect_same_state_dicts(const nn::TensorDict& got, const nn::TensorDict& want, const std::string& what) {
  expect(got.size() == want.size(), "{}: {} state entries, the plain optimizer has {}", what, got.size(), want.size());
  for (const auto& [key, t] : want) {
    expect(got.contains(key), "{}: the state dict lacks '{}'", what, key);
    const double d = max_abs_diff(got.at(key), t);
    expect(d <= 1e-12, "{}: '{}' differs from the plain optimizer's by {}", what, key, d);
  }
}

// Rank r's loss of micro-batch `micro` at `step`, through DDP (shard_loss's rows).
inline Tensor ddp_shard_loss(DistributedDataParallel& ddp, int step, int r, int micro = 0) {
  const int64_t first = ((step * 4 + micro) * 16 + r) * kRowsPerRank;
  return mse_loss(ddp(inputs(first, kRowsPerRank, 8, f64)), targets(first, kRowsPerRank, 4, f64));
}

using DdpAndOptimizer = std::pair<DistributedDataParallel*, optim::Optimizer*>;

// One step of each model: zero_grad, `micro` backwards of loss(ddp, k) (all but the last under
// no_sync), then the optimizer's step.
inline void step_each(std::initializer_list<DdpAndOptimizer> models, int micro,
                      const std::function<Tensor(DistributedDataParallel&, int micro)>& loss) {
  for (auto [ddp, opt] : models) {
    opt->zero_grad();
    for (int k = 0; k < micro; ++k) {
      auto guard = k + 1 < micro ? std::optional<DistributedDataParallel::NoSyncGuard>(ddp->no_sync()) : std::nullopt;
      loss(*ddp, k).backward();
    }
    opt->step();
  }
}

// ZeRO and the plain optimizer, each behind its own DDP, over `steps` steps of `micro` micro-batches.
inline void zero_equivalence(ProcessGroupPtr g, const optim::OptimizerSpec& spec, double bucket_cap_mb, int micro,
                             bool schedule) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("zero {} cap={} micro={} schedule={} rank {}/{}", spec_name(spec), bucket_cap_mb,
                                       micro, schedule, R, W);
  auto zero_model = make_net_without_never(f64, R == 0 ? 7 : 100 + R);
  auto plain_model = make_net_without_never(f64, R == 0 ? 7 : 200 + R);
  DistributedDataParallel zero_ddp(zero_model, g);
  DistributedDataParallel plain_ddp(plain_model, g);
  ZeroRedundancyOptimizer zero(zero_model->parameters(), spec, g, {.bucket_cap_mb = bucket_cap_mb});
  auto plain = plain_optimizer(spec, plain_model->parameters());
  std::unique_ptr<optim::StepLR> zero_sched, plain_sched;
  if (schedule) {
    zero_sched = std::make_unique<optim::StepLR>(zero, 2, 0.5);
    plain_sched = std::make_unique<optim::StepLR>(*plain, 2, 0.5);
  }
  for (int step = 0; step < 5; ++step) {
    step_each({{&zero_ddp, &zero}, {&plain_ddp, plain.get()}}, micro,
              [&](DistributedDataParallel& ddp, int k) { return ddp_shard_loss(ddp, step, R, k); });
    if (schedule) {
      zero_sched->step();
      plain_sched->step();
    }
    expect_same_parameters(*zero_model, *plain_model, 1e-12, fmt::format("{} step {}", what, step));
  }
  // The partition: every parameter has one owner, and the state held across ranks is the plain
  // optimizer's, each rank holding its partition's.
  int64_t plain_bytes = 0, local_numel = 0;
  for (const Tensor& p : plain_model->parameters())
    if (const optim::ParamState* st = plain->state(p))
      for (const auto& [name, t] : st->buffers) plain_bytes += static_cast<int64_t>(t.nbytes());
  for (const Tensor& p : zero.local_parameters()) local_numel += p.numel();
  Tensor sums = from_vector<int64_t>({zero.local_state_bytes(), local_numel}, {2});
  g->allreduce(sums, ReduceOp::sum)->wait();
  int64_t total_numel = 0;
  for (const Tensor& p : zero_model->parameters()) total_numel += p.numel();
  expect(sums.to_vector<int64_t>()[0] == plain_bytes, "{}: the ranks hold {} state bytes in all, the plain optimizer {}",
         what, sums.to_vector<int64_t>()[0], plain_bytes);
  expect(sums.to_vector<int64_t>()[1] == total_numel, "{}: the partitions hold {} of {} elements", what,
         sums.to_vector<int64_t>()[1], total_numel);
  for (size_t i = 0; i < zero.parameters().size(); ++i)
    expect(zero.owner(i) >= 0 && zero.owner(i) < W, "{}: parameter {} has owner {}", what, i, zero.owner(i));

  // The consolidated state dict is the plain optimizer's; on the other ranks state_dict() is an error.
  const int to = W - 1;
  zero.consolidate_state_dict(to);
  if (R == to) {
    expect_same_state_dicts(zero.state_dict(), plain->state_dict(), what);
  } else {
    expect_join_error([&] { zero.state_dict(); },
                      fmt::format("state_dict() on rank {}: the state is sharded; call consolidate_state_dict({})", R, R));
  }
  // A state dict written by one process (or any number of ranks: the format is the same) resumes
  // here: a fresh ZeRO loads it and steps as the plain optimizer does.
  ZeroRedundancyOptimizer resumed(zero_model->parameters(), spec, g, {.bucket_cap_mb = bucket_cap_mb});
  resumed.load_state_dict(plain->state_dict());
  step_each({{&zero_ddp, &resumed}, {&plain_ddp, plain.get()}}, 1,
            [&](DistributedDataParallel& ddp, int) { return ddp_shard_loss(ddp, 9, R); });
  expect_same_parameters(*zero_model, *plain_model, 1e-12, what + " after load_state_dict");
}

inline void zero_equivalence_all(ProcessGroupPtr g) {
  zero_equivalence(g, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true}, 25, 1, false);
  zero_equivalence(g, optim::AdamOptions{.lr = 0.01, .amsgrad = true}, 1e-4, 1, true);  // a bucket per parameter
  zero_equivalence(g, optim::AdamWOptions{.lr = 0.01}, 25, 2, true);
  zero_equivalence(g, optim::AdamOptions{.lr = 0.01}, 4e-4, 1, false);  // a few parameters per bucket
}

// Behind DDP with native mixed precision (bf16 shadows, f32 masters): ZeRO steps its partition of
// the f32 masters, which are the parameters themselves (the shadows live only from a forward to
// the end of its backward), and broadcasts them; the plain optimizer behind the same DDP setup
// must end bitwise equal, with no_sync accumulation between steps.
inline void zero_mixed_precision(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("zero mixed precision rank {}/{}", R, W);
  auto zero_model = make_net_without_never(f32, R == 0 ? 7 : 100 + R);
  auto plain_model = make_net_without_never(f32, R == 0 ? 7 : 200 + R);
  DdpOptions o;
  o.mixed_precision = MixedPrecision{.param_dtype = bf16, .reduce_dtype = f32};
  DistributedDataParallel zero_ddp(zero_model, g, o);
  DistributedDataParallel plain_ddp(plain_model, g, o);
  const optim::AdamWOptions adamw{.lr = 0.01};
  ZeroRedundancyOptimizer zero(zero_model->parameters(), adamw, g, {.bucket_cap_mb = 4e-4});
  optim::AdamW plain(plain_model->parameters(), adamw);
  for (int step = 0; step < 4; ++step) {
    step_each({{&zero_ddp, &zero}, {&plain_ddp, &plain}}, 2, [&](DistributedDataParallel& ddp, int k) {
      const int64_t first = ((step * 4 + k) * 16 + R) * kRowsPerRank;
      Tensor out = ddp(inputs(first, kRowsPerRank, 8, f32));
      expect(out.dtype() == bf16, "{}: the forward ran in {}, not bf16", what, out.dtype());
      return mse_loss(out.to(f32), targets(first, kRowsPerRank, 4, f32));
    });
    for (const Tensor& p : zero_model->parameters())
      expect(p.dtype() == f32, "{}: a parameter reads as {} between steps, not its f32 master", what, p.dtype());
    expect_same_parameters(*zero_model, *plain_model, 0, fmt::format("{} step {}", what, step));
  }
}

// overlap_with_ddp: the partition is stepped inside backward as DDP reduces each bucket; step()
// only broadcasts. The same parameters as DDP + the plain optimizer stepped after backward, with
// no_sync accumulation, a schedule and a bucket per parameter or a few; and under bf16 mixed
// precision (the steps run on the f32 masters) bitwise.
inline void zero_overlap(ProcessGroupPtr g, const optim::OptimizerSpec& spec, double ddp_cap_mb, int micro,
                         std::optional<Dtype> low) {
  const int W = g->size(), R = g->rank();
  const Dtype dt = low ? f32 : f64;
  const std::string what = fmt::format("zero overlap {} cap={} micro={} mp={} rank {}/{}", spec_name(spec), ddp_cap_mb,
                                       micro, low ? dtype_name(*low) : "none", R, W);
  auto zero_model = make_net_without_never(dt, R == 0 ? 7 : 100 + R);
  auto plain_model = make_net_without_never(dt, R == 0 ? 7 : 200 + R);
  // Before DDP, which takes its steps over.
  ZeroRedundancyOptimizer zero(zero_model->parameters(), spec, g, {.overlap_with_ddp = true});
  DdpOptions o;
  o.bucket_cap_mb = ddp_cap_mb;
  if (low) o.mixed_precision = MixedPrecision{.param_dtype = *low, .reduce_dtype = f32};
  DistributedDataParallel zero_ddp(zero_model, g, o);
  DistributedDataParallel plain_ddp(plain_model, g, o);
  auto plain = plain_optimizer(spec, plain_model->parameters());
  optim::StepLR zero_sched(zero, 2, 0.5), plain_sched(*plain, 2, 0.5);
  for (int step = 0; step < 5; ++step) {
    step_each({{&zero_ddp, &zero}, {&plain_ddp, plain.get()}}, micro, [&](DistributedDataParallel& ddp, int k) {
      const int64_t first = ((step * 4 + k) * 16 + R) * kRowsPerRank;
      return mse_loss(ddp(inputs(first, kRowsPerRank, 8, dt)).to(dt), targets(first, kRowsPerRank, 4, dt));
    });
    zero_sched.step();
    plain_sched.step();
    for (const Tensor& p : zero_model->parameters())
      expect(!p.grad().defined(), "{}: a gradient is left after the steps in backward", what);
    expect_same_parameters(*zero_model, *plain_model, low ? 0 : 1e-12, fmt::format("{} step {}", what, step));
  }
  zero.consolidate_state_dict(0);
  if (R == 0) expect_same_state_dicts(zero.state_dict(), plain->state_dict(), what);
}

inline void zero_overlap_all(ProcessGroupPtr g) {
  zero_overlap(g, optim::AdamOptions{.lr = 0.01, .amsgrad = true}, 1e-9, 1, std::nullopt);  // a bucket per parameter
  zero_overlap(g, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}, 4e-4, 2, std::nullopt);
  zero_overlap(g, optim::AdamWOptions{.lr = 0.01}, 25, 2, bf16);
}

// overlap_with_ddp's misuse: DDP made first (it claimed the gradients), or no DDP at all.
inline void zero_overlap_errors(ProcessGroupPtr g) {
  {
    auto net = make_net_without_never(f64, 7);
    DistributedDataParallel ddp(net, g);
    expect_join_error(
        [&] { ZeroRedundancyOptimizer z(net->parameters(), optim::AdamOptions{}, g, {.overlap_with_ddp = true}); },
        "is managed by DistributedDataParallel: apply the optimizer in backward before wrapping the module");
  }
  {
    auto net = make_net_without_never(f64, 7);
    ZeroRedundancyOptimizer z(net->parameters(), optim::AdamOptions{}, g, {.overlap_with_ddp = true});
    DistributedDataParallel ddp(net, g);
    expect_join_error([&] { Join join({&ddp, &z}); }, "overlap_with_ddp does not work under a Join");
  }
  const Tensor x = inputs(0, 4, 8, f64), y = targets(0, 4, 4, f64);
  {
    // A Join over DDP alone: its shadow reductions would run no steps on a joined rank.
    auto net = make_net_without_never(f64, 7);
    ZeroRedundancyOptimizer z(net->parameters(), optim::AdamOptions{}, g, {.overlap_with_ddp = true});
    DistributedDataParallel ddp(net, g);
    expect_join_error([&] { Join join({&ddp}); }, "[Join] DDP with an optimizer in backward");
  }
  {
    // Two synchronised backwards before step(): DDP + Adam would accumulate; here every rank raises.
    auto net = make_net_without_never(f64, 7);
    ZeroRedundancyOptimizer z(net->parameters(), optim::AdamOptions{}, g, {.overlap_with_ddp = true});
    DistributedDataParallel ddp(net, g);
    mse_loss(ddp(x), y).backward();
    expect_join_error([&] { mse_loss(ddp(x), y).backward(); }, "was reduced again before step()");
  }
  {
    // A parameter frozen when the optimizer was made and trained later has no step in backward.
    auto net = make_net_without_never(f64, 7);
    net->fc1->bias.requires_grad_(false);
    ZeroRedundancyOptimizer z(net->parameters(), optim::AdamOptions{}, g, {.overlap_with_ddp = true});
    net->fc1->bias.requires_grad_(true);
    DistributedDataParallel ddp(net, g);
    mse_loss(ddp(x), y).backward();
    expect_join_error([&] { z.step(); }, "has a gradient but no step in backward");
  }
  {
    // step_only: only optimizers that can skip parameters, only their own parameters.
    auto net = make_net_without_never(f64, 7);
    TensorList ps = net->parameters();
    optim::SGD sgd({ps[0]}, {.lr = 0.1});
    expect_join_error([&] { sgd.step_only(ps[1]); }, "[SGD] step_only: the tensor of shape [16] is not one of");
    ZeroRedundancyOptimizer plain(ps, optim::SGDOptions{}, g);
    expect_join_error([&] { plain.step_only(ps[0]); }, "step_only: this optimizer cannot step one parameter alone");
  }
  auto net = make_net_without_never(f64, 7);
  ZeroRedundancyOptimizer z(net->parameters(), optim::AdamOptions{}, g, {.overlap_with_ddp = true});
  mse_loss((*net)(x), y).backward();
  expect_join_error([&] { z.step(); }, "[ZeroRedundancyOptimizer] overlap_with_ddp: no DistributedDataParallel steps "
                                       "parameter 0");
}

// Two parameter groups (weight decay on the matrices only, as train's GPT), one with its own
// learning rate: the same as the plain optimizer with those groups, state dict included.
inline void zero_two_groups(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("zero two groups rank {}/{}", R, W);
  auto zero_model = make_net_without_never(f64, R == 0 ? 7 : 100 + R);
  auto plain_model = make_net_without_never(f64, R == 0 ? 7 : 200 + R);
  auto split = [](Net& m) {
    std::pair<TensorList, TensorList> out;
    for (const auto& [name, p] : m.named_parameters())
      if (p.requires_grad()) (p.dim() >= 2 ? out.first : out.second).push_back(p);
    return out;
  };
  auto [zw, zb] = split(*zero_model);
  auto [pw, pb] = split(*plain_model);
  DistributedDataParallel zero_ddp(zero_model, g), plain_ddp(plain_model, g);
  ZeroRedundancyOptimizer zero({{zw, optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1}},
                                {zb, optim::AdamWOptions{.lr = 0.01, .weight_decay = 0}}},
                               g);
  optim::AdamW plain(std::vector<optim::AdamW::Group>{{pw, optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1}},
                                                      {pb, optim::AdamWOptions{.lr = 0.01, .weight_decay = 0}}});
  for (int step = 0; step < 4; ++step) {
    if (step == 2) {
      zero.set_lr(1, 0.003);
      plain.set_lr(1, 0.003);
    }
    step_each({{&zero_ddp, &zero}, {&plain_ddp, &plain}}, 1,
              [&](DistributedDataParallel& ddp, int) { return ddp_shard_loss(ddp, step, R); });
    expect_same_parameters(*zero_model, *plain_model, 1e-12, fmt::format("{} step {}", what, step));
  }
  expect(zero.num_param_groups() == 2 && zero.lr(1) == 0.003, "{}: groups or lr wrong", what);
  zero.consolidate_state_dict(0);
  if (R == 0) expect_same_state_dicts(zero.state_dict(), plain.state_dict(), what);
  expect_join_error([&] { ZeroRedundancyOptimizer z({{zw, optim::SGDOptions{}}, {zb, optim::AdamOptions{}}}, g); },
                    "group 1 differs from group 0");
}

// ZeRO under a Join: a joined rank steps its partition with the gradients of the ranks still
// training and the learning rate of their schedule, so all ranks train as one process would.
inline void zero_with_join(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("zero join rank {}/{}", R, W);
  auto model = make_net_without_never(f64, R == 0 ? 7 : 100 + R);
  auto reference = make_net_without_never(f64, 7);
  const optim::OptimizerSpec spec = optim::AdamWOptions{.lr = 0.02};
  DistributedDataParallel ddp(model, g);
  ZeroRedundancyOptimizer zero(model->parameters(), spec, g);
  optim::StepLR sched(zero, 1, 0.7);
  {
    Join join({&ddp, &zero});
    data::DataLoader loader(join_shard(R, R), join_loader_options());  // R + 1 batches
    for (const TensorList& b : loader) {
      zero.zero_grad();
      mse_loss(ddp(b[0]), b[1]).backward();
      zero.step();
      sched.step();
    }
  }
  std::vector<std::vector<TensorList>> batches;
  for (int r = 0; r < W; ++r) batches.push_back(join_batches(r, r));
  auto ref_opt = plain_optimizer(spec, reference->parameters());
  optim::StepLR ref_sched(*ref_opt, 1, 0.7);
  train_uneven_reference(*reference, *ref_opt, batches, [&] { ref_sched.step(); });
  expect_same_parameters(*model, *reference, 1e-12, what);
  // The state too: consolidated, it is the reference optimizer's.
  zero.consolidate_state_dict(0);
  if (R == 0) expect_same_state_dicts(zero.state_dict(), ref_opt->state_dict(), what);
}

inline void zero_errors(ProcessGroupPtr g) {
  auto model = make_net_without_never(f64, 7);
  TensorList params = model->parameters();
  expect_join_error([&] { ZeroRedundancyOptimizer z(TensorList{}, optim::SGDOptions{}, g); },
                    "[ZeroRedundancyOptimizer] got no parameters");
  expect_join_error([&] { ZeroRedundancyOptimizer z({params[0], params[0]}, optim::SGDOptions{}, g); },
                    "parameter 1 appears more than once");
  expect_join_error([&] { ZeroRedundancyOptimizer z(params, optim::SGDOptions{.lr = -1}, g); }, "invalid learning rate");
  expect_join_error([&] { ZeroRedundancyOptimizer z(params, optim::SGDOptions{}, g, {.bucket_cap_mb = 0}); },
                    "[ZeroRedundancyOptimizer] bucket_cap_mb must be positive, got 0");
  ZeroRedundancyOptimizer zero(params, optim::AdamOptions{}, g);
  expect_join_error([&] { zero.consolidate_state_dict(g->size()); }, "is not in the group");
  expect_join_error([&] { zero.set_lr(1, 0.1); }, "[ZeroRedundancyOptimizer] has 1 parameter groups, not 2");
  expect_join_error([&] { (void)zero.lr(3); }, "has 1 parameter groups, not 4");
  {
    // Joinables must share one group: a ZeRO over a copy of DDP's group is refused at once.
    std::vector<int> all(static_cast<size_t>(g->size()));
    for (int r = 0; r < g->size(); ++r) all[static_cast<size_t>(r)] = r;
    ProcessGroupPtr copy = g->new_group(all);
    auto net = make_net_without_never(f64, 7);
    DistributedDataParallel ddp(net, g);
    ZeroRedundancyOptimizer z(net->parameters(), optim::AdamOptions{}, copy);
    expect_join_error([&] { Join join({&ddp, &z}); }, "[Join] every joinable must communicate over the same group");
  }
  expect_join_error([&] { zero.state_dict(); }, "call consolidate_state_dict");
  {
    auto net = make_net_without_never(f64, 7);
    DistributedDataParallel ddp(net, g);
    ZeroRedundancyOptimizer z(net->parameters(), optim::AdamOptions{}, g);
    expect_join_error([&] { Join join({&z, &ddp}); }, "[Join] joinable 1 announces the iterations");
  }
  // A state dict of another model is refused before anything changes.
  nn::TensorDict bad;
  bad.insert("state.0.exp_avg", zeros({3, 3}, f64));
  expect_join_error([&] { zero.load_state_dict(bad); }, "has shape [3, 3]");
  if (g->size() > 1) {  // different parameters on one rank: every rank raises
    TensorList fewer(params.begin(), params.end() - (g->rank() == 1 ? 1 : 0));
    expect_join_error([&] { ZeroRedundancyOptimizer z(fewer, optim::SGDOptions{}, g); },
                      "the ranks pass different parameters");
  }
}

}  // namespace ddp_cases
