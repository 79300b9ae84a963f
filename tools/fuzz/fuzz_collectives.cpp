// libFuzzer target: the collectives' argument checks across thread ranks.
//
// Each input runs a world of 2 or 3 ranks (dist::run_threads, debug checks on, a 1 s timeout).
// The bytes give a few steps; at each step every rank issues one collective (allreduce,
// allreduce_coalesced, broadcast, allgather, allgather_into, reduce_scatter, reduce_scatter_tensor,
// all_to_all with equal or listed splits, barrier) with a dtype, element count, reduce op and
// root. A step's call is shared by all ranks, then each rank may change one field of its own, so
// ranks may disagree (a mismatch the group must detect) or pass arguments that are wrong on their
// own (caught at issue). A rank that gets a tandem::Error rethrows it, which fails the other ranks'
// pending collectives at once.
//
// Every input must end with each rank either done or stopped by a tandem::Error; anything else
// escaping a rank is a finding, as is a crash, a sanitizer report, or a run that lasts past the
// timeout by a wide margin (a hang: a watchdog aborts). Where all ranks made the same call and it
// succeeded, its results are checked against values computed here: wrong data is a finding too.
// Every rank issues the same number of collectives, so a correct group never waits for the
// timeout; the one time path (a rank that never arrives) is left to tests/dist/test_dist.cpp, since
// each such input would cost the whole timeout.
//
// tools/fuzz/make_seeds.py writes seeds in this encoding; FUZZ_TRACE=1 in the environment prints
// each rank's calls and outcome.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "fuzz_common.h"
#include "tandem.h"

using namespace tandem;
using namespace tandem::dist;

namespace {

constexpr auto kTimeout = std::chrono::milliseconds(1000);
// A run taking longer than this has hung: every collective ends within kTimeout of its issue.
constexpr auto kHang = std::chrono::milliseconds(10000);
constexpr int kMaxSteps = 4;

enum class Kind : uint8_t {
  allreduce, allreduce_coalesced, broadcast, allgather, allgather_into, reduce_scatter,
  reduce_scatter_tensor, all_to_all, all_to_all_splits, barrier, count
};
const char* kind_name(Kind k) {
  static const char* names[] = {"allreduce",      "allreduce_coalesced",   "broadcast",  "allgather",
                                "allgather_into", "reduce_scatter",        "reduce_scatter_tensor",
                                "all_to_all",     "all_to_all(splits)",    "barrier"};
  return names[static_cast<int>(k)];
}

// One rank's call at one step.
struct Call {
  Kind kind = Kind::barrier;
  Dtype dtype = f32;
  int64_t count = 1;   // elements per rank (rows for all_to_all)
  int64_t cols = 1;    // all_to_all: elements per row
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  int64_t out_skew = 0;  // added to the output's (or the inputs') size: 0 is right
  uint8_t split_seed = 0;  // all_to_all_splits: rows from rank k to rank j are pattern_split(seed, k, j)
  bool splits_changed = false;
  std::vector<int64_t> in_splits, out_splits;  // this rank's, from the pattern unless changed
  bool operator==(const Call&) const = default;
};

class Bytes {
 public:
  Bytes(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  int64_t pick(int64_t k) { return u8() % k; }

 private:
  const uint8_t* p_;
  size_t n_;
};

Dtype dtype_from(int64_t v) {
  static constexpr Dtype table[] = {f32, f64, f16, bf16, i32, i64, boolean, f32};
  return table[v % 8];
}
ReduceOp op_from(int64_t v) {
  static constexpr ReduceOp table[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::product};
  return table[v % 5];
}
int64_t count_from(uint8_t v) {
  if (v < 200) return v % 9;  // 0..8
  static constexpr int64_t table[] = {-1, 17, 100, 1000, int64_t{1} << 40, -(int64_t{1} << 40), 3, 6};
  return table[v % 8];
}
int64_t split_from(uint8_t v) {
  if (v < 220) return v % 4;
  static constexpr int64_t table[] = {-1, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), 5};
  return table[v % 4];
}

// Rows rank `from` sends to each rank in an all_to_all_splits call: a pattern every rank derives
// the same way from one seed byte, so that agreeing ranks also agree on each other's splits.
int64_t pattern_split(uint8_t seed, int from, int to) { return (seed + 3 * from + 5 * to) % 3; }

Call read_call(Bytes& in, int world) {
  Call c;
  c.kind = static_cast<Kind>(in.pick(static_cast<int64_t>(Kind::count)));
  c.dtype = dtype_from(in.u8());
  c.count = count_from(in.u8());
  c.cols = in.pick(3) + 1;
  c.op = op_from(in.u8());
  c.root = static_cast<int>(in.pick(world));
  c.split_seed = in.u8();
  return c;
}

// Rank r's version of the step's call: splits resolved for r, then maybe one field changed.
Call rank_call(const Call& base, int r, int world, Bytes& in) {
  Call c = base;
  c.in_splits.resize(world);
  c.out_splits.resize(world);
  for (int to = 0; to < world; ++to) c.in_splits[to] = pattern_split(c.split_seed, r, to);
  for (int from = 0; from < world; ++from) c.out_splits[from] = pattern_split(c.split_seed, from, r);
  uint8_t change = in.u8();
  if (change < 176) return c;  // most ranks keep the shared call
  switch (change % 8) {
    case 0: c.kind = static_cast<Kind>(in.pick(static_cast<int64_t>(Kind::count))); break;
    case 1: c.dtype = dtype_from(in.u8()); break;
    case 2: c.count = count_from(in.u8()); break;
    case 3: c.op = op_from(in.u8()); break;
    case 4: c.root = static_cast<int>(in.u8() < 200 ? in.pick(world) : in.pick(9) - 4); break;
    case 5: c.out_skew = in.pick(5) - 2; break;
    case 6: {
      int64_t to = in.pick(world);
      c.in_splits[to] = split_from(in.u8());
      c.splits_changed = true;
      break;
    }
    default: {
      int64_t from = in.pick(world);
      c.out_splits[from] = split_from(in.u8());
      c.splits_changed = true;
      break;
    }
  }
  return c;
}

// Rank r's input element i: small integers (exact in every dtype, products included).
double value(int r, int64_t i, Dtype dtype) {
  if (dtype == boolean) return static_cast<double>((r + i) % 2);
  return static_cast<double>((r + 1) * (i % 3 + 1)) * (i % 2 ? -1 : 1);
}

Tensor filled(int r, int64_t n, Dtype dtype, int64_t offset = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = value(r, offset + i, dtype);
  return from_vector(v).to(dtype);
}

double reduce_values(ReduceOp op, Dtype dtype, int world, int64_t i) {
  double acc = value(0, i, dtype);
  for (int k = 1; k < world; ++k) {
    double v = value(k, i, dtype);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc = dtype == boolean ? (acc || v) : acc + v; break;
      case ReduceOp::product: acc = dtype == boolean ? (acc && v) : acc * v; break;
      case ReduceOp::min: acc = std::min(acc, v); break;
      case ReduceOp::max: acc = std::max(acc, v); break;
    }
  }
  return op == ReduceOp::avg ? acc / world : acc;
}

