// Checkpoints of a training run (dist/checkpoint.h): save_checkpoint on every rank, rank 0 writing
// one file; load_checkpoint on every rank. A run resumed from a checkpoint goes on with the same
// bits as the run that did not stop, whether a ZeroRedundancyOptimizer or a plain optimizer wrote
// it or reads it, and whatever number of ranks wrote it (one process on the whole batch included);
// a load that cannot restore every part it was given restores none.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "core/random.h"
#include "ddp_cases.h"
#include "ddp_in_backward_cases.h"
#include "ddp_join_cases.h"  // expect_join_error
#include "ddp_zero_cases.h"
#include "ddp_zero_join_cases.h"  // warmup_cosine

namespace ddp_cases {

// A checkpoint file every rank of g names alike (rank 0's process id, broadcast; the world size
// keeps the threads runs at several sizes apart); rank 0 removes it.
class SharedCheckpoint {
 public:
  SharedCheckpoint(ProcessGroupPtr g, const std::string& tag) : g_(std::move(g)) {
    Tensor token = from_vector<int64_t>({g_->rank() == 0 ? static_cast<int64_t>(::getpid()) : 0});
    g_->broadcast(token, 0)->wait();
    path = (std::filesystem::temp_directory_path() /
            fmt::format("tandem_checkpoint_{}_{}_{}.safetensors", tag, token.item<int64_t>(), g_->size()))
               .string();
  }
  ~SharedCheckpoint() { remove(); }  // a failed case: whatever is left
  SharedCheckpoint(const SharedCheckpoint&) = delete;
  SharedCheckpoint& operator=(const SharedCheckpoint&) = delete;
  // Every rank has read it: rank 0 removes it.
  void done() {
    g_->barrier()->wait();
    remove();
  }
  std::string path;

