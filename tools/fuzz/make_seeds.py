#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzzers (tools/fuzz/corpus/<name>/).

safetensors: valid files laid out as Tandem's save_safetensors writes them (compact JSON, padded
with spaces to a multiple of 8, tensors by decreasing element size then name), and malformed ones
that each break one rule the loader checks.
idx: IDX files, plain and gzipped, of every element type, and broken ones (bad magic, payload
too short or too long, truncated gzip, CRC error).
ops, collectives: small programs in the byte encodings that fuzz_ops.cpp and fuzz_collectives.cpp
read (each helper below mirrors one op's reads; a reader past the end yields zeros).

crash-*: minimal inputs reproducing what the fuzzers found, each named by the regression test
that covers it (tests/<area>/test_*.cpp, tagged [fuzz]); they run with the other seeds every time.

Run it again only to change the seeds; the bytes are committed.
"""
import gzip
import json
import os
import struct

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

for name, table in [("safetensors", safetensors_seeds), ("ops", ops_seeds), ("collectives", collectives_seeds), ("idx", idx_seeds)]:
    out_dir = os.path.join(corpus_dir, name)
    os.makedirs(out_dir, exist_ok=True)
    for seed_name, data in table.items():
        with open(os.path.join(out_dir, seed_name), "wb") as f:
            f.write(bytes(data))
    print(f"{len(table)} seeds in {out_dir}")
