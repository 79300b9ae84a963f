// The DDP checks shared by test_ddp (threads backend, in one process) and test_ddp_mpi (mpi
// backend under mpirun) through ddp_case_table.h, and the models, data and references every DDP
// case uses (the modes' own cases are in ddp_*_cases.h). Each case runs on every rank with that
// rank's group and throws on a failed check. Equivalence is always against a single process that
// computes, on its own, the loss every rank computes on its shard, averaged over ranks, and takes
// the same optimizer steps.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/ddp/detail/delayed_allreduce.h"  // the cases read its launches and its group
#include "dist/ddp/detail/param_shadows.h"      // set_side_stream_factory_for_tests
#include "dist_cases.h"
#include "tandem.h"

namespace ddp_cases {

using namespace tandem;
using namespace tandem::dist;
using dist_cases::expect;
using nn::mse_loss;

// A group handle that does not own the group (run_threads lends a reference).
inline ProcessGroupPtr borrow(ProcessGroup& g) { return ProcessGroupPtr(std::shared_ptr<void>(), &g); }

// Deterministic data: row i of a [rows, cols] tensor, no RNG involved.
inline Tensor inputs(int64_t first_row, int64_t rows, int64_t cols, Dtype dt) {
  std::vector<double> v;
  for (int64_t i = first_row; i < first_row + rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(std::sin(0.37 * i + 1.3 * j) + 0.1 * j);
  return from_vector(v, {rows, cols}).to(dt);
}
inline Tensor targets(int64_t first_row, int64_t rows, int64_t cols, Dtype dt) {
  std::vector<double> v;
  for (int64_t i = first_row; i < first_row + rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(std::cos(0.21 * i - 0.7 * j));
  return from_vector(v, {rows, cols}).to(dt);
}

// fc1 -> tanh -> fc2, plus `extra` (used on the ranks `use_extra` picks) and `never` (used by no
// rank): the model for unused-parameter cases.
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2, extra, never;
  std::function<bool(int)> use_extra = [](int) { return true; };
  int rank = 0;
  Net() : Module("Net") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 4));
    extra = register_module("extra", std::make_shared<nn::Linear>(16, 4));
    never = register_module("never", std::make_shared<nn::Linear>(16, 4));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = tanh((*fc1)(x));
    Tensor y = (*fc2)(h);
    if (use_extra(rank)) y = y + (*extra)(h);
    return y;
  }
};

inline std::shared_ptr<Net> make_net(Dtype dt, uint64_t seed = 7) {
  manual_seed(seed);
  auto net = std::make_shared<Net>();
  net->to(dt);
  return net;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  return (a.to(f64) - b.to(f64)).abs().max().item<double>();
}

inline void expect_same_parameters(nn::Module& got, nn::Module& want, double tol, const std::string& what) {
  auto g = got.named_parameters();
  auto w = want.named_parameters();
  for (const auto& [name, t] : w) {
    double d = max_abs_diff(g.at(name), t);
    expect(d <= tol, "{}: parameter {} differs from the single-process result by {} (tolerance {})", what, name, d, tol);
  }
}

enum class Layout { per_parameter, default_caps, one_bucket };
inline std::optional<double> cap_for(Layout l) {
  switch (l) {
    case Layout::per_parameter: return 1e-9;  // every tensor reaches the cap alone
    case Layout::default_caps: return std::nullopt;
    case Layout::one_bucket: return 1024.0;
  }
  return std::nullopt;
}
inline const char* layout_name(Layout l) {
  return l == Layout::per_parameter ? "per-parameter" : l == Layout::default_caps ? "default caps" : "one bucket";
}

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(const TensorList&)>;
inline MakeOptimizer sgd() {
  return [](const TensorList& p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9}); };
}
inline MakeOptimizer adamw() {
  return [](const TensorList& p) { return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 0.01}); };
}

constexpr int64_t kRowsPerRank = 4;

// rank r's loss on its shard of step `step` (rows differ per step and rank).
inline Tensor shard_loss(nn::Module& model, int step, int r, Dtype dt, int micro = 0) {
  int64_t first = ((step * 4 + micro) * 16 + r) * kRowsPerRank;
  return mse_loss(model(inputs(first, kRowsPerRank, 8, dt)), targets(first, kRowsPerRank, 4, dt));
}

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

