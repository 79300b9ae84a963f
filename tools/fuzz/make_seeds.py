#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzzers (tools/fuzz/corpus/<name>/).

safetensors: valid files laid out as Tandem's save_safetensors writes them (compact JSON, padded
with spaces to a multiple of 8, tensors by decreasing element size then name), and malformed ones
that each break one rule the loader checks.
idx: IDX files, plain and gzipped, of every element type, and broken ones (bad magic, payload
too short or too long, truncated gzip, CRC error).
ops, seq_ops, collectives: small programs in the byte encodings that fuzz_ops.cpp, fuzz_seq_ops.cpp
and fuzz_collectives.cpp read (each helper below mirrors one op's reads; a reader past the end
yields zeros).

crash-*: minimal inputs reproducing what the fuzzers found, each named by the regression test
that covers it (tests/<area>/test_*.cpp, tagged [fuzz]); they run with the other seeds every time.

Run it again only to change the seeds; the bytes are committed. Arguments choose the corpora it
writes (`make_seeds.py seq_ops`); without, it writes them all.
"""
import gzip
import json
import os
import struct
import sys

ITEMSIZE = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "BOOL": 1}
corpus_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def image(header_text: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header_text)) + header_text + data


def valid(tensors, metadata=None):
    """tensors: {name: (dtype, shape, raw bytes)} -> file bytes."""
    order = sorted(tensors, key=lambda n: (-ITEMSIZE[tensors[n][0]], n))
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name in order:
        dtype, shape, raw = tensors[name]
        n = 1
        for d in shape:
            n *= d
        assert len(raw) == n * ITEMSIZE[dtype], name
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return image(text, data)


f32 = lambda *v: struct.pack(f"<{len(v)}f", *v)
seeds = {
    "valid_f32_2x3": valid({"w": ("F32", [2, 3], f32(1, 2, 3, 4, 5, 6))}),
    "valid_every_dtype": valid({
        "a": ("F64", [2], struct.pack("<2d", 0.5, -1e300)),
        "b": ("I64", [1], struct.pack("<q", -(2**63))),
        "c": ("F32", [1, 2], f32(float("inf"), float("nan"))),
        "d": ("I32", [2], struct.pack("<2i", 7, -7)),
        "e": ("F16", [3], struct.pack("<3H", 0x3C00, 0x7C00, 0x0001)),
        "f": ("BF16", [1, 2], struct.pack("<2H", 0x3F80, 0xFF80)),
        "g": ("BOOL", [4], bytes([0, 1, 1, 0])),
    }, metadata={"format": "pt", "tandem.optimizer": "adam"}),
    "valid_scalar_and_empty": valid({
        "scalar": ("F32", [], f32(3.5)),
        "empty": ("F32", [0, 3], b""),
        "wide_empty": ("I64", [4, 0, 1000000], b""),
    }),
    "valid_no_tensors": valid({}, metadata={"note": "nothing here"}),
    "bad_truncated": valid({"w": ("F32", [2, 3], f32(1, 2, 3, 4, 5, 6))})[:-5],
    "bad_header_length": struct.pack("<Q", 2**63) + b"{}      ",
    "bad_overlap": image(
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        b'"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32(1, 2)),
    "bad_shape_bytes": image(b'{"a":{"dtype":"I32","shape":[3],"data_offsets":[0,8]}}', bytes(8)),
    "bad_bool_byte": image(b'{"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}', bytes([1, 2])),
    "bad_nesting": image(b"{" + b'"a":[' * 40 + b"]" * 40 + b"}", b""),
    "bad_dtype": image(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', bytes(1)),
}
safetensors_seeds = seeds


# ---- fuzz_ops: opcode bytes (case labels of Program::one) and their argument bytes ----
SIZE = {1: 0, 2: 1, 3: 2, 4: 3, 0: 6, 5: 7, 6: 9, 8: 10}  # index into Bytes::small_size's table
FLOAT = {"f32": 0, "f64": 1, "f16": 2, "bf16": 3}            # Bytes::floating_dtype
DTYPE = {"f32": 0, "f64": 1, "f16": 3, "bf16": 4, "i32": 5, "i64": 6, "bool": 7}  # Bytes::dtype


def dim(d, ndim):
    """Bytes::dim's encoding of dim d (-ndim-1 <= d <= ndim+1)."""
    return d + ndim + 1


def shape(*dims):
    return [len(dims)] + [SIZE[d] for d in dims]


def leaf(dims, dtype="f32", grad=True, kind=2):
    """Opcode 1: a floating leaf (kind 0 zeros, 2 randn, 3 ones), maybe requiring grad."""
    return [1] + shape(*dims) + [FLOAT[dtype], kind, 1 if grad else 0]


def int_leaf(dims, dtype="i64"):
    """Opcode 0 with an integer or bool dtype: randint(-3, 4) values (bool: randint too)."""
    return [0] + shape(*dims) + [DTYPE[dtype], 2]


