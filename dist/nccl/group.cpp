// The nccl group (see dist/nccl/nccl.h): the collectives launched on the comm stream of its
// NcclComm (comm.h), CPU tensors handed to the companion group, and the bootstrap over it.
// Part of the CUDA backend library; compiled to the "built without NCCL" stubs when the CUDA
// build found no NCCL (TANDEM_WITH_NCCL unset).
#include "dist/nccl/nccl.h"

#ifndef TANDEM_WITH_NCCL

namespace tandem::dist {

bool nccl_available() { return false; }

ProcessGroupPtr make_nccl_world(const InitOptions&) {
  fail("[dist] the nccl backend needs a CUDA build with NCCL (this tandem's CUDA backend was built without NCCL); "
       "use backend mpi");
}

}  // namespace tandem::dist

#else  // TANDEM_WITH_NCCL

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string_view>

#include "cuda/allocator.h"
#include "cuda/detail/check.h"
#include "cuda/runtime.h"
#include "dist/detail/collective_checks.h"
#include "dist/detail/comm_thread.h"
#include "dist/detail/group_base.h"
#include "dist/mpi/mpi.h"
#include "dist/nccl/detail/comm.h"
#include "dist/threads/threads.h"

namespace tandem::dist {

namespace {

bool is_cpu_tensor(const Tensor& t) { return t.defined() && t.is_cpu(); }

// InitOptions::nccl_blocking_wait, else TANDEM_NCCL_BLOCKING_WAIT=1 (anything but empty or 0).
bool blocking_wait_requested(const std::optional<bool>& option) {
  if (option) return *option;
  const char* env = std::getenv("TANDEM_NCCL_BLOCKING_WAIT");
  return env != nullptr && *env != 0 && std::string_view(env) != "0";
}

constexpr int64_t kIdWords = (sizeof(ncclUniqueId) + 7) / 8;

// One collective as issued. Its arguments are checked by check_<op> of
// dist/detail/collective_checks.h, as on the other backends; check_device adds this backend's rule.
struct Launch {
  OpKind kind = OpKind::barrier;
  int peer = 0;  // broadcast root, send dst, recv src
  int tag = 0;
  std::string fingerprint;
  std::vector<int64_t> in_splits, out_splits;  // all_to_all
  TensorList result;
  TensorList keep;
  std::optional<ReduceOp> reduce;  // for the flight recorder
};

// Enqueues a collective's NCCL calls on the comm stream (each through TANDEM_NCCL_ENQUEUE, see
// NcclLaunch); may add scratch tensors to `keep`.
using Body = std::function<void(const NcclLaunch&, TensorList& keep)>;

std::shared_ptr<ProcessGroup> create_group(ProcessGroupPtr cpu, int device, int local_size, bool blocking_wait);

// The settings live here and in the companion group, which carries this group's CPU tensors.
class NcclGroup final : public GroupBase {
 public:
  NcclGroup(ProcessGroupPtr cpu, std::shared_ptr<NcclComm> comm, int local_size, bool blocking_wait)
      : GroupBase(comm->rank, comm->size, comm->name, cpu->timeout(), cpu->debug_checks(), comm->broken),
        cpu_(std::move(cpu)), comm_(std::move(comm)), local_size_(local_size), blocking_wait_(blocking_wait) {
    // Its ranks are its companion group's: the same world ranks answer for both.
    auto* companion = dynamic_cast<GroupBase*>(cpu_.get());
    recorder().set_backend("nccl", companion ? companion->recorder().world_ranks() : std::vector<int>{});
  }
  ~NcclGroup() override { comm_->stop(); }

  std::string_view backend() const override { return "nccl"; }
  void set_timeout(Milliseconds timeout) override {
    GroupBase::set_timeout(timeout);
    cpu_->set_timeout(timeout);
    comm_->teardown_ms.store(timeout.count());
  }
  void set_debug_checks(bool on) override {
    GroupBase::set_debug_checks(on);
    cpu_->set_debug_checks(on);
  }
  bool is_broken() const override { return GroupBase::is_broken() || cpu_->is_broken(); }

