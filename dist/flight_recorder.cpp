// The flight recorder: the groups' rings (detail/flight_recorder.h), the process registry, the
// caller tags, and the dumps (JSON, written on failure, on a peer's request, on SIGUSR1, at exit).
#include "dist/flight_recorder.h"

#include <fmt/format.h>
#include <semaphore.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "dist/detail/flight_recorder.h"

namespace tandem::dist {

namespace {

thread_local char tls_tag[48] = {};

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void copy_tag(char (&to)[48], std::string_view from) {
  const size_t n = std::min(from.size(), sizeof to - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

}  // namespace

// ---- tags ----

CollectiveTag::CollectiveTag(std::string_view name, int64_t index) {
  std::memcpy(previous_, tls_tag, sizeof previous_);
  if (index < 0) {
    copy_tag(tls_tag, name);
  } else {
    auto end = fmt::format_to_n(tls_tag, sizeof tls_tag - 1, "{} {}", name, index).out;
    *end = '\0';
  }
}

CollectiveTag::~CollectiveTag() { std::memcpy(tls_tag, previous_, sizeof previous_); }

std::string_view current_collective_tag() { return tls_tag; }

// ---- entries ----

std::string_view flight_state_name(FlightState s) {
  switch (s) {
    case FlightState::issued: return "issued";
    case FlightState::started: return "started";
    case FlightState::completed: return "completed";
    case FlightState::failed: return "failed";
  }
  return "?";
}

std::string FlightEntry::signature() const {
  std::string s(op_kind_name(kind));
  if (has_reduce) s += fmt::format(" {}", reduce_op_name(reduce));
  // all_to_all's inputs may differ in size from rank to rank (uneven splits): its dtype only.
  if (has_dtype) s += kind == OpKind::all_to_all ? fmt::format(" {}", dtype_name(dtype))
                                                 : fmt::format(" {}[{}]", dtype_name(dtype), numel);
  if (tensors > 1) s += fmt::format(" in {} tensors", tensors);
  if (kind == OpKind::broadcast) s += fmt::format(" root {}", peer);
  if (kind == OpKind::send) s += fmt::format(" to {} tag {}", peer, tag);
  if (kind == OpKind::recv) s += fmt::format(" from {} tag {}", peer, tag);
  return s;
}

std::string FlightEntry::summary() const {
  return caller[0] ? fmt::format("{} ({})", signature(), caller) : signature();
}

// ---- the ring ----

FlightRecorder::FlightRecorder(std::string group, int rank, int size, size_t capacity)
    : group_(std::move(group)), rank_(rank), size_(size), capacity_(capacity) {}

void FlightRecorder::set_backend(std::string backend, std::vector<int> world_ranks) {
  std::lock_guard lock(mutex_);
  backend_ = std::move(backend);
  world_ranks_ = std::move(world_ranks);
}

std::string FlightRecorder::backend() const {
  std::lock_guard lock(mutex_);
  return backend_;
}

std::vector<int> FlightRecorder::world_ranks() const {
  std::lock_guard lock(mutex_);
  return world_ranks_;
}

FlightEntry* FlightRecorder::slot(uint64_t id) {
  if (capacity_ == 0 || id == 0) return nullptr;
  FlightEntry& e = ring_[(id - 1) % capacity_];
  return e.id == id ? &e : nullptr;
}

uint64_t FlightRecorder::issued(OpKind kind, uint64_t seq, const TensorList& inputs, std::optional<ReduceOp> reduce,
                                int peer, int tag) {
  const int64_t t = now_us();
  std::lock_guard lock(mutex_);
  const uint64_t id = next_id_++;
  issued_before_ = last_issued_;
  if (!is_p2p(kind)) last_issued_ = static_cast<int64_t>(seq);
  if (capacity_ == 0) return id;
  if (ring_.size() < capacity_) ring_.emplace_back();
  FlightEntry& e = ring_[(id - 1) % capacity_];
  e.id = id;
  e.seq = seq;
  e.kind = kind;
  e.has_reduce = reduce.has_value();
  e.reduce = reduce.value_or(ReduceOp::sum);
  e.has_dtype = !inputs.empty();
  e.dtype = inputs.empty() ? Dtype::f32 : inputs[0].dtype();
  e.numel = 0;
  for (const Tensor& x : inputs) e.numel += x.numel();
  e.tensors = static_cast<int>(inputs.size());
  e.peer = peer;
  e.tag = tag;
  std::memcpy(e.caller, tls_tag, sizeof e.caller);
  e.issued_us = t;
  e.started_us = e.ended_us = 0;
  e.state = FlightState::issued;
  e.error.clear();
  e.missing.clear();
  return id;
}

void FlightRecorder::started(uint64_t id) {
  const int64_t t = now_us();
  std::lock_guard lock(mutex_);
  if (FlightEntry* e = slot(id); e && e->state == FlightState::issued) {
    e->started_us = t;
    e->state = FlightState::started;
  }
}

void FlightRecorder::ended(uint64_t id, int64_t seq, bool ok, std::string_view error,
                           const std::vector<int>& missing) {
  const int64_t t = now_us();
  std::lock_guard lock(mutex_);
  if (seq >= 0) last_ended_ = std::max(last_ended_, seq);
  FlightEntry* e = slot(id);
  if (!e) return;
  if (e->started_us == 0) e->started_us = t;
  e->ended_us = t;
  e->state = ok ? FlightState::completed : FlightState::failed;
  if (!ok) {
    e->error = error;
    e->missing = missing;
  }
}

void FlightRecorder::withdraw(uint64_t id) {
  std::lock_guard lock(mutex_);
  if (id == 0 || id + 1 != next_id_) return;  // only the newest
  if (FlightEntry* e = slot(id)) {
    e->id = 0;
    if (ring_.size() == id) ring_.pop_back();  // not wrapped yet: the slot was the last one added
  }
  --next_id_;
  last_issued_ = issued_before_;
}

void FlightRecorder::set_broken(std::string_view reason) {
  std::lock_guard lock(mutex_);
  if (broken_.empty()) broken_ = reason;
}

FlightPosition FlightRecorder::position(uint64_t seq) const {
  std::lock_guard lock(mutex_);
  FlightPosition p;
  p.last_issued = last_issued_;
  p.last_ended = last_ended_;
  // Newest first: the collective entries with the sequence number asked for, and the newest one.
  const uint64_t newest = next_id_ - 1;
  const uint64_t kept = std::min<uint64_t>(newest, ring_.size());
  for (uint64_t k = 0; k < kept; ++k) {
    const FlightEntry& e = ring_[(newest - 1 - k) % capacity_];
    if (is_p2p(e.kind)) continue;
    if (!p.last) p.last = e;
    if (e.seq == seq) {
      p.at_seq = e;
      break;
    }
    if (e.seq < seq) break;
  }
  return p;
}

FlightRecorder::Snapshot FlightRecorder::snapshot() const {
  std::lock_guard lock(mutex_);
  Snapshot s;
  s.group = group_;
  s.backend = backend_;
  s.broken = broken_;
  s.rank = rank_;
  s.size = size_;
  s.world_ranks = world_ranks_;
  s.capacity = capacity_;
  s.recorded = next_id_ - 1;
  const uint64_t kept = std::min<uint64_t>(s.recorded, ring_.size());
  s.entries.reserve(kept);
  for (uint64_t id = s.recorded - kept + 1; id <= s.recorded; ++id) s.entries.push_back(ring_[(id - 1) % capacity_]);
  return s;
}

FlightFailure flight_failure(std::exception_ptr error, std::string fallback) noexcept {
  FlightFailure f;
  try {
    try {
      std::rethrow_exception(error);
    } catch (const CollectiveError& e) {
      f.what = e.what();
      f.missing = e.missing_ranks();
    } catch (const std::exception& e) {
      f.what = e.what();
    } catch (...) {
      f.what = std::move(fallback);
    }
  } catch (...) {  // no memory for the text: the entry says less
  }
  return f;
}

// ---- settings ----

std::string flight_recorder_dir() {
  const char* env = std::getenv("TANDEM_FLIGHT_RECORDER");
  return env ? env : "";
}

size_t flight_recorder_capacity() {
  const char* env = std::getenv("TANDEM_FLIGHT_RECORDER_ENTRIES");
  if (!env) return 2000;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(env, &end, 10);
  TANDEM_CHECK(end != env && *end == '\0' && errno == 0 && n >= 0 && n <= 10'000'000,
               "[flight_recorder] TANDEM_FLIGHT_RECORDER_ENTRIES must be a whole number from 0 to 10000000, got '{}'",
               env);
  return static_cast<size_t>(n);
}

// ---- the registry, and the dumps ----

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::weak_ptr<FlightRecorder>> live;
  std::deque<std::shared_ptr<FlightRecorder>> retired;  // the newest kRetired destroyed groups'
  static constexpr size_t kRetired = 8;
  std::atomic<int> process_rank{-1};
  std::mutex dump_mutex;  // one dump at a time (they write the same file)
  bool hooks_installed = false;  // under mutex
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: dumps may run at exit
  return *r;
}

std::vector<std::shared_ptr<FlightRecorder>> all_recorders() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::shared_ptr<FlightRecorder>> out;
  for (auto& w : r.live)
    if (auto p = w.lock()) out.push_back(std::move(p));
  for (auto& p : r.retired) out.push_back(p);
  return out;
}

// A thread that dumps when woken: by SIGUSR1 (a signal handler may do almost nothing itself:
// sem_post is one of the few calls it may make) or by a failure (flight_dump_on_failure), whose
// reason waits in g_dump_reason.
sem_t g_dump_signal;
std::mutex g_dump_reason_mutex;
std::string g_dump_reason;  // empty: SIGUSR1
std::atomic<bool> g_dump_thread{false};

extern "C" void on_dump_signal(int) { sem_post(&g_dump_signal); }

void dump_quietly(const std::string& reason) noexcept {
  try {
    dump_flight_recorder(reason);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  } catch (...) {
  }
}

// With TANDEM_FLIGHT_RECORDER set when the first group is made: SIGUSR1 dumps (unless the program
// handles SIGUSR1 itself), and so does the exit.
void install_hooks_locked(Registry& r) {
  if (r.hooks_installed || flight_recorder_dir().empty()) return;
  r.hooks_installed = true;
  std::atexit([] { dump_quietly("exit"); });
  if (sem_init(&g_dump_signal, 0, 0) != 0) return;
  std::thread([] {
    for (;;) {
      if (sem_wait(&g_dump_signal) != 0) continue;  // EINTR
      std::string reason;
      {
        std::lock_guard lock(g_dump_reason_mutex);
        reason.swap(g_dump_reason);
      }
      dump_quietly(reason.empty() ? "SIGUSR1" : reason);
    }
  }).detach();
  g_dump_thread.store(true);
  struct sigaction old = {};
  if (sigaction(SIGUSR1, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;  // the program's own
  struct sigaction sa = {};
  sa.sa_handler = on_dump_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
}

nlohmann::ordered_json entry_json(const FlightEntry& e) {
  nlohmann::ordered_json j;
  j["id"] = e.id;
  j["seq"] = e.seq;
  j["op"] = std::string(op_kind_name(e.kind));
  j["p2p"] = is_p2p(e.kind);
  if (e.has_reduce) j["reduce"] = std::string(reduce_op_name(e.reduce));
  if (e.has_dtype) j["dtype"] = std::string(dtype_name(e.dtype));
  j["numel"] = e.numel;
  j["tensors"] = e.tensors;
  if (e.kind == OpKind::broadcast || is_p2p(e.kind)) j["peer"] = e.peer;
  if (is_p2p(e.kind)) j["tag"] = e.tag;
  j["signature"] = e.signature();
  j["caller"] = std::string(e.caller);
  j["state"] = std::string(flight_state_name(e.state));
  j["issued_us"] = e.issued_us;
  j["started_us"] = e.started_us;
  j["ended_us"] = e.ended_us;
  if (e.state == FlightState::failed) {
    j["error"] = e.error;
    if (!e.missing.empty()) j["missing_ranks"] = e.missing;
  }
  return j;
}

}  // namespace

std::shared_ptr<FlightRecorder> make_flight_recorder(std::string group, int rank, int size) {
  auto rec = std::make_shared<FlightRecorder>(std::move(group), rank, size, flight_recorder_capacity());
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  // Forget the groups that are gone (retired ones are kept in `retired`).
  std::erase_if(r.live, [](const std::weak_ptr<FlightRecorder>& w) { return w.expired(); });
  r.live.push_back(rec);
  install_hooks_locked(r);
  return rec;
}

void retire_flight_recorder(const std::shared_ptr<FlightRecorder>& recorder) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.retired.push_back(recorder);
  while (r.retired.size() > Registry::kRetired) r.retired.pop_front();
}

std::shared_ptr<FlightRecorder> find_flight_recorder(std::string_view group, std::string_view backend, int rank) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (auto it = r.live.rbegin(); it != r.live.rend(); ++it)  // the newest first
    if (auto rec = it->lock(); rec && rec->group() == group && rec->rank() == rank && rec->backend() == backend)
      return rec;
  return nullptr;
}

