// DDP's modes on the small GPT of train --model gpt (tools/train/models.h: fused causal attention,
// lm_head.weight tied to wte.weight, nanoGPT's AdamW parameter groups), each alone and together:
// static_graph, the optimizer in backward (one per parameter group), the delayed allreduce of the
// token embedding hooked to the first block's first parameter (train's --delay-allreduce
// wte.weight), gradient clipping on DDP's averaged gradients, and bf16 mixed precision. Without
// mixed precision every combination equals one process training on the concatenation of every
// rank's batch, in f64; with bf16 the f32 masters track that training in f32. Shared by test_ddp
// (threads backend) and test_ddp_mpi (mpirun) through ddp_case_table.h; each case runs on every
// rank and throws on a failed check.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ddp_cases.h"
#include "train/models.h"

namespace ddp_cases {

// nanoGPT at a test's size: 13 characters, a context of 8, 2 blocks of 2 heads over 16 channels
// (about 7k parameters), no dropout, biases on as in train.
inline GptConfig small_gpt_config() {
  return {.vocab_size = 13, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16, .dropout = 0.0, .bias = true};
}
constexpr int64_t kGptRows = 2;  // sequences per rank and step
constexpr int kGptSteps = 5;
// The clipping threshold: below the gradient norm of the first step at every world size up to 4
// (about 1 to 2 here), so clip_grad_norm_ scales the gradients at least once (checked), and above
// some later steps' norms, so it also leaves them alone.
constexpr double kGptMaxNorm = 0.5;

inline std::shared_ptr<Gpt> make_small_gpt(uint64_t seed, Dtype dt) {
  manual_seed(seed);
  auto m = make_gpt(small_gpt_config());
  m->to(dt);
  return m;
}

// Rank r's batch of step `step`: kGptRows windows of block_size + 1 token ids from a formula (no
// RNG), the inputs [rows, T] and the next characters [rows, T].
inline std::pair<Tensor, Tensor> gpt_batch(int step, int r) {
  const GptConfig c = small_gpt_config();
  const int64_t T = c.block_size;
  std::vector<int64_t> x, y;
  for (int64_t b = 0; b < kGptRows; ++b)
    for (int64_t t = 0; t <= T; ++t) {
      const int64_t i = ((step * 16 + r) * kGptRows + b) * (T + 1) + t;
      const int64_t token = (i * (i + 1) * 7 + 3 * i + i / 5) % c.vocab_size;
      if (t < T) x.push_back(token);
      if (t > 0) y.push_back(token);
    }
  return {from_vector<int64_t>(x, {kGptRows, T}), from_vector<int64_t>(y, {kGptRows, T})};
}

// The single process's batch of step `step`: every rank's, concatenated in rank order. Its mean
// loss is the mean of the ranks' mean losses (the ranks' batches are the same size).
inline std::pair<Tensor, Tensor> gpt_global_batch(int step, int W) {
  TensorList xs, ys;
  for (int r = 0; r < W; ++r) {
    auto [x, y] = gpt_batch(step, r);
    xs.push_back(x);
    ys.push_back(y);
  }
  return {cat(xs, 0), cat(ys, 0)};
}

struct GptModes {
  bool static_graph = false;
  bool in_backward = false;      // each parameter group's optimizer applied in backward
  bool delayed = false;          // wte.weight's allreduce delayed, hooked to blocks.0.ln_1.weight
  bool mixed_precision = false;  // bf16 shadows of f32 masters
};

inline std::string gpt_modes_name(const GptModes& m) {
  std::vector<std::string> parts;
  if (m.mixed_precision) parts.emplace_back("bf16 mixed precision");
  if (m.static_graph) parts.emplace_back("static_graph");
  if (m.in_backward) parts.emplace_back("optimizer in backward");
  if (m.delayed) parts.emplace_back("delayed wte.weight");
  return parts.empty() ? std::string("plain DDP") : fmt::format("{}", fmt::join(parts, " + "));
}

// train's options for these modes; buckets of about 8 KiB, so the f64 model spreads over several.
inline DdpOptions gpt_ddp_options(const GptModes& m) {
  DdpOptions o;
  o.bucket_cap_mb = 8.0 / 1024;
  o.static_graph = m.static_graph;
  if (m.delayed) {
    o.delay_all_reduce_named_params = {"wte.weight"};
    o.param_to_hook_all_reduce = "blocks.0.ln_1.weight";  // the first block's first parameter, as train picks
  }
  if (m.mixed_precision) o.mixed_precision = MixedPrecision{.param_dtype = bf16};
  return o;
}

// One optimizer kind for gpt_param_groups' two groups: weight decay on the decay group only.
struct GptOptimizer {
  optim::OptimizerSpec decay, no_decay;
};
// nanoGPT's AdamW (betas 0.9, 0.95, weight decay 0.1), at a learning rate that moves the small
// model visibly in 5 steps: the modes without mixed precision.
inline GptOptimizer gpt_adamw() {
  auto with = [](double weight_decay) {
    return optim::AdamWOptions{.lr = 0.01, .beta1 = kGptRecipe.beta1, .beta2 = kGptRecipe.beta2,
                               .weight_decay = weight_decay};
  };
  return {with(0.1), with(0.0)};
}
// SGD with momentum, as the other mixed-precision cases: its parameters move by the bf16
// gradients' small relative error times the step, so they track f32 within the bf16 tolerance.
// (Adam's normalisation would turn the bf16 error of a near-zero gradient into a whole step.)
inline GptOptimizer gpt_sgd() {
  auto with = [](double weight_decay) {
    return optim::SGDOptions{.lr = 0.3, .momentum = 0.9, .weight_decay = weight_decay};
  };
  return {with(0.1), with(0.0)};
}

inline std::unique_ptr<optim::Optimizer> gpt_plain_optimizer(const GptOptimizer& o, const GptParamGroups& g) {
  if (const auto* a = std::get_if<optim::AdamWOptions>(&o.decay)) {
    std::vector<optim::AdamW::Group> groups{{g.decay, *a}, {g.no_decay, std::get<optim::AdamWOptions>(o.no_decay)}};
    return std::make_unique<optim::AdamW>(std::move(groups));
  }
  std::vector<optim::SGD::Group> groups{{g.decay, std::get<optim::SGDOptions>(o.decay)},
                                        {g.no_decay, std::get<optim::SGDOptions>(o.no_decay)}};
  return std::make_unique<optim::SGD>(std::move(groups));
}

// The GPT under DDP in the modes `m` for kGptSteps steps against one process training on every
// rank's batch (gpt_global_batch) with the same optimizer, started from rank 0's weights (the
// other ranks start from other seeds: DDP broadcasts rank 0's). Without the optimizer in
// backward both sides clip to kGptMaxNorm after backward (under DDP on the averaged gradients,
// so every rank computes the single process's norm). Without mixed precision everything is f64
// and every parameter equals the single process's to 1e-10; with bf16 the f32 masters are
// bitwise equal across ranks and within bf16's tolerance of the f32 single process, and with the
// optimizer in backward bitwise equal to mixed-precision DDP + step() in the same modes. Also: the
// tie survives, wte.weight is one bucket slot (none when delayed), the delayed allreduce runs
// once per backward, the tied weight takes one in-backward step per backward, and clipping with
// the optimizer in backward is the clear error.
inline void gpt_modes_case(ProcessGroupPtr g, GptModes m) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("GPT, {}, rank {}/{}", gpt_modes_name(m), R, W);
  const Dtype dt = m.mixed_precision ? f32 : f64;
  const Dtype forward_dt = m.mixed_precision ? bf16 : f64;
  const GptOptimizer optimizer = m.mixed_precision ? gpt_sgd() : gpt_adamw();
  const bool clips = !m.in_backward;
  const uint64_t seed = R == 0 ? 7 : 60 + R;  // the ranks start different: DDP broadcasts rank 0's