// DDP over `steps` steps vs one process computing the mean of every rank's loss.
inline void equivalence(ProcessGroupPtr g, Dtype dt, bool bucket_view, bool find_unused, Layout layout,
                        const MakeOptimizer& make_opt, int steps = 5) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("{} bucket_view={} find_unused={} {} rank {}/{}", dt, bucket_view, find_unused,
                                       layout_name(layout), R, W);
  // extra is used on odd ranks only when unused parameters are allowed; never is never used.
  auto uses_extra = [find_unused](int r) { return !find_unused || r % 2 == 1; };
  auto model = make_net(dt, R == 0 ? 7 : 100 + R);  // the ranks start different: DDP broadcasts rank 0's
  model->rank = R;
  model->use_extra = uses_extra;
  if (!find_unused) {
    // Without find_unused_parameters every parameter must get a gradient: leave `never` out.
    model->never->weight.requires_grad_(false);
    model->never->bias.requires_grad_(false);
  }
  auto reference = make_net(dt, 7);
  if (!find_unused) {
    reference->never->weight.requires_grad_(false);
    reference->never->bias.requires_grad_(false);
  }
  DdpOptions o;
  o.bucket_cap_mb = cap_for(layout);
  o.gradient_as_bucket_view = bucket_view;
  o.find_unused_parameters = find_unused;
  DistributedDataParallel ddp(model, g, o);
  auto opt = make_opt(model->parameters());
  auto ref_opt = make_opt(reference->parameters());
  for (int step = 0; step < steps; ++step) {
    opt->zero_grad(/*set_to_none=*/!bucket_view);
    shard_loss(ddp.module(), step, R, dt);  // a forward outside DDP must not disturb it
    model->zero_grad(!bucket_view);
    Tensor loss = mse_loss(ddp(inputs(((step * 4) * 16 + R) * kRowsPerRank, kRowsPerRank, 8, dt)),
                           targets(((step * 4) * 16 + R) * kRowsPerRank, kRowsPerRank, 4, dt));
    loss.backward();
    ddp.check_reducer_finalized();
    opt->step();

    ref_opt->zero_grad();
    Tensor total;
    for (int r = 0; r < W; ++r) {
      reference->rank = r;
      reference->use_extra = uses_extra;
      Tensor l = shard_loss(*reference, step, r, dt);
      total = total.defined() ? total + l : l;
    }
    (total / static_cast<double>(W)).backward();
    ref_opt->step();
  }
  const double tol = dt == f64 ? 1e-12 : 2e-5;
  expect_same_parameters(*model, *reference, tol, what);
  if (find_unused) {
    // `never` got no gradient on any rank: .grad stays none.
    expect(!model->never->weight.grad().defined(), "{}: a globally unused parameter got a gradient", what);
    auto st = ddp.stats();
    expect(std::find(st.unused_parameters.begin(), st.unused_parameters.end(), "never.weight") !=
               st.unused_parameters.end(),
           "{}: stats do not list never.weight as unused", what);
  }
  if (bucket_view) {
    // .grad is a view into the bucket buffers: gradients of one bucket are adjacent in memory.
    auto st = ddp.stats();
    expect(st.iterations == steps, "{}: {} iterations recorded, expected {}", what, st.iterations, steps);
  }
}

inline void all_equivalence(ProcessGroupPtr g, bool quick) {
  for (Dtype dt : {f64, f32})
    for (bool view : {false, true})
      for (bool unused : {false, true})
        for (Layout l : {Layout::per_parameter, Layout::default_caps, Layout::one_bucket}) {
          if (quick && dt == f32 && l != Layout::default_caps) continue;
          equivalence(g, dt, view, unused, l, sgd());
          if (!quick || l == Layout::default_caps) equivalence(g, dt, view, unused, l, adamw());
        }
}

// no_sync over three micro-batches, then a synchronised fourth, equals one step on all four.
inline void no_sync_accumulation(ProcessGroupPtr g, bool bucket_view) {
  const int W = g->size(), R = g->rank();
  auto model = make_net(f64, 7);
  model->never->weight.requires_grad_(false);
  model->never->bias.requires_grad_(false);
  auto reference = make_net(f64, 7);
  reference->never->weight.requires_grad_(false);
  reference->never->bias.requires_grad_(false);
  DdpOptions o;
  o.gradient_as_bucket_view = bucket_view;
  o.bucket_cap_mb = 1e-9;
  DistributedDataParallel ddp(model, g, o);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  for (int step = 0; step < 2; ++step) {
    model->zero_grad(!bucket_view);
    {
      auto guard = ddp.no_sync();
      for (int k = 0; k < 3; ++k) ddp.call([&] { return shard_loss(*model, step, R, f64, k); }).backward();
    }
    ddp.call([&] { return shard_loss(*model, step, R, f64, 3); }).backward();
    ddp.check_reducer_finalized();
    opt.step();
    reference->zero_grad();
    Tensor total;
    for (int r = 0; r < W; ++r)
      for (int k = 0; k < 4; ++k) {
        Tensor l = shard_loss(*reference, step, r, f64, k);
        total = total.defined() ? total + l : l;
      }
    (total / static_cast<double>(W)).backward();
    ref_opt.step();
  }
  expect_same_parameters(*model, *reference, 1e-12, fmt::format("no_sync bucket_view={} rank {}", bucket_view, R));
}

