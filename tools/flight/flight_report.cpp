// flight_report: reads the flight recorder dumps of every rank (dist/flight_recorder.h; one
// tandem_flight_rank<R>.json per rank, written under TANDEM_FLIGHT_RECORDER=<dir>) and says, in a
// few lines per group, where the ranks went apart: the first collective at which they disagree
// (another op, size, dtype or caller), or the collective some ranks entered and others never
// did, with the ranks on each side and what the missing ranks were doing last.
//
//   flight_report DIR            every tandem_flight_rank*.json in DIR
//   flight_report FILE...        the dumps named
//
// Exit status: 0 when every group's ranks agree and nothing failed, 1 when it found a
// disagreement, a hang or a failure, 2 for bad input (no dumps, a file that is not a dump).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Entry {
  int64_t seq = 0;
  std::string signature, caller, state, error;
  std::vector<int> missing;
  int64_t issued_us = 0, ended_us = 0;

  // What the ranks must agree on: the op, reduce op, dtype, size and root. The caller tag is shown,
  // not compared (a program may tag the same collective differently on different ranks).
  const std::string& key() const { return signature; }
  std::string summary() const { return caller.empty() ? signature : fmt::format("{} ({})", signature, caller); }
};

// One rank's view of one group.
struct Timeline {
  int rank = 0, size = 0;
  std::string backend, broken, file, reason;
  int64_t recorded = 0;
  std::map<int64_t, Entry> collectives;  // by sequence number
};

struct Group {
  std::string name, backend;
  int size = 0;
  std::map<int, Timeline> ranks;
};

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

std::string ago(int64_t later_us, int64_t earlier_us) {
  if (later_us == 0 || earlier_us == 0) return "";
  return fmt::format(", {:.2f} s before", static_cast<double>(later_us - earlier_us) / 1e6);
}

// Reads one dump into `groups`. The first group of a name and rank in a file wins: the live
// groups come before the destroyed ones kept for the dump.
void load(const fs::path& path, std::map<std::string, Group>& groups, std::vector<int>& process_ranks) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", path.string()));
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(fmt::format("{} is not JSON: {}", path.string(), e.what()));
  }
  if (!doc.is_object() || doc.value("format", "") != "tandem-flight-recorder")
    throw std::runtime_error(fmt::format("{} is not a Tandem flight recorder dump", path.string()));
  process_ranks.push_back(doc.value("process_rank", -1));
  std::set<std::pair<std::string, int>> seen;
  for (const json& g : doc.at("groups")) {
    const std::string name = g.at("group");
    const std::string backend = g.value("backend", "");
    const int rank = g.at("rank");
    // An nccl group shares its name with its companion mpi group: the backend tells them apart.
    const std::string id = backend + ":" + name;
    if (!seen.insert({id, rank}).second) continue;
    Group& group = groups[id];
    group.name = name;
    group.backend = backend;
    group.size = std::max(group.size, g.at("size").get<int>());
    if (group.ranks.count(rank)) continue;  // threads groups in several files: the first file's
    Timeline& t = group.ranks[rank];
    t.rank = rank;
    t.size = g.at("size");
    t.backend = g.value("backend", "");
    t.broken = g.value("broken", "");
    t.recorded = g.value("recorded", int64_t{0});
    t.file = path.filename().string();
    t.reason = doc.value("reason", "");
    for (const json& e : g.at("entries")) {
      if (e.value("p2p", false)) continue;
      Entry x;
      x.seq = e.at("seq");
      x.signature = e.at("signature");
      x.caller = e.value("caller", "");
      x.state = e.value("state", "");
      x.error = e.value("error", "");
      x.issued_us = e.value("issued_us", int64_t{0});
      x.ended_us = e.value("ended_us", int64_t{0});
      if (e.contains("missing_ranks")) x.missing = e["missing_ranks"].get<std::vector<int>>();
      t.collectives[x.seq] = std::move(x);
    }
  }
}

