#!/usr/bin/python3
# Tandem's PyTorch parity cases, drawn from a seed at test time: tests/test_parity.cpp runs this
# with Debian's /usr/bin/python3 (python3-torch) and replays every case in Tandem.
#
# A case is a small program: inputs (each a base tensor plus the views that make it, often
# non-contiguous), steps (op, input and output names, arguments), outputs, and an upstream
# gradient per floating output. PyTorch runs it here; the outputs and the base tensors' gradients
# go to <out>/cases.safetensors (written by hand, "<case id>/<name>"), the programs to
# <out>/manifest.json. Each case comes as f64 and f32 twins built from the same draws.
#
# Draws are redone where the comparison would not be meaningful: inputs within MARGIN of a kink
# (abs, relu, clamp, maximum/minimum, extreme-value ties), outside a domain, normalising
# near-constant slices, |values| > 1e3. The conditioning that remains is measured and recorded
# for the replay's tolerances: how far the f32 twin lies from the f64 one ("noise"), and the
# largest gradient of each input's view ("grad_scale"). PyTorch 1.13 bugs are worked around
# where the reference is computed (see _var_std, _batch_norm, _Gelu), and a twin pair further
# apart than rounding can explain (a kernel misreading memory) is drawn again. Deliberate
# differences are left out where they would be drawn (see t_creation, _std_exact_on_constant).
#
# TANDEM_PARITY_DEBUG=1 prints every rejected draw and why.
import argparse
import json
import math
import os
import random
import struct
import sys

import torch
import torch.nn.functional as F

MARGIN = 1e-3
MAX_MAGNITUDE = 1e3

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "i64": torch.int64, "i32": torch.int32, "bool": torch.bool}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
SAFETENSORS_DTYPES = {torch.float64: ("F64", 8), torch.float32: ("F32", 4), torch.float16: ("F16", 2),
                      torch.bfloat16: ("BF16", 2), torch.int64: ("I64", 8), torch.int32: ("I32", 4),
                      torch.bool: ("BOOL", 1)}
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


# ---- the ops: name -> PyTorch implementation on a list of tensors and the step's arguments ----
# tests/test_parity.cpp has the same names mapped to Tandem calls.

def _slice(x, p):
    d = wrap(p["dim"], x.dim())
    return x[(slice(None),) * d + (slice(p["start"], p["end"], p["step"]),)]


def _squeeze(x, p):
    return x.squeeze(p["dim"]) if "dim" in p else x.squeeze()


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


def _layer_norm(xs, p):
    x = xs[0]
    rest = list(xs[1:])
    w = opt_input(rest, p, "has_weight")
    b = opt_input(rest, p, "has_bias")
    return F.layer_norm(x, p["normalized_shape"], w, b, p["eps"])


def _linear(xs, p):
    return F.linear(xs[0], xs[1], xs[2] if len(xs) > 2 else None)


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


def _cross_entropy(xs, p):
    w = xs[2] if p.get("has_weight", False) else None
    return F.cross_entropy(xs[0], xs[1], weight=w, ignore_index=p["ignore_index"], reduction=p["reduction"],
                           label_smoothing=p["label_smoothing"])


def _nll_loss(xs, p):
    w = xs[2] if p.get("has_weight", False) else None
    return F.nll_loss(xs[0], xs[1], weight=w, ignore_index=p["ignore_index"], reduction=p["reduction"])


def _split(xs, p):
    return list(torch.split(xs[0], p["sizes"] if "sizes" in p else p["size"], p["dim"]))


