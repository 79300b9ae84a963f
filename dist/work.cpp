#include "dist/process_group.h"

#include "core/trace.h"
#include "dist/detail/comm_thread.h"

#include <atomic>
#include <thread>

namespace tandem::dist {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::product: return "product";
  }
  return "?";
}

namespace {

std::atomic<int> waiting_on_work{0};

// Counts the calling thread in threads_waiting_on_work() while it blocks.
struct CountedWait {
  CountedWait() { waiting_on_work.fetch_add(1, std::memory_order_relaxed); }
  ~CountedWait() { waiting_on_work.fetch_sub(1, std::memory_order_relaxed); }
  CountedWait(const CountedWait&) = delete;
  CountedWait& operator=(const CountedWait&) = delete;
};

}  // namespace

int threads_waiting_on_work() { return waiting_on_work.load(std::memory_order_relaxed); }

Work::Work(std::string description) : description_(std::move(description)) {}

WorkPtr Work::completed(TensorList result, std::string description) {
  auto w = std::make_shared<Work>(std::move(description));
  w->mark_completed(std::move(result));
  return w;
}

void Work::order_on_device(TensorList result, std::function<void()> make_current_stream_wait) {
  TANDEM_CHECK(make_current_stream_wait != nullptr, "[dist] order_on_device on {} needs a stream wait", description_);
  std::lock_guard lock(mutex_);
  TANDEM_CHECK(!done_ && !stream_wait_, "[dist] order_on_device on {} after it completed or twice", description_);
  result_ = std::move(result);
  stream_wait_ = std::move(make_current_stream_wait);
}

void Work::wait() const {
  std::unique_lock lock(mutex_);
  if (!done_ && stream_wait_) {
    lock.unlock();
    stream_wait_();  // immutable once set
    return;
  }
  if (!done_) {
    // A continuation or hook running on a communication thread that waits for work queued behind
    // it would wait for itself.
    TANDEM_CHECK(!on_comm_thread(), "[dist] wait on {} from a communication thread (inside a continuation) would "
                 "deadlock; chain it with then() instead", description_);
    CountedWait counted;
    trace::Scope span([&] { return "wait " + description_; }, "dist");  // only a wait that blocks
    block(lock, nullptr);
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::wait(Milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  if (!done_ && stream_wait_) {
    lock.unlock();
    stream_wait_();
    return;
  }
  if (!done_) {
    TANDEM_CHECK(!on_comm_thread(), "[dist] wait on {} from a communication thread (inside a continuation) would "
                 "deadlock; chain it with then() instead", description_);
    CountedWait counted;
    trace::Scope span([&] { return "wait " + description_; }, "dist");
    const auto until = std::chrono::steady_clock::now() + timeout;
    if (!block(lock, &until)) {
      fail("[dist] wait on {} timed out after {} ms (the operation is still running)", description_, timeout.count());
    }
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::block(std::unique_lock<std::mutex>& lock, const std::chrono::steady_clock::time_point* until) const {
  while (!done_) {
    if (until && std::chrono::steady_clock::now() >= *until) return false;
    if (!progress_) {
      if (until) {
        cv_.wait_until(lock, *until);
      } else {
        cv_.wait(lock);
      }
      continue;
    }
    // Caller progress: this thread advances the operation (the group's turn is its own while it
    // polls), as MPI_Wait would; a thread already doing so is about to finish a step.
    lock.unlock();
    const WorkProgress::Poll polled = progress_->poll();
    if (polled == WorkProgress::Poll::busy) std::this_thread::yield();
    lock.lock();
    // idle: the operation runs on the communication thread, or waits behind one that does; its
    // completion notifies, and the short sleep also covers it becoming pollable.
    if (polled == WorkProgress::Poll::idle && !done_) cv_.wait_for(lock, std::chrono::microseconds(100));
  }
  return true;
}

bool Work::is_completed() const {
  std::lock_guard lock(mutex_);
  return done_;
}

bool Work::is_success() const {
  std::lock_guard lock(mutex_);
  return done_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard lock(mutex_);
  return error_;
}

const TensorList& Work::result() const {
  wait();
  return result_;  // immutable once done
}

WorkPtr Work::then(std::function<TensorList(Work&)> fn) {
  TANDEM_CHECK(fn != nullptr, "[dist] then() on {} needs a function", description_);
  auto next = std::make_shared<Work>(description_ + " (then)");
  next->progress_ = progress_;  // it completes when this does: waiting on it advances this
  auto self = shared_from_this();
  auto run = [self, next, fn = std::move(fn)] {
    if (self->error_) {
      next->mark_failed(self->error_);
      return;
    }
    try {
      next->mark_completed(fn(*self));
    } catch (...) {
      next->mark_failed(std::current_exception());
    }
  };
  {
    std::lock_guard lock(mutex_);
    if (!done_) {
      continuations_.push_back(std::move(run));
      return next;
    }
  }
  run();
  return next;
}

void Work::mark_completed(TensorList result) { finish(std::move(result), nullptr); }

void Work::mark_failed(std::exception_ptr error) {
  TANDEM_CHECK(error != nullptr, "[dist] mark_failed on {} needs an exception", description_);
  finish({}, std::move(error));
}

void Work::finish(TensorList result, std::exception_ptr error) {
  std::vector<std::function<void()>> continuations;
  {
    std::lock_guard lock(mutex_);
    TANDEM_CHECK(!done_, "[dist] {} completed twice", description_);
    if (!stream_wait_) result_ = std::move(result);  // a device-ordered result is read unlocked
    error_ = std::move(error);
    done_ = true;
    continuations.swap(continuations_);
  }
  cv_.notify_all();
  // Outside the lock: a continuation may call then() or is_completed() on this Work.
  for (auto& c : continuations) c();
}

}  // namespace tandem::dist