// BatchNorm buffers: broadcast_buffers=false leaves them per rank (also at construction);
// true makes every forward start from rank 0's.
inline void buffers(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  auto make = [&] {
    manual_seed(3);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(8, 6));
    m->push_back(std::make_shared<nn::BatchNorm1d>(6));
    m->push_back(std::make_shared<nn::Linear>(6, 4));
    m->to(f64);
    return m;
  };
  auto gather_first = [&](const Tensor& t) {  // element 0 of t on every rank
    Tensor all = zeros({W}, f64);
    g->allgather_into(all, t.flatten().narrow(0, 0, 1).to(f64).contiguous())->wait();
    return all.to_vector<double>();
  };
  for (bool broadcast : {false, true}) {
    auto m = make();
    Tensor rm = m->buffer("1.running_mean");
    {
      NoGradGuard ng;
      rm.fill_(static_cast<double>(R + 1));  // rank-specific before DDP
    }
    DdpOptions o;
    o.broadcast_buffers = broadcast;
    DistributedDataParallel ddp(m, g, o);
    auto at_construction = gather_first(m->buffer("1.running_mean"));
    for (int r = 0; r < W; ++r) {
      double want = broadcast ? 1.0 : r + 1.0;
      expect(at_construction[r] == want, "broadcast_buffers={}: rank {}'s running_mean is {} after construction, expected {}",
             broadcast, r, at_construction[r], want);
    }
    std::vector<double> seen_at_forward;
    auto hook = m->register_forward_pre_hook([&](nn::Module& mod) {
      seen_at_forward = gather_first(mod.buffer("1.running_mean"));
    });
    optim::SGD opt(m->parameters(), {.lr = 0.05});
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      int64_t first = (step * 16 + R) * 5;
      mse_loss(ddp(inputs(first, 5, 8, f64)), targets(first, 5, 4, f64)).backward();
      opt.step();
      for (int r = 1; r < W; ++r) {
        if (broadcast)
          expect(seen_at_forward[r] == seen_at_forward[0], "broadcast_buffers=true: at forward {} rank {}'s running_mean is {}, rank 0's {}",
                 step, r, seen_at_forward[r], seen_at_forward[0]);
        else
          expect(seen_at_forward[r] != seen_at_forward[0], "broadcast_buffers=false: at forward {} rank {} has rank 0's running_mean {}",
                 step, r, seen_at_forward[0]);
      }
    }
    // Parameters agree either way.
    for (const auto& [name, p] : m->named_parameters()) {
      Tensor mine = p.to(f64).contiguous();
      Tensor root = mine.clone();
      g->broadcast(root, 0)->wait();
      expect(max_abs_diff(mine, root) == 0, "broadcast_buffers={}: parameter {} differs from rank 0's on rank {}", broadcast, name, R);
    }
  }
}

// Gradient accumulation with BatchNorm and broadcast_buffers (PyTorch's rule): rank 0's buffers
// are broadcast only before the first forward of each window (the previous forward was
// synchronised); the no_sync forwards and the synchronised forward that ends the window update
// each rank's own statistics. The reference: one BatchNorm per rank fed the same micro-batches,
// every rank's copy reset to rank 0's at each window start. BatchNorm comes first, so its
// statistics depend on the data only.
inline void buffers_with_no_sync(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  constexpr int kMicro = 3;  // two no_sync micro-batches, then the synchronised one
  manual_seed(4);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::BatchNorm1d>(8));
  m->push_back(std::make_shared<nn::Linear>(8, 4));
  m->to(f64);
  std::vector<std::shared_ptr<nn::BatchNorm1d>> ref;
  for (int r = 0; r < W; ++r) {
    ref.push_back(std::make_shared<nn::BatchNorm1d>(8));
    ref.back()->to(f64);
  }
  DistributedDataParallel ddp(m, g, {});
  optim::SGD opt(m->parameters(), {.lr = 0.05});
  auto batch = [&](int step, int micro, int r) {
    int64_t first = ((step * kMicro + micro) * 16 + r) * 5;
    return std::pair{inputs(first, 5, 8, f64) * (1.0 + r), targets(first, 5, 4, f64)};
  };
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    for (int r = 1; r < W; ++r)
      for (const auto& [name, b] : ref[0]->named_buffers()) {
        NoGradGuard ng;
        ref[r]->buffer(name).copy_(b);
      }
    for (int micro = 0; micro < kMicro; ++micro) {
      for (int r = 0; r < W; ++r) {
        NoGradGuard ng;
        (*ref[r])(batch(step, micro, r).first);
      }
      auto [x, y] = batch(step, micro, R);
      if (micro + 1 < kMicro) {
        auto guard = ddp.no_sync();
        mse_loss(ddp(x), y).backward();
      } else {
        mse_loss(ddp(x), y).backward();
      }
    }
    opt.step();
    for (const auto& [name, want] : ref[R]->named_buffers()) {
      Tensor got = m->buffer("0." + name);
      double d = max_abs_diff(got, want);
      expect(d == 0, "no_sync window {}: rank {}'s {} differs from the per-rank reference by {} (got {}, want {})",
             step, R, name, d, got.to(f64).flatten().narrow(0, 0, 1).item<double>(),
             want.to(f64).flatten().narrow(0, 0, 1).item<double>());
    }
  }
}