[[noreturn]] void finding(const std::string& what) {
  fprintf(stderr, "fuzz_collectives: %s\n", what.c_str());
  std::abort();
}

void expect_values(const Tensor& t, const std::vector<double>& expected, const Call& c, int r) {
  std::vector<double> got = t.to(f64).contiguous().to_vector<double>();
  if (got.size() != expected.size())
    finding(fmt::format("{} on rank {}: {} result elements, expected {}", kind_name(c.kind), r, got.size(),
                        expected.size()));
  double tol = (c.dtype == f16 || c.dtype == bf16) ? 1e-2 : 1e-6;
  for (size_t i = 0; i < got.size(); ++i) {
    double want = expected[i];
    if (is_integral(c.dtype)) want = std::trunc(want);
    if (std::fabs(got[i] - want) > tol * std::max(1.0, std::fabs(want)))
      finding(fmt::format("{} {} {} on rank {}: element {} is {}, expected {}", kind_name(c.kind),
                          reduce_op_name(c.op), c.dtype, r, i, got[i], want));
  }
}

// Issues rank r's call and waits for it; when `check`, verifies the results.
void run_call(ProcessGroup& g, const Call& c, bool check) {
  const int r = g.rank(), n = g.size();
  const int64_t m = c.count;
  auto bounded = [](int64_t v) { return v >= 0 && v <= 4096; };
  switch (c.kind) {
    case Kind::allreduce: {
      if (!bounded(m)) return void(g.allreduce(zeros({1}, c.dtype), c.op)->wait());
      Tensor t = filled(r, m, c.dtype);
      g.allreduce(t, c.op)->wait();
      if (check) {
        std::vector<double> want(m);
        for (int64_t i = 0; i < m; ++i) want[i] = reduce_values(c.op, c.dtype, n, i);
        expect_values(t, want, c, r);
      }
      break;
    }
    case Kind::allreduce_coalesced: {
      if (!bounded(m)) return void(g.allreduce_coalesced({}, c.op)->wait());
      Tensor a = filled(r, m, c.dtype), b = filled(r, 2, c.out_skew ? f64 : c.dtype, m);
      g.allreduce_coalesced({a, b}, c.op)->wait();
      if (check) {
        std::vector<double> want(m), want_b(2);
        for (int64_t i = 0; i < m; ++i) want[i] = reduce_values(c.op, c.dtype, n, i);
        for (int64_t i = 0; i < 2; ++i) want_b[i] = reduce_values(c.op, c.dtype, n, m + i);
        expect_values(a, want, c, r);
        expect_values(b, want_b, c, r);
      }
      break;
    }
    case Kind::broadcast: {
      if (!bounded(m)) return void(g.broadcast(zeros({0}, c.dtype), c.root)->wait());
      Tensor t = filled(r, m, c.dtype);
      g.broadcast(t, c.root)->wait();
      if (check) {
        std::vector<double> want(m);
        for (int64_t i = 0; i < m; ++i) want[i] = value(c.root, i, c.dtype);
        expect_values(t, want, c, r);
      }
      break;
    }
    case Kind::allgather: {
      if (!bounded(m)) return void(g.allgather({}, zeros({1}, c.dtype))->wait());
      Tensor in = filled(r, m, c.dtype);
      TensorList outs;
      for (int k = 0; k < n + (c.out_skew > 0 ? 1 : 0) - (c.out_skew < 0 ? 1 : 0); ++k)
        outs.push_back(zeros({m}, c.dtype));
      g.allgather(outs, in)->wait();
      if (check) {
        for (int k = 0; k < n; ++k) {
          std::vector<double> want(m);
          for (int64_t i = 0; i < m; ++i) want[i] = value(k, i, c.dtype);
          expect_values(outs[k], want, c, r);
        }
      }
      break;
    }
    case Kind::allgather_into: {
      if (!bounded(m)) return void(g.allgather_into(zeros({2}, c.dtype), zeros({1}, c.dtype))->wait());
      Tensor in = filled(r, m, c.dtype);
      Tensor out = zeros({std::max<int64_t>(0, n * m + c.out_skew)}, c.dtype);
      g.allgather_into(out, in)->wait();
      if (check) {
        std::vector<double> want;
        for (int k = 0; k < n; ++k)
          for (int64_t i = 0; i < m; ++i) want.push_back(value(k, i, c.dtype));
        expect_values(out, want, c, r);
      }
      break;
    }
    case Kind::reduce_scatter: {
      if (!bounded(m)) return void(g.reduce_scatter(zeros({1}, c.dtype), {}, c.op)->wait());
      TensorList ins;
      for (int k = 0; k < n; ++k) ins.push_back(filled(r, m, c.dtype, k * m));
      if (c.out_skew) ins.pop_back();
      Tensor out = zeros({m}, c.dtype);
      g.reduce_scatter(out, ins, c.op)->wait();
      if (check) {
        std::vector<double> want(m);
        for (int64_t i = 0; i < m; ++i) want[i] = reduce_values(c.op, c.dtype, n, r * m + i);
        expect_values(out, want, c, r);
      }
      break;
    }
    case Kind::reduce_scatter_tensor: {
      if (!bounded(m)) return void(g.reduce_scatter_tensor(zeros({1}, c.dtype), zeros({3}, c.dtype), c.op)->wait());
      Tensor in = filled(r, std::max<int64_t>(0, n * m + c.out_skew), c.dtype);
      Tensor out = zeros({m}, c.dtype);
      g.reduce_scatter_tensor(out, in, c.op)->wait();
      if (check) {
        std::vector<double> want(m);
        for (int64_t i = 0; i < m; ++i) want[i] = reduce_values(c.op, c.dtype, n, r * m + i);
        expect_values(out, want, c, r);
      }
      break;
    }
    case Kind::all_to_all: {
      // Equal splits: `count` rows per destination (count * n rows in all), `cols` per row.
      if (!bounded(m)) return void(g.all_to_all(zeros({3, 1}, c.dtype), zeros({3, 1}, c.dtype))->wait());
      int64_t rows = n * m + c.out_skew;
      Tensor in = filled(r, std::max<int64_t>(0, rows) * c.cols, c.dtype).reshape({std::max<int64_t>(0, rows), c.cols});
      Tensor out = zeros({n * m, c.cols}, c.dtype);
      g.all_to_all(out, in)->wait();
      if (check) {
        std::vector<double> want;
        for (int k = 0; k < n; ++k)
          for (int64_t i = 0; i < m * c.cols; ++i) want.push_back(value(k, r * m * c.cols + i, c.dtype));
        expect_values(out, want, c, r);
      }
      break;
    }
    case Kind::all_to_all_splits: {
      int64_t in_rows = 0, out_rows = 0;
      bool sane = true;
      for (int k = 0; k < n; ++k) {
        sane = sane && c.in_splits[k] >= 0 && c.in_splits[k] <= 64 && c.out_splits[k] >= 0 && c.out_splits[k] <= 64;
        if (sane) {
          in_rows += c.in_splits[k];
          out_rows += c.out_splits[k];
        }
      }
      AllToAllSplits splits{c.out_splits, c.in_splits};
      if (!sane) {  // wild splits against small tensors: must be refused
        g.all_to_all(zeros({4, 1}, c.dtype), zeros({4, 1}, c.dtype), splits)->wait();
        finding("all_to_all accepted wild splits");
      }
      Tensor in = filled(r, in_rows * c.cols, c.dtype).reshape({in_rows, c.cols});
      Tensor out = zeros({out_rows + c.out_skew < 0 ? 0 : out_rows + c.out_skew, c.cols}, c.dtype);
      g.all_to_all(out, in, splits)->wait();
      if (check) {
        // Rank k sends rank r its rows [sum of k's splits to ranks < r, + k's split to r).
        // Rank k sends rank r the rows after those it sends to ranks 0..r-1.
        std::vector<double> want;
        for (int k = 0; k < n; ++k) {
          int64_t row = 0;
          for (int j = 0; j < r; ++j) row += pattern_split(c.split_seed, k, j);
          for (int64_t i = 0; i < c.out_splits[k] * c.cols; ++i) want.push_back(value(k, row * c.cols + i, c.dtype));
        }
        expect_values(out, want, c, r);
      }
      break;
    }
    case Kind::barrier:
    case Kind::count: g.barrier()->wait(); break;
  }
}

