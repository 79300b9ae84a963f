// The dist layer on the threads backend: every collective x dtype with 1, 2, 3, 4 and 8 ranks,
// misuse (argument errors, mismatched collectives, timeouts), error propagation and init().
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <limits>

#include "dist_cases.h"
#include "tandem.h"

using namespace tandem;
using namespace tandem::dist;
using namespace dist_cases;

namespace {
ThreadsOptions test_options() {
  ThreadsOptions o;
  o.timeout = std::chrono::seconds(30);  // a bug fails the test instead of hanging it
  return o;
}
}  // namespace

TEST_CASE("dist threads: every collective x dtype", "[dist]") {
  for (int n : {1, 2, 3, 4, 8}) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(run_threads(n, [](ProcessGroup& pg) {
      allreduce_all(pg);
      allreduce_coalesced_all(pg);
      broadcast_all(pg);
      allgather_all(pg);
      reduce_scatter_all(pg);
      all_to_all_all(pg);
      barrier_and_p2p(pg);
      work_continuations(pg);
    }, test_options()));
  }
}

TEST_CASE("dist threads: sub-groups", "[dist]") {
  for (int n : {1, 2, 3, 4, 8}) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(run_threads(n, [](ProcessGroup& pg) { sub_groups(pg); }, test_options()));
  }
}

TEST_CASE("dist threads: argument errors", "[dist]") {
  for (int n : {1, 2, 3}) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(run_threads(n, [](ProcessGroup& pg) { argument_errors(pg); }, test_options()));
  }
}

// Found by tools/fuzz/fuzz_collectives (corpus/collectives/crash-all-to-all-split-overflow): splits
// that sum past int64 overflowed the total (undefined behaviour) before it was compared with the
// rows; now the issuing rank is refused, and its peers stop at once.
TEST_CASE("dist threads: all_to_all splits that sum past int64", "[dist][fuzz]") {
  const int64_t big = std::numeric_limits<int64_t>::max();
  for (int n : {2, 3}) {
    INFO("ranks: " << n);
    std::string in_error, out_error;
    REQUIRE_THROWS_WITH(run_threads(n, [&](ProcessGroup& pg) {
      Tensor t = zeros({2 * n, 2});  // equal splits of 2 rows work; the listed ones overflow
      std::vector<int64_t> wild(n, 2);
      wild[n - 1] = big;
      if (pg.rank() == 0) {
        in_error = error_of([&] { pg.all_to_all(t, t, {{}, wild}); });
        out_error = error_of([&] { pg.all_to_all(t, t, {wild, {}}); });
        throw Error("rank 0 gives up");
      }
      pg.barrier()->wait();  // fails as soon as rank 0 throws
    }, test_options()), Catch::Contains("rank 0 gives up"));
    REQUIRE_THAT(in_error, Catch::Contains("[all_to_all] input splits") && Catch::Contains("sum past int64"));
    REQUIRE_THAT(out_error, Catch::Contains("[all_to_all] output splits") && Catch::Contains("sum past int64"));
  }
}

TEST_CASE("dist threads: mismatched collectives name what each rank called", "[dist]") {
  for (int n : {2, 3, 4}) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(run_threads(n, [](ProcessGroup& pg) { mismatch_detection(pg); }, test_options()));
  }
  // Without debug checks the threads backend still refuses mismatched calls (it must, for safety).
  std::atomic<int> errors{0};
  REQUIRE_NOTHROW(run_threads(2, [&](ProcessGroup& pg) {
    Tensor t = make({pg.rank() + 1}, f32, [](int64_t) { return 1; });
    std::string msg = error_of([&] { pg.allreduce(t)->wait(); });
    if (msg.find("rank 0 called allreduce(sum) f32 [1]; rank 1 called allreduce(sum) f32 [2]") != std::string::npos)
      ++errors;
  }, test_options()));
  REQUIRE(errors == 2);
}

TEST_CASE("dist threads: timeouts name the collective and the missing ranks", "[dist]") {
  for (int n : {2, 3, 4}) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(run_threads(n, [](ProcessGroup& pg) { timeout_reporting(pg, false); }, test_options()));
  }
}