  auto model = make_small_gpt(seed, dt);
  auto reference = make_small_gpt(7, dt);
  std::vector<std::shared_ptr<optim::InBackwardOptimizers>> in_bw;
  if (m.in_backward) {
    const GptParamGroups groups = gpt_param_groups(*model);
    in_bw.push_back(optim::apply_optimizer_in_backward(optimizer.decay, groups.decay));
    in_bw.push_back(optim::apply_optimizer_in_backward(optimizer.no_decay, groups.no_decay));
  }
  DistributedDataParallel ddp(model, g, gpt_ddp_options(m));
  std::unique_ptr<optim::Optimizer> opt;
  if (!m.in_backward) opt = gpt_plain_optimizer(optimizer, gpt_param_groups(*model));
  auto ref_opt = gpt_plain_optimizer(optimizer, gpt_param_groups(*reference));
  // Mixed precision with the optimizer in backward: the same modes with a plain step beside it.
  std::shared_ptr<Gpt> twin;
  std::unique_ptr<DistributedDataParallel> twin_ddp;
  std::unique_ptr<optim::Optimizer> twin_opt;
  if (m.mixed_precision && m.in_backward) {
    twin = make_small_gpt(seed, dt);
    twin_ddp = std::make_unique<DistributedDataParallel>(twin, g, gpt_ddp_options(m));
    twin_opt = gpt_plain_optimizer(optimizer, gpt_param_groups(*twin));
  }

