# Dtypes: type promotion across mixed operands (0-dim ones included), and f16/bf16 conversions and
# arithmetic. Their ops are the other families'.

import math

import torch

from .common import DTYPE_NAMES, DTYPES, broadcast_shapes, rand_dims, rand_shape


PROMOTE_DTYPES = ["f32", "f64", "f16", "bf16", "i32", "i64", "bool"]


def t_promotion(c):
    """Mixed dtypes, 0-dim operands included: result dtypes and values (and float gradients)."""
    r = c.rng.random()
    out = rand_shape(c.rng, 1, 3)
    if r < 0.6:
        op = c.rng.choice(["add", "sub", "mul", "div", "maximum", "minimum", "where", "eq", "lt"])
        sa, sb = broadcast_shapes(c.rng, out, 2)
        if c.rng.random() < 0.4:
            (sa if c.rng.random() < 0.5 else sb).clear()  # a 0-dim operand
        da, db = c.rng.choice(PROMOTE_DTYPES), c.rng.choice(PROMOTE_DTYPES)
        if c.fdt == torch.float32:
            # The f32 twin swaps f64 for f32 (and the f64 twin keeps both).
            da, db = ("f32" if da == "f64" else da), ("f32" if db == "f64" else db)
        def operand(shape, dt):
            if dt == "bool":
                return c.input(shape, "bool", dtype="bool")
            kind = ("away0" if op == "div" else "normal") if dt in ("f32", "f64") else "int"
            return c.input(shape, kind, dtype=dt, lo=1 if op == "div" else -3, hi=4)
        if op == "where":
            cond = c.input(out, "bool", dtype="bool")
            c.output(c.op("where", [cond, operand(sa, da), operand(sb, db)]))
        else:
            params = {"alpha": 1, "integral": True} if op in ("add", "sub") else {}
            c.output(c.op(op, [operand(sa, da), operand(sb, db)], **params))
    elif r < 0.7:
        # Joining and clamping across dtypes.
        op = c.rng.choice(["cat", "stack", "clamp_t"])
        dts = [c.rng.choice(PROMOTE_DTYPES) for _ in range(c.rng.randint(2, 3))]
        if c.fdt == torch.float32:
            dts = ["f32" if d == "f64" else d for d in dts]
        def operand(dt):
            if dt == "bool":
                return c.input(out, "bool", dtype="bool")
            return c.input(out, "normal" if dt in ("f32", "f64") else "int", dtype=dt, lo=-3, hi=4)
        if op == "clamp_t":
            ins = [operand(dts[0]), operand(dts[1])] + ([operand(dts[2])] if len(dts) > 2 else [])
            c.output(c.op("clamp_t", ins, has_lo=True, has_hi=len(dts) > 2))
        else:
            c.output(c.op(op, [operand(d) for d in dts], dim=0))
    elif r < 0.8:
        dt = c.rng.choice(["i32", "i64", "bool"])
        op = c.rng.choice(["add_s", "mul_s", "sub_s", "div_s"])
        v = c.rng.choice([2, -1, 0.5, 1.5])
        x = c.input(out, "bool" if dt == "bool" else "int", dtype=dt, lo=-3, hi=4)
        c.output(c.op(op, [x], value=v, integral=isinstance(v, int)))
    else:
        src = c.rng.choice(PROMOTE_DTYPES)
        dst = c.rng.choice(PROMOTE_DTYPES)
        if c.fdt == torch.float32:
            src, dst = ("f32" if src == "f64" else src), ("f32" if dst == "f64" else dst)
        kind = {"bool": "bool"}.get(src, "normal" if src in ("f32", "f64") else "int")
        x = c.input(out, kind, dtype=src, lo=-3, hi=4, scale=3.0)
        op = c.rng.choice(["to_dtype", "to_dtype", "sum"])
        if op == "sum":
            c.output(c.op("sum", [x], dims=None))
        else:
            c.output(c.op("to_dtype", [x], dtype=dst))


HALF_LIMITS = {torch.float16: (65504.0, 2.0 ** -14, 2.0 ** -24), torch.bfloat16: (3.3895e38, 2.0 ** -126, 2.0 ** -133)}


