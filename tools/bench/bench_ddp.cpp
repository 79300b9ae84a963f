// bench_ddp: DDP's cost, beside our own single-process step and PyTorch DDP over gloo.
//
//   bench_ddp [--json] [--runs N] [--no-peer] [--quick] [--peer-python PATH]
//
// Run it plainly (not under mpirun): it measures the single-process figures itself and launches
// `mpirun -np 2 bench_ddp --worker ...` for the DDP ones (one thread per rank), and the PyTorch
// peer (tools/bench/bench_ddp_peer.py, two gloo processes) in the same run. Rows:
//   ddp_step_np2          the bench_cpu MLP (64x784-512-512-10 per rank), one DDP step, vs our single-process step
//   ddp_floor_np2         the same local step (no DDP, no communication) run by both ranks at once, vs our
//                         single-process step: the machine's own contention; ddp_step_np2 / ddp_floor_np2 is
//                         what DDP itself costs
//   ddp_mpi_floor_np2     the DDP step vs the local step followed by a blocking MPI_Allreduce of each bucket's bytes
//                         (raw MPI, no overlap): what the communication costs at that point of the step
//   ddp_vs_torch_np2      the same DDP step vs PyTorch DDP (gloo, 2 ranks, same per-rank batch)
//   optim_in_bwd_np2      the same DDP step with SGD (momentum 0.9) stepped in backward vs DDP + step()
//   bucketing_gain        200 Linear(32, 32) layers: backward+comm time with one bucket per parameter / bucketed
//   bucket_view_rss       peak RSS of a 50 M-parameter model, DDP with gradient_as_bucket_view / single process
//   optim_in_bwd_peak_rss peak RSS of the 50 M-parameter model under DDP, SGD (momentum 0.9) in backward vs
//                         DDP + step() with zero_grad(set_to_none)
//   mp_bf16_comm_np2      4 x Linear(1024, 1024), 8 rows per rank (communication-heavy): the reducer's
//                         communication time per step with bf16 mixed precision vs f32 DDP
//   mp_bf16_step_np2      the same model, whole step, bf16 mixed precision vs f32 DDP
//   zero_step_np2         the bench MLP's DDP step with ZeroRedundancyOptimizer(Adam) vs DDP + Adam, interleaved
//   zero_overlap_step_np2 the same with overlap_with_ddp (the partition stepped in backward) vs DDP + Adam
//   flight_recorder_np2   the bench MLP's DDP step with the flight recorder (2000 entries) vs off (0 entries),
//                         interleaved; the note: the same with 400 single-parameter buckets a step
//   fingerprint_check_np2 the bench MLP's DDP step with every collective's fingerprint compared across the
//                         ranks first (TANDEM_DIST_DEBUG=detail) vs without, interleaved; the note: the same
//                         with 400 single-parameter buckets a step
//   zero_adam_state_rss_np2/np4  the 50 M-parameter model under DDP: the resident memory Adam's first step adds
//                         (its state) with ZeroRedundancyOptimizer vs plain Adam, the largest over the ranks
// The three DDP-step variants and the floor run in the same two processes, in interleaved batches
// of 20 steps with a barrier before each. Each peak RSS is a fresh process (group) of its own.
#include "cli.h"
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <memory>
#include <numeric>
#include <nlohmann/json.hpp>

#include "bench_common.h"
#include "tandem.h"
#include "train/models.h"

using namespace tandem;

namespace {

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// A worker's or the peer's JSON result; failures are told on stderr (bench_common.h).
std::optional<nlohmann::json> run_json(const std::string& cmd) { return bench::run_json(cmd, "bench_ddp"); }

// ---- workers (under mpirun; rank 0 prints one JSON line) ----

double max_abs_diff(const TensorList& a, const TensorList& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, max(abs(a[i] - b[i])).item<double>());
  return d;
}

