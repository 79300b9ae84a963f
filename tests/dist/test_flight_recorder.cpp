// The flight recorder on the threads backend: what each operation's entry holds (op, reduce op,
// dtype, elements, caller tag, times, state), the ring's wrap-around, a timeout's failed entry
// with its missing ranks, the JSON dump, and how a timed-out rank describes its peers' answers.
// The mpi side (peers asked over MPI, dumps on timeout and SIGUSR1, flight_report) is
// tests/dist/check_flight.sh's.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "temp_dir.h"
#include "dist/detail/flight_recorder.h"
#include "dist/detail/peer_probe.h"
#include "tandem.h"

using namespace tandem;
using namespace tandem::dist;

namespace {

ThreadsOptions quick(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  ThreadsOptions o;
  o.timeout = timeout;
  return o;
}

FlightRecorder::Snapshot snapshot_of(ProcessGroup& pg) { return dynamic_cast<GroupBase&>(pg).recorder().snapshot(); }

// Sets an environment variable for one test case.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("flight recorder: each operation's entry says what, how big, who asked, when and how it ended",
          "[dist][flight]") {
  std::vector<FlightRecorder::Snapshot> snaps(2);
  run_threads(2, [&](ProcessGroup& pg) {
    Tensor a = ones({3, 4});
    {
      CollectiveTag tag("loss average");
      pg.allreduce(a, ReduceOp::avg)->wait();
      {
        CollectiveTag inner("ddp bucket", 7);  // nested: the innermost names the operation
        pg.broadcast(ones({5}, f64), 1)->wait();
      }
      pg.barrier()->wait();  // the outer tag again
    }
    if (pg.rank() == 0) pg.send(ones({2}), 1, 9)->wait();
    if (pg.rank() == 1) pg.recv(zeros({2}), 0, 9)->wait();
    pg.allreduce_coalesced({ones({2}), ones({3})}, ReduceOp::max)->wait();  // no tag
    CHECK(current_collective_tag().empty());
    snaps[pg.rank()] = snapshot_of(pg);
  }, quick());
  const auto& s = snaps[1];
  CHECK(s.group == "world");
  CHECK(s.backend == "threads");
  CHECK(s.rank == 1);
  CHECK(s.size == 2);
  CHECK(s.recorded == 5);
  REQUIRE(s.entries.size() == 5);
  const FlightEntry& ar = s.entries[0];
  CHECK(ar.seq == 0);
  CHECK(ar.summary() == "allreduce avg f32[12] (loss average)");
  CHECK(ar.state == FlightState::completed);
  CHECK(ar.issued_us > 0);
  CHECK(ar.issued_us <= ar.started_us);
  CHECK(ar.started_us <= ar.ended_us);
  CHECK(s.entries[1].summary() == "broadcast f64[5] root 1 (ddp bucket 7)");
  CHECK(s.entries[2].summary() == "barrier (loss average)");
  CHECK(s.entries[3].summary() == "recv f32[2] from 0 tag 9");
  CHECK(s.entries[3].seq == 0);  // point-to-point operations count apart
  CHECK(s.entries[4].summary() == "allreduce_coalesced max f32[5] in 2 tensors");
  CHECK(s.entries[4].seq == 3);
  CHECK(snaps[0].entries[3].summary() == "send f32[2] to 1 tag 9");
}

TEST_CASE("flight recorder: the ring keeps the last TANDEM_FLIGHT_RECORDER_ENTRIES operations", "[dist][flight]") {
  {
    ScopedEnv entries("TANDEM_FLIGHT_RECORDER_ENTRIES", "4");
    run_threads(2, [](ProcessGroup& pg) {
      for (int k = 0; k < 10; ++k) pg.allreduce(full({1}, k))->wait();
      auto s = snapshot_of(pg);
      CHECK(s.capacity == 4);
      CHECK(s.recorded == 10);
      REQUIRE(s.entries.size() == 4);
      for (int k = 0; k < 4; ++k) CHECK(s.entries[k].seq == static_cast<uint64_t>(6 + k));
      // The position a peer is told: the newest collective, and #seq only while it is in the ring.
      auto& rec = dynamic_cast<GroupBase&>(pg).recorder();
      FlightPosition p = rec.position(8);
      CHECK(p.last_issued == 9);
      CHECK(p.last_ended == 9);
      REQUIRE(p.at_seq);
      CHECK(p.at_seq->seq == 8);
      CHECK(!rec.position(2).at_seq);
    }, quick());
  }
  {
    ScopedEnv off("TANDEM_FLIGHT_RECORDER_ENTRIES", "0");
    run_threads(2, [](ProcessGroup& pg) {
      for (int k = 0; k < 3; ++k) pg.allreduce(full({1}, k))->wait();
      auto s = snapshot_of(pg);
      CHECK(s.entries.empty());
      CHECK(s.recorded == 3);
      FlightPosition p = dynamic_cast<GroupBase&>(pg).recorder().position(2);  // the counters stay
      CHECK(p.last_issued == 2);
      CHECK(p.last_ended == 2);
    }, quick());
  }
  ScopedEnv bad("TANDEM_FLIGHT_RECORDER_ENTRIES", "lots");
  CHECK_THROWS_WITH(run_threads(1, [](ProcessGroup&) {}, quick()),
                    Catch::Contains("[flight_recorder] TANDEM_FLIGHT_RECORDER_ENTRIES must be a whole number") &&
                        Catch::Contains("'lots'"));
}

