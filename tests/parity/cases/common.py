# What every op family's module shares: the dtypes, the margin and magnitude limits, Reject (a draw
# to redo), step arguments, random shapes and dims.

import torch


MARGIN = 1e-3
MAX_MAGNITUDE = 1e3

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "i64": torch.int64, "i32": torch.int32, "bool": torch.bool}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# Least precise first: a case is judged at the precision of its least precise tensor.
PRECISION_ORDER = [torch.bfloat16, torch.float16, torch.float32, torch.float64]


class Reject(Exception):
    """The draw landed somewhere the comparison would not be meaningful; draw again."""


def wrap(dim, ndim):
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise Reject()
    return dim % n


def scalar_value(p, key):
    v = p[key]
    return int(v) if p.get("integral", False) else float(v)


def opt_input(xs, flags, name):
    return xs.pop(0) if flags.get(name, False) else None


def rand_shape(rng, lo=1, hi=3, max_size=5, p1=0.25, p0=0.0):
    shape = []
    for _ in range(rng.randint(lo, hi)):
        r = rng.random()
        shape.append(0 if r < p0 else 1 if r < p0 + p1 else rng.randint(2, max_size))
    return shape


def broadcast_shapes(rng, out, n, p_one=0.3, p_drop=0.3):
    shapes = []
    for _ in range(n):
        s = list(out)
        if s and rng.random() < p_drop:
            s = s[rng.randint(1, len(s)):]
        s = [1 if rng.random() < p_one else d for d in s]
        shapes.append(s)
    return shapes


def neg_dim(rng, d, ndim):
    """The same dim, counted from the end half of the time (Tandem and PyTorch both wrap)."""
    return d - ndim if ndim > 0 and rng.random() < 0.5 else d


def rand_dims(rng, ndim, allow_empty=False):
    if ndim == 0:
        return []
    k = rng.randint(0 if allow_empty else 1, ndim)
    dims = rng.sample(range(ndim), k)
    return [neg_dim(rng, d, ndim) for d in dims]


def max_abs_finite(t):
    f = t.detach()[torch.isfinite(t.detach())]
    return float(f.abs().max()) if f.numel() else 0.0