// The bench MLP's step three ways in the same processes: DDP + step(), the same local step
// without DDP (both ranks compute at once and never communicate: the floor the machine itself
// sets), and DDP with the same SGD stepped in backward. All three start from the same
// parameters and see the same batch on both ranks, so they must end with the same parameters.
nlohmann::json ddp_steps(dist::ProcessGroupPtr g, int runs) {
  manual_seed(0);
  MlpBench with_step(64, 784, 512, 10);
  manual_seed(0);
  MlpBench local(64, 784, 512, 10);
  manual_seed(0);
  MlpBench in_bwd(64, 784, 512, 10);
  in_bwd.opt.reset();  // MlpBench's SGD (lr 0.01, momentum 0.9), one per parameter, stepped in backward:
  auto in_bwd_opt = optim::apply_optimizer_in_backward(optim::SGDOptions{.lr = 0.01, .momentum = 0.9},
                                                       in_bwd.model->parameters());  // before DDP wraps it
  dist::DistributedDataParallel ddp(with_step.model, g);
  dist::DistributedDataParallel ddp_in_bwd(in_bwd.model, g);
  auto ddp_step = [&] {
    with_step.opt->zero_grad(true);
    nn::cross_entropy(ddp(with_step.x), with_step.y).backward();
    with_step.opt->step();
  };
  auto local_step = [&] { local.step(); };
  auto in_bwd_step = [&] { nn::cross_entropy(ddp_in_bwd(in_bwd.x), in_bwd.y).backward(); };  // no zero_grad, no step()
  // The floor with communication: the same local step, then as many bytes as DDP's buckets hold
  // through one blocking MPI_Allreduce each (no overlap, no copies into buckets): what MPI itself
  // costs at that point of the step, on these two cores.
  manual_seed(0);
  MlpBench raw(64, 784, 512, 10);
  std::vector<Tensor> raw_buckets;
  for (int64_t bytes : ddp.stats().bucket_bytes) raw_buckets.push_back(zeros({bytes / 4}));
  auto mpi_floor_step = [&] {
    raw.step();
    for (Tensor& t : raw_buckets)
      MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  // Every rank must run the same number of steps: fixed iterations, no time-based loop.
  auto ms = bench::median_seconds_interleaved({ddp_step, local_step, in_bwd_step, mpi_floor_step}, 20, runs, 5,
                                              [&] { g->barrier()->wait(); });
  nlohmann::json out;
  out["ddp_step_ms"] = ms[0] * 1e3;
  out["local_step_ms"] = ms[1] * 1e3;
  out["in_bwd_step_ms"] = ms[2] * 1e3;
  out["mpi_floor_step_ms"] = ms[3] * 1e3;
  out["progress"] = std::string(g->progress_mode());
  out["max_param_diff"] = std::max(max_abs_diff(with_step.model->parameters(), local.model->parameters()),
                                   max_abs_diff(with_step.model->parameters(), in_bwd.model->parameters()));
  if (std::getenv("TANDEM_BENCH_VERBOSE") && g->rank() == 0)
    fmt::print(stderr, "{}{}", ddp.stats().str(), ddp_in_bwd.stats().str());
  return out;
}

// Communication-heavy: 4 x Linear(1024, 1024) (16 MiB of f32 gradients) on 8 rows per rank, DDP
// in f32 and with bf16 mixed precision, interleaved in the same two processes.
nlohmann::json mixed_precision_steps(dist::ProcessGroupPtr g, int runs) {
  auto make = [] {
    manual_seed(2);
    auto m = std::make_shared<nn::Sequential>();
    for (int i = 0; i < 4; ++i) {
      if (i) m->push_back(std::make_shared<nn::ReLU>());
      m->push_back(std::make_shared<nn::Linear>(1024, 1024));
    }
    return m;
  };
  auto f32_model = make(), mp_model = make();
  dist::DistributedDataParallel f32_ddp(f32_model, g);
  dist::DdpOptions o;
  o.mixed_precision = dist::MixedPrecision{.param_dtype = bf16};
  dist::DistributedDataParallel mp_ddp(mp_model, g, o);
  optim::SGD f32_opt(f32_model->parameters(), {.lr = 0.01, .momentum = 0.9});
  optim::SGD mp_opt(mp_model->parameters(), {.lr = 0.01, .momentum = 0.9});
  manual_seed(3 + static_cast<uint64_t>(g->rank()));
  Tensor x = randn({8, 1024}), y = randn({8, 1024});
  std::vector<double> f32_comm, mp_comm;
  auto f32_step = [&] {
    f32_opt.zero_grad();
    nn::mse_loss(f32_ddp(x), y).backward();
    f32_opt.step();
    f32_comm.push_back(f32_ddp.stats().comm_ms);
  };
  auto mp_step = [&] {
    mp_opt.zero_grad();
    nn::mse_loss(mp_ddp(x).to(f32), y).backward();
    mp_opt.step();
    mp_comm.push_back(mp_ddp.stats().comm_ms);
  };
  auto ms = bench::median_seconds_interleaved({f32_step, mp_step}, 10, runs, 3, [&] { g->barrier()->wait(); });
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? NAN : v[v.size() / 2];
  };
  nlohmann::json out;
  out["f32_step_ms"] = ms[0] * 1e3;
  out["mp_step_ms"] = ms[1] * 1e3;
  out["f32_comm_ms"] = median(f32_comm);
  out["mp_comm_ms"] = median(mp_comm);
  return out;
}

