// bench_allreduce: an nccl-tests-style sweep of dist allreduce (sum, in place) from 8 B to 64 MiB,
// with raw MPI_Allreduce on the same buffers in the same run as the peer.
//
//   mpirun -np 2 build/tools/bench_allreduce [--backend mpi|threads|nccl] [--device cpu|cuda] [--ranks N]
//                                            [--dtype f32,f16,...] [--min-bytes 8] [--max-bytes 64M] [--json]
//
// --backend nccl (CUDA tensors; --device cuda is its default) times with CUDA events on the current
// stream and takes raw ncclAllReduce on the same device buffers (its own communicator, on the
// current stream, synchronised after each call as ours is waited) as the peer. --device cuda with
// mpi or threads stages through host buffers and has no peer.
//
// Per size: count, dtype, median time over timed batches (the slowest rank's; ours and raw MPI in
// interleaved batches), algbw = bytes / time, busbw = algbw * 2 (n - 1) / n (what each rank's link
// carries), for ours and raw MPI. Ours is timed twice: issue then wait (what DDP and an async
// caller see), and under a BlockingIssueGuard (a caller that wants the result at once, as
// MPI_Allreduce gives it).
// Every result is checked before timing: rank r contributes (r + i) % 3 at element i, so the exact
// sum is known (and exact in f16/bf16). --backend threads runs N ranks as threads (no MPI peer).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "bench_common.h"
#include "cli.h"
#include "dist/dist.h"
#ifdef TANDEM_WITH_CUDA
#include "cuda/detail/check.h"
#include "cuda/runtime.h"
#endif
#ifdef TANDEM_WITH_NCCL
#include <nccl.h>
#endif

using namespace tandem;
using namespace tandem::dist;

namespace {

struct Args {
  std::string backend = "mpi";
  std::string device;  // "cpu" or "cuda"; default cuda for nccl, else cpu
  int ranks = 2;  // threads backend only
  std::vector<Dtype> dtypes = {f32};
  size_t min_bytes = 8;
  size_t max_bytes = size_t(64) << 20;
  bool json = false;
};

size_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  double mult = unit.empty() || unit == "B" ? 1 : unit == "K" ? 1024 : unit == "M" ? 1 << 20 : unit == "G" ? 1 << 30 : -1;
  TANDEM_CHECK(mult > 0 && v > 0, "[bench_allreduce] bad size '{}' (use e.g. 8, 4K, 64M)", s);
  return static_cast<size_t>(v * mult);
}

Dtype parse_dtype(const std::string& s) {
  for (Dtype d : {f32, f64, f16, bf16, i32, i64})
    if (dtype_name(d) == s) return d;
  tandem::fail("[bench_allreduce] unknown dtype '{}' (f32 f64 f16 bf16 i32 i64)", s);
}

