#include "dist/threads/threads.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <tuple>

#include "core/parallel.h"
#include "core/threads.h"
#include "dist/detail/flight_recorder.h"
#include "dist/detail/host_staging.h"
#include "dist/detail/queued_group.h"
#include "dist/detail/reduce_kernels.h"

namespace tandem::dist {

namespace {

struct World;

// One collective instance (a sequence number of one group) as the ranks meet in it.
struct Slot {
  explicit Slot(int n) : calls(n, nullptr) {}
  std::vector<Op*> calls;  // each rank's Op, valid while that rank is inside the slot
  int arrived = 0;
  int reduced = 0;  // ranks done reading the others' buffers
  int left = 0;
  bool ready = false;       // everyone arrived and the slot was prepared
  std::string abandoned;    // why the ranks that arrived gave up (a timeout)
  std::vector<int> missing; // the ranks that had not arrived then
  std::string error;        // mismatch found while preparing: every rank throws it
  std::vector<char> buffer; // allreduce results, reduced in parallel by rank chunks
  std::shared_ptr<struct GroupShared> child;  // new_group
};

struct Message {
  Dtype dtype;
  Shape shape;
  std::vector<char> bytes;
};

// What the ranks of one group share.
struct GroupShared {
  explicit GroupShared(int n) : size(n) {}
  int size;
  std::map<uint64_t, std::shared_ptr<Slot>> slots;
  std::map<std::tuple<int, int, int>, std::deque<Message>> mail;  // (src, dst, tag)
};

struct World {
  std::mutex mutex;  // one lock for the whole world: simple, and tests do not need more
  std::condition_variable cv;
  std::string aborted;  // set by run_threads when a rank threw
};

class ThreadGroup final : public QueuedGroup {
 public:
  ThreadGroup(int rank, std::shared_ptr<World> world, std::shared_ptr<GroupShared> shared, std::string name)
      : QueuedGroup(rank, shared->size, std::move(name)), world_(std::move(world)), shared_(std::move(shared)) {
    recorder().set_backend("threads", {});  // the ranks are this process's threads: no peer to ask
  }
  ~ThreadGroup() override {
    {
      std::lock_guard lock(world_->mutex);
      closing_ = true;
    }
    world_->cv.notify_all();
    stop_comm_thread();
  }
  std::string_view backend() const override { return "threads"; }

 protected:
  // Device tensors go through host copies (detail/host_staging.h).
  void on_issue(const Op& op) override { sync_device_tensors(op); }
  void execute(Op& op) override {
    // A world of one's allreduce queued to the communication thread (thread progress, or issued
    // while the group was busy): nothing to reduce or copy, as on the issuing thread below. It
    // staged the bucket into the shared buffer and back before: 0.27 ms of a 1.5 ms world-1 DDP
    // step of the bench MLP.
    if (reduces_over_nothing(op)) return;
    HostStaging staging(op);
    if (op.kind == OpKind::send) {
      do_send(op);
    } else if (op.kind == OpKind::recv) {
      do_recv(op);
    } else {
      collective(op);
    }
    staging.finish();
  }

  bool always_fingerprints() const override { return size() > 1; }

  // A world of one (dist::init without a launcher) reduces over nothing: an allreduce leaves its
  // tensor as it is (avg divides by 1), so it completes on the issuing thread with no hand-off.
  bool can_start(const Op& op) const override { return reduces_over_nothing(op); }
  bool reduces_over_nothing(const Op& op) const {
    return size() == 1 && op.kind == OpKind::allreduce && op.inputs[0].is_cpu();
  }
  std::unique_ptr<StartedOp> start(Op&) override {
    struct Identity final : StartedOp {
      bool progress() override { return true; }
    };
    return std::make_unique<Identity>();
  }