// The bench MLP's DDP step with Adam two ways in the same processes: ZeRO (each rank steps its
// partition, then the partitions are broadcast) and the plain optimizer. Both start alike and see
// the same batches, so they must end with the same parameters.
nlohmann::json zero_steps(dist::ProcessGroupPtr g, int runs) {
  const optim::AdamOptions adam{.lr = 1e-3};
  manual_seed(0);
  MlpBench zero_mlp(64, 784, 512, 10);
  manual_seed(0);
  MlpBench plain_mlp(64, 784, 512, 10);
  manual_seed(0);
  MlpBench overlap_mlp(64, 784, 512, 10);
  // overlap_with_ddp: made before its DDP, which takes over its steps.
  dist::ZeroRedundancyOptimizer overlap(overlap_mlp.model->parameters(), adam, g, {.overlap_with_ddp = true});
  dist::DistributedDataParallel zero_ddp(zero_mlp.model, g), plain_ddp(plain_mlp.model, g),
      overlap_ddp(overlap_mlp.model, g);
  dist::ZeroRedundancyOptimizer zero(zero_mlp.model->parameters(), adam, g);
  optim::Adam plain(plain_mlp.model->parameters(), adam);
  auto zero_step = [&] {
    zero.zero_grad();
    nn::cross_entropy(zero_ddp(zero_mlp.x), zero_mlp.y).backward();
    zero.step();
  };
  auto plain_step = [&] {
    plain.zero_grad();
    nn::cross_entropy(plain_ddp(plain_mlp.x), plain_mlp.y).backward();
    plain.step();
  };
  auto overlap_step = [&] {
    overlap.zero_grad();
    nn::cross_entropy(overlap_ddp(overlap_mlp.x), overlap_mlp.y).backward();
    overlap.step();
  };
  auto ms = bench::median_seconds_interleaved({zero_step, plain_step, overlap_step}, 20, runs, 5,
                                              [&] { g->barrier()->wait(); });
  nlohmann::json out;
  out["zero_step_ms"] = ms[0] * 1e3;
  out["adam_step_ms"] = ms[1] * 1e3;
  out["overlap_step_ms"] = ms[2] * 1e3;
  out["max_param_diff"] = std::max(max_abs_diff(zero_mlp.model->parameters(), plain_mlp.model->parameters()),
                                   max_abs_diff(overlap_mlp.model->parameters(), plain_mlp.model->parameters()));
  return out;
}

std::shared_ptr<nn::Sequential> fifty_million();

