// DDP on the threads backend: N model replicas in one process, each rank on its own thread with
// its own autograd state. The cases of ddp_case_table.h run here at several world sizes (and under
// mpirun in test_ddp_mpi); the ones after them need the threads backend.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <initializer_list>

#include "ddp_case_table.h"
#include "forwarding_group.h"

using namespace tandem;
using namespace tandem::dist;
using namespace ddp_cases;
using nn::mse_loss;

namespace {
void on_threads(int n, const std::function<void(ProcessGroupPtr)>& fn, int timeout_s = 60) {
  ThreadsOptions o;
  o.timeout = std::chrono::seconds(timeout_s);
  run_threads(n, [&](ProcessGroup& g) { fn(borrow(g)); }, o);
}

int threads_timeout_s(Wait w) {
  switch (w) {
    case Wait::normal: return 60;
    case Wait::shorter: return 20;
    case Wait::breaks_group: return 2;
  }
  return 60;
}

// A table case: each step at each of its world sizes, on a fresh world of threads.
void run_steps(std::initializer_list<Step> steps) {
  int k = 0;
  for (const Step& s : steps) {
    INFO("step " << ++k << " of " << steps.size());
    for (int n : s.thread_ranks) {
      INFO(n << " ranks");
      const auto start = std::chrono::steady_clock::now();
      REQUIRE_NOTHROW(on_threads(n, s.run, threads_timeout_s(s.wait)));
      if (s.wait == Wait::breaks_group) CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
    }
  }
}
}  // namespace

#define TANDEM_DDP_THREADS_CASE(threads_name, threads_tags, mpi_name, ...) \
  TEST_CASE(threads_name, threads_tags) { run_steps({__VA_ARGS__}); }
TANDEM_DDP_CASES(TANDEM_DDP_THREADS_CASE)
#undef TANDEM_DDP_THREADS_CASE

// Only on the threads backend from here on.

namespace {
// Forwards to a real group and counts what DDP and the comm hooks ask of its step stream
// (ProcessGroup::run_on_step_stream / join_step_stream; on the nccl backend that stream is what
// keeps device work off NCCL's stream and off the watchdog thread's).
class StepStreamSpy final : public ForwardingGroup {
 public:
  explicit StepStreamSpy(ProcessGroupPtr inner) : ForwardingGroup(std::move(inner)) {}
  std::atomic<int> steps{0}, joins{0}, kept{0};

  void run_on_step_stream(const std::function<TensorList()>& fn) override {
    ++steps;
    kept += static_cast<int>(fn().size());
  }
  void join_step_stream() override { ++joins; }
};
}  // namespace

// The compress hooks' cast back and the optimizer steps in backward run through the group's step
// stream, and every synchronised backward joins it (before this, the cast ran on whatever stream
// the watchdog thread had current, and DDP joined only with the optimizer in backward).
TEST_CASE("ddp: compress hooks and steps in backward go through the step stream, joined every backward", "[ddp]") {
  ThreadsOptions o;
  o.timeout = std::chrono::seconds(60);
  auto spy = std::make_shared<StepStreamSpy>(make_thread_world(1, o)[0]);
  auto model = make_net(f32);
  model->never->weight.requires_grad_(false);  // every parameter then receives a gradient
  model->never->bias.requires_grad_(false);
  DistributedDataParallel ddp(model, spy, {});
  ddp.register_comm_hook(hooks::fp16_compress);
  for (int step = 0; step < 3; ++step) {
    Tensor loss = mse_loss(ddp(inputs(0, 4, 8, f32)), targets(0, 4, 4, f32));
    const int joins_before = spy->joins;
    loss.backward();
    REQUIRE(spy->joins > joins_before);  // the end of backward joined the step stream
  }
  const int buckets = static_cast<int>(ddp.stats().bucket_bytes.size());
  REQUIRE(buckets >= 1);
  REQUIRE(spy->steps == 3 * buckets);  // one cast back per bucket per backward
  REQUIRE(spy->kept == 2 * spy->steps);  // the bucket and the reduced copy it read
}

TEST_CASE("ddp threads: one rank leaves a parameter without gradient; the others fail within the timeout", "[ddp]") {
  std::vector<std::string> errors(2);
  auto start = std::chrono::steady_clock::now();
  ThreadsOptions o;
  o.timeout = std::chrono::seconds(2);
  run_threads(
      2,
      [&](ProcessGroup& g) {
        auto model = make_net(f64);
        model->rank = g.rank();
        model->use_extra = [](int r) { return r != 0; };  // rank 0 never reaches `extra`
        model->never->weight.requires_grad_(false);
        model->never->bias.requires_grad_(false);
        DistributedDataParallel ddp(model, borrow(g), {.bucket_cap_mb = 1e-9});
        try {
          mse_loss(ddp(inputs(0, 4, 8, f64)), targets(0, 4, 4, f64)).backward();
          ddp.check_reducer_finalized();
        } catch (const std::exception& e) {
          errors[g.rank()] = e.what();
        }
      },
      o);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("rank 0: " << errors[0]);
  INFO("rank 1: " << errors[1]);
  CHECK_THAT(errors[0], Catch::Contains("[ddp] Expected to have finished reduction") &&
                            Catch::Contains("on rank 0 2 of 6 parameters received no gradient") &&
                            Catch::Contains("extra.weight, extra.bias") && Catch::Contains("find_unused_parameters"));
  CHECK_THAT(errors[1], Catch::Contains("timed out") || Catch::Contains("failed"));
  CHECK(seconds < 30);
}