  Device control_device(Device params_device) const override { return params_device; }
  bool supports_blocking_issue(Device device) const override {
    return device.is_cpu() && cpu_->supports_blocking_issue(device);
  }

  // The step stream is the group's own, never NCCL's: work queued on the comm stream while a
  // non-blocking NCCL call may still be enqueueing there (ncclInProgress) is not allowed, and the
  // continuation's thread (the watchdog) has no stream of the user's to borrow. The host has seen
  // the collective finish before a continuation runs, so the step stream needs no wait for it.
  void run_on_step_stream(const std::function<TensorList()>& fn) override {
    cuda::DeviceGuard device(comm_->device);
    std::lock_guard lock(step_mutex_);
    if (step_stream_.raw() == nullptr) step_stream_ = cuda::Stream::create(comm_->device, -1);
    if (!on_comm_thread()) {
      // Run inline by then() on a Work already complete (a hook that skipped communication): the
      // caller's stream may still be writing what fn reads, so the step stream waits for it.
      // (On the watchdog thread the current stream is nobody's: the collective has finished.)
      step_ready_.record(cuda::current_stream(comm_->device));
      step_ready_.wait(step_stream_.raw());
    }
    TensorList kept;
    {
      cuda::StreamGuard guard(step_stream_);
      kept = fn();
    }
    // Used here, freed elsewhere: not handed out again before this stream, and the joining
    // stream (join_step_stream), are done with them.
    for (Tensor& t : kept) {
      if (!t.defined() || !t.device().is_cuda()) continue;
      cuda::record_stream(t, step_stream_.raw());
      step_kept_.push_back(std::move(t));
    }
    step_queued_ = true;
  }

  void join_step_stream() override {
    std::lock_guard lock(step_mutex_);
    if (!step_queued_) return;
    cuda::DeviceGuard device(comm_->device);
    cudaStream_t joiner = cuda::current_stream(comm_->device);
    step_joined_.record(step_stream_.raw());
    step_joined_.wait(joiner);
    for (const Tensor& t : step_kept_) cuda::record_stream(t, joiner);
    step_kept_.clear();
    step_queued_ = false;
  }

  WorkPtr allreduce(const Tensor& tensor, ReduceOp reduce) override {
    if (is_cpu_tensor(tensor)) return cpu("allreduce").allreduce(tensor, reduce);
    Launch l;
    l.fingerprint = check_allreduce(tensor, reduce);
    check_device(tensor, "allreduce", "tensor");
    l.kind = OpKind::allreduce;
    l.reduce = reduce;
    l.result = {tensor};
    return launch(std::move(l), [tensor, reduce](const NcclLaunch& on, TensorList&) {
      if (tensor.numel() == 0) return;
      void* p = tensor.data_ptr();
      TANDEM_NCCL_ENQUEUE(on, ncclAllReduce(p, p, tensor.numel(), nccl_type(tensor.dtype()),
                                            nccl_op(reduce, tensor.dtype()), on.comm, on.stream));
    });
  }

  WorkPtr allreduce_coalesced(const TensorList& tensors, ReduceOp reduce) override {
    TANDEM_CHECK(!tensors.empty(), "[allreduce_coalesced] needs at least one tensor");
    if (is_cpu_tensor(tensors[0])) return cpu("allreduce_coalesced").allreduce_coalesced(tensors, reduce);
    Launch l;
    l.fingerprint = check_allreduce_coalesced(tensors, reduce);
    check_device(tensors[0], "allreduce_coalesced", "tensor 0");  // the others: on tensor 0's device
    l.kind = OpKind::allreduce_coalesced;
    l.reduce = reduce;
    l.result = tensors;
    return launch(std::move(l), [tensors, reduce](const NcclLaunch& on, TensorList&) {
      const Dtype dt = tensors[0].dtype();
      NcclCallGroup group(on);
      for (const Tensor& t : tensors) {
        if (t.numel() == 0) continue;
        void* p = t.data_ptr();
        TANDEM_NCCL_ENQUEUE(on,
                            ncclAllReduce(p, p, t.numel(), nccl_type(dt), nccl_op(reduce, dt), on.comm, on.stream));
      }
      group.end();
    });
  }

