#!/usr/bin/env bash
# shellcheck disable=SC2317  # print_summary and the row helpers run from traps and run_row
# The one command for a GPU machine (the device tool's H100/H200, sm_90, 16 cores): checks in
# seconds that it can build at all, builds for sm_90 (Release, Ninja) into build-gpu only what the
# GPU run needs, runs every CUDA test, the DDP delayed-allreduce case under
# CUDA_DEVICE_MAX_CONNECTIONS=1, NCCL through bench_allreduce and train, then bench_gpu beside
# PyTorch-CUDA. Logs go to $OUT (the device tool's folder, which returns at most 8 files) or
# ./gpu-check-logs; ONE short table is printed last, whatever stopped the run.
#
#   tools/ci/gpu-check.sh [--dry-run] [--build DIR] [all|preflight|build|test|bench|deps]
#     all (default) = preflight + build + test + bench. Stages share the build folder, so a short
#     lease can run them in two calls (build, then test and bench) while the machine stays warm.
#     preflight: the seconds-long checks only; deps: only unpack the packages below.
#   --dry-run: the rehearsal for a machine without a GPU (CI's .ci/run, against tools/test.sh's
#     build/): every stage runs against an existing CUDA build without reconfiguring it or building
#     what is already there, the CUDA tests skip, the GPU rows say "not run" (never "passed") and
#     the table and the 8-file limit are checked all the same.
#
# The device image has nvcc, CMake and ninja (from pip), g++, and NCCL only as the pip wheel
# nvidia-nccl-cu13 (libnccl.so.2, no libnccl.so for find_library to find: the preflight finds it
# through python3 and passes it to CMake as TANDEM_NCCL_LIBRARY / TANDEM_NCCL_INCLUDE_DIR). It
# most likely lacks zlib's headers, fmt, nlohmann-json, Catch2 v2, CLI11, OpenBLAS and Open MPI,
# and it cannot download them. Two steps:
#   1. here (Debian's mirrors reachable): tools/ci/gpu-deps.sh    -> <repo>/gpu-deps/*.deb (~20 MiB)
#   2. on the device tool: run tools/ci/gpu-check.sh with carry ["gpu-deps"] (in every call); the
#      folder is found by default and unpacked into <build>/deps-root (see "dependencies" below).
# Environment: TANDEM_GPU_BUILD (build folder, default <repo>/build-gpu; with --dry-run
# TANDEM_BUILD_DIR or <repo>/build, as tools/test.sh), JOBS (default: the cores), CUDA_ARCH (default
# 90), BENCH_RUNS (default 7), TANDEM_GPU_BUDGET (seconds the whole run may take, default 560: under
# the device tool's 600-second command limit, so the table still prints), TANDEM_DEPS (the folder
# of .deb files, default <repo>/gpu-deps where it has any; empty: use none), TANDEM_DEPS_ALL=1
# (unpack even the runtime libraries the machine already has). With deps, <build>/deps-env.sh
# holds the environment for a shell there (`. build-gpu/deps-env.sh; mpirun ...`).
#
# Exit status: 0 when everything passed (a dry run: when every stage ran and only the device was
# missing); 1 a check failed (tests, an NCCL row, a run out of time, more than 8 log files); 2
# preflight, configure or build failed; 3 no usable CUDA device (not with --dry-run); 4 the
# benchmark failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dry=0
stage=all
build_arg=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --build) build_arg=${2:-}; shift ;;
    --build=*) build_arg=${1#--build=} ;;
    all|preflight|build|test|bench|deps) stage=$1 ;;
    *) echo "usage: $0 [--dry-run] [--build DIR] [all|preflight|build|test|bench|deps]" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$build_arg" ]; then
  build=$build_arg
elif [ $dry -eq 1 ]; then
  build=${TANDEM_GPU_BUILD:-${TANDEM_BUILD_DIR:-$root/build}}
else
  build=${TANDEM_GPU_BUILD:-$root/build-gpu}
