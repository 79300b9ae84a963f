// The command-line conventions every tool follows, on top of CLI11: `--help` prints the usage and
// exits 0; a bad flag or value is one line on stderr ("train: --batch: Value abc not in range")
// and exit status 2, the status a run that fails for bad input ends with too.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tools {

constexpr int kBadInput = 2;

// CLI11's PositiveNumber names the whole double range in its message; these say what is wanted.
inline CLI::Validator number_above(double low, bool inclusive, const char* what) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        const bool ok = end != s.c_str() && *end == '\0' && (inclusive ? v >= low : v > low);
        return ok ? std::string() : fmt::format("must be {}, got '{}'", what, s);
      },
      what);
}
inline const CLI::Validator positive = number_above(0, false, "a positive number");
inline const CLI::Validator non_negative = number_above(0, true, "a number >= 0");

// -1 when the tool should go on, else the status main() returns.
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::Success& e) {  // --help (CLI11's CallForHelp and CallForAllHelp derive from it)
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "{}: {} (see --help)\n", app.get_name(), e.what());
    return kBadInput;
  }
}

}  // namespace tools

// In main(): returns from it when the command line says so (help, or a bad flag).
#define TANDEM_TOOL_PARSE(app, argc, argv)                                    \
  do {                                                                         \
    if (const int tool_parse_status = ::tools::parse(app, argc, argv); tool_parse_status >= 0) \
      return tool_parse_status;                                                \
  } while (0)