// Every rank leaves `extra` without gradient and find_unused_parameters is off: the reduction
// cannot finish, and check_reducer_finalized / the next forward say why, naming the parameters.
inline void unused_everywhere_is_an_error(ProcessGroupPtr g) {
  auto model = make_net(f64);
  model->use_extra = [](int) { return false; };
  model->never->weight.requires_grad_(false);
  model->never->bias.requires_grad_(false);
  DistributedDataParallel ddp(model, g, {});
  shard_loss(ddp.module(), 0, g->rank(), f64);  // not through DDP: harmless
  mse_loss(ddp(inputs(0, 4, 8, f64)), targets(0, 4, 4, f64)).backward();
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string msg;
    try {
      if (attempt == 0) ddp.check_reducer_finalized();
      else ddp(inputs(0, 4, 8, f64));
    } catch (const std::exception& e) {
      msg = e.what();
    }
    expect(msg.find("[ddp] Expected to have finished reduction") != std::string::npos &&
               msg.find("extra.weight, extra.bias") != std::string::npos &&
               msg.find("find_unused_parameters") != std::string::npos,
           "{} did not raise the unused-parameter error: '{}'", attempt == 0 ? "check_reducer_finalized" : "forward",
           msg);
  }
}

// Construction errors: different models across ranks, and a model with nothing to train.
inline void construction_errors(ProcessGroupPtr g) {
  const int R = g->rank();
  if (g->size() > 1) {
    manual_seed(1);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(8, R == 1 ? 5 : 6));
    std::string msg;
    try {
      DistributedDataParallel ddp(m, g, {});
    } catch (const std::exception& e) {
      msg = e.what();
    }
    expect(msg.find("[ddp] the model differs across ranks: parameter 0") != std::string::npos &&
               msg.find("[6, 8]") != std::string::npos && msg.find("[5, 8] f32 on rank 1") != std::string::npos,
           "mismatched shapes: got '{}'", msg);
    auto n = std::make_shared<nn::Sequential>();
    n->push_back(std::make_shared<nn::Linear>(8, 6, /*bias=*/R != 1));
    msg.clear();
    try {
      DistributedDataParallel ddp(n, g, {});
    } catch (const std::exception& e) {
      msg = e.what();
    }
    expect(msg.find("rank 0 has 2 parameters but rank 1 has 1") != std::string::npos, "mismatched counts: got '{}'", msg);
  }
  auto frozen = std::make_shared<nn::Linear>(3, 3);
  frozen->weight.requires_grad_(false);
  frozen->bias.requires_grad_(false);
  std::string msg;
  try {
    DistributedDataParallel ddp(frozen, g, {});
  } catch (const std::exception& e) {
    msg = e.what();
  }
  expect(msg.find("DDP is not needed when a module has no parameter that requires a gradient") != std::string::npos,
         "frozen module: got '{}'", msg);
  auto lin = std::make_shared<nn::Linear>(3, 3);
  msg.clear();
  try {
    DistributedDataParallel ddp(lin, g, {.ignored_parameters = {"weight", "nope"}});
  } catch (const std::exception& e) {
    msg = e.what();
  }
  expect(msg.find("ignored name 'nope'") != std::string::npos, "unknown ignored name: got '{}'", msg);
}

