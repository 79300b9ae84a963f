// The trace recorder (core/trace.h): nothing is recorded while off; spans nest per thread, with
// each thread's name; async spans pair across threads; the JSON is Chrome's trace-event format
// and merges across processes. And what DDP records: a 2-rank step on the threads backend.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "core/trace.h"
#include "tandem.h"

using namespace tandem;
using nlohmann::json;

namespace {

// Every 'X' event of one thread either contains or follows the one before it: properly nested.
void require_nested_per_thread(const json& events) {
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> spans;
  for (const auto& e : events)
    if (e.at("ph") == "X") spans[e.at("tid").get<int>()].push_back({e.at("ts"), e.at("ts").get<int64_t>() + e.at("dur").get<int64_t>()});
  for (auto& [tid, list] : spans) {
    std::sort(list.begin(), list.end(), [](auto a, auto b) { return a.first < b.first || (a.first == b.first && a.second > b.second); });
    std::vector<int64_t> open;  // ends of the enclosing spans
    for (auto [b, e] : list) {
      while (!open.empty() && open.back() <= b) open.pop_back();
      INFO("thread " << tid << ": span [" << b << ", " << e << "] overlaps an enclosing span partially");
      REQUIRE((open.empty() || e <= open.back()));
      open.push_back(e);
    }
  }
}

}  // namespace

TEST_CASE("trace: spans nest per thread, async spans pair across threads, off records nothing", "[trace]") {
  { TANDEM_TRACE_SCOPE("before start", "test"); }
  trace::start();
  trace::set_thread_name("main");
  {
    TANDEM_TRACE_SCOPE("step", "test");
    { TANDEM_TRACE_SCOPE("forward", "test"); }
    {
      TANDEM_TRACE_SCOPE(std::string("backward"), "test");
      trace::async_begin("bucket 0", "test", 7);
      std::thread comm([] {
        trace::set_thread_name("comm");
        TANDEM_TRACE_SCOPE("allreduce", "test");
        trace::async_end("bucket 0", "test", 7);
      });
      comm.join();
      trace::instant("ready", "test");
    }
  }
  trace::stop();
  { TANDEM_TRACE_SCOPE("after stop", "test"); }

  const json doc = json::parse(trace::to_json(3, "rank 3"));
  const json& events = doc.at("traceEvents");
  std::map<std::string, int> count;
  std::map<int, std::string> thread_names;
  for (const auto& e : events) {
    REQUIRE(e.at("pid") == 3);
    if (e.at("ph") == "M" && e.at("name") == "thread_name") thread_names[e.at("tid")] = e.at("args").at("name");
    if (e.at("ph") != "M") ++count[e.at("name").get<std::string>() + "/" + e.at("ph").get<std::string>()];
  }
  CHECK(count["step/X"] == 1);
  CHECK(count["forward/X"] == 1);
  CHECK(count["backward/X"] == 1);
  CHECK(count["allreduce/X"] == 1);
  CHECK(count["bucket 0/b"] == 1);
  CHECK(count["bucket 0/e"] == 1);
  CHECK(count["ready/i"] == 1);
  CHECK(count.count("before start/X") == 0);
  CHECK(count.count("after stop/X") == 0);
  std::set<std::string> names;
  for (const auto& [tid, n] : thread_names) names.insert(n);
  CHECK(names.count("main") == 1);
  CHECK(names.count("comm") == 1);
  require_nested_per_thread(events);

  // Two processes' objects merge into one, each keeping its pid.
  const json merged = json::parse(trace::merge_json({trace::to_json(0, "rank 0"), trace::to_json(1, "rank 1")}));
  std::set<int> pids;
  for (const auto& e : merged.at("traceEvents")) pids.insert(e.at("pid").get<int>());
  CHECK(pids == std::set<int>{0, 1});
}

namespace {

// The span names per thread name, and the threads' names by tid.
struct Timeline {
  std::map<int, std::string> thread;  // tid -> name
  std::map<std::string, std::map<std::string, int>> spans;  // thread name -> span name -> count
};

Timeline timeline(const json& events) {
  Timeline t;
  for (const auto& e : events)
    if (e.at("ph") == "M" && e.at("name") == "thread_name") t.thread[e.at("tid")] = e.at("args").at("name");
  for (const auto& e : events)
    if (e.at("ph") == "X") ++t.spans[t.thread.at(e.at("tid").get<int>())][e.at("name").get<std::string>()];
  return t;
}

}  // namespace

