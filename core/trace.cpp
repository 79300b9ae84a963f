#include "core/trace.h"

#include <time.h>

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

namespace tandem::detail {
std::atomic<bool> trace_recording{false};
}  // namespace tandem::detail

namespace tandem::trace {

namespace {

int64_t now_us() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000 + ts.tv_nsec / 1000;
}

struct Event {
  char phase;  // 'X' span, 'i' instant, 'b'/'e' async begin/end
  std::string name;
  const char* category;
  int64_t ts_us;
  int64_t dur_us;
  uint64_t id;
};

// One per thread that ever recorded; kept after the thread ends, so its events still get written.
// Its mutex is uncontended except while to_json reads it.
struct ThreadLog {
  std::mutex mutex;
  int tid = 0;
  std::string name;
  std::vector<Event> events;
};

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<ThreadLog>> threads;
  int next_tid = 1;
};

Registry& registry() {
  static Registry* r = new Registry;  // leaked: threads may record during static destruction
  return *r;
}

// A thread's name until it records: naming a thread registers nothing, so threads that name
// themselves at start (communication, prefetch) cost nothing while no recording runs.
thread_local std::string tls_name;
thread_local ThreadLog* tls_log = nullptr;

ThreadLog& this_thread_log() {
  thread_local std::shared_ptr<ThreadLog> log = [] {
    auto l = std::make_shared<ThreadLog>();
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    l->tid = r.next_tid++;
    l->name = tls_name.empty() ? "thread " + std::to_string(l->tid) : tls_name;
    r.threads.push_back(l);
    tls_log = l.get();
    return l;
  }();
  return *log;
}

void record(Event e) {
  ThreadLog& log = this_thread_log();
  std::lock_guard lock(log.mutex);
  log.events.push_back(std::move(e));
}

}  // namespace

void start() {
  Registry& r = registry();
  {
    std::lock_guard lock(r.mutex);
    for (const auto& t : r.threads) {
      std::lock_guard l(t->mutex);
      t->events.clear();
    }
  }
  detail::trace_recording.store(true);
}

void stop() { detail::trace_recording.store(false); }

void set_thread_name(const std::string& name) {
  tls_name = name;
  if (!tls_log) return;
  std::lock_guard lock(tls_log->mutex);
  tls_log->name = name;
}

uint64_t new_async_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void Scope::begin(std::string name, const char* category) {
  active_ = true;
  name_ = std::move(name);
  category_ = category;
  start_us_ = now_us();
}

void Scope::end() {
  const int64_t t = now_us();
  record({'X', std::move(name_), category_, start_us_, t - start_us_, 0});
}

void instant(const std::string& name, const char* category) {
  if (enabled()) record({'i', name, category, now_us(), 0, 0});
}

void async_begin(const std::string& name, const char* category, uint64_t id) {
  if (enabled()) record({'b', name, category, now_us(), 0, id});
}

void async_end(const std::string& name, const char* category, uint64_t id) {
  if (enabled()) record({'e', name, category, now_us(), 0, id});
}

std::string to_json(int pid, const std::string& process_name) {
  using nlohmann::json;
  json events = json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", process_name}}}});
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const auto& t : r.threads) {
    std::lock_guard l(t->mutex);
    if (t->events.empty()) continue;
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", t->tid}, {"args", {{"name", t->name}}}});
    for (const Event& e : t->events) {
      json j = {{"ph", std::string(1, e.phase)}, {"name", e.name}, {"cat", e.category},
                {"ts", e.ts_us}, {"pid", pid}, {"tid", t->tid}};
      if (e.phase == 'X') j["dur"] = e.dur_us;
      if (e.phase == 'i') j["s"] = "t";  // thread-scoped instant
      if (e.phase == 'b' || e.phase == 'e') j["id"] = e.id;
      events.push_back(std::move(j));
    }
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump();
}

std::string merge_json(const std::vector<std::string>& per_process) {
  using nlohmann::json;
  json all = json::array();
  for (const std::string& s : per_process) {
    json one = json::parse(s);
    for (auto& e : one.at("traceEvents")) all.push_back(std::move(e));
  }
  return json{{"traceEvents", std::move(all)}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace tandem::trace
