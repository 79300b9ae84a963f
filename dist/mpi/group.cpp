// The mpi group: the collectives over MPI (the allreduce algorithms are in allreduce.cpp), point
// to point, the debug fingerprint exchange and sub-groups; make_mpi_world and mpi_finalize.
#include "dist/mpi/mpi.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "dist/detail/flight_recorder.h"
#include "dist/detail/host_staging.h"
#include "dist/detail/peer_probe.h"
#include "dist/detail/queued_group.h"
#include "dist/mpi/detail/allreduce.h"
#include "dist/mpi/detail/peer_responder.h"
#include "dist/mpi/detail/runtime.h"

namespace tandem::dist {

namespace {
constexpr int kDebugTag = 12;  // fingerprints, on the group's debug communicator
}  // namespace

// A group over a communicator of its own; its operations run on QueuedGroup's communication thread
// with nonblocking MPI calls polled against the deadline (poll_until).
class MpiGroup final : public QueuedGroup {
 public:
  // Takes ownership of `comm` (a communicator private to this group).
  MpiGroup(MPI_Comm comm, std::string name)
      : QueuedGroup(comm_rank(comm), comm_size(comm), std::move(name),
                    std::make_shared<BrokenState>(/*peers_are_processes=*/true)),
        comm_(comm), coll_(comm, rank(), size()) {
    set_caller_progress(mpi_caller_progress());
    TANDEM_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    TANDEM_MPI_CHECK(MPI_Comm_dup(comm, &p2p_));
    TANDEM_MPI_CHECK(MPI_Comm_dup(comm, &debug_));
    recorder().set_backend("mpi", world_ranks(comm));
    {
      std::lock_guard lock(mpi_runtime().broken_mutex);
      mpi_runtime().broken_by_name.emplace(this->name(), broken_ptr());
    }
    std::lock_guard lock(mpi_runtime().groups_mutex);
    mpi_runtime().groups.insert(this);
  }
  ~MpiGroup() override {
    {
      std::lock_guard lock(mpi_runtime().groups_mutex);
      mpi_runtime().groups.erase(this);
    }
    {
      std::lock_guard lock(mpi_runtime().broken_mutex);
      auto& by_name = mpi_runtime().broken_by_name;
      for (auto [it, end] = by_name.equal_range(name()); it != end; ++it)
        if (it->second.lock() == broken_ptr()) {
          by_name.erase(it);
          break;
        }
    }
    shutdown();
  }
  std::string_view backend() const override { return "mpi"; }

  // Stops the thread and frees the communicators (no throw: runs from destructors and finalize).
  void shutdown() noexcept {
    stop();
    release();
  }
  // Stops the communication thread: what it still runs ends by its deadline (or breaks the group).
  void stop() noexcept { stop_comm_thread(); }
  // Frees the communicators; the thread must be stopped.
  void release() noexcept {
    if (comm_ == MPI_COMM_NULL || mpi_runtime().finalized) return;
    for (MPI_Comm* c : {&comm_, &p2p_, &debug_}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
      *c = MPI_COMM_NULL;
    }
  }

 protected:
  // Device tensors go through host copies (detail/host_staging.h).
  void on_issue(const Op& op) override { sync_device_tensors(op); }
  void execute(Op& op) override {
    HostStaging staging(op);
    WaitsEndOnBreak watch(broken());  // a peer that broke the group says so: stop waiting for it
    run(op);
    staging.finish();
  }

  // An MPI error inside a collective between live processes almost always means the ranks ran
  // different collectives (a message longer than this rank's expects), rarely a failing
  // transport: the peers say which, and what they ran instead.
  std::exception_ptr translate_failure(const Op& op, std::exception_ptr error) override {
    try {
      std::rethrow_exception(error);
    } catch (const MpiError& e) {
      if (is_p2p(op.kind)) return error;
      std::optional<PeerReport> peers = probe_peers(recorder(), op.seq);
      std::string what;
      if (peers && peers->mismatch) {
        what = fmt::format("the ranks are not running the same collective: {}", peers->text);
      } else {
        what = fmt::format("the transport failed ({}){}", e.mpi_text(), peers ? "; " + peers->text : std::string());
      }
      return std::make_exception_ptr(
          CollectiveError(fmt::format("[dist] {} failed: {}. The group is broken. {}", describe(op), what,
                                      flight_dump_hint()),
                          false, peers ? peers->missing : std::vector<int>{}));
    } catch (...) {
      return error;
    }
  }

