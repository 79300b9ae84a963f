// The dist layer with CUDA tensors: the nccl backend at world size 1 on one GPU (every collective x
// dtype of dist_cases.h, stream ordering, argument errors, a timeout that aborts the communicator),
// and the mpi backend with CUDA tensors staged through host buffers ("[cuda_mpi]": CTest runs those
// under `mpirun -np 2` on the same GPU as test_cuda_nccl_mpi:np2; alone they are a world of size 1).
// Without a usable device every case skips and says so.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../dist/dist_cases.h"
#include "cuda/detail/check.h"
#include "cuda/runtime.h"
#include "cuda_test_util.h"
#include "dist/nccl/nccl.h"
#include "forwarding_group.h"
#include "mpi_case.h"
#include "tandem.h"

using namespace tandem;
using namespace tandem::dist;
using namespace dist_cases;

namespace {

// Runs dist_cases' checks (written for CPU tensors) on CUDA tensors: each tensor is copied to
// `device`, the collective runs on `inner` with the device copies, and a continuation copies the
// results back into the CPU tensors, which are the Work's result as the cases expect.
class OnDevice final : public ForwardingGroup {
 public:
  OnDevice(ProcessGroupPtr inner, Device device) : ForwardingGroup(std::move(inner)), device_(device) {}

  WorkPtr allreduce(const Tensor& t, ReduceOp op) override {
    Tensor d = dev(t);
    return back(inner_->allreduce(d, op), {t}, {d});
  }
  WorkPtr allreduce_coalesced(const TensorList& ts, ReduceOp op) override {
    TensorList ds = dev(ts);
    return back(inner_->allreduce_coalesced(ds, op), ts, ds);
  }
  WorkPtr broadcast(const Tensor& t, int root) override {
    Tensor d = dev(t);
    return back(inner_->broadcast(d, root), {t}, {d});
  }
  WorkPtr allgather(const TensorList& outs, const Tensor& in) override {
    TensorList ds = dev(outs);
    return back(inner_->allgather(ds, dev(in)), outs, ds);
  }
  WorkPtr allgather_into(const Tensor& out, const Tensor& in) override {
    Tensor d = dev(out);
    return back(inner_->allgather_into(d, dev(in)), {out}, {d});
  }
  WorkPtr reduce_scatter(const Tensor& out, const TensorList& ins, ReduceOp op) override {
    Tensor d = dev(out);
    return back(inner_->reduce_scatter(d, dev(ins), op), {out}, {d});
  }
  WorkPtr reduce_scatter_tensor(const Tensor& out, const Tensor& in, ReduceOp op) override {
    Tensor d = dev(out);
    return back(inner_->reduce_scatter_tensor(d, dev(in), op), {out}, {d});
  }
  WorkPtr all_to_all(const Tensor& out, const Tensor& in, const AllToAllSplits& splits) override {
    Tensor d = dev(out);
    return back(inner_->all_to_all(d, dev(in), splits), {out}, {d});
  }
  WorkPtr barrier() override { return inner_->barrier(); }
  WorkPtr send(const Tensor& t, int dst, int tag) override { return inner_->send(dev(t), dst, tag); }
  WorkPtr recv(const Tensor& t, int src, int tag) override {
    Tensor d = dev(t);
    return back(inner_->recv(d, src, tag), {t}, {d});
  }
  ProcessGroupPtr new_group(const std::vector<int>& ranks) override {
    ProcessGroupPtr child = inner_->new_group(ranks);
    return child ? std::make_shared<OnDevice>(child, device_) : nullptr;
  }

 private:
  Tensor dev(const Tensor& t) const { return t.to(device_); }
  TensorList dev(const TensorList& ts) const {
    TensorList out;
    for (const Tensor& t : ts) out.push_back(dev(t));
    return out;
  }
  static WorkPtr back(WorkPtr w, TensorList host, TensorList device) {
    return w->then([host, device](Work& done) {
      for (size_t i = 0; i < host.size(); ++i) {
        expect(done.result()[i].is_same(device[i]), "result {} is not the tensor handed to the collective", i);
        expect(device[i].is_cuda(), "result {} left the device", i);
        Tensor c = device[i].to(kCPU);
        if (c.nbytes()) std::memcpy(host[i].data_ptr(), c.data_ptr(), c.nbytes());
      }
      return host;
    });
  }

