#include "dist/mpi/mpi.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "dist/detail/comm_thread.h"
#include "dist/detail/host_staging.h"
#include "dist/detail/queued_group.h"
#include "dist/detail/reduce_kernels.h"

namespace tandem::dist {

namespace {

void check_mpi(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) [[likely]] return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail("[mpi] {} failed: {} ({}:{})", call, std::string(text, len), file, line);
}
#define TANDEM_MPI_CHECK(...) check_mpi((__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)

// How a thread waits for MPI requests. Peers in step complete within a few polls, so it spins
// first (latency); then it yields, which also covers a large transfer in flight; once a peer is
// clearly late (> 1 ms: DDP launches buckets long before slower ranks reach them) it sleeps in
// growing steps up to 100 us, so a waiting comm thread does not keep taking the core from the
// compute threads of its own or another rank. When there is no compute to make room for (a caller
// running a blocking op itself, or a comm thread while some thread of the process is blocked in
// Work::wait) it is patient for as long as the op's `bytes` take at 1 GB/s before sleeping: an
// 8 MiB exchange takes ~3 ms here, and a rank asleep when its peer finishes lost up to 100 us of
// it (with 1 ms only, the 16 MiB allreduce ran at 0.88 x raw MPI, 0.99 x with this). A comm
// thread that patient during compute made a DDP step 3-7 % slower (7 A/B runs).
class Backoff {
 public:
  explicit Backoff(size_t bytes = 0) : transfer_time_(static_cast<int64_t>(bytes)) {}

  void pause() {
    ++polls_;
    if (polls_ < 128) return;
    if (polls_ == 128) start_ = std::chrono::steady_clock::now();
    if (!sleeping_) {
      // The clock is read every 16th pause: a read costs as much as a poll (perf put it at 4 %
      // of a 256 KiB allreduce when read on every one).
      if ((polls_ & 15) != 0 || patient(std::chrono::steady_clock::now() - start_)) {
        std::this_thread::yield();
        return;
      }
      sleeping_ = true;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(100));
  }

 private:
  bool patient(std::chrono::nanoseconds waited) const {
    if (waited < std::chrono::milliseconds(1)) return true;
    return waited < transfer_time_ && (caller_runs_op() || threads_waiting_on_work() > 0);
  }

  std::chrono::nanoseconds transfer_time_;
  uint64_t polls_ = 0;
  bool sleeping_ = false;
  std::chrono::steady_clock::time_point start_{};
  std::chrono::microseconds sleep_{5};
};

class MpiGroup;

// Process-wide MPI state: initialisation, the lock used when MPI is only SERIALIZED, and the live
// groups (so finalize can stop them first).
struct Runtime {
  std::mutex init_mutex;
  bool initialized = false;
  bool finalized = false;
  bool we_initialized = false;
  bool serialized = false;
  MpiInfo info;
  std::mutex call_mutex;
  std::mutex groups_mutex;
  std::set<MpiGroup*> groups;

  std::unique_lock<std::mutex> lock() {
    return serialized ? std::unique_lock<std::mutex>(call_mutex) : std::unique_lock<std::mutex>();
  }
};

Runtime& runtime() {
  static Runtime* r = new Runtime();  // never destroyed: groups may outlive static destruction
  return *r;
}

void ensure_initialized() {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.init_mutex);
  TANDEM_CHECK(!rt.finalized, "[mpi] MPI was already finalised (dist::finalize or program exit)");
  if (rt.initialized) return;
  int already = 0;
  TANDEM_MPI_CHECK(MPI_Initialized(&already));
  int provided = 0;
  if (already) {
    TANDEM_MPI_CHECK(MPI_Query_thread(&provided));
  } else {
    TANDEM_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    rt.we_initialized = true;
    std::atexit(mpi_finalize);
  }
  TANDEM_CHECK(provided >= MPI_THREAD_SERIALIZED,
               "[mpi] the MPI library provides thread level {} but Tandem's communication threads need "
               "MPI_THREAD_SERIALIZED ({}) or MPI_THREAD_MULTIPLE ({})", provided, MPI_THREAD_SERIALIZED,
               MPI_THREAD_MULTIPLE);
  rt.serialized = provided < MPI_THREAD_MULTIPLE;
  TANDEM_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MpiInfo& info = rt.info;
  info.thread_level = provided;
  TANDEM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &info.rank));
  TANDEM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &info.size));
  MPI_Comm node = MPI_COMM_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &node));
  TANDEM_MPI_CHECK(MPI_Comm_rank(node, &info.local_rank));
  TANDEM_MPI_CHECK(MPI_Comm_size(node, &info.local_size));
  TANDEM_MPI_CHECK(MPI_Comm_free(&node));
  rt.initialized = true;
}

