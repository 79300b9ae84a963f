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
      Causal attention, forward and backward at B 8, H 4, T 512, D 64, f32: PyTorch 2.x's fused
      scaled_dot_product_attention where the peer has it; on PyTorch 1.13, which has none, as a
      model writes it (q kᵀ · scale, masked_fill of the causal mask, softmax, · v).
      Reports the median ms of 5 runs after the first, and the first run's peak RSS over what the
      inputs take (MiB), as bench_train's sdpa worker does for ours.

  bench_train_peer.py gpt SETUP --world W --steps N --time-after K --total-steps S --warmup WU --lr LR
                      --batch B --beta1 B1 --beta2 B2 --weight-decay WD --clip C --n-head H [--eval]
      Train's GPT (tools/train/models.h) in PyTorch, in W processes (gloo DDP when W > 1), with the
      same module and parameter names, so SETUP's weights load into it: the initial weights
      ("model.<name>", lm_head.weight tied to wte.weight), the training split's token ids
      ("train_tokens"), every rank's window starts for the steps ("order.<W>.<rank>": step s takes
      entries [s B, (s + 1) B), the window being tokens [start, start + T] as train's TextDataset
      cuts it) and the validation windows train evaluates ("val.x", "val.y"), all written by
      bench_train. Attention fused on PyTorch 2.x, unfused on 1.13 (which has no fused op: q kᵀ ·
      1/√D, masked_fill of the causal mask, softmax, · v); exact GELU, LayerNorm eps 1e-5, the tied
      head. Each step:
      forward, mean cross-entropy, backward, clip_grad_norm_ to C, AdamW (betas B1/B2, eps 1e-8,
      weight decay WD on the parameters of 2+ dims, none on the others), then the schedule: train's
      warm-up from lr/10 over WU steps and a cosine to 0 over the other S - WU (LambdaLR). Runs N
      steps; reports (rank 0) the median ms of the steps after the first K (zero_grad to the
      schedule's step; the batch is cut before the clock starts), the whole loop's seconds, the
      first and last steps' losses averaged over the ranks, and with --eval the validation loss
      (nats per character, the mean over every target of the validation windows).

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

from peer_threads import end_rank, join_ranks, set_threads

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


def init_rank(rank, world, port):
    """One intra-op thread; a gloo group of `world` ranks on localhost when world > 1. Returns world."""
    set_threads(1)
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    return world


def train_rank(rank, args, port, queue):
    world = init_rank(rank, args.world, port)
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
        end_rank(queue)  # not Python's teardown, which can deadlock in PyTorch 1.13 (see end_rank)


def current_rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)


def causal_attention(q, k, v, causal, scale):
    """softmax(q kᵀ · scale, causal) v: PyTorch 2.x's fused scaled_dot_product_attention where the
    peer has it (its CPU kernel is tiled, as ours), else 1.13's composition of ops."""
    fused = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if fused is not None:
        return fused(q, k, v, is_causal=True)  # scale: 1/sqrt(D), the callers' own
    s = (q @ k.transpose(-2, -1)) * scale
    s = s.masked_fill(~causal, float("-inf"))
    return torch.softmax(s, -1) @ v


def sdpa():
    import resource
    set_threads(1)
    torch.manual_seed(0)
    shape = (8, 4, 512, 64)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    w = torch.randn(shape)
    causal = torch.ones(512, 512, dtype=torch.bool).tril()
    scale = 1.0 / math.sqrt(64)

    def step():
        q.grad = k.grad = v.grad = None
        (causal_attention(q, k, v, causal, scale) * w).sum().backward()

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


# ---- train's GPT (tools/train/models.h), module for module, so that its state_dict loads ----