 private:
  void remove() {
    std::error_code ec;
    if (g_->rank() == 0) std::filesystem::remove(path, ec);
  }
  ProcessGroupPtr g_;
};

// Copies of a state dict's tensors, to compare with after something may have changed them.
inline nn::TensorDict snapshot(const nn::TensorDict& d) {
  nn::TensorDict out;
  for (const auto& [k, t] : d) out.insert(k, t.detach().clone());
  return out;
}

inline void expect_same_dict(const nn::TensorDict& got, const nn::TensorDict& want, const std::string& what) {
  expect(got.size() == want.size(), "{}: {} entries, expected {} ({} vs {})", what, got.size(), want.size(), got.keys(),
         want.keys());
  for (const auto& [key, t] : want) {
    expect(got.contains(key), "{}: no entry '{}'", what, key);
    expect(got.at(key).shape() == t.shape(), "{}: '{}' has shape {}, expected {}", what, key, got.at(key).shape(),
           t.shape());
    const double d = t.numel() == 0 ? 0 : max_abs_diff(got.at(key), t);
    expect(d == 0, "{}: '{}' differs by {}", what, key, d);
  }
}

// (a) DDP + ZeroRedundancyOptimizer(AdamW) + a warm-up/cosine schedule, saved after 3 steps at this
// number of ranks and resumed into fresh objects: every step after it has the bits of the run that
// went on, and the step, the generator and the loop's own entries come back.
inline void checkpoint_resume_zero(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("checkpoint resume (ZeRO) rank {}/{}", R, W);
  const optim::AdamWOptions adamw{.lr = 0.02};
  auto model = make_net_without_never(f64, R == 0 ? 7 : 100 + R);
  DistributedDataParallel ddp(model, g);
  ZeroRedundancyOptimizer zero(model->parameters(), adamw, g);
  auto schedule = warmup_cosine(zero);
  auto train = [&](DistributedDataParallel& d, optim::Optimizer& opt, optim::LRScheduler& sched, int step) {
    step_each({{&d, &opt}}, 1, [&](DistributedDataParallel& dd, int) { return ddp_shard_loss(dd, step, R); });
    sched.step();
  };
  for (int step = 0; step < 3; ++step) train(ddp, zero, *schedule, step);

  SharedCheckpoint file(g, "resume_zero");
  manual_seed(1234);  // every rank alike: rank 0's generator is the one saved
  randn({3});
  const PhiloxState rng = get_rng_state();
  TrainingState saved{.model = model.get(), .optimizer = &zero, .scheduler = schedule.get(), .step = 3};
  saved.extra.insert("position", from_vector<int64_t>({3, 12}));
  save_checkpoint(file.path, saved, g);
  randn({5});  // the generator moves on; the load puts it back

  auto resumed_model = make_net_without_never(f64, 300 + R);
  ZeroRedundancyOptimizer resumed(resumed_model->parameters(), adamw, g);
  auto resumed_schedule = warmup_cosine(resumed);
  TrainingState state{.model = resumed_model.get(), .optimizer = &resumed, .scheduler = resumed_schedule.get()};
  state.extra.insert("stale", zeros({1}));  // replaced by the file's entries
  const CheckpointInfo info = load_checkpoint(file.path, state);
  file.done();
  expect(info.step == 3 && state.step == 3 && info.world_size == W, "{}: read step {} (state {}) at {} ranks", what,
         info.step, state.step, info.world_size);
  expect(state.extra.size() == 1 && state.extra.contains("position") &&
             state.extra.at("position").to_vector<int64_t>() == std::vector<int64_t>{3, 12},
         "{}: the extra entries came back as {}", what, state.extra.keys());
  const PhiloxState now = get_rng_state();
  expect(now.seed == rng.seed && now.offset == rng.offset, "{}: the generator is at ({}, {}), saved at ({}, {})", what,
         now.seed, now.offset, rng.seed, rng.offset);
  expect(resumed_schedule->last_epoch() == 3 && resumed.lr() == zero.lr(),
         "{}: the schedule is at epoch {}, lr {} ({})", what, resumed_schedule->last_epoch(), resumed.lr(), zero.lr());
  expect_same_parameters(*resumed_model, *model, 0, what + " after loading");

  DistributedDataParallel resumed_ddp(resumed_model, g);
  for (int step = 3; step < 7; ++step) {
    train(ddp, zero, *schedule, step);
    train(resumed_ddp, resumed, *resumed_schedule, step);
    expect_same_parameters(*resumed_model, *model, 0, fmt::format("{} step {}", what, step));
  }
  zero.consolidate_state_dict(0);
  resumed.consolidate_state_dict(0);
  if (R == 0) expect_same_dict(resumed.state_dict(), zero.state_dict(), what + " optimizer state");
}

// (b) The optimizer's part has the plain optimizer's format: a plain AdamW's checkpoint resumes
// into a ZeroRedundancyOptimizer and a ZeroRedundancyOptimizer's into a plain AdamW, and both go on
// as the run that wrote it (the same arithmetic per parameter: 1e-12 in f64).
inline void checkpoint_plain_and_zero(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const optim::AdamWOptions adamw{.lr = 0.02};
  auto make = [&](bool zero, nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
    if (zero) return std::make_unique<ZeroRedundancyOptimizer>(m.parameters(), adamw, g);
    return std::make_unique<optim::AdamW>(m.parameters(), adamw);
  };
  for (bool zero_saves : {false, true}) {
    const std::string what =
        fmt::format("checkpoint {} rank {}/{}", zero_saves ? "ZeRO -> AdamW" : "AdamW -> ZeRO", R, W);
    auto model = make_net_without_never(f64, R == 0 ? 7 : 100 + R);
    DistributedDataParallel ddp(model, g);
    auto opt = make(zero_saves, *model);
    optim::StepLR sched(*opt, 2, 0.5);
    for (int step = 0; step < 3; ++step) {
      step_each({{&ddp, opt.get()}}, 1, [&](DistributedDataParallel& d, int) { return ddp_shard_loss(d, step, R); });
      sched.step();
    }
    SharedCheckpoint file(g, zero_saves ? "zero_to_plain" : "plain_to_zero");
    save_checkpoint(file.path, {.model = model.get(), .optimizer = opt.get(), .scheduler = &sched, .step = 3}, g);

    auto resumed_model = make_net_without_never(f64, 300 + R);
    auto resumed = make(!zero_saves, *resumed_model);
    optim::StepLR resumed_sched(*resumed, 2, 0.5);
    TrainingState state{.model = resumed_model.get(), .optimizer = resumed.get(), .scheduler = &resumed_sched};
    load_checkpoint(file.path, state);
    file.done();
    DistributedDataParallel resumed_ddp(resumed_model, g);
    for (int step = 3; step < 7; ++step) {
      step_each({{&ddp, opt.get()}, {&resumed_ddp, resumed.get()}}, 1,
                [&](DistributedDataParallel& d, int) { return ddp_shard_loss(d, step, R); });
      sched.step();
      resumed_sched.step();
      expect_same_parameters(*resumed_model, *model, 1e-12, fmt::format("{} step {}", what, step));
    }
  }
}

// (c) A checkpoint one process wrote (on the whole batch: every rank's shard, as one loss) loads
// at W ranks behind DDP + ZeRO, and the W ranks go on as that process goes on alone (f64, 1e-12).
inline void checkpoint_from_one_process(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("checkpoint from one process rank {}/{}", R, W);
  const optim::AdamWOptions adamw{.lr = 0.02};
  // The process alone, on every rank alike (deterministic), so each can compare with it.
  auto alone = make_net_without_never(f64, 7);
  optim::AdamW alone_opt(alone->parameters(), adamw);
  optim::StepLR alone_sched(alone_opt, 2, 0.5);
  auto step_alone = [&](int step) {
    alone_opt.zero_grad();
    reference_backward(W, 1, [&](int r, int) { return shard_loss(*alone, step, r, f64); });
    alone_opt.step();
    alone_sched.step();
  };
  step_alone(0);
  step_alone(1);
  SharedCheckpoint file(g, "one_process");
  if (R == 0) {  // written by a group of one: this process alone
    save_checkpoint(file.path, {.model = alone.get(), .optimizer = &alone_opt, .scheduler = &alone_sched, .step = 2},
                    make_thread_world(1)[0]);
  }
  g->barrier()->wait();

  auto model = make_net_without_never(f64, 300 + R);
  ZeroRedundancyOptimizer zero(model->parameters(), adamw, g);
  optim::StepLR sched(zero, 2, 0.5);
  TrainingState state{.model = model.get(), .optimizer = &zero, .scheduler = &sched, .rng = false};
  const CheckpointInfo info = load_checkpoint(file.path, state);
  file.done();
  expect(info.world_size == 1 && info.step == 2, "{}: read step {} at {} ranks", what, info.step, info.world_size);
  DistributedDataParallel ddp(model, g);
  for (int step = 2; step < 6; ++step) {
    step_each({{&ddp, &zero}}, 1, [&](DistributedDataParallel& d, int) { return ddp_shard_loss(d, step, R); });
    sched.step();
    step_alone(step);
    expect_same_parameters(*model, *alone, 1e-12, fmt::format("{} step {}", what, step));
  }
}

// The Net's layers with other widths: a model that does not fit the Net's checkpoint.
struct WideNet : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2, extra, never;
  WideNet() : Module("WideNet") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 5));
    extra = register_module("extra", std::make_shared<nn::Linear>(16, 5));
    never = register_module("never", std::make_shared<nn::Linear>(16, 5));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = tanh((*fc1)(x));
    return (*fc2)(h) + (*extra)(h);
  }
};

