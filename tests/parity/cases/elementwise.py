# Elementwise ops: unary, binary, with a Scalar, comparisons and logic, where, clamp with tensor
# bounds, masked_fill, dtype conversion; their kinks, and their templates.

import math

import torch
import torch.nn.functional as F

from .common import DTYPES, broadcast_shapes, opt_input, rand_shape, scalar_value


def _clamp_tensors(xs, p):
    rest = list(xs[1:])
    lo = opt_input(rest, p, "has_lo")
    hi = opt_input(rest, p, "has_hi")
    return torch.clamp(xs[0], min=lo, max=hi)


def _where_scalar(xs, p):
    """where with a Scalar for either branch (or both): p["a"] / p["b"] hold them, null for a tensor."""
    rest = list(xs[1:])
    a = rest.pop(0) if p["a"] is None else (int(p["a"]) if p["a_integral"] else float(p["a"]))
    b = rest.pop(0) if p["b"] is None else (int(p["b"]) if p["b_integral"] else float(p["b"]))
    return torch.where(xs[0], a, b)


class _Gelu(torch.autograd.Function):
    """F.gelu with its backward given a contiguous gradient: PyTorch 1.13's f32 CPU kernel for
    the exact (erf) GELU's backward reads a non-contiguous upstream gradient wrongly (off by
    ~3e4, or garbage that changes from run to run). The derivative is still PyTorch's own."""

    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return F.gelu(x, approximate=approximate)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            xx = x.detach().requires_grad_()
            (gx,) = torch.autograd.grad(F.gelu(xx, approximate=ctx.approximate), xx, g.contiguous())
        return gx, None


OPS = {
    "add": lambda xs, p: torch.add(xs[0], xs[1], alpha=scalar_value(p, "alpha")),
    "sub": lambda xs, p: torch.sub(xs[0], xs[1], alpha=scalar_value(p, "alpha")),
    "mul": lambda xs, p: torch.mul(xs[0], xs[1]),
    "div": lambda xs, p: torch.div(xs[0], xs[1]),
    "maximum": lambda xs, p: torch.maximum(xs[0], xs[1]),
    "minimum": lambda xs, p: torch.minimum(xs[0], xs[1]),
    "pow": lambda xs, p: torch.pow(xs[0], xs[1]),
    "add_s": lambda xs, p: xs[0] + scalar_value(p, "value"),
    "sub_s": lambda xs, p: xs[0] - scalar_value(p, "value"),
    "mul_s": lambda xs, p: xs[0] * scalar_value(p, "value"),
    "div_s": lambda xs, p: xs[0] / scalar_value(p, "value"),
    "rsub_s": lambda xs, p: scalar_value(p, "value") - xs[0],
    "s_div": lambda xs, p: scalar_value(p, "value") / xs[0],
    "pow_s": lambda xs, p: torch.pow(xs[0], scalar_value(p, "value")),
    "neg": lambda xs, p: torch.neg(xs[0]),
    "abs": lambda xs, p: torch.abs(xs[0]),
    "exp": lambda xs, p: torch.exp(xs[0]),
    "log": lambda xs, p: torch.log(xs[0]),
    "sqrt": lambda xs, p: torch.sqrt(xs[0]),
    "rsqrt": lambda xs, p: torch.rsqrt(xs[0]),
    "tanh": lambda xs, p: torch.tanh(xs[0]),
    "sigmoid": lambda xs, p: torch.sigmoid(xs[0]),
    "relu": lambda xs, p: torch.relu(xs[0]),
    "gelu": lambda xs, p: _Gelu.apply(xs[0], "tanh" if p["tanh"] else "none"),
    "silu": lambda xs, p: F.silu(xs[0]),
    "clamp": lambda xs, p: torch.clamp(xs[0], min=p["lo"], max=p["hi"]),
    "where": lambda xs, p: torch.where(xs[0], xs[1], xs[2]),
    "where_s": _where_scalar,
    "clamp_t": _clamp_tensors,
    "masked_fill": lambda xs, p: xs[0].masked_fill(xs[1], scalar_value(p, "value")),
    "to_dtype": lambda xs, p: xs[0].to(DTYPES[p["dtype"]]),
    "eq": lambda xs, p: torch.eq(xs[0], xs[1]),
    "ne": lambda xs, p: torch.ne(xs[0], xs[1]),
    "lt": lambda xs, p: torch.lt(xs[0], xs[1]),
    "le": lambda xs, p: torch.le(xs[0], xs[1]),
    "gt": lambda xs, p: torch.gt(xs[0], xs[1]),
    "ge": lambda xs, p: torch.ge(xs[0], xs[1]),
    "eq_s": lambda xs, p: torch.eq(xs[0], scalar_value(p, "value")),
    "ne_s": lambda xs, p: torch.ne(xs[0], scalar_value(p, "value")),
    "lt_s": lambda xs, p: torch.lt(xs[0], scalar_value(p, "value")),
    "le_s": lambda xs, p: torch.le(xs[0], scalar_value(p, "value")),
    "gt_s": lambda xs, p: torch.gt(xs[0], scalar_value(p, "value")),
    "ge_s": lambda xs, p: torch.ge(xs[0], scalar_value(p, "value")),
    "logical_and": lambda xs, p: torch.logical_and(xs[0], xs[1]),
    "logical_or": lambda xs, p: torch.logical_or(xs[0], xs[1]),
    "logical_xor": lambda xs, p: torch.logical_xor(xs[0], xs[1]),
    "logical_not": lambda xs, p: torch.logical_not(xs[0]),
    "isnan": lambda xs, p: torch.isnan(xs[0]),
    "isinf": lambda xs, p: torch.isinf(xs[0]),
}