  // The op's tensors (host copies when staged) and the algorithms' scratch areas may still be
  // written by MPI: a receive freed with a late peer's message on its way, a collective that
  // cannot be cancelled. Kept for good (the group is broken: no op runs on it again).
  void keep_buffers_of_broken(const Op& op) override {
    auto tensors = std::make_shared<TensorList>(op.inputs);
    tensors->insert(tensors->end(), op.outputs.begin(), op.outputs.end());
    keep_forever(std::move(tensors));
    coll_.abandon();
  }

  // The peers' responders hear it now (peer_responder.h), so a rank waiting in a collective this
  // one will never finish fails within moments instead of at its deadline.
  void on_break(const Op& op, const std::string& reason) override {
    notify_peers_of_break(recorder().group(), recorder().world_ranks(), rank(), static_cast<int64_t>(op.seq), reason);
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
        allreduce(op, t.data_ptr(), t.numel(), t.dtype());
        break;
      }
      case OpKind::allreduce_coalesced: {
        int64_t total = 0;
        for (const Tensor& t : op.inputs) total += t.numel();
        const Dtype dt = op.inputs[0].dtype();
        char* buf = coll_.scratch(0, total * itemsize(dt));
        size_t off = 0;
        for (const Tensor& t : op.inputs) {
          if (t.nbytes()) std::memcpy(buf + off, t.data_ptr(), t.nbytes());
          off += t.nbytes();
        }
        allreduce(op, buf, total, dt);
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
          auto lk = mpi_runtime().lock();
          TANDEM_MPI_CHECK(MPI_Ibcast(t.data_ptr(), mpi_int(t.nbytes(), "broadcast bytes"), MPI_BYTE, op.root, comm_, &req));
        }
        wait_collective(op, &req, 1, t.nbytes());
        break;
      }
      case OpKind::allgather:
      case OpKind::allgather_into: {
        const Tensor& in = op.inputs[0];
        const int bytes = mpi_int(in.nbytes(), "allgather bytes per rank");
        char* out = op.kind == OpKind::allgather_into ? static_cast<char*>(op.outputs[0].data_ptr())
                                                      : coll_.scratch(0, static_cast<size_t>(bytes) * size());
        const void* send = in.data_ptr() == out + static_cast<size_t>(bytes) * rank() ? MPI_IN_PLACE : in.data_ptr();
        MPI_Request req;
        {
          auto lk = mpi_runtime().lock();
          TANDEM_MPI_CHECK(MPI_Iallgather(send, bytes, MPI_BYTE, out, bytes, MPI_BYTE, comm_, &req));
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
          char* buf = coll_.scratch(0, out.nbytes() * size());
          for (int k = 0; k < size(); ++k)
            if (out.nbytes()) std::memcpy(buf + out.nbytes() * k, op.inputs[k].data_ptr(), out.nbytes());
          in = buf;
        }
        MPI_Request req;
        {
          auto lk = mpi_runtime().lock();
          TANDEM_MPI_CHECK(MPI_Ireduce_scatter_block(in, out.data_ptr(), mpi_int(out.numel(), "reduce_scatter count"),
                                                     mpi_type(dt), mpi_op(op.reduce, dt), comm_, &req));
        }
        wait_collective(op, &req, 1, out.nbytes() * size());
        if (op.reduce == ReduceOp::avg) divide_buffer(out.data_ptr(), out.numel(), dt, size());
        break;
      }
      case OpKind::all_to_all: {
        const Tensor& in = op.inputs[0];
        const Tensor& out = op.outputs[0];
        const int64_t row = static_cast<int64_t>(row_bytes(out));
        const int n = size();
        // On the heap: MPI reads the counts until the exchange completes (kept if it fails).
        auto counts = std::make_shared<std::array<std::vector<int>, 4>>();
        for (auto& c : *counts) c.resize(static_cast<size_t>(n));
        auto& [sc, sd, rc, rd] = *counts;
        int64_t soff = 0, roff = 0;
        for (int k = 0; k < n; ++k) {
          sc[k] = mpi_int(op.in_splits[k] * row, "all_to_all bytes");
          sd[k] = mpi_int(soff, "all_to_all offset");
          rc[k] = mpi_int(op.out_splits[k] * row, "all_to_all bytes");
          rd[k] = mpi_int(roff, "all_to_all offset");
          soff += sc[k];
          roff += rc[k];
        }
        MPI_Request req;
        {
          auto lk = mpi_runtime().lock();
          TANDEM_MPI_CHECK(MPI_Ialltoallv(in.data_ptr(), sc.data(), sd.data(), MPI_BYTE, out.data_ptr(), rc.data(),
                                          rd.data(), MPI_BYTE, comm_, &req));
        }
        wait_collective(op, &req, 1, static_cast<size_t>(soff + roff), counts);
        break;
      }
      case OpKind::barrier: {
        MPI_Request req;
        {
          auto lk = mpi_runtime().lock();
          TANDEM_MPI_CHECK(MPI_Ibarrier(comm_, &req));
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

  // The group's ranks as MPI_COMM_WORLD numbers them (the peer responders' communicator does).
  static std::vector<int> world_ranks(MPI_Comm c) {
    const int n = comm_size(c);
    std::vector<int> mine(n), world(n);
    for (int k = 0; k < n; ++k) mine[k] = k;
    MPI_Group g = MPI_GROUP_NULL, w = MPI_GROUP_NULL;
    TANDEM_MPI_CHECK(MPI_Comm_group(c, &g));
    TANDEM_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &w));
    TANDEM_MPI_CHECK(MPI_Group_translate_ranks(g, n, mine.data(), w, world.data()));
    MPI_Group_free(&g);
    MPI_Group_free(&w);
    return world;
  }