void set_flight_process_rank(int rank) { registry().process_rank.store(rank); }

int flight_process_rank() {
  const int r = registry().process_rank.load();
  if (r >= 0) return r;
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* env = std::getenv(var)) return std::atoi(env);
  return 0;
}

std::string flight_recorder_json(std::string_view reason) {
  nlohmann::ordered_json doc;
  doc["format"] = "tandem-flight-recorder";
  doc["version"] = 1;
  doc["reason"] = std::string(reason);
  doc["process_rank"] = flight_process_rank();
  doc["pid"] = static_cast<int64_t>(getpid());
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  doc["host"] = host;
  doc["time_us"] = now_us();
  doc["groups"] = nlohmann::ordered_json::array();
  for (auto& rec : all_recorders()) {
    FlightRecorder::Snapshot s = rec->snapshot();
    nlohmann::ordered_json g;
    g["group"] = s.group;
    g["backend"] = s.backend;
    g["rank"] = s.rank;
    g["size"] = s.size;
    g["world_ranks"] = s.world_ranks;
    g["capacity"] = s.capacity;
    g["recorded"] = s.recorded;
    if (!s.broken.empty()) g["broken"] = s.broken;
    g["entries"] = nlohmann::ordered_json::array();
    for (const FlightEntry& e : s.entries) g["entries"].push_back(entry_json(e));
    doc["groups"].push_back(std::move(g));
  }
  // Tags are cut at a byte count and errors quote what they met: never let a stray byte stop a dump.
  return doc.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string dump_flight_recorder(std::string_view reason, const std::string& path) {
  std::string target = path;
  if (target.empty()) {
    const std::string dir = flight_recorder_dir();
    TANDEM_CHECK(!dir.empty(), "[flight_recorder] no dump path given and TANDEM_FLIGHT_RECORDER is not set");
    target = fmt::format("{}/tandem_flight_rank{}.json", dir, flight_process_rank());
  }
  Registry& r = registry();
  std::lock_guard lock(r.dump_mutex);  // taken before the snapshot: a later dump is never overwritten by an older one
  const std::string text = flight_recorder_json(reason);
  // Written beside and renamed: a reader (the report tool, another dump) never sees half a file.
  const std::string tmp = fmt::format("{}.{}.tmp", target, getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TANDEM_CHECK(out.good(), "[flight_recorder] cannot write {}: {}", tmp, std::strerror(errno));
    out << text << '\n';
    out.close();
    TANDEM_CHECK(out.good(), "[flight_recorder] writing {} failed: {}", tmp, std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("[flight_recorder] cannot rename {} to {}: {}", tmp, target, std::strerror(err));
  }
  return target;
}

void flight_dump_on_failure(const std::string& reason) {
  try {
    if (flight_recorder_dir().empty()) return;
    if (!g_dump_thread.load()) return dump_quietly(reason);
    {
      std::lock_guard lock(g_dump_reason_mutex);
      g_dump_reason = reason;
    }
    sem_post(&g_dump_signal);
  } catch (...) {  // a failure path: the dump is a courtesy
  }
}

void flight_dump_now(const std::string& reason) noexcept {
  if (!flight_recorder_dir().empty()) dump_quietly(reason);
}

std::string flight_dump_hint() {
  const std::string dir = flight_recorder_dir();
  if (dir.empty())
    return "Set TANDEM_FLIGHT_RECORDER=<dir> to have every rank dump its last collectives there "
           "(flight_report <dir>, installed beside the library, reads them)";
  return fmt::format("Every rank's last collectives are dumped to {}/tandem_flight_rank<R>.json "
                     "(read them with flight_report {})",
                     dir, dir);
}

}  // namespace tandem::dist
