#include "dist/mpi/detail/peer_responder.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "dist/detail/flight_recorder.h"
#include "dist/detail/peer_probe.h"
#include "dist/flight_recorder.h"
#include "dist/mpi/detail/runtime.h"

namespace tandem::dist {

namespace {

constexpr int kQueryTag = 1;
constexpr int kNoticeTag = 2;  // a group broke on the sender
constexpr int kAnswerTagBase = 1000;  // + the asker's round (mod kRounds): a late answer to an
constexpr int kRounds = 20000;        // earlier round is never taken for this one's
constexpr auto kTick = std::chrono::milliseconds(20);

// Fixed-size messages: every rank runs the same binary.
struct Query {
  int64_t seq;
  int32_t answer_tag;
  int32_t dump;
  int32_t rank_in_group;  // the rank asked about, in the group
  int32_t asker;          // the asking rank, in the group
  char group[160];
  char backend[16];
};

struct Answer {
  int64_t last_issued;
  int64_t last_seq;
  int32_t knows_group;
  int32_t has_at_seq;
  char at_seq_signature[160];
  char at_seq_summary[224];
  char at_seq_state[16];
  char last_summary[224];
  char last_state[16];
};

struct Notice {
  int64_t seq;
  int32_t from;  // the rank it broke on, in the group
  int32_t unused;
  char group[160];
  char reason[1024];
};

template <size_t N>
void put(char (&to)[N], std::string_view from) {
  const size_t n = std::min(from.size(), N - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

template <size_t N>
std::string get(const char (&from)[N]) {
  return std::string(from, strnlen(from, N));
}

Answer answer_for(const Query& q) {
  Answer a{};
  a.last_issued = a.last_seq = -1;
  auto rec = find_flight_recorder(get(q.group), get(q.backend), q.rank_in_group);
  if (!rec) return a;
  a.knows_group = 1;
  const FlightPosition p = rec->position(static_cast<uint64_t>(q.seq));
  a.last_issued = p.last_issued;
  if (p.at_seq) {
    a.has_at_seq = 1;
    put(a.at_seq_signature, p.at_seq->signature());
    put(a.at_seq_summary, p.at_seq->summary());
    put(a.at_seq_state, flight_state_name(p.at_seq->state));
  }
  if (p.last) {
    a.last_seq = static_cast<int64_t>(p.last->seq);
    put(a.last_summary, p.last->summary());
    put(a.last_state, flight_state_name(p.last->state));
  } else if (p.last_issued >= 0) {
    a.last_seq = p.last_issued;  // a ring of 0 entries: the number alone
    put(a.last_summary, "(not recorded: TANDEM_FLIGHT_RECORDER_ENTRIES=0)");
    put(a.last_state, p.last_ended >= p.last_issued ? "ended" : "running");
  }
  return a;
}

struct Responder {
  struct Sent {
    MPI_Request req;
    Answer answer;
  };
  MPI_Comm comm = MPI_COMM_NULL;
  // Answers on their way (push_back keeps earlier ones in place for MPI); one still pending at
  // the stop (an asker that went away) stays here for good: the Responder is never destroyed.
  std::deque<Sent> sent;
  // Notices this rank sent (any thread), until MPI is done with them; as `sent`, one still
  // pending at the stop stays for good.
  struct SentNotice {
    MPI_Request req = MPI_REQUEST_NULL;
    Notice notice;
  };
  std::mutex notices_mutex;
  std::deque<SentNotice> notices;
  std::thread thread;
  std::mutex mutex;
  std::condition_variable cv;
  bool stopping = false;
  std::atomic<int> round{0};

  void run() {
    std::unique_lock lock(mutex);
    while (!stopping) {
      cv.wait_for(lock, kTick);
      if (stopping) break;
      lock.unlock();
      bool dump = false;
      int asker = -1;
      for (;;) {
        int flag = 0;
        MPI_Status st;
        Query q{};
        {
          auto lk = mpi_runtime().lock();
          if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, comm, &flag, &st) != MPI_SUCCESS || !flag) break;
          if (MPI_Recv(&q, sizeof q, MPI_BYTE, st.MPI_SOURCE, kQueryTag, comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        }
        sent.push_back(Sent{MPI_REQUEST_NULL, answer_for(q)});
        {
          auto lk = mpi_runtime().lock();
          MPI_Isend(&sent.back().answer, sizeof(Answer), MPI_BYTE, st.MPI_SOURCE, q.answer_tag, comm, &sent.back().req);
        }
        dump |= q.dump != 0;
        asker = st.MPI_SOURCE;
      }
      // Notices from ranks whose group broke: that group breaks here too.
      for (;;) {
        int flag = 0;
        MPI_Status st;
        Notice n{};
        {
          auto lk = mpi_runtime().lock();
          if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, comm, &flag, &st) != MPI_SUCCESS || !flag) break;
          if (MPI_Recv(&n, sizeof n, MPI_BYTE, st.MPI_SOURCE, kNoticeTag, comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        }
        try {
          break_group_from_peer(get(n.group), n.from, n.seq, get(n.reason));
        } catch (...) {  // no memory for the reason: the group breaks at its deadline instead
        }
      }
      {
        std::lock_guard notices_lock(notices_mutex);
        while (!notices.empty()) {
          int done = 0;
          auto lk = mpi_runtime().lock();
          if (MPI_Test(&notices.front().req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
          if (!done) break;
          notices.pop_front();
        }
      }
      // Answers delivered (or to a rank that gave up: small, so MPI sends them eagerly) are freed.
      while (!sent.empty()) {
        int done = 0;
        auto lk = mpi_runtime().lock();
        if (sent.front().req != MPI_REQUEST_NULL && MPI_Test(&sent.front().req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
          done = 1;
        if (!done && sent.front().req != MPI_REQUEST_NULL) break;
        sent.pop_front();
      }
      if (dump) flight_dump_on_failure(fmt::format("rank {} timed out and asked for it", asker));
      lock.lock();
    }
    std::lock_guard notices_lock(notices_mutex);
    auto lk = mpi_runtime().lock();
    for (Sent& s : sent)
      if (s.req != MPI_REQUEST_NULL) MPI_Request_free(&s.req);  // the buffer stays (see `sent`)
    for (SentNotice& s : notices)
      if (s.req != MPI_REQUEST_NULL) MPI_Request_free(&s.req);
  }
};

Responder& responder() {
  static Responder* r = new Responder();  // never destroyed: stopped by mpi_finalize
  return *r;
}

// Never throws: an MPI error on a peer's request counts as no answer from it, and every request
// is cancelled or completed before the buffers go (which are kept for good should one not be).
std::vector<PeerAnswer> ask(const PeerQuery& pq) {
  Responder& r = responder();
  const int n = static_cast<int>(pq.world_ranks.size());
  const int tag = kAnswerTagBase + r.round.fetch_add(1) % kRounds;
  struct Buffers {
    std::vector<Query> queries;
    std::vector<Answer> answers;
  };
  auto buffers = std::make_unique<Buffers>();
  buffers->queries.resize(n);
  buffers->answers.resize(n);
  std::vector<MPI_Request> recvs(n, MPI_REQUEST_NULL), sends(n, MPI_REQUEST_NULL);
  std::vector<bool> got(n, false), failed(n, false);
  {
    auto lk = mpi_runtime().lock();
    for (int k = 0; k < n; ++k) {
      if (k == pq.rank) continue;
      Query& q = buffers->queries[k];
      q.seq = static_cast<int64_t>(pq.seq);
      q.answer_tag = tag;
      q.dump = pq.dump ? 1 : 0;
      q.rank_in_group = k;
      q.asker = pq.rank;
      put(q.group, pq.group);
      put(q.backend, pq.backend);
      const int peer = pq.world_ranks[k];
      if (MPI_Irecv(&buffers->answers[k], sizeof(Answer), MPI_BYTE, peer, tag, r.comm, &recvs[k]) != MPI_SUCCESS ||
          MPI_Isend(&q, sizeof(Query), MPI_BYTE, peer, kQueryTag, r.comm, &sends[k]) != MPI_SUCCESS)
        failed[k] = true;
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + pq.wait;
  for (;;) {
    bool all = true;
    {
      auto lk = mpi_runtime().lock();
      for (int k = 0; k < n; ++k) {
        if (k == pq.rank || got[k] || failed[k]) continue;
        int done = 0;
        if (MPI_Test(&recvs[k], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          failed[k] = true;
          continue;
        }
        got[k] = done != 0;
        all &= got[k];
      }
    }
    if (all || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<Answer> answers(n);
  for (int k = 0; k < n; ++k)
    if (got[k]) answers[k] = buffers->answers[k];  // complete: MPI is done writing these
  {
    // A peer that did not answer: its receive is cancelled (and waited for, so no late answer
    // lands in freed memory). A query to it is small and normally sent eagerly; should its send
    // still be pending, its buffer is kept for good rather than freed under MPI.
    auto lk = mpi_runtime().lock();
    bool pending = false;
    for (int k = 0; k < n; ++k) {
      if (recvs[k] != MPI_REQUEST_NULL && !got[k]) {
        MPI_Cancel(&recvs[k]);
        if (MPI_Wait(&recvs[k], MPI_STATUS_IGNORE) != MPI_SUCCESS && recvs[k] != MPI_REQUEST_NULL) {
          MPI_Request_free(&recvs[k]);
          pending = true;
        }
      }
      if (sends[k] != MPI_REQUEST_NULL) {
        int done = 0;
        if (MPI_Test(&sends[k], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 0;
        if (!done) {
          MPI_Request_free(&sends[k]);
          pending = true;
        }
      }
    }
    if (pending) {
      static std::mutex kept_mutex;
      static auto* kept = new std::vector<std::unique_ptr<Buffers>>();
      std::lock_guard keep(kept_mutex);
      kept->push_back(std::move(buffers));
    }
  }
  std::vector<PeerAnswer> out;
  for (int k = 0; k < n; ++k) {
    if (k == pq.rank) continue;
    PeerAnswer a;
    a.rank = k;
    a.answered = got[k];
    if (got[k]) {
      const Answer& x = answers[k];
      a.knows_group = x.knows_group != 0;
      a.last_issued = x.last_issued;
      a.has_at_seq = x.has_at_seq != 0;
      a.at_seq_signature = get(x.at_seq_signature);
      a.at_seq_summary = get(x.at_seq_summary);
      a.at_seq_state = get(x.at_seq_state);
      a.last_summary = get(x.last_summary);
      a.last_state = get(x.last_state);
      a.last_seq = x.last_seq;
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

void start_peer_responder(MPI_Comm comm) {
  Responder& r = responder();
  r.comm = comm;
  r.thread = std::thread([&r] { r.run(); });
  set_peer_prober(ask);
}

void notify_peers_of_break(const std::string& group, const std::vector<int>& world_ranks, int rank, int64_t seq,
                           const std::string& reason) noexcept {
  Responder& r = responder();
  try {
    std::lock_guard lock(r.mutex);  // not while the responder stops
    if (r.stopping || r.comm == MPI_COMM_NULL) return;
    std::lock_guard notices_lock(r.notices_mutex);
    for (int k = 0; k < static_cast<int>(world_ranks.size()); ++k) {
      if (k == rank) continue;
      Responder::SentNotice& s = r.notices.emplace_back();
      s.notice.seq = seq;
      s.notice.from = rank;
      put(s.notice.group, group);
      constexpr size_t kRoom = sizeof(s.notice.reason) - 1;
      put(s.notice.reason, reason.size() <= kRoom ? reason : reason.substr(0, kRoom - 6) + " [...]");
      auto lk = mpi_runtime().lock();
      if (MPI_Isend(&s.notice, sizeof(Notice), MPI_BYTE, world_ranks[k], kNoticeTag, r.comm, &s.req) != MPI_SUCCESS)
        s.req = MPI_REQUEST_NULL;
    }
  } catch (...) {  // no memory: the peers find out at their deadline
  }
}

void stop_peer_responder() noexcept {
  set_peer_prober(nullptr);
  Responder& r = responder();
  {
    std::lock_guard lock(r.mutex);
    r.stopping = true;
  }
  r.cv.notify_all();
  if (r.thread.joinable()) r.thread.join();
}

}  // namespace tandem::dist
