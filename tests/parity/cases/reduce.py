# Reductions: sum, mean, max/min (whole and along a dim), amax/amin, argmax/argmin, var/std,
# logsumexp, norm; their kinks (ties of the extreme values), std's check on constant slices, and
# their templates.

import math

import torch

from .common import Reject, neg_dim, rand_dims, rand_shape, wrap


def _var_std(fn):
    def run(xs, p):
        if p.get("dims") is None:
            return fn(xs[0])
        # dims=[] reduces everything (Tandem and PyTorch alike), but PyTorch 1.13 differentiates
        # it as a reduction over nothing (2 (x - mean) / (1 - correction): -inf at correction 1):
        # the reference spells the dims out, while Tandem is still given [].
        dims = p["dims"] or list(range(xs[0].dim()))
        return fn(xs[0], dim=dims, correction=p["correction"], keepdim=p["keepdim"])
    return run


def _reduce(fn):
    def run(xs, p):
        if p.get("dims") is None:
            return fn(xs[0])
        return fn(xs[0], dim=p["dims"], keepdim=p["keepdim"])
    return run


def _arg(fn):
    def run(xs, p):
        if p.get("dim") is None:
            return fn(xs[0])
        return fn(xs[0], dim=p["dim"], keepdim=p["keepdim"])
    return run


OPS = {
    "sum": _reduce(torch.sum),
    "mean": _reduce(torch.mean),
    "max_all": lambda xs, p: torch.max(xs[0]),
    "min_all": lambda xs, p: torch.min(xs[0]),
    "max_dim": lambda xs, p: list(torch.max(xs[0], p["dim"], p["keepdim"])),
    "min_dim": lambda xs, p: list(torch.min(xs[0], p["dim"], p["keepdim"])),
    "amax": lambda xs, p: torch.amax(xs[0], dim=p["dims"], keepdim=p["keepdim"]),
    "amin": lambda xs, p: torch.amin(xs[0], dim=p["dims"], keepdim=p["keepdim"]),
    "argmax": _arg(torch.argmax),
    "argmin": _arg(torch.argmin),
    "var": _var_std(torch.var),
    "std": _var_std(torch.std),
    "logsumexp": lambda xs, p: torch.logsumexp(xs[0], dim=p["dims"], keepdim=p["keepdim"]),
    "norm": lambda xs, p: torch.norm(xs[0]),
}


def _gap_top2(x, dims):
    """The smallest gap between the largest two (and the smallest two) values of each reduced slice."""
    x = x.detach().to(torch.float64)
    if x.dim() == 0:
        return math.inf
    dims = sorted(wrap(d, x.dim()) for d in dims)
    keep = [d for d in range(x.dim()) if d not in dims]
    y = x.permute(*(keep + dims))
    y = y.reshape(-1, max(1, math.prod(x.shape[d] for d in dims)))
    if y.shape[1] < 2 or y.numel() == 0:
        return math.inf
    s = torch.sort(y, dim=1).values
    return float(torch.minimum(s[:, -1] - s[:, -2], s[:, 1] - s[:, 0]).min())


def _all_dims(x):
    return list(range(x.dim()))


def _kink_reduce_extreme(xs, p):
    dims = p.get("dims")
    if "dim" in p:
        dims = None if p["dim"] is None else [p["dim"]]
    return _gap_top2(xs[0], _all_dims(xs[0]) if dims is None or dims == [] else dims)


KINKS = {
    "max_all": lambda xs, p: _gap_top2(xs[0], _all_dims(xs[0])),
    "min_all": lambda xs, p: _gap_top2(xs[0], _all_dims(xs[0])),
    "max_dim": lambda xs, p: _gap_top2(xs[0], [p["dim"]]),
    "min_dim": lambda xs, p: _gap_top2(xs[0], [p["dim"]]),
    "amax": _kink_reduce_extreme,
    "amin": _kink_reduce_extreme,
    "argmax": _kink_reduce_extreme,
    "argmin": _kink_reduce_extreme,
    "norm": lambda xs, p: float(xs[0].detach().norm()),
}


