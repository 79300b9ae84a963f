// Join (dist/join.h): DDP training with uneven inputs. Rank r reads its own shard, with r more
// batches than rank 0 and a short last batch (DataLoader, drop_last=false); the ranks that run
// out join and shadow the others. The result must equal one process that, at each iteration, sums
// the losses of the ranks that still have a batch and divides by the initial world size (or by
// those ranks, with divide_by_initial_world_size=false), and every rank must end with it.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp_cases.h"

namespace ddp_cases {

constexpr int64_t kJoinBatch = 4;

// Rank r's shard: `full` batches of kJoinBatch rows and a short one of 2 rows.
inline std::shared_ptr<data::TensorDataset> join_shard(int r, int64_t full) {
  const int64_t rows = full * kJoinBatch + 2, first = 1000 * static_cast<int64_t>(r);
  return std::make_shared<data::TensorDataset>(TensorList{inputs(first, rows, 8, f64), targets(first, rows, 4, f64)});
}

inline data::LoaderOptions join_loader_options() {
  return {.batch_size = kJoinBatch, .shuffle = false, .drop_last = false, .prefetch = 0};
}

// Every batch of rank r's shard, in order.
inline std::vector<TensorList> join_batches(int r, int64_t full) {
  data::DataLoader loader(join_shard(r, full), join_loader_options());
  std::vector<TensorList> out;
  for (const TensorList& b : loader) out.push_back(b);
  return out;
}

// One process over the ranks' uneven batches (batches[r]: rank r's), each iteration on the losses
// of the ranks that still have a batch, summed and divided by the initial world size: the
// reference of a Join run. `after_step` runs after each step (a schedule's).
inline void train_uneven_reference(nn::Module& reference, optim::Optimizer& opt,
                                   const std::vector<std::vector<TensorList>>& batches,
                                   const std::function<void()>& after_step = {}) {
  const auto W = static_cast<double>(batches.size());
  size_t longest = 0;
  for (const auto& b : batches) longest = std::max(longest, b.size());
  for (size_t i = 0; i < longest; ++i) {
    opt.zero_grad();
    Tensor total;
    for (const auto& mine : batches) {
      if (i >= mine.size()) continue;
      Tensor l = mse_loss(reference(mine[i][0]), mine[i][1]);
      total = total.defined() ? total + l : l;
    }
    (total / W).backward();
    opt.step();
    if (after_step) after_step();
  }
}

struct JoinVariant {
  bool divide_by_initial_world_size = true;
  bool find_unused = false;
  bool static_graph = false;
  bool bucket_view = false;
  Layout layout = Layout::default_caps;
  bool rank0_idle = false;  // rank 0 has no batch at all: it joins before the first iteration
  int64_t base = 1;         // rank r has base + r full batches (and the short one)
  std::string str() const {
    return fmt::format("divide_by_initial={} find_unused={} static_graph={} bucket_view={} {} rank0_idle={}",
                       divide_by_initial_world_size, find_unused, static_graph, bucket_view, layout_name(layout),
                       rank0_idle);
  }
};

inline void join_equivalence(ProcessGroupPtr g, const JoinVariant& v) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("join {} rank {}/{}", v.str(), R, W);
  // With unused parameters allowed, extra is used on odd ranks only, so it is unused everywhere in
  // the iterations where only even ranks still train; never is never used.
  auto uses_extra = [&v](int r) { return !v.find_unused || r % 2 == 1; };
  auto model = v.find_unused ? make_net(f64, R == 0 ? 7 : 100 + R) : make_net_without_never(f64, R == 0 ? 7 : 100 + R);
  model->rank = R;
  model->use_extra = uses_extra;
  auto reference = v.find_unused ? make_net(f64, 7) : make_net_without_never(f64, 7);
  DdpOptions o;
  o.bucket_cap_mb = cap_for(v.layout);
  o.find_unused_parameters = v.find_unused;
  o.static_graph = v.static_graph;
  o.gradient_as_bucket_view = v.bucket_view;
  DistributedDataParallel ddp(model, g, o);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});

  int64_t trained = 0;
  {
    Join join({&ddp}, {.divide_by_initial_world_size = v.divide_by_initial_world_size});
    if (!(v.rank0_idle && R == 0)) {
      data::DataLoader loader(join_shard(R, v.base + R), join_loader_options());
      for (const TensorList& b : loader) {
        opt.zero_grad(/*set_to_none=*/!v.bucket_view);
        mse_loss(ddp(b[0]), b[1]).backward();
        opt.step();
        ++trained;
      }
    }
    join.join();
  }
  expect(trained == (v.rank0_idle && R == 0 ? 0 : v.base + R + 1), "{}: trained {} batches", what, trained);

  // The reference: iteration i sums the losses of the ranks that still have a batch i.
  std::vector<std::vector<TensorList>> batches;
  for (int r = 0; r < W; ++r)
    batches.push_back(v.rank0_idle && r == 0 ? std::vector<TensorList>{} : join_batches(r, v.base + r));
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (size_t i = 0;; ++i) {
    std::vector<int> active;
    for (int r = 0; r < W; ++r)
      if (i < batches[r].size()) active.push_back(r);
    if (active.empty()) break;
    ref_opt.zero_grad();
    Tensor total;
    for (int r : active) {
      reference->rank = r;
      reference->use_extra = uses_extra;
      Tensor l = mse_loss((*reference)(batches[r][i][0]), batches[r][i][1]);
      total = total.defined() ? total + l : l;
    }
    const double divisor = v.divide_by_initial_world_size ? W : static_cast<double>(active.size());
    (total / divisor).backward();
    ref_opt.step();
  }
  expect_same_parameters(*model, *reference, 1e-12, what);
}