  // Every parameter once (lm_head.weight is wte.weight), each in one bucket slot unless delayed.
  const auto names = ddp.parameter_names();
  expect(names.size() == model->named_parameters().size() &&
             std::find(names.begin(), names.end(), "lm_head.weight") == names.end(),
         "{}: DDP manages {}", what, names);
  std::vector<std::string> slots;
  for (const auto& b : ddp.stats().bucket_parameters) slots.insert(slots.end(), b.begin(), b.end());
  for (const std::string& name : names) {
    const int64_t want = m.delayed && name == "wte.weight" ? 0 : 1;
    const auto got = std::count(slots.begin(), slots.end(), name);
    expect(got == want, "{}: parameter {} is in the buckets {} times, expected {}", what, name, got, want);
  }

  std::map<std::string, Tensor> start;  // the reference's weights before training (mixed precision)
  if (m.mixed_precision)
    for (const auto& [name, p] : reference->named_parameters()) start[name] = p.detach().clone();
  std::string inside;  // what a forward saw that it should not have
  HookHandle inside_hook;
  if (m.mixed_precision)
    inside_hook = model->register_forward_pre_hook([&](nn::Module&) {
      if (model->wte->weight.dtype() != bf16 || model->lm_head->weight.dtype() != bf16 ||
          model->ln_f->weight.dtype() != bf16)
        inside = fmt::format("inside forward wte.weight is {}, lm_head.weight {}, ln_f.weight {}",
                             model->wte->weight.dtype(), model->lm_head->weight.dtype(), model->ln_f->weight.dtype());
    });

  bool clipped = false;
  for (int step = 0; step < kGptSteps; ++step) {
    if (opt) opt->zero_grad();
    auto [x, y] = gpt_batch(step, R);
    Tensor logits = ddp(x);
    expect(logits.dtype() == forward_dt, "{}: step {}'s logits are {}, not {}", what, step, logits.dtype(), forward_dt);
    gpt_loss(logits, y).backward();
    ddp.check_reducer_finalized();
    expect(inside.empty(), "{}: step {}: {}", what, step, inside);
    if (m.delayed)
      expect(ddp.delayed_allreduce()->launches() == step + 1, "{}: {} delayed allreduces after {} backwards", what,
             ddp.delayed_allreduce()->launches(), step + 1);
    for (const auto& [name, p] : model->named_parameters()) {
      expect(p.dtype() == dt, "{}: after backward {} parameter {} is {}", what, step, name, p.dtype());
      if (m.in_backward)
        expect(!p.grad().defined(), "{}: parameter {} kept its gradient after its step in backward {}", what, name,
               step);
      else
        expect(p.grad().defined() && p.grad().dtype() == dt,
               "{}: after backward {} parameter {} has no {} gradient", what, step, name, dt);
    }
    double norm = 0;
    if (opt) {
      norm = nn::utils::clip_grad_norm_(model->named_parameters(), kGptMaxNorm);  // DDP's averaged gradients
      clipped = clipped || norm > kGptMaxNorm;
      opt->step();
    }
    if (twin) {
      twin_opt->zero_grad();
      gpt_loss((*twin_ddp)(x), y).backward();
      twin_ddp->check_reducer_finalized();
      twin_opt->step();
    }

    ref_opt->zero_grad();
    auto [all_x, all_y] = gpt_global_batch(step, W);
    gpt_loss((*reference)(all_x), all_y).backward();
    if (clips) {
      const double ref_norm = nn::utils::clip_grad_norm_(reference->named_parameters(), kGptMaxNorm);
      const double norm_tol = (m.mixed_precision ? 5e-2 : 1e-10) * ref_norm;  // bf16 gradients: ~1e-2 relative
      expect(std::abs(norm - ref_norm) <= norm_tol,
             "{}: step {}'s gradient norm is {} under DDP, {} in one process (tolerance {})", what, step, norm,
             ref_norm, norm_tol);
    }
    ref_opt->step();
  }