MPI_Datatype mpi_type(Dtype d) {
  switch (d) {
    case f32: return MPI_FLOAT;
    case f64: return MPI_DOUBLE;
    case i32: return MPI_INT32_T;
    case i64: return MPI_INT64_T;
    case boolean: return MPI_C_BOOL;
    case f16:
    case bf16: return MPI_UINT16_T;  // bit patterns; only Tandem's user ops reduce them
  }
  return MPI_DATATYPE_NULL;
}

// MPI user ops for the 2-byte floats: combine element by element in float.
template <class T, ReduceOp R>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  detail::reduce_into(static_cast<T*>(inout), static_cast<const T*>(in), *len, R);
}

struct HalfOps {
  MPI_Op ops[2][5];  // [f16, bf16][ReduceOp]
};

HalfOps& half_ops() {
  static HalfOps* ops = [] {
    auto* h = new HalfOps();
    auto make = [](MPI_User_function* f) {
      MPI_Op op;
      TANDEM_MPI_CHECK(MPI_Op_create(f, 1, &op));
      return op;
    };
    h->ops[0][0] = make(&half_op<Half, ReduceOp::sum>);
    h->ops[0][1] = h->ops[0][0];
    h->ops[0][2] = make(&half_op<Half, ReduceOp::min>);
    h->ops[0][3] = make(&half_op<Half, ReduceOp::max>);
    h->ops[0][4] = make(&half_op<Half, ReduceOp::product>);
    h->ops[1][0] = make(&half_op<BFloat16, ReduceOp::sum>);
    h->ops[1][1] = h->ops[1][0];
    h->ops[1][2] = make(&half_op<BFloat16, ReduceOp::min>);
    h->ops[1][3] = make(&half_op<BFloat16, ReduceOp::max>);
    h->ops[1][4] = make(&half_op<BFloat16, ReduceOp::product>);
    return h;
  }();
  return *ops;
}

MPI_Op mpi_op(ReduceOp r, Dtype d) {
  if (d == f16 || d == bf16) return half_ops().ops[d == f16 ? 0 : 1][static_cast<int>(r)];
  if (d == boolean) return (r == ReduceOp::sum || r == ReduceOp::max) ? MPI_LOR : MPI_LAND;
  switch (r) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::product: return MPI_PROD;
  }
  return MPI_OP_NULL;
}

int to_int(int64_t v, const char* what) {
  TANDEM_CHECK(v <= INT_MAX, "[mpi] {} of {} exceeds MPI's int count limit", what, v);
  return static_cast<int>(v);
}

constexpr int kRingTag = 11;
constexpr int kDebugTag = 12;

class MpiGroup final : public QueuedGroup {
 public:
  // Takes ownership of `comm` (a communicator private to this group).
  MpiGroup(MPI_Comm comm, std::string name) : QueuedGroup(comm_rank(comm), comm_size(comm), std::move(name)) {
    coll_ = comm;
    TANDEM_MPI_CHECK(MPI_Comm_set_errhandler(coll_, MPI_ERRORS_RETURN));
    TANDEM_MPI_CHECK(MPI_Comm_dup(coll_, &p2p_));
    TANDEM_MPI_CHECK(MPI_Comm_dup(coll_, &debug_));
    std::lock_guard lock(runtime().groups_mutex);
    runtime().groups.insert(this);
  }
  ~MpiGroup() override {
    {
      std::lock_guard lock(runtime().groups_mutex);
      runtime().groups.erase(this);
    }
    shutdown();
  }
  std::string_view backend() const override { return "mpi"; }

  // Stops the thread and frees the communicators (no throw: runs from destructors and finalize).
  void shutdown() noexcept {
    stop_comm_thread();
    if (coll_ == MPI_COMM_NULL || runtime().finalized) return;
    for (MPI_Comm* c : {&coll_, &p2p_, &debug_}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
      *c = MPI_COMM_NULL;
    }
  }