// Fills `a` from the command line; -1 to go on, else main()'s status (tools/cli.h).
int parse(int argc, char** argv, Args& a) {
  CLI::App app{"Allreduce latency and bus bandwidth, ours beside raw MPI_Allreduce (launch with mpirun)",
               "bench_allreduce"};
  std::string dtypes = "f32", min_bytes = "8", max_bytes = "64M";
  app.add_option("--backend", a.backend, "mpi, threads or nccl")->check(CLI::IsMember({"mpi", "threads", "nccl"}));
  app.add_option("--device", a.device, "cpu or cuda (default: cuda for nccl, else cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--ranks", a.ranks, "ranks of the threads backend")->check(CLI::Range(1, 1024));
  app.add_option("--dtype", dtypes, "comma-separated dtypes (f32 f64 f16 bf16 i32 i64)");
  app.add_option("--min-bytes", min_bytes, "smallest message, e.g. 8, 4K, 64M");
  app.add_option("--max-bytes", max_bytes, "largest message");
  app.add_flag("--json", a.json, "one JSON object per row");
  app.callback([&] {
    a.dtypes.clear();
    size_t pos = 0;
    while (pos <= dtypes.size()) {
      size_t comma = dtypes.find(',', pos);
      if (comma == std::string::npos) comma = dtypes.size();
      a.dtypes.push_back(parse_dtype(dtypes.substr(pos, comma - pos)));
      pos = comma + 1;
    }
    a.min_bytes = parse_bytes(min_bytes);
    a.max_bytes = parse_bytes(max_bytes);
  });
  try {
    if (const int status = tools::parse(app, argc, argv); status >= 0) return status;
  } catch (const Error& e) {  // a value the callback could not read
    fmt::print(stderr, "bench_allreduce: {} (see --help)\n", e.what());
    return tools::kBadInput;
  }
  if (a.device.empty()) a.device = a.backend == "nccl" ? "cuda" : "cpu";
  TANDEM_CHECK(a.backend != "nccl" || a.device == "cuda", "[bench_allreduce] --backend nccl needs --device cuda");
#ifndef TANDEM_WITH_NCCL
  TANDEM_CHECK(a.backend != "nccl", "[bench_allreduce] --backend nccl needs a CUDA build of tandem with NCCL");
#endif
#ifndef TANDEM_WITH_CUDA
  TANDEM_CHECK(a.device == "cpu", "[bench_allreduce] --device cuda needs a CUDA build of tandem");
#endif
  return -1;
}

void fill(const Tensor& t, int rank) {
  TANDEM_DISPATCH_NUMERIC(t.dtype(), "fill", [&] {
    auto* p = static_cast<scalar_t*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>((rank + i) % 3));
  });
}

void zero(const Tensor& t) { std::memset(t.data_ptr(), 0, t.nbytes()); }

// Empty when the buffer holds the sum over n ranks of fill(), else what is wrong.
std::string check(const Tensor& t, int n) {
  std::string err;
  TANDEM_DISPATCH_NUMERIC(t.dtype(), "check", [&] {
    const auto* p = static_cast<const scalar_t*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel() && err.empty(); ++i) {
      double want = 0;
      for (int r = 0; r < n; ++r) want += (r + i) % 3;
      double got = static_cast<double>(static_cast<acc_t<scalar_t>>(p[i]));
      if (got != want) err = fmt::format("element {} is {}, expected {}", i, got, want);
    }
  });
  return err;
}

// Raw MPI's view of our dtypes; f16/bf16 get a float-converting user op like Tandem's.
template <class T>
void raw_half_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<T*>(inout);
  const auto* b = static_cast<const T*>(in);
  for (int i = 0; i < *len; ++i) a[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

std::pair<MPI_Datatype, MPI_Op> raw_type(Dtype d) {
  static MPI_Op half_sum = MPI_OP_NULL, bf16_sum = MPI_OP_NULL;
  switch (d) {
    case f32: return {MPI_FLOAT, MPI_SUM};
    case f64: return {MPI_DOUBLE, MPI_SUM};
    case i32: return {MPI_INT32_T, MPI_SUM};
    case i64: return {MPI_INT64_T, MPI_SUM};
    case f16:
      if (half_sum == MPI_OP_NULL) MPI_Op_create(&raw_half_sum<Half>, 1, &half_sum);
      return {MPI_UINT16_T, half_sum};
    case bf16:
      if (bf16_sum == MPI_OP_NULL) MPI_Op_create(&raw_half_sum<BFloat16>, 1, &bf16_sum);
      return {MPI_UINT16_T, bf16_sum};
    default: return {MPI_DATATYPE_NULL, MPI_OP_NULL};
  }
}

struct Result {
  size_t bytes;
  int64_t count;
  Dtype dtype;
  double ours_s;           // issue, then wait
  double blocking_s = NAN;  // under a BlockingIssueGuard (not nccl)
  double raw_s = NAN;
  std::string error;
};

std::string human(size_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return fmt::format("{}MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{}KiB", b >> 10);
  return fmt::format("{}B", b);
}

// Batches sized so that each size takes a fraction of a second: 64 MiB of traffic per batch, at
// least 4 calls (a batch of 2 large calls made the 8-16 MiB medians swing by 30 % between runs).
int iters_for(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((size_t(64) << 20) / std::max<size_t>(bytes, 4096), 4, 1000));
}

