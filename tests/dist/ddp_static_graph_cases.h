// DDP's static_graph: one, two and three forwards of the same module before one backward, and a
// graph that changes under it (an error on the rank that changed, a timeout elsewhere). Shared by
// test_ddp (threads backend) and test_ddp_mpi (mpirun) through ddp_case_table.h; each case runs on
// every rank and throws on a failed check; equivalence is against one process computing every
// rank's loss.
#pragma once

#include "ddp_cases.h"

namespace ddp_cases {

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

}  // namespace ddp_cases