 protected:
  // Device tensors go through host copies (detail/host_staging.h).
  void on_issue(const Op& op) override { sync_device_tensors(op); }
  void execute(Op& op) override {
    HostStaging staging(op);
    run(op);
    staging.finish();
  }

 private:
  void run(Op& op) {
    if (op.kind == OpKind::send) return do_send(op);
    if (op.kind == OpKind::recv) return do_recv(op);
    if (op.kind == OpKind::new_group) return do_new_group(op);
    if (op.debug && size() > 1) exchange_fingerprints(op);
    switch (op.kind) {
      case OpKind::allreduce: {
        if (op.started) {
          finish(op, *op.started);  // begun by the issuing thread
          break;
        }
        const Tensor& t = op.inputs[0];
        allreduce_buffer(op, t.data_ptr(), t.numel(), t.dtype());
        break;
      }
      case OpKind::allreduce_coalesced: {
        int64_t total = 0;
        for (const Tensor& t : op.inputs) total += t.numel();
        const Dtype dt = op.inputs[0].dtype();
        char* buf = scratch(0, total * itemsize(dt));
        size_t off = 0;
        for (const Tensor& t : op.inputs) {
          if (t.nbytes()) std::memcpy(buf + off, t.data_ptr(), t.nbytes());
          off += t.nbytes();
        }
        allreduce_buffer(op, buf, total, dt);
        off = 0;
        for (const Tensor& t : op.inputs) {
          if (t.nbytes()) std::memcpy(t.data_ptr(), buf + off, t.nbytes());
          off += t.nbytes();
        }
        break;
      }
      case OpKind::broadcast: {
        const Tensor& t = op.inputs[0];
        MPI_Request req;
        {
          auto lk = runtime().lock();
          TANDEM_MPI_CHECK(MPI_Ibcast(t.data_ptr(), to_int(t.nbytes(), "broadcast bytes"), MPI_BYTE, op.root, coll_, &req));
        }
        wait_collective(op, &req, 1, t.nbytes());
        break;
      }
      case OpKind::allgather:
      case OpKind::allgather_into: {
        const Tensor& in = op.inputs[0];
        const int bytes = to_int(in.nbytes(), "allgather bytes per rank");
        char* out = op.kind == OpKind::allgather_into ? static_cast<char*>(op.outputs[0].data_ptr())
                                                      : scratch(0, static_cast<size_t>(bytes) * size());
        const void* send = in.data_ptr() == out + static_cast<size_t>(bytes) * rank() ? MPI_IN_PLACE : in.data_ptr();
        MPI_Request req;
        {
          auto lk = runtime().lock();
          TANDEM_MPI_CHECK(MPI_Iallgather(send, bytes, MPI_BYTE, out, bytes, MPI_BYTE, coll_, &req));
        }
        wait_collective(op, &req, 1, static_cast<size_t>(bytes) * size());
        if (op.kind == OpKind::allgather) {
          for (int k = 0; k < size(); ++k)
            if (bytes) std::memcpy(op.outputs[k].data_ptr(), out + static_cast<size_t>(bytes) * k, bytes);
        }
        break;
      }
      case OpKind::reduce_scatter:
      case OpKind::reduce_scatter_tensor: {
        const Tensor& out = op.outputs[0];
        const Dtype dt = out.dtype();
        const void* in = op.inputs[0].data_ptr();
        if (op.kind == OpKind::reduce_scatter) {
          char* buf = scratch(0, out.nbytes() * size());
          for (int k = 0; k < size(); ++k)
            if (out.nbytes()) std::memcpy(buf + out.nbytes() * k, op.inputs[k].data_ptr(), out.nbytes());
          in = buf;
        }
        MPI_Request req;
        {
          auto lk = runtime().lock();
          TANDEM_MPI_CHECK(MPI_Ireduce_scatter_block(in, out.data_ptr(), to_int(out.numel(), "reduce_scatter count"),
                                                     mpi_type(dt), mpi_op(op.reduce, dt), coll_, &req));
        }
        wait_collective(op, &req, 1, out.nbytes() * size());
        if (op.reduce == ReduceOp::avg) divide(out.data_ptr(), out.numel(), dt);
        break;
      }
      case OpKind::all_to_all: {
        const Tensor& in = op.inputs[0];
        const Tensor& out = op.outputs[0];
        const int64_t row = static_cast<int64_t>(row_bytes(out));
        const int n = size();
        std::vector<int> sc(n), sd(n), rc(n), rd(n);
        int64_t soff = 0, roff = 0;
        for (int k = 0; k < n; ++k) {
          sc[k] = to_int(op.in_splits[k] * row, "all_to_all bytes");
          sd[k] = to_int(soff, "all_to_all offset");
          rc[k] = to_int(op.out_splits[k] * row, "all_to_all bytes");
          rd[k] = to_int(roff, "all_to_all offset");
          soff += sc[k];
          roff += rc[k];
        }
        MPI_Request req;
        {
          auto lk = runtime().lock();
          TANDEM_MPI_CHECK(MPI_Ialltoallv(in.data_ptr(), sc.data(), sd.data(), MPI_BYTE, out.data_ptr(), rc.data(),
                                          rd.data(), MPI_BYTE, coll_, &req));
        }
        wait_collective(op, &req, 1, static_cast<size_t>(soff + roff));
        break;
      }
      case OpKind::barrier: {
        MPI_Request req;
        {
          auto lk = runtime().lock();
          TANDEM_MPI_CHECK(MPI_Ibarrier(coll_, &req));
        }
        wait_collective(op, &req, 1);
        break;
      }
      default: break;
    }
  }