  WorkPtr broadcast(const Tensor& tensor, int root) override {
    if (is_cpu_tensor(tensor)) return cpu("broadcast").broadcast(tensor, root);
    Launch l;
    l.fingerprint = check_broadcast(*this, tensor, root);
    check_device(tensor, "broadcast", "tensor");
    l.kind = OpKind::broadcast;
    l.peer = root;
    l.result = {tensor};
    return launch(std::move(l), [tensor, root](const NcclLaunch& on, TensorList&) {
      if (tensor.nbytes() == 0) return;
      void* p = tensor.data_ptr();
      TANDEM_NCCL_ENQUEUE(on, ncclBroadcast(p, p, tensor.nbytes(), ncclUint8, root, on.comm, on.stream));
    });
  }

  WorkPtr allgather(const TensorList& outputs, const Tensor& input) override {
    if (is_cpu_tensor(input)) return cpu("allgather").allgather(outputs, input);
    Launch l;
    l.fingerprint = check_allgather(*this, outputs, input);
    check_device(input, "allgather", "input");  // the outputs: on the input's device
    l.kind = OpKind::allgather;
    l.result = outputs;
    l.keep = {input};
    const int n = size();
    // Gathered into one buffer, then copied out on the comm stream (the outputs need not be
    // adjacent). Allocated before the launch: never inside the handle lock (comm.h).
    Tensor flat = make_empty({n * input.numel()}, input.dtype(), Device::cuda(comm_->device), "allgather");
    l.keep.push_back(flat);
    return launch(std::move(l), [outputs, input, n, flat](const NcclLaunch& on, TensorList&) {
      const size_t bytes = input.nbytes();
      if (bytes == 0) return;
      char* f = static_cast<char*>(flat.data_ptr());
      TANDEM_NCCL_ENQUEUE(
          on, ncclAllGather(input.data_ptr(), f, input.numel(), nccl_type(input.dtype()), on.comm, on.stream));
      for (int k = 0; k < n; ++k) {
        TANDEM_CUDA_CHECK(
            cudaMemcpyAsync(outputs[k].data_ptr(), f + bytes * k, bytes, cudaMemcpyDeviceToDevice, on.stream));
      }
    });
  }

  WorkPtr allgather_into(const Tensor& output, const Tensor& input) override {
    if (is_cpu_tensor(input)) return cpu("allgather_into").allgather_into(output, input);
    Launch l;
    l.fingerprint = check_allgather_into(*this, output, input);
    check_device(input, "allgather_into", "input");
    l.kind = OpKind::allgather_into;
    l.result = {output};
    l.keep = {input};
    return launch(std::move(l), [output, input](const NcclLaunch& on, TensorList&) {
      if (input.numel() == 0) return;
      TANDEM_NCCL_ENQUEUE(on, ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                                            nccl_type(input.dtype()), on.comm, on.stream));
    });
  }

  WorkPtr reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp reduce) override {
    if (is_cpu_tensor(output)) return cpu("reduce_scatter").reduce_scatter(output, inputs, reduce);
    Launch l;
    l.fingerprint = check_reduce_scatter(*this, output, inputs, reduce);
    check_device(output, "reduce_scatter", "output");  // the inputs: on the output's device
    l.kind = OpKind::reduce_scatter;
    l.reduce = reduce;
    l.result = {output};
    l.keep = inputs;
    const int n = size();
    Tensor flat = make_empty({n * output.numel()}, output.dtype(), Device::cuda(comm_->device), "reduce_scatter");
    l.keep.push_back(flat);  // allocated before the launch: never inside the handle lock (comm.h)
    return launch(std::move(l), [output, inputs, reduce, n, flat](const NcclLaunch& on, TensorList&) {
      const size_t bytes = output.nbytes();
      if (bytes == 0) return;
      char* f = static_cast<char*>(flat.data_ptr());
      for (int k = 0; k < n; ++k) {
        TANDEM_CUDA_CHECK(
            cudaMemcpyAsync(f + bytes * k, inputs[k].data_ptr(), bytes, cudaMemcpyDeviceToDevice, on.stream));
      }
      const Dtype dt = output.dtype();
      TANDEM_NCCL_ENQUEUE(on, ncclReduceScatter(f, output.data_ptr(), output.numel(), nccl_type(dt),
                                                nccl_op(reduce, dt), on.comm, on.stream));
    });
  }

