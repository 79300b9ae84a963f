#!/usr/bin/env bash
# The install check: installs the built tree into a scratch prefix, moves the prefix elsewhere (the
# package must be relocatable), and builds outside consumer projects against it with
# find_package(Tandem):
#  - a CPU consumer that links Tandem::tandem only: it runs autograd and the data layer, and must
#    start small (its RSS at the start of main <= 30 MiB) and never map a CUDA library;
#  - where Tandem was built with CUDA, a CUDA consumer that links Tandem::cuda and calls cuda::
#    itself (its GPU work skips, saying so, without a usable device).
# It also refuses absolute paths in the installed targets, compiles every installed header alone,
# and runs the installed flight_report (bin/) on a flight recorder dump the consumer writes.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/staged" >/dev/null
mv "$scratch/staged" "$scratch/prefix"   # relocated: nothing may point at the first prefix
prefix=$scratch/prefix
libdir=$(dirname "$(find "$prefix" -name 'libtandem.so*' -o -name 'libtandem.a' | head -1)")

# The exported targets name their dependencies as imported targets, never as files of the machine
# that built them (search hints in the config files are not paths it depends on).
if grep -nE '/(usr|opt|work|root|home|tmp)/' "$libdir"/cmake/Tandem/TandemTargets*.cmake; then
  echo "check_install: the installed targets name absolute paths (above)" >&2
  exit 1
fi
# Every installed header compiles on its own, with nothing but the installed tree and fmt: the
# public set is closed (no header reaches one that stays in the source tree). CUDA's need the
# toolkit's headers and are compiled by the CUDA consumer below.
(cd "$prefix/include" && find tandem -name '*.h' ! -path 'tandem/cuda/*') |
  xargs -P "$(nproc)" -I{} sh -c 'echo "#include <{}>" | ${CXX:-c++} -std=c++20 -fsyntax-only -x c++ -I"$0/include" -I"$0/include/tandem" - || { echo "check_install: {} does not compile on its own" >&2; exit 255; }' "$prefix"
with_cuda=0
grep -q 'set(TANDEM_WITH_CUDA ON)' "$libdir/cmake/Tandem/TandemConfig.cmake" && with_cuda=1
shared=0
grep -q 'set(TANDEM_SHARED_LIBS ON)' "$libdir/cmake/Tandem/TandemConfig.cmake" && shared=1

mkdir -p "$scratch/consumer"
cat > "$scratch/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer CXX)
find_package(Tandem REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE Tandem::tandem)
if(TARGET Tandem::cuda)
  add_executable(cuda_consumer cuda_main.cpp)
  target_link_libraries(cuda_consumer PRIVATE Tandem::cuda)