  Device device_;
};

Tensor on(const Tensor& t, int device) { return t.to(Device::cuda(device)); }

void run_checks(const char* what, const std::function<void()>& fn) {
  INFO(what);
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
  }
  INFO(error);
  REQUIRE(error.empty());
}

#ifdef TANDEM_WITH_NCCL
// Without a launcher the nccl world has size 1; under mpirun -np 2 on one GPU NCCL cannot run
// (a device per rank), so these cases only run alone.
bool nccl_cases_can_run() {
  if (launched_by_mpi() && mpi_info().size > 1) {
    WARN("SKIP: the nccl cases run at world size 1 (this is an mpirun world of " << mpi_info().size << ")");
    return false;
  }
  return true;
}

ProcessGroupPtr nccl_world() {
  static ProcessGroupPtr w = [] {
    InitOptions o;
    o.timeout = std::chrono::seconds(60);
    return make_nccl_world(o);
  }();
  return w;
}

int group_device() { return cuda::current_device(); }  // make_nccl_world made it current

// A nccl group of its own, for a case that ends with it broken (the world group stays usable);
// the world group is made first, so that the device is current.
ProcessGroupPtr group_that_will_break() {
  nccl_world();
  return make_nccl_world();
}

// Blocks the host until the watchdog has completed `w` (at most 60 s) and returns its error, "" on
// success. Work::wait on a CUDA collective need not block (it may only order the caller's stream
// after it), but a continuation's Work completes on the host, with `w`'s error when `w` failed.
std::string host_outcome(const WorkPtr& w) {
  return error_of([&] { w->then([](Work&) { return TensorList{}; })->wait(std::chrono::seconds(60)); });
}
#endif

}  // namespace

#ifdef TANDEM_WITH_NCCL

TEST_CASE("nccl: world of size 1, every collective x dtype", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  if (!nccl_cases_can_run()) return;
  ProcessGroupPtr g = nccl_world();
  REQUIRE(g->backend() == "nccl");
  REQUIRE(g->size() == 1);
  REQUIRE(g->rank() == 0);
  REQUIRE(nccl_available());
  REQUIRE_FALSE(g->supports_blocking_issue(Device::cuda(group_device())));  // stream-ordered
  REQUIRE(g->supports_blocking_issue(kCPU));  // CPU tensors go over the companion group
  OnDevice d(g, Device::cuda(group_device()));
  run_checks("allreduce", [&] { allreduce_all(d); });
  run_checks("allreduce_coalesced", [&] { allreduce_coalesced_all(d); });
  run_checks("broadcast", [&] { broadcast_all(d); });
  run_checks("allgather", [&] { allgather_all(d); });
  run_checks("reduce_scatter", [&] { reduce_scatter_all(d); });
  run_checks("all_to_all", [&] { all_to_all_all(d); });
  run_checks("barrier", [&] { barrier_and_p2p(d); });
  run_checks("continuations", [&] { work_continuations(d); });
  run_checks("sub-groups", [&] { sub_groups(d); });
  REQUIRE(!g->is_broken());
}

