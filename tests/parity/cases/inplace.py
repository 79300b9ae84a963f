# In-place ops, forward only (Tandem refuses in-place ops on tensors that require grad), written
# through views of a base.

import torch

from .common import broadcast_shapes, rand_shape, scalar_value


OPS = {
    "add_": lambda xs, p: xs[0].add_(xs[1], alpha=scalar_value(p, "alpha")),
    "sub_": lambda xs, p: xs[0].sub_(xs[1], alpha=scalar_value(p, "alpha")),
    "mul_": lambda xs, p: xs[0].mul_(xs[1]),
    "div_": lambda xs, p: xs[0].div_(xs[1]),
    "add_s_": lambda xs, p: xs[0].add_(scalar_value(p, "value")),
    "sub_s_": lambda xs, p: xs[0].sub_(scalar_value(p, "value")),
    "mul_s_": lambda xs, p: xs[0].mul_(scalar_value(p, "value")),
    "div_s_": lambda xs, p: xs[0].div_(scalar_value(p, "value")),
    "zero_": lambda xs, p: xs[0].zero_(),
    "fill_": lambda xs, p: xs[0].fill_(scalar_value(p, "value")),
    "copy_": lambda xs, p: xs[0].copy_(xs[1]),
    "clamp_": lambda xs, p: xs[0].clamp_(min=p["lo"], max=p["hi"]),
    "addcmul_": lambda xs, p: xs[0].addcmul_(xs[1], xs[2], value=scalar_value(p, "value")),
    "addcdiv_": lambda xs, p: xs[0].addcdiv_(xs[1], xs[2], value=scalar_value(p, "value")),
    "lerp_": lambda xs, p: xs[0].lerp_(xs[1], float(p["weight"])),
}


def t_inplace(c):
    """In-place ops written through views (transposed, strided, offset, size-1 dims with odd
    strides) of a base that does not require grad: the view and the whole base are compared, so
    elements outside the view must be untouched."""
    shape = rand_shape(c.rng, 1, 3, max_size=5)
    integer = c.rng.random() < 0.2
    dt = c.rng.choice(["i64", "i32"]) if integer else None
    ops = ["add_", "sub_", "mul_", "add_s_", "sub_s_", "mul_s_", "zero_", "fill_", "copy_", "clamp_"]
    if not integer:
        ops += ["div_", "div_s_", "addcmul_", "addcdiv_", "lerp_"]
    op = c.rng.choice(ops)
    kind = "int" if integer else "normal"
    # No expand on the destination: writing through overlapping elements is an error (t_errors).
    x = c.input(shape, kind, dtype=dt, requires_grad=False, allow_expand=False, lo=-3, hi=4)
    def operand(kind2="normal", other_shape=None):
        return c.input(other_shape or broadcast_shapes(c.rng, shape, 1)[0], "int" if integer else kind2,
                       dtype=dt if integer else c.rng.choice([None, None, "f32" if c.fdt == torch.float64 else None]),
                       requires_grad=False, lo=-3, hi=4)
    if op in ("add_", "sub_"):
        alpha = c.rng.choice([1, 2, -1]) if integer else c.rng.choice([1, -0.5, 2.5])
        y = c.op(op, [x, operand()], alpha=alpha, integral=isinstance(alpha, int))
    elif op in ("mul_", "div_"):
        y = c.op(op, [x, operand("away0" if op == "div_" else "normal")])
    elif op in ("add_s_", "sub_s_", "mul_s_", "div_s_", "fill_"):
        v = c.rng.choice([2, -3]) if integer else c.rng.choice([2, -1.5, 0.25])
        y = c.op(op, [x], value=v, integral=isinstance(v, int))
    elif op == "zero_":
        y = c.op(op, [x])
    elif op == "copy_":
        # copy_ broadcasts and casts its source (from any dtype).
        src_dt = c.rng.choice(["f32", "f64", "i64", "i32", "bool"])
        src_kind = "bool" if src_dt == "bool" else "normal" if src_dt in ("f32", "f64") else "int"
        src = c.input(broadcast_shapes(c.rng, shape, 1)[0], src_kind, dtype=src_dt, requires_grad=False, lo=-3, hi=4,
                      scale=3.0)
        y = c.op(op, [x, src])
    elif op == "clamp_":
        y = c.op(op, [x], lo=c.rng.choice([None, -1.0]), hi=c.rng.choice([None, 1.0, 2.0]))
    elif op in ("addcmul_", "addcdiv_"):
        y = c.op(op, [x, operand(), operand("away0" if op == "addcdiv_" else "normal")],
                 value=c.rng.choice([1, 0.5, -2]), integral=False)
    else:
        y = c.op(op, [x, operand()], weight=c.rng.choice([0.25, 0.5, 1.5]))
    c.output(y)
    c.output(c.base(x))
