// ZeroRedundancyOptimizer under a Join (dist/zero.h, dist/join.h): a rank that runs out of data no
// longer runs the user's loop, yet steps its share of the parameters. It must step it exactly as
// the ranks still training would: with the averaged gradients upcast into its f32 masters under
// mixed precision, clipped as the user's loop clips them, at the learning rate of their schedule;
// and afterwards its schedulers must stand where theirs do. Each case trains two models on the
// same uneven shards (rank r: r + 1 full batches and a short one), one with ZeRO under a Join, one
// with DDP + the plain optimizer under a Join (whose joined ranks step nothing and take the final
// parameters from a rank that trained last), and wants the same bits.
#pragma once

#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp_join_cases.h"
#include "ddp_zero_cases.h"

namespace ddp_cases {

struct ZeroJoinCase {
  std::optional<Dtype> low;    // DDP mixed precision: parameters and reduction in this dtype
  std::optional<double> clip;  // the user's clip_grad_norm_ of every iteration
  bool refused_clip = false;   // every iteration also tries a clip another observer refuses
  std::string str() const {
    return fmt::format("mp={} clip={} refused_clip={}", low ? dtype_name(*low) : "none",
                       clip ? fmt::format("{}", *clip) : "none", refused_clip);
  }
};

// A warm-up then a cosine (train's GPT schedule), as children of a SequentialLR.
inline std::unique_ptr<optim::SequentialLR> warmup_cosine(optim::Optimizer& opt) {
  auto warmup = std::make_shared<optim::LinearLR>(opt, 0.25, 1.0, 2);
  auto cosine = std::make_shared<optim::CosineAnnealingLR>(opt, 6, 1e-4);
  return std::make_unique<optim::SequentialLR>(opt, std::vector<std::shared_ptr<optim::LRScheduler>>{warmup, cosine},
                                               std::vector<int64_t>{2});
}

// Rank R's loop over its uneven shard under a Join of `joinables`; returns the batches it trained.
inline int64_t train_uneven(DistributedDataParallel& ddp, optim::Optimizer& opt, optim::LRScheduler& schedule,
                            std::vector<Joinable*> joinables, const ZeroJoinCase& c, int R) {
  const Dtype dt = c.low ? f32 : f64;
  int64_t trained = 0;
  Join join(std::move(joinables));
  data::DataLoader loader(join_shard(R, R + 1), join_loader_options());
  for (const TensorList& b : loader) {
    opt.zero_grad();
    mse_loss(ddp(b[0].to(dt)).to(dt), b[1].to(dt)).backward();
    if (c.refused_clip) {
      // A clip that never happens (refused after the ZeRO's own check passed) is not repeated.
      HookHandle refuse = nn::utils::observe_gradient_clipping(
          ddp.module().parameters(), {.check = [](const TensorList&) { fail("[test] this clip is refused"); }});
      try {
        nn::utils::clip_grad_norm_(ddp.module().parameters(), 1e-4);
      } catch (const Error&) {
      }
    }
    if (c.clip) nn::utils::clip_grad_norm_(ddp.module().parameters(), *c.clip);
    opt.step();
    schedule.step();
    ++trained;
  }
  join.join();
  return trained;
}

inline void zero_join_against_plain(ProcessGroupPtr g, const ZeroJoinCase& c) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("zero join {} rank {}/{}", c.str(), R, W);
  const Dtype dt = c.low ? f32 : f64;
  auto zero_model = make_net_without_never(dt, R == 0 ? 7 : 100 + R);
  auto plain_model = make_net_without_never(dt, R == 0 ? 7 : 200 + R);
  DdpOptions o;
  o.bucket_cap_mb = 4e-4;  // a few parameters per bucket
  if (c.low) o.mixed_precision = MixedPrecision{.param_dtype = *c.low};
  DistributedDataParallel zero_ddp(zero_model, g, o), plain_ddp(plain_model, g, o);
  const optim::AdamWOptions adamw{.lr = 0.02};
  ZeroRedundancyOptimizer zero(zero_model->parameters(), adamw, g, {.bucket_cap_mb = 4e-4});
  optim::AdamW plain(plain_model->parameters(), adamw);
  auto zero_schedule = warmup_cosine(zero);
  auto plain_schedule = warmup_cosine(plain);
  const int64_t zero_trained = train_uneven(zero_ddp, zero, *zero_schedule, {&zero_ddp, &zero}, c, R);
  train_uneven(plain_ddp, plain, *plain_schedule, {&plain_ddp}, c, R);
  expect(zero_trained == R + 2, "{}: trained {} batches", what, zero_trained);
  expect_same_parameters(*zero_model, *plain_model, 0, what);
  // Every rank's schedule stands where the longest shard's left it (W + 1 steps), at its rate.
  expect(zero_schedule->last_epoch() == W + 1, "{}: the schedule is at epoch {} after the Join, the ranks that "
         "trained last left it at {}", what, zero_schedule->last_epoch(), W + 1);
  expect(zero.lr() == zero_schedule->lr_at(W + 1, 0), "{}: lr {} after the Join, the schedule's is {}", what,
         zero.lr(), zero_schedule->lr_at(W + 1, 0));
}

