# The op families' tables merged: every op's PyTorch implementation (OPS: name -> function of the
# step's input tensors and arguments; tests/parity/test_parity.cpp maps the same names to Tandem
# calls), how close its inputs come to a point where it is not differentiable (KINKS), and the
# checks of its result that redraw a case (POSTCHECKS).

from . import attention, creation, elementwise, index, inplace, matmul, nn, reduce, topk, triangle, views

FAMILIES = (views, elementwise, creation, inplace, reduce, matmul, nn, index, triangle, topk, attention)


def _merge(table):
    merged = {}
    for family in FAMILIES:
        for name, fn in getattr(family, table, {}).items():
            if name in merged:
                raise RuntimeError(f"{table}: {name} is defined by two op families")
            merged[name] = fn
    return merged


OPS = _merge("OPS")
KINKS = _merge("KINKS")
POSTCHECKS = _merge("POSTCHECKS")
