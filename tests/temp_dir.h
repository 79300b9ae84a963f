// A scratch directory for tests that write files (data sets, checkpoints, safetensors).
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

namespace test_util {

// A scratch directory per test case under the system's temp folder, removed with everything in it
// when the test case ends; `tag` names the test program in the folder's name.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "tandem_test") {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           (tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace test_util
