#!/usr/bin/env bash
# Installs the built tree into a scratch prefix and builds a tiny consumer project against it
# with find_package(Tandem), then runs it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
mkdir -p "$scratch/consumer"
cat > "$scratch/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer CXX)
find_package(Tandem REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE Tandem::tandem)
CM
cat > "$scratch/consumer/main.cpp" <<'CPP'
#include <tandem/tandem.h>
#include <iostream>
int main() {
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
  std::cout << "consumer ok: loss " << y.item<double>() << " grad " << w.grad().sum().item<double>() << ", "
            << rows << " rows loaded\n";
  return y.item<double>() == 8.0 && rows == 10 && read_failed ? 0 : 1;
}
CPP
cmake -S "$scratch/consumer" -B "$scratch/consumer/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/consumer/build" >/dev/null
"$scratch/consumer/build/consumer"