// Ignored parameters are neither broadcast nor reduced: their gradients stay local.
inline void ignored_parameters(ProcessGroupPtr g) {
  const int R = g->rank();
  auto model = make_net(f64, 10 + R);
  model->never->weight.requires_grad_(false);
  model->never->bias.requires_grad_(false);
  Tensor before = model->fc2->weight.clone();
  DistributedDataParallel ddp(model, g, {.ignored_parameters = {"fc2.weight"}});
  expect(max_abs_diff(model->fc2->weight, before) == 0, "rank {}: an ignored parameter was broadcast", R);
  Tensor x = inputs(R * 4, 4, 8, f64), y = targets(R * 4, 4, 4, f64);
  mse_loss(ddp(x), y).backward();
  ddp.check_reducer_finalized();
  // The local gradient of fc2.weight: recompute on a detached copy of the (synced) model.
  auto copy = make_net(f64, 0);
  copy->load_state_dict(model->state_dict());
  mse_loss((*copy)(x), y).backward();
  double d = max_abs_diff(model->fc2->weight.grad(), copy->fc2->weight.grad());
  expect(d < 1e-12, "rank {}: the ignored parameter's gradient was reduced (differs from the local one by {})", R, d);
  auto names = ddp.parameter_names();
  expect(std::find(names.begin(), names.end(), "fc2.weight") == names.end(), "fc2.weight is managed although ignored");
}

// Overlap: with one bucket per parameter, bucket 0 is launched before the last gradient is ready.
inline void overlap_order(ProcessGroupPtr g) {
  auto model = make_net(f32);
  model->never->weight.requires_grad_(false);
  model->never->bias.requires_grad_(false);
  DistributedDataParallel ddp(model, g, {.bucket_cap_mb = 1e-9});
  for (int step = 0; step < 2; ++step) {  // the second iteration runs on the rebuilt buckets
    model->zero_grad();
    shard_loss(ddp.module(), 0, 0, f32);
    mse_loss(ddp(inputs(step, 4, 8, f32)), targets(step, 4, 4, f32)).backward();
    const auto& ev = ddp.reducer_events();
    int64_t first_launch = -1, last_ready = -1, finalized = -1, launches = 0;
    for (size_t i = 0; i < ev.size(); ++i) {
      if (ev[i].kind == ReducerEvent::bucket_launched) {
        if (first_launch < 0) {
          expect(ev[i].index == 0, "the first bucket launched is {}, not 0", ev[i].index);
          first_launch = static_cast<int64_t>(i);
        }
        ++launches;
      }
      if (ev[i].kind == ReducerEvent::grad_ready) last_ready = static_cast<int64_t>(i);
      if (ev[i].kind == ReducerEvent::finalized) finalized = static_cast<int64_t>(i);
    }
    expect(launches == 6, "{} buckets launched, expected 6 (one per parameter)", launches);
    expect(first_launch >= 0 && first_launch < last_ready,
           "bucket 0 was launched at event {}, not before the last gradient was ready (event {})", first_launch, last_ready);
    expect(finalized > last_ready, "finalize came before the last gradient");
    // Buckets launch strictly in index order.
    int64_t expect_index = 0;
    for (const auto& e : ev)
      if (e.kind == ReducerEvent::bucket_launched) expect(e.index == expect_index++, "bucket {} launched out of order", e.index);
  }
}

// Ranks whose gradient-ready orders differ agree on the rebuilt buckets (rank 0's order).
struct TwoBranch : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  int rank = 0;
  TwoBranch() : Module("TwoBranch") {
    a = register_module("a", std::make_shared<nn::Linear>(8, 4));
    b = register_module("b", std::make_shared<nn::Linear>(8, 4));
  }
  Tensor forward(const Tensor& x) override {
    // The same function on every rank, computed in a rank-dependent order, so backward makes
    // a's and b's gradients ready in opposite orders on even and odd ranks.
    if (rank % 2 == 0) {
      Tensor ya = (*a)(x);
      return ya + (*b)(x);
    }
    Tensor yb = (*b)(x);
    return (*a)(x) + yb;
  }
};

inline void rebuild_agreement(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  manual_seed(5);
  auto model = std::make_shared<TwoBranch>();
  model->rank = R;
  manual_seed(5);
  auto reference = std::make_shared<TwoBranch>();
  DistributedDataParallel ddp(model, g, {.bucket_cap_mb = 100.0 / (1 << 20)});  // ~100 B: about one tensor each
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  for (int step = 0; step < 4; ++step) {
    opt.zero_grad();
    Tensor l = mse_loss(ddp(inputs(step * 32 + R * 4, 4, 8, f32)), targets(step * 32 + R * 4, 4, 4, f32));
    l.backward();
    opt.step();
    ref_opt.zero_grad();
    Tensor total;
    for (int r = 0; r < W; ++r) {
      reference->rank = r;
      Tensor lr = mse_loss((*reference)(inputs(step * 32 + r * 4, 4, 8, f32)), targets(step * 32 + r * 4, 4, 4, f32));
      total = total.defined() ? total + lr : lr;
    }
    (total / static_cast<double>(W)).backward();
    ref_opt.step();
  }
  auto st = ddp.stats();
  expect(!st.rebuilt_bucket_bytes.empty(), "rank {}: buckets were not rebuilt", R);
  // Every rank's layout (names per bucket) must equal rank 0's: compare a digest of it.
  std::string layout = fmt::format("{}", st.bucket_parameters);
  int64_t digest = static_cast<int64_t>(std::hash<std::string>{}(layout) & 0x7fffffffffff);
  Tensor all = zeros({W}, i64);
  g->allgather_into(all, from_vector<int64_t>({digest}))->wait();
  auto v = all.to_vector<int64_t>();
  for (int r = 1; r < W; ++r) expect(v[r] == v[0], "rank {}'s rebuilt buckets differ from rank 0's (rank {}: {})", r, R, layout);
  expect_same_parameters(*model, *reference, 2e-6, fmt::format("rebuild rank {}", R));
}