  expect(model->lm_head->weight.is_same(model->wte->weight),
         "{}: the tie (lm_head.weight is wte.weight) did not survive", what);
  // bf16: see mixed_precision_case (8 significant bits per gradient; here the parameters move by
  // up to a few tenths in total, checked below, so the tolerance is not met by standing still).
  const double tol = m.mixed_precision ? 3e-2 : 1e-10;
  expect_same_parameters(*model, *reference, tol, what);
  if (clips)
    expect(clipped, "{}: clip_grad_norm_ at {} never clipped: the gradient norms stayed below it", what, kGptMaxNorm);
  if (m.mixed_precision) {
    double moved = 0;
    for (const auto& [name, p] : reference->named_parameters())
      moved = std::max(moved, max_abs_diff(p, start.at(name)));
    expect(moved > tol, "{}: the f32 training moved no parameter by more than {} ({}): the check proves nothing",
           what, tol, moved);
    for (const auto& [name, p] : model->named_parameters()) {
      Tensor mine = p.detach().clone();
      Tensor root = mine.clone();
      g->broadcast(root, 0)->wait();
      expect(max_abs_diff(mine, root) == 0, "{}: parameter {} differs from rank 0's", what, name);
    }
  }
  if (twin) {
    const auto twins = twin->named_parameters();
    for (const auto& [name, p] : model->named_parameters()) {
      const double d = max_abs_diff(p, twins.at(name));
      expect(d == 0, "{}: parameter {} differs by {} from mixed-precision DDP + step() in the same modes", what, name,
             d);
    }
  }
  if (m.in_backward) {
    if (!m.mixed_precision) {  // AdamW counts its steps
      const Tensor& tied = model->wte->weight;
      const auto* st = in_bw[0]->optimizer_for(tied).state(tied);
      expect(st && st->step == kGptSteps, "{}: the tied wte.weight took {} in-backward steps in {} backwards", what,
             st ? st->step : 0, kGptSteps);
    }
    std::string error;
    try {
      nn::utils::clip_grad_norm_(model->named_parameters(), kGptMaxNorm);
    } catch (const std::exception& e) {
      error = e.what();
    }
    expect(error.find("has an optimizer in backward") != std::string::npos,
           "{}: clip_grad_norm_ with the optimizer in backward: '{}'", what, error);
  }
}

// Every combination of static_graph, the optimizer in backward and the delayed wte.weight, in f64.
inline void gpt_modes_f64_all(ProcessGroupPtr g) {
  for (bool static_graph : {false, true})
    for (bool in_backward : {false, true})
      for (bool delayed : {false, true})
        gpt_modes_case(g, {.static_graph = static_graph, .in_backward = in_backward, .delayed = delayed});
}

// bf16 mixed precision alone, with each of the other modes, and with all of them.
inline void gpt_mixed_precision_all(ProcessGroupPtr g) {
  gpt_modes_case(g, {.mixed_precision = true});
  gpt_modes_case(g, {.static_graph = true, .mixed_precision = true});
  gpt_modes_case(g, {.in_backward = true, .mixed_precision = true});
  gpt_modes_case(g, {.delayed = true, .mixed_precision = true});
  gpt_modes_case(g, {.static_graph = true, .delayed = true, .mixed_precision = true});
  gpt_modes_case(g, {.static_graph = true, .in_backward = true, .delayed = true, .mixed_precision = true});
}

}  // namespace ddp_cases
