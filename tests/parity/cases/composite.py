# Templates across the op families: chains of random ops, long dims (past the kernels' blocks),
# inputs exactly on kinks, and how NaN and infinities propagate.

import math

import torch

from .common import MAX_MAGNITUDE, Reject, broadcast_shapes, max_abs_finite, neg_dim, rand_dims, rand_shape


CHAIN_UNARY = ["exp", "tanh", "sigmoid", "gelu", "silu", "neg", "abs", "relu", "log", "sqrt", "rsqrt", "clamp", "pow_s"]


def chain_step(c, v):
    """One random op applied to v (maybe with a fresh input); returns the new value."""
    t = v.t.detach()
    n = v.dim()
    r = c.rng.random()
    if r < 0.3:
        op = c.rng.choice(CHAIN_UNARY)
        params = {}
        if op == "gelu":
            params["tanh"] = c.rng.random() < 0.5
        if op in ("log", "sqrt", "rsqrt") and (t.numel() == 0 or float(t.min()) < 0.05):
            op = "exp" if max_abs_finite(t) < 5 else "tanh"
        if op == "exp" and t.numel() and float(t.max()) > 5:
            op = "tanh"
        if op == "clamp":
            params = {"lo": -0.5, "hi": c.rng.choice([None, 0.8])}
        if op == "pow_s":
            params = {"value": 2, "integral": True}
        return c.op(op, [v], **params)
    if r < 0.5:
        op = c.rng.choice(["add", "sub", "mul", "maximum", "minimum", "div"])
        shape = broadcast_shapes(c.rng, v.shape, 1)[0]
        w = c.input(shape, "away0" if op == "div" else "normal", requires_grad=c.rng.random() < 0.7)
        ins = [v, w] if c.rng.random() < 0.7 or op == "div" else [w, v]
        params = {"alpha": 1, "integral": True} if op in ("add", "sub") else {}
        return c.op(op, ins, **params)
    if r < 0.6:
        # The value used twice: gradients accumulate from both uses.
        if n >= 2 and v.shape[-1] == v.shape[-2] and c.rng.random() < 0.5:
            return c.op("mul", [v, c.op("transpose", [v], d0=-1, d1=-2)])
        if c.rng.random() < 0.5:
            return c.op("add", [v, v], alpha=1, integral=True)
        return c.op("mul", [v, v])
    if r < 0.72 and n >= 1:
        op = c.rng.choice(["sum", "mean", "amax", "logsumexp", "var", "softmax", "log_softmax"])
        if op in ("softmax", "log_softmax"):
            return c.op(op, [v], dim=neg_dim(c.rng, c.rng.randrange(n), n))
        dims = rand_dims(c.rng, n)
        if op == "var":
            count = math.prod(v.shape[d] for d in dims)
            if count < 2:
                raise Reject()
            return c.op(op, [v], dims=dims, correction=1, keepdim=c.rng.random() < 0.5)
        return c.op(op, [v], dims=dims, keepdim=c.rng.random() < 0.5)
    if r < 0.84 and n >= 1:
        k = v.shape[-1]
        m = c.rng.randint(1, 4)
        if c.rng.random() < 0.5:
            w = c.input([k, m], requires_grad=c.rng.random() < 0.8, scale=0.6)
            return c.op("matmul", [v, w])
        ins = [v, c.input([m, k], scale=0.6)]
        if c.rng.random() < 0.5:
            ins.append(c.input([m]))
        return c.op("linear", ins)
    if r < 0.9 and n >= 1:
        ns = v.shape[-1:]
        return c.op("layer_norm", [v, c.input(ns)], normalized_shape=ns, eps=1e-5, has_weight=True, has_bias=False)
    # a view
    if n >= 2 and c.rng.random() < 0.5:
        i, j = c.rng.sample(range(n), 2)
        return c.op("transpose", [v], d0=i, d1=j)
    if n >= 1 and c.rng.random() < 0.5:
        return c.op("unsqueeze", [v], dim=c.rng.randint(0, n))
    return c.op("reshape", [v], shape=[-1])