// (d) Every error, on every rank: a file that is missing or no checkpoint, a part set here that
// the file lacks, a model of other shapes, an optimizer that does not fit (after optimizers in
// backward that did: they are put back), a scheduler of another class; each restores nothing (the
// model, the optimizers' state, the extra entries as they were). Then a load that fits restores
// everything, the optimizers in backward included; and a save that cannot be written fails on
// every rank.
inline void checkpoint_errors(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("checkpoint errors rank {}/{}", R, W);
  const Tensor x = inputs(0, 4, 8, f64), y = targets(0, 4, 4, f64);
  const optim::AdamWOptions adamw{.lr = 0.02};
  // The file: the Net, its fc1 stepped in backward ("fc1"), AdamW over fc2 and extra, a StepLR;
  // no generator state. The same on every rank.
  auto model = make_net_without_never(f64, 7);
  auto fc1_in_backward = optim::apply_optimizer_in_backward(adamw, {model->fc1->weight, model->fc1->bias});
  optim::AdamW opt({model->fc2->weight, model->fc2->bias, model->extra->weight, model->extra->bias}, adamw);
  optim::StepLR sched(opt, 1, 0.5);
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    mse_loss((*model)(x), y).backward();
    opt.step();
    sched.step();
  }
  SharedCheckpoint file(g, "errors");
  TrainingState saved{.model = model.get(),
                      .optimizer = &opt,
                      .scheduler = &sched,
                      .in_backward = {{"fc1", fc1_in_backward.get()}},
                      .step = 2,
                      .rng = false};
  saved.extra.insert("note", from_vector<int64_t>({7}));
  save_checkpoint(file.path, saved, g);

  // A fresh run of the same shapes, stepped once, so it has state to lose.
  auto fresh = make_net_without_never(f64, 300);
  auto fresh_in_backward = optim::apply_optimizer_in_backward(adamw, {fresh->fc1->weight, fresh->fc1->bias});
  optim::AdamW fresh_opt({fresh->fc2->weight, fresh->fc2->bias, fresh->extra->weight, fresh->extra->bias}, adamw);
  optim::StepLR fresh_sched(fresh_opt, 1, 0.5);
  mse_loss((*fresh)(x), y).backward();
  fresh_opt.step();
  const nn::TensorDict model_before = snapshot(fresh->state_dict());
  const nn::TensorDict opt_before = snapshot(fresh_opt.state_dict());
  const nn::TensorDict in_backward_before = snapshot(fresh_in_backward->state_dict());
  auto unchanged = [&](const TrainingState& st, const std::string& after) {
    const std::string w = what + " after " + after;
    expect_same_dict(fresh->state_dict(), model_before, w + ": the model");
    expect_same_dict(fresh_opt.state_dict(), opt_before, w + ": the optimizer");
    expect_same_dict(fresh_in_backward->state_dict(), in_backward_before, w + ": the optimizers in backward");
    expect(fresh_sched.last_epoch() == 0 && fresh_opt.lr() == adamw.lr, "{}: the schedule moved", w);
    expect(st.step == -1 && st.extra.size() == 1 && st.extra.contains("mine"), "{}: the step or extra changed", w);
  };
  auto fresh_state = [&] {
    TrainingState st{.model = fresh.get(),
                     .optimizer = &fresh_opt,
                     .scheduler = &fresh_sched,
                     .in_backward = {{"fc1", fresh_in_backward.get()}},
                     .step = -1,
                     .rng = false};
    st.extra.insert("mine", zeros({1}));
    return st;
  };

  TrainingState st = fresh_state();
  expect_join_error([&] { load_checkpoint(file.path + ".absent", st); },
                    fmt::format("[checkpoint] '{}.absent' does not exist", file.path));
  unchanged(st, "a missing file");
  {
    // A safetensors file that save_checkpoint did not write (each rank its own).
    const std::string plain = file.path + fmt::format(".plain{}", R);
    nn::save_safetensors(plain, fresh->state_dict());
    expect_join_error([&] { load_checkpoint(plain, st); }, fmt::format("[checkpoint] '{}' is not a checkpoint", plain));
    std::filesystem::remove(plain);
    unchanged(st, "a file that is no checkpoint");
  }
  st.rng = true;  // not saved
  expect_join_error([&] { load_checkpoint(file.path, st); },
                    fmt::format("[checkpoint] '{}' holds no random generator state ('checkpoint.rng')", file.path));
  unchanged(st, "a generator state the file lacks");
  st.rng = false;
  st.in_backward.emplace_back("fc2", fresh_in_backward.get());
  expect_join_error([&] { load_checkpoint(file.path, st); },
                    "holds no optimizers in backward 'fc2' ('in_backward.fc2.')");
  unchanged(st, "optimizers in backward the file lacks");
  st.in_backward.pop_back();
  {
    // A model of other shapes, with an optimizer that has state.
    auto wide = std::make_shared<WideNet>();
    wide->to(f64);
    optim::AdamW wide_opt(wide->parameters(), adamw);
    mse_loss((*wide)(x), zeros({4, 5}, f64)).backward();
    wide_opt.step();
    const nn::TensorDict wide_before = snapshot(wide->state_dict());
    const nn::TensorDict wide_opt_before = snapshot(wide_opt.state_dict());
    TrainingState ws{.model = wide.get(), .optimizer = &wide_opt, .rng = false};
    expect_join_error([&] { load_checkpoint(file.path, ws); },
                      fmt::format("[checkpoint] '{}': the model (WideNet) does not fit the file's 'model.' section: "
                                  "[load_state_dict] cannot load into WideNet: size mismatch for 'fc2.weight': the "
                                  "state dict has [4, 16], the module has [5, 16]",
                                  file.path));
    expect_same_dict(wide->state_dict(), wide_before, what + " after a model of other shapes: the model");
    expect_same_dict(wide_opt.state_dict(), wide_opt_before, what + " after a model of other shapes: the optimizer");
  }
  {
    // The model and the optimizers in backward fit, the optimizer (over fewer parameters) does not:
    // the optimizers in backward, loaded first, are put back, and the model is left alone.
    optim::AdamW fewer({fresh->fc2->weight}, adamw);
    TrainingState fs = fresh_state();
    fs.optimizer = &fewer;
    fs.scheduler = nullptr;
    expect_join_error([&] { load_checkpoint(file.path, fs); },
                      fmt::format("[checkpoint] '{}': the optimizer (AdamW) does not fit the file's 'optimizer.' "
                                  "section: [AdamW] load_state_dict: ",
                                  file.path));
    unchanged(fs, "an optimizer that does not fit");
    expect(fewer.state(fresh->fc2->weight) == nullptr, "{}: the optimizer that did not fit took state", what);
  }
  {
    optim::CosineAnnealingLR cosine(fresh_opt, 10);
    const double lr = fresh_opt.lr();
    TrainingState cs = fresh_state();
    cs.scheduler = &cosine;
    expect_join_error([&] { load_checkpoint(file.path, cs); },
                      fmt::format("[checkpoint] '{}': the LR scheduler is a CosineAnnealingLR, the file holds a "
                                  "StepLR's state",
                                  file.path));
    cs.scheduler = &fresh_sched;  // for unchanged(): this one must not have moved either
    expect(fresh_opt.lr() == lr, "{}: a scheduler of another class changed the rate", what);
    fresh_opt.set_lr(adamw.lr);  // the cosine's construction set its epoch 0's rate: the same
    unchanged(cs, "a scheduler of another class");
  }

  // What fits loads, every part.
  const CheckpointInfo info = load_checkpoint(file.path, st);
  expect(info.step == 2 && st.step == 2 && info.world_size == W, "{}: read step {} at {} ranks", what, info.step,
         info.world_size);
  expect_same_dict(fresh->state_dict(), model->state_dict(), what + ": the loaded model");
  expect_same_dict(fresh_opt.state_dict(), opt.state_dict(), what + ": the loaded optimizer");
  expect_same_dict(fresh_in_backward->state_dict(), fc1_in_backward->state_dict(),
                   what + ": the loaded optimizers in backward");
  expect(fresh_sched.last_epoch() == 2 && fresh_opt.lr() == opt.lr(), "{}: the loaded schedule is at epoch {}, lr {}",
         what, fresh_sched.last_epoch(), fresh_opt.lr());
  expect(st.extra.size() == 1 && st.extra.contains("note"), "{}: the extra entries are {}", what, st.extra.keys());

  // Saving: a bad name, or a path that cannot be written (under a file, not a folder), fails on
  // every rank.
  TrainingState bad{.model = model.get(), .in_backward = {{"a.b", fc1_in_backward.get()}}};
  expect_join_error([&] { save_checkpoint(file.path, bad, g); }, "need a name without '.' or ','");
  const std::string nowhere = file.path + "/checkpoint.safetensors";
  expect_join_error([&] { save_checkpoint(nowhere, {.model = model.get()}, g); },
                    fmt::format("[checkpoint] cannot write '{}': ", nowhere));
  std::error_code ec;
  expect(!std::filesystem::exists(nowhere, ec), "{}: a failed save left '{}'", what, nowhere);
  file.done();
}