TEST_CASE("nccl: CUDA tensors stay on the device and follow the caller's stream", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  if (!nccl_cases_can_run()) return;
  ProcessGroupPtr g = nccl_world();
  const int dev = group_device();
  const int64_t n = int64_t(1) << 22;
  Tensor x = on(make({n}, f32, [](int64_t i) { return static_cast<double>(i % 5); }), dev);
  // Kernels queued on the current stream right before the collective: the comm stream must wait
  // for them (an event, no host sync), or the gather reads half-written values.
  auto produce_and_gather = [&] {
    Tensor y = x;
    for (int k = 0; k < 8; ++k) y = y.add(x);  // 9 x, queued, not synchronised
    Tensor out = on(make({n}, f32, [](int64_t) { return -1; }), dev);
    WorkPtr w = g->allgather_into(out, y);
    w->wait();
    REQUIRE(w->result().size() == 1);
    REQUIRE(w->result()[0].is_same(out));
    REQUIRE(out.is_cuda());
    Tensor host = out.to(kCPU);
    const float* p = host.data_ptr<float>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += p[i] != static_cast<float>(9 * (i % 5));
    REQUIRE(wrong == 0);
  };
  produce_and_gather();
  {
    cuda::Stream user = cuda::Stream::create(dev);
    cuda::StreamGuard guard(user);  // another current stream: the collective orders after it instead
    produce_and_gather();
  }
  // f16 and bf16 go to NCCL natively; avg at size 1 is the identity.
  for (Dtype dt : {f16, bf16}) {
    Tensor h = on(make({1000}, dt, [](int64_t i) { return static_cast<double>(i % 17) / 4; }), dev);
    WorkPtr w = g->allreduce(h, ReduceOp::avg);
    REQUIRE(host_outcome(w) == "");  // wait() orders the stream; the host outcome comes later
    expect_values(h.to(kCPU), [](int64_t i) { return static_cast<double>(i % 17) / 4; }, "f16/bf16 avg", 0);
  }
  // Several in flight at once complete in order.
  std::vector<Tensor> ts;
  std::vector<WorkPtr> ws;
  for (int k = 0; k < 16; ++k) {
    ts.push_back(on(make({257}, i64, [k](int64_t i) { return static_cast<double>(i * k); }), dev));
    ws.push_back(g->allreduce(ts.back(), ReduceOp::max));
  }
  for (auto& w : ws) w->wait();
  for (int k = 0; k < 16; ++k) expect_values(ts[k].to(kCPU), [k](int64_t i) { return static_cast<double>(i * k); }, "in flight");
  // A CPU tensor on an nccl group goes over its companion group.
  Tensor c = make({4}, f64, [](int64_t i) { return static_cast<double>(i); });
  g->allreduce(c)->wait();
  expect_values(c, [](int64_t i) { return static_cast<double>(i); }, "CPU tensor on an nccl group");
}

TEST_CASE("nccl: argument errors", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  if (!nccl_cases_can_run()) return;
  ProcessGroupPtr g = nccl_world();
  const int dev = group_device();
  Tensor base = on(make({3, 4}, f32, [](int64_t) { return 1; }), dev);
  Tensor transposed = make_view(base, {4, 3}, {1, 4}, 0);
  expect_error(error_of([&] { g->allreduce(transposed); }), {"[allreduce]", "contiguous", "[4, 3]"}, "non-contiguous");
  expect_error(error_of([&] { g->allreduce(on(make({2}, i32, [](int64_t) { return 1; }), dev), ReduceOp::avg); }),
               {"[allreduce]", "avg", "i32"}, "avg on ints");
  expect_error(error_of([&] { g->broadcast(base, 1); }), {"[broadcast]", "root"}, "bad root");
  expect_error(error_of([&] { g->allreduce_coalesced({base, on(make({2}, f64, [](int64_t) { return 0; }), dev)}); }),
               {"[allreduce_coalesced]", "f64", "f32"}, "coalesced dtypes");
  Tensor cpu_out = make({3, 4}, f32, [](int64_t) { return 0; });
  expect_error(error_of([&] { g->allgather_into(cpu_out, base); }), {"[allgather_into]", "cpu", "cuda"},
               "mixed devices");
  expect_error(error_of([&] { g->allreduce(Tensor()); }), {"[allreduce]", "undefined"}, "undefined tensor");
  if (cuda::device_count() > 1) {
    Tensor other = on(make({2}, f32, [](int64_t) { return 1; }), (dev + 1) % cuda::device_count());
    expect_error(error_of([&] { g->allreduce(other); }), {"[allreduce]", "communicates on"}, "another device");
  }
  expect_error(error_of([&] { g->new_group({0, 0}); }), {"[new_group]", "twice"}, "new_group duplicates");
  Tensor t = on(make({2}, f32, [](int64_t) { return 1; }), dev);
  g->allreduce(t)->wait();  // none of that broke the group
  expect_values(t.to(kCPU), [](int64_t) { return 1; }, "allreduce after argument errors");
  REQUIRE(!g->is_broken());
}

