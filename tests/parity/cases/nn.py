# nn functional: softmax, log_softmax, layer_norm, dropout, embedding, batch_norm, the losses;
# their kinks (normalising near-constant slices), and their templates.

import math

import torch
import torch.nn.functional as F

from .common import neg_dim, opt_input, rand_shape


def _layer_norm(xs, p):
    x = xs[0]
    rest = list(xs[1:])
    w = opt_input(rest, p, "has_weight")
    b = opt_input(rest, p, "has_bias")
    return F.layer_norm(x, p["normalized_shape"], w, b, p["eps"])


def _batch_norm(xs, p):
    rest = list(xs)
    x = rest.pop(0)
    w = opt_input(rest, p, "affine")
    b = opt_input(rest, p, "affine")
    if p["track_running_stats"]:
        rm, rv = rest[0].clone(), rest[1].clone()
    else:
        rm = rv = None
    # A fresh module's first batch: momentum None (a cumulative average) weighs it by 1.
    momentum = 1.0 if p["momentum"] is None else p["momentum"]
    # PyTorch 1.13's CPU batch_norm backward reads a strided or expanded weight as if it were
    # contiguous (grad_input from the wrong elements, ~1e-321 garbage for a stride-0 weight);
    # a contiguous copy (whose backward routes the gradient back to the view) avoids that.
    if w is not None:
        w = w.contiguous()
    use_batch_stats = p["training"] or not p["track_running_stats"]
    y = F.batch_norm(x, rm, rv, w, b, use_batch_stats, momentum, p["eps"])
    if p["track_running_stats"]:
        if not p["training"]:
            return [y]
        return [y, rm, rv]
    return [y]


def _cross_entropy(xs, p):
    w = xs[2] if p.get("has_weight", False) else None
    return F.cross_entropy(xs[0], xs[1], weight=w, ignore_index=p["ignore_index"], reduction=p["reduction"],
                           label_smoothing=p["label_smoothing"])


def _nll_loss(xs, p):
    w = xs[2] if p.get("has_weight", False) else None
    return F.nll_loss(xs[0], xs[1], weight=w, ignore_index=p["ignore_index"], reduction=p["reduction"])


OPS = {
    "softmax": lambda xs, p: torch.softmax(xs[0], p["dim"]),
    "log_softmax": lambda xs, p: torch.log_softmax(xs[0], p["dim"]),
    "layer_norm": _layer_norm,
    "dropout": lambda xs, p: F.dropout(xs[0], p["p"], p["training"]),
    "embedding": lambda xs, p: F.embedding(xs[1], xs[0]),
    "batch_norm1d": _batch_norm,
    "cross_entropy": _cross_entropy,
    "nll_loss": _nll_loss,
    "mse_loss": lambda xs, p: F.mse_loss(xs[0], xs[1], reduction=p["reduction"]),
}


def _slice_std(x, dims):
    """The smallest (biased) standard deviation over the slices that `dims` reduce."""
    if x.numel() == 0:
        return math.inf
    return float(x.var(dim=dims, unbiased=False).sqrt().min())


def _kink_layer_norm(xs, p):
    k = len(p["normalized_shape"])
    return _slice_std(xs[0], list(range(xs[0].dim() - k, xs[0].dim()))) * 0.02


def _kink_batch_norm(xs, p):
    if not p["training"] and p["track_running_stats"]:
        return math.inf  # normalised by the given running statistics
    return _slice_std(xs[0], [0] + ([2] if xs[0].dim() == 3 else [])) * 0.02


KINKS = {
    # Normalising a near-constant slice divides the rounding of x - mean by sqrt(var + eps): slices
    # need a standard deviation of at least 0.05 (MARGIN / 0.02). On an exactly constant f32 slice
    # the answer is 0, and neither library's mean is exact there: layer_norm outputs up to 6e-5
    # (PyTorch) and 1.5e-4 (Tandem) in place of 0 at eps 1e-5, in unrelated directions.
    "layer_norm": _kink_layer_norm,
    "batch_norm1d": _kink_batch_norm,
}


def t_softmax(c):
    op = c.rng.choice(["softmax", "log_softmax"])
    shape = rand_shape(c.rng, 0, 4)
    x = c.input(shape, scale=2.0)
    n = x.dim()
    d = neg_dim(c.rng, c.rng.randrange(n), n) if n else 0
    c.output(c.op(op, [x], dim=d))