  static int comm_rank(MPI_Comm c) {
    int r = 0;
    TANDEM_MPI_CHECK(MPI_Comm_rank(c, &r));
    return r;
  }
  static int comm_size(MPI_Comm c) {
    int s = 0;
    TANDEM_MPI_CHECK(MPI_Comm_size(c, &s));
    return s;
  }

  // Scratch memory owned by the communication thread (two independent areas).
  char* scratch(int which, size_t bytes) {
    auto& s = scratch_[which];
    if (s.size() < bytes) s.resize(bytes);
    return s.data();
  }

  void divide(void* p, int64_t n, Dtype dt) {
    TANDEM_DISPATCH_FLOATING(dt, "allreduce", [&] { detail::divide_by(static_cast<scalar_t*>(p), n, size()); });
  }

  // Polls the requests, which move `bytes` in all, until all complete; false at the deadline. See
  // Backoff for the pacing.
  bool poll(const Op& op, MPI_Request* reqs, int n, size_t bytes = 0) {
    Backoff backoff(bytes);
    for (uint64_t spin = 0;; ++spin) {
      int done = 0;
      {
        auto lk = runtime().lock();
        TANDEM_MPI_CHECK(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
      }
      if (done) return true;
      if ((spin & 63) == 63 && Clock::now() > op.deadline) return false;
      backoff.pause();
    }
  }

  [[noreturn]] void collective_timeout(const Op& op) {
    throw TimeoutError(fmt::format("[dist] {} timed out after {} ms; the group is broken. The mpi backend cannot "
                                   "tell which ranks did not arrive unless TANDEM_DIST_DEBUG=detail is set",
                                   describe(op), op.timeout.count()),
                       false);
  }

  void wait_collective(const Op& op, MPI_Request* reqs, int n, size_t bytes = 0) {
    if (!poll(op, reqs, n, bytes)) collective_timeout(op);
  }

  // ---- allreduce ----

  void allreduce_buffer(Op& op, void* data, int64_t count, Dtype dt) {
    const int n = size();
    if (n == 1 || count == 0) return;
    if (use_ring(count * itemsize(dt), n) && count >= n) {
      ring_allreduce(op, static_cast<char*>(data), count, dt);
      if (op.reduce == ReduceOp::avg) divide(data, count, dt);
      return;
    }
    SmallAllreduce small(*this, op.reduce, static_cast<char*>(data), count, dt);
    finish(op, small);
  }

  // The issuing thread's fast path (QueuedGroup::start): one small CPU tensor, no debug exchange.
  bool can_start(const Op& op) const override {
    if (op.kind != OpKind::allreduce || op.debug) return false;
    const Tensor& t = op.inputs[0];
    return t.is_cpu() && t.nbytes() <= kInlineBytes;
  }

  std::unique_ptr<StartedOp> start(Op& op) override {
    const Tensor& t = op.inputs[0];
    return std::make_unique<SmallAllreduce>(*this, op.reduce, static_cast<char*>(t.data_ptr()), t.numel(), t.dtype());
  }

  // Polls a started op to completion; a TimeoutError at the deadline (see Backoff for the pacing).
  void finish(const Op& op, StartedOp& started) {
    Backoff backoff;
    for (uint64_t spin = 0; !started.progress(); ++spin) {
      if ((spin & 63) == 63 && Clock::now() > op.deadline) collective_timeout(op);
      backoff.pause();
    }
  }

  // An allreduce too small for the ring (use_ring) as a StartedOp, so the issuing thread can
  // begin it and the communication thread finish it. With a power-of-two group, recursive
  // doubling: log2(n) rounds, each exchanging the whole buffer with rank ^ 2^k and combining in
  // the same order on both partners (lower rank's data first), so every rank ends with identical
  // bits. Otherwise one MPI_Iallreduce.
  class SmallAllreduce final : public StartedOp {
   public:
    SmallAllreduce(MpiGroup& g, ReduceOp reduce, char* data, int64_t count, Dtype dt)
        : g_(g), reduce_(reduce), data_(data), count_(count), dt_(dt), bytes_(count * itemsize(dt)) {
      const int n = g.size();
      if (n == 1 || count == 0) {
        done_ = true;
      } else if ((n & (n - 1)) == 0) {
        tmp_ = g.scratch(1, bytes_);
        post_round();
      } else {
        auto lk = runtime().lock();
        TANDEM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data_, to_int(count_, "allreduce count"), mpi_type(dt_),
                                        mpi_op(reduce_, dt_), g.coll_, &reqs_[0]));
        nreq_ = 1;
      }
    }
    ~SmallAllreduce() override {
      // Only after a failure: free what is still posted (the group is broken by then).
      for (int i = 0; i < nreq_; ++i)
        if (reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs_[i]);
    }