  // The peers are asked where they are (detail/peer_probe.h): the error names the ranks that did
  // not arrive and what they did last, or the ones that issued something else under this number.
  [[noreturn]] void collective_timeout(const Op& op) {
    stop_if_broken(op);
    std::optional<PeerReport> peers = probe_peers(recorder(), op.seq);
    const std::string who = peers ? peers->text : "the other ranks could not be asked where they are";
    throw TimeoutError(fmt::format("[dist] {} timed out after {} ms; the group is broken: {}. {}{}", describe(op),
                                   op.timeout.count(), who, flight_dump_hint(), compare_hint()),
                       false, peers ? peers->missing : std::vector<int>{});
  }

  // A wait that ended because the group broke meanwhile (a peer's notice): that is the error.
  void stop_if_broken(const Op& op) const {
    if (broken().is_broken()) throw CollectiveError(stopped_by_break(op), false);
  }

  // `keep`: buffers of the caller's own (counts, lengths) that the requests use, kept for good
  // when the wait fails.
  void wait_collective(const Op& op, MPI_Request* reqs, int n, size_t bytes = 0, std::shared_ptr<void> keep = nullptr) {
    if (wait_requests(reqs, n, op.deadline, bytes)) return;
    if (keep) keep_forever(std::move(keep));
    collective_timeout(op);
  }

  // ---- allreduce ----

  void allreduce(const Op& op, void* data, int64_t count, Dtype dt) {
    if (!allreduce_buffer(coll_, static_cast<char*>(data), count, dt, op.reduce, op.deadline)) collective_timeout(op);
  }

  // The issuing thread's fast path (QueuedGroup::start): one CPU tensor, no debug exchange; a
  // small one only, unless the pollers advance it (caller progress).
  bool can_start(const Op& op) const override {
    if (op.kind != OpKind::allreduce || op.debug) return false;
    const Tensor& t = op.inputs[0];
    return t.is_cpu() && (caller_progress() || t.nbytes() <= kInlineAllreduceBytes);
  }