TEST_CASE("dist threads: a rank that throws stops the others at once", "[dist]") {
  auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(run_threads(3, [](ProcessGroup& pg) {
    if (pg.rank() == 1) tandem::fail("[test] rank 1 gives up");
    Tensor t = make({4}, f32, [](int64_t) { return 1; });
    pg.allreduce(t)->wait();
  }, test_options()), Catch::Contains("[test] rank 1 gives up"));
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(elapsed < 10);  // far below the 30 s timeout

  // What the other ranks see.
  std::atomic<int> stopped{0};
  REQUIRE_THROWS(run_threads(2, [&](ProcessGroup& pg) {
    if (pg.rank() == 0) tandem::fail("[test] rank 0 gives up");
    Tensor t = make({4}, f32, [](int64_t) { return 1; });
    std::string msg = error_of([&] { pg.allreduce(t)->wait(); });
    if (msg.find("allreduce #0") != std::string::npos && msg.find("rank 0 failed: [test] rank 0 gives up") != std::string::npos)
      ++stopped;
  }, test_options()));
  REQUIRE(stopped == 1);
}

TEST_CASE("dist threads: Work::wait with a timeout and waits inside continuations", "[dist]") {
  std::atomic<bool> rank0_gave_up{false}, continuation_attached{false};
  std::atomic<int> checks{0};
  REQUIRE_NOTHROW(run_threads(2, [&](ProcessGroup& pg) {
    Tensor t = make({4}, f32, [&](int64_t) { return pg.rank() + 1; });
    if (pg.rank() == 0) {
      WorkPtr w = pg.allreduce(t);
      std::string msg = error_of([&] { w->wait(std::chrono::milliseconds(50)); });
      if (msg.find("wait on allreduce #0") != std::string::npos && msg.find("timed out after 50 ms") != std::string::npos)
        ++checks;
      if (!w->is_completed()) ++checks;
      rank0_gave_up = true;
      w->wait();  // rank 1 now joins; the collective itself was never cancelled
      expect_values(t, [](int64_t) { return 3; }, "allreduce after a wait timeout");
    } else {
      while (!rank0_gave_up) std::this_thread::yield();
      pg.allreduce(t)->wait();
    }
    // A continuation runs on the communication thread; waiting there for later work would deadlock.
    // Rank 1 joins the barrier only after rank 0 attached its continuation, so that barrier cannot
    // already be complete at then() (which would run the continuation inline on the caller).
    if (pg.rank() == 0) {
      WorkPtr first = pg.barrier();
      std::string inner;
      WorkPtr chained = first->then([&](Work&) {
        inner = error_of([&] { pg.barrier()->wait(); });
        return TensorList{};
      });
      continuation_attached = true;
      chained->wait();
      if (inner.find("would deadlock") != std::string::npos) ++checks;
    } else {
      while (!continuation_attached) std::this_thread::yield();
      pg.barrier()->wait();  // pairs with rank 0's first barrier
      pg.barrier()->wait();  // pairs with the barrier rank 0 issued inside its continuation
    }
    pg.barrier()->wait();
  }, test_options()));
  REQUIRE(checks == 3);  // the wait timeout (2 checks on rank 0) and the deadlock check
}

