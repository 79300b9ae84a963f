#!/usr/bin/env bash
# The one command for a GPU machine: builds Tandem for sm_90 (Release) into build-gpu, runs every
# CUDA test, then the rest of the suite, then tools/bench_gpu beside PyTorch-CUDA. Full logs go
# to $OUT (the device tool's folder) or ./gpu-check-logs; ONE short table is printed last.
#
#   tools/gpu-check.sh [all|build|test|bench|deps]  (default all; stages share the build folder,
#                                                  so a short lease can run them in two calls;
#                                                  deps only unpacks the packages below)
# The GPU machine's image has nvcc, CMake, ninja and g++ but most likely not fmt, nlohmann-json,
# Catch2 v2, CLI11, OpenBLAS or Open MPI, and it cannot download them. Two steps:
#   1. here (Debian's mirrors reachable): tools/gpu-deps.sh    -> <repo>/gpu-deps/*.deb (~20 MiB)
#   2. on the device tool: run tools/gpu-check.sh with carry ["gpu-deps"] (in every call); the
#      folder is found by default and unpacked into <build>/deps-root (see "dependencies" below).
# Environment: TANDEM_GPU_BUILD (build folder, default <repo>/build-gpu), JOBS (default 16),
# CUDA_ARCH (default 90), BENCH_RUNS (default 7), TANDEM_DEPS (the folder of .deb files, default
# <repo>/gpu-deps where it has any; empty: use none), TANDEM_DEPS_ALL=1 (unpack even the runtime
# libraries the machine already has). With deps, <build>/deps-env.sh holds the environment for
# a shell there (`. build-gpu/deps-env.sh; mpirun ...`).
#
# Exit status: 0 when everything passed; 1 tests failed; 2 configure or build failed; 3 no usable
# CUDA device (after building: the build is still checked); 4 the benchmark failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TANDEM_GPU_BUILD:-$root/build-gpu}
jobs=${JOBS:-16}
arch=${CUDA_ARCH:-90}
runs=${BENCH_RUNS:-7}
stage=${1:-all}
logs=${OUT:-$root/gpu-check-logs}
mkdir -p "$logs"
case "$stage" in all|build|test|bench|deps) ;; *) echo "usage: $0 [all|build|test|bench|deps]" >&2; exit 2 ;; esac

summary=()   # "check|result" lines for the final table
note() { summary+=("$1|$2"); }
status=0
fail_with() { [ "$status" -eq 0 ] && status=$1; }

print_summary() {
  echo
  echo "== gpu-check ($stage) on $(hostname) — full logs in $logs =="
  printf '| %-14s | %s\n' "check" "result"
  printf '|%s|%s\n' "----------------" "--------------------------------------------------"
  for s in "${summary[@]}"; do printf '| %-14s | %s\n' "${s%%|*}" "${s#*|}"; done
  if [ -s "$logs/bench_table.txt" ]; then
    echo
    cat "$logs/bench_table.txt"
  fi
}
trap print_summary EXIT

# ---------------------------------------------------------------- environment
{
  echo "date: $(date -u +%FT%TZ)"; echo "repo: $root"; uname -a
  command -v nvidia-smi >/dev/null && nvidia-smi -L && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  command -v nvcc >/dev/null && nvcc --version | tail -2
  [ -x /usr/local/cuda/bin/nvcc ] && /usr/local/cuda/bin/nvcc --version | tail -1
  cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1
  git -C "$root" log --oneline -1 2>/dev/null
} > "$logs/env.txt" 2>&1