// Comm hooks: fp16/bf16 compression within tolerance, a custom hook, and registration errors.
inline void comm_hooks(ProcessGroupPtr g) {
  const int R = g->rank();
  auto grads_with = [&](const std::function<void(DistributedDataParallel&)>& setup) {
    auto model = make_net(f32);
    model->never->weight.requires_grad_(false);
    model->never->bias.requires_grad_(false);
    DistributedDataParallel ddp(model, g, {.bucket_cap_mb = 0.0005});
    setup(ddp);
    for (int step = 0; step < 2; ++step) {
      model->zero_grad();
      mse_loss(ddp(inputs(R * 4 + step * 64, 4, 8, f32)), targets(R * 4 + step * 64, 4, 4, f32)).backward();
    }
    std::vector<Tensor> out;
    for (const Tensor& p : model->parameters())
      if (p.grad().defined()) out.push_back(p.grad().clone());
    return out;
  };
  auto plain = grads_with([](DistributedDataParallel&) {});
  auto g_fp16 = grads_with([](DistributedDataParallel& d) { d.register_comm_hook(hooks::fp16_compress); });
  auto g_bf16 = grads_with([](DistributedDataParallel& d) { d.register_comm_hook(hooks::bf16_compress); });
  auto wrapped = grads_with([](DistributedDataParallel& d) {
    d.register_comm_hook(hooks::compress_wrapper(bf16, hooks::allreduce));
  });
  int calls = 0;
  auto custom = grads_with([&](DistributedDataParallel& d) {
    // Sums without dividing, then divides in a continuation: the same average, a different path.
    d.register_comm_hook([&calls](GradBucket& b) {
      ++calls;
      int n = b.group->size();
      return b.group->allreduce(b.buffer, ReduceOp::sum)->then([n](Work& w) {
        NoGradGuard ng;
        w.result()[0].div_(n);
        return w.result();
      });
    });
  });
  for (size_t i = 0; i < plain.size(); ++i) {
    double scale = std::max(1.0, plain[i].abs().max().item<double>());
    double d16 = max_abs_diff(g_fp16[i], plain[i]) / scale, db16 = max_abs_diff(g_bf16[i], plain[i]) / scale;
    double dw = max_abs_diff(wrapped[i], plain[i]) / scale, dc = max_abs_diff(custom[i], plain[i]) / scale;
    expect(d16 < 2e-3, "fp16_compress gradient {} off by {}", i, d16);
    expect(db16 < 2e-2, "bf16_compress gradient {} off by {}", i, db16);
    expect(dw < 2e-2, "compress_wrapper gradient {} off by {}", i, dw);
    expect(dc < 1e-6, "custom hook gradient {} off by {}", i, dc);
    expect(d16 > 0 || db16 > 0, "compression changed nothing: are the hooks running?");
  }
  expect(calls > 0, "the custom hook never ran");

  auto model = make_net(f32);
  model->never->weight.requires_grad_(false);
  model->never->bias.requires_grad_(false);
  DistributedDataParallel ddp(model, g, {});
  ddp.register_comm_hook(hooks::allreduce);
  std::string twice, late;
  try {
    ddp.register_comm_hook(hooks::fp16_compress);
  } catch (const std::exception& e) {
    twice = e.what();
  }
  expect(twice.find("register_comm_hook may only be called once") != std::string::npos, "second hook: '{}'", twice);
  auto net2 = make_net(f32);
  net2->never->weight.requires_grad_(false);
  net2->never->bias.requires_grad_(false);
  DistributedDataParallel ddp2(net2, g, {});
  mse_loss(ddp2(inputs(0, 4, 8, f32)), targets(0, 4, 4, f32)).backward();
  try {
    ddp2.register_comm_hook(hooks::fp16_compress);
  } catch (const std::exception& e) {
    late = e.what();
  }
  expect(late.find("before the first backward") != std::string::npos, "hook after training: '{}'", late);
}