// The watchdog: one thread for the whole fuzzing run, aborting when an input outlives kHang.
std::atomic<int64_t> deadline_ms{0};
int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
void watchdog() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int64_t d = deadline_ms.load();
    if (d != 0 && now_ms() > d) finding("hang: an input ran past the timeout by far (watchdog)");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_num_threads(1);
  std::thread(watchdog).detach();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const int world = 2 + static_cast<int>(in.pick(2));
  const int steps = 1 + static_cast<int>(in.pick(kMaxSteps));
  // calls[s][r]: rank r's call at step s, all read up front (the bytes are not thread-safe).
  std::vector<std::vector<Call>> calls(steps);
  std::vector<bool> agreed(steps);
  for (int s = 0; s < steps; ++s) {
    Call base = read_call(in, world);
    for (int r = 0; r < world; ++r) calls[s].push_back(rank_call(base, r, world, in));
    agreed[s] = true;
    for (int r = 1; r < world; ++r) {
      Call a = calls[s][r], b = calls[s][0];
      a.in_splits = b.in_splits = a.out_splits = b.out_splits = {};  // per rank by design, from the seed
      agreed[s] = agreed[s] && a == b;
    }
  }
  std::mutex mutex;
  std::vector<std::string> outcome(world);
  ThreadsOptions options;
  options.timeout = kTimeout;
  options.debug_checks = true;
  deadline_ms.store(now_ms() + kHang.count());
  try {
    run_threads(world, [&](ProcessGroup& g) {
      const int r = g.rank();
      try {
        for (int s = 0; s < steps; ++s) run_call(g, calls[s][r], agreed[s]);
      } catch (const Error& e) {
        std::lock_guard lock(mutex);
        outcome[r] = e.what();
        throw;
      } catch (const std::exception& e) {
        finding(fmt::format("rank {} threw a {} that is not a tandem::Error: {}", r, typeid(e).name(), e.what()));
      } catch (...) {
        finding(fmt::format("rank {} threw something that is not a std::exception", r));
      }
    }, options);
  } catch (const Error&) {
    // Some rank was refused or saw a mismatch: every other rank has stopped too.
  }
  deadline_ms.store(0);
  // FUZZ_TRACE=1 in the environment: the calls and each rank's outcome on stderr.
  static const bool trace = std::getenv("FUZZ_TRACE") != nullptr;
  if (trace) {
    for (int s = 0; s < steps; ++s) {
      for (int r = 0; r < world; ++r) {
        const Call& c = calls[s][r];
        fprintf(stderr, "step %d rank %d: %s %s count %lld op %s root %d skew %lld splits in [%s] out [%s]%s\n", s, r,
                kind_name(c.kind), std::string(dtype_name(c.dtype)).c_str(), static_cast<long long>(c.count),
                std::string(reduce_op_name(c.op)).c_str(), c.root, static_cast<long long>(c.out_skew),
                fmt::format("{}", fmt::join(c.in_splits, ", ")).c_str(),
                fmt::format("{}", fmt::join(c.out_splits, ", ")).c_str(), agreed[s] ? " (agreed)" : "");
      }
    }
    for (int r = 0; r < world; ++r)
      fprintf(stderr, "rank %d: %s\n", r, outcome[r].empty() ? "done" : outcome[r].c_str());
  }
  return 0;
}