 private:
  // Waits on the world's condition variable until pred, the deadline, an abort or shutdown.
  // Returns false on the deadline; throws on abort/shutdown.
  template <class Pred>
  bool wait_until(std::unique_lock<std::mutex>& lock, const Op& op, Pred pred) {
    bool ok = world_->cv.wait_until(lock, op.deadline, [&] { return pred() || !world_->aborted.empty() || closing_; });
    if (pred()) return true;
    if (!world_->aborted.empty())
      throw TimeoutError(fmt::format("[dist] {} stopped: {}", describe(op), world_->aborted), false);
    if (closing_) throw TimeoutError(fmt::format("[dist] {} stopped: the group is being destroyed", describe(op)), false);
    return ok;
  }

  void do_send(Op& op) {
    const Tensor& t = op.inputs[0];
    Message m{t.dtype(), t.shape(), std::vector<char>(t.nbytes())};
    if (t.nbytes()) std::memcpy(m.bytes.data(), t.data_ptr(), t.nbytes());
    {
      std::lock_guard lock(world_->mutex);
      shared_->mail[{rank(), op.root, op.tag}].push_back(std::move(m));
    }
    world_->cv.notify_all();
  }

  void do_recv(Op& op) {
    const Tensor& t = op.inputs[0];
    std::unique_lock lock(world_->mutex);
    auto& box = shared_->mail[{op.root, rank(), op.tag}];
    if (!wait_until(lock, op, [&] { return !box.empty(); })) {
      // Nothing was taken from the mailbox, so the group is as usable as before.
      throw TimeoutError(fmt::format("[dist] {} timed out after {} ms: rank {} did not send", describe(op),
                                     op.timeout.count(), op.root),
                         true);
    }
    Message m = std::move(box.front());
    box.pop_front();
    lock.unlock();
    TANDEM_CHECK(m.dtype == t.dtype() && m.bytes.size() == t.nbytes(),
                 "[recv] rank {} sent {} {} (tag {}) but the receive tensor on rank {} is {} {}", op.root, m.dtype,
                 m.shape, op.tag, rank(), t.dtype(), t.shape());
    if (!m.bytes.empty()) std::memcpy(t.data_ptr(), m.bytes.data(), m.bytes.size());
  }

  // Everyone arrived: check the calls agree and set up shared state. Runs once, under the lock.
  void prepare(Slot& s, const Op& op) {
    const int n = size();
    std::vector<std::string> fps;
    for (Op* c : s.calls) fps.push_back(c->fingerprint);
    for (int r = 1; r < n; ++r) {
      if (fps[r] != fps[0]) {
        try {
          fail_mismatch(op.seq, fps);
        } catch (const Error& e) {
          s.error = e.what();
        }
        return;
      }
    }
    if (op.kind == OpKind::all_to_all) {
      for (int i = 0; i < n && s.error.empty(); ++i) {
        for (int j = 0; j < n; ++j) {
          int64_t sends = s.calls[i]->in_splits[j], expects = s.calls[j]->out_splits[i];
          if (sends != expects) {
            s.error = split_mismatch(op.seq, i, sends, j, expects);
            break;
          }
        }
      }
    }
    if (op.kind == OpKind::allreduce || op.kind == OpKind::allreduce_coalesced) {
      size_t bytes = 0;
      for (const Tensor& t : op.inputs) bytes += t.nbytes();
      s.buffer.resize(bytes);
    }
    if (op.kind == OpKind::new_group) s.child = std::make_shared<GroupShared>(static_cast<int>(op.ranks.size()));
  }

