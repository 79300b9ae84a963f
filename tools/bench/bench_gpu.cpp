// bench_gpu: Tandem's CUDA figures beside PyTorch-CUDA's, measured in the same run.
//
//   bench_gpu [--json] [--json-out FILE] [--runs N] [--no-peer] [--quick] [--peer-script PATH]
//   bench_gpu --check     (says whether a usable CUDA device is here: exit 0 if so, else 1)
//
// Rows (the goals are issue 3's): copy_bw (256 MiB device-to-device copy_, GB/s counting bytes
// read plus written: the ceiling), add_bw (256 MiB f32 a + b), cast_bw (256 MiB f32 -> bf16),
// softmax_bw_* and layernorm_bw_* (8192x8192 rows, f32 and bf16), gemm_bf16_8192 and
// gemm_f32_4096 (TFLOP/s; f32 without TF32, as PyTorch's default), mlp_step_gpu
// (tools/train/models.h's MLP, 784-4096-4096-10 at batch 4096, cross-entropy, one SGD momentum
// step, ms), sdpa_fwd_bwd_f32 and sdpa_fwd_bwd_bf16 (scaled_dot_product_attention's forward and
// backward, B 8, H 4, T 512, D 64, causal, the upstream gradient given, ms; the peer is PyTorch
// 2.x's fused torch.nn.functional.scaled_dot_product_attention, whichever backend it picks).
// Each row is timed with CUDA events on the current stream: warm-up first, then the
// median of --runs samples of the mean over several calls. The peer (tools/bench/bench_gpu_peer.py,
// python3 with torch) runs first, in its own process, so both see an idle GPU. A row whose op
// fails says why in its note.
// Without a usable GPU it says so and exits 1.
#include "cli.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "bench_common.h"
#include "tandem.h"
#include "train/models.h"

#ifdef TANDEM_WITH_CUDA
#include "cuda/runtime.h"
#endif

using namespace tandem;