// The resident memory the first optimizer step adds (Adam's state: two tensors per parameter it
// steps) on the 50 M-parameter model under DDP, ZeRO or plain Adam; the largest over the ranks.
nlohmann::json adam_state_rss(dist::ProcessGroupPtr g, bool zero) {
  manual_seed(2);
  auto model = fifty_million();
  Tensor x = randn({8, 1000});
  dist::DistributedDataParallel ddp(model, g);
  std::unique_ptr<optim::Optimizer> opt;
  dist::ZeroRedundancyOptimizer* z = nullptr;
  if (zero) {
    auto owned = std::make_unique<dist::ZeroRedundancyOptimizer>(model->parameters(), optim::AdamOptions{.lr = 1e-6}, g);
    z = owned.get();
    opt = std::move(owned);
  } else {
    opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 1e-6});
  }
  pow(ddp(x), 2).mean().backward();
  g->barrier()->wait();
  const double before = bench::rss_bytes() / (1 << 20);
  opt->step();
  const double after = bench::rss_bytes() / (1 << 20);
  Tensor added = from_vector<double>({after - before}, {1});
  g->allreduce(added, dist::ReduceOp::max)->wait();
  int64_t state_bytes = 0;
  if (z) {
    state_bytes = z->local_state_bytes();
  } else {
    for (const Tensor& p : model->parameters())
      if (const optim::ParamState* st = opt->state(p))
        for (const auto& [name, t] : st->buffers) state_bytes += static_cast<int64_t>(t.nbytes());
  }
  Tensor most = from_vector<int64_t>({state_bytes}, {1});
  g->allreduce(most, dist::ReduceOp::max)->wait();
  nlohmann::json out;
  out["state_rss_mib"] = added.item<double>();
  out["state_mib"] = static_cast<double>(most.item<int64_t>()) / (1 << 20);
  return out;
}

std::shared_ptr<nn::Sequential> deep_narrow() {
  auto m = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 200; ++i) m->push_back(std::make_shared<nn::Linear>(32, 32));
  return m;
}

double backward_comm_ms(dist::ProcessGroupPtr g, std::optional<double> cap_mb, int runs) {
  manual_seed(1);
  auto model = deep_narrow();
  dist::DdpOptions o;
  o.bucket_cap_mb = cap_mb;
  dist::DistributedDataParallel ddp(model, g, o);
  Tensor x = randn({16, 32});
  std::vector<double> samples;
  for (int r = 0; r < runs + 2; ++r) {
    g->barrier()->wait();
    double total = 0;
    for (int i = 0; i < 10; ++i) {
      model->zero_grad(false);
      Tensor loss = pow(ddp(x), 2).mean();
      double t0 = bench::now_s();
      loss.backward();  // includes the reduction's finalize
      total += bench::now_s() - t0;
    }
    if (r >= 2) samples.push_back(total / 10);  // two warm-up rounds (the first rebuilds buckets)
  }
  std::sort(samples.begin(), samples.end());
  if (std::getenv("TANDEM_BENCH_VERBOSE") && g->rank() == 0) fmt::print(stderr, "{}", ddp.stats().str());
  return samples[samples.size() / 2] * 1e3;
}

// The flight recorder's cost: the same DDP steps on the world group (recording, the default 2000
// entries) and on a copy of it made with TANDEM_FLIGHT_RECORDER_ENTRIES=0 (counters only),
// interleaved in the same processes: the bench MLP (a few buckets a step) and the 200-layer model
// with a bucket per parameter (400 collectives a step), where a per-operation cost would show.
nlohmann::json paired_steps(dist::ProcessGroupPtr on, dist::ProcessGroupPtr off, int runs);

nlohmann::json flight_steps(dist::ProcessGroupPtr g, int runs) {
  std::vector<int> all(static_cast<size_t>(g->size()));
  std::iota(all.begin(), all.end(), 0);
  setenv("TANDEM_FLIGHT_RECORDER_ENTRIES", "0", 1);
  dist::ProcessGroupPtr off = g->new_group(all);
  unsetenv("TANDEM_FLIGHT_RECORDER_ENTRIES");
  return paired_steps(g, off, runs);
}

// The debug fingerprints' cost (every collective preceded by an exchange of what each rank
// called): the same steps on a copy of the world group with the checks on, vs the world group.
nlohmann::json fingerprint_steps(dist::ProcessGroupPtr g, int runs) {
  std::vector<int> all(static_cast<size_t>(g->size()));
  std::iota(all.begin(), all.end(), 0);
  dist::ProcessGroupPtr checked = g->new_group(all);
  checked->set_debug_checks(true);
  return paired_steps(checked, g, runs);
}