def _min_abs(t):
    t = t.detach()
    return math.inf if t.numel() == 0 else float(t.abs().min())


def _kink_clamp(xs, p):
    x = xs[0].detach()
    d = math.inf
    if p["lo"] is not None:
        d = min(d, _min_abs(x - p["lo"]))
    if p["hi"] is not None:
        d = min(d, _min_abs(x - p["hi"]))
    return d


def _kink_clamp_tensors(xs, p):
    """Distances of a to each bound, and between the bounds (where they cross, hi wins)."""
    rest = list(xs[1:])
    lo = opt_input(rest, p, "has_lo")
    hi = opt_input(rest, p, "has_hi")
    d = math.inf
    for bound in (lo, hi):
        if bound is not None:
            d = min(d, _min_abs(xs[0] - bound))
    if lo is not None and hi is not None:
        d = min(d, _min_abs(lo - hi))
    return d


def _kink_pow_s(xs, p):
    e = p["value"]
    if float(e).is_integer():
        return _min_abs(xs[0]) if e < 0 else math.inf
    return float(xs[0].detach().min()) if xs[0].numel() else math.inf


KINKS = {
    "abs": lambda xs, p: _min_abs(xs[0]),
    "relu": lambda xs, p: _min_abs(xs[0]),
    "clamp": _kink_clamp,
    "clamp_t": _kink_clamp_tensors,
    "maximum": lambda xs, p: _min_abs(xs[0].detach() - xs[1].detach()),
    "minimum": lambda xs, p: _min_abs(xs[0].detach() - xs[1].detach()),
    "log": lambda xs, p: float(xs[0].detach().min()) if xs[0].numel() else math.inf,
    "sqrt": lambda xs, p: float(xs[0].detach().min()) if xs[0].numel() else math.inf,
    "rsqrt": lambda xs, p: float(xs[0].detach().min()) if xs[0].numel() else math.inf,
    "pow": lambda xs, p: float(xs[0].detach().min()) if xs[0].numel() else math.inf,
    "pow_s": _kink_pow_s,
    # Division: denominators at least 0.05 from zero (MARGIN / 0.02).
    "div": lambda xs, p: _min_abs(xs[1]) * 0.02,
    "s_div": lambda xs, p: _min_abs(xs[0]) * 0.02,
}

# Comparisons are kinks too when they compare computed (not loaded) values; the templates only
# feed them loaded tensors, whose values are the same bits in PyTorch and Tandem.


UNARY = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "silu", "clamp", "pow_s"]


def t_unary(c):
    op = c.rng.choice(UNARY)
    shape = rand_shape(c.rng, 0, 4, p0=0.03)
    params = {}
    kind = {"log": "positive", "sqrt": "positive", "rsqrt": "positive", "abs": "away0",
            "relu": "away0"}.get(op, "normal")
    if op == "gelu":
        params["tanh"] = c.rng.random() < 0.5
    if op == "clamp":
        lo = c.rng.choice([None, -0.5, -1.0, 0.0, 0.3])
        hi = c.rng.choice([None, 0.5, 1.2, 0.0]) if lo is not None else c.rng.choice([0.5, 1.2, 0.0])
        if lo is not None and hi is not None and hi < lo:
            lo, hi = hi, lo
        params = {"lo": lo, "hi": hi}
    if op == "pow_s":
        e = c.rng.choice([2, 3, -1, 0, 1, 0.5, 1.5, -0.5, 2.5, -2])
        params = {"value": e, "integral": isinstance(e, int) and c.rng.random() < 0.5}
        kind = "positive" if not float(e).is_integer() else "away0" if e < 0 else "normal"
    x = c.input(shape, kind)
    c.output(c.op(op, [x], **params))


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"]


def t_binary(c):
    op = c.rng.choice(BINARY)
    out = rand_shape(c.rng, 0, 4, p0=0.02)
    sa, sb = broadcast_shapes(c.rng, out, 2)
    kinds = {"div": ("normal", "away0"), "pow": ("positive", "normal")}.get(op, ("normal", "normal"))
    a = c.input(sa, kinds[0], requires_grad=c.rng.random() < 0.9)
    b = c.input(sb, kinds[1], requires_grad=c.rng.random() < 0.8 or not c.leaves, scale=0.7)
    params = {}
    if op in ("add", "sub"):
        alpha = c.rng.choice([1, 1, 2, -0.5, 0.25])
        params = {"alpha": alpha, "integral": isinstance(alpha, int)}
    c.output(c.op(op, [a, b], **params))