  WorkPtr reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp reduce) override {
    if (is_cpu_tensor(output)) return cpu("reduce_scatter_tensor").reduce_scatter_tensor(output, input, reduce);
    Launch l;
    l.fingerprint = check_reduce_scatter_tensor(*this, output, input, reduce);
    check_device(output, "reduce_scatter_tensor", "output");
    l.kind = OpKind::reduce_scatter_tensor;
    l.reduce = reduce;
    l.result = {output};
    l.keep = {input};
    return launch(std::move(l), [output, input, reduce](const NcclLaunch& on, TensorList&) {
      if (output.numel() == 0) return;
      const Dtype dt = output.dtype();
      TANDEM_NCCL_ENQUEUE(on, ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), nccl_type(dt),
                                                nccl_op(reduce, dt), on.comm, on.stream));
    });
  }

  WorkPtr all_to_all(const Tensor& output, const Tensor& input, const AllToAllSplits& splits) override {
    if (is_cpu_tensor(input)) return cpu("all_to_all").all_to_all(output, input, splits);
    Launch l;
    l.fingerprint = check_all_to_all(*this, output, input, splits, l.in_splits, l.out_splits);
    check_device(input, "all_to_all", "input");
    const int n = size();
    l.kind = OpKind::all_to_all;
    l.result = {output};
    l.keep = {input};
    std::vector<int64_t> in = l.in_splits, out = l.out_splits;  // copied before l moves into launch
    return launch(std::move(l), [output, input, in, out, n](const NcclLaunch& on, TensorList&) {
      const size_t row = row_bytes(output);
      const char* src = static_cast<const char*>(input.data_ptr());
      char* dst = static_cast<char*>(output.data_ptr());
      NcclCallGroup group(on);
      size_t soff = 0, roff = 0;
      for (int k = 0; k < n; ++k) {
        const size_t sb = in[k] * row, rb = out[k] * row;
        if (sb) TANDEM_NCCL_ENQUEUE(on, ncclSend(src + soff, sb, ncclUint8, k, on.comm, on.stream));
        if (rb) TANDEM_NCCL_ENQUEUE(on, ncclRecv(dst + roff, rb, ncclUint8, k, on.comm, on.stream));
        soff += sb;
        roff += rb;
      }
      group.end();
    });
  }

  // A one-element allreduce: complete once every rank has reached it.
  WorkPtr barrier() override {
    Launch l;
    l.kind = OpKind::barrier;
    l.fingerprint = "barrier";
    // Its own buffer each time (4 bytes from the cache): allocated before the launch, never inside
    // the handle lock (comm.h). The value is never read.
    Tensor buffer = make_empty({1}, i32, Device::cuda(comm_->device), "barrier");
    l.keep.push_back(buffer);
    return launch(std::move(l), [buffer](const NcclLaunch& on, TensorList&) {
      void* p = buffer.data_ptr();
      TANDEM_NCCL_ENQUEUE(on, ncclAllReduce(p, p, 1, ncclInt32, ncclSum, on.comm, on.stream));
    });
  }

  WorkPtr send(const Tensor& tensor, int dst, int tag) override {
    return p2p(OpKind::send, "send", "dst", tensor, dst, tag);
  }

  WorkPtr recv(const Tensor& tensor, int src, int tag) override {
    return p2p(OpKind::recv, "recv", "src", tensor, src, tag);
  }

  // The companion group splits first (it checks that every rank listed the same ranks); its
  // members then bootstrap their communicator over it.
  ProcessGroupPtr new_group(const std::vector<int>& ranks) override {
    ProcessGroupPtr cpu_child = cpu("new_group").new_group(ranks);
    {
      std::lock_guard issue(comm_->issue_mutex);
      ++next_number(OpKind::new_group);  // a collective of this group, as on the other backends
    }
    if (!cpu_child) return nullptr;
    ProcessGroupPtr g = create_group(cpu_child, comm_->device, local_size_, blocking_wait_);
    configure_child(*g);
    return g;
  }

 private:
  // The companion group, for CPU tensors; fails at once when this group is broken.
  ProcessGroup& cpu(const char* op) {
    broken().check(fmt::format("{} on group {}", op, name()));
    return *cpu_;
  }

  void check_device(const Tensor& t, const char* op, const char* what) const {
    TANDEM_CHECK(t.device() == Device::cuda(comm_->device),
                 "[{}] {} is on {} but the nccl group {} communicates on cuda:{} (CPU tensors go over MPI)", op, what,
                 t.device(), name(), comm_->device);
  }

  // send and recv share their checks and their launch: `peer` is the destination or the source.
  WorkPtr p2p(OpKind kind, const char* what, const char* peer_name, const Tensor& tensor, int peer, int tag) {
    const bool sending = kind == OpKind::send;
    if (is_cpu_tensor(tensor)) {
      ProcessGroup& g = cpu(what);
      return sending ? g.send(tensor, peer, tag) : g.recv(tensor, peer, tag);
    }
    check_p2p(*this, what, peer_name, tensor, peer, tag);
    check_device(tensor, what, "tensor");
    Launch l;
    l.kind = kind;
    l.peer = peer;
    l.tag = tag;
    l.result = {tensor};
    return launch(std::move(l), [tensor, peer, sending](const NcclLaunch& on, TensorList&) {
      if (tensor.nbytes() == 0) return;
      if (sending) {
        TANDEM_NCCL_ENQUEUE(on, ncclSend(tensor.data_ptr(), tensor.nbytes(), ncclUint8, peer, on.comm, on.stream));
      } else {
        TANDEM_NCCL_ENQUEUE(on, ncclRecv(tensor.data_ptr(), tensor.nbytes(), ncclUint8, peer, on.comm, on.stream));
      }
    });
  }

  // Issue path: sequence number, debug fingerprints, then the NCCL calls on the comm stream after
  // the caller's stream; no host synchronisation.
  WorkPtr launch(Launch l, const Body& body) {
    NcclComm& c = *comm_;
    c.wait_for_room();  // a bounded run-ahead of the host (see kMaxInFlight)
    std::lock_guard issue(c.issue_mutex);
    const bool collective = !is_p2p(l.kind);
    uint64_t& counter = next_number(l.kind);
    const uint64_t seq = counter;
    const std::string what = describe(l.kind, seq, l.peer, l.tag);
    broken().check(what);
    TANDEM_CHECK(!cpu_->is_broken(), "[dist] cannot run {}: the group is broken (its {} companion group {} is)", what,
                 cpu_->backend(), cpu_->name());
    ++counter;
    if (collective && debug_checks() && size() > 1) exchange_fingerprints(l, seq, what);
    auto work = std::make_shared<Work>(what);
    NcclPending p;
    p.recorder = recorder_ptr();
    p.record = p.recorder->issued(l.kind, seq, l.result, l.reduce, l.kind == OpKind::broadcast || !collective ? l.peer : -1,
                                  l.tag);
    p.record_seq = collective ? static_cast<int64_t>(seq) : -1;
    p.recorder->started(p.record);  // on the device once the caller's stream gets there
    p.what = what;
    p.kind = std::string(op_kind_name(l.kind));
    p.seq = seq;
    p.work = work;
    p.result = std::move(l.result);
    p.keep = std::move(l.keep);
    p.timeout = timeout();
    p.deadline = Clock::now() + p.timeout;
    try {
      cuda::DeviceGuard guard(c.device);
      cudaStream_t s = c.stream.raw();
      // Stream calls that are not NCCL's stay outside the handle lock (comm.h): with a full launch
      // queue they block until the device drains, which an aborted collective may be holding up.
      c.ready.record(cuda::current_stream(c.device));  // after everything the caller issued so far
      c.ready.wait(s);
      {
        std::lock_guard handle(c.handle_mutex);  // see comm.h: the abort waits for this
        ncclComm_t nc = c.comm.load();
        if (nc == nullptr) throw Error(broken().message(what));  // aborted: the group broke meanwhile
        // Each NCCL call returns once NCCL has enqueued it, or by the deadline (NcclLaunch::check):
        // a peer that never connects cannot hold this thread, which holds the issue lock. The few
        // copies some bodies queue between NCCL calls cannot find the queue full: at most
        // NcclComm::kMaxInFlight collectives are queued (wait_for_room above).
        body(NcclLaunch{c, nc, s, what, p.timeout, p.deadline}, p.keep);
      }
      p.done = c.take_event();
      p.done->record(s);  // still under the issue lock: in launch order
    } catch (const TimeoutError& e) {
      // NCCL was still waiting for a peer at the deadline; the message names the operation.
      p.recorder->ended(p.record, p.record_seq, false, e.what());
      c.break_group(e.what());
      flight_dump_on_failure(e.what());
      throw;
    } catch (const std::exception& e) {
      p.recorder->ended(p.record, p.record_seq, false, e.what());
      if (c.broken->is_broken()) throw;  // broken by another thread meanwhile: its error says why
      // This rank's part may be missing while the peers' went ahead: they would wait for it until
      // their timeout, so this group cannot be trusted any more.
      std::string msg = fmt::format("[dist] {} could not be launched: {}; the communicator was aborted and the group "
                                    "is broken", what, e.what());
      c.break_group(msg);
      throw Error(msg);
    }
    // The caching allocator must not hand these blocks out again before the comm stream is done.
    // Outside the handle lock: the allocator's lock may be held by a thread waiting for the device.
    for (const Tensor& t : p.keep) cuda::record_stream(t, c.stream.raw());
    for (const Tensor& t : p.result) cuda::record_stream(t, c.stream.raw());
    if (!blocking_wait_ && l.kind != OpKind::barrier) {
      // wait() orders the waiting thread's stream after the collective instead of blocking the
      // host; the watchdog still completes the Work (continuations, errors) when the event fires.
      // A barrier's wait blocks the host, as in PyTorch: callers use it to hold ranks together.
      const int device = c.device;
      work->order_on_device(p.result, [done = p.done, device] { done->wait(cuda::current_stream(device)); });
    }
    c.push(std::move(p));
    return work;
  }

  // TANDEM_DIST_DEBUG=detail: before the collective, every rank's packed fingerprint goes to every
  // rank over the companion group; all ranks see the same table, so all throw the same mismatch.
  // Blocks the caller (debug mode only).
  void exchange_fingerprints(const Launch& l, uint64_t seq, const std::string& what) {
    const int64_t words = fingerprint_words();
    const std::vector<int64_t> packed = pack_fingerprint(l.fingerprint, l.kind, l.in_splits, l.out_splits);
    Tensor mine = make_empty({words}, i64, kCPU, "dist debug");
    std::memcpy(mine.data_ptr(), packed.data(), mine.nbytes());
    Tensor all = make_empty({size() * words}, i64, kCPU, "dist debug");
    try {
      cpu_->allgather_into(all, mine)->wait();
    } catch (const std::exception& e) {
      std::string msg = fmt::format("[dist] {}: the debug fingerprint exchange failed: {}", what, e.what());
      comm_->break_group(msg);
      throw Error(msg);
    }
    check_fingerprints(seq, l.kind, all.data_ptr<int64_t>());
  }

  ProcessGroupPtr cpu_;
  std::shared_ptr<NcclComm> comm_;
  int local_size_;
  // InitOptions::nccl_blocking_wait: Work::wait blocks the host until the watchdog has seen the
  // collective finish (PyTorch's TORCH_NCCL_BLOCKING_WAIT), for debugging; by default it orders
  // the caller's stream (Work::order_on_device). Sub-groups inherit it.
  bool blocking_wait_;
  std::mutex step_mutex_;  // the step stream's state below
  cuda::Stream step_stream_;  // run_on_step_stream; created at the first use
  cuda::Event step_joined_, step_ready_;
  TensorList step_kept_;  // used on the step stream since the last join
  bool step_queued_ = false;
};

