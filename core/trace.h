// A timeline of what each thread does, for chrome://tracing and Perfetto (Chrome's trace-event
// format): spans (forward, backward, a bucket's reduction, the optimizer step, a wait) nest per
// thread, and async spans (from a bucket's launch on the backward thread to its reduction on the
// communication thread) get tracks of their own.
//
//   trace::start();                       // recording on
//   { TANDEM_TRACE_SCOPE("forward", "ddp"); ... }
//   trace::stop();
//   std::string json = trace::to_json(rank, "rank 0");  // {"traceEvents": [...]}
//
// Off, each probe costs one relaxed atomic load. Timestamps are CLOCK_MONOTONIC microseconds,
// the same clock for every process of a node, so several ranks' events merge into one file.
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::detail {
extern std::atomic<bool> trace_recording;
}  // namespace tandem::detail

namespace tandem::trace {

inline bool enabled() { return detail::trace_recording.load(std::memory_order_relaxed); }
void start();  // drops what an earlier recording kept, then records
void stop();

// The name this thread's track shows ("main", "rank 0 comm world", ...); kept for later
// recordings. Cheap enough for any thread to call once at its start, recording or not.
void set_thread_name(const std::string& name);

// A span on the calling thread from construction to destruction.
class Scope {
 public:
  Scope(const char* name, const char* category) {
    if (enabled()) begin(name, category);
  }
  Scope(const std::string& name, const char* category) {
    if (enabled()) begin(name, category);
  }
  // A name that costs something to make (a format) is made only while recording:
  //   trace::Scope span([&] { return "wait " + what; }, "dist");
  template <std::invocable F>
  Scope(F&& make_name, const char* category) {
    if (enabled()) begin(std::forward<F>(make_name)(), category);
  }
  ~Scope() {
    if (active_) end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void begin(std::string name, const char* category);
  void end();
  bool active_ = false;
  std::string name_;
  const char* category_ = "";
  int64_t start_us_ = 0;
};

// A point in time on the calling thread.
void instant(const std::string& name, const char* category);
// An async span that may begin and end on different threads; `id` pairs them (unique among the
// spans of one name that overlap).
void async_begin(const std::string& name, const char* category, uint64_t id);
void async_end(const std::string& name, const char* category, uint64_t id);
// A fresh id for async_begin/async_end, unique in this process.
uint64_t new_async_id();

// Everything recorded since start(), as one JSON object {"traceEvents": [...]}, process id `pid`
// (the rank) named `process_name`, one thread id per thread with its name.
std::string to_json(int pid, const std::string& process_name);
// The events of several such objects (one per rank) in one object: what a file should hold.
std::string merge_json(const std::vector<std::string>& per_process);

}  // namespace tandem::trace

#define TANDEM_TRACE_CONCAT_(a, b) a##b
#define TANDEM_TRACE_CONCAT(a, b) TANDEM_TRACE_CONCAT_(a, b)
#define TANDEM_TRACE_SCOPE(name, category) \
  ::tandem::trace::Scope TANDEM_TRACE_CONCAT(tandem_trace_scope_, __LINE__)(name, category)