SCALAR = ["add_s", "sub_s", "mul_s", "div_s", "rsub_s", "s_div"]


def t_scalar(c):
    op = c.rng.choice(SCALAR)
    value = c.rng.choice([2, -3, 0.5, -1.25, 3.0])
    if op == "div_s" and value == 0:
        value = 2
    x = c.input(rand_shape(c.rng, 0, 4), "away0" if op == "s_div" else "normal")
    c.output(c.op(op, [x], value=value, integral=isinstance(value, int)))


COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]


def t_compare(c):
    """Comparisons and logic on loaded values (small integers in floating form, so ties are exact)."""
    out = rand_shape(c.rng, 0, 4)
    r = c.rng.random()
    if r < 0.45:
        sa, sb = broadcast_shapes(c.rng, out, 2)
        dt = c.rng.choice([None, None, "i64", "i32"])
        a = c.input(sa, "int", dtype=dt, requires_grad=False, lo=-2, hi=3)
        b = c.input(sb, "int", dtype=c.rng.choice([dt, None]), requires_grad=False, lo=-2, hi=3)
        c.output(c.op(c.rng.choice(COMPARE), [a, b]))
    elif r < 0.6:
        a = c.input(out, "int", requires_grad=False, lo=-2, hi=3)
        v = c.rng.choice([0, 1, -1.0, 0.5, 2])
        c.output(c.op(c.rng.choice(COMPARE) + "_s", [a], value=v, integral=isinstance(v, int)))
    elif r < 0.8:
        sa, sb = broadcast_shapes(c.rng, out, 2)
        a = c.input(sa, "bool", dtype="bool")
        b = c.input(sb, "bool", dtype="bool")
        op = c.rng.choice(["logical_and", "logical_or", "logical_xor"])
        c.output(c.op(op, [a, b]))
        c.output(c.op("logical_not", [a]))
    else:
        a = c.input(out, "special", requires_grad=False)
        c.allow_nonfinite = True
        c.output(c.op(c.rng.choice(["isnan", "isinf"]), [a]))


def t_where(c):
    out = rand_shape(c.rng, 0, 4)
    if c.rng.random() < 0.6:
        sc, sa, sb = broadcast_shapes(c.rng, out, 3)
        if c.rng.random() < 0.5:
            cond = c.input(sc, "bool", dtype="bool")
        else:
            # A condition computed from loaded values: exact in both libraries.
            p = c.input(sc, "int", requires_grad=False, lo=-2, hi=3)
            q = c.input(sc, "int", requires_grad=False, lo=-2, hi=3)
            cond = c.op(c.rng.choice(COMPARE), [p, q])
        r = c.rng.random()
        if r < 0.7:
            a = c.input(sa)
            b = c.input(sb, requires_grad=c.rng.random() < 0.7)
            c.output(c.op("where", [cond, a, b]))
        else:
            # A Scalar branch (or two): the result takes cond's shape when both are Scalars.
            scalars = [c.rng.choice([1, -2, 0.5, 2.25]) for _ in range(2)]
            which = c.rng.choice(["a", "b", "both"])
            p = {"a": scalars[0] if which in ("a", "both") else None,
                 "b": scalars[1] if which in ("b", "both") else None}
            p["a_integral"] = isinstance(p["a"], int)
            p["b_integral"] = isinstance(p["b"], int)
            ins = [cond]
            if p["a"] is None:
                ins.append(c.input(sa, dtype=c.rng.choice([None, None, "i64"])))
            if p["b"] is None:
                ins.append(c.input(sb, dtype=c.rng.choice([None, None, "i64"])))
            c.output(c.op("where_s", ins, **p))
    else:
        a = c.input(out)
        mask = c.input(broadcast_shapes(c.rng, out, 1, p_drop=0.3)[0], "bool", dtype="bool")
        v = c.rng.choice([0.0, -1.5, 2])
        c.output(c.op("masked_fill", [a, mask], value=v, integral=isinstance(v, int)))


def t_clamp_tensor(c):
    """clamp with tensor bounds, broadcast together; bounds sometimes crossed (hi wins there)."""
    out = rand_shape(c.rng, 0, 3)
    sa, sl, sh = broadcast_shapes(c.rng, out, 3)
    which = c.rng.choice(["lo", "hi", "both", "both"])
    flags = {"has_lo": which in ("lo", "both"), "has_hi": which in ("hi", "both")}
    ins = [c.input(sa)]
    if flags["has_lo"]:
        ins.append(c.input(sl, "uniform", lo=-1.0, hi=0.3, requires_grad=c.rng.random() < 0.7))
    if flags["has_hi"]:
        ins.append(c.input(sh, "uniform", lo=-0.3, hi=1.0, requires_grad=c.rng.random() < 0.7))
    c.output(c.op("clamp_t", ins, **flags))
