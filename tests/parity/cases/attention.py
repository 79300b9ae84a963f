# Attention: scaled_dot_product_attention (PyTorch 2.x's F.scaled_dot_product_attention, which
# PyTorch 1.13 lacks), and its template.
#
# The reference is the math composition softmax(q kᵀ · scale + bias) v, bias from a boolean mask
# (-inf where false), an additive mask, or causal (torch.ones(L, S).tril(): top-left aligned), with
# Tandem's two documented differences from PyTorch's math path: a query whose keys are all masked
# gets 0 and no gradient (PyTorch: NaN), and f16/bf16 inputs are computed in f32 and rounded once
# (Tandem's fused op accumulates in f32). Dropout is left out: Tandem's keep bits are Philox's, not
# PyTorch's generator's (tests/core/test_attention.cpp checks them).

import math

import torch

from .common import broadcast_shapes, rand_shape


def _sdpa(xs, p):
    q, k, v = xs[0], xs[1], xs[2]
    mask = xs[3] if len(xs) > 3 else None
    dtype = q.dtype
    if dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.float()
    L, S = q.shape[-2], k.shape[-2]
    scale = p["scale"] if p["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if p["is_causal"]:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask
    zero = torch.zeros((), dtype=s.dtype)
    live = s.amax(-1, keepdim=True) > -math.inf
    w = torch.where(live, torch.softmax(torch.where(live, s, zero), -1), zero)
    return torch.matmul(w, v).to(dtype)


OPS = {
    "scaled_dot_product_attention": _sdpa,
}


def _mask_with_neg_inf(c, shape, dtype):
    """An additive mask with -inf at about a fifth of its elements (a whole query's keys now and
    then): the softmax's running maximum starts at -inf there, and its gradient is 0 there."""
    m = c.randn(shape)
    m = torch.where(c.uniform(shape, 0.0, 1.0) < 0.2, torch.tensor(-math.inf, dtype=torch.float64), m)
    return m.to(dtype)


def t_attention(c):
    """q [*batch, L, E], k [*batch, S, E], v [*batch, S, Ev] (often strided; now and then a GPT's
    qkv split of one tensor), with no mask, causal, or a boolean or additive mask broadcast from a
    smaller shape (the additive one often differentiable, sometimes holding -inf); the default
    scale or another. Mostly tiny; some L and S around Tandem's 64-wide tiles. f16/bf16 forward."""
    half = c.rng.random() < 0.15
    dtype = c.rng.choice(["bf16", "f16"]) if half else None
    grad = None if not half else False
    if c.rng.random() < 0.1:
        batch = rand_shape(c.rng, 0, 1, max_size=2, p1=0.3)
        L, S = c.rng.randint(60, 70), c.rng.randint(60, 70)
        E, Ev = c.rng.randint(2, 8), c.rng.randint(2, 8)
    else:
        batch = rand_shape(c.rng, 0, 3, max_size=3, p1=0.3)
        size = lambda: c.rng.choice([1, 1, 2, 3, 4, 5, 6, 7])
        L, S, E, Ev = size(), size(), size(), size()
    if not half and len(batch) == 2 and c.rng.random() < 0.2:
        # GPT: x [B, T, 3·H·D] -> chunk(3, -1) -> view(B, T, H, D).transpose(1, 2) each.
        B, H = batch
        S = L
        Ev = E
        x = c.input([B, L, 3 * H * E], views=False)
        parts = c.op("chunk", [x], chunks=3, dim=-1)
        q, k, v = [c.op("transpose", [c.op("view", [t], shape=[B, L, H, E])], d0=1, d1=2) for t in parts]
    else:
        q = c.input(batch + [L, E], dtype=dtype, requires_grad=grad)
        k = c.input(batch + [S, E], dtype=dtype, requires_grad=grad)
        v = c.input(batch + [S, Ev], dtype=dtype, requires_grad=grad)
    params = {"is_causal": False, "scale": None}
    if c.rng.random() < 0.4:
        params["scale"] = c.rng.choice([0.5, 0.125, 1.3, -0.7])
    ins = [q, k, v]
    r = c.rng.random()
    if r < 0.25:
        params["is_causal"] = True
    elif r < 0.65:
        mshape = broadcast_shapes(c.rng, batch + [L, S], 1, p_one=0.3, p_drop=0.4)[0]
        kind = c.rng.random()
        if kind < 0.45:
            ins.append(c.input(mshape, "bool", dtype="bool", p=0.75))
        elif kind < 0.75:
            ins.append(c.input(mshape, dtype=dtype, scale=2.0, requires_grad=grad if half else c.rng.random() < 0.7))
        else:
            ins.append(c.input(mshape, "given", value=_mask_with_neg_inf(c, mshape, q.t.dtype), dtype=q.t.dtype,
                               requires_grad=grad if half else c.rng.random() < 0.7))
    c.output(c.op("scaled_dot_product_attention", ins, **params))