// A backward that throws, then remove_autograd_hooks (or destroying the DDP), then a second DDP
// over the same module trains correctly with its hooks firing once per parameter.
inline void hooks_after_failed_backward(ProcessGroupPtr g, bool destroy) {
  const int W = g->size(), R = g->rank();
  auto model = make_net(f64);
  model->never->weight.requires_grad_(false);
  model->never->bias.requires_grad_(false);
  auto first = std::make_unique<DistributedDataParallel>(model, g, DdpOptions{});
  Tensor out = (*first)(inputs(R * 4, 4, 8, f64));
  auto bomb = register_hook(out, [](const Tensor&) -> Tensor { throw std::runtime_error("boom in backward"); });
  bool threw = false;
  try {
    mse_loss(out, targets(R * 4, 4, 4, f64)).backward();
  } catch (const std::exception&) {
    threw = true;
  }
  expect(threw, "the failing backward did not throw");
  if (destroy) first.reset();
  else first->remove_autograd_hooks();

  auto reference = make_net(f64);
  reference->never->weight.requires_grad_(false);
  reference->never->bias.requires_grad_(false);
  reference->load_state_dict(model->state_dict());
  DistributedDataParallel second(model, g, {.bucket_cap_mb = 1e-9});
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    model->zero_grad();
    shard_loss(second.module(), step, R, f64).backward();  // local only: DDP did not run forward
    model->zero_grad();
    second.call([&] { return shard_loss(*model, step, R, f64); }).backward();
    second.check_reducer_finalized();
    int64_t ready = 0;
    for (const auto& e : second.reducer_events()) ready += e.kind == ReducerEvent::grad_ready;
    expect(ready == 6, "second DDP: {} gradient-ready events in one backward, expected 6", ready);
    opt.step();
    ref_opt.zero_grad();
    Tensor total;
    for (int r = 0; r < W; ++r) {
      Tensor l = shard_loss(*reference, step, r, f64);
      total = total.defined() ? total + l : l;
    }
    (total / static_cast<double>(W)).backward();
    ref_opt.step();
  }
  expect_same_parameters(*model, *reference, 1e-12, fmt::format("second DDP (destroy={}) rank {}", destroy, R));
}


// ---- weight tying ----

// wte -> tanh(mid) (+ extra on the ranks use_extra picks) -> lm_head, lm_head.weight tied to
// wte.weight with Module::set_parameter: one parameter, two uses.
struct TiedLM : nn::Module {
  static constexpr int64_t vocab = 11, dim = 6;
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Linear> mid, extra, lm_head;
  std::function<bool(int)> use_extra = [](int) { return true; };
  int rank = 0;
  TiedLM() : Module("TiedLM") {
    wte = register_module("wte", std::make_shared<nn::Embedding>(vocab, dim));
    mid = register_module("mid", std::make_shared<nn::Linear>(dim, dim));
    extra = register_module("extra", std::make_shared<nn::Linear>(dim, dim));
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(dim, vocab, /*bias=*/false));
    set_parameter("lm_head.weight", wte->weight);
  }
  Tensor forward(const Tensor& idx) override {
    Tensor h = tanh((*mid)(wte->forward(idx)));
    if (use_extra(rank)) h = h + (*extra)(h);
    return (*lm_head)(h);
  }
};

// A model of type M with parameters drawn from `seed`, in f64: every equivalence case's start.
template <class M>
std::shared_ptr<M> seeded_f64(uint64_t seed) {
  manual_seed(seed);
  auto m = std::make_shared<M>();
  m->to(f64);
  return m;
}

inline std::shared_ptr<TiedLM> make_tied_lm(uint64_t seed) { return seeded_f64<TiedLM>(seed); }

// Deterministic token ids for rows first.. of a step's shard; `shift` 1 gives the targets.
inline Tensor tied_tokens(int64_t first, int64_t rows, int64_t shift) {
  std::vector<int64_t> v;
  for (int64_t i = first; i < first + rows; ++i) v.push_back((i * (i + shift) * 7 + 3 * i + shift) % TiedLM::vocab);
  return from_vector<int64_t>(v, {rows});
}
inline Tensor tied_loss(nn::Module& m, int step, int r) {
  int64_t first = (step * 16 + r) * kRowsPerRank;
  return nn::cross_entropy(m(tied_tokens(first, kRowsPerRank, 0)), tied_tokens(first, kRowsPerRank, 1));
}

