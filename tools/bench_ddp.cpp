// bench_ddp: DDP's cost, beside our own single-process step and PyTorch DDP over gloo.
//
//   bench_ddp [--json] [--runs N] [--no-peer] [--quick]
//
// Run it plainly (not under mpirun): it measures the single-process figures itself and launches
// `mpirun -np 2 bench_ddp --worker ...` for the DDP ones (one thread per rank), and the PyTorch
// peer (tools/bench_ddp_peer.py, two gloo processes) in the same run. Rows:
//   ddp_step_np2      the bench_cpu MLP (64x784-512-512-10 per rank), one DDP step, vs our single-process step
//   ddp_vs_torch_np2  the same DDP step vs PyTorch DDP (gloo, 2 ranks, same per-rank batch)
//   bucketing_gain    200 Linear(32, 32) layers: backward+comm time with one bucket per parameter / bucketed
//   bucket_view_rss   peak RSS of a 50 M-parameter model, DDP with gradient_as_bucket_view / single process
#include <CLI/CLI.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench_common.h"
#include "mlp.h"
#include "tandem.h"

using namespace tandem;

namespace {

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// A worker's or the peer's JSON result; failures are told on stderr (bench_common.h).
std::optional<nlohmann::json> run_json(const std::string& cmd) { return bench::run_json(cmd, "bench_ddp"); }

std::string self_exe() {
  std::array<char, 4096> buf{};
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : "bench_ddp";
}

std::string mpirun_prefix(int np) {
  std::string flags;
  if (geteuid() == 0) flags += " --allow-run-as-root";
  if (np > static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))) flags += " --oversubscribe";
  return fmt::format("mpirun -np {}{} -x TANDEM_NUM_THREADS=1", np, flags);
}

// ---- workers (under mpirun; rank 0 prints one JSON line) ----

double ddp_step_ms(dist::ProcessGroupPtr g, int runs) {
  manual_seed(0);
  MlpBench mlp(64, 784, 512, 10);
  dist::DistributedDataParallel ddp(mlp.model, g);
  auto step = [&] {
    mlp.opt->zero_grad(true);
    nn::cross_entropy(ddp(mlp.x), mlp.y).backward();
    mlp.opt->step();
  };
  // Every rank must run the same number of steps: fixed iterations, no time-based loop.
  for (int i = 0; i < 5; ++i) step();
  std::vector<double> samples;
  for (int r = 0; r < runs; ++r) {
    g->barrier()->wait();
    double t0 = bench::now_s();
    for (int i = 0; i < 20; ++i) step();
    samples.push_back((bench::now_s() - t0) / 20);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2] * 1e3;
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

std::shared_ptr<nn::Sequential> fifty_million() {
  auto m = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 50; ++i) m->push_back(std::make_shared<nn::Linear>(1000, 1000));  // 50.05 M parameters
  return m;
}

double big_model_peak_rss(dist::ProcessGroupPtr g) {
  manual_seed(2);
  auto model = fifty_million();
  optim::SGD opt(model->parameters(), {.lr = 1e-6});
  Tensor x = randn({8, 1000});
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (g) ddp = std::make_unique<dist::DistributedDataParallel>(model, g, dist::DdpOptions{.gradient_as_bucket_view = true});
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad(/*set_to_none=*/false);  // keep .grad (and so the bucket views) between steps
    Tensor out = ddp ? (*ddp)(x) : (*model)(x);
    pow(out, 2).mean().backward();
    opt.step();
  }
  return peak_rss_mib();
}