def t_chain(c):
    v = c.input(rand_shape(c.rng, 1, 3, max_size=4))
    for _ in range(c.rng.randint(2, 5)):
        v = chain_step(c, v)
        t = v.t.detach()
        if t.numel() and (not bool(torch.isfinite(t).all()) or float(t.abs().max()) > MAX_MAGNITUDE):
            raise Reject()
    c.output(v)


def big_shape(rng, max_numel=4096):
    """Longer dims than the other templates draw: runs past the kernels' blocks of 8, tails,
    pairwise-summation blocks and the GEMM paths that small sizes never reach."""
    while True:
        shape = [rng.choice([1, 3, 7, 8, 9, 16, 17, 31, 33, 64, 65, 130]) for _ in range(rng.randint(1, 3))]
        if math.prod(shape) <= max_numel:
            return shape


def t_big(c):
    op = c.rng.choice(["unary", "binary", "sum", "mean", "var", "std", "logsumexp", "amax", "softmax",
                       "log_softmax", "layer_norm", "matmul", "linear", "cross_entropy", "gather", "cat"])
    shape = big_shape(c.rng)
    n = len(shape)
    if op == "unary":
        name = c.rng.choice(["exp", "tanh", "sigmoid", "gelu", "silu", "log", "sqrt", "abs", "relu"])
        kind = {"log": "positive", "sqrt": "positive", "abs": "away0", "relu": "away0"}.get(name, "normal")
        x = c.input(shape, kind)
        c.output(c.op(name, [x], **({"tanh": c.rng.random() < 0.5} if name == "gelu" else {})))
    elif op == "binary":
        sa, sb = broadcast_shapes(c.rng, shape, 2)
        name = c.rng.choice(["add", "sub", "mul", "div", "maximum"])
        a = c.input(sa)
        b = c.input(sb, "away0" if name == "div" else "normal")
        c.output(c.op(name, [a, b], **({"alpha": 1, "integral": True} if name in ("add", "sub") else {})))
    elif op in ("sum", "mean", "logsumexp", "amax"):
        x = c.input(shape, allow_expand=op != "amax")
        c.output(c.op(op, [x], dims=rand_dims(c.rng, n), keepdim=c.rng.random() < 0.5))
    elif op in ("var", "std"):
        x = c.input(shape)
        dims = rand_dims(c.rng, n)
        if math.prod(shape[d] for d in dims) < 3:
            raise Reject()
        c.output(c.op(op, [x], dims=dims, correction=c.rng.choice([0, 1]), keepdim=c.rng.random() < 0.5))
    elif op in ("softmax", "log_softmax"):
        x = c.input(shape, scale=2.0)
        c.output(c.op(op, [x], dim=neg_dim(c.rng, c.rng.randrange(n), n)))
    elif op == "layer_norm":
        k = c.rng.randint(1, n)
        ns = shape[n - k:]
        x = c.input(shape)
        c.output(c.op("layer_norm", [x, c.input(ns), c.input(ns)], normalized_shape=ns, eps=1e-5, has_weight=True,
                      has_bias=True))
    elif op in ("matmul", "linear"):
        m, k, nn = (c.rng.choice([1, 7, 16, 33, 64]) for _ in range(3))
        batch = [c.rng.choice([1, 2, 3])] if c.rng.random() < 0.5 else []
        a = c.input(batch + [m, k], scale=0.5)
        if op == "matmul":
            c.output(c.op("matmul", [a, c.input([k, nn], scale=0.5)]))
        else:
            c.output(c.op("linear", [a, c.input([nn, k], scale=0.5), c.input([nn])]))
    elif op == "cross_entropy":
        rows, classes = c.rng.choice([1, 17, 64, 200]), c.rng.choice([2, 9, 33, 100])
        logits = c.input([rows, classes], scale=2.0)
        t = torch.randint(0, classes, [rows], generator=c.gen, dtype=torch.int64)
        target = c.input([rows], "given", value=t, dtype="i64", requires_grad=False)
        c.output(c.op("cross_entropy", [logits, target], reduction=c.rng.choice(["mean", "sum", "none"]),
                      ignore_index=c.rng.choice([-100, 0]), label_smoothing=c.rng.choice([0.0, 0.1])))
    elif op == "gather":
        x = c.input(shape)
        d = c.rng.randrange(n)
        idx = c.index([c.rng.randint(1, 2 * shape[k]) if k == d else shape[k] for k in range(n)], shape[d])
        c.output(c.op("gather", [x, idx], dim=d))
    else:
        d = c.rng.randrange(n)
        parts = []
        for _ in range(c.rng.randint(2, 3)):
            s2 = list(shape)
            s2[d] = c.rng.choice([1, 8, 17])
            parts.append(c.input(s2))
        c.output(c.op("cat", parts, dim=d))


