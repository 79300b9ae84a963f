# Indexing and joining: index_select, gather, scatter_add, cat, stack, split, chunk.

import torch

from .common import neg_dim, rand_shape


def _split(xs, p):
    return list(torch.split(xs[0], p["sizes"] if "sizes" in p else p["size"], p["dim"]))


OPS = {
    "index_select": lambda xs, p: torch.index_select(xs[0], p["dim"], xs[1]),
    # Tandem's gather and scatter_add take i32 indices too (PyTorch's only i64): the reference
    # gets them widened, so the i32 path is checked rather than refused.
    "gather": lambda xs, p: torch.gather(xs[0], p["dim"], xs[1].long()),
    "scatter_add": lambda xs, p: torch.scatter_add(xs[0], p["dim"], xs[1].long(), xs[2]),
    "cat": lambda xs, p: torch.cat(xs, p["dim"]),
    "stack": lambda xs, p: torch.stack(xs, p["dim"]),
    "split": _split,
    "chunk": lambda xs, p: list(torch.chunk(xs[0], p["chunks"], p["dim"])),
}


def t_index(c):
    op = c.rng.choice(["index_select", "gather", "scatter_add", "cat", "stack", "split", "chunk"])
    shape = rand_shape(c.rng, 1, 3, max_size=5, p1=0.15)
    n = len(shape)
    d = c.rng.randrange(n)
    dn = neg_dim(c.rng, d, n)
    if op == "index_select":
        a = c.input(shape)
        idx = c.index([c.rng.randint(0, 6)], shape[d], dtype=c.rng.choice(["i64", "i64", "i32"]))
        c.output(c.op("index_select", [a, idx], dim=dn))
    elif op == "gather":
        a = c.input(shape)
        ishape = [c.rng.randint(1, 5) if k == d else c.rng.randint(1, shape[k]) for k in range(n)]
        idx = c.index(ishape, shape[d], dtype=c.rng.choice(["i64", "i64", "i32"]))
        c.output(c.op("gather", [a, idx], dim=dn))
    elif op == "scatter_add":
        a = c.input(shape, requires_grad=c.rng.random() < 0.8)
        ishape = [c.rng.randint(1, 5) if k == d else c.rng.randint(1, shape[k]) for k in range(n)]
        idx = c.index(ishape, shape[d], dtype=c.rng.choice(["i64", "i64", "i32"]))
        # src may be larger than index (only its leading part is read); PyTorch 1.13 cannot
        # differentiate that form, so such a src takes no gradient.
        larger = c.rng.random() < 0.3
        sshape = [s + c.rng.randint(0, 1) for s in ishape] if larger else ishape
        src = c.input(sshape, requires_grad=not larger)
        c.output(c.op("scatter_add", [a, idx, src], dim=dn))
    elif op in ("cat", "stack"):
        parts = []
        for _ in range(c.rng.randint(1, 4)):
            s = list(shape)
            if op == "cat":
                s[d] = c.rng.randint(0, 3)
            parts.append(c.input(s, requires_grad=c.rng.random() < 0.8))
        sd = dn if op == "cat" else neg_dim(c.rng, c.rng.randint(0, n), n + 1)
        c.output(c.op(op, parts, dim=sd))
    else:
        a = c.input(shape)
        if op == "split":
            if c.rng.random() < 0.5:
                params = {"size": c.rng.randint(1, max(1, shape[d]))}
            else:
                sizes, left = [], shape[d]
                while left > 0:
                    s = c.rng.randint(0 if c.rng.random() < 0.2 else 1, left)
                    sizes.append(s)
                    left -= s
                params = {"sizes": sizes or [0]}
            params["dim"] = dn
        else:
            params = {"chunks": c.rng.randint(1, 4), "dim": dn}
        pieces = c.op(op, [a], **params)
        # Some pieces go unused: their gradient is zero.
        for p in pieces:
            if c.rng.random() < 0.7:
                c.output(p)
        if not c.outputs:
            c.output(pieces[0])