// The logic the nccl backend's Works use (Work::order_on_device), checked without a device: wait()
// orders "the stream" (here: counts) instead of blocking, the result is there from the launch and
// is never replaced, and errors the operation already reported are still rethrown.
TEST_CASE("dist: a device-ordered Work waits on the stream, not the host", "[dist]") {
  Tensor launched = make({3}, f32, [](int64_t i) { return static_cast<double>(i); });
  std::atomic<int> stream_waits{0};
  auto work = std::make_shared<Work>("allreduce #0 on group world (test)");
  work->order_on_device({launched}, [&] { ++stream_waits; });
  REQUIRE(work->is_device_ordered());
  REQUIRE_THROWS_WITH(work->order_on_device({launched}, [] {}), Catch::Contains("twice"));
  const auto start = std::chrono::steady_clock::now();
  work->wait();  // not complete on the host: would block forever if it waited there
  work->wait(std::chrono::milliseconds(1));
  REQUIRE(work->result().at(0).is_same(launched));
  REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  REQUIRE(stream_waits == 3);  // wait(), wait(timeout), result()
  REQUIRE(!work->is_completed());
  // A continuation still runs when the backend completes the Work on the host; the result it sees
  // is the launch's, whatever the backend passes.
  std::atomic<bool> continued{false};
  WorkPtr next = work->then([&](Work& w) {
    continued = w.result().at(0).is_same(launched);
    return TensorList{};
  });
  work->mark_completed({make({1}, f32, [](int64_t) { return 7; })});
  REQUIRE(continued);
  REQUIRE(work->result().at(0).is_same(launched));
  work->wait();
  REQUIRE(stream_waits == 3);  // complete on the host: nothing left to order
  REQUIRE_THROWS_WITH(work->order_on_device({launched}, [] {}), Catch::Contains("after it completed"));

  // A failure reported before the wait is rethrown; the stream is not ordered on a failed Work.
  auto failed = std::make_shared<Work>("allreduce #1 on group world (test)");
  failed->order_on_device({launched}, [&] { ++stream_waits; });
  failed->mark_failed(std::make_exception_ptr(Error("[dist] allreduce #1 failed: the group is broken")));
  REQUIRE_THROWS_WITH(failed->wait(), Catch::Contains("the group is broken"));
  REQUIRE_THROWS_WITH(failed->result(), Catch::Contains("the group is broken"));
  REQUIRE(stream_waits == 3);
}

TEST_CASE("dist threads: a small allreduce with a late peer returns at once, and completes in order", "[dist]") {
  for (int n : {2, 3}) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(run_threads(n, [](ProcessGroup& pg) { late_peer(pg); }, test_options()));
  }
}

TEST_CASE("dist threads: a BlockingIssueGuard finishes each collective before the call returns", "[dist]") {
  for (int n : {1, 2, 3, 4}) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(run_threads(n, [](ProcessGroup& pg) { blocking_issue(pg); }, test_options()));
  }
}

TEST_CASE("dist init: a world of size 1 without mpirun, and backend selection", "[dist]") {
  if (launched_by_mpi()) return;  // this test is about running without a launcher
  ProcessGroupPtr w = init();
  REQUIRE(w->size() == 1);
  REQUIRE(w->rank() == 0);
  REQUIRE(world_info().local_size == 1);
  REQUIRE(init() == w);
  Tensor t = make({3}, f32, [](int64_t i) { return static_cast<double>(i); });
  // A world of one reduces over nothing: done on the calling thread, complete when issued.
  WorkPtr done = dist::allreduce(t, ReduceOp::avg);
  REQUIRE(done->is_completed());
  REQUIRE(done->result()[0].is_same(t));
  expect_values(t, [](int64_t i) { return static_cast<double>(i); }, "size-1 allreduce");
  {
    AsyncIssueGuard queued;  // through the communication thread instead: the same result
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::product}) {
      WorkPtr w1 = dist::allreduce(t, op);
      w1->wait();
      REQUIRE(w1->result()[0].is_same(t));
      expect_values(t, [](int64_t i) { return static_cast<double>(i); }, "size-1 allreduce, queued");
    }
  }
  REQUIRE_NOTHROW(allreduce_all(*w));
  finalize();
  REQUIRE(!is_initialized());
  REQUIRE_THROWS_WITH(world(), Catch::Contains("[dist] no world group"));
#ifndef TANDEM_WITH_CUDA
  REQUIRE_THROWS_WITH(init(InitOptions{"nccl", {}, {}}), Catch::Contains("[dist] the nccl backend needs a CUDA build"));
#endif
  REQUIRE_THROWS_WITH(init(InitOptions{"gloo", {}, {}}), Catch::Contains("unknown backend 'gloo'"));
}