// Reports one group; true when it found something wrong.
bool report(const Group& g) {
  std::vector<int> present, absent;
  for (int r = 0; r < g.size; ++r) (g.ranks.count(r) ? present : absent).push_back(r);
  fmt::print("group {} ({} ranks, {}):\n", g.name, g.size, g.backend);
  if (!absent.empty())
    fmt::print("  {} left no dump (stopped, killed, or not dumping)\n", rank_list(absent));
  // The window every present rank still holds in its ring.
  int64_t lo = 0, hi = -1;
  for (int r : present) {
    const Timeline& t = g.ranks.at(r);
    if (t.collectives.empty()) continue;
    lo = std::max(lo, t.collectives.begin()->first);
    hi = std::max(hi, t.collectives.rbegin()->first);
  }
  auto last_of = [&](const Timeline& t) -> const Entry* {
    return t.collectives.empty() ? nullptr : &t.collectives.rbegin()->second;
  };
  for (int64_t s = lo; s <= hi; ++s) {
    std::map<std::string, std::vector<int>> by_key;  // what the ranks issued as #s
    std::vector<int> never;                           // present ranks whose last collective is before #s
    for (int r : present) {
      const Timeline& t = g.ranks.at(r);
      auto it = t.collectives.find(s);
      if (it != t.collectives.end()) {
        by_key[it->second.key()].push_back(r);
      } else if (t.collectives.empty() || t.collectives.rbegin()->first < s) {
        never.push_back(r);
      }
    }
    if (by_key.size() > 1) {
      // The largest side first: the odd rank out is named after it.
      std::vector<std::pair<std::string, std::vector<int>>> sides(by_key.begin(), by_key.end());
      std::stable_sort(sides.begin(), sides.end(), [](auto& a, auto& b) { return a.second.size() > b.second.size(); });
      fmt::print("  the ranks disagree at collective #{}:\n", s);
      for (auto& [key, ranks] : sides) {
        const Entry& e = g.ranks.at(ranks.front()).collectives.at(s);
        fmt::print("    {} issued {}, {}\n", rank_list(ranks), e.summary(), e.state);
      }
      // A rank whose #s is the others' #s+1 skipped one.
      const auto& majority = sides.front();
      for (size_t k = 1; k < sides.size(); ++k) {
        const Entry& theirs = g.ranks.at(sides[k].second.front()).collectives.at(s);
        const Timeline& ref = g.ranks.at(majority.second.front());
        auto next = ref.collectives.find(s + 1);
        if (next != ref.collectives.end() && next->second.key() == theirs.key())
          fmt::print("    {} skipped #{} ({}): what {} issued as #{} is the others' #{}\n", rank_list(sides[k].second), s,
                     ref.collectives.at(s).summary(), sides[k].second.size() == 1 ? "it" : "they", s, s + 1);
      }
      return true;
    }
    if (!by_key.empty() && (!never.empty() || !absent.empty())) {
      const std::vector<int>& entered = by_key.begin()->second;
      const Entry& e = g.ranks.at(entered.front()).collectives.at(s);
      std::vector<int> missing = never;
      for (int r : absent) missing.push_back(r);
      std::sort(missing.begin(), missing.end());
      // With every rank dumping, a collective the last ranks still run is no hang unless it failed.
      if (never.empty() && e.state == "completed") continue;
      fmt::print("  collective #{} {} was entered by {} ({}) and never by {}\n", s, e.summary(), rank_list(entered),
                 e.state, rank_list(missing));
      for (int r : never) {
        const Timeline& t = g.ranks.at(r);
        const Entry* last = last_of(t);
        if (last == nullptr && t.recorded > 0) {
          fmt::print("    rank {}'s ring holds no collectives ({} operations recorded; TANDEM_FLIGHT_RECORDER_ENTRIES "
                     "too small there?)\n", r, t.recorded);
        } else if (last == nullptr) {
          fmt::print("    rank {} issued no collective on this group\n", r);
        } else {
          fmt::print("    rank {} last issued #{} {}, {}{}\n", r, last->seq, last->summary(), last->state,
                     ago(e.issued_us, last->issued_us));
        }
      }
      if (!absent.empty() && !e.missing.empty())
        fmt::print("    rank {}'s timeout found {} missing: {}\n", entered.front(), rank_list(e.missing), e.error);
      return true;
    }
  }
  // Every rank issued the same collectives. A timeout that found ranks missing still names them:
  // e.g. a rank stopped (SIGSTOP) whose dump was written after it was let go again.
  for (int64_t s = lo; s <= hi; ++s) {
    std::vector<int> timed_out;
    std::set<int> missing;
    const Entry* first = nullptr;
    for (int r : present) {
      auto it = g.ranks.at(r).collectives.find(s);
      if (it == g.ranks.at(r).collectives.end() || it->second.missing.empty()) continue;
      timed_out.push_back(r);
      missing.insert(it->second.missing.begin(), it->second.missing.end());
      if (first == nullptr) first = &it->second;
    }
    if (first == nullptr) continue;
    fmt::print("  collective #{} {} timed out on {}, which found {} missing\n", s, first->summary(),
               rank_list(timed_out), rank_list(std::vector<int>(missing.begin(), missing.end())));
    fmt::print("    rank {}: {}\n", timed_out.front(), first->error);
    return true;
  }
  // Everything agrees: what failed or is still running, if anything.
  bool wrong = false;
  for (int r : present) {
    const Timeline& t = g.ranks.at(r);
    for (const auto& [seq, e] : t.collectives) {
      if (e.state == "failed") {
        fmt::print("  rank {}: #{} {} failed: {}\n", r, seq, e.summary(), e.error);
        wrong = true;
        break;
      }
    }
  }
  if (!wrong) {
    const Entry* last = last_of(g.ranks.begin()->second);
    if (last == nullptr) {
      fmt::print("  no collectives recorded\n");
    } else {
      std::set<std::string> states;
      for (int r : present)
        if (const Entry* l = last_of(g.ranks.at(r))) states.insert(l->state);
      fmt::print("  the ranks agree on collectives #{} to #{}; the last, {}, is {} ({})\n", lo, hi, last->summary(),
                 fmt::join(states, "/"), rank_list(present));
      wrong = !absent.empty();
    }
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flight_report: where the ranks of a Tandem job went apart, from their flight recorder dumps"};
  app.name("flight_report");
  std::vector<std::string> inputs;
  app.add_option("dumps", inputs, "a directory of tandem_flight_rank*.json files, or the files")->required();
  TANDEM_TOOL_PARSE(app, argc, argv);
  std::vector<fs::path> files;
  for (const std::string& in : inputs) {
    if (fs::is_directory(in)) {
      for (const auto& e : fs::directory_iterator(in)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("tandem_flight_rank", 0) == 0 && e.path().extension() == ".json") files.push_back(e.path());
      }
    } else {
      files.emplace_back(in);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    fmt::print(stderr, "flight_report: no tandem_flight_rank*.json dumps in {}\n", fmt::join(inputs, ", "));
    return tools::kBadInput;
  }
  std::map<std::string, Group> groups;
  std::vector<int> process_ranks;
  try {
    for (const fs::path& f : files) load(f, groups, process_ranks);
  } catch (const std::exception& e) {
    fmt::print(stderr, "flight_report: {}\n", e.what());
    return tools::kBadInput;
  }
  std::sort(process_ranks.begin(), process_ranks.end());
  fmt::print("flight_report: {} dump{} (process {}), {} group{}\n", files.size(), files.size() == 1 ? "" : "s",
             rank_list(process_ranks), groups.size(), groups.size() == 1 ? "" : "s");
  bool wrong = false;
  for (const auto& [name, g] : groups)
    if (!g.ranks.empty()) wrong |= report(g);
  return wrong ? 1 : 0;
}
