// The dist checks shared by test_dist (threads backend, in one process) and test_dist_mpi (mpi
// backend under mpirun). Each case runs on every rank with that rank's group and throws on a
// failed check (Catch's macros are not thread safe, so the threads test reports from the main
// thread). Values are small integers so sums and products are exact in every dtype, f16 and
// bf16 included, whatever order a backend combines them in.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dist/dist.h"

namespace dist_cases {

using namespace tandem;
using namespace tandem::dist;

inline const std::vector<Dtype> kAllDtypes = {f32, f64, f16, bf16, i32, i64, boolean};
inline const std::vector<ReduceOp> kAllOps = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                                              ReduceOp::product};

template <class... Args>
void expect(bool ok, fmt::format_string<Args...> f, Args&&... args) {
  if (!ok) throw std::runtime_error(fmt::format(f, std::forward<Args>(args)...));
}

// A tensor whose element i is v(i).
inline Tensor make(const Shape& shape, Dtype dt, const std::function<double(int64_t)>& v) {
  Tensor t = make_empty(shape, dt, kCPU, "test");
  TANDEM_DISPATCH_ALL(dt, "test", [&] {
    auto* p = static_cast<scalar_t*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<scalar_t, bool>) {
        p[i] = v(i) != 0;
      } else {
        p[i] = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(v(i)));
      }
    }
  });
  return t;
}

inline double at(const Tensor& t, int64_t i) {
  double out = 0;
  TANDEM_DISPATCH_ALL(t.dtype(), "test", [&] {
    out = static_cast<double>(static_cast<acc_t<scalar_t>>(static_cast<const scalar_t*>(t.data_ptr())[i]));
  });
  return out;
}

inline double tolerance(Dtype dt) { return dt == f16 ? 2e-3 : dt == bf16 ? 1e-2 : dt == f32 ? 1e-6 : 1e-12; }

// Checks t[i] == want(i) (relative tolerance for avg results, which need not be exact).
inline void expect_values(const Tensor& t, const std::function<double(int64_t)>& want, const std::string& what,
                          double rtol = 0) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    double got = at(t, i), w = want(i);
    if (t.dtype() == boolean) w = w != 0;
    bool ok = rtol == 0 ? got == w : std::abs(got - w) <= rtol * std::max(1.0, std::abs(w));
    expect(ok, "{}: element {} is {}, expected {} ({} {})", what, i, got, w, t.dtype(), t.shape());
  }
}

inline bool supports(ReduceOp op, Dtype dt) { return op != ReduceOp::avg || is_floating(dt); }

// The value rank r contributes at element i for reduce op `op`, and the expected reduction.
inline double contribution(ReduceOp op, Dtype dt, int r, int64_t i) {
  if (dt == boolean) return (r + i) % 3 == 0 ? 1 : 0;
  if (op == ReduceOp::product) return (r + i) % 2 + 1;  // 1 or 2: products of up to 8 fit bf16
  return (r * 3 + i) % 7 + 1;
}
inline double expected_reduction(ReduceOp op, Dtype dt, int n, int64_t i) {
  double acc = contribution(op, dt, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = contribution(op, dt, r, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc = dt == boolean ? (acc || v) : acc + v; break;
      case ReduceOp::product: acc = dt == boolean ? (acc && v) : acc * v; break;
      case ReduceOp::min: acc = std::min(acc, v); break;
      case ReduceOp::max: acc = std::max(acc, v); break;
    }
  }
  return op == ReduceOp::avg ? acc / n : acc;
}

// ---- collectives x dtypes ----