#ifdef TANDEM_WITH_CUDA
// As bench::median_seconds, timed by CUDA events on the current stream around each batch (every
// call completes before the next, so the end event marks the last completion).
double median_seconds_cuda(const std::function<void()>& fn, int iters, int runs, int warmup) {
  const int device = cuda::current_device();
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> samples;
  for (int r = 0; r < runs; ++r) {
    cuda::Event start(true), end(true);
    start.record(cuda::current_stream(device));
    for (int i = 0; i < iters; ++i) fn();
    end.record(cuda::current_stream(device));
    end.synchronize();
    samples.push_back(start.elapsed_ms(end) / 1e3 / iters);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}
#endif

#ifdef TANDEM_WITH_NCCL
[[noreturn]] void nccl_failed(ncclResult_t rc, const char* call) {
  tandem::fail("[bench_allreduce] {} failed: {}", call, ncclGetErrorString(rc));
}
#define BENCH_NCCL(call)                                     \
  do {                                                       \
    ncclResult_t bench_rc_ = (call);                         \
    if (bench_rc_ != ncclSuccess) nccl_failed(bench_rc_, #call); \
  } while (0)

// The peer for --backend nccl: a communicator of its own over MPI_COMM_WORLD, on the current device.
struct RawNccl {
  ncclComm_t comm = nullptr;
  RawNccl() {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ncclUniqueId id;
    if (rank == 0) BENCH_NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    BENCH_NCCL(ncclCommInitRank(&comm, size, id, rank));
  }
  ~RawNccl() {
    if (comm) (void)ncclCommDestroy(comm);
  }
  ncclDataType_t type(Dtype d) const {
    switch (d) {
      case f32: return ncclFloat32;
      case f64: return ncclFloat64;
      case f16: return ncclFloat16;
      case bf16: return ncclBfloat16;
      case i32: return ncclInt32;
      default: return ncclInt64;
    }
  }
  void allreduce(const Tensor& t) const {
    cudaStream_t s = cuda::current_stream(t.device());
    BENCH_NCCL(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), type(t.dtype()), ncclSum, comm, s));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
  }
};
#endif

// The benchmark's buffer on the benchmarked device; CPU-side fills and checks go through `host`.
struct Buffer {
  Tensor host, t;
  Device device;
  Buffer(int64_t count, Dtype dt, Device dev) : host(make_empty({count}, dt, kCPU, "bench")), device(dev) {
    t = dev.is_cpu() ? host : host.to(dev);
  }
  void upload() {
    if (!device.is_cpu()) t = host.to(device);
  }
  const Tensor& download() {
    if (!device.is_cpu()) {
      Tensor c = t.to(kCPU);
      std::memcpy(host.data_ptr(), c.data_ptr(), c.nbytes());
    }
    return host;
  }
};