TEST_CASE("ddp: marking a parameter ready twice in one iteration names it", "[ddp]") {
  on_threads(1, [](ProcessGroupPtr g) {
    auto model = make_net(f64);
    model->never->weight.requires_grad_(false);
    model->never->bias.requires_grad_(false);
    DistributedDataParallel ddp(model, g, {});
    // Two backwards over parts of one output: the first leaves `extra` unready (so the iteration
    // stays open), the second reaches fc1 again.
    Tensor h = tanh((*model->fc1)(inputs(0, 4, 8, f64)));
    Tensor y = ddp.call([&] { return (*model->fc2)(h); });
    y.sum().backward(Tensor(), /*retain_graph=*/true);
    REQUIRE_THROWS_WITH(y.sum().backward(), Catch::Contains("[ddp] parameter 'fc1.weight' was marked ready twice") ||
                                                Catch::Contains("[ddp] parameter 'fc1.bias' was marked ready twice") ||
                                                Catch::Contains("[ddp] parameter 'fc2.weight' was marked ready twice") ||
                                                Catch::Contains("[ddp] parameter 'fc2.bias' was marked ready twice"));
  });
}

TEST_CASE("ddp: stats describe buckets, timings and the ready order", "[ddp]") {
  on_threads(2, [](ProcessGroupPtr g) {
    auto model = make_net(f32);
    model->never->weight.requires_grad_(false);
    model->never->bias.requires_grad_(false);
    DistributedDataParallel ddp(model, g, {.bucket_cap_mb = 0.0005});
    for (int i = 0; i < 2; ++i) {
      model->zero_grad();
      mse_loss(ddp(inputs(i, 4, 8, f32)), targets(i, 4, 4, f32)).backward();
    }
    auto s = ddp.stats();
    expect(s.iterations == 2, "iterations {}", s.iterations);
    expect(s.world_size == 2, "world size {}", s.world_size);
    expect(s.bucket_bytes.size() >= 2, "{} buckets", s.bucket_bytes.size());
    int64_t total = 0;
    for (int64_t b : s.bucket_bytes) total += b;
    expect(total == (8 * 16 + 16 + 16 * 4 + 4 + 16 * 4 + 4) * 4, "bucket bytes sum to {}", total);
    expect(s.grad_ready_order.size() == 6, "{} names in the ready order", s.grad_ready_order.size());
    expect(s.rebuilt_bucket_bytes.size() == s.bucket_bytes.size(), "rebuilt sizes missing");
    expect(s.comm_ms >= 0 && s.backward_compute_ms >= 0 && s.forward_ms > 0, "timings not recorded");
    expect(s.str().find("DDP over 2 ranks, 2 iterations") != std::string::npos, "str(): {}", s.str());
  });
}

TEST_CASE("ddp: misuse after construction is a clear error, and a failed reduction stays reported", "[ddp]") {
  on_threads(1, [](ProcessGroupPtr g) {
    auto frozen_never = [] {
      auto m = make_net(f64);
      m->never->weight.requires_grad_(false);
      m->never->bias.requires_grad_(false);
      return m;
    };
    if (!is_initialized())  // this binary never calls dist::init()
      REQUIRE_THROWS_WITH(DistributedDataParallel(frozen_never()),
                          Catch::Contains("[ddp] no process group given and dist::init() has not run"));
    REQUIRE_THROWS_WITH(DistributedDataParallel(frozen_never(), g, {.bucket_cap_mb = 0.0}),
                        Catch::Contains("[ddp] bucket_cap_mb must be positive"));
    {
      // After remove_autograd_hooks the module trains locally; a synchronised forward says so.
      auto m = frozen_never();
      DistributedDataParallel ddp(m, g, {});
      ddp.remove_autograd_hooks();
      REQUIRE_THROWS_WITH(ddp(inputs(0, 4, 8, f64)), Catch::Contains("[ddp] the autograd hooks were removed"));
    }
    {
      // A hook whose result does not fit the bucket fails the backward, then every forward.
      auto m = frozen_never();
      DistributedDataParallel ddp(m, g, {});
      ddp.register_comm_hook([](GradBucket&) { return Work::completed({zeros({3}, f64)}); });
      REQUIRE_THROWS_WITH(mse_loss(ddp(inputs(0, 4, 8, f64)), targets(0, 4, 4, f64)).backward(),
                          Catch::Contains("[ddp] the comm hook returned 3 elements for bucket 0"));
      REQUIRE_THROWS_WITH(ddp(inputs(0, 4, 8, f64)),
                          Catch::Contains("[ddp] the previous iteration's gradient reduction failed") &&
                              Catch::Contains("returned 3 elements"));
      REQUIRE_THROWS_WITH(ddp.check_reducer_finalized(), Catch::Contains("gradient reduction failed"));
    }
    {
      auto m = frozen_never();
      DistributedDataParallel ddp(m, g, {});
      ddp.register_comm_hook([](GradBucket&) { return WorkPtr(); });
      REQUIRE_THROWS_WITH(mse_loss(ddp(inputs(0, 4, 8, f64)), targets(0, 4, 4, f64)).backward(),
                          Catch::Contains("[ddp] the comm hook returned no Work for bucket 0"));
    }
  });
}

TEST_CASE("ddp threads: mixed precision casts on a side stream; each module waits for its own before forward",
          "[ddp][mixed_precision]") {
  DeferredCasts deferred;
  for (int n : {1, 2}) {
    INFO(n << " ranks");
    REQUIRE_NOTHROW(on_threads(n, mixed_precision_side_stream));
    // The whole mixed-precision matrix's core, with every cast deferred until it is waited for.
    REQUIRE_NOTHROW(on_threads(n, [](ProcessGroupPtr g) {
      for (MpMode mode : {MpMode::plain, MpMode::no_sync, MpMode::static_two_forwards})
        mixed_precision_case(g, bf16, true, false, mode);
      mixed_precision_case(g, f16, false, true, MpMode::plain);
    }));
  }
}