OPS = {
    # views and copies
    "transpose": lambda xs, p: xs[0].transpose(p["d0"], p["d1"]),
    "permute": lambda xs, p: xs[0].permute(p["dims"]),
    "narrow": lambda xs, p: xs[0].narrow(p["dim"], p["start"], p["length"]),
    "slice": lambda xs, p: _slice(xs[0], p),
    "select": lambda xs, p: xs[0].select(p["dim"], p["index"]),
    "expand": lambda xs, p: xs[0].expand(p["shape"]),
    "unsqueeze": lambda xs, p: xs[0].unsqueeze(p["dim"]),
    "squeeze": lambda xs, p: _squeeze(xs[0], p),
    "view": lambda xs, p: xs[0].view(p["shape"]),
    "reshape": lambda xs, p: xs[0].reshape(p["shape"]),
    "flatten": lambda xs, p: xs[0].flatten(p["start"], p["end"]),
    "contiguous": lambda xs, p: xs[0].contiguous(),
    "clone": lambda xs, p: xs[0].clone(),
    # elementwise
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
    # creation (no inputs); a null dtype means the default PyTorch infers
    "arange": lambda xs, p: torch.arange(*[int(p[k]) if p[k + "_integral"] else float(p[k])
                                           for k in ("start", "end", "step")],
                                         **({"dtype": DTYPES[p["dtype"]]} if p["dtype"] else {})),
    "linspace": lambda xs, p: torch.linspace(p["start"], p["end"], p["steps"],
                                             **({"dtype": DTYPES[p["dtype"]]} if p["dtype"] else {})),
    "eye": lambda xs, p: torch.eye(p["n"], dtype=DTYPES[p["dtype"]]),
    "full": lambda xs, p: torch.full(p["shape"], scalar_value(p, "value"), dtype=DTYPES[p["dtype"]]),
    # in place (forward only: Tandem refuses in-place ops on tensors that require grad)
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
    # reductions
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
    # linear algebra
    "matmul": lambda xs, p: torch.matmul(xs[0], xs[1]),
    "mm": lambda xs, p: torch.mm(xs[0], xs[1]),
    "bmm": lambda xs, p: torch.bmm(xs[0], xs[1]),
    "linear": _linear,
    "addmm": lambda xs, p: torch.addmm(xs[0], xs[1], xs[2]),
    # nn functional
    "softmax": lambda xs, p: torch.softmax(xs[0], p["dim"]),
    "log_softmax": lambda xs, p: torch.log_softmax(xs[0], p["dim"]),
    "layer_norm": _layer_norm,
    "dropout": lambda xs, p: F.dropout(xs[0], p["p"], p["training"]),
    "embedding": lambda xs, p: F.embedding(xs[1], xs[0]),
    "batch_norm1d": _batch_norm,
    "cross_entropy": _cross_entropy,
    "nll_loss": _nll_loss,
    "mse_loss": lambda xs, p: F.mse_loss(xs[0], xs[1], reduction=p["reduction"]),
    # indexing and joining
    "index_select": lambda xs, p: torch.index_select(xs[0], p["dim"], xs[1]),
    # Tandem's gather and scatter_add take i32 indices too (PyTorch's only i64): the reference
    # gets them widened, so the i32 path is checked rather than refused.
    "gather": lambda xs, p: torch.gather(xs[0], p["dim"], xs[1].long()),
    "scatter_add": lambda xs, p: torch.scatter_add(xs[0], p["dim"], xs[1].long(), xs[2]),
    "cat": lambda xs, p: torch.cat(xs, p["dim"]),
    "stack": lambda xs, p: torch.stack(xs, p["dim"]),
    "split": _split,
    "chunk": lambda xs, p: list(torch.chunk(xs[0], p["chunks"], p["dim"])),
}


# ---- kinks: how close an op's inputs come to a point where it is not differentiable ----

def _min_abs(t):
    t = t.detach()
    return math.inf if t.numel() == 0 else float(t.abs().min())


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
    "abs": lambda xs, p: _min_abs(xs[0]),
    "relu": lambda xs, p: _min_abs(xs[0]),
    "clamp": _kink_clamp,
    "clamp_t": _kink_clamp_tensors,
    "maximum": lambda xs, p: _min_abs(xs[0].detach() - xs[1].detach()),
    "minimum": lambda xs, p: _min_abs(xs[0].detach() - xs[1].detach()),
    "max_all": lambda xs, p: _gap_top2(xs[0], _all_dims(xs[0])),
    "min_all": lambda xs, p: _gap_top2(xs[0], _all_dims(xs[0])),
    "max_dim": lambda xs, p: _gap_top2(xs[0], [p["dim"]]),
    "min_dim": lambda xs, p: _gap_top2(xs[0], [p["dim"]]),
    "amax": _kink_reduce_extreme,
    "amin": _kink_reduce_extreme,
    "argmax": _kink_reduce_extreme,
    "argmin": _kink_reduce_extreme,
    "log": lambda xs, p: float(xs[0].detach().min()) if xs[0].numel() else math.inf,
    "sqrt": lambda xs, p: float(xs[0].detach().min()) if xs[0].numel() else math.inf,
    "rsqrt": lambda xs, p: float(xs[0].detach().min()) if xs[0].numel() else math.inf,
    "pow": lambda xs, p: float(xs[0].detach().min()) if xs[0].numel() else math.inf,
    "pow_s": _kink_pow_s,
    # Division: denominators at least 0.05 from zero (MARGIN / 0.02).
    "div": lambda xs, p: _min_abs(xs[1]) * 0.02,
    "s_div": lambda xs, p: _min_abs(xs[0]) * 0.02,
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

# Comparisons are kinks too when they compare computed (not loaded) values; the templates only
# feed them loaded tensors, whose values are the same bits in PyTorch and Tandem.


# ---- shapes and views ----

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


