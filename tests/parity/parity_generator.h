// What the PyTorch parity tests share: they run a generator script under Debian's PyTorch
// (TANDEM_PARITY_PYTHON, /usr/bin/python3 with python3-torch) into a folder, then read the tensors
// (a safetensors file) and the manifest (JSON) it wrote. test_parity.cpp replays op programs,
// test_module_parity.cpp the nn modules.
#pragma once

#include <catch2/catch.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>

#include "nn/safetensors.h"

namespace parity {

namespace fs = std::filesystem;
using Json = nlohmann::json;

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// Why PyTorch cannot be used here, or nullopt when it can.
inline std::optional<std::string> torch_unavailable() {
  const std::string python = TANDEM_PARITY_PYTHON;
  if (!fs::exists(python)) return python + " does not exist";
  const std::string probe = shell_quote(python) + " -c 'import torch' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) return python + " cannot import torch (Debian: apt-get install python3-torch)";
  return std::nullopt;
}

// A generator's output: in TANDEM_PARITY_DIR when set (kept), else a temporary folder removed
// with it.
struct Generated {
  fs::path dir;
  bool temporary = false;
  tandem::nn::TensorDict tensors;
  Json manifest;
  double seconds = 0;  // the generator's run
  ~Generated() {
    std::error_code ec;
    if (temporary) fs::remove_all(dir, ec);
  }
};

// Runs `script --out DIR --seed SEED <args>` (SEED: TANDEM_PARITY_SEED, else a fixed one), then
// reads DIR/<tensors_file> and DIR/<manifest_file> into `g`.
inline void generate(Generated& g, const std::string& script, const std::string& folder_name, const std::string& args,
                     const std::string& tensors_file, const std::string& manifest_file) {
  const std::string keep = env_or("TANDEM_PARITY_DIR", "");
  if (keep.empty()) {
    g.dir = fs::temp_directory_path() / (folder_name + "-" + std::to_string(::getpid()));
    g.temporary = true;
  } else {
    g.dir = keep;
  }
  fs::create_directories(g.dir);
  const std::string cmd = shell_quote(TANDEM_PARITY_PYTHON) + " " + shell_quote(script) + " --out " +
                          shell_quote(g.dir.string()) + " --seed " +
                          shell_quote(env_or("TANDEM_PARITY_SEED", "20240611")) + args;
  const auto start = std::chrono::steady_clock::now();
  INFO("generator: " << cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  g.tensors = tandem::nn::load_safetensors((g.dir / tensors_file).string());
  std::ifstream in(g.dir / manifest_file);
  REQUIRE(in.good());
  g.manifest = Json::parse(in);
}

}  // namespace parity