// Sizes around the mpi backend's thresholds: eager-sized pieces (4000 bytes, so 1000/1001 f32 and
// 8000/8001 f32 sit at one piece and at the last piece count), then whole messages, then the ring
// (from max(64 KiB, n x 32 KiB): 20000 f32 rings on 2 ranks only, 70001 f32 on up to 8).
inline void allreduce_all(ProcessGroup& pg, const std::vector<int64_t>& sizes = {0, 1, 13, 1000, 1001, 8000, 8001,
                                                                                  20000, 70001}) {
  const int n = pg.size(), r = pg.rank();
  for (Dtype dt : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      if (!supports(op, dt)) continue;
      for (int64_t numel : sizes) {
        Tensor t = make({numel}, dt, [&](int64_t i) { return contribution(op, dt, r, i); });
        WorkPtr w = pg.allreduce(t, op);
        w->wait();
        expect(w->is_completed() && w->is_success(), "allreduce work not complete after wait");
        expect(w->result().size() == 1 && w->result()[0].is_same(t), "allreduce result is not the tensor");
        expect_values(t, [&](int64_t i) { return expected_reduction(op, dt, n, i); },
                      fmt::format("allreduce({}) of {} elements on {} ranks", reduce_op_name(op), numel, n),
                      op == ReduceOp::avg ? tolerance(dt) : 0);
      }
    }
  }
}

inline void allreduce_coalesced_all(ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  for (Dtype dt : kAllDtypes) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      std::vector<Shape> shapes = {{3}, {2, 5}, {1}, {0}, {4, 1, 2}};
      TensorList ts;
      int64_t base = 0;
      std::vector<int64_t> bases;
      for (auto& s : shapes) {
        bases.push_back(base);
        ts.push_back(make(s, dt, [&](int64_t i) { return contribution(op, dt, r, base + i); }));
        base += numel_of(s);
      }
      // Issue two at once: they run in order and both complete.
      WorkPtr w1 = pg.allreduce_coalesced(ts, op);
      Tensor extra = make({5}, dt, [&](int64_t i) { return contribution(op, dt, r, i); });
      WorkPtr w2 = pg.allreduce(extra, op);
      w2->wait();
      w1->wait();
      expect(w1->result().size() == ts.size(), "coalesced result has {} tensors", w1->result().size());
      for (size_t k = 0; k < ts.size(); ++k) {
        expect_values(ts[k], [&](int64_t i) { return expected_reduction(op, dt, n, bases[k] + i); },
                      fmt::format("allreduce_coalesced({}) tensor {}", reduce_op_name(op), k));
      }
      expect_values(extra, [&](int64_t i) { return expected_reduction(op, dt, n, i); }, "allreduce after coalesced");
    }
  }
}

inline void broadcast_all(ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  for (Dtype dt : kAllDtypes) {
    for (int root = 0; root < n; ++root) {
      Tensor t = make({2, 9}, dt, [&](int64_t i) { return r == root ? (i * 7 + root) % 11 : 99; });
      pg.broadcast(t, root)->wait();
      expect_values(t, [&](int64_t i) { return (i * 7 + root) % 11; }, fmt::format("broadcast from root {}", root));
    }
  }
}

inline void allgather_all(ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  auto value = [](int src, int64_t i) { return (src * 5 + i) % 9; };
  for (Dtype dt : kAllDtypes) {
    Tensor in = make({3, 2}, dt, [&](int64_t i) { return value(r, i); });
    TensorList outs;
    for (int k = 0; k < n; ++k) outs.push_back(make({3, 2}, dt, [](int64_t) { return 0; }));
    WorkPtr w = pg.allgather(outs, in);
    Tensor flat = make({n * 6}, dt, [](int64_t) { return 0; });
    WorkPtr w2 = pg.allgather_into(flat, in);
    w->wait();
    w2->wait();
    for (int k = 0; k < n; ++k)
      expect_values(outs[k], [&](int64_t i) { return value(k, i); }, fmt::format("allgather output {}", k));
    expect_values(flat, [&](int64_t i) { return value(static_cast<int>(i / 6), i % 6); }, "allgather_into");
    expect(w->result().size() == static_cast<size_t>(n), "allgather result size {}", w->result().size());
  }
}