endif()
CM
cat > "$scratch/consumer/main.cpp" <<'CPP'
#include <tandem/tandem.h>
#include <tandem/core/backend.h>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
// VmRSS in KiB, and whether a library whose name contains `name` is mapped.
long rss_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(name) != std::string::npos) return true;
  return false;
}
int main(int argc, char** argv) {
  const long start_kib = rss_kib();
  const bool cuda_built = argc > 1 && std::strcmp(argv[1], "cuda") == 0;
  tandem::Tensor w = tandem::ones({2, 2}, tandem::f64);
  w.requires_grad_();
  tandem::Tensor y = tandem::matmul(w, w).sum();
  y.backward();
  // The data layer: its headers are installed, and read_idx pulls zlib into the link.
  tandem::data::DataLoader loader(tandem::data::TensorDataset({tandem::arange(10)}), {.batch_size = 4});
  int64_t rows = 0;
  for (const tandem::TensorList& batch : loader) rows += batch[0].size(0);
  bool read_failed = false;
  try {
    tandem::data::read_idx("/nonexistent.idx.gz", tandem::f32);
  } catch (const tandem::Error&) {
    read_failed = true;
  }
  // A group of one averages a number; its flight recorder is dumped where the script reads it.
  if (argc > 2) {
    tandem::dist::run_threads(1, [](tandem::dist::ProcessGroup& g) {
      tandem::dist::CollectiveTag tag("install check");
      g.allreduce(tandem::ones({1}), tandem::dist::ReduceOp::avg)->wait();
    });
    tandem::dist::dump_flight_recorder("install check", argv[2]);
  }
  const bool cuda_mapped = mapped("libcudart") || mapped("libcublas") || mapped("libtandem_cuda");
  std::cout << "consumer ok: loss " << y.item<double>() << " grad " << w.grad().sum().item<double>() << ", " << rows
            << " rows loaded; RSS at start " << start_kib / 1024.0 << " MiB; CUDA mapped: " << cuda_mapped << "\n";
  // The first CUDA device asked for loads libtandem_cuda from the installed lib folder, which finds
  // the CUDA libraries through its own run path: the backend is there, device or not.
  const bool cuda_loaded = tandem::has_backend(tandem::DeviceType::cuda);
  std::cout << "consumer: CUDA backend " << (cuda_loaded ? "loaded" : "absent: ")
            << tandem::backend_unavailable_reason(tandem::DeviceType::cuda) << "\n";
  return y.item<double>() == 8.0 && rows == 10 && read_failed && !cuda_mapped && start_kib <= 30 * 1024 &&
                 cuda_loaded == cuda_built
             ? 0
             : 1;
}
CPP
cat > "$scratch/consumer/cuda_main.cpp" <<'CPP'
#include <tandem/tandem.h>
#include <tandem/cuda/runtime.h>
#include <iostream>
int main() {
  if (!tandem::cuda::is_available()) {
    std::cout << "cuda consumer ok: SKIP the GPU work (" << tandem::cuda::unavailable_reason() << ")\n";
    return 0;
  }
  tandem::Tensor x = tandem::ones({4, 4}).to(tandem::Device::cuda(0));
  const double s = tandem::matmul(x, x).sum().item<double>();
  std::cout << "cuda consumer ok: " << s << " on " << x.device().str() << "\n";
  return s == 64.0 ? 0 : 1;
}
CPP
cmake -S "$scratch/consumer" -B "$scratch/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$scratch/consumer/build" >/dev/null
# The CPU consumer loads the CUDA backend when asked where there is one to load: a CUDA build of
# shared libraries (a static one has nothing to load; its programs link Tandem::cuda for CUDA).
mkdir "$scratch/dumps"
"$scratch/consumer/build/consumer" "$([ "$with_cuda$shared" = 11 ] && echo cuda || echo cpu)" \
  "$scratch/dumps/tandem_flight_rank0.json"
# The installed flight_report (what the timeout errors tell users to run) reads the dump.
[ -x "$prefix/bin/flight_report" ] || { echo "check_install: no bin/flight_report in the install" >&2; exit 1; }
"$prefix/bin/flight_report" "$scratch/dumps" | tee "$scratch/report.txt"
grep -q "allreduce avg f32\[1\] (install check)" "$scratch/report.txt" ||
  { echo "check_install: the installed flight_report did not read the dump" >&2; exit 1; }
binary_kib=$(( $(stat -c %s "$scratch/consumer/build/consumer") / 1024 ))
lib_kib=$(( $(stat -L -c %s "$libdir/libtandem.so" 2>/dev/null || stat -c %s "$libdir/libtandem.a") / 1024 ))
echo "consumer binary ${binary_kib} KiB, libtandem ${lib_kib} KiB"
if [ "$shared" = 1 ] && [ "$lib_kib" -gt $((16 * 1024)) ]; then
  echo "check_install: libtandem is over 16 MiB" >&2
  exit 1
fi
if [ "$with_cuda" = 1 ]; then
  [ -x "$scratch/consumer/build/cuda_consumer" ] || { echo "check_install: no Tandem::cuda in a CUDA build" >&2; exit 1; }
  "$scratch/consumer/build/cuda_consumer"
fi
