#!/usr/bin/env python3
"""The layer map, checked: every #include of the library must point down the layer order.

    core <- autograd <- nn <- data, dist      (data and dist are siblings: neither includes the other)
    dist (communication) <- dist/ddp          (only the umbrella dist/dist.h includes both)
    of autograd, dist includes only backward_seam.h and the public ops.h, grad_mode.h, hooks.h
    cuda <- core only                         (the CUDA backend; dist/nccl/ is built with it)
    core/cpu <- core/cpu, core's .cpp files   (the CPU backend: no layer above core, not cuda, and no
                                               header of core/ or core/detail/, which those include)

and nothing in the library includes tools/ or tests/ (which may include anything, core/cpu/ too:
they are not checked here). Third-party backends stay in their folder: <mpi.h> in dist/mpi/,
<nccl.h> in dist/nccl/, CUDA's headers in cuda/ and dist/nccl/ (core/half.h includes
cuda_fp16.h/cuda_bf16.h only under nvcc, for device code: checked below), OpenBLAS's <cblas.h> in
core/cpu/matmul.cpp, oneDNN's headers in core/cpu/onednn.cpp.

Usage: check_layers.py [ROOT]      exits 1 and names file:line for each include against the map
       check_layers.py --self-test a tree with one violation of each kind must fail, a clean one pass
"""
import os
import re
import sys
import tempfile

# Folder (longest prefix wins) -> the folders its files may include.
ALLOWED = {
    "core": {"core", "core/cpu"},
    "core/cpu": {"core", "core/cpu"},  # the CPU backend, internal to core (the mirror of cuda/)
    "autograd": {"core", "autograd"},
    "nn": {"core", "autograd", "nn"},
    "data": {"core", "autograd", "nn", "data"},
    "dist": {"core", "autograd", "nn", "dist"},  # the communication layer: not dist/ddp
    "dist/ddp": {"core", "autograd", "nn", "dist", "dist/ddp"},  # DDP, on top of the communication layer
    "dist/nccl": {"core", "autograd", "nn", "dist", "cuda"},  # part of libtandem_cuda
    "cuda": {"core", "cuda"},
}
LIBRARY = ("core", "autograd", "nn", "data", "dist", "cuda")
# What dist may include of autograd (STYLE take 6): the public API and the one seam header.
AUTOGRAD_FOR_DIST = {"autograd/backward_seam.h", "autograd/ops.h", "autograd/grad_mode.h", "autograd/hooks.h"}
PROJECT_ROOTS = set(LIBRARY) | {"tools", "tests"}

# System headers that belong to one backend: header regex -> folders (prefixes) allowed to include it.
BACKEND_HEADERS = [
    (re.compile(r"^mpi\.h$"), ("dist/mpi/",)),
    (re.compile(r"^nccl(_device)?\.h$"), ("dist/nccl/",)),
    (re.compile(r"^(cuda|cublas|curand|cusparse|cufft)[A-Za-z0-9_]*\.h$"), ("cuda/", "dist/nccl/")),
    (re.compile(r"^cblas\.h$"), ("core/cpu/matmul.cpp",)),
    (re.compile(r"^(oneapi/)?dnnl[A-Za-z0-9_./]*$"), ("core/cpu/onednn.cpp",)),
]
# file -> headers it may include only inside `#if defined(__CUDACC__)` (device code under nvcc).
UNDER_NVCC = {"core/half.h": {"cuda_fp16.h", "cuda_bf16.h"}}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def folder_of(rel):
    best = None
    for f in ALLOWED:
        if rel.startswith(f + "/") and (best is None or len(f) > len(best)):
            best = f
    return best