inline void reduce_scatter_all(ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  const int64_t m = 5;
  for (Dtype dt : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      if (!supports(op, dt)) continue;
      // Element i of chunk k from rank s is contribution(op, s, k * m + i).
      Tensor in = make({n * m}, dt, [&](int64_t j) { return contribution(op, dt, r, j); });
      TensorList ins;
      for (int k = 0; k < n; ++k) ins.push_back(make({m}, dt, [&](int64_t i) { return contribution(op, dt, r, k * m + i); }));
      Tensor out1 = make({m}, dt, [](int64_t) { return 0; });
      Tensor out2 = make({m}, dt, [](int64_t) { return 0; });
      WorkPtr w1 = pg.reduce_scatter_tensor(out1, in, op);
      WorkPtr w2 = pg.reduce_scatter(out2, ins, op);
      w1->wait();
      w2->wait();
      double rtol = op == ReduceOp::avg ? tolerance(dt) : 0;
      auto want = [&](int64_t i) { return expected_reduction(op, dt, n, r * m + i); };
      expect_values(out1, want, fmt::format("reduce_scatter_tensor({})", reduce_op_name(op)), rtol);
      expect_values(out2, want, fmt::format("reduce_scatter({})", reduce_op_name(op)), rtol);
    }
  }
}

inline void all_to_all_all(ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  const int64_t cols = 3;
  // Row q sent from src to dst carries src * 100 + dst * 10 + q (per column + c).
  auto cell = [](int src, int dst, int64_t q, int64_t c) { return src * 16 + dst * 4 + q * 2 + c; };
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64}) {
    for (bool uneven : {false, true}) {
      auto rows = [&](int src, int dst) -> int64_t { return uneven ? (src + 2 * dst) % 3 : 2; };
      AllToAllSplits splits;
      int64_t in_rows = 0, out_rows = 0;
      for (int k = 0; k < n; ++k) {
        if (uneven) {
          splits.input.push_back(rows(r, k));
          splits.output.push_back(rows(k, r));
        }
        in_rows += rows(r, k);
        out_rows += rows(k, r);
      }
      std::vector<double> in_vals, want;
      for (int k = 0; k < n; ++k)
        for (int64_t q = 0; q < rows(r, k); ++q)
          for (int64_t c = 0; c < cols; ++c) in_vals.push_back(cell(r, k, q, c) % 64);
      for (int k = 0; k < n; ++k)
        for (int64_t q = 0; q < rows(k, r); ++q)
          for (int64_t c = 0; c < cols; ++c) want.push_back(cell(k, r, q, c) % 64);
      Tensor in = make({in_rows, cols}, dt, [&](int64_t i) { return in_vals[i]; });
      Tensor out = make({out_rows, cols}, dt, [](int64_t) { return -1; });
      pg.all_to_all(out, in, splits)->wait();
      expect_values(out, [&](int64_t i) { return want[i]; }, fmt::format("all_to_all ({})", uneven ? "uneven" : "equal"));
    }
  }
}

inline void barrier_and_p2p(ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  pg.barrier()->wait();
  if (n == 1) return;
  for (Dtype dt : kAllDtypes) {
    int to = (r + 1) % n, from = (r + n - 1) % n;
    Tensor out = make({4, 2}, dt, [&](int64_t i) { return (r + i) % 2; });
    Tensor in = make({4, 2}, dt, [](int64_t) { return 0; });
    // Even ranks send first, odd ranks receive first: both orders must work.
    WorkPtr a, b;
    if (r % 2 == 0) {
      a = pg.send(out, to, 3);
      b = pg.recv(in, from, 3);
    } else {
      b = pg.recv(in, from, 3);
      a = pg.send(out, to, 3);
    }
    a->wait();
    b->wait();
    expect_values(in, [&](int64_t i) { return (from + i) % 2; }, fmt::format("recv from rank {}", from));
  }
}

inline void work_continuations(ProcessGroup& pg) {
  const int n = pg.size();
  Tensor t = make({6}, f32, [](int64_t i) { return static_cast<double>(i); });
  WorkPtr w = pg.allreduce(t, ReduceOp::sum);
  // The comm-hook pattern: chain a division after the allreduce.
  WorkPtr chained = w->then([n](Work& done) {
    Tensor x = done.result()[0];
    auto* p = x.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] /= static_cast<float>(n);
    return TensorList{x};
  });
  chained->wait();
  expect(w->is_completed(), "the first work is complete when its continuation is");
  expect_values(chained->result()[0], [](int64_t i) { return static_cast<double>(i); }, "allreduce then divide");
  // A continuation that throws fails the chained work, not the original.
  WorkPtr bad = w->then([](Work&) -> TensorList { tandem::fail("[hook] boom"); });
  bool threw = false;
  try {
    bad->wait();
  } catch (const Error& e) {
    threw = std::string(e.what()).find("[hook] boom") != std::string::npos;
  }
  expect(threw && w->is_success() && !bad->is_success(), "a throwing continuation fails only the chained work");
  WorkPtr ready = Work::completed({t});
  expect(ready->is_completed() && ready->result()[0].is_same(t), "Work::completed");
}