def index(values, dtype_case=3):
    """pick_or_index() choosing make_index(): a 1-D index of small values (0..5); dtype_case 0 i32,
    1 f32, 2 bool, else i64."""
    return [0, len(values), 255, 255] + sum(([0, v] for v in values), []) + [dtype_case]


def index2d(rows, values, dtype_case=3):
    """pick_or_index() choosing make_index(): a [rows, len(values) // rows] index."""
    assert 1 <= rows <= 3
    return [0, len(values) // rows, 0, rows - 1] + sum(([0, v] for v in values), []) + [dtype_case]


ops_seeds = {
    # x [4, 3] @ w [3, 2] -> tanh -> softmax(-1) -> sum; backward at the end.
    "mlp": [7] + leaf([4, 3]) + leaf([3, 2]) + [30, 0, 1, 0] + [18, 2, 2] + [33, 3, dim(-1, 2), 0] + [23, 4, 1, 1],
    # views of a [2, 3, 4] f64 leaf: permute, reshape [4, -1], narrow, expand, flatten, an in-place
    # op on a non-leaf, and a backward run twice without retain_graph (the second is refused).
    "views": [1] + leaf([2, 3, 4], "f64") + [7, 0, 1, 2, 1, 100] + [6, 1, 2, 0, 3, 200, 1]
             + [9, 2, dim(0, 2), 1, 2] + [12, 3, 1, 0, 2, 0, 0] + [15, 4, dim(0, 3), dim(-1, 3)]
             + [46, 0, 1] + [48, 6, 0, 1],
    # index ops on a [5, 3] leaf: index_select, gather, scatter_add, embedding, masked_fill.
    "index": [2] + leaf([5, 3]) + [36, 0, dim(0, 2)] + index([0, 4, 2]) + [37, 0, dim(1, 2)] + index2d(3, [1, 0] * 3)
             + [38, 0, dim(0, 2)] + index2d(1, [1, 4, 3]) + [0, 3, 0] + [42, 0] + index([4, 0])
             + [39, 0, 0, 100, 3, 0],
    # reductions with dims: max(dim, keepdim), var(dims, correction), logsumexp, argmax, amax.
    "reduce": [3] + leaf([3, 4]) + [24, 0, 0, dim(1, 2), 1, 1] + [26, 0, 100, 1, dim(0, 2), 0, 1, 1, 1]
              + [27, 0, 1, dim(-1, 2), 0] + [28, 0, 0, dim(1, 2), 1, 1] + [25, 0, 2, dim(0, 2), dim(1, 2), 1, 1],
    # creation with huge and negative sizes (must be errors), eye/linspace/arange, bounded and not.
    "wild_creation": [4] + [2, 1, 200, 3, 200, 3, 6, 0] + [2, 0, 200, 0, 0, 1]
                     + [2, 2, 200, 7, 200, 7, 200, 9, 1, 2, 9, 0] + [2, 1, 200, 8, 200, 8, 0, 1]
                     + [4, 0, 210, 0, 4, 1, 0] + [4, 5, 0, 0, 0, 1, 2] + [3, 0, 0, 0, 1, 2, 20, 1, 1]
                     + [3, 8, 9, 0, 0, 2, 6],
    # nn: layer_norm over the last dim with new weight and bias, linear, dropout, cat, stack of
    # mismatched shapes, split.
    "nn": [5] + leaf([2, 4]) + leaf([3, 4]) + [34, 0, 1, 1, 1, 0, 3, 1, 1, 0, 0, 1, 0] + [31, 0, 1, 0]
          + [35, 3, 0, 1] + [40, 2, 0, 2, dim(0, 2), 1] + [40, 2, 0, 1, dim(0, 2), 0]
          + [41, 5, dim(0, 2), 0, 0, 1, 1, 1],
    # in place: on a leaf that requires grad (refused), fill_ of a plain leaf, a new leaf from a
    # detached copy, addcmul_, an in-place select of a non-leaf, a second backward, then no_grad.
    "inplace": [6] + leaf([3]) + leaf([3], grad=False) + [43, 0, 1, 4, 3, 0] + [44, 1, 1, 4, 0] + [47, 0, 3]
               + [45, 1, 2, 0, 0, 4, 0] + [46, 2, 3, 1] + [48, 3, 0, 1] + [49] + [43, 0, 1, 0, 3, 0],
    # dtypes: an i32 and a bool leaf, i32 * f16, casts, where, integer clamp, a bool-only op on
    # integers (refused), integer pow.
    # Findings (fixed): each converted an out-of-range double, or (softmax) sized scratch by a
    # dim of an empty view [0, 2^62] and let std::length_error escape.
    "crash-arange-count": [0, 3, 0, 8, 4, 0, 1],                # arange(0.0, 1e30, 2.0)
    "crash-full-inf-i32": [0, 0, 1, 0, 5, 1, 16, 0],            # full([1], inf, i32)
    "crash-fill-inf-i32": [0] + int_leaf([1], "i32")[:-1] + [0] + [44, 0, 1, 16, 0],   # fill_(inf)
    "crash-masked-fill-inf-i32": [0] + int_leaf([1], "i32")[:-1] + [0] + [39, 0, 0, 100, 16, 0],
    "crash-clamp-bound-i32": [0] + int_leaf([1], "i32")[:-1] + [0] + [20, 0, 1, 1, 8, 0],  # clamp(lo=1e30)
    "crash-linspace-i32": [0, 4, 5, 0, 0, 5, 8, 9],             # linspace(1e30, -1e30, 5, i32)
    "crash-softmax-empty-huge-dim": [0] + leaf([0], grad=False, kind=0) + [14, 0, dim(-1, 1)]
                                    + [12, 1, 0, 0, 240, 6] + [33, 2, dim(-1, 2), 1],
    # Finding (fixed): slice(dim 0, step INT64_MAX) multiplied the stride 3 by the step.
    "crash-slice-huge-step": [0] + leaf([2, 3]) + [10, 0, dim(0, 2), 0, 10, 255, 11],
    "dtypes": [8] + int_leaf([2, 3], "i32") + [0] + shape(3) + [DTYPE["bool"], 3] + leaf([2, 3], "f16")
              + [16, 0, 2, 2] + [21, 3, 6] + [19, 0, 2, 0, 1, 100, 0] + [20, 0, 1, 1, 2, 1, 6]
              + [22, 0, 1, 5] + [17, 0, 4, 1, 4],
}


# ---- fuzz_collectives: [world, steps], then per step the shared call and per rank a change byte ----
KIND = {"allreduce": 0, "allreduce_coalesced": 1, "broadcast": 2, "allgather": 3, "allgather_into": 4,
        "reduce_scatter": 5, "reduce_scatter_tensor": 6, "all_to_all": 7, "all_to_all_splits": 8, "barrier": 9}
CDTYPE = {"f32": 0, "f64": 1, "f16": 2, "bf16": 3, "i32": 4, "i64": 5, "bool": 6}
OP = {"sum": 0, "avg": 1, "min": 2, "max": 3, "product": 4}


def call(kind, dtype="f32", count=4, cols=1, op="sum", root=0, split_seed=0):
    return [KIND[kind], CDTYPE[dtype], count, cols - 1, OP[op], root, split_seed]


def world(n, steps):
    return [n - 2, steps - 1]


KEEP = [0]  # a rank that keeps the shared call


def change(field, *arg):
    """A rank's change byte (>= 176; field: 0 kind, 1 dtype, 2 count, 3 op, 4 root, 5 size skew,
    6 an input split, 7 an output split) and the bytes it reads."""
    return [176 + field] + list(arg)


collectives_seeds = {
    "allreduce_sum_2": world(2, 1) + call("allreduce", "f32", 4) + KEEP * 2,
    "mixed_3_ranks": world(3, 4) + call("broadcast", "f64", 5, root=1) + KEEP * 3
                     + call("allgather_into", "i32", 3) + KEEP * 3
                     + call("reduce_scatter_tensor", "bf16", 2, op="max") + KEEP * 3
                     + call("barrier") + KEEP * 3,
    "all_to_all_3": world(3, 2) + call("all_to_all", "i64", 2, cols=2) + KEEP * 3
                    + call("all_to_all_splits", "f32", 0, cols=3, split_seed=7) + KEEP * 3,
    "lists_2": world(2, 3) + call("allgather", "f16", 3) + KEEP * 2 + call("reduce_scatter", "f64", 2, op="product")
               + KEEP * 2 + call("allreduce_coalesced", "bool", 5, op="max") + KEEP * 2,
    "kind_mismatch": world(2, 2) + call("allreduce", "f32", 3) + KEEP + change(0, KIND["broadcast"])
                     + call("barrier") + KEEP * 2,
    "dtype_mismatch_3": world(3, 1) + call("allgather_into", "f32", 2) + KEEP * 2 + change(1, CDTYPE["f64"]),
    "local_errors": world(2, 3) + call("allreduce", "i32", 4, op="avg") + KEEP * 2
                    + call("allgather_into", "f32", 2) + change(5, 3) + KEEP
                    + call("broadcast", "f32", 2) + change(4, 250, 8) + KEEP,
    "wild_splits_3": world(3, 1) + call("all_to_all_splits", "f32", 0, split_seed=2) + KEEP + change(6, 1, 221)
                     + KEEP,
    "count_mismatch": world(2, 1) + call("reduce_scatter_tensor", "f32", 3) + KEEP + change(2, 4),
    # Finding (fixed): rank 0's input splits [INT64_MAX, 1] overflowed their sum.
    "crash-all-to-all-split-overflow": world(2, 1) + call("all_to_all_splits", "f32", 0, split_seed=2)
                                       + change(6, 0, 221) + KEEP,
}


# ---- fuzz_seq_ops: opcode % 16 (Program::one's case labels) and the argument bytes each reads ----
SQ_SIZE = {1: 0, 2: 1, 3: 2, 4: 3, 0: 6, 5: 7, 8: 9, 65: 10, 130: 15}      # Program::size
SQ_HUGE = {2**31: 0, 2**32: 1, 2**62: 2, 2**63 - 1: 3, 3037000500: 4, 2**20: 5, 4097: 6, 2**63 - 2: 7}  # huge
SQ_NDIM = {2: 0, 3: 2, 4: 4, 1: 6, 0: 7, 5: 8}                              # Program::ndim
SCALARS = [0, 1, -1, 0.5, 2, -2.5, 3, 7, 1e30, -1e30, 1e-30, 100, 65504, 1e300, "-0", 0.25, "inf", "-inf", "nan", 4]
LAYOUT = {"contiguous": 0, "transposed": 3, "strided": 4, "expanded": 5, "narrowed": 6, "permuted": 7}
VALUES = {"zeros": 0, "full": 1, "ones": 2, "sprinkled": 3, "random": 4}
I64_MAX, I64_MIN = 2**63 - 1, -(2**63)


def sq_any_size(d):
    """Program::any_size: a size of Program::size's table, or (byte >= 232) one of huge's."""
    return [0, SQ_SIZE[d]] if d in SQ_SIZE else [232, SQ_HUGE[d]]


def sq_huge_empty(dims):
    """Whether make_with builds `dims` as an expanded empty tensor (and reads no bytes for it)."""
    return 0 in dims and any(d > 4096 for d in dims)


def sq_values(kind="random", scalar=None):
    """Program::values: kind, and the Scalar (Bytes::any_scalar: value, then the integer flag)."""
    if kind in ("full", "sprinkled"):
        return [VALUES[kind], SCALARS.index(scalar), 0]
    return [VALUES[kind]]


def sq_make(dims, layout="contiguous", kind="random", scalar=None, extra=()):
    """Program::make: the layout byte and its bytes (expanded: a flag per dim, 1 = broadcast from
    size 1; narrowed: dim, offset - 1, extra), then the values."""
    if sq_huge_empty(dims):
        return []
    return [LAYOUT[layout]] + list(extra) + sq_values(kind, scalar)


def sq_operand(dims, dtype="f32", grad=True, **make):
    """Program::operand(fresh = true): ndim, sizes, dtype (floating or any), grad flag, make."""
    dt = [0, FLOAT[dtype]] if dtype in FLOAT else [200, DTYPE[dtype]]
    return [SQ_NDIM[len(dims)]] + sum((sq_any_size(d) for d in dims), []) + dt + [1 if grad else 0] \
        + sq_make(dims, **make)


def sq_leaf(dims, dtype="f32", grad=True, **make):
    """Opcodes 0 (floating) and 1 (any dtype): a new tensor on the stack."""
    op, dt = (0, FLOAT[dtype]) if dtype in FLOAT else (1, DTYPE[dtype])
    return [op, SQ_NDIM[len(dims)]] + sum((sq_any_size(d) for d in dims), []) + [dt, 1 if grad else 0] \
        + sq_make(dims, **make)


def sq_diagonal(d):
    extremes = [I64_MAX, I64_MIN, I64_MAX - 1, I64_MIN + 1, 2**31, -(2**31), 2**62, -(2**62)]
    return [d + 8] if -8 <= d <= 8 else [208 + extremes.index(d)]


def sq_count(k, n):
    """Program::count_arg for a dim of size n: k in [0, n + 1] (past 64: 0, 1, n, n + 1 or k = 4 mod 5
    below 224), or one of the extremes."""
    extremes = [-1, I64_MIN, I64_MAX, 2**31, 2**32, 2**62, -(2**31), 4097]
    if k in extremes and not 0 <= k <= n + 1:
        return [224 + extremes.index(k)]
    if n <= 64:
        return [k]
    if k in (0, 1, n, n + 1):
        return [[0, 1, n, n + 1].index(k)]
    assert k % 5 == 4 and k < 224 and k < n, k
    return [k]


def sq_triangle(x, diagonal, lower=True, grad_check=True):
    """Opcode 3: tril/triu of x (a sq_operand's bytes, or ("pick", slot))."""
    fresh = not isinstance(x, tuple)
    return [3, 1 if fresh else 0] + (x if fresh else [x[1]]) + sq_diagonal(diagonal) + [1 if lower else 0] \
        + ([1 if grad_check else 0] if fresh else [])


def sq_topk(x, ndim, dim, k, n, largest=True, sorted_=True, grad_check=True):
    fresh = not isinstance(x, tuple)
    return [4, 1 if fresh else 0] + (x if fresh else [x[1]]) + [dim + ndim + 1] + sq_count(k, n) \
        + [1 if largest else 0, 1 if sorted_ else 0] + ([1 if grad_check else 0] if fresh else [])


PROB_NDIM = {1: 0, 2: 1, 0: 4, 3: 5}
PROB_WIDTH = [1, 2, 3, 4, 5, 8, 0, 33, 64, 100, 1000, 4096]
PROB_KIND = {"abs_randn": 0, "rand": 1, "sparse": 2, "softmax": 3, "values": 4}


def sq_multinomial(dims, num_samples, replacement, dtype="f32", kind="softmax", layout="contiguous", extra=(),
                   values=()):
    """Opcode 5 with new probabilities (make_probs): rows of Program::size, a width of PROB_WIDTH."""
    lead = sum(([0, SQ_SIZE[d]] for d in dims[:-1]), [])
    dt = [0, FLOAT[dtype]] if dtype in FLOAT else [230, DTYPE[dtype]]
    probs = [PROB_NDIM[len(dims)]] + lead + ([PROB_WIDTH.index(dims[-1])] if dims else []) + dt \
        + [PROB_KIND[kind], 0] + ([] if sq_huge_empty(dims) else [LAYOUT[layout]] + list(extra) + list(values))
    n = dims[-1] if dims else 1
    return [5, 64] + probs + sq_count(num_samples, n) + [1 if replacement else 0]


ATTN_NDIM = {4: 0, 3: 1, 2: 2, 5: 5, 1: 6}
ATTN_LEAD = {1: 0, 2: 1, 3: 3, 0: 4, 4: 7}
ATTN_SIZE = {1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 8: 5, 0: 6, 64: 11, 65: 12, 16: 15}
DROPOUT = {0: 0, 0.5: 4, 0.1: 5, 1e-300: 6, 0.999999: 7, 1.0: 9, "-0": 10, -0.5: 11, "nan": 12, "inf": 13, 0.25: 15}
SCALE = [1, 0, -1, 0.125, 1e30, -1e30, 1e300, "nan", "inf", "-inf", 1e-300, 2.5, 8, "-0", 1e-3, 100]
MASK_FORM = {"full": 0, "LS": 1, "1S": 2, "L1": 3, "S": 4, "0-dim": 5, "ones_lead": 6, "wrong_L": 7, "SL": 8,
             "extra_dim": 9, "tril": 10}
MASK_KIND_BOOL = {"true": 0, "false": 1, "half": 2, "sparse": 3}
MASK_KIND_FLOAT = {"zeros": 0, "randn": 1, "-inf": 2, "all_-inf": 3, "values": 4}
WRONG = {"E": 0, "S": 1, "batch": 2, "fewer_dims": 3, "v_dtype": 4, "k_dtype": 5, "more_dims": 6, "Ev0": 7}


def sq_attn_size(d):
    return [ATTN_SIZE[d]] if d in ATTN_SIZE else [244, SQ_HUGE[d]]


def sq_mask(form=None, dtype="bool", kind="half", grad=False, layout="contiguous", diagonal=0, dims=None):
    """Program::make_mask: none, or form, dtype (bool / the query's / another float / i64), kind, grad,
    then tril's diagonal or make_with's bytes (values only for kind "values")."""
    if form is None:
        return [0]
    which = {"bool": 0, "q": 4, "other": 6, "i64": 7}[dtype]
    kinds = MASK_KIND_BOOL if dtype == "bool" else MASK_KIND_FLOAT
    out = [128, MASK_FORM[form], which, kinds[kind], 1 if grad else 0]
    if form == "tril":
        return out + sq_diagonal(diagonal)
    if dims is not None and sq_huge_empty(dims):
        return out
    return out + [LAYOUT[layout]] + ([VALUES["random"]] if kind == "values" or dtype == "i64" else [])


def sq_attention(lead, L, S, E, Ev, dtype="f32", wrong=None, grads=(1, 1, 1), layouts=("contiguous",) * 3,
                 mask=(0,), causal=False, dropout=0, scale=None, backward=True):
    """Opcode 6: a new problem q [*lead, L, E], k [*lead, S, E], v [*lead, S, Ev] (layouts without
    extra bytes: contiguous, transposed, strided, permuted), its mask (sq_mask), causal, dropout_p,
    scale (None: 1 / sqrt(E)), backward."""
    nd = len(lead) + 2
    dt = [0, FLOAT[dtype]] if dtype in FLOAT else [230, DTYPE[dtype]]
    out = [6] + dt + [ATTN_NDIM[nd]] + sum(([ATTN_LEAD[d]] if d in ATTN_LEAD else [248, SQ_HUGE[d]] for d in lead), [])
    out += sq_attn_size(L) + sq_attn_size(S) + sq_attn_size(E) + sq_attn_size(Ev)
    out += [0] if wrong is None else [200 + WRONG[wrong]]
    out += list(grads)
    for dims, layout in zip(([*lead, L, E], [*lead, S, E], [*lead, S, Ev]), layouts):
        out += sq_make(dims, layout)
    out += list(mask) + [1 if causal else 0, DROPOUT[dropout]]
    out += [0] if scale is None else [160 + SCALE.index(scale)]
    return out + [1 if backward else 0]


MAX_NORM = [1, 0.5, 0, 1e-30, 1e30, 100, "inf", -1, "nan", "-0", 1e-6, 2]
NORM_TYPE = [2, 2, 1, "inf", 3, 0.5, 0, -1, "nan", "-inf", 1e30, 2.5]


def sq_param(dims, dtype="f32", values=("random",), grad="backward", layout="contiguous"):
    """One clip_grad_norm_ parameter, new: Bytes::small_shape(3), dtype, values, then its gradient
    from sum(p * p).backward(), set by hand (make: a layout, random values), none, or zeros."""
    source = {"backward": [0], "set": [1, LAYOUT[layout], VALUES["random"]], "none": [2], "zeros": [3]}[grad]
    return [0, len(dims)] + [SIZE[d] for d in dims] + [FLOAT[dtype]] + sq_values(*values) + source


def sq_clip(params, max_norm=1, norm_type=2, error_if_nonfinite=False, form=0):
    """Opcode 8. params: sq_param's bytes, or "undefined", "duplicate", "empty", ("leaf", i), ("pick", i)."""
    out = [8, len(params)]
    for p in params:
        if p == "undefined":
            out += [4]
        elif p == "duplicate":
            out += [6]
        elif p == "empty":
            out += [7]
        elif isinstance(p, tuple):
            out += [3 if p[0] == "leaf" else 5, p[1]]
        else:
            out += p
    return out + [MAX_NORM.index(max_norm), NORM_TYPE.index(norm_type), 1 if error_if_nonfinite else 0, form]


SAMPLE_VOCAB = [1, 2, 5, 8, 33, 100, 1000, 3]
TEMPERATURE = [1, 0.7, 2, 1e-3, 0, -1, "inf", "nan"]


def sq_sample(rows, vocab, k, num_samples=1, replacement=False, dtype="f32", temperature=1, kind="random"):
    """Opcode 12: top-k sampling from new logits [rows, vocab] ([vocab] for rows 0)."""
    dims = [vocab] if rows == 0 else [rows, vocab]
    return [12, rows, SAMPLE_VOCAB.index(vocab), FLOAT[dtype], 1] + sq_make(dims, kind=kind) \
        + [TEMPERATURE.index(temperature)] + sq_count(k, vocab) + [num_samples - 1, 1 if replacement else 0]


BLOCK_T = [1, 2, 3, 4, 5, 8, 65, 0]
BLOCK_D = [1, 2, 4, 0]


def sq_block(B, T, H, D, dtype="f32", dropout=0, scale=None, max_norm=1, x_layout="contiguous"):
    """Opcode 13: a causal self-attention block on x [B, T, H * D], then clip_grad_norm_ of x and w."""
    C = H * D
    return [13, B - 1, BLOCK_T.index(T), H - 1, BLOCK_D.index(D), FLOAT[dtype]] + sq_make([B, T, C], x_layout) \
        + sq_make([C, 3 * C]) + [DROPOUT[dropout]] + ([0] if scale is None else [160 + SCALE.index(scale)]) \
        + [MAX_NORM.index(max_norm)]


def sq_huge_empty_op(zero_at, dims, dtype="f32", grad=True):
    """Opcode 2: an empty tensor with huge sizes (dims: sizes, 0 at zero_at)."""
    out = [2, len(dims) - 1] + ([1] if zero_at == 0 else [0, zero_at])
    for i, d in enumerate(dims):
        if i != zero_at:
            out += [1, SQ_HUGE[d]] if d in SQ_HUGE else [0, SQ_SIZE[d]]
    return out + [DTYPE[dtype], 1 if grad else 0]


seq_ops_seeds = {
    # tril(diagonal 1) of an f32 [3, 4] leaf and triu(-1) of a transposed f64 one, both with their
    # gradient checked; tril of a bool tensor, with diagonal INT64_MIN; triu of a 1-D tensor (refused);
    # tril of an empty [0, 2^62, 3] view.
    "triangles": [1] + sq_triangle(sq_operand([3, 4]), 1)
                 + sq_triangle(sq_operand([4, 3], "f64", layout="transposed"), -1, lower=False)
                 + sq_leaf([3, 5], "bool", grad=False, kind="random")
                 + sq_triangle(("pick", 2), I64_MIN) + sq_triangle(sq_operand([4]), 0, lower=False)
                 + sq_triangle(sq_operand([0, 2**62, 3], grad=False), 2),
    # topk: k 3 of the last dim of [4, 8] with NaN sprinkled in (largest, sorted, gradient checked);
    # the 2 smallest of dim 0 of a strided [5, 3] f16 view, unsorted; k one too many (refused); a
    # bool input (refused); a 0-dim input with k 0; dim INT64_MIN (refused).
    "topk": [2] + sq_topk(sq_operand([4, 8], kind="sprinkled", scalar="nan"), 2, -1, 3, 8)
            + sq_topk(sq_operand([5, 3], "f16", layout="strided"), 2, 0, 2, 5, largest=False, sorted_=False)
            + sq_topk(sq_operand([2, 3], "f64"), 2, 1, 4, 3)
            + sq_topk(sq_operand([3, 3], "bool", grad=False), 2, 1, 1, 3)
            + sq_topk(sq_operand([], "f32"), 0, -1, 0, 1)
            + [4, 0, 0, 240] + sq_count(1, 1) + [1, 1],
    # multinomial: 4 of 8 without replacement from softmax rows [3, 8]; 6 of 5 with replacement
    # from rand [5]; 2 of 4 without replacement from sparse 0/1 rows (refused when a row has fewer
    # than 2 non-zero); 4 of 1000 with replacement from bf16 [2, 1000]; i64 probabilities (refused);
    # an empty [0, 33] batch.
    "multinomial": [3] + sq_multinomial([3, 8], 4, False) + sq_multinomial([5], 6, True, kind="rand")
                   + sq_multinomial([4, 4], 2, False, kind="sparse")
                   + sq_multinomial([2, 1000], 4, True, "bf16", kind="abs_randn")
                   + sq_multinomial([3], 1, True, "i64", kind="values", values=[4])
                   + sq_multinomial([0, 33], 2, False, "f64", kind="rand"),
    # attention: q, k, v [2, 2, 5, 4] with a bool mask [L, S] broadcast over batch and heads,
    # backward; causal with L 3 != S 5 on transposed q and strided k; f16 with a float mask that is
    # -inf in places, dropout 0.5; L 65 and S 64 (two query tiles) in f64 with an explicit scale.
    "attention": [4] + sq_attention([2, 2], 5, 5, 4, 4, mask=sq_mask("LS", "bool", "half"))
                 + sq_attention([2], 3, 5, 4, 2, layouts=("transposed", "strided", "contiguous"), causal=True)
                 + sq_attention([1, 2], 4, 4, 2, 3, "f16", mask=sq_mask("1S", "q", "-inf"), dropout=0.5)
                 + sq_attention([], 65, 64, 4, 2, "f64", scale=0.125, grads=(1, 0, 1)),
    # masks that fully mask rows: all-false bool, all -inf float (their rows are 0), tril's mask with
    # diagonal -2 (rows 0 and 1 fully masked), a mask that needs grad; causal with L 5 > S 2.
    "attention_masks": [5] + sq_attention([2], 4, 3, 2, 2, mask=sq_mask("full", "bool", "false"))
                       + sq_attention([1, 1], 3, 4, 2, 2, mask=sq_mask("L1", "q", "all_-inf"))
                       + sq_attention([2], 4, 4, 2, 2, mask=sq_mask("tril", "bool", diagonal=-2))
                       + sq_attention([2, 2], 3, 3, 2, 2, "f64", mask=sq_mask("S", "q", "randn", grad=True))
                       + sq_attention([1], 5, 2, 3, 3, causal=True, dropout=0.1),
    # refusals: a mask with is_causal, E differing between q and k, an i64 query, dropout_p 1,
    # scale NaN, a mask of shape [S, L], a mask of the wrong dtype, a mask with a dim too many.
    "attention_errors": [6] + sq_attention([2], 3, 3, 2, 2, mask=sq_mask("LS", "bool", "true"), causal=True)
                        + sq_attention([2], 3, 3, 2, 2, wrong="E") + sq_attention([2], 3, 3, 2, 2, "i64")
                        + sq_attention([2], 3, 3, 2, 2, dropout=1.0) + sq_attention([2], 3, 3, 2, 2, scale="nan")
                        + sq_attention([1], 2, 3, 2, 2, mask=sq_mask("SL", "bool", "half"))
                        + sq_attention([1], 2, 3, 2, 2, mask=sq_mask("LS", "i64", "zeros"))
                        + sq_attention([1], 2, 3, 2, 2, mask=sq_mask("extra_dim", "bool", "true")),
    # empty problems with huge sizes: L = S = 2^32 with E = Ev = 0 (B * H * L * S is past int64);
    # an empty batch with L 2^62; S 0 (every row fully masked: 0); E 0 (scores 0 + bias); L 2^62
    # with E 0 and Ev 1 (an output of 2^62 elements: refused).
    "attention_huge": [7] + sq_attention([], 2**32, 2**32, 0, 0)
                      + sq_attention([0], 2**62, 3, 2, 2) + sq_attention([2], 3, 0, 2, 2)
                      + sq_attention([2], 3, 3, 0, 2, scale=2.5) + sq_attention([], 2**62, 2, 0, 1),
    # clip_grad_norm_: two parameters with gradients from a backward (max_norm 1: clipped); one
    # with a gradient set by hand as a transposed view, norm inf; a NaN gradient with
    # error_if_nonfinite (refused) and without (scaled by NaN); a parameter twice; an undefined
    # one (refused); norm_type 0 (refused); as a dict.
    "clip": [8] + sq_clip([sq_param([3, 4]), sq_param([4], "f64")], 1, 2)
            + sq_clip([sq_param([2, 3], grad="set", layout="transposed")], 0.5, "inf", form=1)
            + sq_clip([sq_param([3], values=("full", "nan"))], 1, 2, True)
            + sq_clip([sq_param([3], "bf16", values=("sprinkled", "nan"))], 1, 2, False)
            + sq_clip([sq_param([2, 2], "f16"), "duplicate", "empty"], 1e-6, 3)
            + sq_clip([sq_param([2]), "undefined"], 1, 2) + sq_clip([("leaf", 0)], 1, 0)
            + sq_clip([("leaf", 1), ("leaf", 2)], 100, 0.5, form=2),
    # a GPT's pieces: a causal self-attention block (B 2, T 8, 2 heads of 4) with clipping, one with
    # T 65 and dropout, then top-k sampling of 2 rows of 100 logits (k 9), of 1-D logits with
    # temperature 0 (inf logits: refused downstream), of bf16 logits with k = vocab.
    "gpt": [9] + sq_block(2, 8, 2, 4) + sq_block(1, 65, 1, 2, dropout=0.1, max_norm=0.5)
           + sq_sample(2, 100, 9, 2, True) + sq_sample(0, 33, 5, 1, temperature=0)
           + sq_sample(1, 8, 8, 3, False, "bf16") + [9, 0, 0, 0],
    # empty tensors with huge sizes through every op: [0, 2^62]; [2^62, 2^62, 0] (refused: the sizes
    # multiply past int64 before the 0); tril; topk with k 0 of dim 0 and k 2^62 of dim 1;
    # multinomial of the [0, 2^62] rows, 2^62 samples each; then 2 * it, transposed.
    "huge_empty": [10] + sq_huge_empty_op(0, [0, 2**62]) + sq_huge_empty_op(2, [2**62, 2**62, 0], "bf16")
                  + sq_triangle(("pick", 0), 5) + [4, 0, 0, dim(0, 2)] + sq_count(0, 0) + [1, 1]
                  + [4, 0, 0, dim(1, 2)] + [2] + [1, 1] + [5, 0, 0, 2, 1] + [10, 0, 5, 4, 0] + [11, 0, 1],
}


def idx(type_code, dims, payload, dtype=0):
    """An IDX file (magic 00 00 type ndim, big-endian u32 dims, payload) behind fuzz_idx's dtype
    byte (0 f32, 1 f64, 2 f16, 3 bf16, 4 i32, 5 i64, 6 bool)."""
    head = bytes([0, 0, type_code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims)
    return bytes([dtype]) + head + payload


def gz(seed):
    """The same seed with its file gzipped (mtime 0, so the bytes are reproducible)."""
    return seed[:1] + gzip.compress(seed[1:], mtime=0)


idx_images = idx(0x08, [2, 3, 3], bytes(range(0, 180, 10)))
idx_seeds = {
    "u8_images": idx_images,
    "u8_images_gz": gz(idx_images),
    "u8_labels_i64": idx(0x08, [5], bytes([0, 9, 3, 1, 7]), dtype=5),
    "i8_bool": idx(0x09, [4], bytes([0, 1, 0xFF, 0x80]), dtype=6),
    "i16_i32": idx(0x0B, [2, 2], struct.pack(">4h", -1, 2, -32768, 32767), dtype=4),
    "i32_f64": idx(0x0C, [3], struct.pack(">3i", -7, 2**31 - 1, 0), dtype=1),
    "f32_f16": idx(0x0D, [2], struct.pack(">2f", 1.5, -70000.0), dtype=2),
    "f64_bf16_gz": gz(idx(0x0E, [2], struct.pack(">2d", 3.25, 1e300), dtype=3)),
    "zero_dim": idx(0x08, [0, 4], b""),
    "scalar": idx(0x08, [], b"\x2a"),
    "bad_magic": bytes([0]) + b"\x1f\x00\x08\x01" + struct.pack(">I", 1) + b"x",
    "float_as_int": idx(0x0D, [1], struct.pack(">f", 2.0), dtype=4),
    "too_short": idx(0x08, [4, 4], bytes(10)),
    "too_long": idx(0x08, [2], bytes(3)),
    "huge_dims": idx(0x08, [0xFFFFFFFF, 0xFFFFFFFF, 16], bytes(8)),
    "truncated_gz": gz(idx_images)[:-9],
    "bad_crc_gz": gz(idx_images)[:-8] + b"\0\0\0\0" + gz(idx_images)[-4:],
}

tables = [("safetensors", safetensors_seeds), ("ops", ops_seeds), ("collectives", collectives_seeds),
          ("idx", idx_seeds), ("seq_ops", seq_ops_seeds)]
for name, table in tables:
    if len(sys.argv) > 1 and name not in sys.argv[1:]:
        continue
    out_dir = os.path.join(corpus_dir, name)
    os.makedirs(out_dir, exist_ok=True)
    for seed_name, data in table.items():
        with open(os.path.join(out_dir, seed_name), "wb") as f:
            f.write(bytes(data))
    print(f"{len(table)} seeds in {out_dir}")