inline void join_uneven_inputs(ProcessGroupPtr g) {
  join_equivalence(g, {});
  join_equivalence(g, {.divide_by_initial_world_size = false, .layout = Layout::per_parameter});
  join_equivalence(g, {.find_unused = true, .layout = Layout::one_bucket});
  join_equivalence(g, {.divide_by_initial_world_size = false, .find_unused = true});
  join_equivalence(g, {.bucket_view = true, .layout = Layout::per_parameter});
  // Rank 0 joins before any iteration: the others' first reduction, the static graph's used map
  // and the bucket rebuild (whose order rank 0 broadcasts) are all shadowed.
  join_equivalence(g, {.static_graph = true, .layout = Layout::per_parameter, .rank0_idle = true, .base = 0});
  join_equivalence(g, {.find_unused = true, .static_graph = true, .rank0_idle = true});
  join_equivalence(g, {.rank0_idle = true, .base = 0});
}

// A module that counts its forwards in a buffer: which rank's buffer the others take shows.
struct ForwardCounter : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  Tensor count;
  ForwardCounter() : Module("ForwardCounter") {
    fc = register_module("fc", std::make_shared<nn::Linear>(8, 4));
    count = register_buffer("count", zeros({1}, f64));
  }
  Tensor forward(const Tensor& x) override {
    {
      NoGradGuard no_grad;
      count.add_(1.0);
    }
    return (*fc)(x);
  }
};

// Buffers are broadcast before each iteration from a rank still training (rank 0 joins first, with
// a stale count), and at the end every rank takes the count of a rank that trained in the last
// iteration: the number of iterations the longest shard had (2W - 1; from a stale rank 0 it would
// be 2).
inline void join_buffers_follow_the_ranks_still_training(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  manual_seed(3);
  auto model = std::make_shared<ForwardCounter>();
  model->to(f64);
  DistributedDataParallel ddp(model, g);
  optim::SGD opt(model->parameters(), {.lr = 0.05});
  {
    Join join({&ddp});
    data::DataLoader loader(join_shard(R, 2 * R), join_loader_options());  // 2R + 1 batches
    for (const TensorList& b : loader) {
      opt.zero_grad();
      mse_loss(ddp(b[0]), b[1]).backward();
      opt.step();
    }
  }  // the destructor joins
  const double count = model->count.item<double>();
  expect(count == 2 * W - 1, "join buffers rank {}/{}: count {} after the join, expected {} (the longest shard's batches)",
         R, W, count, 2 * W - 1);
  // Every rank holds the same parameters: the rank that trained last broadcast them.
  Tensor w = model->fc->weight.detach().clone();
  g->allreduce(w, ReduceOp::sum)->wait();
  expect(max_abs_diff(w, model->fc->weight * static_cast<double>(W)) < 1e-12,
         "join buffers rank {}/{}: the parameters differ across ranks after the join", R, W);
}