def view_recipe(rng, shape, depth=None, allow_expand=True):
    """A base shape and view steps that turn a contiguous base into a tensor of `shape`.

    Built backwards from the target: each pick says which view produced the current shape and
    what shape it was applied to. Permutes and transposes of size-1 dims leave those dims with
    strides a freshly allocated tensor would not have; narrow/slice/select leave offsets and gaps;
    expand leaves zero strides.
    """
    if 1 in shape and len(shape) >= 2 and depth is None and rng.random() < 0.4:
        return odd_ones_recipe(rng, shape)
    steps = []
    cur = list(shape)
    if depth is None:
        depth = rng.choice([0, 1, 1, 2, 2, 3])
    for _ in range(depth):
        n = len(cur)
        kinds = ["narrow", "slice", "select", "squeeze"]
        if n >= 2:
            kinds += ["transpose", "permute", "permute"]
        if 1 in cur:
            kinds += ["unsqueeze", "permute_one"]
        if allow_expand and any(d > 1 for d in cur):
            kinds += ["expand"]
        kind = rng.choice(kinds)
        nonempty = [d for d in range(n) if cur[d] > 0]
        if kind in ("narrow", "slice") and not nonempty:
            kind = "select"
        if kind == "transpose":
            i, j = rng.sample(range(n), 2)
            pre = list(cur)
            pre[i], pre[j] = pre[j], pre[i]
            step = {"op": "transpose", "d0": neg_dim(rng, i, n), "d1": neg_dim(rng, j, n)}
        elif kind in ("permute", "permute_one"):
            perm = list(range(n))
            if kind == "permute_one" and n >= 2:
                # Move a size-1 dim somewhere else: its stride then belongs to another position.
                one = rng.choice([d for d in range(n) if cur[d] == 1])
                perm.remove(one)
                perm.insert(rng.randrange(n), one)
            else:
                rng.shuffle(perm)
            # out.shape[k] = in.shape[perm[k]]
            pre = [0] * n
            for k in range(n):
                pre[perm[k]] = cur[k]
            step = {"op": "permute", "dims": [neg_dim(rng, d, n) if rng.random() < 0.2 else d for d in perm]}
        elif kind == "narrow":
            d = rng.choice(nonempty)
            extra = rng.randint(1, 3)
            start = rng.randint(0, extra)
            pre = list(cur)
            pre[d] += extra
            # A negative start counts from the end, as in PyTorch.
            if rng.random() < 0.2:
                start -= pre[d]
            step = {"op": "narrow", "dim": neg_dim(rng, d, n), "start": start, "length": cur[d]}
        elif kind == "slice":
            d = rng.choice(nonempty)
            st = rng.choice([2, 3])
            start = rng.randint(0, 2)
            end = start + (cur[d] - 1) * st + 1 + rng.randint(0, st - 1)
            pre = list(cur)
            pre[d] = end + rng.randint(0, 2)
            # Python's slice rules: negative bounds count from the end, an end past it is clamped.
            r = rng.random()
            if r < 0.15:
                start -= pre[d]
            elif r < 0.3 and end < pre[d]:
                end -= pre[d]
            elif r < 0.4 and end == pre[d]:
                end += rng.randint(1, 5)
            step = {"op": "slice", "dim": neg_dim(rng, d, n), "start": start, "end": end, "step": st}
        elif kind == "select":
            d = rng.randint(0, n)
            k = rng.randint(1, 3)
            pre = cur[:d] + [k] + cur[d:]
            index = rng.randint(0, k - 1)
            step = {"op": "select", "dim": neg_dim(rng, d, n + 1), "index": index - k if rng.random() < 0.3 else index}
        elif kind == "squeeze":
            d = rng.randint(0, n)
            pre = cur[:d] + [1] + cur[d:]
            step = {"op": "squeeze", "dim": neg_dim(rng, d, n + 1)}
        elif kind == "unsqueeze":
            d = rng.choice([d for d in range(n) if cur[d] == 1])
            pre = cur[:d] + cur[d + 1:]
            step = {"op": "unsqueeze", "dim": neg_dim(rng, d, n)}
        else:  # expand
            pre = [1 if d > 1 and rng.random() < 0.6 else d for d in cur]
            if pre == cur:
                pre[rng.choice([d for d in range(n) if cur[d] > 1])] = 1
            lead = rng.randint(0, 1) if n >= 2 else 0
            pre = pre[lead:]
            target = [-1 if k >= lead and pre[k - lead] == cur[k] and rng.random() < 0.5 else cur[k]
                      for k in range(n)]
            step = {"op": "expand", "shape": target}
        steps.insert(0, step)
        cur = pre
    return cur, steps


def odd_ones_recipe(rng, shape):
    """A tensor dense in its non-1 dims (so is_contiguous() says yes) whose size-1 dims carry
    the strides of other dims: base.t().narrow(1, 0, 1).unsqueeze(1) and its relatives. Code
    that trusts contiguity but reads a size-1 dim's stride reads the wrong elements."""
    n = len(shape)
    ones = [d for d in range(n) if shape[d] == 1]
    dense = [shape[d] for d in range(n) if shape[d] != 1]
    extra = [rng.randint(2, 3) for _ in ones]
    k, m = len(ones), len(dense)
    # [extra..., dense...] -> [dense..., extra...] -> each extra dim narrowed to 1 -> interleaved.
    steps = [{"op": "permute", "dims": list(range(k, k + m)) + list(range(k))}]
    for i, e in enumerate(extra):
        steps.append({"op": "narrow", "dim": m + i, "start": rng.randrange(e), "length": 1})
    order, next_dense, next_one = [], 0, m
    for d in range(n):
        if shape[d] == 1:
            order.append(next_one)
            next_one += 1
        else:
            order.append(next_dense)
            next_dense += 1
    steps.append({"op": "permute", "dims": order})
    return extra + dense, steps


def apply_views(t, steps):
    for s in steps:
        t = OPS[s["op"]]([t], s)
    return t


