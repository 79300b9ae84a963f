// Checkpoints survive a kill: a child process saving a ~100 MB model is SIGKILLed at random
// moments, 50 times. The file under the real name is always a complete checkpoint, bit-exact (the
// last one saved in full, or the one being saved if its rename landed), and the temporary files
// the killed writers leave are removed by the next save.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "tandem.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kElements = 25'000'000;  // 100 MB of f32

nn::TensorDict version_tensors(int version) {
  nn::TensorDict d;
  d.insert("weight", full({kElements}, static_cast<double>(version)));
  d.insert("step", from_vector<int64_t>({version}));
  return d;
}

void save_version(const std::string& path, int version) {
  nn::save_safetensors(path, version_tensors(version), {{"version", std::to_string(version)}});
}

// The version the file holds, after checking that every byte agrees with it.
int check_complete(const std::string& path) {
  nn::Metadata meta;
  nn::TensorDict d = nn::load_safetensors(path, &meta);
  const int version = std::stoi(meta.at("version"));
  const Tensor& w = d.at("weight");
  REQUIRE(w.numel() == kElements);
  REQUIRE(min(w).item<double>() == version);
  REQUIRE(max(w).item<double>() == version);
  REQUIRE(d.at("step").item<int64_t>() == version);
  return version;
}

int temporaries_in(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  return n;
}

}  // namespace

TEST_CASE("checkpoint: SIGKILL during a 100 MB save never corrupts the previous checkpoint", "[checkpoint]") {
  const fs::path dir = fs::temp_directory_path() / fmt::format("tandem-kill-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "model.safetensors").string();

  const auto t0 = std::chrono::steady_clock::now();
  save_version(path, 0);
  const double save_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::mt19937 rng(12345);
  // Kill points spread over one save and a bit beyond (the child saves versions back to back).
  std::uniform_real_distribution<double> when(0.0, 1.5 * std::max(save_ms, 20.0));
  int last = 0, landed_new = 0, killed_mid_save = 0;
  for (int round = 1; round <= 50; ++round) {
    const int first_new = last + 1;
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // The child: save new versions until killed (never returns into Catch2).
      try {
        for (int v = first_new;; ++v) save_version(path, v);
      } catch (...) {
        ::_exit(3);
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(when(rng)));
    REQUIRE(::kill(child, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));  // killed, not failed
    INFO("round " << round << ", the previous complete version " << last);
    const int now = check_complete(path);
    // Either the previous checkpoint, or one the child finished (rename landed) before the kill.
    REQUIRE((now == last || now >= first_new));
    if (now != last) ++landed_new;
    if (temporaries_in(dir) > 0) ++killed_mid_save;
    last = now;
  }
  // Both outcomes happened: the test exercised kills mid-write and kills after a rename.
  CHECK(killed_mid_save > 0);
  WARN(killed_mid_save << " of 50 kills left a temporary file; " << landed_new << " rounds saw a newer version land");
  // The next save cleans every stale temporary of the dead writers.
  save_version(path, last + 1);
  CHECK(temporaries_in(dir) == 0);
  CHECK(check_complete(path) == last + 1);
  fs::remove_all(dir);
}