// BatchNorm under a Join, as PyTorch: before each iteration the running statistics of the highest
// rank still training are broadcast (even when every rank still has data), and at the end every
// rank takes those of the highest rank that trained in the last iteration. The BatchNorm is the
// first layer, so its statistics depend on the data alone: the reference replays the rule.
inline void join_batchnorm_buffers(ProcessGroupPtr g, bool uneven) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("join batchnorm uneven={} rank {}/{}", uneven, R, W);
  // Uneven: rank r has W - r full batches and a short one, so the highest ranks join first and
  // the lowest and highest rules disagree; even: two full batches and a short one everywhere.
  auto full_batches = [&](int r) -> int64_t { return uneven ? W - r : 2; };
  manual_seed(4);
  auto model = std::make_shared<nn::Sequential>(nn::BatchNorm1d(8), nn::Linear(8, 4));
  model->to(f64);
  DistributedDataParallel ddp(model, g);
  optim::SGD opt(model->parameters(), {.lr = 0.05});
  {
    Join join({&ddp});
    data::DataLoader loader(join_shard(R, full_batches(R)), join_loader_options());
    for (const TensorList& b : loader) {
      opt.zero_grad();
      mse_loss(ddp(b[0]), b[1]).backward();
      opt.step();
    }
  }
  // The rule, replayed: each rank's statistics after iteration i are its own batch's update of the
  // statistics the iteration's authority (the highest rank with a batch i) had after i - 1.
  std::vector<std::vector<TensorList>> batches;
  for (int r = 0; r < W; ++r) batches.push_back(join_batches(r, full_batches(r)));
  nn::BatchNorm1d bn(8);
  bn.to(f64);
  std::vector<std::pair<Tensor, Tensor>> stats(static_cast<size_t>(W), {zeros({8}, f64), ones({8}, f64)});
  int last = -1;
  for (size_t i = 0;; ++i) {
    int authority = -1;
    for (int r = 0; r < W; ++r)
      if (i < batches[r].size()) authority = r;
    if (authority < 0) break;
    last = authority;
    const auto base = stats[static_cast<size_t>(authority)];
    for (int r = 0; r < W; ++r) {
      stats[static_cast<size_t>(r)] = base;  // the broadcast reaches the joined ranks too
      if (i >= batches[r].size()) continue;
      NoGradGuard no_grad;
      bn.running_mean().copy_(base.first);
      bn.running_var().copy_(base.second);
      bn(batches[r][i][0]);
      stats[static_cast<size_t>(r)] = {bn.running_mean().clone(), bn.running_var().clone()};
    }
  }
  auto got = model->at<nn::BatchNorm1d>(0);
  const auto& want = stats[static_cast<size_t>(last)];
  expect(max_abs_diff(got->running_mean(), want.first) < 1e-12 && max_abs_diff(got->running_var(), want.second) < 1e-12,
         "{}: the running statistics are not those of the highest rank still training (rank {} last): mean differs "
         "by {}, var by {}",
         what, last, max_abs_diff(got->running_mean(), want.first), max_abs_diff(got->running_var(), want.second));
}

inline void join_batchnorm_buffers_both(ProcessGroupPtr g) {
  join_batchnorm_buffers(g, true);
  join_batchnorm_buffers(g, false);
}

