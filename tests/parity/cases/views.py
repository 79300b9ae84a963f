# Views and copies: their ops, the random view chains every input is made through (view_recipe,
# odd_ones_recipe), and the template of view chains on a leaf.

from .common import Reject, neg_dim, rand_shape, wrap


def _slice(x, p):
    d = wrap(p["dim"], x.dim())
    return x[(slice(None),) * d + (slice(p["start"], p["end"], p["step"]),)]


def _squeeze(x, p):
    return x.squeeze(p["dim"]) if "dim" in p else x.squeeze()


OPS = {
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
}


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