fi
case "$build" in /*) ;; *) build=$PWD/$build ;; esac
jobs=${JOBS:-$(nproc)}
arch=${CUDA_ARCH:-90}
runs=${BENCH_RUNS:-7}
budget=${TANDEM_GPU_BUDGET:-560}
# The device tool empties $OUT before each command; our own default folder is emptied here, so that
# the file count below is this run's.
if [ -n "${OUT:-}" ]; then
  logs=$OUT
else
  logs=$root/gpu-check-logs
  rm -rf "$logs"
fi
mkdir -p "$logs"
tmp=$(mktemp -d)   # one program's output at a time, before it is merged into runs.log
# At most 8 files come back from the device: these 7, small logs merged. env.txt: environment,
# dependencies, preflight; build.log: configure and build; ctest_cuda.log: every CUDA test, verbose
# (skips show); runs.log: the device check, the mpirun and NCCL runs, bench_gpu's stderr;
# bench_table.txt and bench.json: the benchmark; summary.txt: the table printed last.
env_log=$logs/env.txt
runs_log=$logs/runs.log
mode=$stage
[ $dry -eq 1 ] && mode="$stage, dry run"
dry_note="not run (dry run: no device)"

summary=()   # "check|result" lines for the final table
note() { summary+=("$1|$2"); }
status=0
fail_with() { [ "$status" -eq 0 ] && status=$1; }
fail() { note "$1" "$2"; fail_with "${3:-1}"; }   # fail ROW TEXT [STATUS]

print_summary() {
  local rc=$? n   # the status the script is exiting with
  trap - EXIT INT TERM HUP
  rm -rf "$tmp"
  # The device returns at most 8 files from $OUT: count them as the device tool will.
  n=$(find "$logs" -type f ! -name summary.txt | wc -l)
  n=$((n + 1))
  if [ "$n" -le 8 ]; then note out-files "$n files in $logs (the device returns at most 8)"
  else
    note out-files "FAILED: $n files in $logs, the device returns only 8: $(cd "$logs" && find . -type f | sed 's|^\./||' | sort | paste -sd' ')"
    [ "$rc" -eq 0 ] && rc=1
  fi
  if [ -s "$logs/bench_table.txt" ]; then
    echo
    cat "$logs/bench_table.txt"
  fi
  {
    echo
    echo "== gpu-check ($mode) on ${HOSTNAME:-$(uname -n)} in $SECONDS s, exit $rc: full logs in $logs =="
    printf '| %-14s | %s\n' "check" "result"
    printf '|%s|%s\n' "----------------" "--------------------------------------------------"
    for s in "${summary[@]}"; do printf '| %-14s | %s\n' "${s%%|*}" "${s#*|}"; done
  } | tee "$logs/summary.txt"
  exit "$rc"
}
trap print_summary EXIT
# A run stopped from outside still ends with the table (the device tool's limit kills harder).
trap 'fail interrupted "stopped by a signal after $SECONDS s"; exit 1' INT TERM HUP

# stage_time CAP: the seconds a stage may take under `timeout`: CAP, or what is left of the budget
# less 20 s for the rows and the table. Fails when under 10 s are left, so that a slow build or a
# hung test costs the later rows, not the table.
stage_time() {
  local t=$1 left=$((budget - SECONDS - 20))
  [ "$left" -lt "$t" ] && t=$left
  [ "$t" -ge 10 ] || return 1
  echo "$t"
}
out_of_time() { fail "$1" "not run: out of time (TANDEM_GPU_BUDGET=$budget s, $SECONDS s used)" "${2:-1}"; }
# Every tool and test prints one of these when it finds no usable CUDA device.
no_device_re='no usable CUDA device|needs a CUDA device|no CUDA device'
# ... and one of these when the build has no NCCL: on a device that is a failure, not a skip.
no_nccl_re='without NCCL|NCCL not built|nccl: not built|needs a CUDA build (of tandem )?with NCCL'

multiarch=$(gcc -print-multiarch 2>/dev/null); multiarch=${multiarch:-x86_64-linux-gnu}
ldconfig_p() { if command -v ldconfig >/dev/null; then ldconfig -p; else /sbin/ldconfig -p; fi 2>/dev/null; }
nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
# As root (the device machine, CI) Open MPI wants these, as the CTest entries set them.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# ---------------------------------------------------------------- environment
{
  echo "date: $(date -u +%FT%TZ)"; echo "repo: $root"; echo "build: $build"; echo "mode: $mode"; uname -a
  "$nvcc_path" --version 2>/dev/null | tail -2
  timeout 30 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -1
  git -C "$root" log --oneline -1 2>/dev/null
} > "$env_log" 2>&1

# ---------------------------------------------------------------- dependencies
# Packages the machine lacks, as .deb files made HERE by tools/ci/gpu-deps.sh (default folder
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
  usr="$deps_root/usr"; lib="$usr/lib/$multiarch"
  # Unpack afresh when the set of .debs (or the skip choice) changed since the last unpack.
  stamp="$( (cd "$deps_dir" && ls -l --time-style=+%s -- *.deb) | awk '{print $5, $6, $7}'; echo "all=${TANDEM_DEPS_ALL:-0}"; cat "$deps_dir/MANIFEST" 2>/dev/null; cksum < "$0")"
  if [ ! -f "$deps_root/.unpacked" ] || [ "$(cat "$deps_root/.unpacked")" != "$stamp" ]; then
    rm -rf "$deps_root"; mkdir -p "$deps_root"
    have_sonames=$(ldconfig_p | awk 'NR > 1 {print $1}' | sort -u)
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
      deb_extract "$f" || { fail deps "FAILED: could not unpack $f" 2; exit 2; }
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
    [ -d "$lib/openmpi/include" ] && [ ! -e "$inc/mpi" ] && ln -s "../../lib/$multiarch/openmpi/include" "$inc/mpi"
    # pkg-config files say prefix=/usr, PMIx's defaults file names its plugins' folder: point
    # them at the unpacked tree.
    find "$deps_root" -name '*.pc' -type f -exec sed -i "s|^prefix=/usr\$|prefix=$usr|" {} +
    [ -f "$lib/pmix2/share/pmix-mca-params.conf" ] && sed -i "s|= */usr/|= $usr/|" "$lib/pmix2/share/pmix-mca-params.conf"
    # zlib1g-dev's libz.so is an absolute link to /lib/<multiarch>/libz.so.1.2.13, zlib1g's file,
    # which is skipped when the machine has a libz.so.1 (of another version, maybe elsewhere): point
    # it at the unpacked copy, else at the loader's libz.so.1, so that FindZLIB takes the shared
    # library and not zlib1g-dev's libz.a.
    if [ -L "$lib/libz.so" ]; then
      zlink=$(readlink "$lib/libz.so")
      if [ "${zlink#/}" != "$zlink" ] && [ -e "$deps_root$zlink" ]; then
        ln -sfn "$deps_root$zlink" "$lib/libz.so"
      elif [ ! -e "$lib/libz.so" ]; then
        zsys=$(ldconfig_p | awk '$1 == "libz.so.1" && /x86-64/ {print $NF; exit}')
        [ -n "$zsys" ] && ln -sfn "$zsys" "$lib/libz.so"
      fi
    fi
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
  fail deps "no .deb files in '${deps_dir:-<TANDEM_DEPS empty>}' (run tools/ci/gpu-deps.sh here first)" 2
  exit 2