    bool progress() override {
      if (done_) return true;
      int flag = 0;
      {
        auto lk = runtime().lock();
        TANDEM_MPI_CHECK(MPI_Testall(nreq_, reqs_, &flag, MPI_STATUSES_IGNORE));
      }
      if (!flag) return false;
      nreq_ = 0;
      if (tmp_) {
        const int peer = g_.rank() ^ mask_;
        if (g_.rank() < peer) {
          g_.reduce_local(data_, tmp_, count_, dt_, reduce_);
        } else {
          g_.reduce_local(tmp_, data_, count_, dt_, reduce_);
          std::memcpy(data_, tmp_, bytes_);
        }
        mask_ <<= 1;
        if (mask_ < g_.size()) {
          post_round();
          return false;
        }
      }
      if (reduce_ == ReduceOp::avg) g_.divide(data_, count_, dt_);
      done_ = true;
      return true;
    }

   private:
    // Posts the exchange with rank ^ mask_, in pieces that fit MPI's eager protocol: Open MPI's
    // shared-memory transport sends at most 4 KiB (header included) eagerly and a larger message
    // costs a rendezvous round trip (measured here: 4 KiB whole 7.9 us, as pieces 4.2 us, raw
    // MPI_Allreduce 4.9 us).
    void post_round() {
      const int peer = g_.rank() ^ mask_;
      const size_t item = itemsize(dt_);
      const size_t piece = bytes_ <= kPieceBytes * kMaxPieces ? kPieceBytes / item * item : bytes_;
      auto lk = runtime().lock();
      for (size_t off = 0; off < bytes_; off += piece) {
        int len = static_cast<int>(std::min(piece, bytes_ - off));
        TANDEM_MPI_CHECK(MPI_Irecv(tmp_ + off, len, MPI_BYTE, peer, kRingTag, g_.coll_, &reqs_[nreq_++]));
      }
      for (size_t off = 0; off < bytes_; off += piece) {
        int len = static_cast<int>(std::min(piece, bytes_ - off));
        TANDEM_MPI_CHECK(MPI_Isend(data_ + off, len, MPI_BYTE, peer, kRingTag, g_.coll_, &reqs_[nreq_++]));
      }
    }

    static constexpr size_t kPieceBytes = 4000;
    static constexpr int kMaxPieces = 8;  // up to 32,000 bytes in pieces; above, whole messages