def t_layer_norm(c):
    shape = rand_shape(c.rng, 1, 4, p1=0.15)
    k = c.rng.randint(1, len(shape))
    ns = shape[len(shape) - k:]
    x = c.input(shape, scale=c.rng.choice([1.0, 3.0]))
    ins = [x]
    flags = {"has_weight": c.rng.random() < 0.7, "has_bias": c.rng.random() < 0.6}
    if flags["has_weight"]:
        ins.append(c.input(ns, requires_grad=c.rng.random() < 0.9))
    if flags["has_bias"]:
        ins.append(c.input(ns, requires_grad=c.rng.random() < 0.9))
    eps = c.rng.choice([1e-5, 1e-5, 1e-3, 0.1])
    c.output(c.op("layer_norm", ins, normalized_shape=ns, eps=eps, **flags))


def t_dropout_embedding(c):
    if c.rng.random() < 0.4:
        # Dropout is deterministic only as the identity: eval mode, or p = 0.
        x = c.input(rand_shape(c.rng, 0, 3))
        training = c.rng.random() < 0.5
        c.output(c.op("dropout", [x], p=0.0 if training else c.rng.choice([0.0, 0.3, 0.9]), training=training))
    else:
        rows, dim = c.rng.randint(1, 6), c.rng.randint(1, 4)
        w = c.input([rows, dim])
        idx = c.index(rand_shape(c.rng, 0, 2, max_size=6), rows, dtype=c.rng.choice(["i64", "i64", "i32"]))
        c.output(c.op("embedding", [w, idx]))


def t_batch_norm(c):
    ch = c.rng.randint(1, 4)
    three = c.rng.random() < 0.5
    shape = [c.rng.randint(2, 4), ch] + ([c.rng.randint(1, 3)] if three else [])
    x = c.input(shape)
    p = {"training": c.rng.random() < 0.7, "affine": c.rng.random() < 0.7, "track_running_stats": c.rng.random() < 0.7,
         "momentum": c.rng.choice([0.1, 0.5, None]), "eps": c.rng.choice([1e-5, 1e-3])}
    ins = [x]
    if p["affine"]:
        ins += [c.input([ch]), c.input([ch])]
    if p["track_running_stats"]:
        ins += [c.input([ch], requires_grad=False, views=False),
                c.input([ch], "positive", requires_grad=False, views=False)]
    outs = c.op("batch_norm1d", ins, **p)
    for o in outs:
        c.output(o)


def t_loss(c):
    op = c.rng.choice(["cross_entropy", "cross_entropy", "cross_entropy_probs", "nll_loss", "mse_loss"])
    if op == "mse_loss":
        shape = rand_shape(c.rng, 0, 3)
        a = c.input(shape)
        b = c.input(shape, requires_grad=c.rng.random() < 0.5)
        c.output(c.op("mse_loss", [a, b], reduction=c.rng.choice(["none", "mean", "sum"])))
        return
    classes = c.rng.randint(1, 5)
    form = c.rng.choice(["nc", "nc", "ncd", "c"])
    n = c.rng.randint(1, 4)
    extra = [c.rng.randint(1, 3)] if form == "ncd" else []
    lshape = [classes] if form == "c" else [n, classes] + extra
    tshape = [] if form == "c" else [n] + extra
    logits = c.input(lshape, scale=2.0)
    reduction = c.rng.choice(["none", "mean", "sum", "mean"])
    ignore = c.rng.choice([-100, -100, 0, 1]) if classes > 1 else -100
    p = {"reduction": reduction, "ignore_index": ignore}
    if op == "cross_entropy_probs":
        probs = torch.softmax(c.randn(lshape) * 2, dim=0 if form == "c" else 1).to(c.fdt)
        target = c.input(lshape, "given", value=probs, requires_grad=False)
        op = "cross_entropy"
    else:
        lo = -1 if ignore == -100 and c.rng.random() < 0.3 else 0
        t = torch.randint(lo, classes, tshape, generator=c.gen, dtype=torch.int64)
        t = torch.where(t < 0, torch.tensor(ignore), t)
        if c.rng.random() < 0.08 and reduction == "mean":
            # Every target ignored: the mean is 0/0 (NaN) and the gradient is zero.
            t = torch.full(tshape, ignore, dtype=torch.int64)
            c.allow_nonfinite = True
        target = c.input(tshape, "given", value=t, dtype="i64", requires_grad=False)
    ins = [logits, target]
    if c.rng.random() < 0.4:
        p["has_weight"] = True
        ins.append(c.input([classes], "positive", requires_grad=False))
    if op == "cross_entropy":
        p["label_smoothing"] = c.rng.choice([0.0, 0.0, 0.1, 0.3])
    c.output(c.op(op, ins, **p))