// Collective over `cpu`'s ranks: sets up this rank's device state, broadcasts rank 0's
// ncclUniqueId over `cpu`, agrees that every rank is ready (so that one failing rank makes all
// throw instead of leaving the others in ncclCommInitRank), then creates the communicator.
std::shared_ptr<ProcessGroup> create_group(ProcessGroupPtr cpu, int device, int local_size, bool blocking_wait) {
  const int rank = cpu->rank(), size = cpu->size();
  std::string local_error;
  std::shared_ptr<NcclComm> comm;
  Tensor id = make_empty({kIdWords}, i64, kCPU, "nccl bootstrap");
  std::memset(id.data_ptr(), 0, id.nbytes());
  try {
    comm = std::make_shared<NcclComm>(rank, size, device, cpu->name());
    if (rank == 0) {
      ncclUniqueId uid;
      TANDEM_NCCL_CHECK(ncclGetUniqueId(&uid));
      std::memcpy(id.data_ptr(), &uid, sizeof uid);
    }
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  cpu->broadcast(id, 0)->wait();
  Tensor status = make_empty({1}, i32, kCPU, "nccl bootstrap");
  status.data_ptr<int32_t>()[0] = local_error.empty() ? 0 : 1;
  cpu->allreduce(status, ReduceOp::max)->wait();
  TANDEM_CHECK(local_error.empty(), "[nccl] cannot create nccl group {} on rank {} (cuda:{}): {}", cpu->name(), rank,
               device, local_error);
  TANDEM_CHECK(status.data_ptr<int32_t>()[0] == 0,
               "[nccl] cannot create nccl group {}: another rank failed to set up (see its error)", cpu->name());
  ncclUniqueId uid;
  std::memcpy(&uid, id.data_ptr(), sizeof uid);
  try {
    cuda::DeviceGuard guard(device);
    // Bounded by the timeout: a rank that never joins makes every other rank fail here, not hang.
    comm->comm.store(init_nccl_comm(size, uid, rank, cpu->timeout()));
  } catch (const std::exception& e) {
    std::string hint;
    if (local_size > cuda::device_count()) {
      hint = fmt::format("; {} ranks on this node share {} CUDA device{}, but NCCL needs a device per rank (use "
                         "backend mpi to share a GPU)", local_size, cuda::device_count(),
                         cuda::device_count() == 1 ? "" : "s");
    }
    std::string msg = fmt::format("[nccl] cannot create nccl group {} of {} ranks on rank {} (cuda:{}): {}{}",
                                  cpu->name(), size, rank, device, e.what(), hint);
    // A peer may be hung: recorded process-wide, so that the exit does not wait for it forever.
    comm->broken->mark(msg);
    throw Error(msg);
  }
  comm->teardown_ms.store(cpu->timeout().count());
  comm->start_watchdog(comm);
  return std::make_shared<NcclGroup>(std::move(cpu), std::move(comm), local_size, blocking_wait);
}

}  // namespace

bool nccl_available() {
  try {
    if (!cuda::is_available()) return false;
    return !launched_by_mpi() || mpi_info().local_size <= cuda::device_count();
  } catch (...) {
    return false;
  }
}

ProcessGroupPtr make_nccl_world(const InitOptions& options) {
  TANDEM_CHECK(cuda::is_available(), "[dist] the nccl backend needs a CUDA device: {}", cuda::unavailable_reason());
  ProcessGroupPtr cpu;
  int device = 0, local_size = 1;
  if (launched_by_mpi()) {
    MpiInfo m = mpi_info();
    cpu = make_mpi_world(options.timeout, options.debug_checks);
    device = m.local_rank % cuda::device_count();  // the local rank picks the device
    local_size = m.local_size;
  } else {
    cpu = make_thread_world(1, ThreadsOptions{options.timeout, options.debug_checks})[0];
    device = cuda::current_device();
  }
  cuda::set_device(device);
  return create_group(std::move(cpu), device, local_size, blocking_wait_requested(options.nccl_blocking_wait));
}

}  // namespace tandem::dist

#endif  // TANDEM_WITH_NCCL
