# Arguments PyTorch refuses, across the op families: Tandem must throw a tandem::Error.

import math

import torch

from .common import neg_dim, rand_shape


def t_errors(c):
    """Arguments PyTorch refuses: Tandem must throw (a tandem::Error, not a crash or a result)."""
    kind = c.rng.choice(["broadcast", "matmul", "mm", "bmm", "linear", "gather", "index_select", "embedding",
                         "scatter_add", "cross_entropy", "nll_loss", "narrow", "select", "transpose", "permute",
                         "expand", "view", "reshape", "squeeze", "unsqueeze", "amax_empty", "max_dim_empty",
                         "argmax_empty", "cat", "stack", "softmax", "layer_norm", "where", "masked_fill",
                         "softmax_int", "matmul_int", "inplace_overlap", "inplace_cast", "inplace_broadcast",
                         "mean_int", "var_int", "triangle_1d", "topk_k"])
    shape = rand_shape(c.rng, 2, 3, p1=0.0)
    n = len(shape)
    r = c.rng.randrange
    if kind == "broadcast":
        bad = list(shape)
        bad[r(n)] += 1
        c.op_error(c.rng.choice(["add", "mul", "maximum"]), [c.input(shape), c.input(bad)],
                   **{"alpha": 1, "integral": True})
    elif kind == "matmul":
        c.op_error("matmul", [c.input([2, 3]), c.input([4, 2])])
    elif kind == "mm":
        c.op_error("mm", [c.input([2, 2, 3]), c.input([3, 2])])
    elif kind == "bmm":
        c.op_error("bmm", [c.input([2, 2, 3]), c.input([3, 3, 2])])
    elif kind == "linear":
        c.op_error("linear", [c.input([2, 3]), c.input([4, 2])])
    elif kind in ("gather", "index_select", "scatter_add", "embedding"):
        d = r(n)
        bad = shape[d] + r(3) if c.rng.random() < 0.7 else -shape[d] - 1 - r(3)
        if kind == "embedding":
            w = c.input([shape[0], 2])
            idx = c.input([3], "given", value=torch.tensor([0, bad % 1000 if bad > 0 else bad, 0]), dtype="i64",
                          requires_grad=False)
            c.op_error("embedding", [w, idx])
            return
        a = c.input(shape)
        ishape = [1] * n if kind != "index_select" else [3]
        value = torch.zeros(ishape, dtype=torch.int64)
        value.view(-1)[0] = bad
        idx = c.input(ishape, "given", value=value, dtype="i64", requires_grad=False)
        if kind == "scatter_add":
            c.op_error(kind, [a, idx, c.input(ishape)], dim=d)
        else:
            c.op_error(kind, [a, idx], dim=d)
    elif kind in ("cross_entropy", "nll_loss"):
        classes = c.rng.randint(2, 4)
        t = torch.tensor([0, classes + r(3) if c.rng.random() < 0.7 else -1 - r(3)])
        target = c.input([2], "given", value=t, dtype="i64", requires_grad=False)
        p = {"reduction": "mean", "ignore_index": -100}
        if kind == "cross_entropy":
            p["label_smoothing"] = 0.0
        c.op_error(kind, [c.input([2, classes]), target], **p)
    elif kind == "narrow":
        d = r(n)
        c.op_error("narrow", [c.input(shape)], dim=d, start=r(shape[d]), length=shape[d] + 1)
    elif kind == "select":
        d = r(n)
        c.op_error("select", [c.input(shape)], dim=d, index=shape[d] + r(2) if c.rng.random() < 0.5 else -shape[d] - 1)
    elif kind == "transpose":
        c.op_error("transpose", [c.input(shape)], d0=0, d1=n + r(2))
    elif kind == "permute":
        c.op_error("permute", [c.input(shape)], dims=[0] * n)
    elif kind == "expand":
        bad = list(shape)
        bad[r(n)] += 1
        c.op_error("expand", [c.input(shape, views=False)], shape=bad)
    elif kind == "view":
        # A transposed tensor cannot be viewed flat.
        x = c.input(shape, views=False)
        c.op_error("view", [c.op("transpose", [x], d0=0, d1=n - 1)], shape=[-1])
    elif kind == "reshape":
        c.op_error("reshape", [c.input(shape)], shape=[math.prod(shape) + 1])
    elif kind == "squeeze":
        c.op_error("squeeze", [c.input(shape)], dim=n + r(2))
    elif kind == "unsqueeze":
        c.op_error("unsqueeze", [c.input(shape)], dim=n + 1 + r(2))
    elif kind in ("amax_empty", "max_dim_empty", "argmax_empty"):
        empty = list(shape)
        empty[0] = 0
        x = c.input(empty)
        if kind == "amax_empty":
            c.op_error("amax", [x], dims=[0], keepdim=False)
        elif kind == "max_dim_empty":
            c.op_error("max_dim", [x], dim=0, keepdim=False)
        else:
            c.op_error("argmax", [x], dim=None)
    elif kind in ("cat", "stack"):
        other = list(shape)
        other[r(n - 1) + 1 if kind == "cat" else r(n)] += 1
        c.op_error(kind, [c.input(shape), c.input(other)], dim=0)
    elif kind == "softmax":
        c.op_error("softmax", [c.input(shape)], dim=n + r(2))
    elif kind == "layer_norm":
        ns = [shape[-1] + 1]
        c.op_error("layer_norm", [c.input(shape)], normalized_shape=ns, eps=1e-5, has_weight=False, has_bias=False)
    elif kind == "where":
        # The condition must be bool.
        c.op_error("where", [c.input(shape, requires_grad=False), c.input(shape), c.input(shape)])
    elif kind == "masked_fill":
        c.op_error("masked_fill", [c.input(shape), c.input(shape, "int", dtype="i64", lo=0, hi=2)], value=1.0,
                   integral=False)
    elif kind == "softmax_int":
        c.op_error(c.rng.choice(["softmax", "log_softmax"]), [c.input(shape, "int", dtype="i64", lo=-2, hi=3)],
                   dim=-1)
    elif kind == "matmul_int":  # PyTorch does not promote matrix products
        c.op_error("matmul", [c.input([2, 3]), c.input([3, 2], "int", dtype="i64", lo=-2, hi=3)])
    elif kind == "inplace_overlap":
        # Several elements of the destination share memory.
        x = c.input([1] + shape[1:], requires_grad=False, views=False)
        dest = c.op("expand", [x], shape=shape)
        c.op_error(c.rng.choice(["add_s_", "mul_s_", "fill_"]), [dest], value=2, integral=True)
    elif kind == "inplace_cast":
        # An integer destination cannot hold a floating result.
        c.op_error(c.rng.choice(["add_s_", "mul_s_", "div_s_"]), [c.input(shape, "int", dtype="i64", lo=-2, hi=3)],
                   value=1.5 if c.rng.random() < 0.7 else 2, integral=False)
    elif kind in ("mean_int", "var_int"):
        x = c.input(shape, "int", dtype=c.rng.choice(["i64", "i32"]), lo=-2, hi=3)
        if kind == "mean_int":
            c.op_error("mean", [x], dims=None)
        else:
            c.op_error("var", [x], dims=[0], correction=1, keepdim=False)
    elif kind == "triangle_1d":  # a vector or a 0-dim tensor has no triangle
        c.op_error(c.rng.choice(["tril", "triu"]), [c.input(shape[:r(2)])], diagonal=r(3) - 1)
    elif kind == "topk_k":  # k beyond the size of the dim
        d = r(n)
        c.op_error("topk", [c.input(shape)], k=shape[d] + 1 + r(2), dim=neg_dim(c.rng, d, n), largest=True,
                   sorted=True)
    else:  # inplace_broadcast: the destination cannot grow
        c.op_error("add_", [c.input(shape[1:], requires_grad=False), c.input(shape, requires_grad=False)], alpha=1,
                   integral=True)
