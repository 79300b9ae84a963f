#!/usr/bin/python3
"""PyTorch peer for tools/bench/bench_cpu: the same work, one thread, median of several runs.

Prints one JSON object {row: value} on stdout. Run by bench_cpu itself when PyTorch is present.
"""
import json
import statistics
import sys
import time

import torch

from peer_threads import set_threads

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # the other peers' models

runs = 5  # samples per row; the command line's first argument (bench_train imports the rows)


def median_time(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def sgd_step_ms(model, x, y, iters, warmup):
    """Median ms of one SGD (momentum 0.9) cross-entropy step of model on (x, y)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return median_time(step, iters, warmup) * 1e3


def mlp_step():
    from bench_ddp_peer import make  # the same MLP and batch (seed 0)
    model, x, y = make()
    return sgd_step_ms(model, x, y, 20, 5)


def tiny_op():
    n = 1000
    x = torch.ones(1, requires_grad=True)
    c = torch.ones(1)

    def chain():
        y = x
        for _ in range(n):
            y = y + c
        y.backward()
    return median_time(chain, 5, 2) / n * 1e6  # us per op


def matmul_bf16():
    torch.manual_seed(0)
    a = torch.randn(512, 1024).bfloat16()
    b = torch.randn(1024, 1024).bfloat16()
    return 2.0 * 512 * 1024 * 1024 / median_time(lambda: torch.matmul(a, b), 10, 2) / 1e9  # GFLOP/s


def cnn_step():
    torch.manual_seed(0)
    from bench_train_peer import make_cnn
    return sgd_step_ms(make_cnn(), torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,)), 5, 2)


def conv2d_fwd_bwd():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(32, 64, 3, padding=1)
    x = torch.randn(64, 32, 28, 28, requires_grad=True)

    def step():
        conv.zero_grad(set_to_none=True)
        x.grad = None
        conv(x).sum().backward()
    return median_time(step, 3, 2) * 1e3  # ms


if __name__ == "__main__":
    set_threads(1)
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else runs
    out = {"mlp_step": mlp_step(), "tiny_op": tiny_op(), "matmul_bf16": matmul_bf16(),
           "conv2d_fwd_bwd": conv2d_fwd_bwd()}
    set_threads(2)
    out["mlp_step_2t"] = mlp_step()
    out["cnn_step_2t"] = cnn_step()
    print(json.dumps(out))