// throw_on_early_termination: every rank raises at the first iteration where a rank has no
// batch, and the group stays usable (every rank ran the same collectives).
inline void join_throw_on_early_termination(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("join throw rank {}/{}", R, W);
  auto model = make_net_without_never(f64, 7);
  DistributedDataParallel ddp(model, g);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  int64_t trained = 0;
  std::string error;
  try {
    Join join({&ddp}, {.throw_on_early_termination = true});
    data::DataLoader loader(join_shard(R, 1 + R), join_loader_options());  // R + 2 batches
    for (const TensorList& b : loader) {
      opt.zero_grad();
      mse_loss(ddp(b[0]), b[1]).backward();
      opt.step();
      ++trained;
    }
    join.join();
  } catch (const Error& e) {
    error = e.what();
  }
  if (W == 1) {
    expect(error.empty() && trained == 2, "{}: one rank never terminates early, got '{}'", what, error);
    return;
  }
  expect(error.find("[Join] rank(s) 0 exhausted their inputs at iteration 2") != std::string::npos &&
             error.find("throw_on_early_termination") != std::string::npos,
         "{}: expected the early-termination error naming rank 0 and iteration 2, got '{}'", what, error);
  expect(trained == 2, "{}: trained {} batches before the error, expected 2 on every rank", what, trained);
  Tensor one = ones({1}, f64);
  g->allreduce(one, ReduceOp::sum)->wait();
  expect(one.item<double>() == W, "{}: the group is out of step after the error", what);
}

inline void expect_join_error(const std::function<void()>& fn, const std::string& needle) {
  std::string msg;
  try {
    fn();
  } catch (const std::exception& e) {
    msg = e.what();
  }
  expect(msg.find(needle) != std::string::npos, "expected an error containing '{}', got '{}'", needle, msg);
}

// Misuse gets a clear error on every rank, never a hang.
inline void join_misuse(ProcessGroupPtr g) {
  const int R = g->rank();
  auto model = make_net_without_never(f64, 7);
  DistributedDataParallel ddp(model, g);
  expect_join_error([&] { Join join({}); }, "[Join] needs at least one joinable");
  expect_join_error([&] { Join join({&ddp, &ddp}); }, "[Join] joinable 1 is listed twice");
  {
    Join outer({&ddp});
    expect_join_error([&] { Join inner({&ddp}); }, "already attached to another Join");
    // Two synchronised forwards before a backward cannot be shadowed: every rank raises at the
    // second, before its announcement.
    Tensor x = inputs(0, 4, 8, f64);
    ddp(x);
    expect_join_error([&] { ddp(x); }, fmt::format("[Join] rank {} runs a forward while the backward", R));
    outer.join();  // every rank: the first forward's iteration was announced, never backwarded
    expect_join_error([&] { outer.join(); }, "[Join] join() was already called");
  }
  if (g->size() > 1) {
    // Ranks still training that announce different iterations (rank 1 under no_sync) all raise.
    DistributedDataParallel fresh(make_net_without_never(f64, 7), g);
    Join join({&fresh});
    Tensor x = inputs(0, 4, 8, f64);
    expect_join_error(
        [&] {
          auto guard = R == 1 ? std::optional<DistributedDataParallel::NoSyncGuard>(fresh.no_sync()) : std::nullopt;
          mse_loss(fresh(x), targets(0, 4, 4, f64)).backward();
        },
        "[Join] the ranks still training disagree about iteration 0");
  }  // unwinding skipped nothing: the destructor joins (no iteration was left open)
  auto delayed_model = make_net_without_never(f64, 7);
  DdpOptions o;
  o.delay_all_reduce_named_params = {"fc1.weight"};
  o.param_to_hook_all_reduce = "fc2.weight";
  DistributedDataParallel delayed(delayed_model, g, o);
  expect_join_error([&] { Join join({&delayed}); }, "[Join] DDP with delay_all_reduce_named_params");
}

}  // namespace ddp_cases