inline void sub_groups(ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  std::vector<int> evens, reversed;
  for (int k = 0; k < n; k += 2) evens.push_back(k);
  for (int k = n - 1; k >= 0; --k) reversed.push_back(k);
  ProcessGroupPtr even = pg.new_group(evens);
  ProcessGroupPtr rev = pg.new_group(reversed);
  expect((even != nullptr) == (r % 2 == 0), "rank {} membership of the even group", r);
  expect(rev && rev->rank() == n - 1 - r && rev->size() == n, "reversed group rank {} size {}", rev ? rev->rank() : -1,
         rev ? rev->size() : -1);
  if (even) {
    expect(even->rank() == r / 2 && even->size() == static_cast<int>(evens.size()), "even group rank/size");
    allreduce_all(*even, {1, 7, 70001});
    broadcast_all(*even);
  }
  // The parent keeps working, interleaved with the children.
  Tensor t = make({3}, i64, [&](int64_t) { return r; });
  pg.allreduce(t)->wait();
  expect_values(t, [&](int64_t) { return n * (n - 1) / 2; }, "parent allreduce after new_group");
  Tensor u = make({2}, f32, [&](int64_t) { return rev->rank(); });
  rev->broadcast(u, 0)->wait();  // rev's rank 0 is the parent's last rank
  expect_values(u, [](int64_t) { return 0; }, "broadcast on the reversed group");
}

// ---- misuse ----

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

inline void expect_error(const std::string& msg, const std::vector<std::string>& parts, const std::string& what) {
  expect(!msg.empty(), "{}: expected an error, got none", what);
  for (auto& p : parts) expect(msg.find(p) != std::string::npos, "{}: error '{}' lacks '{}'", what, msg, p);
}

inline void argument_errors(ProcessGroup& pg) {
  const int n = pg.size();
  Tensor base = make({3, 4}, f32, [](int64_t) { return 1; });
  Tensor transposed = make_view(base, {4, 3}, {1, 4}, 0);
  expect_error(error_of([&] { pg.allreduce(transposed); }), {"[allreduce]", "contiguous", "[4, 3]"}, "non-contiguous");
  expect_error(error_of([&] { pg.allreduce(make({2}, i32, [](int64_t) { return 1; }), ReduceOp::avg); }),
               {"[allreduce]", "avg", "i32"}, "avg on ints");
  expect_error(error_of([&] { pg.broadcast(base, n); }), {"[broadcast]", "root"}, "bad root");
  expect_error(error_of([&] { pg.allreduce_coalesced({base, make({2}, f64, [](int64_t) { return 0; })}); }),
               {"[allreduce_coalesced]", "f64", "f32"}, "coalesced dtypes");
  if (n > 1) {
    expect_error(error_of([&] { pg.allgather({base}, base); }), {"[allgather]", "one output per rank"},
                 "allgather list size");
    Tensor a = make({3, 2}, f32, [](int64_t) { return 0; });
    expect_error(error_of([&] { pg.all_to_all(a, a, {{3}, {3}}); }), {"[all_to_all]", "one entry per rank"},
                 "all_to_all splits");
    expect_error(error_of([&] { pg.send(base, pg.rank()); }), {"[send]", "another rank"}, "send to self");
    expect_error(error_of([&] { pg.recv(base, pg.size()); }), {"[recv] src", "another rank"}, "recv from outside");
    expect_error(error_of([&] { pg.send(base, (pg.rank() + 1) % pg.size(), -1); }), {"[send] tag -1"}, "negative tag");
  }
  expect_error(error_of([&] { pg.new_group({0, 0}); }), {"[new_group]", "twice"}, "new_group duplicates");
  // None of that consumed a sequence number: the group still works.
  Tensor t = make({2}, f32, [](int64_t) { return 1; });
  pg.allreduce(t)->wait();
  expect_values(t, [&](int64_t) { return n; }, "allreduce after argument errors");
}