TEST_CASE("nccl: a collective past its timeout aborts the communicator and breaks the group", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  if (!nccl_cases_can_run()) return;
  ProcessGroupPtr g = group_that_will_break();
  const int dev = group_device();
  Tensor t = on(make({64}, f32, [](int64_t) { return 1; }), dev);
  // #0 works. It runs under the group's default timeout (its first call also connects the
  // communicator, which can take long) and has finished before the timeout is shortened, which
  // applies to the collectives issued from then on.
  REQUIRE(host_outcome(g->allreduce(t)) == "");
  g->set_timeout(std::chrono::milliseconds(400));
  cuda::Stream user = cuda::Stream::create(dev);
  {
    cuda::StreamGuard guard(user);
    // The caller's stream is held up on the host for 2 s, so the collective ordered after it
    // cannot finish within 400 ms.
    TANDEM_CUDA_CHECK(cudaLaunchHostFunc(
        user.raw(), [](void*) { std::this_thread::sleep_for(std::chrono::seconds(2)); }, nullptr));
    auto start = std::chrono::steady_clock::now();
    WorkPtr w = g->allreduce(t);
    std::string msg = host_outcome(w);
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    expect_error(msg, {"[dist] allreduce #1 timed out after 400 ms on nccl group of 1 rank", "aborted", "broken"},
                 "timeout");
    REQUIRE(waited < 10);
    // Once reported, the error is what wait() throws (whether it blocks or orders the stream).
    expect_error(error_of([&] { w->wait(); }), {"allreduce #1 timed out"}, "wait after the timeout");
  }
  REQUIRE(g->is_broken());
  auto start = std::chrono::steady_clock::now();
  expect_error(error_of([&] { g->barrier(); }), {"broken", "allreduce #1"}, "use of a broken group");
  expect_error(error_of([&] { g->allreduce(make({1}, f32, [](int64_t) { return 1; })); }), {"broken"},
               "CPU tensor on a broken group");
  REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));  // at once
  user.synchronize();
  // The world group is unaffected.
  Tensor u = on(make({3}, f32, [](int64_t) { return 2; }), dev);
  nccl_world()->allreduce(u)->wait();
  expect_values(u.to(kCPU), [](int64_t) { return 2; }, "another group after a broken one");
}

TEST_CASE("nccl: dist::init with backend nccl", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  if (launched_by_mpi()) return;  // about a world without a launcher
  ProcessGroupPtr w = init(InitOptions{"nccl", std::chrono::seconds(60), {}});
  REQUIRE(w->backend() == "nccl");
  REQUIRE(world_info().backend == "nccl");
  REQUIRE(world_info().size == 1);
  Tensor t = on(make({5}, bf16, [](int64_t i) { return static_cast<double>(i); }), cuda::current_device());
  dist::allreduce(t, ReduceOp::sum)->wait();
  expect_values(t.to(kCPU), [](int64_t i) { return static_cast<double>(i); }, "dist::allreduce on nccl");
}

// ---- issue 26: the handle lock, the step stream and device-ordered waits ----

namespace {
// Holds `stream` on the host for `ms` milliseconds: what is ordered after it cannot finish before.
void hold_stream(cudaStream_t stream, int ms) {
  static int held_ms = 0;
  held_ms = ms;
  TANDEM_CUDA_CHECK(cudaLaunchHostFunc(
      stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(held_ms)); }, nullptr));
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

