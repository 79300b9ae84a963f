// The trace recorder (core/trace.h): nothing is recorded while off; spans nest per thread, with
// each thread's name; async spans pair across threads; the JSON is Chrome's trace-event format
// and merges across processes.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "core/trace.h"

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
