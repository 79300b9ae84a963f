#include "dist/detail/peer_probe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "dist/detail/flight_recorder.h"
#include "dist/flight_recorder.h"
#include "dist/join.h"

namespace tandem::dist {

namespace {
// The prober, and the calls of it in flight: set_peer_prober(nullptr) waits them out, so the
// transport is never used after it is torn down (MPI_Finalize).
std::mutex g_prober_mutex;
std::condition_variable g_prober_idle;
PeerProber g_prober = nullptr;
int g_prober_calls = 0;

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}
}  // namespace

void set_peer_prober(PeerProber prober) {
  std::unique_lock lock(g_prober_mutex);
  g_prober = prober;
  if (prober == nullptr) g_prober_idle.wait(lock, [] { return g_prober_calls == 0; });
}

std::optional<PeerReport> probe_peers(const FlightRecorder& recorder, uint64_t seq) {
  if (recorder.size() < 2) return std::nullopt;
  PeerProber prober = nullptr;
  {
    std::lock_guard lock(g_prober_mutex);
    if (g_prober == nullptr) return std::nullopt;
    prober = g_prober;
    ++g_prober_calls;
  }
  struct Done {
    ~Done() {
      std::lock_guard lock(g_prober_mutex);
      if (--g_prober_calls == 0) g_prober_idle.notify_all();
    }
  } done;
  // Whatever goes wrong here, the timeout being raised must not turn into another error.
  try {
    PeerQuery q;
    q.group = recorder.group();
    q.backend = recorder.backend();
    q.rank = recorder.rank();
    q.world_ranks = recorder.world_ranks();
    if (static_cast<int>(q.world_ranks.size()) != recorder.size()) return std::nullopt;
    q.seq = seq;
    q.dump = !flight_recorder_dir().empty();
    const FlightPosition mine = recorder.position(seq);
    return describe_peer_answers(prober(q), seq, mine.at_seq, q.wait);
  } catch (...) {
    return std::nullopt;
  }
}

PeerReport describe_peer_answers(const std::vector<PeerAnswer>& answers, uint64_t seq,
                                 const std::optional<FlightEntry>& mine, std::chrono::milliseconds wait) {
  const std::string my_signature = mine ? mine->signature() : "";
  const std::string my_summary = mine ? mine->summary() : "";
  bool join_involved = my_summary.find(kJoinAnnouncementTag) != std::string::npos;
  PeerReport r;
  std::vector<std::string> parts;
  std::vector<int> in_it;
  // Ranks that issued something else under the number, grouped by what (and in which state).
  std::vector<std::pair<std::string, std::vector<int>>> others;
  for (const PeerAnswer& a : answers) {
    if (!a.answered) {
      r.missing.push_back(a.rank);
      parts.push_back(fmt::format("rank {} did not arrive: it did not answer within {} ms (stopped, hung, or gone)",
                                  a.rank, wait.count()));
    } else if (!a.knows_group) {
      r.missing.push_back(a.rank);
      parts.push_back(fmt::format("rank {} did not arrive: it has no such group (destroyed, or never made)", a.rank));
    } else if (a.last_issued < static_cast<int64_t>(seq)) {
      r.missing.push_back(a.rank);
      if (a.last_seq < 0) {
        parts.push_back(fmt::format("rank {} did not arrive: it has issued no collective on this group", a.rank));
      } else {
        parts.push_back(fmt::format("rank {} did not arrive: its last collective on this group is #{}, {}, {}", a.rank,
                                    a.last_seq, a.last_summary, a.last_state));
      }
    } else if (a.has_at_seq && !my_signature.empty() && a.at_seq_signature != my_signature) {
      r.mismatch = true;
      join_involved |= a.at_seq_summary.find(kJoinAnnouncementTag) != std::string::npos;
      const std::string what = fmt::format("{} as #{} ({})", a.at_seq_summary, seq, a.at_seq_state);
      auto same = std::find_if(others.begin(), others.end(), [&](const auto& o) { return o.first == what; });
      if (same == others.end()) {
        others.push_back({what, {a.rank}});
      } else {
        same->second.push_back(a.rank);
      }
    } else {
      in_it.push_back(a.rank);
    }
  }
  for (const auto& [what, ranks] : others)
    parts.push_back(fmt::format("{} issued {}, where this rank issued {}", rank_list(ranks), what, my_summary));
  if (r.missing.empty() && parts.empty()) {
    r.text = "every rank issued it (a rank may be stuck inside it)";
    return r;
  }
  r.text = fmt::format("{}", fmt::join(parts, "; "));
  if (!in_it.empty()) r.text += fmt::format("; {} issued it too", rank_list(in_it));
  // A rank that has joined a dist::Join shadows only the joinables' collectives: one of the
  // user's own in the loop meets its announcement instead.
  if (r.mismatch && join_involved) r.text += std::string(". ") + kJoinShadowRule;
  return r;
}

}  // namespace tandem::dist