TEST_CASE("flight recorder: a timeout leaves a failed entry naming the missing ranks, and the dump holds it",
          "[dist][flight]") {
  test_util::TempDir dir("tandem_flight");
  std::vector<std::string> json_text(3);
  run_threads(3, [&](ProcessGroup& pg) {
    pg.allreduce(ones({4}))->wait();
    std::vector<int> all = {0, 1, 2};
    ProcessGroupPtr g = pg.new_group(all);
    g->set_timeout(std::chrono::milliseconds(300));
    if (pg.rank() == 0) {
      CollectiveTag tag("lonely");
      CHECK_THROWS_WITH(g->allreduce(ones({6}))->wait(),
                        Catch::Contains("ranks 1, 2 did not arrive") && Catch::Contains("TANDEM_FLIGHT_RECORDER"));
      auto s = snapshot_of(*g);
      REQUIRE(s.entries.size() == 1);
      const FlightEntry& e = s.entries[0];
      CHECK(e.state == FlightState::failed);
      CHECK(e.summary() == "allreduce sum f32[6] (lonely)");
      CHECK(e.missing == std::vector<int>{1, 2});
      CHECK_THAT(e.error, Catch::Contains("timed out after 300 ms"));
      CHECK_THAT(s.broken, Catch::Contains("timed out"));
      // An operation the broken group refuses consumes no number and leaves no entry.
      CHECK_THROWS_WITH(g->barrier(), Catch::Contains("the group is broken"));
      auto& rec = dynamic_cast<GroupBase&>(*g).recorder();
      CHECK(rec.snapshot().recorded == 1);
      CHECK(rec.position(0).last_issued == 0);
      // The dump: every recorder of the process, this broken group among them.
      const std::string path = dump_flight_recorder("test", dir.file("dump.json"));
      std::ifstream in(path);
      auto doc = nlohmann::json::parse(in);
      CHECK(doc["format"] == "tandem-flight-recorder");
      CHECK(doc["reason"] == "test");
      bool found = false;
      for (const auto& grp : doc["groups"]) {
        if (grp["group"] != g->name() || grp["rank"] != 0 || !grp.contains("broken")) continue;
        const auto& x = grp["entries"][0];
        found = x["op"] == "allreduce" && x["reduce"] == "sum" && x["dtype"] == "f32" && x["numel"] == 6 &&
                x["caller"] == "lonely" && x["state"] == "failed" &&
                x["missing_ranks"] == nlohmann::json::array({1, 2}) && x["signature"] == "allreduce sum f32[6]";
      }
      CHECK(found);
    }
    pg.barrier()->wait();
  }, quick());
  // Without a directory, a dump needs a path.
  CHECK_THROWS_WITH(dump_flight_recorder("test"), Catch::Contains("[flight_recorder] no dump path given"));
  // A path that cannot be written is one error naming it, and leaves no temporary file behind.
  const std::string bad = dir.file("no/such/dir/dump.json");
  CHECK_THROWS_WITH(dump_flight_recorder("test", bad),
                    Catch::Contains("[flight_recorder] cannot write") && Catch::Contains("no/such/dir/dump.json"));
}

