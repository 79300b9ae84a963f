#!/usr/bin/python3
# Tandem's PyTorch parity cases, drawn from a seed at test time: tests/parity/test_parity.cpp runs
# this with Debian's /usr/bin/python3 (python3-torch) and replays every case in Tandem. The ops and
# the templates that draw the cases are in cases/, a module per op family (cases/__init__.py);
# this script draws, pairs the f64 and f32 twins and writes the files.
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
# where the reference is computed (see _var_std in cases/reduce.py, _batch_norm in cases/nn.py,
# _Gelu in cases/elementwise.py), and a twin pair further apart than rounding can explain (a
# kernel misreading memory) is drawn again. Deliberate differences are left out where they would
# be drawn (see t_creation in cases/creation.py, _std_exact_on_constant in cases/reduce.py).
#
# TANDEM_PARITY_DEBUG=1 prints every rejected draw and why.
import argparse
import json
import os
import random
import struct
import sys

import torch

sys.dont_write_bytecode = True  # cases/ is imported from the source tree: leave no __pycache__ there

from cases.attention import t_attention
from cases.case import Case
from cases.common import DTYPE_NAMES, MARGIN, Reject
from cases.composite import t_big, t_chain, t_nan, t_ties
from cases.creation import t_creation
from cases.dtypes import t_half, t_promotion
from cases.elementwise import t_binary, t_clamp_tensor, t_compare, t_scalar, t_unary, t_where
from cases.errors import t_errors
from cases.index import t_index
from cases.inplace import t_inplace
from cases.matmul import t_matmul
from cases.nn import t_batch_norm, t_dropout_embedding, t_layer_norm, t_loss, t_softmax
from cases.reduce import t_reduce, t_zero_spread
from cases.topk import t_topk
from cases.triangle import t_triangle
from cases.views import t_views

SAFETENSORS_DTYPES = {torch.float64: ("F64", 8), torch.float32: ("F32", 4), torch.float16: ("F16", 2),
                      torch.bfloat16: ("BF16", 2), torch.int64: ("I64", 8), torch.int32: ("I32", 4),
                      torch.bool: ("BOOL", 1)}


# ---- the templates, each drawing one case, and their weights ----

TEMPLATES = [
    (t_unary, 14), (t_binary, 12), (t_scalar, 5), (t_compare, 6), (t_where, 6), (t_clamp_tensor, 4),
    (t_reduce, 16), (t_zero_spread, 2), (t_matmul, 20), (t_softmax, 4), (t_layer_norm, 5),
    (t_dropout_embedding, 3), (t_batch_norm, 3), (t_index, 10), (t_loss, 10), (t_views, 8), (t_chain, 14),
    (t_promotion, 6), (t_nan, 3), (t_big, 5), (t_ties, 5), (t_errors, 6), (t_half, 5), (t_inplace, 6),
    (t_creation, 3), (t_triangle, 3), (t_topk, 4), (t_attention, 4),
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