void sweep(ProcessGroup& pg, const Args& args, bool with_mpi, std::vector<Result>& out) {
  const int n = pg.size();
  const bool on_cuda = args.device == "cuda";
  Device dev = kCPU;
#ifdef TANDEM_WITH_CUDA
  if (on_cuda) dev = Device::cuda(cuda::current_device());
  auto timed = on_cuda ? median_seconds_cuda : bench::median_seconds;
#else
  auto timed = bench::median_seconds;
#endif
#ifdef TANDEM_WITH_NCCL
  std::unique_ptr<RawNccl> raw_nccl;
  if (args.backend == "nccl") raw_nccl = std::make_unique<RawNccl>();
#endif
  for (Dtype dt : args.dtypes) {
    for (size_t bytes = std::max(args.min_bytes, itemsize(dt)); bytes <= args.max_bytes; bytes *= 2) {
      int64_t count = static_cast<int64_t>(bytes / itemsize(dt));
      Buffer buf(count, dt, dev);
      const Tensor& t = buf.t;
      Result r{count * itemsize(dt), count, dt, 0, NAN, NAN, ""};
      fill(buf.host, pg.rank());
      buf.upload();
      pg.allreduce(t)->wait();
      r.error = check(buf.download(), n);
      const bool blocking = pg.supports_blocking_issue(t.device());
      if (blocking && r.error.empty()) {
        fill(buf.host, pg.rank());
        buf.upload();
        {
          BlockingIssueGuard guard;
          pg.allreduce(t)->wait();
        }
        std::string err = check(buf.download(), n);
        if (!err.empty()) r.error = "blocking: " + err;
      }
      const int iters = iters_for(bytes);
      zero(buf.host);  // timed runs sum zeros, so repeated sums cannot overflow
      buf.upload();
      auto ours = [&] { pg.allreduce(t)->wait(); };
      auto ours_blocking = [&] {
        BlockingIssueGuard guard;
        pg.allreduce(t)->wait();
      };
      pg.barrier()->wait();
      const bool raw_mpi = with_mpi && !on_cuda;
      if (!raw_mpi) {
        r.ours_s = timed(ours, iters, 5, std::min(iters, 20));
        if (blocking) r.blocking_s = timed(ours_blocking, iters, 5, std::min(iters, 20));
      }
#ifdef TANDEM_WITH_NCCL
      if (raw_nccl) {
        fill(buf.host, pg.rank());
        buf.upload();
        raw_nccl->allreduce(t);
        std::string raw_err = check(buf.download(), n);
        if (!raw_err.empty() && r.error.empty()) r.error = "raw NCCL: " + raw_err;
        zero(buf.host);
        buf.upload();
        auto raw = [&] { raw_nccl->allreduce(t); };
        MPI_Barrier(MPI_COMM_WORLD);
        r.raw_s = timed(raw, iters, 5, std::min(iters, 20));
      }
#endif
      if (raw_mpi) {
        auto [type, op] = raw_type(dt);
        fill(t, pg.rank());
        MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(count), type, op, MPI_COMM_WORLD);
        std::string raw_err = check(t, n);
        if (!raw_err.empty() && r.error.empty()) r.error = "raw MPI: " + raw_err;
        zero(t);
        auto raw = [&] { MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(count), type, op, MPI_COMM_WORLD); };
        MPI_Barrier(MPI_COMM_WORLD);
        // Ours (both ways) and raw in interleaved batches (7 each), so drift on a shared machine
        // hits all three.
        auto medians = bench::median_seconds_interleaved({ours, ours_blocking, raw}, iters, 7, std::min(iters, 20));
        r.ours_s = medians[0];
        r.blocking_s = medians[1];
        r.raw_s = medians[2];
      }
      if (with_mpi) {
        // Report the slowest rank, as nccl-tests does.
        double times[3] = {r.ours_s, r.blocking_s, r.raw_s}, worst[3];
        MPI_Allreduce(times, worst, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        r.ours_s = worst[0];
        r.blocking_s = worst[1];
        r.raw_s = worst[2];
        int bad = r.error.empty() ? 0 : 1, any_bad = 0;
        MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (any_bad && r.error.empty()) r.error = "wrong result on another rank";
      }
      out.push_back(r);
    }
  }
}

