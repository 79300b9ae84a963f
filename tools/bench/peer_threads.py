"""One thread count for the whole PyTorch peer, BLAS included.

Debian's PyTorch 1.13 calls OpenBLAS through libblas.so.3 (BLAS_INFO=generic; the openblas-pthread
build by default), whose own thread pool torch.set_num_threads does not reach: a peer "on one
thread" ran its GEMMs on every core (a 512 GEMM at 231 GFLOP/s against OpenBLAS's 122 on one
thread, on a 2-core machine). set_threads sets both, so the peer's rows use the threads they say.
"""
import ctypes

import torch


def set_threads(n):
    torch.set_num_threads(n)
    for name in ("libblas.so.3", "libopenblas.so.0"):  # the library torch loaded, by its soname
        try:
            setter = ctypes.CDLL(name).openblas_set_num_threads
        except (OSError, AttributeError):
            continue
        setter(ctypes.c_int(n))
        return
