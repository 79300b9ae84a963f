# Triangles: tril and triu over the last two dims, batched over the leading ones.

import torch

from .common import rand_shape


OPS = {
    "tril": lambda xs, p: torch.tril(xs[0], p["diagonal"]),
    "triu": lambda xs, p: torch.triu(xs[0], p["diagonal"]),
}


def t_triangle(c):
    """tril/triu of a matrix or a batch of them (square or not, often non-contiguous, sometimes
    empty), on diagonals below, on, above and past either corner; integer and bool inputs too.
    Sometimes both, making a band. The result only copies or zeroes: it must match exactly."""
    rows = 0 if c.rng.random() < 0.05 else c.rng.randint(1, 5)
    cols = 0 if c.rng.random() < 0.05 else c.rng.randint(1, 5)
    shape = rand_shape(c.rng, 0, 2, max_size=3, p1=0.2) + [rows, cols]
    r = c.rng.random()
    if r < 0.15:
        x = c.input(shape, "int", dtype=c.rng.choice(["i64", "i32"]), lo=-5, hi=6)
    elif r < 0.25:
        x = c.input(shape, "bool", dtype="bool")
    else:
        x = c.input(shape)
    op = c.rng.choice(["tril", "triu"])
    y = c.op(op, [x], diagonal=c.rng.randint(-rows - 2, cols + 2))
    if c.rng.random() < 0.3:
        y = c.op("triu" if op == "tril" else "tril", [y], diagonal=c.rng.randint(-rows - 1, cols + 1))
    c.output(y, exact=True)