TEST_CASE("trace: a 2-rank DDP step records forward, backward, each bucket from launch to reduction, the "
          "collectives on the communication threads and the wait, nested per thread",
          "[trace][ddp]") {
  constexpr int kSteps = 3;
  std::vector<size_t> buckets(2);
  auto train = [&](dist::ProcessGroup& g) {
    trace::set_thread_name(fmt::format("rank {} main", g.rank()));
    manual_seed(11);  // the same model on both ranks
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(16, 32));
    model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Linear>(32, 4));
    // A bucket per parameter (4): several reductions to overlap with backward.
    dist::DistributedDataParallel ddp(model, dist::ProcessGroupPtr(std::shared_ptr<void>(), &g), {.bucket_cap_mb = 1e-9});
    optim::SGD opt(model->parameters(), {.lr = 0.01});
    Tensor x = randn({8, 16}), y = randn({8, 4});
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad(true);
      nn::mse_loss(ddp(x), y).backward();
      opt.step();
    }
    buckets[static_cast<size_t>(g.rank())] = ddp.stats().bucket_bytes.size();
  };
  dist::ThreadsOptions options;
  options.timeout = std::chrono::seconds(60);
  trace::start();
  dist::run_threads(2, train, options);
  trace::stop();
  const std::string recorded = trace::to_json(0, "test");
  dist::run_threads(2, train, options);  // off: nothing more
  REQUIRE(trace::to_json(0, "test") == recorded);
  REQUIRE(buckets == std::vector<size_t>{4, 4});

  const json doc = json::parse(recorded);
  const json& events = doc.at("traceEvents");
  require_nested_per_thread(events);
  const Timeline t = timeline(events);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const std::string main = fmt::format("rank {} main", r), comm = fmt::format("rank {} comm world", r);
    REQUIRE(t.spans.count(main) == 1);
    REQUIRE(t.spans.count(comm) == 1);
    const auto& m = t.spans.at(main);
    for (const char* name : {"ddp forward", "backward", "ddp finalize", "ddp wait for buckets"}) {
      INFO(name);
      CHECK(m.count(name) == 1);
      if (m.count(name)) CHECK(m.at(name) == kSteps);
    }
    CHECK(m.count("ddp construction sync") == 1);
    // The buckets' allreduces and more (construction sync, the rebuild's broadcast).
    REQUIRE(t.spans.at(comm).count("allreduce") == 1);
    CHECK(t.spans.at(comm).at("allreduce") >= static_cast<int>(kSteps * buckets[0]));
  }

  // DDP's end-of-backward callback runs inside autograd's backward, its wait inside it.
  auto inside = [&](const std::string& inner, const std::string& outer) {
    for (const auto& e : events) {
      if (e.at("ph") != "X" || e.at("name") != inner) continue;
      const int64_t b = e.at("ts"), end = b + e.at("dur").get<int64_t>();
      bool found = false;
      for (const auto& o : events)
        if (o.at("ph") == "X" && o.at("name") == outer && o.at("tid") == e.at("tid"))
          found = found || (o.at("ts").get<int64_t>() <= b && end <= o.at("ts").get<int64_t>() + o.at("dur").get<int64_t>());
      INFO(inner << " at " << b << " is not inside a " << outer);
      CHECK(found);
    }
  };
  inside("ddp wait for buckets", "ddp finalize");
  inside("ddp finalize", "backward");

  // Every bucket span: one begin on its rank's main thread (at the launch, inside backward), one
  // end at or after it, and its rank's communication thread ran an allreduce in between.
  struct Async {
    int begins = 0, ends = 0;
    int64_t begin_ts = 0, end_ts = 0;
    std::string rank_thread;
  };
  std::map<std::pair<std::string, uint64_t>, Async> spans;
  for (const auto& e : events) {
    const std::string ph = e.at("ph");
    if (ph != "b" && ph != "e") continue;
    CHECK(e.at("cat") == "ddp");
    Async& a = spans[{e.at("name").get<std::string>(), e.at("id").get<uint64_t>()}];
    if (ph == "b") {
      ++a.begins;
      a.begin_ts = e.at("ts");
      a.rank_thread = t.thread.at(e.at("tid").get<int>());
    } else {
      ++a.ends;
      a.end_ts = e.at("ts");
    }
  }
  REQUIRE(spans.size() == 2 * kSteps * buckets[0]);
  std::map<std::string, int> per_rank;
  for (const auto& [key, a] : spans) {
    INFO(key.first << " id " << key.second << " launched on " << a.rank_thread);
    REQUIRE(key.first.starts_with("bucket "));
    REQUIRE(a.begins == 1);
    REQUIRE(a.ends == 1);
    REQUIRE(a.begin_ts <= a.end_ts);
    REQUIRE(a.rank_thread.ends_with(" main"));
    ++per_rank[a.rank_thread];
    const std::string comm = a.rank_thread.substr(0, a.rank_thread.size() - 4) + "comm world";
    bool reduced = false;
    for (const auto& e : events)
      if (e.at("ph") == "X" && e.at("name") == "allreduce" && t.thread.at(e.at("tid").get<int>()) == comm) {
        const int64_t b = e.at("ts");
        // It starts after the launch and before the span's end, which is recorded by the thread
        // that completes the Work: inside the allreduce's turn on the communication thread, or on
        // the launching thread when the reduction was done before it could attach the
        // continuation (a thread preempted between the two).
        reduced = reduced || (b >= a.begin_ts && b <= a.end_ts);
      }
    CHECK(reduced);
  }
  CHECK(per_rank == std::map<std::string, int>{{"rank 0 main", kSteps * 4}, {"rank 1 main", kSteps * 4}});
}