else
  note deps "none (no .deb files in '${deps_dir:-<TANDEM_DEPS empty>}'): the machine's own packages"
fi
[ "$stage" = deps ] && exit 0

# ---------------------------------------------------------------- preflight
# Seconds, each under its own timeout, before minutes of build: what would make the build or the
# run fail anyway stops here with one clear row. With the packages above on the paths already.
{ echo; echo "== preflight"; } >> "$env_log"
# A tool's whole output, then its first line: piped into head, the tool could die of SIGPIPE, which
# pipefail reports as the tool failing.
first_line() {
  local o
  o=$(timeout 20 "$@" 2>>"$env_log") || return 1
  o=${o%%$'\n'*}
  [ -n "$o" ] && echo "$o"
}
if v=$(first_line cmake --version); then
  note cmake "${v#cmake version } ($(command -v cmake))"
else
  fail cmake "MISSING: no working cmake on PATH" 2; exit 2
fi
if v=$(timeout 20 "$nvcc_path" --version 2>>"$env_log") && [[ $v =~ release\ [0-9.]+ ]]; then
  note nvcc "${BASH_REMATCH[0]} ($nvcc_path)"
else
  fail nvcc "MISSING: no nvcc (on PATH or /usr/local/cuda/bin): no CUDA build possible" 2; exit 2
fi
# A build folder keeps the generator it was made with; a new one gets Ninja when there is one.
generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
if [ -z "$generator" ]; then
  if command -v ninja >/dev/null; then generator=Ninja
  elif command -v make >/dev/null; then generator="Unix Makefiles"
  fi
