// Shared by the benchmark programs: timing, medians, RSS, launching workers under mpirun, and the
// row table / --json output (one JSON object per row: name, ours, peer, unit, ratio = ours / peer).
#pragma once

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
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

// As median_seconds for several functions timed in interleaved batches (a, b, c, a, b, c, ...),
// so that a shared machine's drift over the run falls on all alike: the median of each, in order.
// `before_batch` (untimed) runs before each batch, e.g. a barrier that lines ranks up.
inline std::vector<double> median_seconds_interleaved(const std::vector<std::function<void()>>& fns, int iters,
                                                      int runs, int warmup,
                                                      const std::function<void()>& before_batch = {}) {
  for (const auto& fn : fns)
    for (int i = 0; i < warmup; ++i) fn();
  std::vector<std::vector<double>> samples(fns.size());
  for (int r = 0; r < runs; ++r) {
    for (size_t f = 0; f < fns.size(); ++f) {
      if (before_batch) before_batch();
      double t0 = now_s();
      for (int i = 0; i < iters; ++i) fns[f]();
      samples[f].push_back((now_s() - t0) / iters);
    }
  }
  std::vector<double> medians;
  for (auto& s : samples) {
    std::sort(s.begin(), s.end());
    medians.push_back(s[s.size() / 2]);
  }
  return medians;
}

// Samples of one figure, summarised as a row reports it: median, range, count.
struct Samples {
  std::vector<double> values;
  void add(double v) { values.push_back(v); }
  bool empty() const { return values.empty(); }
  double median() const {
    if (values.empty()) return NAN;
    std::vector<double> v = values;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  }
  double min() const { return values.empty() ? NAN : *std::min_element(values.begin(), values.end()); }
  double max() const { return values.empty() ? NAN : *std::max_element(values.begin(), values.end()); }
  // "12.3 [12.1-12.9]" (one value: just it), with `digits` significant digits.
  std::string str(int digits = 4) const {
    if (values.empty()) return "-";
    if (values.size() == 1) return fmt::format("{:.{}g}", values[0], digits);
    return fmt::format("{:.{}g} [{:.{}g}-{:.{}g}]", median(), digits, min(), digits, max(), digits);
  }
};

// This program's path, to launch itself as a worker.
inline std::string self_exe(const char* fallback) {
  std::array<char, 4096> buf{};
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : fallback;
}

// `mpirun -np N` with what this machine needs (root, more ranks than cores) and one intra-op
// thread per rank.
// The Python that runs the PyTorch peer: `flag` (--peer-python PATH) when given, else
// $TANDEM_PEER_PYTHON, else Debian's /usr/bin/python3 (python3-torch 1.13). tools/ci/peer-venv.sh
// makes one with today's PyTorch 2.x.
inline std::string peer_python(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("TANDEM_PEER_PYTHON");
  return env && *env ? env : "/usr/bin/python3";
}

inline std::string mpirun_prefix(int np) {
  std::string flags;
  if (geteuid() == 0) flags += " --allow-run-as-root";
  if (np > static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))) flags += " --oversubscribe";
  return fmt::format("mpirun -np {}{} -x TANDEM_NUM_THREADS=1", np, flags);
}

// Resident set size of this process, in bytes (from /proc/self/statm).
inline double rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  f >> pages_total >> pages_resident;
  return static_cast<double>(pages_resident) * 4096.0;
}

// Runs `cmd` through the shell and returns the last line of its stdout that parses as JSON (MPI
// and Python may print notices before it); nullopt if it cannot start, exits non-zero or prints
// no JSON. With `report_as` (the program's name) a failure is told on stderr with the output;
// without it the failure is silent, for peers whose absence (no PyTorch) is an expected case.
inline std::optional<nlohmann::json> run_json(const std::string& cmd, std::string_view report_as = {}) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  std::array<char, 4096> buf;
  while (size_t k = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), k);
  if (pclose(p) != 0) {
    if (!report_as.empty()) fmt::print(stderr, "{}: '{}' failed:\n{}\n", report_as, cmd, out);
    return std::nullopt;
  }
  size_t end = out.size();
  while (end > 0) {
    size_t start = out.rfind('\n', end - 1);
    start = start == std::string::npos ? 0 : start + 1;
    try {
      return nlohmann::json::parse(out.substr(start, end - start));
    } catch (const std::exception&) {
    }
    if (start == 0) break;
    end = start - 1;
  }
  if (!report_as.empty()) fmt::print(stderr, "{}: no JSON from '{}':\n{}\n", report_as, cmd, out);
  return std::nullopt;
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
  size_t w = 18;  // the name column fits the longest name
  for (const auto& r : rows) w = std::max(w, r.name.size());
  fmt::print("| {:<{}} | {:>10} | {:>10} | {:<8} | {:>7} | {:<12} | {}\n", "row", w, "ours", "peer", "unit", "ratio",
             "goal", "note");
  fmt::print("|{:-<{}}|{:-<12}|{:-<12}|{:-<10}|{:-<9}|{:-<14}|------\n", "", w + 2, "", "", "", "", "");
  for (const auto& r : rows) {
    std::string peer = r.peer ? fmt::format("{:.4g}", *r.peer) : "-";
    std::string ratio = r.peer ? fmt::format("{:.3f}", r.ratio()) : "-";
    fmt::print("| {:<{}} | {:>10.4g} | {:>10} | {:<8} | {:>7} | {:<12} | {}\n", r.name, w, r.ours, peer, r.unit, ratio,
               r.goal, r.note);
  }
}

}  // namespace bench
