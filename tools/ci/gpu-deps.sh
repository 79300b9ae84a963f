#!/usr/bin/env bash
# Fetches, HERE (where Debian's mirrors answer), the .deb files that tools/ci/gpu-check.sh needs to
# build and test Tandem on a machine that has only a C/C++ toolchain, CMake and CUDA and can
# download nothing (the lent GPU machine). Output: <repo>/gpu-deps/ (ignored by git), plus
# gpu-deps/MANIFEST ("<package> core|runtime" per line) that gpu-check.sh reads. Idempotent: a
# .deb already there at the candidate version is kept, stale ones are removed.
#
#   tools/ci/gpu-deps.sh          then, on the device tool: carry ["gpu-deps"], run tools/ci/gpu-check.sh
#
# The list is explicit (the closure of `apt-cache depends --recurse --no-recommends` over the
# core packages below, for Debian 12 "bookworm", amd64), minus:
#   - what a Debian 12 + build-essential image already has: libc6, libgcc-s1, libstdc++6,
#     libatomic1 and libquadmath0 (gcc's runtime, via libgcc-12-dev), libudev1 and libuuid1
#     (apt / util-linux need them), perl, tar, debconf, adduser, passwd ...;
#   - the alternatives that the recursion drags in but the build does not need: gfortran-12 and
#     the flang/LLVM toolchains (libopenmpi-dev "Depends: gfortran-12 | gfortran-mod-15": only
#     for the Fortran wrappers), the other openblas flavours (openmp, serial), openssh-client
#     (mpirun starts local ranks by fork; gpu-check.sh sets plm_rsh_agent when ssh is absent);
#   - the -dev packages of Open MPI's own dependencies (libhwloc-dev, libevent-dev, libpmix-dev,
#     libibverbs-dev, libnuma-dev, libnl-*-dev, libltdl-dev) and libjs-jquery*: mpicxx links only
#     -lmpi_cxx -lmpi, and mpi.h includes none of their headers;
#   - plugin packages that cannot work unpacked off their compiled-in paths anyway:
#     libhwloc-plugins (+ libxnvctrl0, libx11 ...) and ibverbs-providers.
# zlib1g-dev is Tandem's own: the build has required ZLIB (zlib.h, libz.so) since the data layer
# (data/idx.cpp), and the device image may have the library without the headers. Its libz.so
# links to zlib1g's file, which gpu-check.sh relinks to the machine's libz.so.1 when it skips
# zlib1g.
# "runtime" packages are only libraries that openblas (libgfortran5), Open MPI's core or its
# plugins (UCX, OFI, PSM, verbs, netlink) or zlib1g-dev (zlib1g) link; gpu-check.sh skips one
# when the machine's loader already has all its sonames, so that an older copy never shadows the
# system's.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${TANDEM_DEPS_OUT:-$root/gpu-deps}

core=(
  libfmt-dev libfmt9                       # fmt 9 (CMake config in usr/lib/x86_64-linux-gnu/cmake/fmt)
  nlohmann-json3-dev                       # header-only (CMake config in usr/share/cmake)
  catch2                                   # Catch2 v2 (CMake config in usr/lib/cmake/Catch2)
  libcli11-dev                             # header-only (CLI/CLI.hpp)
  libopenblas-dev libopenblas-pthread-dev  # cblas.h, libopenblas.so / libblas.so (pthread flavour)
  libopenblas0 libopenblas0-pthread        # libopenblas.so.0
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common  # mpi.h, mpicxx, libmpi, mpirun, help files
  zlib1g-dev                               # zlib.h, libz.so: data/idx.cpp's gzipped IDX files
)
runtime=(
  libgfortran5                                                                 # libopenblas0-pthread's Fortran runtime
  libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libmunge2   # libmpi / orted / PMIx
  libnl-3-200 libnl-route-3-200 libibverbs1 librdmacm1 libnuma1                # verbs, netlink, numa
  libucx0 libfabric1 libpsm2-2 libpsm-infinipath1                              # UCX / OFI / PSM plugins
  zlib1g                                                                       # libz.so.1, zlib1g-dev's
)

mkdir -p "$dest"
# As root apt would fetch as _apt, which cannot write into the checkout: fetch as root, quietly.
sandbox=()
[ "$(id -u)" -eq 0 ] && sandbox=(-o APT::Sandbox::User=root)
want=()
for p in "${core[@]}" "${runtime[@]}"; do
  fn=$(apt-cache show --no-all-versions "$p" 2>/dev/null | sed -n 's/^Filename: //p' | head -1)
  if [ -z "$fn" ]; then
    echo "gpu-deps: apt knows no package '$p' (run apt-get update?)" >&2; exit 1
  fi
  deb=$(basename "$fn")
  want+=("$deb")
  if [ ! -s "$dest/$deb" ]; then
    echo "gpu-deps: downloading $p"
    (cd "$dest" && apt-get download -q ${sandbox[@]+"${sandbox[@]}"} "$p" >/dev/null)
    [ -s "$dest/$deb" ] || { echo "gpu-deps: apt-get download $p did not produce $deb" >&2; exit 1; }
  fi
done
# Drop .debs from earlier runs that are no longer wanted (another version, a removed package).
for f in "$dest"/*.deb; do
  keep=0
  for w in "${want[@]}"; do [ "$(basename "$f")" = "$w" ] && keep=1; done
  [ $keep -eq 1 ] || { echo "gpu-deps: removing stale $(basename "$f")"; rm -f "$f"; }
done
{
  for p in "${core[@]}"; do echo "$p core"; done
  for p in "${runtime[@]}"; do echo "$p runtime"; done
} > "$dest/MANIFEST"

total=$(du -cb "$dest"/*.deb "$dest/MANIFEST" | tail -1 | cut -f1)
echo "gpu-deps: ${#want[@]} packages in $dest, $((total / 1024)) KiB ($(awk -v b="$total" 'BEGIN{printf "%.1f", b/1048576}') MiB) to carry"
if [ "$total" -gt $((48 * 1048576)) ]; then
  echo "gpu-deps: WARNING: over 48 MiB; with the working tree it may not fit the device tool's 64 MiB" >&2
fi