    MpiGroup& g_;
    ReduceOp reduce_;
    char* data_;
    char* tmp_ = nullptr;  // set for recursive doubling
    int64_t count_;
    Dtype dt_;
    size_t bytes_;
    int mask_ = 1;
    bool done_ = false;
    MPI_Request reqs_[2 * kMaxPieces] = {};
    int nreq_ = 0;
  };

  void reduce_local(char* acc, const char* src, int64_t count, Dtype dt, ReduceOp r) {
    TANDEM_DISPATCH_ALL(dt, "allreduce", [&] {
      detail::reduce_into(reinterpret_cast<scalar_t*>(acc), reinterpret_cast<const scalar_t*>(src), count, r);
    });
  }

  // Exchanges `send_bytes` with `peer` and receives `recv_bytes` from `from` (in MPI_BYTE pieces
  // that fit an int).
  void exchange(const Op& op, const char* send, size_t send_bytes, int to, char* recv, size_t recv_bytes, int from) {
    std::vector<MPI_Request> reqs;
    {
      auto lk = runtime().lock();
      for (size_t off = 0; off < recv_bytes; off += kMaxMessage) {
        reqs.emplace_back();
        int len = static_cast<int>(std::min(kMaxMessage, recv_bytes - off));
        TANDEM_MPI_CHECK(MPI_Irecv(recv + off, len, MPI_BYTE, from, kRingTag, coll_, &reqs.back()));
      }
      for (size_t off = 0; off < send_bytes; off += kMaxMessage) {
        reqs.emplace_back();
        int len = static_cast<int>(std::min(kMaxMessage, send_bytes - off));
        TANDEM_MPI_CHECK(MPI_Isend(send + off, len, MPI_BYTE, to, kRingTag, coll_, &reqs.back()));
      }
    }
    if (!reqs.empty()) wait_collective(op, reqs.data(), static_cast<int>(reqs.size()), send_bytes + recv_bytes);
  }

  // Ring reduce-scatter then ring allgather: each rank sends 2 (n-1)/n of the buffer.
  void ring_allreduce(const Op& op, char* data, int64_t count, Dtype dt) {
    const int n = size(), r = rank();
    const size_t item = itemsize(dt);
    auto lo = [&](int c) { return count * c / n; };
    auto len = [&](int c) { return lo(c + 1) - lo(c); };
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    char* tmp = scratch(1, (count / n + 1) * item);
    for (int s = 0; s < n - 1; ++s) {
      int send_c = ((r - s) % n + n) % n, recv_c = ((r - s - 1) % n + n) % n;
      exchange(op, data + lo(send_c) * item, len(send_c) * item, right, tmp, len(recv_c) * item, left);
      reduce_local(data + lo(recv_c) * item, tmp, len(recv_c), dt, op.reduce);
    }
    for (int s = 0; s < n - 1; ++s) {
      int send_c = ((r + 1 - s) % n + n) % n, recv_c = ((r - s) % n + n) % n;
      exchange(op, data + lo(send_c) * item, len(send_c) * item, right, data + lo(recv_c) * item,
               len(recv_c) * item, left);
    }
  }

  // ---- debug fingerprints ----

  // Every rank sends its packed fingerprint to every other rank, point to point, so that a rank
  // that never arrives is named; all ranks then hold the same table and reach the same verdict.
  void exchange_fingerprints(const Op& op) {
    const int n = size(), me = rank();
    const int64_t words = fingerprint_words();
    const std::vector<int64_t> mine = pack_fingerprint(op.fingerprint, op.kind, op.in_splits, op.out_splits);
    std::vector<int64_t> table(n * words);
    std::copy(mine.begin(), mine.end(), table.begin() + me * words);
    const int bytes = to_int(words * static_cast<int64_t>(sizeof(int64_t)), "fingerprint bytes");
    std::vector<MPI_Request> recvs(n, MPI_REQUEST_NULL), sends(n, MPI_REQUEST_NULL);
    {
      auto lk = runtime().lock();
      for (int k = 0; k < n; ++k) {
        if (k == me) continue;
        TANDEM_MPI_CHECK(MPI_Irecv(&table[k * words], bytes, MPI_BYTE, k, kDebugTag, debug_, &recvs[k]));
        TANDEM_MPI_CHECK(MPI_Isend(mine.data(), bytes, MPI_BYTE, k, kDebugTag, debug_, &sends[k]));
      }
    }
    if (!poll(op, recvs.data(), n)) {
      std::vector<int> missing;
      auto lk = runtime().lock();
      for (int k = 0; k < n; ++k) {
        if (recvs[k] == MPI_REQUEST_NULL) continue;
        int done = 0;
        MPI_Test(&recvs[k], &done, MPI_STATUS_IGNORE);
        if (done) continue;
        missing.push_back(k);
        MPI_Cancel(&recvs[k]);
        MPI_Request_free(&recvs[k]);
      }
      for (auto& s : sends)
        if (s != MPI_REQUEST_NULL) MPI_Request_free(&s);
      throw TimeoutError(fmt::format("[dist] {} timed out after {} ms: {} {} did not arrive", describe(op),
                                     op.timeout.count(), missing.size() == 1 ? "rank" : "ranks",
                                     join_ranks(missing)),
                         false);
    }
    wait_collective(op, sends.data(), n);
    check_fingerprints(op.seq, op.kind, table.data());
  }

  // ---- point to point ----

  void do_send(Op& op) {
    const Tensor& t = op.inputs[0];
    MPI_Request req;
    {
      auto lk = runtime().lock();
      TANDEM_MPI_CHECK(MPI_Isend(t.data_ptr(), to_int(t.nbytes(), "send bytes"), MPI_BYTE, op.root, op.tag, p2p_, &req));
    }
    if (poll(op, &req, 1)) return;
    bool cancelled = cancel(req);
    throw TimeoutError(fmt::format("[dist] {} timed out after {} ms: rank {} did not receive{}", describe(op),
                                   op.timeout.count(), op.root, cancelled ? "" : "; the group is broken"),
                       cancelled);
  }

  void do_recv(Op& op) {
    const Tensor& t = op.inputs[0];
    MPI_Request req;
    MPI_Status status;
    {
      auto lk = runtime().lock();
      TANDEM_MPI_CHECK(MPI_Irecv(t.data_ptr(), to_int(t.nbytes(), "recv bytes"), MPI_BYTE, op.root, op.tag, p2p_, &req));
    }
    bool done = false;
    int rc = MPI_SUCCESS;
    Backoff backoff;
    for (uint64_t spin = 0;; ++spin) {
      int flag = 0;
      {
        auto lk = runtime().lock();
        rc = MPI_Test(&req, &flag, &status);
      }
      if (rc != MPI_SUCCESS || flag) {
        done = true;
        break;
      }
      if ((spin & 63) == 63 && Clock::now() > op.deadline) break;
      backoff.pause();
    }
    if (!done) {
      bool cancelled = cancel(req);
      throw TimeoutError(fmt::format("[dist] {} timed out after {} ms: rank {} did not send{}", describe(op),
                                     op.timeout.count(), op.root, cancelled ? "" : "; the group is broken"),
                         cancelled);
    }
    int err_class = MPI_SUCCESS;
    if (rc != MPI_SUCCESS) MPI_Error_class(rc, &err_class);
    TANDEM_CHECK(err_class != MPI_ERR_TRUNCATE && status.MPI_ERROR != MPI_ERR_TRUNCATE,
                 "[recv] rank {} sent more than the receive tensor on rank {} holds ({} {}, {} bytes, tag {})", op.root,
                 rank(), t.dtype(), t.shape(), t.nbytes(), op.tag);
    TANDEM_MPI_CHECK(rc);
    int count = 0;
    TANDEM_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
    TANDEM_CHECK(static_cast<size_t>(count) == t.nbytes(),
                 "[recv] rank {} sent {} bytes but the receive tensor on rank {} is {} {} ({} bytes, tag {})", op.root,
                 count, rank(), t.dtype(), t.shape(), t.nbytes(), op.tag);
  }

  // True when the pending request was cancelled (nothing of it remains in flight).
  bool cancel(MPI_Request& req) {
    auto lk = runtime().lock();
    if (MPI_Cancel(&req) != MPI_SUCCESS) return false;
    MPI_Status st;
    if (MPI_Wait(&req, &st) != MPI_SUCCESS) return false;
    int cancelled = 0;
    MPI_Test_cancelled(&st, &cancelled);
    return cancelled != 0;
  }

  // ---- sub-groups ----

  void do_new_group(Op& op) {
    const int n = size();
    // Every rank must list the same ranks: gather the lists and compare.
    int len = static_cast<int>(op.ranks.size());
    std::vector<int> lens(n);
    MPI_Request req;
    {
      auto lk = runtime().lock();
      TANDEM_MPI_CHECK(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, coll_, &req));
    }
    wait_collective(op, &req, 1);
    std::vector<int> displs(n);
    int total = 0;
    for (int k = 0; k < n; ++k) {
      displs[k] = total;
      total += lens[k];
    }
    std::vector<int> all(total);
    {
      auto lk = runtime().lock();
      TANDEM_MPI_CHECK(MPI_Iallgatherv(op.ranks.data(), len, MPI_INT, all.data(), lens.data(), displs.data(), MPI_INT,
                                       coll_, &req));
    }
    wait_collective(op, &req, 1);
    std::vector<std::string> fps(n);
    bool mismatch = false;
    for (int k = 0; k < n; ++k) {
      std::vector<int> theirs(all.begin() + displs[k], all.begin() + displs[k] + lens[k]);
      fps[k] = new_group_fingerprint(theirs);
      mismatch |= theirs != op.ranks;
    }
    if (mismatch) fail_mismatch(op.seq, fps);
    auto it = std::find(op.ranks.begin(), op.ranks.end(), rank());
    int color = it == op.ranks.end() ? MPI_UNDEFINED : 0;
    int key = static_cast<int>(it - op.ranks.begin());
    MPI_Comm sub = MPI_COMM_NULL;
    {
      // Blocking, but every rank has just passed the gathers above, so none is missing.
      auto lk = runtime().lock();
      TANDEM_MPI_CHECK(MPI_Comm_split(coll_, color, key, &sub));
    }
    std::string child_name = next_child_name();
    ProcessGroupPtr group;
    if (sub != MPI_COMM_NULL) {
      group = std::make_shared<MpiGroup>(sub, child_name);
      configure_child(*group);
    }
    publish_created(op, group);
  }

  // The ring moves 2 (n-1)/n of the buffer in 2 (n-1) steps of bytes/n; recursive doubling moves
  // all of it log2(n) times. The ring wins once its steps are past the rendezvous size: from
  // 64 KiB at n = 2 (128 KiB: 0.81 x raw MPI with recursive doubling, 0.97 x with the ring), and
  // with chunks of at least 32 KiB in larger groups (256 KiB at n = 8, where it was set before).
  static constexpr size_t kRingMinBytes = 64 * 1024;
  static constexpr size_t kRingChunkBytes = 32 * 1024;
  static bool use_ring(size_t bytes, int n) {
    return bytes >= std::max(kRingMinBytes, kRingChunkBytes * static_cast<size_t>(n));
  }
  static constexpr size_t kInlineBytes = 32 * 1024;  // ~20 us here: well inside QueuedGroup::kInlineBudget
  static constexpr size_t kMaxMessage = size_t(1) << 30;

  MPI_Comm coll_ = MPI_COMM_NULL;   // collectives (and the ring's messages)
  MPI_Comm p2p_ = MPI_COMM_NULL;    // user send/recv, so their tags never meet the ring's
  MPI_Comm debug_ = MPI_COMM_NULL;  // fingerprints
  std::vector<char> scratch_[2];
};

}  // namespace

MpiInfo mpi_info() {
  ensure_initialized();
  return runtime().info;
}

ProcessGroupPtr make_mpi_world(std::optional<Milliseconds> timeout, std::optional<bool> debug_checks) {
  ensure_initialized();
  MPI_Comm comm = MPI_COMM_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  auto g = std::make_shared<MpiGroup>(comm, "world");
  if (timeout) g->set_timeout(*timeout);
  if (debug_checks) g->set_debug_checks(*debug_checks);
  return g;
}

void mpi_finalize() {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.init_mutex);
  if (!rt.initialized || rt.finalized) return;
  {
    std::lock_guard glock(rt.groups_mutex);
    for (MpiGroup* g : rt.groups) g->shutdown();
  }
  rt.finalized = true;
  if (rt.we_initialized) MPI_Finalize();
}

}  // namespace tandem::dist