def describe_step(s):
    args = ", ".join(f"{k}={v}" for k, v in s.items() if k not in ("op", "in", "out"))
    return f"{s['op']}({args})"


def geometry(t):
    return f"shape {list(t.shape)} strides {list(t.stride())} offset {t.storage_offset()}"


# ---- one case ----

def max_abs_finite(t):
    f = t.detach()[torch.isfinite(t.detach())]
    return float(f.abs().max()) if f.numel() else 0.0


class Var:
    def __init__(self, name, t):
        self.name = name
        self.t = t

    @property
    def shape(self):
        return list(self.t.shape)

    def dim(self):
        return self.t.dim()


class Case:
    def __init__(self, cid, family, seed, fdt):
        self.cid = cid
        self.family = family
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.fdt = fdt
        self.inputs = []
        self.steps = []
        self.outputs = []
        self.tensors = {}
        self.leaves = []  # (manifest entry, base tensor, the input after its views)
        self.counter = 0
        self.allow_nonfinite = False
        self.at_kinks = False  # t_ties puts inputs on kinks on purpose
        self.error = None  # t_errors: PyTorch's message for the step it refuses
        self.bases = {}  # input name -> its base tensor (the replay knows it as "<name>.base")
        self.lines = []

    # Data: always drawn in f64 (the same draws for the f64 and the f32 twin), then cast.
    def randn(self, shape):
        return torch.randn(shape, generator=self.gen, dtype=torch.float64)

    def uniform(self, shape, lo, hi):
        return torch.rand(shape, generator=self.gen, dtype=torch.float64) * (hi - lo) + lo

    def data(self, shape, kind, dtype, **kw):
        if kind == "normal":
            t = self.randn(shape) * kw.get("scale", 1.0)
        elif kind == "positive":
            t = self.uniform(shape, kw.get("lo", 0.25), kw.get("hi", 3.0))
        elif kind == "away0":
            u = self.randn(shape)
            t = torch.sign(u) * (0.2 + u.abs())
        elif kind == "uniform":
            t = self.uniform(shape, kw["lo"], kw["hi"])
        elif kind == "int":
            t = torch.randint(kw["lo"], kw["hi"], shape, generator=self.gen, dtype=torch.int64).to(torch.float64)
        elif kind == "bool":
            t = torch.rand(shape, generator=self.gen, dtype=torch.float64) < kw.get("p", 0.5)
            return t
        elif kind == "special":
            t = self.randn(shape)
            pick = torch.randint(0, 6, shape, generator=self.gen)
            t = torch.where(pick == 0, torch.tensor(math.nan, dtype=torch.float64), t)
            t = torch.where(pick == 1, torch.tensor(math.inf, dtype=torch.float64), t)
            t = torch.where(pick == 2, torch.tensor(-math.inf, dtype=torch.float64), t)
        elif kind == "given":
            t = kw["value"]
        else:
            raise ValueError(kind)
        return t.to(dtype)

    def name(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def input(self, shape, kind="normal", dtype=None, requires_grad=None, views=True, allow_expand=True,
              depth=None, **kw):
        dtype = self.fdt if dtype is None else DTYPES[dtype] if isinstance(dtype, str) else dtype
        floating = dtype.is_floating_point
        if requires_grad is None:
            requires_grad = floating
        if views:
            base_shape, steps = view_recipe(self.rng, shape, depth=depth, allow_expand=allow_expand)
        else:
            base_shape, steps = list(shape), []
        base = self.data(base_shape, kind, dtype, **kw)
        if kind == "given":
            base_shape, steps = list(base.shape), []
        name = self.name("x")
        key = f"{self.cid}/{name}"
        self.tensors[key] = base.clone()
        base = base.clone()
        if requires_grad:
            base.requires_grad_(True)
        t = apply_views(base, steps)
        entry = {"name": name, "key": key, "views": steps, "requires_grad": requires_grad}
        self.inputs.append(entry)
        self.bases[name] = base
        if requires_grad:
            if t is not base:
                t.retain_grad()
            self.leaves.append((entry, base, t))
        self.lines.append(f"{name}: {DTYPE_NAMES[dtype]} base {base_shape}"
                          + (" -> " + " -> ".join(describe_step(s) for s in steps) if steps else "")
                          + f" => {geometry(t)}")
        return Var(name, t)

    def index(self, shape, high, dtype="i64", views=True):
        return self.input(shape, "int", dtype=dtype, requires_grad=False, views=views, allow_expand=True,
                          lo=0, hi=max(high, 1))

    def op(self, name, ins, n_out=None, **params):
        xs = [v.t for v in ins]
        # Kinks are measured in f64 (bool and integer operands included).
        if not self.at_kinks and name in KINKS:
            if KINKS[name]([x.detach().to(torch.float64) for x in xs], params) < MARGIN:
                raise Reject()
        try:
            res = OPS[name](xs, params)
        except (RuntimeError, IndexError, ValueError) as e:
            raise Reject() from e
        if name in POSTCHECKS and not POSTCHECKS[name](xs, params, res):
            raise Reject()
        many = isinstance(res, (list, tuple))
        res = list(res) if many else [res]
        outs = [Var(self.name("t"), r) for r in res]
        step = {"op": name, "in": [v.name for v in ins], "out": [v.name for v in outs]}
        step.update(params)
        self.steps.append(step)
        self.lines.append(f"{', '.join(step['out'])} = {name}({', '.join(step['in'])}"
                          + "".join(f", {k}={v}" for k, v in params.items()) + ")"
                          + "".join(f"  [{v.name}: {geometry(v.t)}]" for v in outs))
        return outs if many else outs[0]

    def base(self, v):
        """The whole base tensor behind input v: what an in-place op on a view wrote, and did not."""
        return Var(v.name + ".base", self.bases[v.name])

    def op_error(self, name, ins, **params):
        """A step PyTorch refuses: recorded with its message; the replay expects a tandem::Error."""
        try:
            OPS[name]([v.t for v in ins], params)
        except (RuntimeError, IndexError, ValueError, TypeError) as e:
            self.error = str(e).splitlines()[0][:200]
        else:
            raise Reject()  # accepted after all: not an error case
        step = {"op": name, "in": [v.name for v in ins], "out": ["t_err"]}
        step.update(params)
        self.steps.append(step)
        self.lines.append(f"{name}({', '.join(step['in'])}" + "".join(f", {k}={v}" for k, v in params.items())
                          + f") -> PyTorch: {self.error}")

    def output(self, var, upstream=True, exact=False):
        """`exact`: the value is one correctly rounded operation on exact inputs (a conversion, a
        half-precision add): both libraries must produce the same bits."""
        var.exact = exact
        self.outputs.append(var)
        var.want_upstream = upstream and var.t.dtype.is_floating_point and var.t.requires_grad

    def finish(self):
        """Runs backward, checks magnitudes and returns the manifest entry (tensors in self.tensors)."""
        if not self.outputs and self.error is None:
            raise ValueError("a case without outputs")
        roots, grads = [], []
        out_entries = []
        for v in self.outputs:
            t = v.t.detach()
            if t.dtype.is_floating_point:
                if not self.allow_nonfinite and not bool(torch.isfinite(t).all()):
                    raise Reject()
                if max_abs_finite(t) > MAX_MAGNITUDE:
                    raise Reject()
            key = f"{self.cid}/{v.name}.out"
            self.tensors[key] = t.clone()
            entry = {"name": v.name, "expected": key}
            if v.exact:
                entry["exact"] = True
            if v.want_upstream:
                ushape, usteps = view_recipe(self.rng, v.shape, depth=self.rng.choice([0, 0, 1, 2]))
                ubase = self.data(ushape, "normal", v.t.dtype)
                ukey = f"{self.cid}/{v.name}.upstream"
                self.tensors[ukey] = ubase
                g = apply_views(ubase, usteps)
                roots.append(v.t)
                grads.append(g)
                entry["upstream"] = {"key": ukey, "views": usteps}
            out_entries.append(entry)
        if roots:
            try:
                torch.autograd.backward(roots, grads)
            except RuntimeError as e:
                # Some odd stride patterns have no oneDNN memory descriptor in PyTorch's backward.
                raise Reject() from e
        for entry, base, view in self.leaves:
            g = base.grad
            if g is None:
                entry["grad"] = None
                continue
            # The view's own gradient bounds the terms the view's backward sums into the base's
            # (an expanded input gets many): the replay compares relative to that magnitude.
            if view.grad is not None:
                entry["grad_scale"] = max_abs_finite(view.grad)
            if not bool(torch.isfinite(g).all()) and not self.allow_nonfinite:
                raise Reject()
            if max_abs_finite(g) > MAX_MAGNITUDE:
                raise Reject()
            entry["grad"] = f"{entry['key']}.grad"
            self.tensors[entry["grad"]] = g.detach().clone()
        ops = sorted({s["op"] for s in self.steps})
        # The case is as precise as its least precise tensor (an f64 leaf's gradient through an
        # op that promoted to f32 was summed in f32): the replay's tolerance follows this.
        dtypes = {t.dtype for t in self.tensors.values()} | {DTYPES[s["dtype"]] for s in self.steps if s.get("dtype")}
        precision = DTYPE_NAMES[next(d for d in PRECISION_ORDER + [self.fdt] if d in dtypes or d == self.fdt)]
        return {
            "id": self.cid,
            "family": self.family,
            "dtype": DTYPE_NAMES[self.fdt],
            "precision": precision,
            "ops": ops,
            "allow_nonfinite": self.allow_nonfinite,
            "desc": f"{self.family} ({DTYPE_NAMES[self.fdt]}): " + "; ".join(self.lines),
            "inputs": self.inputs,
            "steps": self.steps,
            "outputs": out_entries,
            "error": self.error,
        }


# ---- templates: each draws one case ----

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


def rand_dims(rng, ndim, allow_empty=False):
    if ndim == 0:
        return []
    k = rng.randint(0 if allow_empty else 1, ndim)
    dims = rng.sample(range(ndim), k)
    return [neg_dim(rng, d, ndim) for d in dims]


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


def t_matmul(c):
    op = c.rng.choice(["matmul", "matmul", "matmul", "mm", "bmm", "linear", "linear", "addmm"])
    size = lambda: c.rng.choice([1, 1, 2, 3, 4, 5])
    n, k, m = size(), size(), size()
    if c.rng.random() < 0.03:
        k = 0
    if op == "mm":
        a, b = c.input([n, k]), c.input([k, m])
        c.output(c.op("mm", [a, b]))
    elif op == "bmm":
        bt = size()
        a, b = c.input([bt, n, k]), c.input([bt, k, m])
        c.output(c.op("bmm", [a, b]))
    elif op == "matmul":
        form = c.rng.choice(["vv", "vm", "mv", "mm", "bm", "mb", "bb", "bv", "vb"])
        batch = rand_shape(c.rng, 1, 2, max_size=3, p1=0.4)
        ba, bb = broadcast_shapes(c.rng, batch, 2, p_one=0.3, p_drop=0.4)
        shapes = {"vv": ([k], [k]), "vm": ([k], [k, m]), "mv": ([n, k], [k]), "mm": ([n, k], [k, m]),
                  "bm": (ba + [n, k], [k, m]), "mb": ([n, k], bb + [k, m]), "bb": (ba + [n, k], bb + [k, m]),
                  "bv": (ba + [n, k], [k]), "vb": ([k], bb + [k, m])}[form]
        a, b = c.input(shapes[0]), c.input(shapes[1], requires_grad=c.rng.random() < 0.85)
        c.output(c.op("matmul", [a, b]))
    elif op == "linear":
        lead = rand_shape(c.rng, 0, 3, max_size=3, p1=0.4)
        x = c.input(lead + [k])
        w = c.input([m, k], requires_grad=c.rng.random() < 0.9)
        ins = [x, w]
        if c.rng.random() < 0.6:
            ins.append(c.input([m], requires_grad=c.rng.random() < 0.9))
        c.output(c.op("linear", ins))
    else:
        bias_shape = c.rng.choice([[n, m], [m], [1, m], [n, 1], [1, 1], []])
        bias = c.input(bias_shape, requires_grad=c.rng.random() < 0.8)
        a, b = c.input([n, k]), c.input([k, m])
        c.output(c.op("addmm", [bias, a, b]))


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


def t_index(c):
    op = c.rng.choice(["index_select", "gather", "scatter_add", "cat", "stack", "split", "chunk"])
    shape = rand_shape(c.rng, 1, 3, max_size=5, p1=0.15)
    n = len(shape)
    d = c.rng.randrange(n)
    dn = neg_dim(c.rng, d, n)
    if op == "index_select":
        a = c.input(shape)
        idx = c.index([c.rng.randint(0, 6)], shape[d], dtype=c.rng.choice(["i64", "i64", "i32"]))
        c.output(c.op("index_select", [a, idx], dim=dn))
    elif op == "gather":
        a = c.input(shape)
        ishape = [c.rng.randint(1, 5) if k == d else c.rng.randint(1, shape[k]) for k in range(n)]
        idx = c.index(ishape, shape[d], dtype=c.rng.choice(["i64", "i64", "i32"]))
        c.output(c.op("gather", [a, idx], dim=dn))
    elif op == "scatter_add":
        a = c.input(shape, requires_grad=c.rng.random() < 0.8)
        ishape = [c.rng.randint(1, 5) if k == d else c.rng.randint(1, shape[k]) for k in range(n)]
        idx = c.index(ishape, shape[d], dtype=c.rng.choice(["i64", "i64", "i32"]))
        # src may be larger than index (only its leading part is read); PyTorch 1.13 cannot
        # differentiate that form, so such a src takes no gradient.
        larger = c.rng.random() < 0.3
        sshape = [s + c.rng.randint(0, 1) for s in ishape] if larger else ishape
        src = c.input(sshape, requires_grad=not larger)
        c.output(c.op("scatter_add", [a, idx, src], dim=dn))
    elif op in ("cat", "stack"):
        parts = []
        for _ in range(c.rng.randint(1, 4)):
            s = list(shape)
            if op == "cat":
                s[d] = c.rng.randint(0, 3)
            parts.append(c.input(s, requires_grad=c.rng.random() < 0.8))
        sd = dn if op == "cat" else neg_dim(c.rng, c.rng.randint(0, n), n + 1)
        c.output(c.op(op, parts, dim=sd))
    else:
        a = c.input(shape)
        if op == "split":
            if c.rng.random() < 0.5:
                params = {"size": c.rng.randint(1, max(1, shape[d]))}
            else:
                sizes, left = [], shape[d]
                while left > 0:
                    s = c.rng.randint(0 if c.rng.random() < 0.2 else 1, left)
                    sizes.append(s)
                    left -= s
                params = {"sizes": sizes or [0]}
            params["dim"] = dn
        else:
            params = {"chunks": c.rng.randint(1, 4), "dim": dn}
        pieces = c.op(op, [a], **params)
        # Some pieces go unused: their gradient is zero.
        for p in pieces:
            if c.rng.random() < 0.7:
                c.output(p)
        if not c.outputs:
            c.output(pieces[0])


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


def t_views(c):
    """View chains on a leaf, then the same through reshape/view/flatten/squeeze/contiguous."""
    shape = rand_shape(c.rng, 1, 4, p1=0.3)
    x = c.input(shape, depth=c.rng.choice([1, 2, 3]))
    v = x
    for _ in range(c.rng.randint(1, 3)):
        n = v.dim()
        op = c.rng.choice(["reshape", "view", "flatten", "squeeze", "unsqueeze", "contiguous", "clone", "transpose",
                           "permute", "expand", "select", "narrow", "slice"])
        if op in ("reshape", "view"):
            numel = v.t.numel()
            dims = []
            rest = numel
            for f in (2, 3, 5, 1):
                while rest % f == 0 and rest > 1 and f > 1 and c.rng.random() < 0.5:
                    dims.append(f)
                    rest //= f
            dims.append(rest)
            c.rng.shuffle(dims)
            if c.rng.random() < 0.3:
                dims[c.rng.randrange(len(dims))] = -1
            try:
                v = c.op(op, [v], shape=dims)
            except Reject:
                v = c.op("reshape", [v], shape=dims)
        elif op == "flatten":
            if n == 0:
                v = c.op(op, [v], start=0, end=-1)  # a 0-dim tensor flattens to [1]
                continue
            s = c.rng.randrange(n)
            e = c.rng.randint(s, n - 1)
            v = c.op(op, [v], start=neg_dim(c.rng, s, n), end=neg_dim(c.rng, e, n))
        elif op == "squeeze":
            if c.rng.random() < 0.4 or n == 0:
                v = c.op(op, [v])
            else:
                v = c.op(op, [v], dim=neg_dim(c.rng, c.rng.randrange(n), n))  # a no-op unless that dim is 1
        elif op == "unsqueeze":
            v = c.op(op, [v], dim=neg_dim(c.rng, c.rng.randint(0, n), n + 1))
        elif op in ("contiguous", "clone"):
            v = c.op(op, [v])
        elif op == "transpose" and n >= 1:
            i, j = c.rng.randrange(n), c.rng.randrange(n)  # i == j: the identity
            v = c.op(op, [v], d0=i, d1=j)
        elif op == "permute" and n >= 1:
            perm = list(range(n))
            c.rng.shuffle(perm)
            v = c.op(op, [v], dims=perm)
        elif op == "expand":
            target = [c.rng.randint(2, 3) if s == 1 and c.rng.random() < 0.6 else s for s in v.shape]
            lead = [2] if c.rng.random() < 0.3 else []
            v = c.op(op, [v], shape=lead + target)
        elif op in ("select", "narrow", "slice") and n >= 1:
            d = c.rng.randrange(n)
            if v.shape[d] == 0:
                continue
            if op == "select":
                v = c.op(op, [v], dim=d, index=c.rng.randrange(v.shape[d]))
            elif op == "narrow":
                start = c.rng.randrange(v.shape[d])
                v = c.op(op, [v], dim=d, start=start, length=c.rng.randint(0, v.shape[d] - start))
            else:
                start = c.rng.randrange(v.shape[d])
                v = c.op(op, [v], dim=d, start=start, end=c.rng.randint(start, v.shape[d]), step=c.rng.randint(1, 3))
    c.output(v)


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


def t_errors(c):
    """Arguments PyTorch refuses: Tandem must throw (a tandem::Error, not a crash or a result)."""
    kind = c.rng.choice(["broadcast", "matmul", "mm", "bmm", "linear", "gather", "index_select", "embedding",
                         "scatter_add", "cross_entropy", "nll_loss", "narrow", "select", "transpose", "permute",
                         "expand", "view", "reshape", "squeeze", "unsqueeze", "amax_empty", "max_dim_empty",
                         "argmax_empty", "cat", "stack", "softmax", "layer_norm", "where", "masked_fill",
                         "softmax_int", "matmul_int", "inplace_overlap", "inplace_cast", "inplace_broadcast",
                         "mean_int", "var_int"])
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
    else:  # inplace_broadcast: the destination cannot grow
        c.op_error("add_", [c.input(shape[1:], requires_grad=False), c.input(shape, requires_grad=False)], alpha=1,
                   integral=True)


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


TEMPLATES = [
    (t_unary, 14), (t_binary, 12), (t_scalar, 5), (t_compare, 6), (t_where, 6), (t_clamp_tensor, 4),
    (t_reduce, 16), (t_zero_spread, 2), (t_matmul, 20), (t_softmax, 4), (t_layer_norm, 5),
    (t_dropout_embedding, 3), (t_batch_norm, 3), (t_index, 10), (t_loss, 10), (t_views, 8), (t_chain, 14),
    (t_promotion, 6), (t_nan, 3), (t_big, 5), (t_ties, 5), (t_errors, 6), (t_half, 5), (t_inplace, 6),
    (t_creation, 3),
]


def family_name(fn):
    return fn.__name__[2:]


# ---- safetensors, written by hand ----

def write_safetensors(path, tensors):
    # Decreasing element size, then name (the reference implementation's order) keeps every
    # tensor naturally aligned; offsets tile the data buffer with no gaps.
    items = sorted(tensors.items(), key=lambda kv: (-SAFETENSORS_DTYPES[kv[1].dtype][1], kv[0]))
    header, chunks, offset = {}, [], 0
    for name, t in items:
        code, size = SAFETENSORS_DTYPES[t.dtype]
        t = t.detach().contiguous()
        # numpy has no bfloat16: both 2-byte floats travel as their bit patterns.
        arr = t.view(torch.int16).numpy() if size == 2 else t.numpy()
        raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        assert len(raw) == t.numel() * size
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for ch in chunks:
            f.write(ch)
    os.replace(tmp, path)


def noise(a, b):
    """The largest |a - b| over the elements both have finite (0 when they cannot be paired)."""
    if a.shape != b.shape or not a.dtype.is_floating_point or not b.dtype.is_floating_point:
        return 0.0
    a, b = a.to(torch.float64), b.to(torch.float64)
    both = torch.isfinite(a) & torch.isfinite(b)
    return float((a - b)[both].abs().max()) if bool(both.any()) else 0.0


def set_noise(twin64, twin32):
    """Records, for every compared tensor, how far PyTorch's f32 result lies from its f64 one.

    That distance measures how sensitive the tensor is to rounding (cancellation in sums of
    gradients over expanded dims, normalising a near-constant slice, ...): the replay widens its
    tolerance by a multiple of it (scaled by the epsilon ratio for f64), so ill-conditioned
    elements are judged by the rounding they actually suffer, not by a fixed count of ulps.
    """
    (e64, t64), (e32, t32) = twin64, twin32

    def capped(value, want64, term_scale=0.0):
        # Conditioning here never puts the twins more than ~2e-5 of the tensor's scale apart; an
        # f32 twin 1e-4 away is a PyTorch kernel misreading memory (it has done so: GELU's and
        # batch_norm's backwards), whose noise must not widen anything: draw again.
        w = want64.to(torch.float64)
        finite = w[torch.isfinite(w)]
        scale = max(1.0, term_scale, float(finite.abs().max()) if finite.numel() else 0.0)
        if value > 1e-4 * scale:
            raise Reject()
        return value

    def layout(e):
        return ([s["op"] for s in e["steps"]], [i["name"] for i in e["inputs"]], [o["name"] for o in e["outputs"]])
    if layout(e64) != layout(e32):
        return  # a value-dependent draw made the twins differ: no pairing, no widening
    for o64, o32 in zip(e64["outputs"], e32["outputs"]):
        value = noise(t64[o64["expected"]], t32[o32["expected"]])
        o64["noise"] = o32["noise"] = capped(value, t64[o64["expected"]])
    for i64, i32 in zip(e64["inputs"], e32["inputs"]):
        if i64.get("grad") and i32.get("grad"):
            value = noise(t64[i64["grad"]], t32[i32["grad"]])
            i64["grad_noise"] = i32["grad_noise"] = capped(value, t64[i64["grad"]], i64.get("grad_scale", 0.0))


def generate(seed, count, only=None):
    master = random.Random(seed)
    templates = [(fn, w) for fn, w in TEMPLATES if only is None or family_name(fn) in only]
    fns = [fn for fn, _ in templates]
    weights = [w for _, w in templates]
    cases, tensors = [], {}
    rejected = 0
    for i in range(count):
        fn = master.choices(fns, weights)[0]
        for _attempt in range(200):
            s = master.getrandbits(62)
            try:
                built = []
                for fdt in (torch.float64, torch.float32):
                    c = Case(f"c{i:05d}{DTYPE_NAMES[fdt]}", family_name(fn), s, fdt)
                    fn(c)
                    built.append((c.finish(), c.tensors))
            except Reject:
                rejected += 1
                if os.environ.get("TANDEM_PARITY_DEBUG"):
                    import traceback
                    print(f"reject {i} {fn.__name__} {s}:", traceback.format_exc().splitlines()[-3], file=sys.stderr)
                continue
            try:
                set_noise(built[0], built[1])
            except Reject:
                rejected += 1
                continue
            for entry, ts in built:
                cases.append(entry)
                tensors.update(ts)
            break
        else:
            raise RuntimeError(f"template {fn.__name__} kept drawing unusable cases")
    return cases, tensors, rejected


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="directory for cases.safetensors and manifest.json")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=4000, help="case templates (each gives an f64 and an f32 case)")
    ap.add_argument("--only", default=None, help="comma-separated families (e.g. matmul,reduce)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    only = set(args.only.split(",")) if args.only else None
    cases, tensors, rejected = generate(args.seed, args.count, only)
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "cases.safetensors"), tensors)
    manifest = {"seed": args.seed, "torch": torch.__version__, "margin": MARGIN, "cases": cases}
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, separators=(",", ":"))
    print(f"parity: {len(cases)} cases ({len(tensors)} tensors, {rejected} draws rejected) from seed {args.seed}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