// DDP of the tied model (AdamW, or AdamW in backward) vs one process on the mean loss: the tied
// weight is one bucket slot under its first name, its gradient is ready (and reduced) once per
// backward, it is stepped once per backward, and the tie survives.
inline void tied_equivalence(ProcessGroupPtr g, bool find_unused, bool static_graph, bool in_backward, bool bucket_view) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("tied weights find_unused={} static={} in_backward={} view={} rank {}/{}",
                                       find_unused, static_graph, in_backward, bucket_view, R, W);
  const bool unused_ok = find_unused || static_graph;
  auto uses_extra = [unused_ok](int r) { return !unused_ok || r % 2 == 1; };
  auto model = make_tied_lm(R == 0 ? 7 : 50 + R);  // the ranks start different: DDP broadcasts rank 0's
  model->rank = R;
  model->use_extra = uses_extra;
  auto reference = make_tied_lm(7);
  const optim::AdamWOptions adamw{.lr = 0.01};
  std::shared_ptr<optim::InBackwardOptimizers> in_bw;
  if (in_backward) in_bw = optim::apply_optimizer_in_backward(adamw, model->parameters());
  DdpOptions o;
  o.find_unused_parameters = find_unused;
  o.static_graph = static_graph;
  o.gradient_as_bucket_view = bucket_view;
  o.bucket_cap_mb = 1e-9;  // a bucket per parameter
  DistributedDataParallel ddp(model, g, o);
  std::unique_ptr<optim::AdamW> opt;
  if (!in_backward) opt = std::make_unique<optim::AdamW>(model->parameters(), adamw);
  optim::AdamW ref_opt(reference->parameters(), adamw);

  const auto names = ddp.parameter_names();
  const std::vector<std::string> want_names{"wte.weight", "mid.weight", "mid.bias", "extra.weight", "extra.bias"};
  expect(names == want_names, "{}: DDP's parameters are {}, expected {}", what, names, want_names);
  std::vector<std::string> slots;
  for (const auto& b : ddp.stats().bucket_parameters) slots.insert(slots.end(), b.begin(), b.end());
  expect(std::count(slots.begin(), slots.end(), "wte.weight") == 1 && slots.size() == want_names.size(),
         "{}: the buckets hold {}, expected each of {} once", what, slots, want_names);
  const int64_t tied_index = 0;  // wte.weight's index in parameter_names()

  const int steps = 4;
  for (int step = 0; step < steps; ++step) {
    if (opt) opt->zero_grad(/*set_to_none=*/!bucket_view);
    ddp.call([&] { return tied_loss(*model, step, R); }).backward();
    ddp.check_reducer_finalized();
    // The tied weight is ready as often as mid.weight, which is used once (the event log has
    // two grad_ready per parameter in static_graph's first iteration: at the hook, then at the
    // end-of-backward reduction); a second hook would be "marked ready twice".
    int64_t tied_ready = 0, once_ready = 0, launched = 0;
    for (const auto& e : ddp.reducer_events()) {
      tied_ready += e.kind == ReducerEvent::grad_ready && e.index == tied_index;
      once_ready += e.kind == ReducerEvent::grad_ready && e.index == tied_index + 1;
      launched += e.kind == ReducerEvent::bucket_launched;
    }
    expect(tied_ready >= 1 && tied_ready == once_ready,
           "{}: the tied weight was ready {} times in backward {}, mid.weight {} times", what, tied_ready, step,
           once_ready);
    const auto bucket_count = static_cast<int64_t>(ddp.stats().bucket_bytes.size());
    expect(launched == bucket_count, "{}: {} bucket launches in backward {}, expected {}", what, launched, step,
           bucket_count);
    if (opt) opt->step();

    ref_opt.zero_grad();
    reference->use_extra = uses_extra;
    reference_backward(W, 1, [&](int r, int) {
      reference->rank = r;
      return tied_loss(*reference, step, r);
    });
    ref_opt.step();
  }
  expect(model->lm_head->weight.is_same(model->wte->weight), "{}: the tie did not survive DDP", what);
  expect_same_parameters(*model, *reference, 1e-10, what);
  if (in_bw) {
    const Tensor& tied = model->wte->weight;
    const auto* st = in_bw->optimizer_for(tied).state(tied);
    expect(st && st->step == steps, "{}: the tied weight took {} in-backward steps in {} backwards", what,
           st ? st->step : 0, steps);
  }
}

inline void tied_weights_all(ProcessGroupPtr g) {
  tied_equivalence(g, false, false, false, false);
  tied_equivalence(g, false, false, false, true);
  tied_equivalence(g, true, false, false, false);
  tied_equivalence(g, false, true, false, false);
  tied_equivalence(g, false, false, true, false);
  tied_equivalence(g, true, false, true, false);
}

}  // namespace ddp_cases
