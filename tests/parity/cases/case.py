# One case: its inputs (a base tensor and the views that make it), its steps (each op looked up in
# tables.OPS, checked against its kinks first), its outputs and upstream gradients; finish() runs
# PyTorch's backward and returns the manifest entry.

import math
import random

import torch

from .common import DTYPE_NAMES, DTYPES, MARGIN, MAX_MAGNITUDE, PRECISION_ORDER, Reject, max_abs_finite
from .tables import KINKS, OPS, POSTCHECKS
from .views import apply_views, describe_step, geometry, view_recipe


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
