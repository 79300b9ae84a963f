#!/usr/bin/python3
"""PyTorch peer for tools/bench/bench_train, one intra-op thread per process. Prints one JSON object.

  bench_train_peer.py conv
      One sample of bench_cpu's conv2d_fwd_bwd row (bench_cpu_peer.py's, after its warm-up), ms.
  bench_train_peer.py train SETUP --world W --epochs E --lr LR --schedule S --warmup N --batch B
                      --momentum M --mean MEAN --std STD --data-root DIR
      Train's CNN on Fashion-MNIST, in W processes (gloo DDP when W > 1): the initial weights and
      every rank's data order per epoch come from SETUP (a safetensors file bench_train writes:
      "model.<name>" tensors, "order.<W>.<rank>.<epoch>" index lists), so the model, its start, the
      data order and the optimizer (SGD with momentum, the schedule stepped per step as train's)
      are train's. Batches are rows taken from the normalised images held in memory. Reports the
      wall time of the first epoch's loop and of the whole training (rank 0; evaluation and data
      loading excluded), the last step's loss and the test accuracy.

  bench_train_peer.py sdpa
      Attention as a model writes it without a fused op (PyTorch 1.13 has none): q kᵀ · scale,
      masked_fill of the causal mask, softmax, · v; forward and backward at B 8, H 4, T 512, D 64, f32.
      Reports the median ms of 5 runs after the first, and the first run's peak RSS over what the
      inputs take (MiB), as bench_train's sdpa worker does for ours.

Run by bench_train itself when PyTorch is present.
"""
import argparse
import gzip
import json
import math
import os
import socket
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = torch.from_numpy(array.copy())
    return out


def read_idx(root, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(root, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                raw = f.read()
            ndim = raw[3]
            dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
            return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    sys.exit(f"bench_train_peer: no {stem}[.gz] in {root}")


def fashion_mnist(root, split, mean, std):
    prefix = "train" if split == "train" else "t10k"
    images = torch.from_numpy(read_idx(root, prefix + "-images-idx3-ubyte").astype(np.float32))
    labels = torch.from_numpy(read_idx(root, prefix + "-labels-idx1-ubyte").astype(np.int64))
    # train's one fused pass: x * (1 / (255 std)) - mean / std
    images = images * (1.0 / (255.0 * std)) + (-mean / std)
    return images.unsqueeze(1).contiguous(), labels


def make_cnn(channels=32):
    # tools/train/models.h's make_fmnist_cnn, layer for layer (so the parameter names match).
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * channels * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def lr_factor(step, total, schedule, warmup):
    # train's per-step schedule: linear warm-up from 0.1 over `warmup` steps, then the decay over
    # the remaining steps (tools/train/train.cpp).
    if step < warmup:
        return 0.1 + 0.9 * step / warmup
    rest = max(1, total - warmup)
    e = step - warmup
    if schedule == "cosine":
        return (1 + math.cos(math.pi * e / rest)) / 2
    if schedule == "step":
        return 0.1 ** (e // max(1, rest // 3))
    return 1.0


def train_rank(rank, args, port, queue):
    torch.set_num_threads(1)
    world = args.world
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    setup = read_safetensors(args.setup)
    x, y = fashion_mnist(args.data_root, "train", args.mean, args.std)
    model = make_cnn()
    state = {k[len("model."):]: v for k, v in setup.items() if k.startswith("model.")}
    model.load_state_dict(state)
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
    orders = [setup[f"order.{world}.{rank}.{e}"] for e in range(args.epochs)]
    per_epoch = (len(orders[0]) + args.batch - 1) // args.batch
    total = per_epoch * args.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, total, args.schedule, args.warmup))
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    first_epoch_s = None
    loss = None
    for e in range(args.epochs):
        order = orders[e]
        for b in range(per_epoch):
            idx = order[b * args.batch:(b + 1) * args.batch]
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            sched.step()
        if first_epoch_s is None:
            first_epoch_s = time.perf_counter() - t0
    train_s = time.perf_counter() - t0
    last_loss = loss.detach().clone()
    if world > 1:
        dist.all_reduce(last_loss)
        last_loss /= world
    if rank == 0:
        accuracy = None  # JSON has no NaN
        if not args.no_eval:
            tx, ty = fashion_mnist(args.data_root, "test", args.mean, args.std)
            model.eval()
            with torch.no_grad():
                correct = sum(int((model(tx[i:i + 1000]).argmax(1) == ty[i:i + 1000]).sum())
                              for i in range(0, len(ty), 1000))
            accuracy = correct / len(ty)
        queue.put({"epoch_s": first_epoch_s, "train_s": train_s, "loss": float(last_loss),
                   "accuracy": accuracy, "steps": total, "version": torch.__version__})
    if world > 1:
        dist.destroy_process_group()


def current_rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)


def sdpa():
    import resource
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = (8, 4, 512, 64)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    w = torch.randn(shape)
    causal = torch.ones(512, 512, dtype=torch.bool).tril()
    scale = 1.0 / math.sqrt(64)

    def step():
        q.grad = k.grad = v.grad = None
        s = (q @ k.transpose(-2, -1)) * scale
        s = s.masked_fill(~causal, float("-inf"))
        ((torch.softmax(s, -1) @ v) * w).sum().backward()

    base = current_rss_mib()
    step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0 - base
    ms = []
    for _ in range(5):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    return {"ms": ms[len(ms) // 2], "peak_mib": peak, "version": torch.__version__}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "sdpa":
        print(json.dumps(sdpa()))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "conv":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_cpu_peer
        torch.set_num_threads(1)
        bench_cpu_peer.runs = 1
        print(json.dumps({"conv2d_fwd_bwd_ms": bench_cpu_peer.conv2d_fwd_bwd(), "version": torch.__version__}))
        return
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train"])
    p.add_argument("setup")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--schedule", choices=["constant", "cosine", "step"], default="constant")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--momentum", type=float, required=True)
    p.add_argument("--mean", type=float, required=True)
    p.add_argument("--std", type=float, required=True)
    p.add_argument("--data-root", required=True)
    p.add_argument("--no-eval", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.world == 1:
        import queue as q
        results = q.Queue()
        train_rank(0, args, 0, results)
        print(json.dumps(results.get()))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=train_rank, args=(r, args, port, results)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    out = results.get(timeout=3600)
    for proc in procs:
        proc.join()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