// Rank 0 calls a different collective than the others; with debug checks every rank's wait names
// what each rank called, and the group stays usable.
inline void mismatch_detection(ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  if (n == 1) return;
  pg.set_debug_checks(true);
  Tensor t = make({4}, f32, [](int64_t) { return 1; });
  Tensor d = make({4}, f64, [](int64_t) { return 1; });
  std::string msg = error_of([&] { (r == 0 ? pg.allreduce(d) : pg.allreduce(t))->wait(); });
  expect_error(msg, {"collective mismatch", "rank 0 called allreduce(sum) f64 [4]", "called allreduce(sum) f32 [4]"},
               "dtype mismatch");
  msg = error_of([&] { (r == n - 1 ? pg.broadcast(t, 0) : pg.allreduce(t, ReduceOp::max))->wait(); });
  expect_error(msg, {"collective mismatch", fmt::format("rank {} called broadcast(root 0) f32 [4]", n - 1),
                     "called allreduce(max) f32 [4]"}, "op mismatch");
  Tensor big = make({5}, f32, [](int64_t) { return 1; });
  msg = error_of([&] { pg.allreduce(r == 0 ? big : t)->wait(); });
  expect_error(msg, {"collective mismatch", "rank 0 called allreduce(sum) f32 [5]"}, "shape mismatch");
  // all_to_all splits that disagree between a sender and its receiver.
  AllToAllSplits s;
  for (int k = 0; k < n; ++k) {
    s.input.push_back(1);
    s.output.push_back(k == 0 && r == 1 ? 2 : 1);  // rank 1 expects 2 rows from rank 0, which sends 1
  }
  int64_t out_rows = n + (r == 1 ? 1 : 0);
  msg = error_of([&] {
    pg.all_to_all(make({out_rows, 2}, f32, [](int64_t) { return 0; }), make({n, 2}, f32, [](int64_t) { return 0; }), s)
        ->wait();
  });
  expect_error(msg, {"[all_to_all] split mismatch"}, "split mismatch");
  pg.set_debug_checks(false);
  Tensor ok = make({3}, f32, [](int64_t) { return 2; });
  pg.allreduce(ok)->wait();
  expect_values(ok, [&](int64_t) { return 2 * n; }, "allreduce after mismatches");
}

// On a copy of the group (a timeout breaks it): ranks >= 1 (threads: the upper half) skip a
// collective; the ones that called it time out naming the collective, its number and, where
// known, the missing ranks. `exact_missing` is false for the mpi backend without debug checks.
// A small allreduce issued while a peer is late returns at once (it may start on the issuing
// thread, which hands it to the communication thread when the peer is not there): its Work is
// still running, wait(timeout) says so, and the ops issued behind it complete in order. The same
// under an AsyncIssueGuard, which always queues.
inline void late_peer(ProcessGroup& pg) {
  using namespace std::chrono;
  const int n = pg.size(), r = pg.rank();
  if (n == 1) return;
  const bool late = r == n - 1;
  for (bool guarded : {false, true}) {
    std::optional<AsyncIssueGuard> guard;
    if (guarded) guard.emplace();
    pg.barrier()->wait();
    if (late) std::this_thread::sleep_for(milliseconds(300));
    Tensor a = make({1000}, f32, [&](int64_t i) { return contribution(ReduceOp::sum, f32, r, i); });
    Tensor b = make({13}, i64, [&](int64_t i) { return contribution(ReduceOp::max, i64, r, i); });
    const auto start = steady_clock::now();
    WorkPtr wa = pg.allreduce(a);
    WorkPtr wb = pg.allreduce(b, ReduceOp::max);
    const double issue_ms = duration<double, std::milli>(steady_clock::now() - start).count();
    if (!late) {
      expect(issue_ms < 150, "issuing two small allreduces with a peer 300 ms late took {} ms (guard {})", issue_ms,
             guarded);
      expect(!wa->is_completed(), "an allreduce completed while a peer was still asleep");
      std::string msg;
      try {
        wa->wait(milliseconds(10));
      } catch (const Error& e) {
        msg = e.what();
      }
      expect(msg.find("timed out after 10 ms (the operation is still running)") != std::string::npos,
             "wait(10 ms) on a running allreduce: '{}'", msg);
    }
    wb->wait();
    expect(wa->is_completed(), "an allreduce issued first is complete when the one behind it is");
    expect_values(a, [&](int64_t i) { return expected_reduction(ReduceOp::sum, f32, n, i); }, "late-peer sum", 0);
    expect_values(b, [&](int64_t i) { return expected_reduction(ReduceOp::max, i64, n, i); }, "late-peer max", 0);
  }
}

