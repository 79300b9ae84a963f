#include "dist/detail/group_base.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "dist/detail/collective_checks.h"
#include "dist/detail/flight_recorder.h"

namespace tandem::dist {

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::allreduce: return "allreduce";
    case OpKind::allreduce_coalesced: return "allreduce_coalesced";
    case OpKind::broadcast: return "broadcast";
    case OpKind::allgather: return "allgather";
    case OpKind::allgather_into: return "allgather_into";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::reduce_scatter_tensor: return "reduce_scatter_tensor";
    case OpKind::all_to_all: return "all_to_all";
    case OpKind::barrier: return "barrier";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::new_group: return "new_group";
  }
  return "?";
}

Milliseconds default_timeout() {
  if (const char* env = std::getenv("TANDEM_DIST_TIMEOUT")) {
    char* end = nullptr;
    double s = std::strtod(env, &end);
    TANDEM_CHECK(end != env && s > 0, "[dist] TANDEM_DIST_TIMEOUT must be a positive number of seconds, got '{}'", env);
    return Milliseconds(static_cast<int64_t>(s * 1000.0));
  }
  return Milliseconds(300'000);
}

bool default_debug_checks() {
  const char* env = std::getenv("TANDEM_DIST_DEBUG");
  return env && std::string_view(env) == "detail";
}

// ---- BrokenState ----

namespace {
struct ProcessBreak {
  std::mutex mutex;
  std::string first;
};
ProcessBreak& process_break() {
  static auto* b = new ProcessBreak();  // never destroyed: read by an exit handler
  return *b;
}
}  // namespace

std::string first_process_break() {
  ProcessBreak& b = process_break();
  std::lock_guard lock(b.mutex);
  return b.first;
}

std::string BrokenState::reason() const {
  std::lock_guard lock(mutex_);
  return reason_;
}

bool BrokenState::mark(const std::string& reason) {
  bool first = false;
  {
    std::lock_guard lock(mutex_);
    first = !broken_.load();
    if (reason_.empty()) reason_ = reason;
    broken_.store(true);
  }
  if (!peers_are_processes_) return first;
  ProcessBreak& b = process_break();
  std::lock_guard lock(b.mutex);
  // Never empty once recorded: the exit path tests for "".
  if (b.first.empty()) b.first = reason.empty() ? std::string("[dist] a group broke") : reason;
  return first;
}

namespace {
thread_local const BrokenState* t_running_group = nullptr;
}  // namespace

WaitsEndOnBreak::WaitsEndOnBreak(const BrokenState& state) : previous_(t_running_group) { t_running_group = &state; }
WaitsEndOnBreak::~WaitsEndOnBreak() { t_running_group = previous_; }
bool wait_abandoned() { return t_running_group != nullptr && t_running_group->is_broken(); }

std::string BrokenState::message(std::string_view what) const {
  return fmt::format("[dist] cannot run {}: the group is broken ({})", what, reason());
}

// ---- GroupBase ----

GroupBase::GroupBase(int rank, int size, std::string name, Milliseconds timeout, bool debug_checks,
                     std::shared_ptr<BrokenState> broken)
    : rank_(rank), size_(size), name_(std::move(name)), timeout_ms_(timeout.count()), debug_(debug_checks),
      broken_(std::move(broken)), recorder_(make_flight_recorder(name_, rank, size)) {}

GroupBase::~GroupBase() { retire_flight_recorder(recorder_); }

void GroupBase::set_timeout(Milliseconds timeout) {
  TANDEM_CHECK(timeout.count() > 0, "[dist] timeout must be positive, got {} ms", timeout.count());
  timeout_ms_.store(timeout.count());
}

std::string GroupBase::compare_hint() const {
  if (debug_checks()) return "";
  return " If the ranks may have called different collectives, TANDEM_DIST_DEBUG=detail compares each one across "
         "the ranks before it runs and names the first that differs (it costs about 8% of a small DDP step, so it "
         "is off by default).";
}

std::string GroupBase::describe(OpKind kind, uint64_t seq, int peer, int tag) const {
  // The group part never changes (formatted once: describe runs for every op issued).
  std::call_once(where_once_, [&] { where_ = fmt::format("group {} ({}, rank {} of {})", name_, backend(), rank_, size_); });
  const std::string& where = where_;
  switch (kind) {
    case OpKind::send: return fmt::format("send #{} to rank {} (tag {}) on {}", seq, peer, tag, where);
    case OpKind::recv: return fmt::format("recv #{} from rank {} (tag {}) on {}", seq, peer, tag, where);
    default: return fmt::format("{} #{} on {}", op_kind_name(kind), seq, where);
  }
}

void GroupBase::fail_mismatch(uint64_t seq, const std::vector<std::string>& fingerprints) const {
  // Group ranks that called the same thing, in order of first appearance.
  std::vector<std::pair<std::string, std::vector<int>>> calls;
  for (int r = 0; r < static_cast<int>(fingerprints.size()); ++r) {
    auto it = std::find_if(calls.begin(), calls.end(), [&](auto& c) { return c.first == fingerprints[r]; });
    if (it == calls.end()) {
      calls.push_back({fingerprints[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::string parts;
  for (auto& [fp, ranks] : calls) {
    if (!parts.empty()) parts += "; ";
    parts += fmt::format("{} {} called {}", ranks.size() == 1 ? "rank" : "ranks", join_ranks(ranks), fp);
  }
  fail("[dist] collective mismatch at #{} on group {} ({}, {} ranks): {}", seq, name_, backend(), size_, parts);
}

std::string GroupBase::split_mismatch(uint64_t seq, int src, int64_t sends, int dst, int64_t expects) const {
  return fmt::format("[all_to_all] split mismatch at #{} on group {}: rank {} sends {} rows to rank {}, which expects {}",
                     seq, name_, src, sends, dst, expects);
}

void GroupBase::configure_child(ProcessGroup& child) const {
  child.set_timeout(timeout());
  child.set_debug_checks(debug_checks());
}

std::vector<int64_t> GroupBase::pack_fingerprint(const std::string& fingerprint, OpKind kind,
                                                 const std::vector<int64_t>& in_splits,
                                                 const std::vector<int64_t>& out_splits) const {
  std::string text = fingerprint;
  if (text.size() >= kFingerprintBytes) text = fmt::format("{}... (hash {:016x})", text.substr(0, 180), fnv1a(text));
  std::vector<int64_t> words(fingerprint_words(), 0);
  std::memcpy(words.data(), text.data(), text.size());
  const bool a2a = kind == OpKind::all_to_all;
  for (int k = 0; k < size_; ++k) {
    words[kFingerprintWords + k] = a2a ? in_splits[k] : -1;           // rows this rank sends to k
    words[kFingerprintWords + size_ + k] = a2a ? out_splits[k] : -1;  // rows it expects from k
  }
  return words;
}

void GroupBase::check_fingerprints(uint64_t seq, OpKind kind, const int64_t* table) const {
  const int n = size_;
  const int64_t words = fingerprint_words();
  std::vector<std::string> fps(n);
  bool mismatch = false;
  for (int r = 0; r < n; ++r) {
    const char* text = reinterpret_cast<const char*>(table + r * words);
    fps[r] = std::string(text, strnlen(text, kFingerprintBytes));
    mismatch |= fps[r] != fps[0];
  }
  if (mismatch) fail_mismatch(seq, fps);
  if (kind != OpKind::all_to_all) return;
  for (int src = 0; src < n; ++src) {
    for (int dst = 0; dst < n; ++dst) {
      const int64_t sends = table[src * words + kFingerprintWords + dst];
      const int64_t expects = table[dst * words + kFingerprintWords + n + src];
      if (sends != expects) throw Error(split_mismatch(seq, src, sends, dst, expects));
    }
  }
}

}  // namespace tandem::dist