inline void zero_join_mixed_precision_and_clipping(ProcessGroupPtr g) {
  zero_join_against_plain(g, {});
  zero_join_against_plain(g, {.clip = 0.05});
  zero_join_against_plain(g, {.low = bf16});
  zero_join_against_plain(g, {.low = f16});
  zero_join_against_plain(g, {.low = bf16, .clip = 0.05});
  zero_join_against_plain(g, {.refused_clip = true});
}

// Under a Join a clip of a tensor the ZeRO does not hold cannot be repeated by a joined rank: the
// call is refused (nothing scaled); outside a Join the same call is fine.
inline void zero_join_clip_errors(ProcessGroupPtr g) {
  auto model = make_net_without_never(f64, 7);
  DistributedDataParallel ddp(model, g);
  TensorList params = model->parameters();
  const TensorList held(params.begin() + 1, params.end());  // fc1.weight left out
  ZeroRedundancyOptimizer zero(held, optim::AdamOptions{.lr = 0.01}, g);
  const Tensor x = inputs(0, 4, 8, f64), y = targets(0, 4, 4, f64);
  mse_loss(ddp(x), y).backward();
  nn::utils::clip_grad_norm_(params, 1e-3);  // no Join: nothing to repeat
  zero.step();
  Join join({&ddp, &zero});
  zero.zero_grad();
  model->zero_grad();
  mse_loss(ddp(x), y).backward();
  const Tensor before = params[0].grad().clone();
  expect_join_error([&] { nn::utils::clip_grad_norm_(params, 1e-3); },
                    "[ZeroRedundancyOptimizer] under a Join, clip_grad_norm_ may clip only this optimizer's parameters: "
                    "it also clips the gradient of a tensor of shape [16, 8]");
  expect(max_abs_diff(before, params[0].grad()) == 0, "zero join clip: a refused clip scaled a gradient");
  nn::utils::clip_grad_norm_(held, 1e-3);  // its own parameters: fine
  zero.step();
  join.join();
  if (g->size() > 1) {
    // The schedulers' positions travel with the hyperparameters: every rank must hold the same
    // ones, checked when the Join is made, on every rank alike.
    ZeroRedundancyOptimizer other(held, optim::AdamOptions{.lr = 0.01}, g);
    optim::StepLR first(other, 2);
    std::optional<optim::StepLR> extra;
    if (g->rank() == 1) extra.emplace(other, 3);
    expect_join_error([&] { Join bad({&ddp, &other}); },
                      "under a Join every rank must build the same learning-rate schedulers on the optimizer: the "
                      "ranks hold between 1 and 2");
  }
}

}  // namespace ddp_cases
