// Shared by the benchmark programs: timing, medians, RSS, and the row table / --json output
// (one JSON object per row: name, ours, peer, unit, ratio = ours / peer).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace bench {

inline double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Median over `runs` samples of the mean time of `iters` calls, after `warmup` calls.
inline double median_seconds(const std::function<void()>& fn, int iters, int runs, int warmup) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> samples;
  for (int r = 0; r < runs; ++r) {
    double t0 = now_s();
    for (int i = 0; i < iters; ++i) fn();
    samples.push_back((now_s() - t0) / iters);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Resident set size of this process, in bytes (from /proc/self/statm).
inline double rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  f >> pages_total >> pages_resident;
  return static_cast<double>(pages_resident) * 4096.0;
}

struct Row {
  std::string name;
  double ours = NAN;
  std::optional<double> peer;
  std::string unit;
  std::string goal;
  std::string note;
  double ratio() const { return peer && *peer != 0 ? ours / *peer : NAN; }
};

inline void print_rows(const std::vector<Row>& rows, bool json) {
  if (json) {
    for (const auto& r : rows) {
      std::string peer = r.peer ? fmt::format("{:.6g}", *r.peer) : "null";
      std::string ratio = r.peer ? fmt::format("{:.4g}", r.ratio()) : "null";
      fmt::print("{{\"name\": \"{}\", \"ours\": {:.6g}, \"peer\": {}, \"unit\": \"{}\", \"ratio\": {}}}\n", r.name,
                 r.ours, peer, r.unit, ratio);
    }
    return;
  }
  fmt::print("| {:<18} | {:>10} | {:>10} | {:<8} | {:>7} | {:<12} | {}\n", "row", "ours", "peer", "unit", "ratio", "goal",
             "note");
  fmt::print("|{:-<20}|{:-<12}|{:-<12}|{:-<10}|{:-<9}|{:-<14}|------\n", "", "", "", "", "", "");
  for (const auto& r : rows) {
    std::string peer = r.peer ? fmt::format("{:.4g}", *r.peer) : "-";
    std::string ratio = r.peer ? fmt::format("{:.3f}", r.ratio()) : "-";
    fmt::print("| {:<18} | {:>10.4g} | {:>10} | {:<8} | {:>7} | {:<12} | {}\n", r.name, r.ours, peer, r.unit, ratio,
               r.goal, r.note);
  }
}

}  // namespace bench
