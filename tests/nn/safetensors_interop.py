#!/usr/bin/env python3
"""Cross-checks Tandem's safetensors files against the reference Python package.

  safetensors_interop.py check PATH   -- PATH (written by Tandem) must hold the expected tensors
  safetensors_interop.py write PATH   -- writes the expected tensors with safetensors.numpy

test_safetensors.cpp runs it when `import safetensors, numpy` works (pip install safetensors numpy).
The expected content here must match expected_interop_tensors() in test_safetensors.cpp.
"""
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def expected():
    return {
        "f32": (np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5),
        "f64": np.array([1.5, -2.25], dtype=np.float64),
        "f16": np.array([0.5, -1.0, 65504.0], dtype=np.float16),
        "i32": np.array([[1, -2], [3, 4]], dtype=np.int32),
        "i64": np.array([2**40, -7], dtype=np.int64),
        "bool": np.array([True, False, True]),
        "scalar": np.array(3.25, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


def main():
    mode, path = sys.argv[1], sys.argv[2]
    want = expected()
    if mode == "write":
        save_file(want, path, metadata={"origin": "python"})
        return 0
    got = load_file(path)
    if set(got) != set(want):
        print(f"names differ: {sorted(got)} vs {sorted(want)}")
        return 1
    for k, v in want.items():
        g = got[k]
        if g.dtype != v.dtype or g.shape != v.shape or not np.array_equal(g, v):
            print(f"tensor {k}: got {g.dtype} {g.shape} {g!r}, want {v.dtype} {v.shape} {v!r}")
            return 1
    with safe_open(path, framework="numpy") as f:
        if f.metadata() != {"origin": "tandem"}:
            print(f"metadata: {f.metadata()}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
