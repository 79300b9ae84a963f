#!/usr/bin/python3
"""PyTorch peer for tools/bench/bench_ddp: the bench_cpu MLP under torch DDP over gloo, 2 processes,
one thread each, the same per-rank batch; median of several runs of 20 steps.

Prints one JSON object on stdout. Run by bench_ddp itself when PyTorch is present.
"""
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from peer_threads import end_rank, join_ranks, set_threads

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10))
    return model, torch.randn(64, 784), torch.randint(0, 10, (64,))


def timed(step, sync=lambda: None):
    for _ in range(5):
        step()
    samples = []
    for _ in range(RUNS):
        sync()
        t0 = time.perf_counter()
        for _ in range(20):
            step()
        samples.append((time.perf_counter() - t0) / 20)
    return statistics.median(samples) * 1e3


def rank_main(rank, world, port, queue):
    set_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, x, y = make()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    ms = timed(step, dist.barrier)
    if rank == 0:
        queue.put(ms)
    end_rank(queue)  # not Python's teardown, which can deadlock in PyTorch 1.13 (see end_rank)


def main():
    set_threads(1)
    model, x, y = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    single = timed(step)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    ms = queue.get(timeout=600)
    join_ranks(procs)
    print(json.dumps({"ddp_step_ms": ms, "single_step_ms": single, "version": torch.__version__}))


if __name__ == "__main__":
    main()