  void collective(Op& op) {
    const int n = size();
    const int r = rank();
    std::unique_lock lock(world_->mutex);
    auto& slot_ref = shared_->slots[op.seq];
    if (!slot_ref) slot_ref = std::make_shared<Slot>(n);
    std::shared_ptr<Slot> slot = slot_ref;
    if (!slot->abandoned.empty()) {
      throw TimeoutError(fmt::format("[dist] {} arrived after the other ranks gave up: {}", describe(op),
                                     slot->abandoned), false);
    }
    slot->calls[r] = &op;
    if (++slot->arrived == n) {
      prepare(*slot, op);
      slot->ready = true;
      world_->cv.notify_all();
    }
    bool arrived = false;
    try {
      arrived = wait_until(lock, op, [&] { return slot->ready || !slot->abandoned.empty(); });
    } catch (...) {
      slot->calls[r] = nullptr;
      if (slot->abandoned.empty()) slot->abandoned = "a rank stopped waiting";
      throw;
    }
    if (!arrived || !slot->abandoned.empty()) {
      if (slot->abandoned.empty()) {
        std::vector<int> missing;
        for (int k = 0; k < n; ++k)
          if (!slot->calls[k]) missing.push_back(k);
        slot->abandoned = fmt::format("{} #{} on group {} ({}) timed out after {} ms: {} {} did not arrive",
                                      op_kind_name(op.kind), op.seq, name(), backend(), op.timeout.count(),
                                      missing.size() == 1 ? "rank" : "ranks", join_ranks(missing));
        slot->missing = std::move(missing);
        world_->cv.notify_all();
      }
      slot->calls[r] = nullptr;
      throw TimeoutError(fmt::format("[dist] {}. {}", slot->abandoned, flight_dump_hint()), false, slot->missing);
    }

    auto leave = [&] {
      slot->calls[r] = nullptr;
      if (++slot->left == n) shared_->slots.erase(op.seq);
    };
    if (!slot->error.empty()) {
      std::string error = slot->error;
      leave();
      throw Error(error);
    }
    if (op.kind == OpKind::new_group) {
      std::shared_ptr<GroupShared> child = slot->child;
      leave();
      lock.unlock();
      std::string child_name = next_child_name();
      ProcessGroupPtr group;
      auto it = std::find(op.ranks.begin(), op.ranks.end(), r);
      if (it != op.ranks.end()) {
        group = std::make_shared<ThreadGroup>(static_cast<int>(it - op.ranks.begin()), world_, child, child_name);
        configure_child(*group);
      }
      publish_created(op, group);
      return;
    }
    if (op.kind == OpKind::barrier) {
      leave();
      return;
    }

    // Phase 1, without the lock: read the other ranks' buffers (stable: they are all waiting here).
    lock.unlock();
    std::exception_ptr error;
    try {
      move_data(op, *slot);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (++slot->reduced == n) world_->cv.notify_all();
    // Everyone finishes phase 1 without blocking, so this wait is short; the deadline still holds.
    bool done = wait_until(lock, op, [&] { return slot->reduced == n; });
    if (!done) {
      slot->calls[r] = nullptr;
      throw TimeoutError(fmt::format("[dist] {} timed out while the ranks moved data", describe(op)), false);
    }
    lock.unlock();
    // Phase 2: allreduce results from the shared buffer into this rank's tensors.
    if (!error && (op.kind == OpKind::allreduce || op.kind == OpKind::allreduce_coalesced)) {
      size_t off = 0;
      for (const Tensor& t : op.inputs) {
        if (t.nbytes()) std::memcpy(t.data_ptr(), slot->buffer.data() + off, t.nbytes());
        off += t.nbytes();
      }
    }
    lock.lock();
    leave();
    lock.unlock();
    if (error) std::rethrow_exception(error);
  }

  void move_data(Op& op, Slot& s) {
    const int n = size();
    const int r = rank();
    auto call = [&](int k) -> Op& { return *s.calls[k]; };
    switch (op.kind) {
      case OpKind::allreduce:
      case OpKind::allreduce_coalesced: {
        size_t off = 0;
        for (size_t i = 0; i < op.inputs.size(); ++i) {
          const Tensor& t = op.inputs[i];
          int64_t lo = t.numel() * r / n, hi = t.numel() * (r + 1) / n;
          TANDEM_DISPATCH_ALL(t.dtype(), "allreduce", [&] {
            std::vector<const scalar_t*> srcs(n);
            for (int k = 0; k < n; ++k) srcs[k] = static_cast<const scalar_t*>(call(k).inputs[i].data_ptr()) + lo;
            auto* out = reinterpret_cast<scalar_t*>(s.buffer.data() + off) + lo;
            detail::reduce_many(out, srcs.data(), n, hi - lo, op.reduce);
          });
          off += t.nbytes();
        }
        break;
      }
      case OpKind::broadcast: {
        const Tensor& t = op.inputs[0];
        if (r != op.root && t.nbytes()) std::memcpy(t.data_ptr(), call(op.root).inputs[0].data_ptr(), t.nbytes());
        break;
      }
      case OpKind::allgather:
      case OpKind::allgather_into: {
        const size_t bytes = op.inputs[0].nbytes();
        for (int k = 0; k < n; ++k) {
          char* dst = op.kind == OpKind::allgather ? static_cast<char*>(op.outputs[k].data_ptr())
                                                   : static_cast<char*>(op.outputs[0].data_ptr()) + k * bytes;
          const void* src = call(k).inputs[0].data_ptr();
          if (bytes && dst != src) std::memmove(dst, src, bytes);
        }
        break;
      }
      case OpKind::reduce_scatter:
      case OpKind::reduce_scatter_tensor: {
        const Tensor& out = op.outputs[0];
        const int64_t m = out.numel();
        TANDEM_DISPATCH_ALL(out.dtype(), "reduce_scatter", [&] {
          std::vector<const scalar_t*> srcs(n);
          for (int k = 0; k < n; ++k) {
            srcs[k] = op.kind == OpKind::reduce_scatter
                          ? static_cast<const scalar_t*>(call(k).inputs[r].data_ptr())
                          : static_cast<const scalar_t*>(call(k).inputs[0].data_ptr()) + r * m;
          }
          detail::reduce_many(static_cast<scalar_t*>(out.data_ptr()), srcs.data(), n, m, op.reduce);
        });
        break;
      }
      case OpKind::all_to_all: {
        const Tensor& out = op.outputs[0];
        const size_t row = row_bytes(out);
        char* dst = static_cast<char*>(out.data_ptr());
        for (int k = 0; k < n; ++k) {
          const Op& src = call(k);
          int64_t src_row = 0;
          for (int j = 0; j < r; ++j) src_row += src.in_splits[j];
          size_t bytes = src.in_splits[r] * row;
          if (bytes) std::memcpy(dst, static_cast<const char*>(src.inputs[0].data_ptr()) + src_row * row, bytes);
          dst += op.out_splits[k] * row;
        }
        break;
      }
      default: break;
    }
  }

  std::shared_ptr<World> world_;
  std::shared_ptr<GroupShared> shared_;
  bool closing_ = false;  // guarded by world_->mutex

 public:
  void abort_world(const std::string& reason) {
    {
      std::lock_guard lock(world_->mutex);
      if (world_->aborted.empty()) world_->aborted = reason;
    }
    world_->cv.notify_all();
  }
};

void abort_thread_world(ProcessGroup& group, const std::string& reason) {
  if (auto* g = dynamic_cast<ThreadGroup*>(&group)) g->abort_world(reason);
}

}  // namespace

std::vector<ProcessGroupPtr> make_thread_world(int n, const ThreadsOptions& options) {
  TANDEM_CHECK(n >= 1, "[dist] a thread world needs at least one rank, got {}", n);
  auto world = std::make_shared<World>();
  auto shared = std::make_shared<GroupShared>(n);
  std::vector<ProcessGroupPtr> groups;
  for (int r = 0; r < n; ++r) {
    auto g = std::make_shared<ThreadGroup>(r, world, shared, "world");
    if (options.timeout) g->set_timeout(*options.timeout);
    if (options.debug_checks) g->set_debug_checks(*options.debug_checks);
    groups.push_back(g);
  }
  return groups;
}

void run_threads(int n, const std::function<void(ProcessGroup&)>& fn, const ThreadsOptions& options) {
  auto groups = make_thread_world(n, options);
  std::mutex first_mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r, cap = std::max(1, get_num_threads() / n)] {
      // The ranks share the process's cores: each runs its kernels on its share of them.
      set_thread_intra_op_cap(cap);
      try {
        fn(*groups[r]);
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(first_mutex);
          if (!first) first = std::current_exception();
        }
        abort_thread_world(*groups[r], fmt::format("rank {} failed: {}", r, e.what()));
      } catch (...) {
        {
          std::lock_guard lock(first_mutex);
          if (!first) first = std::current_exception();
        }
        abort_thread_world(*groups[r], fmt::format("rank {} failed", r));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace tandem::dist
