// allreduce_bench: an nccl-tests-style sweep of dist allreduce (sum, in place) from 8 B to 64 MiB,
// with raw MPI_Allreduce on the same buffers in the same run as the peer.
//
//   mpirun -np 2 tools/allreduce_bench [--backend mpi|threads] [--ranks N] [--dtype f32,f16,...]
//                                      [--min-bytes 8] [--max-bytes 64M] [--json]
//
// Per size: count, dtype, median time over several timed batches (the slowest rank's), algbw =
// bytes / time, busbw = algbw * 2 (n - 1) / n (what each rank's link carries), for ours and raw MPI.
// Every result is checked before timing: rank r contributes (r + i) % 3 at element i, so the exact
// sum is known (and exact in f16/bf16). --backend threads runs N ranks as threads (no MPI peer).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"
#include "dist/dist.h"

using namespace tandem;
using namespace tandem::dist;

namespace {

struct Args {
  std::string backend = "mpi";
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
  TANDEM_CHECK(mult > 0 && v > 0, "[allreduce_bench] bad size '{}' (use e.g. 8, 4K, 64M)", s);
  return static_cast<size_t>(v * mult);
}

Dtype parse_dtype(const std::string& s) {
  for (Dtype d : {f32, f64, f16, bf16, i32, i64})
    if (dtype_name(d) == s) return d;
  tandem::fail("[allreduce_bench] unknown dtype '{}' (f32 f64 f16 bf16 i32 i64)", s);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      TANDEM_CHECK(i + 1 < argc, "[allreduce_bench] {} needs a value", k);
      return argv[++i];
    };
    if (k == "--backend") {
      a.backend = next();
    } else if (k == "--ranks") {
      a.ranks = std::atoi(next().c_str());
    } else if (k == "--dtype") {
      a.dtypes.clear();
      std::string list = next();
      size_t pos = 0;
      while (pos <= list.size()) {
        size_t comma = list.find(',', pos);
        if (comma == std::string::npos) comma = list.size();
        a.dtypes.push_back(parse_dtype(list.substr(pos, comma - pos)));
        pos = comma + 1;
      }
    } else if (k == "--min-bytes") {
      a.min_bytes = parse_bytes(next());
    } else if (k == "--max-bytes") {
      a.max_bytes = parse_bytes(next());
    } else if (k == "--json") {
      a.json = true;
    } else {
      tandem::fail("[allreduce_bench] unknown option '{}' (--backend --ranks --dtype --min-bytes --max-bytes --json)", k);
    }
  }
  TANDEM_CHECK(a.backend == "mpi" || a.backend == "threads", "[allreduce_bench] --backend is mpi or threads, got '{}'",
               a.backend);
  return a;
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
  double ours_s;
  double raw_s = NAN;
  std::string error;
};

std::string human(size_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return fmt::format("{}MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{}KiB", b >> 10);
  return fmt::format("{}B", b);
}

// Batches sized so that each size takes a fraction of a second.
int iters_for(size_t bytes) { return static_cast<int>(std::clamp<size_t>((size_t(32) << 20) / std::max<size_t>(bytes, 4096), 2, 1000)); }

void sweep(ProcessGroup& pg, const Args& args, bool with_mpi, std::vector<Result>& out) {
  const int n = pg.size();
  for (Dtype dt : args.dtypes) {
    for (size_t bytes = std::max(args.min_bytes, itemsize(dt)); bytes <= args.max_bytes; bytes *= 2) {
      int64_t count = static_cast<int64_t>(bytes / itemsize(dt));
      Tensor t = make_empty({count}, dt, kCPU, "bench");
      Result r{count * itemsize(dt), count, dt, 0, NAN, ""};
      fill(t, pg.rank());
      pg.allreduce(t)->wait();
      r.error = check(t, n);
      const int iters = iters_for(bytes);
      zero(t);  // timed runs sum zeros, so repeated sums cannot overflow
      auto ours = [&] { pg.allreduce(t)->wait(); };
      pg.barrier()->wait();
      r.ours_s = bench::median_seconds(ours, iters, 5, std::min(iters, 20));
      if (with_mpi) {
        auto [type, op] = raw_type(dt);
        fill(t, pg.rank());
        MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(count), type, op, MPI_COMM_WORLD);
        std::string raw_err = check(t, n);
        if (!raw_err.empty() && r.error.empty()) r.error = "raw MPI: " + raw_err;
        zero(t);
        auto raw = [&] { MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(count), type, op, MPI_COMM_WORLD); };
        MPI_Barrier(MPI_COMM_WORLD);
        r.raw_s = bench::median_seconds(raw, iters, 5, std::min(iters, 20));
        // Report the slowest rank, as nccl-tests does.
        double times[2] = {r.ours_s, r.raw_s}, worst[2];
        MPI_Allreduce(times, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        r.ours_s = worst[0];
        r.raw_s = worst[1];
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
    for (const auto& r : results) {
      std::string base = fmt::format("allreduce_{}_{}_np{}", dtype_name(r.dtype), human(r.bytes), n);
      bench::Row bw{base + "_busbw", r.bytes / r.ours_s * busf / 1e9, {}, "GB/s", "", r.error};
      bench::Row lat{base + "_time", r.ours_s * 1e6, {}, "us", "", r.error};
      if (!std::isnan(r.raw_s)) {
        bw.peer = r.bytes / r.raw_s * busf / 1e9;
        lat.peer = r.raw_s * 1e6;
      }
      rows.push_back(bw);
      rows.push_back(lat);
    }
    bench::print_rows(rows, true);
    return;
  }
  fmt::print("# allreduce (sum, in place), backend {}, {} ranks; ours vs raw MPI_Allreduce on the same buffers\n",
             args.backend, n);
  fmt::print("# {:>10} {:>10} {:>6} | {:>10} {:>8} {:>8} | {:>10} {:>8} {:>8} | {:>6} {}\n", "size", "count", "type",
             "time(us)", "algbw", "busbw", "raw(us)", "algbw", "busbw", "ratio", "check");
  for (const auto& r : results) {
    double alg = r.bytes / r.ours_s / 1e9, raw_alg = r.bytes / r.raw_s / 1e9;
    fmt::print("  {:>10} {:>10} {:>6} | {:>10.2f} {:>8.3f} {:>8.3f} | {:>10.2f} {:>8.3f} {:>8.3f} | {:>6.3f} {}\n",
               r.bytes, r.count, dtype_name(r.dtype), r.ours_s * 1e6, alg, alg * busf, r.raw_s * 1e6, raw_alg,
               raw_alg * busf, r.raw_s / r.ours_s, r.error.empty() ? "ok" : "WRONG: " + r.error);
  }
  fmt::print("# ratio = ours busbw / raw busbw; {}\n", failed ? "SOME RESULTS WERE WRONG" : "all results correct");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args = parse(argc, argv);
    std::vector<Result> results;
    int n = 1;
    bool lead = true;
    if (args.backend == "mpi") {
      ProcessGroupPtr world = init(InitOptions{"mpi", {}, {}});
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