  std::unique_ptr<StartedOp> start(Op& op) override {
    const Tensor& t = op.inputs[0];
    return start_allreduce(coll_, static_cast<char*>(t.data_ptr()), t.numel(), t.dtype(), op.reduce);
  }

  void pending_timeout(const Op& op) override { collective_timeout(op); }

  // Polls an op the issuing thread started to completion; a TimeoutError at the deadline.
  void finish(const Op& op, StartedOp& started) {
    if (!poll_until(op.deadline, 0, [&] { return started.progress(); })) collective_timeout(op);
  }

  // ---- debug fingerprints ----

  // Every rank sends its packed fingerprint to every other rank, point to point, so that a rank
  // that never arrives is named; all ranks then hold the same table and reach the same verdict.
  void exchange_fingerprints(const Op& op) {
    const int n = size(), me = rank();
    const int64_t words = fingerprint_words();
    // On the heap: kept for good if the exchange fails with messages still on their way.
    struct Exchange {
      std::vector<int64_t> mine, table;
      std::vector<MPI_Request> recvs, sends;
    };
    auto ex = std::make_shared<Exchange>();
    ex->mine = pack_fingerprint(op.fingerprint, op.kind, op.in_splits, op.out_splits);
    ex->table.resize(static_cast<size_t>(n * words));
    ex->recvs.assign(static_cast<size_t>(n), MPI_REQUEST_NULL);
    ex->sends.assign(static_cast<size_t>(n), MPI_REQUEST_NULL);
    const std::vector<int64_t>& mine = ex->mine;
    std::vector<int64_t>& table = ex->table;
    std::vector<MPI_Request>& recvs = ex->recvs;
    std::vector<MPI_Request>& sends = ex->sends;
    std::copy(mine.begin(), mine.end(), table.begin() + me * words);
    const int bytes = mpi_int(words * static_cast<int64_t>(sizeof(int64_t)), "fingerprint bytes");
    {
      auto lk = mpi_runtime().lock();
      for (int k = 0; k < n; ++k) {
        if (k == me) continue;
        TANDEM_MPI_CHECK(MPI_Irecv(&table[k * words], bytes, MPI_BYTE, k, kDebugTag, debug_, &recvs[k]));
        TANDEM_MPI_CHECK(MPI_Isend(mine.data(), bytes, MPI_BYTE, k, kDebugTag, debug_, &sends[k]));
      }
    }
    if (!wait_requests(recvs.data(), n, op.deadline)) {
      std::vector<int> missing;
      {
        auto lk = mpi_runtime().lock();
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
      }
      keep_forever(ex);  // a cancel need not have taken effect yet
      stop_if_broken(op);
      throw TimeoutError(fmt::format("[dist] {} timed out after {} ms: {} {} did not arrive. {}", describe(op),
                                     op.timeout.count(), missing.size() == 1 ? "rank" : "ranks", join_ranks(missing),
                                     flight_dump_hint()),
                         false, missing);
    }
    wait_collective(op, sends.data(), n, 0, ex);
    check_fingerprints(op.seq, op.kind, table.data());
  }

  // ---- point to point ----

  void do_send(Op& op) {
    const Tensor& t = op.inputs[0];
    MPI_Request req;
    {
      auto lk = mpi_runtime().lock();
      TANDEM_MPI_CHECK(MPI_Isend(t.data_ptr(), mpi_int(t.nbytes(), "send bytes"), MPI_BYTE, op.root, op.tag, p2p_, &req));
    }
    if (wait_requests(&req, 1, op.deadline)) return;
    bool cancelled = cancel(req);
    stop_if_broken(op);
    throw TimeoutError(fmt::format("[dist] {} timed out after {} ms: rank {} did not receive{}", describe(op),
                                   op.timeout.count(), op.root, cancelled ? "" : "; the group is broken"),
                       cancelled);
  }