void report(const std::vector<Result>& results, int n, const Args& args, bool failed) {
  const double busf = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  if (args.json) {
    std::vector<bench::Row> rows;
    // CPU rows keep their names; device rows say backend and device.
    std::string where = args.device == "cpu" ? "" : fmt::format("{}_{}_", args.backend, args.device);
    for (const auto& r : results) {
      std::string base = fmt::format("allreduce_{}{}_{}_np{}", where, dtype_name(r.dtype), human(r.bytes), n);
      bench::Row bw{base + "_busbw", r.bytes / r.ours_s * busf / 1e9, {}, "GB/s", "", r.error};
      bench::Row lat{base + "_time", r.ours_s * 1e6, {}, "us", "", r.error};
      if (!std::isnan(r.raw_s)) {
        bw.peer = r.bytes / r.raw_s * busf / 1e9;
        lat.peer = r.raw_s * 1e6;
      }
      rows.push_back(bw);
      rows.push_back(lat);
      if (!std::isnan(r.blocking_s)) {
        rows.push_back({base + "_blocking_busbw", r.bytes / r.blocking_s * busf / 1e9, bw.peer, "GB/s", "", r.error});
        rows.push_back({base + "_blocking_time", r.blocking_s * 1e6, lat.peer, "us", "", r.error});
      }
    }
    bench::print_rows(rows, true);
    return;
  }
  const char* peer = args.backend == "nccl" ? "raw ncclAllReduce (current stream, synchronised per call)"
                     : args.device == "cpu" ? "raw MPI_Allreduce"
                                            : "no peer (device tensors staged through host buffers)";
  fmt::print("# allreduce (sum, in place), backend {} on {}, {} ranks; ours vs {} on the same buffers\n", args.backend,
             args.device, n, peer);
  fmt::print("# {:>10} {:>10} {:>6} | {:>10} {:>8} {:>8} | {:>10} {:>8} | {:>10} {:>8} {:>8} | {:>6} {:>6} {}\n",
             "size", "count", "type", "time(us)", "algbw", "busbw", "block(us)", "busbw", "raw(us)", "algbw", "busbw",
             "ratio", "ratioB", "check");
  for (const auto& r : results) {
    double alg = r.bytes / r.ours_s / 1e9, raw_alg = r.bytes / r.raw_s / 1e9;
    fmt::print("  {:>10} {:>10} {:>6} | {:>10.2f} {:>8.3f} {:>8.3f} | {:>10.2f} {:>8.3f} | {:>10.2f} {:>8.3f} {:>8.3f} "
               "| {:>6.3f} {:>6.3f} {}\n",
               r.bytes, r.count, dtype_name(r.dtype), r.ours_s * 1e6, alg, alg * busf, r.blocking_s * 1e6,
               r.bytes / r.blocking_s * busf / 1e9, r.raw_s * 1e6, raw_alg, raw_alg * busf, r.raw_s / r.ours_s,
               r.raw_s / r.blocking_s, r.error.empty() ? "ok" : "WRONG: " + r.error);
  }
  fmt::print("# time: issue, then wait; block: under a BlockingIssueGuard (the caller runs it while the group is idle)\n");
  fmt::print("# ratio = ours busbw / raw busbw (ratioB: blocking); {}\n",
             failed ? "SOME RESULTS WERE WRONG" : "all results correct");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args;
    if (const int status = parse(argc, argv, args); status >= 0) return status;
    std::vector<Result> results;
    int n = 1;
    bool lead = true;
    if (args.backend == "mpi" || args.backend == "nccl") {
      mpi_info();  // MPI for the peer and the slowest-rank report, also without mpirun
      ProcessGroupPtr world = init(InitOptions{args.backend, {}, {}});
      n = world->size();
      lead = world->rank() == 0;
      sweep(*world, args, true, results);
    } else {
      n = args.ranks;
      std::mutex m;
      run_threads(n, [&](ProcessGroup& pg) {
        std::vector<Result> mine;
        sweep(pg, args, false, mine);
        if (pg.rank() == 0) {
          std::lock_guard lock(m);
          results = mine;
        }
      });
    }
    bool failed = std::any_of(results.begin(), results.end(), [](const Result& r) { return !r.error.empty(); });
    if (lead) report(results, n, args, failed);
    finalize();
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
}
