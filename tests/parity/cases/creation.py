# Creation ops (no inputs): arange, linspace, eye, full.

import torch

from .common import DTYPES, rand_shape, scalar_value


# A null dtype means the default PyTorch infers.
OPS = {
    "arange": lambda xs, p: torch.arange(*[int(p[k]) if p[k + "_integral"] else float(p[k])
                                           for k in ("start", "end", "step")],
                                         **({"dtype": DTYPES[p["dtype"]]} if p["dtype"] else {})),
    "linspace": lambda xs, p: torch.linspace(p["start"], p["end"], p["steps"],
                                             **({"dtype": DTYPES[p["dtype"]]} if p["dtype"] else {})),
    "eye": lambda xs, p: torch.eye(p["n"], dtype=DTYPES[p["dtype"]]),
    "full": lambda xs, p: torch.full(p["shape"], scalar_value(p, "value"), dtype=DTYPES[p["dtype"]]),
}


def t_creation(c):
    """arange (its length and dtype inference with integral and floating bounds, negative steps),
    linspace (both endpoints exact), eye and full, in every dtype.

    Left out: integer dtypes with fractional arange arguments, and integer linspace. PyTorch 1.13
    truncates arange's bounds (and, for i64 only, its step) to the dtype before counting
    (arange(2, 11.75, 1.5, dtype=i64) has 9 elements, Tandem's 7 = ceil(9.75 / 1.5)), and its
    integer linspace counts up from start only (linspace(0, 100, 8, dtype=i64) ends at 99);
    Tandem computes in double and casts, with both endpoints exact. Floating arange values are
    compared within tolerance: PyTorch's vectorised kernel adds steps within SIMD chunks, 1 ulp
    from start + i * step."""
    op = c.rng.choice(["arange", "arange", "linspace", "eye", "full"])
    dt = c.rng.choice(["f32", "f64", "i64", "i32", None] + (["bf16", "f16"] if op != "arange" else []))
    if op == "linspace" and dt in ("i64", "i32"):
        dt = "f64"
    if op == "arange":
        step = c.rng.choice([1, 2, 3, -1, -2, 0.5, 0.1, 0.3, -0.25, 1.5])
        start = c.rng.choice([0, 1, -3, 0.5, -1.25, 2])
        length = c.rng.randint(0, 12)
        end = start + step * length + c.rng.choice([0, 0, 1e-9, -1e-9, step / 2])
        if isinstance(start, int) and isinstance(step, int) and c.rng.random() < 0.7:
            end = int(start + step * length)
        p = {"start": start, "end": end, "step": step}
        for k in ("start", "end", "step"):
            p[k + "_integral"] = isinstance(p[k], int)
        if dt in ("i64", "i32") and not all(float(v).is_integer() for v in (start, end, step)):
            dt = None  # see above; the inferred dtype is then f32
        c.output(c.op("arange", [], dtype=dt, **p))
    elif op == "linspace":
        start = c.rng.choice([0.0, -1.0, 2.5, 10.0, -7.3])
        end = c.rng.choice([1.0, 0.0, -2.0, 100.0, 3.3])
        c.output(c.op("linspace", [], start=start, end=end, steps=c.rng.randint(0, 9), dtype=dt))
    elif op == "eye":
        c.output(c.op("eye", [], n=c.rng.randint(0, 5), dtype=dt or "f32"), exact=True)
    else:
        v = c.rng.choice([0, 3, -2, 1.5, -0.1])
        c.output(c.op("full", [], shape=rand_shape(c.rng, 0, 3), value=v, integral=isinstance(v, int),
                      dtype=dt or "f32"), exact=True)