// Rank 0 runs out of data first; after the Join its schedule (the one save_checkpoint writes, from
// rank 0) is where the others' is, so a run resumed from that checkpoint goes on exactly as the
// run that did not stop, and both as one process on the whole batch with the same schedule.
inline void zero_join_resume(ProcessGroupPtr g) {
  const int W = g->size(), R = g->rank();
  const std::string what = fmt::format("zero join resume rank {}/{}", R, W);
  const optim::AdamWOptions adamw{.lr = 0.02};
  auto model = make_net_without_never(f64, R == 0 ? 7 : 100 + R);
  DistributedDataParallel ddp(model, g);
  ZeroRedundancyOptimizer zero(model->parameters(), adamw, g);
  auto schedule = warmup_cosine(zero);
  train_uneven(ddp, zero, *schedule, {&ddp, &zero}, {}, R);

  SharedCheckpoint file(g, "zero_join_resume");
  save_checkpoint(file.path, {.model = model.get(), .optimizer = &zero, .scheduler = schedule.get(), .rng = false}, g);
  auto resumed_model = make_net_without_never(f64, 300 + R);
  ZeroRedundancyOptimizer resumed(resumed_model->parameters(), adamw, g);
  auto resumed_schedule = warmup_cosine(resumed);
  TrainingState state{.model = resumed_model.get(), .optimizer = &resumed, .scheduler = resumed_schedule.get(),
                      .rng = false};
  load_checkpoint(file.path, state);
  file.done();
  DistributedDataParallel resumed_ddp(resumed_model, g);
  expect(resumed_schedule->last_epoch() == W + 1, "{}: rank 0's checkpoint holds schedule epoch {}, the run is at {}",
         what, resumed_schedule->last_epoch(), W + 1);

  // The reference: one process, each iteration on the losses of the ranks that still had a batch.
  auto reference = make_net_without_never(f64, 7);
  optim::AdamW ref_opt(reference->parameters(), adamw);
  auto ref_schedule = warmup_cosine(ref_opt);
  std::vector<std::vector<TensorList>> batches;
  for (int r = 0; r < W; ++r) batches.push_back(join_batches(r, r + 1));
  train_uneven_reference(*reference, ref_opt, batches, [&] { ref_schedule->step(); });
  expect_same_parameters(*model, *reference, 1e-12, what + " after the Join");
  for (int step = 0; step < 3; ++step) {
    step_each({{&ddp, &zero}, {&resumed_ddp, &resumed}}, 1,
              [&](DistributedDataParallel& d, int) { return ddp_shard_loss(d, 20 + step, R); });
    schedule->step();
    resumed_schedule->step();
    ref_opt.zero_grad();
    reference_backward(W, 1, [&](int r, int) { return shard_loss(*reference, 20 + step, r, f64); });
    ref_opt.step();
    ref_schedule->step();
    expect_same_parameters(*resumed_model, *model, 0, fmt::format("{} resumed vs uninterrupted, step {}", what, step));
    expect_same_parameters(*model, *reference, 1e-12, fmt::format("{} vs one process, step {}", what, step));
  }
}

}  // namespace ddp_cases
