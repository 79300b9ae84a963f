#include "data/loader.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "autograd/grad_mode.h"
#include <fmt/format.h>

#include "core/trace.h"

namespace tandem::data {

namespace {

int64_t checked_size(const std::shared_ptr<const Dataset>& dataset) {
  TANDEM_CHECK(dataset != nullptr, "[DataLoader] the data set is null");
  return dataset->size();
}

}  // namespace

// One epoch in flight: its indices, and the bounded queue the prefetch thread fills.
struct DataLoader::Epoch {
  // A made batch, or the exception making it threw (it ends the epoch at that batch).
  struct Slot {
    TensorList batch;
    std::exception_ptr error;
  };

  std::shared_ptr<const Dataset> dataset;
  std::vector<int64_t> indices;
  int64_t batch_size;
  int64_t num_batches;
  size_t capacity;
  int rank;  // names the thread's track in a trace
  int64_t taken = 0;  // batches handed to the consumer (its side only)
  int64_t claimed = 0;  // batches made or being made, by either side (under the mutex)

  std::mutex mutex;
  std::condition_variable ready;  // the queue is not empty
  std::condition_variable space;  // the queue has room, or stop was set
  std::deque<Slot> queue;
  bool stop = false;
  std::thread worker;

  Epoch(std::shared_ptr<const Dataset> d, std::vector<int64_t> idx, int64_t bs, int64_t nb, int64_t first,
        int prefetch, int rank)
      : dataset(std::move(d)), indices(std::move(idx)), batch_size(bs), num_batches(nb),
        capacity(static_cast<size_t>(prefetch)), rank(rank), taken(first), claimed(first) {
    if (capacity > 0 && first < num_batches) worker = std::thread([this] { run(); });
  }

  ~Epoch() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    space.notify_all();
    if (worker.joinable()) worker.join();
  }

  TensorList make(int64_t b) const {
    TANDEM_TRACE_SCOPE("make batch", "data");
    // Data code never records on the tape: the batch is an input, not a result.
    NoGradGuard no_grad;
    const int64_t begin = b * batch_size;
    const int64_t n = std::min(batch_size, static_cast<int64_t>(indices.size()) - begin);
    return dataset->get_batch(std::span<const int64_t>(indices).subspan(static_cast<size_t>(begin),
                                                                        static_cast<size_t>(n)));
  }

  // The prefetch thread: makes the batches in order, at most `capacity` ahead of the consumer
  // (waiting for room before claiming one, so no more than that many exist beside the consumer's).
  void run() {
    trace::set_thread_name(fmt::format("rank {} loader", rank));
    for (;;) {
      int64_t b;
      {
        std::unique_lock<std::mutex> lock(mutex);
        space.wait(lock, [&] { return stop || queue.size() < capacity; });
        if (stop || claimed == num_batches) return;
        b = claimed++;
      }
      Slot slot;
      try {
        slot.batch = make(b);
      } catch (...) {
        slot.error = std::current_exception();
      }
      const bool failed = slot.error != nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (stop) return;
        queue.push_back(std::move(slot));
      }
      ready.notify_one();
      if (failed) return;  // the consumer rethrows at this batch; nothing after it is made
    }
  }

  // The consumer's next batch; the caller has checked taken < num_batches.
  TensorList take() {
    const int64_t b = taken++;
    if (capacity == 0) return make(b);
    Slot slot;
    {
      std::unique_lock<std::mutex> lock(mutex);
      if (queue.empty() && claimed == b) {
        // Nobody has started this batch: the thread has not been scheduled since it had room (a
        // busy machine). Making it here costs what prefetch 0 costs; waiting for the thread to
        // get a core can cost milliseconds.
        claimed = b + 1;
        lock.unlock();
        return make(b);
      }
      // The thread pushes every batch it claims (up to the first failure), and stop is only set
      // by this side, so this wait always ends.
      if (queue.empty()) {
        TANDEM_TRACE_SCOPE("wait for batch", "data");  // the step waits on the loader
        ready.wait(lock, [&] { return !queue.empty(); });
      }
      slot = std::move(queue.front());
      queue.pop_front();
    }
    space.notify_one();
    if (slot.error) std::rethrow_exception(slot.error);
    return std::move(slot.batch);
  }
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)),
      options_(options),
      sampler_(checked_size(dataset_), options.num_replicas, options.rank,
               {.shuffle = options.shuffle, .seed = options.seed, .drop_last = options.shard_drop_last}) {
  TANDEM_CHECK(options_.batch_size >= 1, "[DataLoader] batch_size must be >= 1, got {}", options_.batch_size);
  TANDEM_CHECK(options_.prefetch >= 0, "[DataLoader] prefetch must be >= 0, got {}", options_.prefetch);
}

DataLoader::~DataLoader() = default;  // ~Epoch stops and joins the prefetch thread

int64_t DataLoader::num_batches() const {
  const int64_t n = sampler_.num_samples(), bs = options_.batch_size;
  return options_.drop_last ? n / bs : (n + bs - 1) / bs;
}

DataLoader::Iterator DataLoader::begin_at(int64_t first) {
  TANDEM_CHECK(first >= 0 && first <= num_batches(), "[DataLoader] begin_at: batch {} is outside [0, {}]", first,
               num_batches());
  running_.reset();
  running_ = std::make_unique<Epoch>(dataset_, sampler_.indices(), options_.batch_size, num_batches(), first,
                                     options_.prefetch, options_.rank);
  return Iterator(this);
}

bool DataLoader::next(TensorList& batch) {
  if (!running_) return false;
  if (running_->taken == running_->num_batches) {
    running_.reset();  // the thread has made its last batch: join it now, not at the next begin()
    return false;
  }
  try {
    batch = running_->take();
  } catch (...) {
    running_.reset();  // the epoch ends at the failed batch
    throw;
  }
  return true;
}

DataLoader::Iterator::Iterator(DataLoader* loader) : loader_(loader) { done_ = !loader_->next(batch_); }

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  done_ = !loader_->next(batch_);
  return *this;
}

}  // namespace tandem::data