fi
case "$generator" in
  Ninja) gen_tool=ninja ;;
  "Unix Makefiles") gen_tool="make" ;;
  *) gen_tool="" ;;
esac
if [ -n "$gen_tool" ] && v=$(first_line "$gen_tool" --version); then
  note generator "$generator ($gen_tool $v)"
else
  fail generator "MISSING: neither ninja nor make on PATH (generator '${generator:-none}')" 2; exit 2
fi
# The build has needed ZLIB since the data layer (data/idx.cpp); the device image has no zlib.h
# unless gpu-deps (zlib1g-dev) brought it. Asked of the compiler, so CPATH counts as it will.
cxx=${CXX:-$(command -v c++ || command -v g++)}
[ -n "$cxx" ] || { fail c++ "MISSING: no C++ compiler (c++ or g++) on PATH" 2; exit 2; }
zlib_h=$(echo '#include <zlib.h>' | timeout 20 "$cxx" -E -x c++ - 2>>"$env_log" | sed -n 's/^# [0-9]* "\(.*zlib\.h\)".*/\1/p' | head -1)
if [ -n "$zlib_h" ]; then
  note zlib.h "$zlib_h"
else
  fail zlib.h "MISSING: $cxx finds no zlib.h (run tools/ci/gpu-deps.sh here, carry gpu-deps: it has zlib1g-dev)" 2; exit 2
fi
# NCCL: an unversioned libnccl.so where find_library(nccl) looks (the CUDA toolkit, the system),
# else python3's pip wheel nvidia-nccl-cu13, which ships only libnccl.so.2 and nccl.h: its paths go
# to CMake as TANDEM_NCCL_LIBRARY / TANDEM_NCCL_INCLUDE_DIR (cmake/TandemNCCL.cmake's cache
# variables, which find_library/find_path then leave alone) and its folder on the loader's path.
cuda_home=$(dirname "$(dirname "$nvcc_path")")
nccl_lib="" nccl_inc="" nccl_from=""
for d in "$cuda_home/lib" "$cuda_home/lib64" "$cuda_home/targets/x86_64-linux/lib" "/usr/lib/$multiarch" /usr/lib64 /usr/local/lib; do
  [ -e "$d/libnccl.so" ] && { nccl_lib=$d/libnccl.so; break; }
done
for d in "$cuda_home/include" "$cuda_home/targets/x86_64-linux/include" /usr/include /usr/local/include; do
  [ -e "$d/nccl.h" ] && { nccl_inc=$d; break; }
