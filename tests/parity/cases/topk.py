# topk: the k largest or smallest along a dim, values (differentiable) and indices, and its
# template: batched inputs of 0 to 4 dims, every dim, k from 0 to the dim's size, sorted or not.
#
# Ties are left out (PyTorch may order equal values any way; Tandem puts the lower index first):
# the kink is the smallest gap between neighbours among the first k + 1 ranked values of a slice.
# With sorted=False PyTorch's order is unspecified too (Tandem's is the indices' order), so those
# cases compare what does not depend on it: a second, sorted topk of the values, and the input's
# gradient.

import math

import torch

from .common import neg_dim, rand_shape, wrap


OPS = {
    "topk": lambda xs, p: list(torch.topk(xs[0], p["k"], dim=p["dim"], largest=p["largest"], sorted=p["sorted"])),
}


def _gap_topk(xs, p):
    x = xs[0].detach().to(torch.float64)
    if x.dim() == 0 or x.numel() == 0:
        return math.inf
    d = wrap(p["dim"], x.dim())
    y = x.movedim(d, -1).reshape(-1, x.shape[d])
    k = min(p["k"] + 1, y.shape[1])
    if k < 2 or y.numel() == 0:
        return math.inf
    s = torch.sort(y, dim=1, descending=p["largest"]).values[:, :k]
    return float((s[:, 1:] - s[:, :-1]).abs().min())


KINKS = {"topk": _gap_topk}


def t_topk(c):
    n = c.rng.choice([0, 1, 2, 2, 3, 4])
    shape = rand_shape(c.rng, n, n, max_size=6, p1=0.15)
    x = c.input(shape, allow_expand=False)  # an expanded input repeats values: ties
    if n == 0:
        dim, k = c.rng.choice([0, -1]), c.rng.choice([0, 1])
    else:
        d = c.rng.randrange(n)
        dim, k = neg_dim(c.rng, d, n), c.rng.randint(0, shape[d])
    largest = c.rng.random() < 0.6
    sorted_ = c.rng.random() < 0.7
    values, indices = c.op("topk", [x], k=k, dim=dim, largest=largest, sorted=sorted_)
    if sorted_:
        c.output(values)
        c.output(indices)
    else:
        c.output(c.op("topk", [values], k=k, dim=dim, largest=largest, sorted=True)[0])