class GptAttention(torch.nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.c_attn = torch.nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = torch.nn.Linear(n_embd, n_embd)
        # A plain attribute, not a buffer: not in the state_dict, not broadcast by DDP.
        self.causal = torch.ones(block_size, block_size, dtype=torch.bool).tril()

    def forward(self, x):  # [B, T, C] -> [B, T, C]
        B, T, C = x.shape
        D = C // self.n_head
        q, k, v = (t.view(B, T, self.n_head, D).transpose(1, 2) for t in self.c_attn(x).split(C, 2))
        y = causal_attention(q, k, v, self.causal[:T, :T], 1.0 / math.sqrt(D))  # [B, H, T, D]
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class GptMlp(torch.nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = torch.nn.Linear(n_embd, 4 * n_embd)
        self.gelu = torch.nn.GELU()  # exact (erf), as nn::GELU's default
        self.c_proj = torch.nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class GptBlock(torch.nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = GptAttention(n_embd, n_head, block_size)
        self.ln_2 = torch.nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = GptMlp(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(torch.nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab_size, n_embd)
        self.wpe = torch.nn.Embedding(block_size, n_embd)
        self.blocks = torch.nn.ModuleList(GptBlock(n_embd, n_head, block_size) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(n_embd, eps=1e-5)
        self.lm_head = torch.nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx):  # [B, T] -> [B, T, vocab_size]
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt_from_setup(setup, n_head):
    state = {k[len("model."):]: v for k, v in setup.items() if k.startswith("model.")}
    vocab_size, n_embd = state["wte.weight"].shape
    block_size = state["wpe.weight"].shape[0]
    n_layer = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    model = Gpt(vocab_size, block_size, n_layer, n_head, n_embd)
    state.setdefault("lm_head.weight", state["wte.weight"])
    model.load_state_dict(state)  # strict: every name and shape as ours
    return model


def gpt_rank(rank, args, port, queue):
    world = init_rank(rank, args.world, port)
    setup = read_safetensors(args.setup)
    model = gpt_from_setup(setup, args.n_head)
    tokens = setup["train_tokens"]
    order = setup[f"order.{world}.{rank}"]
    T = model.wpe.weight.shape[0]
    assert len(order) >= args.steps * args.batch, "the setup holds fewer windows than the steps need"
    net = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False) if world > 1 else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(args.beta1, args.beta2), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, args.total_steps, "cosine", args.warmup))
    ar = torch.arange(T)

    def batch(s):
        starts = order[s * args.batch:(s + 1) * args.batch].unsqueeze(1)
        return tokens[starts + ar], tokens[starts + 1 + ar]

    def mean_over_ranks(v):
        t = torch.tensor([v], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(t)
            t /= world
        return float(t)

    if world > 1:
        dist.barrier()
    ms, losses = [], []
    t0 = time.perf_counter()
    for s in range(args.steps):
        x, y = batch(s)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = net(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        sched.step()
        if s >= args.time_after:
            ms.append((time.perf_counter() - t1) * 1e3)
        if s == 0 or s == args.steps - 1:
            losses.append(float(loss.detach()))
    train_s = time.perf_counter() - t0
    first_loss, last_loss = mean_over_ranks(losses[0]), mean_over_ranks(losses[-1])
    if rank == 0:
        val_loss = None  # JSON has no NaN
        if args.eval:
            vx, vy = setup["val.x"], setup["val.y"]
            model.eval()
            total, count = 0.0, 0
            with torch.no_grad():
                for i in range(0, len(vx), args.batch):
                    logits = model(vx[i:i + args.batch])
                    total += float(torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]), vy[i:i + args.batch].reshape(-1),
                        reduction="sum"))
                    count += vy[i:i + args.batch].numel()
            val_loss = total / count
        ms.sort()
        queue.put({"ms": ms[len(ms) // 2] if ms else None, "train_s": train_s, "steps": args.steps,
                   "first_loss": first_loss, "loss": last_loss, "val_loss": val_loss,
                   "version": torch.__version__})
    if world > 1:
        end_rank(queue)  # not Python's teardown, which can deadlock in PyTorch 1.13 (see end_rank)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "sdpa":
        print(json.dumps(sdpa()))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "conv":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_cpu_peer
        set_threads(1)
        bench_cpu_peer.runs = 1
        print(json.dumps({"conv2d_fwd_bwd_ms": bench_cpu_peer.conv2d_fwd_bwd(), "version": torch.__version__}))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "gpt":
        p = argparse.ArgumentParser()
        p.add_argument("mode", choices=["gpt"])
        p.add_argument("setup")
        p.add_argument("--world", type=int, default=1)
        p.add_argument("--steps", type=int, required=True)
        p.add_argument("--time-after", type=int, default=0)
        p.add_argument("--total-steps", type=int, required=True)
        p.add_argument("--warmup", type=int, required=True)
        p.add_argument("--lr", type=float, required=True)
        p.add_argument("--batch", type=int, required=True)
        p.add_argument("--beta1", type=float, required=True)
        p.add_argument("--beta2", type=float, required=True)
        p.add_argument("--weight-decay", type=float, required=True)
        p.add_argument("--clip", type=float, required=True)
        p.add_argument("--n-head", type=int, required=True)
        p.add_argument("--eval", action="store_true")
        print(json.dumps(run_world(gpt_rank, p.parse_args())))
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
    print(json.dumps(run_world(train_rank, p.parse_args())))


def run_world(target, args):
    """target(rank, args, port, queue) in this process (world 1) or in args.world spawned ones; rank
    0's result."""
    set_threads(1)
    if args.world == 1:
        import queue as q
        results = q.Queue()
        target(0, args, 0, results)
        return results.get()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, args, port, results)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    # A rank that dies leaves the others waiting in gloo (30 minutes by default): poll, and fail
    # fast with the exit codes instead.
    import queue as q
    deadline = time.time() + 3600
    while True:
        try:
            out = results.get(timeout=2)
            break
        except q.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) or time.time() > deadline:
                for p in procs:
                    p.terminate()
                sys.exit(f"bench_train_peer: a rank failed or timed out (exit codes {[p.exitcode for p in procs]})")
    join_ranks(procs)
    return out

if __name__ == "__main__":
    main()