def check(root):
    problems = []
    for top in LIBRARY:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                here = folder_of(rel)
                nvcc_depth = 0  # inside #if defined(__CUDACC__) blocks
                depth = 0
                nvcc_at = []
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        stripped = line.strip()
                        if stripped.startswith("#if"):
                            depth += 1
                            if "__CUDACC__" in stripped and "!" not in stripped:
                                nvcc_at.append(depth)
                        elif stripped.startswith("#endif"):
                            if nvcc_at and nvcc_at[-1] == depth:
                                nvcc_at.pop()
                            depth -= 1
                        nvcc_depth = len(nvcc_at)
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        kind, target = m.groups()
                        where = f"{rel}:{lineno}"
                        if kind == '"':
                            first = target.split("/")[0]
                            if target == "tandem.h":
                                problems.append(f"{where}: includes the umbrella tandem.h (a library file includes what it uses)")
                            elif first in ("tools", "tests"):
                                problems.append(f"{where}: includes {target}: the library never includes {first}/")
                            elif "/" in target and first in PROJECT_ROOTS:
                                # A folder with its own row (dist/ddp, dist/nccl) is a layer of its own.
                                dest = folder_of(target) or first
                                if dest == "core/cpu" and here != "core/cpu" and (
                                        here != "core" or name.endswith((".h", ".cuh"))):
                                    problems.append(f"{where}: includes {target}: core/cpu/ is core's CPU backend, "
                                                    f"included only by core/cpu/ and core's .cpp files (not by {here}/ "
                                                    f"{'headers, which cuda/ and the layers above include' if here == 'core' else 'files'})")
                                elif here.startswith("dist") and dest == "autograd" and target not in AUTOGRAD_FOR_DIST:
                                    problems.append(f"{where}: dist includes {target}: of autograd, dist uses only "
                                                    f"{', '.join(sorted(AUTOGRAD_FOR_DIST))} (the seam and the public API)")
                                elif dest != here and dest not in ALLOWED[here] and not (rel == "dist/dist.h" and dest.startswith("dist")):
                                    problems.append(f"{where}: {here}/ includes {target}, against the layer order "
                                                    f"({here}/ may include {', '.join(sorted(ALLOWED[here]))})")
                        else:
                            for pattern, homes in BACKEND_HEADERS:
                                if not pattern.match(target):
                                    continue
                                if any(rel.startswith(h) for h in homes):
                                    break
                                if target in UNDER_NVCC.get(rel, set()) and nvcc_depth > 0:
                                    break
                                problems.append(f"{where}: includes <{target}>, which belongs in {' or '.join(homes)}")
                                break
    return problems


def self_test():
    cases = {
        "core/a.h": '#include "autograd/engine.h"\n',                  # core up into autograd
        "data/b.cpp": '#include "dist/ddp.h"\n',                       # sibling
        "cuda/c.cu": '#include "nn/module.h"\n',                       # cuda above core
        "nn/d.cpp": '#include "tests/test_util.h"\n',                  # tests
        "autograd/e.cpp": '#include <mpi.h>\n',                        # backend header outside its home
        "core/half.h": '#include <cuda_fp16.h>\n',                     # not under nvcc
        "dist/work.cpp": '#include "dist/ddp/reducer.h"\n',           # communication layer up into DDP
        "dist/ddp/j.cpp": '#include "autograd/node.h"\n',             # autograd's internals past the seam
        "autograd/k.cpp": '#include "core/cpu/onednn.h"\n',          # above core into its CPU backend
        "cuda/l.cu": '#include "core/cpu/elementwise_loops.h"\n',    # the CUDA backend into the CPU one
        "core/detail/m.h": '#include "core/cpu/simd_loops.h"\n',     # a shared header into the CPU backend
        "core/n.cpp": '#include <oneapi/dnnl/dnnl.hpp>\n',            # oneDNN outside core/cpu/onednn.cpp
    }
    clean = {
        "core/half.h": '#if defined(__CUDACC__)\n#include <cuda_fp16.h>\n#endif\n',
        "dist/nccl/g.cpp": '#include "cuda/runtime.h"\n#include <nccl.h>\n#include "dist/work.h"\n',
        "data/h.cpp": '#include "nn/module.h"\n#include "data/idx.h"\n',
        "dist/ddp/i.cpp": '#include "dist/process_group.h"\n#include "dist/ddp/reducer.h"\n#include "autograd/backward_seam.h"\n',
        "dist/dist.h": '#include "dist/ddp/ddp.h"\n#include "dist/init.h"\n',
        "core/cpu/matmul.cpp": '#include "core/detail/matmul.h"\n#include <cblas.h>\n#include "core/cpu/onednn.h"\n',
        "core/cpu/onednn.cpp": '#include "core/cpu/onednn.h"\n#include <oneapi/dnnl/dnnl.hpp>\n',
        "core/cpu/elementwise_loops.h": '#include "core/detail/elementwise.h"\n#include "core/cpu/simd_loops.h"\n',
        "core/detail/copy.cpp": '#include "core/detail/copy.h"\n#include "core/cpu/elementwise_loops.h"\n',
    }
    with tempfile.TemporaryDirectory() as bad, tempfile.TemporaryDirectory() as good:
        for root, files in ((bad, cases), (good, clean)):
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w") as fh:
                    fh.write(text)
        found = check(bad)
        missed = [rel for rel in cases if not any(p.startswith(rel + ":") for p in found)]
        wrong = check(good)
    if missed or wrong:
        print("check_layers self-test FAILED: missed", missed, "flagged clean:", wrong)
        return 1
    print(f"check_layers self-test: {len(found)} planted violations found, the clean tree passes")
    return 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) against the layer map (see the docstring of {argv[0]})")
        return 1
    print("check_layers: every library #include follows the layer map")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
