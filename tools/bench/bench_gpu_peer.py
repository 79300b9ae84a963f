#!/usr/bin/env python3
"""PyTorch-CUDA peer for tools/bench/bench_gpu: the same work on the same shapes, timed the same way
(CUDA events, warm-up first, median over runs of the mean over several calls).

sdpa_fwd_bwd_f32 / _bf16: torch.nn.functional.scaled_dot_product_attention (PyTorch 2.x, fused:
the backend PyTorch picks for the dtype, flash or memory-efficient) forward and backward, q, k, v
[8, 4, 512, 64] causal, out.backward(dout) with the gradients cleared before each call, as
bench_gpu's row for Tandem's fused kernel.

Prints one JSON object {row: value} on stdout; a row whose op fails is left out (its error goes
to stderr). Run by bench_gpu itself: python3 bench_gpu_peer.py RUNS [--quick].
"""
import json
import statistics
import sys

import torch

runs = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 7
quick = "--quick" in sys.argv
if not torch.cuda.is_available():
    print("bench_gpu_peer: torch sees no CUDA device", file=sys.stderr)
    sys.exit(1)
dev = torch.device("cuda", 0)
# As Tandem's default (and PyTorch's): f32 matmul in full f32, no TF32.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
bw_iters = 3 if quick else 10


def median_ms(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / iters)
    return statistics.median(samples)


def gbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


N256 = 64 << 20  # f32 elements in 256 MiB
B256 = N256 * 4
out = {}


def row(name, fn):
    try:
        out[name] = fn()
    except Exception as e:  # noqa: BLE001 - one failing row must not hide the others
        print(f"bench_gpu_peer: {name} failed: {e}", file=sys.stderr)
    torch.cuda.empty_cache()


def copy_bw():
    a = torch.randn(N256, device=dev)
    b = torch.empty_like(a)
    return gbps(2 * B256, median_ms(lambda: b.copy_(a), bw_iters, 2))


def add_bw():
    a = torch.randn(N256, device=dev)
    b = torch.randn(N256, device=dev)
    return gbps(3 * B256, median_ms(lambda: a + b, bw_iters, 2))


def cast_bw():
    a = torch.randn(N256, device=dev)
    return gbps(1.5 * B256, median_ms(lambda: a.to(torch.bfloat16), bw_iters, 2))


def softmax_bw(dtype):
    x = torch.randn(8192, 8192, device=dev).to(dtype)
    nbytes = 2 * x.numel() * x.element_size()
    return gbps(nbytes, median_ms(lambda: torch.softmax(x, -1), bw_iters, 2))


def layernorm_bw(dtype):
    x = torch.randn(8192, 8192, device=dev).to(dtype)
    w = torch.randn(8192, device=dev).to(dtype)
    b = torch.randn(8192, device=dev).to(dtype)
    nbytes = 2 * x.numel() * x.element_size()
    return gbps(nbytes, median_ms(lambda: torch.nn.functional.layer_norm(x, (8192,), w, b), bw_iters, 2))


def gemm(n, dtype):
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    ms = median_ms(lambda: a @ b, 3 if quick else 10, 3)
    return 2.0 * n * n * n / (ms * 1e-3) / 1e12


def mlp_step_gpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(4096, 784, device=dev)
    y = torch.randint(0, 10, (4096,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return median_ms(step, 3 if quick else 10, 3)


def sdpa_fwd_bwd(dtype):
    torch.manual_seed(0)
    shape = (8, 4, 512, 64)
    q, k, v = (torch.randn(shape, device=dev).to(dtype).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, device=dev).to(dtype)
    attention = torch.nn.functional.scaled_dot_product_attention

    def step():
        q.grad = k.grad = v.grad = None
        attention(q, k, v, is_causal=True).backward(dout)
    return median_ms(step, 3 if quick else 10, 3)


row("copy_bw", copy_bw)
row("add_bw", add_bw)
row("cast_bw", cast_bw)
row("softmax_bw_f32", lambda: softmax_bw(torch.float32))
row("layernorm_bw_f32", lambda: layernorm_bw(torch.float32))
row("softmax_bw_bf16", lambda: softmax_bw(torch.bfloat16))
row("layernorm_bw_bf16", lambda: layernorm_bw(torch.bfloat16))
row("gemm_bf16_8192", lambda: gemm(8192, torch.bfloat16))
row("gemm_f32_4096", lambda: gemm(4096, torch.float32))
row("mlp_step_gpu", mlp_step_gpu)
row("sdpa_fwd_bwd_f32", lambda: sdpa_fwd_bwd(torch.float32))
row("sdpa_fwd_bwd_bf16", lambda: sdpa_fwd_bwd(torch.bfloat16))
print(json.dumps(out))