def _std_exact_on_constant(xs, p, res):
    """False where a reduced slice is constant but PyTorch's std of it is not exactly 0.

    Its kernels do not always get x - mean exactly 0 on a constant slice (an expanded input in
    f64, say), and then the gradient divides rounding noise by rounding noise and comes out
    O(1). Tandem's std is exactly 0 there, with a zero gradient, as PyTorch's is when its own
    std is exact: the mathematically meaningful answer. Such draws are left out.
    """
    x = xs[0].detach()
    dims = p.get("dims")
    dims = list(range(x.dim())) if dims is None or dims == [] else [wrap(d, x.dim()) for d in dims]
    r = res.detach()
    amax, amin = torch.amax(x, dim=dims, keepdim=True), torch.amin(x, dim=dims, keepdim=True)
    constant = (amax == amin).reshape(r.shape) if x.numel() else torch.zeros(r.shape, dtype=torch.bool)
    return not bool((constant & (r != 0)).any())


POSTCHECKS = {"std": _std_exact_on_constant}


def t_reduce(c):
    op = c.rng.choice(["sum", "mean", "max_all", "min_all", "max_dim", "min_dim", "amax", "amin", "argmax",
                       "argmin", "var", "std", "logsumexp", "norm"])
    extreme = op in ("max_all", "min_all", "max_dim", "min_dim", "amax", "amin", "argmax", "argmin")
    shape = rand_shape(c.rng, 1 if op in ("max_dim", "min_dim") else 0, 4, p0=0.03 if op in ("sum", "mean") else 0)
    # Expanded inputs repeat values: ties for the extreme ops.
    x = c.input(shape, allow_expand=not extreme)
    n = x.dim()
    if x.t.numel() == 0:
        c.allow_nonfinite = True  # the mean of nothing is NaN
    zero_dim_dims = c.rng.choice([[0], [-1], []]) if n == 0 else None  # a 0-dim tensor takes dim 0 or -1
    params = {}
    if op in ("sum", "mean"):
        if c.rng.random() < 0.25:
            params = {"dims": None}
        else:
            params = {"dims": rand_dims(c.rng, n, True), "keepdim": c.rng.random() < 0.5}
        if n == 0 and params["dims"] is not None:
            params["dims"] = zero_dim_dims
    elif op in ("amax", "amin", "logsumexp"):
        params = {"dims": rand_dims(c.rng, n, op != "logsumexp"), "keepdim": c.rng.random() < 0.5}
        if n == 0:
            params["dims"] = zero_dim_dims if op != "logsumexp" else [c.rng.choice([0, -1])]
    elif op in ("max_dim", "min_dim"):
        params = {"dim": neg_dim(c.rng, c.rng.randrange(n), n), "keepdim": c.rng.random() < 0.5}
    elif op in ("argmax", "argmin"):
        if c.rng.random() < 0.3 or n == 0:
            params = {"dim": None}
        else:
            params = {"dim": neg_dim(c.rng, c.rng.randrange(n), n), "keepdim": c.rng.random() < 0.5}
    elif op in ("var", "std"):
        if c.rng.random() < 0.25:
            params = {"dims": None}
        else:
            params = {"dims": rand_dims(c.rng, n, True), "correction": c.rng.choice([0, 1, 1, 2]),
                      "keepdim": c.rng.random() < 0.5}
        dims = params["dims"]
        count = math.prod(x.shape[d] for d in dims) if dims else x.t.numel()
        if count <= (1 if dims is None else params["correction"]):
            raise Reject()
    res = c.op(op, [x], **params)
    if isinstance(res, list):
        c.output(res[0])
        c.output(res[1])
    else:
        c.output(res)


def t_zero_spread(c):
    """var/std where some reduced slices are constant: the known zero-spread case (PyTorch: a
    zero std and a zero gradient)."""
    op = c.rng.choice(["var", "std"])
    rows, cols = c.rng.randint(1, 4), c.rng.randint(2, 5)
    if c.rng.random() < 0.5:
        # Constant rows made by expanding a column.
        x = c.input([rows, 1], views=False)
        x = c.op("expand", [x], shape=[rows, cols])
    else:
        # Constant rows stored as such, beside varying ones.
        const = rows // 2 + 1
        value = torch.cat([c.randn([const, 1]).expand(const, cols), c.randn([rows - const, cols])], 0)
        x = c.input([rows, cols], "given", value=value)
    correction = c.rng.choice([0, 1])
    c.output(c.op(op, [x], dims=[1], correction=correction, keepdim=c.rng.random() < 0.5))