TEST_CASE("nccl: wait() orders the caller's stream instead of blocking the host", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  if (!nccl_cases_can_run()) return;
  ProcessGroupPtr g = nccl_world();
  const int dev = group_device();
  Tensor t = on(make({1024}, f32, [](int64_t i) { return static_cast<double>(i); }), dev);
  g->allreduce(t)->wait();  // connected
  cuda::Stream user = cuda::Stream::create(dev), side = cuda::Stream::create(dev);
  cuda::Event after_wait;
  WorkPtr w;
  {
    cuda::StreamGuard guard(user);
    hold_stream(user.raw(), 1500);  // the collective is ordered after this
    const auto start = std::chrono::steady_clock::now();
    w = g->allreduce(t);
    REQUIRE(w->is_device_ordered());
    {
      cuda::StreamGuard on_side(side);
      w->wait();  // the side stream now waits for the collective on the device
      after_wait.record(side.raw());
    }
    REQUIRE(seconds_since(start) < 0.75);  // the host did not wait for it
    REQUIRE(!w->is_completed());
    REQUIRE(!after_wait.query());  // the side stream is held behind the collective
  }
  after_wait.synchronize();
  const auto start = std::chrono::steady_clock::now();
  while (!w->is_completed() && seconds_since(start) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(w->is_completed());  // the watchdog still completes it on the host
  expect_values(t.to(kCPU), [](int64_t i) { return static_cast<double>(i); }, "allreduce, device-ordered wait");

  // A barrier's wait blocks the host, as in PyTorch.
  WorkPtr barrier = g->barrier();
  REQUIRE(!barrier->is_device_ordered());
  barrier->wait();
  REQUIRE(barrier->is_completed());

  // InitOptions::nccl_blocking_wait (or TANDEM_NCCL_BLOCKING_WAIT=1): wait() blocks until the
  // host saw the collective finish.
  InitOptions blocking_options;
  blocking_options.timeout = std::chrono::seconds(60);
  blocking_options.nccl_blocking_wait = true;
  ProcessGroupPtr blocking = make_nccl_world(blocking_options);
  WorkPtr b = blocking->allreduce(t);
  REQUIRE(!b->is_device_ordered());
  b->wait();
  REQUIRE(b->is_completed());
}

TEST_CASE("nccl: work on the step stream stays off the comm stream and is joined by the caller", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  if (!nccl_cases_can_run()) return;
  ProcessGroupPtr g = nccl_world();
  const int dev = group_device();
  Tensor t = on(make({256}, f32, [](int64_t) { return 1; }), dev);
  Tensor out = on(make({256}, f32, [](int64_t) { return 0; }), dev);
  const cudaStream_t caller = cuda::current_stream(dev);
  std::atomic<bool> other_stream{false};
  WorkPtr chained = g->allreduce(t)->then([&](Work& done) {
    g->run_on_step_stream([&] {
      cudaStream_t s = cuda::current_stream(dev);
      other_stream = s != caller;
      hold_stream(s, 1000);  // held on the host, then out = 3 * the reduced tensor
      NoGradGuard no_grad;
      out.copy_(done.result().at(0));
      out.mul_(3.0);
      return TensorList{out};
    });
    return TensorList{};
  });
  chained->wait();  // a then() Work: the host waits for the continuation, not for the step stream
  REQUIRE(other_stream);
  // A collective issued now does not queue behind the step stream's held work.
  Tensor u = on(make({16}, f32, [](int64_t) { return 2; }), dev);
  const auto start = std::chrono::steady_clock::now();
  WorkPtr next = g->allreduce(u);
  while (!next->is_completed() && seconds_since(start) < 10) std::this_thread::sleep_for(std::chrono::microseconds(200));
  REQUIRE(next->is_completed());
  CHECK(seconds_since(start) < 0.75);
  // The caller's stream joins the step stream: it reads `out` after the step work.
  g->join_step_stream();
  expect_values(out.to(kCPU), [](int64_t) { return 3; }, "written on the step stream, read after the join");
}

TEST_CASE("nccl: a group broken under threads that launch on it fails them all, cleanly and in time", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  if (!nccl_cases_can_run()) return;
  ProcessGroupPtr g = group_that_will_break();
  const int dev = group_device();
  Tensor t = on(make({64}, f32, [](int64_t) { return 1; }), dev);
  g->allreduce(t)->wait();  // #0 connects, under the default timeout
  g->set_timeout(std::chrono::milliseconds(300));
  cuda::Stream user = cuda::Stream::create(dev);
  {
    cuda::StreamGuard guard(user);
    hold_stream(user.raw(), 2000);
    g->allreduce(t);  // cannot finish within 300 ms: the watchdog aborts the communicator
  }
  // Meanwhile four threads keep launching: each launch uses the raw communicator under the handle
  // lock, which the abort takes too (before, ncclCommAbort could free it under their calls: this
  // case is for compute-sanitizer and for a crash, not for timing). At most kMaxInFlight
  // collectives queue; the launchers then wait for room, and the abort wakes them.
  std::vector<std::string> errors(4);
  std::vector<double> failed_after(4, -1);
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      cuda::set_device(dev);
      Tensor x = on(make({32}, f32, [](int64_t) { return 1; }), dev);
      for (int i = 0; i < 2000 && errors[k].empty(); ++i) {
        errors[k] = error_of([&] { g->allreduce(x); });
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      failed_after[k] = seconds_since(start);
    });
  }
  for (std::thread& th : threads) th.join();
  INFO("the launchers failed after " << failed_after[0] << ", " << failed_after[1] << ", " << failed_after[2] << ", "
                                     << failed_after[3] << " s (the stream was held for 2 s, the timeout 300 ms)");
  CHECK(seconds_since(start) < 10);
  for (int k = 0; k < 4; ++k) {
    INFO("thread " << k << ": " << errors[k]);
    CHECK(errors[k].find("broken") != std::string::npos);
  }
  REQUIRE(g->is_broken());
  user.synchronize();
  Tensor u = on(make({3}, f32, [](int64_t) { return 2; }), dev);
  nccl_world()->allreduce(u)->wait();  // other groups are unaffected
  expect_values(u.to(kCPU), [](int64_t) { return 2; }, "another group after a broken one");
}