// The bench MLP's DDP step and the 400-bucket step on group `on` and on group `off`, interleaved.
nlohmann::json paired_steps(dist::ProcessGroupPtr on, dist::ProcessGroupPtr off, int runs) {
  dist::ProcessGroupPtr g = on;
  manual_seed(0);
  MlpBench on_mlp(64, 784, 512, 10);
  manual_seed(0);
  MlpBench off_mlp(64, 784, 512, 10);
  dist::DistributedDataParallel on_ddp(on_mlp.model, g), off_ddp(off_mlp.model, off);
  auto mlp_step = [](MlpBench& m, dist::DistributedDataParallel& ddp) {
    return [&] {
      m.opt->zero_grad(true);
      nn::cross_entropy(ddp(m.x), m.y).backward();
      m.opt->step();
    };
  };
  manual_seed(1);
  auto on_deep = deep_narrow();
  manual_seed(1);
  auto off_deep = deep_narrow();
  dist::DdpOptions per_param;
  per_param.bucket_cap_mb = 1e-9;
  dist::DistributedDataParallel on_deep_ddp(on_deep, g, per_param), off_deep_ddp(off_deep, off, per_param);
  Tensor x = randn({16, 32});
  auto deep_step = [&x](std::shared_ptr<nn::Sequential>& m, dist::DistributedDataParallel& ddp) {
    return [&] {
      m->zero_grad(false);
      pow(ddp(x), 2).mean().backward();
    };
  };
  auto ms = bench::median_seconds_interleaved(
      {mlp_step(on_mlp, on_ddp), mlp_step(off_mlp, off_ddp), deep_step(on_deep, on_deep_ddp),
       deep_step(off_deep, off_deep_ddp)},
      20, runs, 5, [&] { g->barrier()->wait(); });
  nlohmann::json out;
  out["mlp_on_ms"] = ms[0] * 1e3;
  out["mlp_off_ms"] = ms[1] * 1e3;
  out["deep_on_ms"] = ms[2] * 1e3;
  out["deep_off_ms"] = ms[3] * 1e3;
  return out;
}

std::shared_ptr<nn::Sequential> fifty_million() {
  auto m = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 50; ++i) m->push_back(std::make_shared<nn::Linear>(1000, 1000));  // 50.05 M parameters
  return m;
}

enum class RssMode {
  single,       // no DDP, zero_grad(set_to_none=false)
  bucket_view,  // DDP with gradient_as_bucket_view, zero_grad(set_to_none=false) (keeps the views)
  step,         // DDP (default options) + step(), zero_grad(set_to_none=true)
  in_backward,  // DDP (default options), the same SGD stepped in backward: .grad is none after each step
};

// Peak RSS of this process over three steps of the 50 M-parameter model; one mode per process,
// since the peak never goes down.
double big_model_peak_rss(dist::ProcessGroupPtr g, RssMode mode, double momentum) {
  manual_seed(2);
  auto model = fifty_million();
  Tensor x = randn({8, 1000});
  const optim::SGDOptions sgd{.lr = 1e-6, .momentum = momentum};
  std::unique_ptr<optim::SGD> opt;
  std::shared_ptr<optim::InBackwardOptimizers> in_bwd;
  if (mode == RssMode::in_backward)
    in_bwd = optim::apply_optimizer_in_backward(sgd, model->parameters());  // before DDP wraps the model
  else
    opt = std::make_unique<optim::SGD>(model->parameters(), sgd);
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (mode != RssMode::single)
    ddp = std::make_unique<dist::DistributedDataParallel>(
        model, g, dist::DdpOptions{.gradient_as_bucket_view = mode == RssMode::bucket_view});
  for (int i = 0; i < 3; ++i) {
    // set_to_none=false keeps .grad (and so the bucket views) between steps
    if (opt) opt->zero_grad(/*set_to_none=*/mode == RssMode::step);
    Tensor out = ddp ? (*ddp)(x) : (*model)(x);
    pow(out, 2).mean().backward();
    if (opt) opt->step();
  }
  return peak_rss_mib();
}

