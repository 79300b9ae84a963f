"""What every PyTorch peer shares: one thread count for the whole peer, BLAS included
(set_threads), and an end for spawned ranks that survives PyTorch's teardown (join_ranks).

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


def join_ranks(procs, timeout=60):
    """Joins spawned ranks whose result is already in, ending any still alive after `timeout` s.

    PyTorch 1.13 can hang a rank in its teardown: the DDP reducer's last reference to the gloo
    group joins a gloo thread that is waiting for the GIL the joining thread holds (gdb: the main
    thread in ~ProcessGroupGloo -> std::thread::join, a gloo thread in ~TensorImpl ->
    PyEval_AcquireThread; 1 run in 12 of the GPT peer). The rank has reported by then.
    """
    for proc in procs:
        proc.join(timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join()
