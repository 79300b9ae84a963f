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
    // A forward through ddp.call is timed too (it read 0.000 ms before).
    DistributedDataParallel called(make_net_without_never(f32), g);
    called.call([&] { return mse_loss(called.module()(inputs(0, 4, 8, f32)), targets(0, 4, 4, f32)); }).backward();
    expect(called.stats().forward_ms > 0, "ddp.call's forward time is {} ms", called.stats().forward_ms);
  });
}

namespace {
// y = fc(x) * scale + shift, with shift optional (an undefined tensor): a module of several inputs.
struct ScaledNet : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  Dtype seen_x = f64, seen_scale = f64;
  ScaledNet() : Module("ScaledNet") { fc = register_module("fc", std::make_shared<nn::Linear>(8, 4)); }
  size_t max_inputs() const override { return 3; }
  Tensor forward_inputs(const TensorList& in) override {
    seen_x = in[0].dtype();
    seen_scale = in[1].dtype();
    Tensor y = (*fc)(in[0]) * in[1];
    return in.size() > 2 && in[2].defined() ? y + in[2] : y;
  }
};
}  // namespace

// ddp(x, scale) reaches the module's forward_inputs: equal to one process on the whole batch; under
// mixed precision the floating inputs arrive in param_dtype; the hooks see every input.
TEST_CASE("ddp: a module of several inputs through ddp(a, b)", "[ddp]") {
  on_threads(2, [](ProcessGroupPtr g) {
    const int R = g->rank();
    manual_seed(3);
    auto model = std::make_shared<ScaledNet>();
    model->to(f64);
    manual_seed(3);
    auto reference = std::make_shared<ScaledNet>();
    reference->to(f64);
    DistributedDataParallel ddp(model, g);
    optim::SGD opt(model->parameters(), {.lr = 0.1});
    optim::SGD ref_opt(reference->parameters(), {.lr = 0.1});
    auto scale = [](int r) { return full({4, 1}, 1.0 + 0.5 * r, f64); };
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      mse_loss(ddp(inputs(8 * step + 4 * R, 4, 8, f64), scale(R)), targets(8 * step + 4 * R, 4, 4, f64)).backward();
      opt.step();
      ref_opt.zero_grad();
      Tensor total;
      for (int r = 0; r < 2; ++r) {
        Tensor l = mse_loss((*reference)(inputs(8 * step + 4 * r, 4, 8, f64), scale(r)), targets(8 * step + 4 * r, 4, 4, f64));
        total = total.defined() ? total + l : l;
      }
      (total / 2.0).backward();
      ref_opt.step();
      expect_same_parameters(*model, *reference, 1e-12, fmt::format("several inputs, step {}", step));
    }
    expect(ddp.stats().forward_ms > 0, "ddp(a, b)'s forward is not timed");
    // A hook sees both inputs and may replace them; an undefined optional input passes as it is.
    auto hook = model->register_forward_pre_hook(
        nn::ForwardPreHookInputs([](nn::Module&, const TensorList& in) -> std::optional<TensorList> {
          return TensorList{in[0], in[1] * 0.0, in[2]};
        }));
    Tensor zero = ddp(inputs(0, 4, 8, f64), scale(R), Tensor());
    expect(zero.abs().max().item<double>() == 0, "the hook's replaced scale did not reach forward_inputs");
    hook.remove();
    // Mixed precision: x and scale arrive as bf16.
    auto low = std::make_shared<ScaledNet>();
    low->to(f32);
    DdpOptions o;
    o.mixed_precision = MixedPrecision{.param_dtype = bf16};
    DistributedDataParallel low_ddp(low, g, o);
    mse_loss(low_ddp(inputs(0, 4, 8, f32), full({4, 1}, 2.0, f32)).to(f32), targets(0, 4, 4, f32)).backward();
    expect(low->seen_x == bf16 && low->seen_scale == bf16, "under bf16 mixed precision the inputs arrived as {} and {}",
           low->seen_x, low->seen_scale);
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