def t_ties(c):
    """Inputs exactly on kinks (small integers: ties are exact in both libraries), where the
    gradient is a convention: PyTorch's, unless listed as Tandem's deliberate choice."""
    c.at_kinks = True
    shape = rand_shape(c.rng, 1, 3, max_size=4)
    n = len(shape)
    op = c.rng.choice(["relu", "abs", "clamp", "maximum", "minimum", "max_all", "min_all", "amax", "amin",
                       "max_dim", "min_dim", "argmax", "argmin", "clamp_t"])
    x = c.input(shape, "int", lo=-1, hi=2, allow_expand=True)
    if op == "clamp":
        c.output(c.op(op, [x], lo=0.0, hi=1.0))
    elif op in ("maximum", "minimum"):
        c.output(c.op(op, [x, c.input(broadcast_shapes(c.rng, shape, 1)[0], "int", lo=-1, hi=2)]))
    elif op == "clamp_t":
        lo = c.input(broadcast_shapes(c.rng, shape, 1)[0], "int", lo=-1, hi=1)
        hi = c.input(broadcast_shapes(c.rng, shape, 1)[0], "int", lo=0, hi=2)
        c.output(c.op(op, [x, lo, hi], has_lo=True, has_hi=True))
    elif op in ("amax", "amin"):
        c.output(c.op(op, [x], dims=rand_dims(c.rng, n), keepdim=c.rng.random() < 0.5))
    elif op in ("max_dim", "min_dim"):
        for o in c.op(op, [x], dim=neg_dim(c.rng, c.rng.randrange(n), n), keepdim=c.rng.random() < 0.5):
            c.output(o)
    elif op in ("argmax", "argmin"):
        if c.rng.random() < 0.6:
            c.output(c.op(op, [x], dim=c.rng.randrange(n), keepdim=False))
        else:
            c.output(c.op(op, [x], dim=None))
    else:
        c.output(c.op(op, [x]))


def t_nan(c):
    """Forward only: how NaN and infinities propagate through kinked ops and reductions."""
    c.allow_nonfinite = True
    shape = rand_shape(c.rng, 1, 3)
    x = c.input(shape, "special", requires_grad=False)
    op = c.rng.choice(["relu", "clamp", "maximum", "minimum", "max_all", "min_all", "amax", "sum", "exp", "tanh",
                       "sigmoid", "abs", "softmax", "logsumexp"])
    if op == "clamp":
        c.output(c.op(op, [x], lo=-0.5, hi=0.5))
    elif op in ("maximum", "minimum"):
        c.output(c.op(op, [x, c.input(shape, "special", requires_grad=False)]))
    elif op in ("amax", "logsumexp"):
        c.output(c.op(op, [x], dims=[-1], keepdim=False))
    elif op == "sum":
        c.output(c.op(op, [x], dims=[0], keepdim=False))
    elif op == "softmax":
        c.output(c.op(op, [x], dim=-1))
    else:
        c.output(c.op(op, [x]))