int worker(const std::string& what, int runs, double momentum) {
  set_num_threads(1);
  nlohmann::json out;
  if (what == "rss_single") {
    out["peak_rss_mib"] = big_model_peak_rss(nullptr, RssMode::single, momentum);
    fmt::print("{}\n", out.dump());
    return 0;
  }
  dist::ProcessGroupPtr g = dist::init({.backend = "mpi"});
  if (what == "ddp_step") {
    out = ddp_steps(g, runs);
  } else if (what == "mixed_precision") {
    out = mixed_precision_steps(g, runs);
  } else if (what == "bucketing") {
    out["bucketed_ms"] = backward_comm_ms(g, std::nullopt, runs);
    out["per_param_ms"] = backward_comm_ms(g, 1e-9, runs);
  } else if (what == "zero_step") {
    out = zero_steps(g, runs);
  } else if (what == "flight") {
    out = flight_steps(g, runs);
  } else if (what == "fingerprint") {
    out = fingerprint_steps(g, runs);
  } else if (what == "zero_rss" || what == "adam_rss") {
    out = adam_state_rss(g, what == "zero_rss");
  } else if (what == "rss_ddp") {
    out["peak_rss_mib"] = big_model_peak_rss(g, RssMode::bucket_view, momentum);
  } else if (what == "rss_step") {
    out["peak_rss_mib"] = big_model_peak_rss(g, RssMode::step, momentum);
  } else if (what == "rss_in_bwd") {
    out["peak_rss_mib"] = big_model_peak_rss(g, RssMode::in_backward, momentum);
  } else {
    fmt::print(stderr, "bench_ddp: unknown worker '{}'\n", what);
    return 2;
  }
  if (g->rank() == 0) fmt::print("{}\n", out.dump());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tandem DDP benchmarks beside our single-process step and PyTorch DDP", "bench_ddp"};
  bool json = false, no_peer = false, quick = false;
  int runs = 7;
  double momentum = 0;
  std::string worker_task;
  app.add_flag("--json", json, "one JSON object per row");
  app.add_option("--runs", runs, "samples per row (the median is reported)")->check(CLI::Range(1, 1000000));
  app.add_flag("--no-peer", no_peer, "do not run the PyTorch peer");
  app.add_flag("--quick", quick, "skip the 50 M-parameter RSS rows");
  app.add_option("--worker", worker_task, "internal: run one measurement under mpirun");
  app.add_option("--momentum", momentum, "internal: SGD momentum of a peak-RSS worker");
  std::string peer_flag;
  app.add_option("--peer-python", peer_flag,
                 "the Python with torch that runs the peer (default: $TANDEM_PEER_PYTHON, else /usr/bin/python3)");
  TANDEM_TOOL_PARSE(app, argc, argv);

  try {
    if (!worker_task.empty()) return worker(worker_task, runs, momentum);
    set_num_threads(1);
    const std::string self = bench::self_exe("bench_ddp");
    std::vector<bench::Row> rows;

    manual_seed(0);
    MlpBench single(64, 784, 512, 10);
    double single_ms = bench::median_seconds([&] { single.step(); }, 20, runs, 5) * 1e3;
    auto ddp = run_json(fmt::format("{} {} --worker ddp_step --runs {} 2>&1", bench::mpirun_prefix(2), self, runs));
    auto figure = [](const std::optional<nlohmann::json>& j, const char* key) {
      return j ? (*j)[key].get<double>() : NAN;
    };
    double ddp_ms = figure(ddp, "ddp_step_ms"), local_ms = figure(ddp, "local_step_ms"),
           in_bwd_ms = figure(ddp, "in_bwd_step_ms");
    if (ddp && (*ddp)["max_param_diff"].get<double>() != 0)
      fmt::print(stderr, "bench_ddp: the DDP, local and in-backward MLPs ended {} apart (expected equal)\n",
                 (*ddp)["max_param_diff"].get<double>());
    rows.push_back({"ddp_step_np2", ddp_ms, single_ms, "ms", "ratio <= 1.2", "peer: our single-process step"});
    rows.push_back({"ddp_floor_np2", local_ms, single_ms, "ms", "report",
                    fmt::format("2 processes' local steps at once (no comm) vs 1 alone; DDP's own cost "
                                "ddp_step / floor = {:.3f} (goal <= 1.15)",
                                ddp_ms / local_ms)});
    const double mpi_floor_ms = figure(ddp, "mpi_floor_step_ms");
    rows.push_back({"ddp_mpi_floor_np2", ddp_ms, mpi_floor_ms, "ms", "report",
                    fmt::format("DDP step vs the same local step then a blocking MPI_Allreduce per bucket's bytes "
                                "(MPI's own cost there: {:.3f} x the floor); progress mode {}",
                                mpi_floor_ms / local_ms,
                                ddp ? (*ddp)["progress"].get<std::string>() : std::string("?"))});

    std::optional<nlohmann::json> torch;
    if (!no_peer)
      torch = run_json(fmt::format("{} {}/bench_ddp_peer.py {} 2>&1", bench::peer_python(peer_flag), TANDEM_BENCH_DIR,
                                   runs));
    std::optional<double> torch_ms;
    if (torch) torch_ms = (*torch)["ddp_step_ms"].get<double>();
    rows.push_back({"ddp_vs_torch_np2", ddp_ms, torch_ms, "ms", "ratio <= 0.4",
                    torch ? fmt::format("PyTorch {} DDP gloo; its single process {:.2f} ms",
                                        (*torch)["version"].get<std::string>(), (*torch)["single_step_ms"].get<double>())
                          : "PyTorch peer not available"});

    rows.push_back({"optim_in_bwd_np2", in_bwd_ms, ddp_ms, "ms", "ratio <= 1.0",
                    "DDP + SGD (momentum 0.9) in backward vs DDP + step()"});

    auto mp = run_json(fmt::format("{} {} --worker mixed_precision --runs {} 2>&1", bench::mpirun_prefix(2), self, runs));
    if (mp) {
      rows.push_back({"mp_bf16_comm_np2", figure(mp, "mp_comm_ms"), figure(mp, "f32_comm_ms"), "ms", "ratio <= 0.6",
                      "4x Linear(1024,1024), 8 rows/rank: the reducer's comm time per step, bf16 mixed precision vs "
                      "f32 DDP"});
      rows.push_back({"mp_bf16_step_np2", figure(mp, "mp_step_ms"), figure(mp, "f32_step_ms"), "ms", "ratio <= 0.7",
                      "the same model, whole step (forward, backward, step), bf16 mixed precision vs f32 DDP"});
    }
    auto bucketing = run_json(fmt::format("{} {} --worker bucketing --runs {} 2>&1", bench::mpirun_prefix(2), self, runs));
    if (bucketing) {
      double bucketed = (*bucketing)["bucketed_ms"].get<double>(), per_param = (*bucketing)["per_param_ms"].get<double>();
      rows.push_back({"bucketing_gain", per_param / bucketed, std::nullopt, "x", ">= 5x",
                      fmt::format("200x Linear(32,32): {:.2f} ms per parameter vs {:.2f} ms bucketed", per_param, bucketed)});
    }
    auto zero = run_json(fmt::format("{} {} --worker zero_step --runs {} 2>&1", bench::mpirun_prefix(2), self, runs));
    if (zero) {
      rows.push_back({"zero_step_np2", figure(zero, "zero_step_ms"), figure(zero, "adam_step_ms"), "ms", "ratio <= 1.1",
                      fmt::format("the bench MLP, DDP + ZeroRedundancyOptimizer(Adam) vs DDP + Adam (parameters {} "
                                  "apart at the end)",
                                  figure(zero, "max_param_diff"))});
      rows.push_back({"zero_overlap_step_np2", figure(zero, "overlap_step_ms"), figure(zero, "adam_step_ms"), "ms",
                      "ratio <= 1.1",
                      "the same with overlap_with_ddp (each partition stepped in backward as its bucket is reduced) "
                      "vs DDP + Adam"});
    }
    // A setting's cost, on and off in the same processes (paired_steps): the bench MLP's step, and
    // in the note the 400-bucket step where a per-collective cost would show.
    auto paired_row = [&](const char* worker, const char* name, const char* goal, const char* what) {
      auto got = run_json(fmt::format("{} {} --worker {} --runs {} 2>&1", bench::mpirun_prefix(2), self, worker, runs));
      if (!got) return;
      const double deep_on = figure(got, "deep_on_ms"), deep_off = figure(got, "deep_off_ms");
      rows.push_back({name, figure(got, "mlp_on_ms"), figure(got, "mlp_off_ms"), "ms", goal,
                      fmt::format("the bench MLP's DDP step {}; 400 buckets a step: {:.3f} vs {:.3f} ms = {:.3f}", what,
                                  deep_on, deep_off, deep_on / deep_off)});
    };
    paired_row("fingerprint", "fingerprint_check_np2", "ratio <= 1.02 (the default then)",
               "with every collective's fingerprint compared first (TANDEM_DIST_DEBUG=detail) vs without");
    paired_row("flight", "flight_recorder_np2", "ratio <= 1.05",
               "recording (2000 entries) vs the recorder off");
    if (!quick) {
      for (int np : {2, 4}) {
        auto worker_at = [&](const char* what) {
          return run_json(fmt::format("{} {} --worker {} 2>&1", bench::mpirun_prefix(np), self, what));
        };
        auto zero_rss = worker_at("zero_rss"), adam_rss = worker_at("adam_rss");
        if (zero_rss && adam_rss)
          rows.push_back({fmt::format("zero_adam_state_rss_np{}", np), figure(zero_rss, "state_rss_mib"),
                          figure(adam_rss, "state_rss_mib"), "MiB", np == 2 ? "ratio <= 0.55" : "ratio <= 0.3",
                          fmt::format("50 M params under DDP: resident memory Adam's first step adds, ZeRO vs plain, "
                                      "the most on any rank (state tensors {:.0f} vs {:.0f} MiB)",
                                      figure(zero_rss, "state_mib"), figure(adam_rss, "state_mib"))});
      }
      auto single_rss = run_json(fmt::format("{} --worker rss_single 2>&1", self));
      auto ddp_rss = run_json(fmt::format("{} {} --worker rss_ddp 2>&1", bench::mpirun_prefix(2), self));
      if (single_rss && ddp_rss) {
        double s = (*single_rss)["peak_rss_mib"].get<double>(), d = (*ddp_rss)["peak_rss_mib"].get<double>();
        rows.push_back({"bucket_view_rss", d / s, std::nullopt, "x", "<= 1.1",
                        fmt::format("50 M params: {:.0f} MiB with DDP (bucket views) vs {:.0f} MiB single", d, s)});
      }
      // The same model under DDP (default options), SGD with momentum both ways, each in its own
      // processes; plain SGD (no optimizer state) beside it in the note.
      auto rss = [&](const char* what, double m) {
        return run_json(fmt::format("{} {} --worker {} --momentum {} 2>&1", bench::mpirun_prefix(2), self, what, m));
      };
      auto in_bwd_rss = rss("rss_in_bwd", 0.9), step_rss = rss("rss_step", 0.9);
      auto in_bwd_plain = rss("rss_in_bwd", 0), step_plain = rss("rss_step", 0);
      if (in_bwd_rss && step_rss) {
        const double plain_in_bwd = figure(in_bwd_plain, "peak_rss_mib");
        const double plain_step = figure(step_plain, "peak_rss_mib");
        rows.push_back({"optim_in_bwd_peak_rss", figure(in_bwd_rss, "peak_rss_mib"), figure(step_rss, "peak_rss_mib"),
                        "MiB", "ratio <= 0.8",
                        fmt::format("50 M params, DDP, SGD momentum 0.9 in backward vs step() (set_to_none); "
                                    "plain SGD: {:.0f} / {:.0f} MiB = {:.3f}",
                                    plain_in_bwd, plain_step, plain_in_bwd / plain_step)});
      }
    }
    bench::print_rows(rows, json);
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "bench_ddp: {}\n", e.what());
    return 2;
  }
}