  void do_recv(Op& op) {
    const Tensor& t = op.inputs[0];
    MPI_Request req;
    MPI_Status status;
    {
      auto lk = mpi_runtime().lock();
      TANDEM_MPI_CHECK(MPI_Irecv(t.data_ptr(), mpi_int(t.nbytes(), "recv bytes"), MPI_BYTE, op.root, op.tag, p2p_, &req));
    }
    int rc = MPI_SUCCESS;  // an error ends the wait too: reported below with the status
    const bool done = poll_until(op.deadline, 0, [&] {
      int flag = 0;
      auto lk = mpi_runtime().lock();
      rc = MPI_Test(&req, &flag, &status);
      return rc != MPI_SUCCESS || flag;
    });
    if (!done) {
      bool cancelled = cancel(req);
      stop_if_broken(op);
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
    auto lk = mpi_runtime().lock();
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
    // On the heap: kept for good if a gather fails with messages still on their way.
    struct Gathered {
      int len = 0;
      std::vector<int> ranks, lens, displs, all;
    };
    auto gathered = std::make_shared<Gathered>();
    gathered->len = static_cast<int>(op.ranks.size());
    gathered->ranks = op.ranks;
    gathered->lens.resize(static_cast<size_t>(n));
    gathered->displs.resize(static_cast<size_t>(n));
    const int len = gathered->len;
    std::vector<int>& lens = gathered->lens;
    std::vector<int>& displs = gathered->displs;
    std::vector<int>& all = gathered->all;
    MPI_Request req;
    {
      auto lk = mpi_runtime().lock();
      TANDEM_MPI_CHECK(MPI_Iallgather(&gathered->len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_, &req));
    }
    wait_collective(op, &req, 1, 0, gathered);
    int total = 0;
    for (int k = 0; k < n; ++k) {
      displs[k] = total;
      total += lens[k];
    }
    all.resize(static_cast<size_t>(total));
    {
      auto lk = mpi_runtime().lock();
      TANDEM_MPI_CHECK(MPI_Iallgatherv(gathered->ranks.data(), len, MPI_INT, all.data(), lens.data(), displs.data(),
                                       MPI_INT, comm_, &req));
    }
    wait_collective(op, &req, 1, 0, gathered);
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
      auto lk = mpi_runtime().lock();
      TANDEM_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
    }
    std::string child_name = next_child_name();
    ProcessGroupPtr group;
    if (sub != MPI_COMM_NULL) {
      group = std::make_shared<MpiGroup>(sub, child_name);
      configure_child(*group);
    }
    publish_created(op, group);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;   // collectives (and the allreduce algorithms' messages)
  CollectiveComm coll_;             // comm_ as the algorithms use it, with the scratch areas
  MPI_Comm p2p_ = MPI_COMM_NULL;    // user send/recv, so their tags never meet the algorithms'
  MPI_Comm debug_ = MPI_COMM_NULL;  // fingerprints
};

void break_group_from_peer(const std::string& name, int from, int64_t seq, const std::string& reason) {
  MpiRuntime& rt = mpi_runtime();
  const std::string why = fmt::format("rank {} broke it at collective #{}: {}", from, seq, reason);
  std::lock_guard lock(rt.broken_mutex);
  for (auto [it, end] = rt.broken_by_name.equal_range(name); it != end; ++it)
    if (std::shared_ptr<BrokenState> state = it->second.lock()) state->mark(why);
}

ProcessGroupPtr make_mpi_world(std::optional<Milliseconds> timeout, std::optional<bool> debug_checks) {
  ensure_mpi_initialized();
  MPI_Comm comm = MPI_COMM_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  auto g = std::make_shared<MpiGroup>(comm, "world");
  if (timeout) g->set_timeout(*timeout);
  if (debug_checks) g->set_debug_checks(*debug_checks);
  return g;
}

namespace {

// How long a rank whose group broke waits at exit for the other ranks: the timeout, at most 10 s.
// They are normally there within moments (they timed out too, or are already exiting).
Milliseconds exit_grace() noexcept {
  constexpr Milliseconds cap(10'000);
  try {
    return std::min(default_timeout(), cap);
  } catch (...) {  // a malformed TANDEM_DIST_TIMEOUT, already reported when the groups were made
    return cap;
  }
}

// Every rank checks in on the exit communicator (an MPI_Ibarrier). True once all have; false at
// the deadline (none: wait as long as it takes, as MPI_Finalize would) or when MPI fails.
bool all_ranks_reach_exit(MpiRuntime& rt, std::optional<Clock::time_point> deadline) noexcept {
  MPI_Request req = MPI_REQUEST_NULL;
  {
    auto lk = rt.lock();
    if (MPI_Ibarrier(rt.exit_comm, &req) != MPI_SUCCESS) return false;
  }
  for (;;) {
    int done = 0;
    {
      auto lk = rt.lock();
      if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    }
    if (done) return true;
    if (deadline && Clock::now() >= *deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The one place the library ends the process itself. A group of this process broke (a collective
// timed out or failed: its error already reached the program as an exception), and a rank has not
// reached the exit: it is hung, dead, or stuck in a collective that will never complete. MPI_Finalize
// would wait for it forever, and so would the job, holding its nodes until the scheduler's
// wall-clock limit. No exception can help at exit, so, as PyTorch's NCCL watchdog tears the process
// down, MPI_Abort ends the whole job (mpirun then stops every rank) with a non-zero status. The
// reason goes to stderr first: the program may have caught the error without printing it.
[[noreturn]] void abort_job(const MpiRuntime& rt, const std::string& reason, Milliseconds waited) noexcept {
  flight_dump_now(reason);  // TANDEM_FLIGHT_RECORDER: what this rank saw last, before it goes
  std::fprintf(stderr,
               "[dist] rank %d of %d: a group broke (%s) and not every rank reached the exit within %lld ms; "
               "ending the job with MPI_Abort, as MPI_Finalize would wait for them forever\n",
               rt.info.rank, rt.info.size, reason.c_str(), static_cast<long long>(waited.count()));
  std::fflush(nullptr);  // what the program wrote: MPI_Abort does not flush stdio
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; should an MPI ever return from it, the process still ends
}

}  // namespace

void mpi_finalize() {
  MpiRuntime& rt = mpi_runtime();
  std::lock_guard lock(rt.init_mutex);
  if (!rt.initialized || rt.finalized) return;
  {
    // Threads first: an operation still running times out here at the latest, and breaks its
    // group, which the check below must see.
    std::lock_guard glock(rt.groups_mutex);
    for (MpiGroup* g : rt.groups) g->stop();
  }
  if (rt.we_initialized) {
    // MPI_Finalize waits for every rank. A rank whose groups are sound waits as long as it takes
    // (a peer may still be computing); it also checks in, so that a peer whose group broke sees it
    // is here. A rank whose group broke (this or an earlier, destroyed one) waits a little only:
    // if everyone comes (a test that times out on purpose, a rank that failed and left) the job
    // ends normally; otherwise it is aborted.
    const std::string broke = first_process_break();
    if (broke.empty()) {
      (void)all_ranks_reach_exit(rt, std::nullopt);  // on an MPI error, MPI_Finalize decides
    } else {
      const Milliseconds grace = exit_grace();
      if (!all_ranks_reach_exit(rt, Clock::now() + grace)) abort_job(rt, broke, grace);
    }
  }
  {
    std::lock_guard glock(rt.groups_mutex);
    for (MpiGroup* g : rt.groups) g->release();
  }
  stop_peer_responder();  // every rank is past its last collective (or this one is leaving)
  if (rt.probe_comm != MPI_COMM_NULL) MPI_Comm_free(&rt.probe_comm);
  if (rt.exit_comm != MPI_COMM_NULL) MPI_Comm_free(&rt.exit_comm);  // at exit: nothing to report to
  rt.finalized = true;
  if (rt.we_initialized) MPI_Finalize();
}

}  // namespace tandem::dist
