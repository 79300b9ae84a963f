# Linear algebra: matmul (every form of operand), mm, bmm, linear, addmm.

import torch
import torch.nn.functional as F

from .common import broadcast_shapes, rand_shape


def _linear(xs, p):
    return F.linear(xs[0], xs[1], xs[2] if len(xs) > 2 else None)


OPS = {
    "matmul": lambda xs, p: torch.matmul(xs[0], xs[1]),
    "mm": lambda xs, p: torch.mm(xs[0], xs[1]),
    "bmm": lambda xs, p: torch.bmm(xs[0], xs[1]),
    "linear": _linear,
    "addmm": lambda xs, p: torch.addmm(xs[0], xs[1], xs[2]),
}


def t_matmul(c):
    op = c.rng.choice(["matmul", "matmul", "matmul", "mm", "bmm", "linear", "linear", "addmm"])
    size = lambda: c.rng.choice([1, 1, 2, 3, 4, 5])
    n, k, m = size(), size(), size()
    if c.rng.random() < 0.03:
        k = 0
    if op == "mm":
        a, b = c.input([n, k]), c.input([k, m])
        c.output(c.op("mm", [a, b]))
    elif op == "bmm":
        bt = size()
        a, b = c.input([bt, n, k]), c.input([bt, k, m])
        c.output(c.op("bmm", [a, b]))
    elif op == "matmul":
        form = c.rng.choice(["vv", "vm", "mv", "mm", "bm", "mb", "bb", "bv", "vb"])
        batch = rand_shape(c.rng, 1, 2, max_size=3, p1=0.4)
        ba, bb = broadcast_shapes(c.rng, batch, 2, p_one=0.3, p_drop=0.4)
        shapes = {"vv": ([k], [k]), "vm": ([k], [k, m]), "mv": ([n, k], [k]), "mm": ([n, k], [k, m]),
                  "bm": (ba + [n, k], [k, m]), "mb": ([n, k], bb + [k, m]), "bb": (ba + [n, k], bb + [k, m]),
                  "bv": (ba + [n, k], [k]), "vb": ([k], bb + [k, m])}[form]
        a, b = c.input(shapes[0]), c.input(shapes[1], requires_grad=c.rng.random() < 0.85)
        c.output(c.op("matmul", [a, b]))
    elif op == "linear":
        lead = rand_shape(c.rng, 0, 3, max_size=3, p1=0.4)
        x = c.input(lead + [k])
        w = c.input([m, k], requires_grad=c.rng.random() < 0.9)
        ins = [x, w]
        if c.rng.random() < 0.6:
            ins.append(c.input([m], requires_grad=c.rng.random() < 0.9))
        c.output(c.op("linear", ins))
    else:
        bias_shape = c.rng.choice([[n, m], [m], [1, m], [n, 1], [1, 1], []])
        bias = c.input(bias_shape, requires_grad=c.rng.random() < 0.8)
        a, b = c.input([n, k]), c.input([k, m])
        c.output(c.op("addmm", [bias, a, b]))