// Caller progress (a group whose progress_mode() is "caller"; the mpi group where the rank has no
// core to spare): ops that start on the issuing thread stay pending on the group and advance when
// a thread polls. Nobody waiting, the communication thread's stall polls still finish them; with
// poll() alone, a mix of pending ops (the ring and recursive doubling) and one the communication
// thread runs (a broadcast) completes in issue order with the right values; a wait() on a then()
// of a pending op advances it. In "thread" mode there is nothing to check beyond the other cases.
inline void caller_progress(ProcessGroup& pg) {
  using namespace std::chrono;
  const int n = pg.size(), r = pg.rank();
  if (n == 1 || pg.progress_mode() != "caller") return;
  auto sum_input = [&](int64_t numel) {
    return make({numel}, f32, [&](int64_t i) { return contribution(ReduceOp::sum, f32, r, i); });
  };
  auto expect_sum = [&](const Tensor& t, const std::string& what) {
    expect_values(t, [&](int64_t i) { return expected_reduction(ReduceOp::sum, f32, n, i); }, what, 0);
  };
  AsyncIssueGuard async_issue;
  {
    // Nobody polls: the communication thread does, once a millisecond.
    Tensor big = sum_input(300'000), small = sum_input(100);
    WorkPtr wb = pg.allreduce(big), ws = pg.allreduce(small);
    const auto deadline = steady_clock::now() + seconds(10);
    while (!ws->is_completed() && steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
    expect(wb->is_completed() && ws->is_completed(), "pending allreduces nobody polled did not complete in 10 s");
    expect_sum(big, "stall-polled ring allreduce");
    expect_sum(small, "stall-polled small allreduce");
  }
  {
    Tensor a = sum_input(200'000), c = sum_input(70'000), d = sum_input(33);
    Tensor b = make({1000}, f32, [&](int64_t i) { return r == 0 ? static_cast<double>(i) : -1.0; });
    WorkPtr wa = pg.allreduce(a), wbc = pg.broadcast(b, 0), wc = pg.allreduce(c), wd = pg.allreduce(d);
    const auto deadline = steady_clock::now() + seconds(10);
    while (!wd->is_completed() && steady_clock::now() < deadline) pg.poll();
    expect(wd->is_completed(), "polling did not complete the last of four collectives in 10 s");
    expect(wa->is_completed() && wbc->is_completed() && wc->is_completed(),
           "the last collective completed before an earlier one");
    for (const WorkPtr& w : {wa, wbc, wc, wd}) w->wait();
    expect_sum(a, "polled ring allreduce");
    expect_sum(c, "polled ring allreduce behind a broadcast");
    expect_sum(d, "polled small allreduce");
    expect_values(b, [](int64_t i) { return static_cast<double>(i); }, "broadcast between pending allreduces", 0);
  }
  {
    Tensor big = sum_input(150'000);
    WorkPtr w = pg.allreduce(big)->then([](Work& done) { return done.result(); });
    w->wait();
    expect_sum(big, "allreduce waited through then()");
  }
}

// Under a BlockingIssueGuard every collective has finished when its call returns: ops of every
// kind and size (the ring too) complete with the right values; an op issued while the group is
// busy with one a late peer holds up queues behind it and the call waits for both; an
// AsyncIssueGuard on the same thread wins (the call returns at once); a peer that never arrives
// fails the call's Work with the timeout, which wait() rethrows.
inline void blocking_issue(ProcessGroup& pg) {
  using namespace std::chrono;
  const int n = pg.size(), r = pg.rank();
  expect(pg.supports_blocking_issue(kCPU), "group {} says a BlockingIssueGuard does not hold for CPU tensors", pg.name());
  {
    BlockingIssueGuard blocking;
    for (int64_t numel : {1, 1001, 70001}) {
      Tensor t = make({numel}, f32, [&](int64_t i) { return contribution(ReduceOp::sum, f32, r, i); });
      WorkPtr w = pg.allreduce(t);
      expect(w->is_completed(), "a {}-element allreduce under a BlockingIssueGuard is not complete at return", numel);
      expect_values(t, [&](int64_t i) { return expected_reduction(ReduceOp::sum, f32, n, i); },
                    fmt::format("blocking allreduce of {} elements on {} ranks", numel, n));
    }
    Tensor b = make({5}, i64, [&](int64_t i) { return r == n - 1 ? i + 7 : 0; });
    expect(pg.broadcast(b, n - 1)->is_completed(), "a blocking broadcast is not complete at return");
    expect_values(b, [](int64_t i) { return i + 7; }, "blocking broadcast");
    Tensor out = make({2 * n}, f64, [](int64_t) { return -1; });
    expect(pg.allgather_into(out, make({2}, f64, [&](int64_t i) { return r * 2 + i; }))->is_completed(),
           "a blocking allgather is not complete at return");
    expect_values(out, [](int64_t i) { return static_cast<double>(i); }, "blocking allgather");
    expect(pg.barrier()->is_completed(), "a blocking barrier is not complete at return");
    // A continuation on a Work complete at return runs at once, on this thread.
    bool ran = false;
    pg.barrier()->then([&](Work&) {
      ran = true;
      return TensorList{};
    });
    expect(ran, "a continuation on a blocking collective did not run at once");
    // Every dtype and op through the blocking path (allreduce_all waits anyway).
    allreduce_all(pg, {0, 13, 8001});
  }
  if (n == 1) return;
  // A peer 300 ms late: the first allreduce (issued without the guard) returns at once and keeps
  // the group busy; the blocking one behind it queues, and its call returns when both are done.
  const bool late = r == n - 1;
  pg.barrier()->wait();
  if (late) std::this_thread::sleep_for(milliseconds(300));
  Tensor a = make({1000}, f32, [&](int64_t i) { return contribution(ReduceOp::sum, f32, r, i); });
  Tensor c = make({300000}, f32, [&](int64_t i) { return contribution(ReduceOp::sum, f32, r, i); });
  WorkPtr wa = pg.allreduce(a);
  WorkPtr wc;
  {
    BlockingIssueGuard blocking;
    wc = pg.allreduce(c);
  }
  expect(wa->is_completed() && wc->is_completed(), "a blocking allreduce queued behind a running one returned early");
  expect_values(a, [&](int64_t i) { return expected_reduction(ReduceOp::sum, f32, n, i); }, "allreduce before");
  expect_values(c, [&](int64_t i) { return expected_reduction(ReduceOp::sum, f32, n, i); }, "blocking allreduce after");
  // AsyncIssueGuard wins.
  pg.barrier()->wait();
  if (late) std::this_thread::sleep_for(milliseconds(300));
  {
    BlockingIssueGuard blocking;
    AsyncIssueGuard async;
    Tensor d = make({10}, f32, [&](int64_t i) { return contribution(ReduceOp::sum, f32, r, i); });
    const auto start = steady_clock::now();
    WorkPtr wd = pg.allreduce(d);
    const double issue_ms = duration<double, std::milli>(steady_clock::now() - start).count();
    if (!late) expect(issue_ms < 150 && !wd->is_completed(), "under both guards the issue blocked ({} ms)", issue_ms);
    wd->wait();
    expect_values(d, [&](int64_t i) { return expected_reduction(ReduceOp::sum, f32, n, i); }, "both guards");
  }
  // A peer that never arrives (on a copy of the group: the timeout breaks it): the blocking call
  // returns after the timeout with the Work failed, and wait() says why.
  std::vector<int> all;
  for (int k = 0; k < n; ++k) all.push_back(k);
  ProcessGroupPtr g = pg.new_group(all);
  g->set_timeout(milliseconds(400));
  if (r == 0) {
    BlockingIssueGuard blocking;
    Tensor t = make({8}, f32, [](int64_t) { return 1; });
    WorkPtr w = g->allreduce(t);
    expect(w->is_completed() && !w->is_success(), "a blocking allreduce with absent peers did not fail at return");
    expect_error(error_of([&] { w->wait(); }), {"allreduce #0", "timed out after 400 ms"}, "blocking timeout");
  }
  pg.barrier()->wait();
}

inline void timeout_reporting(ProcessGroup& pg, bool debug) {
  const int n = pg.size(), r = pg.rank();
  if (n == 1) return;
  std::vector<int> all;
  for (int k = 0; k < n; ++k) all.push_back(k);
  ProcessGroupPtr g = pg.new_group(all);
  g->set_timeout(std::chrono::milliseconds(600));
  g->set_debug_checks(debug);
  Tensor t = make({8}, f32, [](int64_t) { return 1; });
  g->allreduce(t)->wait();  // #0 works
  const int callers = (n + 1) / 2;
  std::vector<int> missing;
  for (int k = callers; k < n; ++k) missing.push_back(k);
  if (r < callers) {
    auto start = std::chrono::steady_clock::now();
    std::string msg = error_of([&] { g->allreduce(t)->wait(); });
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<std::string> parts = {"allreduce #1", "timed out after 600 ms"};
    if (g->backend() == "threads" || debug) {
      parts.push_back(fmt::format("{} {} did not arrive", missing.size() == 1 ? "rank" : "ranks", fmt::join(missing, ", ")));
    } else {
      // Without debug checks the mpi ranks are asked where they are (the peer responders): each
      // missing one is named with the last collective it issued on the group.
      for (int k : missing)
        parts.push_back(fmt::format("rank {} did not arrive: its last collective on this group is #0, allreduce sum "
                                    "f32[8], completed", k));
      for (int k = 0; k < callers; ++k)
        if (k != r) parts.push_back(fmt::format("issued it too"));
    }
    parts.push_back("TANDEM_FLIGHT_RECORDER");
    expect_error(msg, parts, "timeout");
    expect(waited < 10, "the timeout took {} s", waited);
    expect(g->is_broken(), "a timed-out group reports itself broken");
    expect_error(error_of([&] { g->barrier()->wait(); }), {"broken", "allreduce #1"}, "use of a broken group");
  }
  // Receives time out too, and a cancelled receive leaves the group usable.
  ProcessGroupPtr h = pg.new_group(all);
  h->set_timeout(std::chrono::milliseconds(400));
  if (r == 0) {
    std::string msg = error_of([&] { h->recv(t, 1, 5)->wait(); });
    expect_error(msg, {"recv #0 from rank 1 (tag 5)", "timed out after 400 ms", "rank 1 did not send"}, "recv timeout");
    expect(!h->is_broken(), "a cancelled receive leaves the group usable");
  }
  h->set_timeout(std::chrono::milliseconds(20000));
  h->barrier()->wait();
  Tensor u = make({2}, f32, [](int64_t) { return 1; });
  h->allreduce(u)->wait();
  expect_values(u, [&](int64_t) { return n; }, "allreduce after a recv timeout");
  // A receive tensor that does not match what was sent.
  if (r == 0) h->send(make({3}, f32, [](int64_t) { return 1; }), 1, 9)->wait();
  if (r == 1) {
    std::string msg = error_of([&] { h->recv(make({4}, f32, [](int64_t) { return 0; }), 0, 9)->wait(); });
    expect_error(msg, {"[recv]", "rank 0 sent", "f32 [4]"}, "recv size mismatch");
  }
  h->barrier()->wait();
}

}  // namespace dist_cases