int worker(const std::string& what, int runs) {
  set_num_threads(1);
  nlohmann::json out;
  if (what == "rss_single") {
    out["peak_rss_mib"] = big_model_peak_rss(nullptr);
    fmt::print("{}\n", out.dump());
    return 0;
  }
  dist::ProcessGroupPtr g = dist::init({.backend = "mpi"});
  if (what == "ddp_step") {
    out["ddp_step_ms"] = ddp_step_ms(g, runs);
  } else if (what == "bucketing") {
    out["bucketed_ms"] = backward_comm_ms(g, std::nullopt, runs);
    out["per_param_ms"] = backward_comm_ms(g, 1e-9, runs);
  } else if (what == "rss_ddp") {
    out["peak_rss_mib"] = big_model_peak_rss(g);
  } else {
    fmt::print(stderr, "bench_ddp: unknown worker '{}'\n", what);
    return 2;
  }
  if (g->rank() == 0) fmt::print("{}\n", out.dump());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tandem DDP benchmarks beside our single-process step and PyTorch DDP"};
  bool json = false, no_peer = false, quick = false;
  int runs = 7;
  std::string worker_task;
  app.add_flag("--json", json, "one JSON object per row");
  app.add_option("--runs", runs, "samples per row (the median is reported)");
  app.add_flag("--no-peer", no_peer, "do not run the PyTorch peer");
  app.add_flag("--quick", quick, "skip the 50 M-parameter RSS row");
  app.add_option("--worker", worker_task, "internal: run one measurement under mpirun");
  CLI11_PARSE(app, argc, argv);

  try {
    if (!worker_task.empty()) return worker(worker_task, runs);
    set_num_threads(1);
    const std::string self = self_exe();
    std::vector<bench::Row> rows;

    manual_seed(0);
    MlpBench single(64, 784, 512, 10);
    double single_ms = bench::median_seconds([&] { single.step(); }, 20, runs, 5) * 1e3;
    auto ddp = run_json(fmt::format("{} {} --worker ddp_step --runs {} 2>&1", mpirun_prefix(2), self, runs));
    double ddp_ms = ddp ? (*ddp)["ddp_step_ms"].get<double>() : NAN;
    rows.push_back({"ddp_step_np2", ddp_ms, single_ms, "ms", "ratio <= 1.3", "peer: our single-process step"});

    std::optional<nlohmann::json> torch;
    if (!no_peer)
      torch = run_json(fmt::format("/usr/bin/python3 {}/bench_ddp_peer.py {} 2>&1", TANDEM_TOOLS_DIR, runs));
    std::optional<double> torch_ms;
    if (torch) torch_ms = (*torch)["ddp_step_ms"].get<double>();
    rows.push_back({"ddp_vs_torch_np2", ddp_ms, torch_ms, "ms", "ratio <= 0.5",
                    torch ? fmt::format("PyTorch {} DDP gloo; its single process {:.2f} ms",
                                        (*torch)["version"].get<std::string>(), (*torch)["single_step_ms"].get<double>())
                          : "PyTorch peer not available"});

    auto bucketing = run_json(fmt::format("{} {} --worker bucketing --runs {} 2>&1", mpirun_prefix(2), self, runs));
    if (bucketing) {
      double bucketed = (*bucketing)["bucketed_ms"].get<double>(), per_param = (*bucketing)["per_param_ms"].get<double>();
      rows.push_back({"bucketing_gain", per_param / bucketed, std::nullopt, "x", ">= 5x",
                      fmt::format("200x Linear(32,32): {:.2f} ms per parameter vs {:.2f} ms bucketed", per_param, bucketed)});
    }
    if (!quick) {
      auto single_rss = run_json(fmt::format("{} --worker rss_single 2>&1", self));
      auto ddp_rss = run_json(fmt::format("{} {} --worker rss_ddp 2>&1", mpirun_prefix(2), self));
      if (single_rss && ddp_rss) {
        double s = (*single_rss)["peak_rss_mib"].get<double>(), d = (*ddp_rss)["peak_rss_mib"].get<double>();
        rows.push_back({"bucket_view_rss", d / s, std::nullopt, "x", "<= 1.1",
                        fmt::format("50 M params: {:.0f} MiB with DDP (bucket views) vs {:.0f} MiB single", d, s)});
      }
    }
    bench::print_rows(rows, json);
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "bench_ddp: {}\n", e.what());
    return 2;
  }
}