#ifdef TANDEM_WITH_CUDA
namespace {

const Device kGPU = Device::cuda(0);

// Median over `runs` samples of the mean milliseconds of `iters` calls, timed with events.
double median_ms(const std::function<void()>& fn, int iters, int runs, int warmup) {
  cudaStream_t s = cuda::current_stream(0);
  for (int i = 0; i < warmup; ++i) fn();
  cuda::synchronize(0);
  std::vector<double> samples;
  for (int r = 0; r < runs; ++r) {
    cuda::Event start(true), stop(true);
    start.record(s);
    for (int i = 0; i < iters; ++i) fn();
    stop.record(s);
    stop.synchronize();
    samples.push_back(start.elapsed_ms(stop) / iters);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

double gbps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

Tensor gpu_randn(const Shape& shape, Dtype dtype) { return randn(shape).to(dtype).to(kGPU); }

std::filesystem::path default_peer_script() {
#ifdef TANDEM_BENCH_DIR
  return std::filesystem::path(TANDEM_BENCH_DIR) / "bench_gpu_peer.py";
#else
  return std::filesystem::path(__FILE__).parent_path() / "bench_gpu_peer.py";
#endif
}

// The PyTorch-CUDA peer's rows; nullopt (silently: its own stderr says why) where it cannot run.
// The peer's Python: --peer-python, else $TANDEM_PEER_PYTHON, else the first python3 on PATH (on
// the GPU machine, the one with PyTorch-CUDA; Debian's 1.13 has no CUDA).
std::optional<nlohmann::json> run_peer(const std::string& python, const std::string& script, int runs, bool quick) {
  const char* env = std::getenv("TANDEM_PEER_PYTHON");
  const std::string py = !python.empty() ? python : env && *env ? env : "python3";
  return bench::run_json(fmt::format("{} {} {}{}", py, script, runs, quick ? " --quick" : ""));
}

}  // namespace
#endif

int main(int argc, char** argv) {
  CLI::App app{"Tandem CUDA benchmarks beside PyTorch-CUDA", "bench_gpu"};
  bool json = false, no_peer = false, quick = false, check = false;
  int runs = 7;
  std::string peer_script, json_out;
  app.add_flag("--json", json, "one JSON object per row");
  app.add_option("--json-out", json_out, "also write the rows as JSON lines to this file");
  app.add_flag("--check", check, "only report whether a usable CUDA device is present");
  app.add_option("--runs", runs, "samples per row (the median is reported)")->check(CLI::Range(1, 1000000));
  app.add_flag("--no-peer", no_peer, "do not run the PyTorch peer");
  app.add_flag("--quick", quick, "fewer calls per sample");
  app.add_option("--peer-script", peer_script, "path of bench_gpu_peer.py");
  std::string peer_python;
  app.add_option("--peer-python", peer_python,
                 "the Python with PyTorch-CUDA that runs the peer (default: $TANDEM_PEER_PYTHON, else python3)");
  TANDEM_TOOL_PARSE(app, argc, argv);

#ifndef TANDEM_WITH_CUDA
  fmt::print(stderr, "bench_gpu: tandem was built without CUDA; nothing to measure\n");
  return 1;
#else
  if (!cuda::is_available()) {
    fmt::print(stderr, "bench_gpu: no usable CUDA device ({})\n", cuda::unavailable_reason());
    return 1;
  }
  if (check) {
    for (int d = 0; d < cuda::device_count(); ++d) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, d) == cudaSuccess)
        fmt::print("cuda:{}: {} (sm_{}{}, {} SMs, {:.1f} GiB)\n", d, prop.name, prop.major, prop.minor,
                   prop.multiProcessorCount, double(prop.totalGlobalMem) / double(1 << 30));
    }
    return 0;
  }
  if (runs < 1) runs = 1;
  std::optional<nlohmann::json> peer;
  if (!no_peer)
    peer = run_peer(peer_python, peer_script.empty() ? default_peer_script().string() : peer_script, runs, quick);
  auto peer_value = [&](const std::string& key) -> std::optional<double> {
    if (peer && peer->contains(key) && (*peer)[key].is_number()) return (*peer)[key].get<double>();
    return std::nullopt;
  };

  manual_seed(0);
  const int bw_iters = quick ? 3 : 10;
  std::vector<bench::Row> rows;
  // One row: `measure` gives our figure; an op that throws leaves NaN and says why.
  auto row = [&](const std::string& name, const std::string& unit, const std::string& goal, const std::string& note,
                 const std::function<double()>& measure) {
    bench::Row r{name, NAN, peer_value(name), unit, goal, note};
    try {
      r.ours = measure();
    } catch (const std::exception& e) {
      std::string what = e.what();
      r.note = "FAILED: " + what.substr(0, 160);
    }
    rows.push_back(r);
    return r.ours;
  };

  const int64_t n256 = int64_t{64} << 20;  // f32 elements in 256 MiB
  const double b256 = double(n256) * 4;
  double copy = row("copy_bw", "GB/s", "the ceiling", "256 MiB D2D copy_, read+write", [&] {
    Tensor a = gpu_randn({n256}, f32);
    Tensor b = empty({n256}, TensorOptions(f32, kGPU));
    return gbps(2 * b256, median_ms([&] { b.copy_(a); }, bw_iters, runs, 2));
  });
  auto vs_copy = [&](double ours) {
    return std::isnan(ours) || std::isnan(copy) ? std::string() : fmt::format("{:.2f} x copy_bw", ours / copy);
  };
  {
    double v = row("add_bw", "GB/s", ">= 0.8 copy", "", [&] {
      Tensor a = gpu_randn({n256}, f32), b = gpu_randn({n256}, f32);
      return gbps(3 * b256, median_ms([&] { (void)(a + b); }, bw_iters, runs, 2));
    });
    rows.back().note = "256 MiB f32 a+b; " + (rows.back().note.empty() ? vs_copy(v) : rows.back().note);
  }
  {
    double v = row("cast_bw", "GB/s", ">= 0.8 copy", "", [&] {
      Tensor a = gpu_randn({n256}, f32);
      return gbps(b256 * 1.5, median_ms([&] { (void)a.to(bf16); }, bw_iters, runs, 2));
    });
    rows.back().note = "256 MiB f32->bf16; " + (rows.back().note.empty() ? vs_copy(v) : rows.back().note);
  }
  const int64_t rowsz = 8192;
  for (Dtype d : {f32, bf16}) {
    const double bytes = 2.0 * rowsz * rowsz * double(itemsize(d));
    const std::string tag = d == f32 ? "f32" : "bf16";
    double v = row("softmax_bw_" + tag, "GB/s", ">= 0.7 copy", "", [&] {
      Tensor x = gpu_randn({rowsz, rowsz}, d);
      return gbps(bytes, median_ms([&] { (void)softmax(x, -1); }, bw_iters, runs, 2));
    });
    rows.back().note = "8192x8192 " + tag + "; " + (rows.back().note.empty() ? vs_copy(v) : rows.back().note);
    v = row("layernorm_bw_" + tag, "GB/s", ">= 0.7 copy", "", [&] {
      Tensor x = gpu_randn({rowsz, rowsz}, d);
      Tensor w = gpu_randn({rowsz}, d), b = gpu_randn({rowsz}, d);
      return gbps(bytes, median_ms([&] { (void)layer_norm(x, {rowsz}, w, b); }, bw_iters, runs, 2));
    });
    rows.back().note = "8192x8192 " + tag + "; " + (rows.back().note.empty() ? vs_copy(v) : rows.back().note);
  }
  row("gemm_bf16_8192", "TFLOP/s", "ratio >= 0.95", "8192^3 bf16, f32 accumulate", [&] {
    const int64_t n = 8192;
    Tensor a = gpu_randn({n, n}, bf16), b = gpu_randn({n, n}, bf16);
    return 2.0 * n * n * n / (median_ms([&] { (void)matmul(a, b); }, quick ? 3 : 10, runs, 3) * 1e-3) / 1e12;
  });
  row("gemm_f32_4096", "TFLOP/s", "ratio >= 0.95", "4096^3 f32, TF32 off", [&] {
    const int64_t n = 4096;
    cuda::set_allow_tf32(false);
    Tensor a = gpu_randn({n, n}, f32), b = gpu_randn({n, n}, f32);
    return 2.0 * n * n * n / (median_ms([&] { (void)matmul(a, b); }, quick ? 3 : 10, runs, 3) * 1e-3) / 1e12;
  });
  row("mlp_step_gpu", "ms", "ratio <= 1.0", "784-4096-4096-10, batch 4096, SGD m=0.9", [&] {
    auto model = make_mlp(784, 4096, 10);
    model->to(kGPU);
    optim::SGD opt(model->parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
    Tensor x = randn({4096, 784}).to(kGPU);
    Tensor y = randint(0, 10, {4096}).to(kGPU);
    auto step = [&] {
      opt.zero_grad(true);
      Tensor loss = nn::cross_entropy((*model)(x), y);
      loss.backward();
      opt.step();
    };
    return median_ms(step, quick ? 3 : 10, runs, 3);
  });

  // The fused attention's forward and backward (tests/cuda/test_cuda_attention checks it against
  // the CPU's): q, k, v [8, 4, 512, 64] of the dtype, causal, the upstream gradient dout given to
  // backward as PyTorch's peer does (out.backward(dout)), the three gradients cleared before each call.
  for (Dtype d : {f32, bf16}) {
    const std::string tag = d == f32 ? "f32" : "bf16";
    row("sdpa_fwd_bwd_" + tag, "ms", "report", "B 8, H 4, T 512, D 64, causal, " + tag + "; peer: torch SDPA", [&] {
      const Shape shape{8, 4, 512, 64};
      Tensor q = gpu_randn(shape, d).requires_grad_(), k = gpu_randn(shape, d).requires_grad_();
      Tensor v = gpu_randn(shape, d).requires_grad_(), dout = gpu_randn(shape, d);
      auto step = [&] {
        for (const Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
        scaled_dot_product_attention(q, k, v, Tensor(), 0.0, /*is_causal=*/true).backward(dout);
      };
      return median_ms(step, quick ? 3 : 10, runs, 3);
    });
  }

  if (!no_peer && !peer) fmt::print(stderr, "note: PyTorch-CUDA peer not available (python3 with torch and CUDA)\n");
  bench::print_rows(rows, json);
  if (!json_out.empty()) {
    // print_rows writes to stdout; the JSON lines are rebuilt here the same way for the file.
    if (FILE* f = std::fopen(json_out.c_str(), "w")) {
      for (const auto& r : rows) {
        std::string peer_s = r.peer ? fmt::format("{:.6g}", *r.peer) : "null";
        std::string ratio = r.peer ? fmt::format("{:.4g}", r.ratio()) : "null";
        std::string ours = std::isnan(r.ours) ? "null" : fmt::format("{:.6g}", r.ours);
        fmt::print(f, "{{\"name\": \"{}\", \"ours\": {}, \"peer\": {}, \"unit\": \"{}\", \"ratio\": {}}}\n", r.name,
                   ours, peer_s, r.unit, ratio);
      }
      std::fclose(f);
    }
  }
  bool failed = false;
  for (const auto& r : rows) failed |= std::isnan(r.ours);
  return failed ? 2 : 0;
#endif
}