done
nccl_wheel=$(timeout 20 python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
{
  echo "nccl: libnccl.so* known to the loader:"; ldconfig_p | grep -E 'libnccl\.so' || echo "  none"
  echo "nccl: under CUDA ($cuda_home) and the system: lib '${nccl_lib:-none}', include '${nccl_inc:-none}'"
  echo "nccl: python3's nvidia.nccl: ${nccl_wheel:-none}"
  [ -n "$nccl_wheel" ] && find "$nccl_wheel" -maxdepth 3 \( -name 'libnccl.so*' -o -name nccl.h \) | sed 's/^/  /'
} >> "$env_log" 2>&1
if [ -n "$nccl_lib" ] && [ -n "$nccl_inc" ]; then
  nccl_from=system
elif [ -n "$nccl_wheel" ] && [ -d "$nccl_wheel" ]; then
  wl=$(find "$nccl_wheel" -maxdepth 3 -name 'libnccl.so*' \( -type f -o -type l \) | sort | head -1)
  wi=$(find "$nccl_wheel" -maxdepth 3 -name nccl.h | head -1)
  if [ -n "$wl" ] && [ -n "$wi" ]; then
    nccl_lib=$wl; nccl_inc=$(dirname "$wi"); nccl_from="pip wheel nvidia-nccl-cu13"
    LD_LIBRARY_PATH="$(dirname "$wl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; export LD_LIBRARY_PATH
  fi
fi
nccl_args=()
if [ -n "$nccl_from" ]; then
  nccl_args=(-DTANDEM_NCCL_LIBRARY="$nccl_lib" -DTANDEM_NCCL_INCLUDE_DIR="$nccl_inc")
  note nccl "$nccl_lib, $nccl_inc/nccl.h ($nccl_from)"
else
  # Not fatal: the CUDA kernels are still worth the lease; the NCCL rows below will fail.
  fail nccl "NOT FOUND: no libnccl.so under $cuda_home or the system, no python3 nvidia.nccl (the NCCL rows will fail)"
fi
if gpus=$(timeout 20 nvidia-smi -L 2>>"$env_log") && [ -n "$gpus" ]; then
  note nvidia-smi "$(head -1 <<<"$gpus" | cut -c1-100)$([ "$(wc -l <<<"$gpus")" -gt 1 ] && echo " (+$(($(wc -l <<<"$gpus") - 1)) more)")"
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >> "$env_log" 2>&1
elif [ $dry -eq 1 ]; then
  note nvidia-smi "absent or no GPU (dry run: expected)"
else
  fail nvidia-smi "no GPU: nvidia-smi $(command -v nvidia-smi >/dev/null && echo "lists none" || echo "is absent"): nothing to check here" 3
  exit 3
fi
[ "$stage" = preflight ] && exit "$status"

# ---------------------------------------------------------------- build
# Only what the GPU run needs: the CUDA backend, every tests/cuda/test_cuda_*.cpp, bench_gpu,
# bench_allreduce and train. The CPU suite is CI's: rebuilding and rerunning it here would spend
# the lease on what every CI run already checks.
targets=(tandem_cuda bench_gpu bench_allreduce train)
for src in "$root"/tests/cuda/test_cuda_*.cpp; do targets+=("$(basename "$src" .cpp)"); done
artifact() {  # the file target $1 makes
  case "$1" in
    tandem_cuda) compgen -G "$build/libtandem_cuda.*" | head -1 ;;
    test_cuda_*) echo "$build/tests/$1" ;;
    *) echo "$build/tools/$1" ;;
  esac
}
cache_get() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -1; }
if [ "$stage" = all ] || [ "$stage" = build ] || [ $dry -eq 1 ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  configure=(cmake -S "$root" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON
             -DCMAKE_CUDA_COMPILER="$nvcc_path" -DCMAKE_CUDA_ARCHITECTURES="$arch"
             ${nccl_args[@]+"${nccl_args[@]}"} ${launcher[@]+"${launcher[@]}"})
  if [ $dry -eq 1 ] && [ -f "$build/CMakeCache.txt" ]; then
    # The rehearsal keeps the build it was given as it is: reconfiguring tools/test.sh's build/
    # with other options would rebuild it.
    { echo "dry run: configure not rerun on the existing $build; without --dry-run it would run:"; printf ' %q' "${configure[@]}"; echo; } > "$logs/build.log"
    # CMake records the CUDA compiler there once the project enabled CUDA (TANDEM_HAVE_CUDA).
    cuda_compiler=$(sed -n 's/^set(CMAKE_CUDA_COMPILER "\(.*\)")$/\1/p' "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1)
    if [ -z "$cuda_compiler" ]; then
      fail configure "FAILED: $build is not a CUDA build (CMake never enabled CUDA there): nothing to rehearse" 2
      exit 2
    fi
    note configure "not rerun (dry run): $build, $generator, $cuda_compiler, sm_$(v=$(cache_get CMAKE_CUDA_ARCHITECTURES); echo "${v:-90 (default)}"), NCCL '$(cache_get TANDEM_NCCL_LIBRARY)'"
  elif ! t=$(stage_time 180); then
    out_of_time configure 2; exit 2
  else
    t0=$SECONDS
    if timeout -k 10 "$t" "${configure[@]}" > "$logs/build.log" 2>&1; then
      note configure "ok ($((SECONDS - t0)) s, $generator, sm_$arch; $(grep -m1 -o 'Tandem nccl backend: .*' "$logs/build.log" | cut -c1-80))"
    else
      fail configure "FAILED after $((SECONDS - t0)) s: $(grep -m1 -E 'Could NOT find|Error|error' "$logs/build.log" | cut -c1-100) (build.log)" 2
      exit 2
    fi
  fi
  missing=()
  for t in "${targets[@]}"; do
    a=$(artifact "$t"); [ -n "$a" ] && [ -e "$a" ] || missing+=("$t")
  done
  if [ $dry -eq 1 ] && [ ${#missing[@]} -eq 0 ]; then
    note build "not rebuilt (dry run): the ${#targets[@]} targets are in $build"
  elif ! t=$(stage_time 480); then
    out_of_time build 2; exit 2
  else
    # A dry run builds only what is missing; on the device the build is incremental anyway.
    build_targets=("${targets[@]}")
    [ $dry -eq 1 ] && build_targets=("${missing[@]}")
    t0=$SECONDS
    { echo; echo "== cmake --build $build -j $jobs --target ${build_targets[*]}"; } >> "$logs/build.log"
    timeout -k 10 "$t" cmake --build "$build" -j "$jobs" --target "${build_targets[@]}" >> "$logs/build.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      note build "ok ($((SECONDS - t0)) s, -j$jobs, ${#build_targets[@]} targets)"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      fail build "TIMED OUT after $((SECONDS - t0)) s (rerun the build stage: it resumes) (build.log)" 2; exit 2
    else
      fail build "FAILED after $((SECONDS - t0)) s: $(grep -m1 -E 'error' "$logs/build.log" | cut -c1-100) (build.log)" 2; exit 2
    fi
  fi
fi

# ---------------------------------------------------------------- device
if [ ! -x "$build/tools/bench_gpu" ]; then
  fail device "not checked: $build/tools/bench_gpu is not built (run the build stage)" 2
  exit 2
fi
{ echo "==== device: bench_gpu --check"; } >> "$runs_log"
if timeout -k 5 60 "$build/tools/bench_gpu" --check > "$tmp/device.txt" 2>&1; then
  note device "$(head -1 "$tmp/device.txt" | cut -c1-110)"
  have_device=1
else
  have_device=0
  reason=$(sed 's/^bench_gpu: no usable CUDA device //' "$tmp/device.txt" | head -1 | cut -c1-90)
  if [ $dry -eq 1 ]; then
    note device "no usable CUDA device (dry run: expected): $reason"
  else
    fail device "no usable CUDA device: $reason" 3
  fi
fi
cat "$tmp/device.txt" >> "$runs_log"
if [ $have_device -eq 0 ] && [ $dry -eq 0 ]; then
  echo "gpu-check: no usable CUDA device here; built only, nothing run (see runs.log)" >&2
  exit 3
fi
[ "$stage" = build ] && exit "$status"

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

# The NCCL cases among the CTest results (a case name that says nccl: test_cuda_nccl's "nccl: ..."
# and test_cuda_ddp's "... over nccl ..."): "total passed failed skipped", skipped meaning "no
# usable CUDA device" in the case's own output (-V prefixes each line with the test's number).
nccl_counts() {
  awk -v dev="$no_device_re" '
    NR == FNR {
      if ($0 ~ /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: test_cuda_[a-z_]+:/) {
        id = $0; sub(/^ *[0-9]+\/[0-9]+ Test +#/, "", id); sub(/:.*/, "", id)
        rest = $0; sub(/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: test_cuda_[a-z_]+:/, "", rest)
        if (tolower(rest) ~ /nccl/) {
          total++; nccl[id] = 1
          if (rest ~ / Passed +[0-9.]+ sec *$/) passed++
        }
      }
      next
    }
    match($0, /^[0-9]+: /) && $0 ~ dev {
      id = substr($0, 1, RLENGTH - 2)
      if ((id in nccl) && !(id in seen)) { seen[id] = 1; skipped++ }
    }
    END { printf "%d %d %d %d\n", total, passed, total - passed, skipped }
  ' "$1" "$1"
}

# The build has NCCL when CMake found it (cmake/TandemNCCL.cmake) and no test or tool said otherwise.
nccl_in_build() {
  local l; l=$(cache_get TANDEM_NCCL_LIBRARY)
  [ -n "$l" ] && [ "${l%NOTFOUND}" = "$l" ]
}

# run_row ROW NCCL CAP OK_TEXT_FN CMD...: one GPU program as one row, under its own timeout, its
# output appended to runs.log. An NCCL row (NCCL=1) fails when the build or the program says NCCL
# is missing; a program that found no device is "not run" in a dry run and a failure on a device.
run_row() {
  local row=$1 nccl=$2 cap=$3 ok_text=$4 t t0 rc out=$tmp/run.txt
  shift 4
  t=$(stage_time "$cap") || { out_of_time "$row"; return; }
  t0=$SECONDS
  timeout -k 10 "$t" "$@" > "$out" 2>&1
  rc=$?
  sed -i 's/\x1b\[[0-9;]*m//g' "$out"   # Catch2 colours its output on mpirun's pseudo-terminal
  { echo; echo "==== $row: $* (exit $rc after $((SECONDS - t0)) s, limit $t s)"; cat "$out"; } >> "$runs_log"
  local first_err
  first_err=$(grep -m1 -iE 'error|fail|no test cases matched|what\(\)|abort' "$out" | cut -c1-90)
  if [ "$nccl" -eq 1 ] && { ! nccl_in_build || grep -qiE "$no_nccl_re" "$out"; }; then
    if [ $dry -eq 1 ]; then note "$row" "$dry_note; the build has NO NCCL: this row fails on a device"
    else fail "$row" "FAILED: built without NCCL ($(grep -m1 -oiE "$no_nccl_re" "$out" || echo "no TANDEM_NCCL_LIBRARY"))"
    fi
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    fail "$row" "FAILED: timed out after $t s (runs.log)"
  elif grep -q 'No test cases matched' "$out"; then
    fail "$row" "FAILED: $(grep -m1 'No test cases matched' "$out" | cut -c1-100)"
  elif grep -qE "$no_device_re" "$out"; then
    if [ $dry -eq 1 ]; then note "$row" "$dry_note"
    else fail "$row" "FAILED: skipped, no usable CUDA device (runs.log)"
    fi
  elif [ $rc -ne 0 ]; then
    fail "$row" "FAILED (exit $rc, $((SECONDS - t0)) s): ${first_err:-see runs.log}"
  elif [ $dry -eq 1 ]; then
    # A dry run has no device: a GPU row that "passed" there did not test what it says.
    fail "$row" "FAILED: passed without a device, so it ran nothing on one (runs.log)"
  else
    note "$row" "ok ($((SECONDS - t0)) s): $("$ok_text" "$out")"
  fi
}
ok_catch() { grep -m1 -E 'All tests passed|test cases:' "$1" | cut -c1-90; }
ok_allreduce() {  # the largest size's row: ours (issue + wait) against raw ncclAllReduce, and the check
  { awk '$1 ~ /^[0-9]+$/ && $4 == "|" {last = $1 " B: " $5 " us, raw NCCL " $12 " us"} END {print last}' "$1"
    grep -m1 -oE 'all results correct|SOME RESULTS WERE WRONG' "$1"; } | paste -sd';' - | sed 's/;/; /g'
}
ok_train() { grep -m1 '^final:' "$1" | cut -c1-100; }

if [ "$stage" = all ] || [ "$stage" = test ]; then
  if t=$(stage_time 300); then
    t0=$SECONDS
    # -V keeps every test's output, so a CUDA test that skipped instead of running shows up.
    # --timeout 120 per test (the mpirun entries keep their own 240 s) and the whole under its own
    # limit: a hung test costs its row, not the call.
    timeout -k 10 "$t" ctest --test-dir "$build" -R '^test_cuda' -j "$((jobs < 8 ? jobs : 8))" --timeout 120 -V \
      > "$logs/ctest_cuda.log" 2>&1
    cuda_rc=$?
    cuda_row="$(ctest_result "$logs/ctest_cuda.log") in $((SECONDS - t0)) s"
    n_skips=$(grep -cE "^[0-9]+: .*SKIP: ($no_device_re)" "$logs/ctest_cuda.log")
    if [ $cuda_rc -ne 0 ]; then
      fail cuda-tests "$cuda_row$([ $cuda_rc -eq 124 ] && echo ", TIMED OUT after $t s")"
    elif [ $dry -eq 1 ]; then
      note cuda-tests "$cuda_row; $n_skips skips for want of a device (dry run: expected)"
    else
      note cuda-tests "$cuda_row"
      [ "$n_skips" -gt 0 ] && fail cuda-skips "$n_skips CUDA tests skipped for want of a device"
    fi
    # NCCL's own row: a run where NCCL was missing or skipped must not look green.
    read -r n_total n_passed n_failed n_skipped < <(nccl_counts "$logs/ctest_cuda.log")
    if ! nccl_in_build || grep -qiE "$no_nccl_re" "$logs/ctest_cuda.log"; then
      if [ $dry -eq 1 ]; then note nccl-tests "$dry_note; the build has NO NCCL: this row fails on a device"
      else fail nccl-tests "FAILED: built without NCCL ($(grep -m1 -oiE "$no_nccl_re" "$logs/ctest_cuda.log" || echo "no TANDEM_NCCL_LIBRARY"))"
      fi
    elif [ "$n_total" -eq 0 ]; then
      fail nccl-tests "FAILED: no NCCL test case ran (ctest_cuda.log)"
    elif [ "$n_failed" -gt 0 ]; then
      fail nccl-tests "FAILED: $n_failed of $n_total NCCL cases failed (ctest_cuda.log)"
    elif [ $dry -eq 1 ]; then
      note nccl-tests "$dry_note; $n_total NCCL cases listed, $n_skipped skipped"
    elif [ "$n_skipped" -gt 0 ]; then
      fail nccl-tests "FAILED: $n_skipped of $n_total NCCL cases skipped (no usable device)"
    else
      note nccl-tests "$n_passed passed (of $n_total)"
    fi
  else
    out_of_time cuda-tests
  fi

  # The delayed allreduce's case (tests/cuda/test_cuda_ddp.cpp) with one hardware queue per device, where
  # two communicators launched in a different order on two ranks are likeliest to deadlock. By name
  # (Catch2 splits its filter at commas: escaped), -w NoTests so that a missing case fails.
  mpi_env=(env CUDA_DEVICE_MAX_CONNECTIONS=1 TANDEM_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1)
  mpi_x=()
  [[ $(mpirun --version 2>&1) == *"Open MPI"* ]] && mpi_x=(-x CUDA_DEVICE_MAX_CONNECTIONS)  # no grep -q: SIGPIPE
  if command -v mpirun >/dev/null; then
    run_row ddp-delayed 0 150 ok_catch "${mpi_env[@]}" mpirun -np 2 ${mpi_x[@]+"${mpi_x[@]}"} "$build/tests/test_cuda_ddp" \
      -w NoTests 'ddp cuda: delayed allreduce with a sometimes-used embedding\, 50 steps'
    summary[-1]+=" [CUDA_DEVICE_MAX_CONNECTIONS=1, mpirun -np 2]"   # run_row's row, whatever it says
  else
    fail ddp-delayed "FAILED: no mpirun (carry gpu-deps: it has Open MPI)"
  fi
  # NCCL itself, one process on one GPU: bench_allreduce's checked sweep beside raw ncclAllReduce,
  # and train's DDP over nccl on the synthetic set (the device has no Fashion-MNIST); train exits
  # 1 when it misses its accuracy target.
  run_row nccl-bench 1 120 ok_allreduce "$build/tools/bench_allreduce" --backend nccl --max-bytes 64M
  run_row nccl-train 1 180 ok_train "$build/tools/train" --device cuda --backend nccl --data synthetic --progress lines
fi

# ---------------------------------------------------------------- bench
if [ "$stage" = all ] || [ "$stage" = bench ]; then
  if t=$(stage_time 300); then
    t0=$SECONDS
    timeout -k 10 "$t" "$build/tools/bench_gpu" --runs "$runs" --json-out "$logs/bench.json" \
        --peer-script "$root/tools/bench/bench_gpu_peer.py" > "$logs/bench_table.txt" 2> "$tmp/bench_stderr.txt"
    bench_rc=$?
    { echo; echo "==== bench: bench_gpu --runs $runs (exit $bench_rc after $((SECONDS - t0)) s), its stderr:"; cat "$tmp/bench_stderr.txt"; } >> "$runs_log"
    if [ $bench_rc -eq 0 ]; then
      note bench "ok ($((SECONDS - t0)) s; rows above, JSON in bench.json)"
    elif [ $dry -eq 1 ] && grep -qE "$no_device_re" "$tmp/bench_stderr.txt" "$logs/bench_table.txt"; then
      note bench "$dry_note"
    else
      fail bench "exit $bench_rc after $((SECONDS - t0)) s: $(head -1 "$tmp/bench_stderr.txt" | cut -c1-100) (runs.log)" 4
    fi
    grep -q 'peer not available' "$tmp/bench_stderr.txt" && note bench-peer "PyTorch peer did not run (runs.log)"
  else
    out_of_time bench
  fi
fi
exit "$status"