# ---------------------------------------------------------------- dependencies
# Packages the machine lacks, as .deb files made HERE by tools/gpu-deps.sh (default folder
# <repo>/gpu-deps, when it exists; TANDEM_DEPS= turns it off). Each is unpacked with dpkg -x into
# <build>/deps-root (nothing goes into /), then what the packages' postinst scripts would have
# done is redone there, relocated: alternatives symlinks (libblas/libopenblas/cblas.h, mpicxx,
# mpirun, libmpi.so), Open MPI's prefix (OPAL_PREFIX, so mpirun/mpicxx find their wrapper data,
# help files and components) and its Debian MCA defaults, .pc prefixes; then the tree goes on
# CMake's, the compiler's, the linker's, the loader's and the shell's paths. A "runtime" package
# of gpu-deps/MANIFEST (a library Open MPI links) is skipped when the loader already has all its
# sonames, so an older copy never shadows the system's; TANDEM_DEPS_ALL=1 unpacks them anyway.
deps_dir=${TANDEM_DEPS-$root/gpu-deps}
if [ -n "$deps_dir" ] && compgen -G "$deps_dir/*.deb" >/dev/null; then
  deps_root="$build/deps-root"
  multiarch=$(gcc -print-multiarch 2>/dev/null); multiarch=${multiarch:-x86_64-linux-gnu}
  usr="$deps_root/usr"; lib="$usr/lib/$multiarch"
  # Unpack afresh when the set of .debs (or the skip choice) changed since the last unpack.
  stamp="$( (cd "$deps_dir" && ls -l --time-style=+%s -- *.deb) | awk '{print $5, $6, $7}'; echo "all=${TANDEM_DEPS_ALL:-0}"; cat "$deps_dir/MANIFEST" 2>/dev/null; cksum < "$0")"
  if [ ! -f "$deps_root/.unpacked" ] || [ "$(cat "$deps_root/.unpacked")" != "$stamp" ]; then
    rm -rf "$deps_root"; mkdir -p "$deps_root"
    have_sonames=$({ command -v ldconfig >/dev/null && ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | awk 'NR > 1 {print $1}' | sort -u)
    # dpkg-deb where there is one; else binutils' ar and tar (Debian 12's data members are xz).
    deb_data() { ar p "$1" "$(ar t "$1" | grep -m1 '^data\.tar')"; }
    deb_list() { if command -v dpkg-deb >/dev/null; then dpkg-deb --fsys-tarfile "$1" | tar -t; else deb_data "$1" | tar -tJ; fi; }
    deb_extract() { if command -v dpkg >/dev/null; then dpkg -x "$1" "$deps_root"; else deb_data "$1" | tar -xJ -C "$deps_root"; fi; }
    unpacked=(); skipped=()
    for f in "$deps_dir"/*.deb; do
      pkg=$(basename "$f"); pkg=${pkg%%_*}
      kind=$(awk -v p="$pkg" '$1 == p {print $2}' "$deps_dir/MANIFEST" 2>/dev/null)
      if [ "$kind" = runtime ] && [ "${TANDEM_DEPS_ALL:-0}" != 1 ] && [ -n "$have_sonames" ]; then
        sonames=$(deb_list "$f" | sed -En 's#^\./(usr/)?lib/[^/]+/(lib[^/]*\.so\.[0-9]+)$#\2#p' | sort -u)
        if [ -n "$sonames" ] && [ -z "$(comm -23 <(echo "$sonames") <(echo "$have_sonames"))" ]; then
          skipped+=("$pkg"); continue
        fi
      fi
      deb_extract "$f" || { echo "gpu-check: could not unpack $f" >&2; exit 2; }
      unpacked+=("$pkg")
    done
    # libopenblas*'s update-alternatives: the pthread flavour as the BLAS/LAPACK and cblas.h.
    for n in libblas.so libblas.so.3 liblapack.so liblapack.so.3 libopenblas.so libopenblas.so.0; do
      [ -e "$lib/openblas-pthread/$n" ] && [ ! -e "$lib/$n" ] && ln -s "openblas-pthread/$n" "$lib/$n"
    done
    inc="$usr/include/$multiarch"
    [ -e "$inc/openblas-pthread/cblas.h" ] && [ ! -e "$inc/cblas.h" ] && ln -s openblas-pthread/cblas.h "$inc/cblas.h"
    # Open MPI's update-alternatives (mpi, mpirun): the unsuffixed wrappers and libraries.
    for n in mpicc mpicxx mpic++ mpiCC mpirun mpiexec; do
      [ -e "$usr/bin/$n.openmpi" ] && [ ! -e "$usr/bin/$n" ] && ln -s "$n.openmpi" "$usr/bin/$n"
    done
    [ -e "$lib/openmpi/lib/libmpi.so" ] && [ ! -e "$lib/libmpi.so" ] && ln -s openmpi/lib/libmpi.so "$lib/libmpi.so"
    [ -e "$lib/openmpi/lib/libmpi_cxx.so" ] && [ ! -e "$lib/libmpi++.so" ] && ln -s openmpi/lib/libmpi_cxx.so "$lib/libmpi++.so"
    [ -d "$lib/openmpi/include" ] && [ ! -e "$inc/mpi" ] && ln -s ../../lib/$multiarch/openmpi/include "$inc/mpi"
    # pkg-config files say prefix=/usr, PMIx's defaults file names its plugins' folder: point
    # them at the unpacked tree.
    find "$deps_root" -name '*.pc' -type f -exec sed -i "s|^prefix=/usr\$|prefix=$usr|" {} +
    [ -f "$lib/pmix2/share/pmix-mca-params.conf" ] && sed -i "s|= */usr/|= $usr/|" "$lib/pmix2/share/pmix-mca-params.conf"
    echo "$stamp" > "$deps_root/.unpacked"
    deps_note="unpacked ${#unpacked[@]} packages${skipped:+, skipped ${#skipped[@]} the machine has}"
    echo "deps: unpacked ${#unpacked[@]} packages from $deps_dir into $deps_root: ${unpacked[*]}" >> "$logs/env.txt"
    [ ${#skipped[@]} -gt 0 ] && echo "deps: skipped (the loader already has their libraries): ${skipped[*]}" >> "$logs/env.txt"
  else
    deps_note="already unpacked"
    echo "deps: $deps_root already unpacked from $deps_dir" >> "$logs/env.txt"
  fi
  export CMAKE_PREFIX_PATH="$usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"   # fmt, nlohmann_json, Catch2, BLAS, cblas.h
  export CPATH="$usr/include:$usr/include/$multiarch/openblas-pthread${CPATH:+:$CPATH}"  # CLI11, cblas.h
  export LIBRARY_PATH="$lib:$lib/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}"
  # Loader at test time: libfmt/libmpi/libopenblas and what they link (libgfortran5, hwloc, ...).
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread:$lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$lib/pkgconfig:$usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export PATH="$usr/bin:$PATH"                        # mpicxx for FindMPI, mpirun for ctest
  if [ -x "$usr/bin/opal_wrapper" ]; then
    export OPAL_PREFIX="$usr"                         # relocates Open MPI: wrapper data, help, components
    # Debian's /etc/openmpi/openmpi-mca-params.conf (btl/pml/mtl/osc choices), which a relocated
    # Open MPI would not read, and no noise from plugins whose libraries were left out.
    [ -f "$deps_root/etc/openmpi/openmpi-mca-params.conf" ] &&
      export OMPI_MCA_mca_base_param_files="$deps_root/etc/openmpi/openmpi-mca-params.conf"
    export OMPI_MCA_mca_base_component_show_load_errors=${OMPI_MCA_mca_base_component_show_load_errors:-0}
    # Open MPI's and PMIx's sysconfdirs stay absolute (/etc/openmpi, /usr/lib/.../pmix2) under
    # OPAL_PREFIX: name the unpacked default hostfile, PMIx's defaults and its plugins.
    [ -f "$deps_root/etc/openmpi/openmpi-default-hostfile" ] &&
      export OMPI_MCA_orte_default_hostfile="$deps_root/etc/openmpi/openmpi-default-hostfile"
    if [ -d "$lib/pmix2/lib/pmix" ]; then
      export PMIX_MCA_mca_base_component_path="$lib/pmix2/lib/pmix"
      [ -f "$lib/pmix2/share/pmix-mca-params.conf" ] &&
        export PMIX_MCA_mca_base_param_files="$lib/pmix2/share/pmix-mca-params.conf"
    fi
    # One node: ranks start by fork, but mpirun insists on finding an ssh/rsh agent to select.
    command -v ssh >/dev/null || command -v rsh >/dev/null || export OMPI_MCA_plm_rsh_agent=${OMPI_MCA_plm_rsh_agent:-false}
  fi
  # The same environment for a shell on the machine: `. <build>/deps-env.sh`.
  for v in CMAKE_PREFIX_PATH CPATH LIBRARY_PATH LD_LIBRARY_PATH PKG_CONFIG_PATH PATH OPAL_PREFIX \
           OMPI_MCA_mca_base_param_files OMPI_MCA_mca_base_component_show_load_errors OMPI_MCA_plm_rsh_agent \
           OMPI_MCA_orte_default_hostfile PMIX_MCA_mca_base_component_path PMIX_MCA_mca_base_param_files; do
    [ -n "${!v:-}" ] && printf 'export %s=%q\n' "$v" "${!v}"
  done > "$build/deps-env.sh"
  mpi_line=$(mpirun --version 2>&1 | head -1)
  echo "deps: mpirun is $(command -v mpirun) ($mpi_line); environment in $build/deps-env.sh" >> "$logs/env.txt"
  note deps "$deps_note from $deps_dir; $(command -v mpirun): ${mpi_line:-none}"
elif [ "$stage" = deps ]; then
  note deps "no .deb files in '${deps_dir:-<TANDEM_DEPS empty>}' (run tools/gpu-deps.sh here first)"
  exit 2
fi
[ "$stage" = deps ] && exit 0

# ---------------------------------------------------------------- build
if [ "$stage" = all ] || [ "$stage" = build ]; then
  nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  t0=$SECONDS
  if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="$nvcc_path" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
      "${launcher[@]}" > "$logs/configure.log" 2>&1; then
    note configure "ok ($((SECONDS - t0)) s, sm_$arch)"
  else
    note configure "FAILED: $(grep -m1 -E 'Could NOT find|Error|error' "$logs/configure.log" | cut -c1-110) (configure.log)"
    exit 2
  fi
  t0=$SECONDS
  if cmake --build "$build" -j "$jobs" > "$logs/build.log" 2>&1; then
    note build "ok ($((SECONDS - t0)) s, -j$jobs)"
  else
    note build "FAILED after $((SECONDS - t0)) s: $(grep -m1 -E 'error' "$logs/build.log" | cut -c1-110) (build.log)"
    exit 2
  fi
fi

# ---------------------------------------------------------------- device
if [ ! -x "$build/tools/bench_gpu" ]; then
  note device "not checked: $build/tools/bench_gpu is not built (run the build stage)"
  exit 2
fi
if "$build/tools/bench_gpu" --check > "$logs/device.txt" 2>&1; then
  note device "$(head -1 "$logs/device.txt" | cut -c1-110)"
else
  note device "no usable CUDA device: $(sed 's/^bench_gpu: no usable CUDA device //' "$logs/device.txt" | head -1 | cut -c1-100)"
  echo "gpu-check: no usable CUDA device here; built only, nothing run (see $logs/device.txt)" >&2
  exit 3
fi
[ "$stage" = build ] && exit 0

# ---------------------------------------------------------------- tests
# "N% tests passed, F tests failed out of T" -> "P passed, F failed (of T)" plus the failed names.
ctest_result() {
  local log=$1 line total failed
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$log" | tail -1)
  if [ -z "$line" ]; then
    grep -q 'No tests were found' "$log" && { echo "no tests found"; return; }
    echo "did not finish (see $(basename "$log"))"; return
  fi
  total=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")
  failed=$(sed -E 's/.* ([0-9]+) tests? failed.*/\1/' <<<"$line")
  local names
  names=$(sed -n '/The following tests FAILED/,$p' "$log" | grep -E '^\s+[0-9]+ - ' | sed -E 's/^\s+[0-9]+ - //; s/ \(.*//' | head -5 | paste -sd, -)
  echo "$((total - failed)) passed, $failed failed (of $total)${names:+: $names}"
}

if [ "$stage" = all ] || [ "$stage" = test ]; then
  t0=$SECONDS
  # -V keeps every test's output, so a CUDA test that skipped instead of running shows up.
  ctest --test-dir "$build" -R '^test_cuda' -j 8 --timeout 300 -V > "$logs/ctest_cuda.log" 2>&1
  cuda_rc=$?
  note cuda-tests "$(ctest_result "$logs/ctest_cuda.log") in $((SECONDS - t0)) s"
  skipped=$(grep -c 'SKIP: no usable CUDA device' "$logs/ctest_cuda.log")
  [ "$skipped" -gt 0 ] && { note cuda-skips "$skipped CUDA tests skipped for want of a device"; fail_with 1; }
  [ $cuda_rc -ne 0 ] && fail_with 1
  t0=$SECONDS
  ctest --test-dir "$build" -E '^test_cuda' -j "$jobs" --timeout 300 --output-on-failure > "$logs/ctest_rest.log" 2>&1
  rest_rc=$?
  note other-tests "$(ctest_result "$logs/ctest_rest.log") in $((SECONDS - t0)) s"
  [ $rest_rc -ne 0 ] && fail_with 1
fi

# ---------------------------------------------------------------- bench
if [ "$stage" = all ] || [ "$stage" = bench ]; then
  t0=$SECONDS
  "$build/tools/bench_gpu" --runs "$runs" --json-out "$logs/bench.json" \
      --peer-script "$root/tools/bench_gpu_peer.py" > "$logs/bench_table.txt" 2> "$logs/bench_stderr.log"
  bench_rc=$?
  if [ $bench_rc -eq 0 ]; then
    note bench "ok ($((SECONDS - t0)) s; rows below, JSON in bench.json)"
  else
    note bench "exit $bench_rc after $((SECONDS - t0)) s: $(head -1 "$logs/bench_stderr.log" | cut -c1-100) (bench_stderr.log)"
    fail_with 4
  fi
  grep -q 'peer not available' "$logs/bench_stderr.log" && note bench-peer "PyTorch peer did not run (bench_stderr.log)"
fi
exit $status