#else

TEST_CASE("nccl: not built", "[cuda]") {
  WARN("SKIP: this tandem was built with CUDA but without NCCL");
  REQUIRE_THROWS_WITH(make_nccl_world(), Catch::Contains("needs a CUDA build with NCCL"));
}

#endif  // TANDEM_WITH_NCCL

// ---- the mpi backend with CUDA tensors (staged through host buffers) ----

namespace {

ProcessGroupPtr mpi_world() {
  static ProcessGroupPtr w = make_mpi_world(std::chrono::seconds(60));
  return w;
}

// As test_dist_mpi (mpi_case.h): the ranks agree on the verdict, so a failure on one fails the
// case on all. The case gets the world itself and this rank's device.
void run_mpi_case(const std::function<void(ProcessGroup&, int device)>& fn) {
  ProcessGroupPtr world = mpi_world();
  const int device = mpi_info().local_rank % cuda::device_count();  // ranks may share the GPU
  cuda::set_device(device);
  mpi_case::run_case(world, [&](ProcessGroupPtr g) { fn(*g, device); });
}

}  // namespace

TEST_CASE("mpi with CUDA tensors: every collective x dtype", "[cuda][cuda_mpi]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  run_mpi_case([](ProcessGroup& world, int device) {
    OnDevice d(world.new_group(mpi_case::all_ranks(world)), Device::cuda(device));
    allreduce_all(d);
    allreduce_coalesced_all(d);
    broadcast_all(d);
    allgather_all(d);
    reduce_scatter_all(d);
    all_to_all_all(d);
    barrier_and_p2p(d);
    work_continuations(d);
    sub_groups(d);
    mismatch_detection(d);
  });
}

TEST_CASE("mpi with CUDA tensors: a tensor just computed on the device", "[cuda][cuda_mpi]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  run_mpi_case([](ProcessGroup& world, int device) {
    const int n = world.size(), r = world.rank();
    const int64_t count = int64_t(1) << 20;
    Tensor x = on(make({count}, f32, [&](int64_t i) { return static_cast<double>((i + r) % 3); }), device);
    Tensor y = x;
    for (int k = 0; k < 3; ++k) y = y.add(x);  // 4 x, queued on the current stream, not synchronised
    WorkPtr w = world.allreduce(y);
    w->wait();
    expect(w->result()[0].is_same(y) && y.is_cuda(), "the result is the CUDA tensor");
    expect_values(y.to(kCPU), [&](int64_t i) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += 4 * ((i + q) % 3);
      return s;
    }, "allreduce of a tensor computed just before");
    // The same on a user stream: the comm thread stages on its own stream, so issue must wait
    // for the caller's.
    cuda::Stream user = cuda::Stream::create(device);
    {
      cuda::StreamGuard guard(user);
      Tensor z = x;
      for (int k = 0; k < 7; ++k) z = z.add(x);  // 8 x, on `user`
      world.allreduce(z)->wait();
      expect_values(z.to(kCPU), [&](int64_t i) {
        double s = 0;
        for (int q = 0; q < n; ++q) s += 8 * ((i + q) % 3);
        return s;
      }, "allreduce of a tensor computed on a user stream");
    }
  });
}