TEST_CASE("flight recorder: a timed-out rank describes its peers' answers", "[dist][flight]") {
  auto answer = [](int rank, int64_t last_issued, std::string sig = "", std::string last = "") {
    PeerAnswer a;
    a.rank = rank;
    a.answered = true;
    a.knows_group = true;
    a.last_issued = last_issued;
    a.last_seq = last_issued;
    a.last_summary = last;
    a.last_state = "completed";
    if (!sig.empty()) {
      a.has_at_seq = true;
      a.at_seq_signature = sig;
      a.at_seq_summary = sig + " (ddp bucket 1)";
      a.at_seq_state = "started";
    }
    return a;
  };
  const std::string mine = "allreduce sum f32[8]";
  FlightEntry my_entry;  // what this rank issued as #5: allreduce sum f32[8], tagged "loss average"
  my_entry.kind = OpKind::allreduce;
  my_entry.has_reduce = true;
  my_entry.reduce = ReduceOp::sum;
  my_entry.has_dtype = true;
  my_entry.dtype = f32;
  my_entry.numel = 8;
  my_entry.tensors = 1;
  std::strcpy(my_entry.caller, "loss average");
  REQUIRE(my_entry.signature() == mine);
  const std::optional<FlightEntry> me = my_entry;
  PeerAnswer silent;
  silent.rank = 3;
  std::vector<PeerAnswer> answers = {answer(1, 5, mine), answer(2, 4, "", "broadcast f32[2] root 0 (ddp buffers)"),
                                     silent};
  PeerReport r = describe_peer_answers(answers, 5, me, std::chrono::milliseconds(2000));
  CHECK(r.missing == std::vector<int>{2, 3});
  CHECK(!r.mismatch);
  CHECK(r.text ==
        "rank 2 did not arrive: its last collective on this group is #4, broadcast f32[2] root 0 (ddp buffers), "
        "completed; rank 3 did not arrive: it did not answer within 2000 ms (stopped, hung, or gone); rank 1 issued "
        "it too");
  // A rank that issued something else under this number is named with what it issued.
  // A rank that issued something else under this number is named with what it issued, and this
  // rank's own collective with its caller's tag.
  r = describe_peer_answers({answer(1, 6, "allreduce sum f32[9]")}, 5, me, std::chrono::milliseconds(10));
  CHECK(r.missing.empty());
  CHECK(r.mismatch);
  CHECK(r.text == "rank 1 issued allreduce sum f32[9] (ddp bucket 1) as #5 (started), where this rank issued "
                  "allreduce sum f32[8] (loss average)");
  // Ranks that issued the same other collective are named together.
  r = describe_peer_answers({answer(1, 6, "allreduce sum f32[9]"), answer(2, 6, "allreduce sum f32[9]"), answer(3, 5, mine)},
                            5, me, std::chrono::milliseconds(10));
  CHECK(r.text == "ranks 1, 2 issued allreduce sum f32[9] (ddp bucket 1) as #5 (started), where this rank issued "
                  "allreduce sum f32[8] (loss average); rank 3 issued it too");
  // One of them a Join's announcement: the Join's rule is added.
  PeerAnswer joined = answer(1, 6, "allreduce sum i64[2]");
  joined.at_seq_summary = "allreduce sum i64[2] (join announcement)";
  r = describe_peer_answers({joined}, 5, me, std::chrono::milliseconds(10));
  CHECK_THAT(r.text, Catch::StartsWith("rank 1 issued allreduce sum i64[2] (join announcement) as #5 (started), where "
                                       "this rank issued allreduce sum f32[8] (loss average). Under a dist::Join a "
                                       "rank that has run out of data shadows only the joinables' collectives"));
  r = describe_peer_answers({answer(1, 5, mine)}, 5, me, std::chrono::milliseconds(10));
  CHECK(r.text == "every rank issued it (a rank may be stuck inside it)");
  PeerAnswer fresh = answer(2, -1);
  fresh.last_seq = -1;
  r = describe_peer_answers({fresh}, 0, me, std::chrono::milliseconds(10));
  CHECK(r.text == "rank 2 did not arrive: it has issued no collective on this group");
}

TEST_CASE("flight recorder: tags are cut to fit and restored", "[dist][flight]") {
  CHECK(current_collective_tag().empty());
  {
    CollectiveTag a(std::string(100, 'x'));
    CHECK(current_collective_tag() == std::string(47, 'x'));
    {
      CollectiveTag b("zero parameters of rank", 12);
      CHECK(current_collective_tag() == "zero parameters of rank 12");
    }
    CHECK(current_collective_tag().size() == 47);
  }
  CHECK(current_collective_tag().empty());
}
