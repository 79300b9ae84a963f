"""What every PyTorch peer shares: one thread count for the whole peer, BLAS included
(set_threads), and an end for spawned ranks that survives PyTorch's teardown (end_rank in the
ranks, join_ranks in the parent).

Debian's PyTorch 1.13 calls OpenBLAS through libblas.so.3 (BLAS_INFO=generic; the openblas-pthread
build by default), whose own thread pool torch.set_num_threads does not reach: a peer "on one
thread" ran its GEMMs on every core (a 512 GEMM at 231 GFLOP/s against OpenBLAS's 122 on one
thread, on a 2-core machine). set_threads sets both, so the peer's rows use the threads they say.
"""
import ctypes
import os

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

    A safety net behind end_rank: a rank that still hangs in PyTorch 1.13's teardown (see end_rank)
    has reported by then.
    """
    for proc in procs:
        proc.join(timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join()


def end_rank(queue):
    """The last call of a spawned rank: leaves the gloo group, flushes what the rank put on `queue`
    to the parent, and exits without Python's teardown.

    PyTorch 1.13 can deadlock in that teardown: freeing the DDP module runs ~Reducer, whose last
    reference to the gloo group joins (or locks against) a gloo thread that is freeing a tensor and
    waits for the GIL the main thread holds, while the queue's feeder thread, which would send the
    result, waits for the GIL too (gdb, 2 runs in about 20 of the GPT peer). Nothing is freed after
    this call, so nothing can wait on the GIL.
    """
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    queue.close()
    queue.join_thread()
    os._exit(0)