def half_specials(c, shape, dt):
    """f32 values that probe conversion to `dt`: exact halfway points between neighbours
    (ties to even), values across the normal and subnormal ranges, the overflow edge, zeros of
    both signs, infinities and NaN."""
    top, tiny, sub = HALF_LIMITS[dt]
    n = math.prod(shape)
    h = (c.randn([n]) * c.rng.choice([1.0, 100.0, 1e-3])).to(dt)
    bits = h.view(torch.int16)
    nxt = (bits + 1).view(dt)  # the neighbour away from zero (same sign)
    mid = (h.to(torch.float32) + nxt.to(torch.float32)) / 2  # exact in f32
    out = []
    for i in range(n):
        kind = c.rng.randrange(9)
        if kind < 4:
            out.append(float(mid[i]))
        elif kind == 4:
            out.append(float(c.uniform([1], 0.0, 1.0)) * tiny * c.rng.choice([1, -1]))  # subnormal range
        elif kind == 5:
            out.append(c.rng.choice([top, top * 1.0039, top * 1.001, -top * 1.0039, 2 * sub, sub / 2, sub * 0.75]))
        elif kind == 6:
            out.append(c.rng.choice([0.0, -0.0, math.inf, -math.inf, math.nan]))
        else:
            out.append(float(c.randn([1])) * 10 ** c.rng.randint(-6, 4))
    return torch.tensor(out, dtype=torch.float32).reshape(shape)


HALF_UNARY = {torch.bfloat16: ["exp", "tanh", "sigmoid", "gelu", "silu", "sqrt", "log", "rsqrt", "relu", "abs",
                               "neg", "clamp", "softmax", "log_softmax", "sum", "mean", "amax"],
              torch.float16: ["abs", "neg", "sum", "mean", "amax"]}


def t_half(c):
    """f16 and bf16: conversions (round to nearest even, subnormals, overflow, NaN) and
    arithmetic, forward only. PyTorch 1.13's CPU kernels cover bf16 widely, f16 barely."""
    c.allow_nonfinite = True
    dt = c.rng.choice([torch.float16, torch.bfloat16])
    name = DTYPE_NAMES[dt]
    shape = rand_shape(c.rng, 1, 3, max_size=6)
    r = c.rng.random()
    if r < 0.4:
        src = c.rng.choice(["f32", "f32", "f64"])
        # From f64, PyTorch converts through f32 (two roundings) for bf16 but not for f16;
        # the halfway points are exact in f32, so both orders agree on them.
        x = c.input(shape, "given", value=half_specials(c, shape, dt).to(DTYPES[src]), dtype=src,
                    requires_grad=False)
        y = c.op("to_dtype", [x], dtype=name)
        c.output(y, exact=True)
        if c.rng.random() < 0.5:
            c.output(c.op("to_dtype", [y], dtype=c.rng.choice(["f32", "f64", "bf16" if name == "f16" else "f16"])),
                     exact=True)
    elif r < 0.7:
        op = c.rng.choice(["add", "sub", "mul", "div", "maximum", "minimum"])
        sa, sb = broadcast_shapes(c.rng, shape, 2)
        a = c.input(sa, dtype=name, requires_grad=False, scale=3.0)
        b = c.input(sb, "away0" if op == "div" else "normal", dtype=name, requires_grad=False)
        c.output(c.op(op, [a, b], **({"alpha": 1, "integral": True} if op in ("add", "sub") else {})), exact=True)
    else:
        op = c.rng.choice(HALF_UNARY[dt])
        kind = "positive" if op in ("sqrt", "log", "rsqrt") else "normal"
        x = c.input(shape, kind, dtype=name, requires_grad=False)
        n = x.dim()
        if op == "clamp":
            c.output(c.op(op, [x], lo=-0.5, hi=0.75))
        elif op in ("softmax", "log_softmax"):
            c.output(c.op(op, [x], dim=c.rng.randrange(n)))
        elif op in ("sum", "mean", "amax"):
            c.output(c.op(op, [x], dims=rand_dims(c.rng, n), keepdim=c.rng.random() < 0.5))
        else:
            c.output(c.op(op, [x], **({"tanh": c.rng.random() < 0.5} if op == "gelu" else {})))
