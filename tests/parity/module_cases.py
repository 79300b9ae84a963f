#!/usr/bin/python3
# Module-level PyTorch parity for nn::MultiheadAttention, TransformerEncoderLayer and
# TransformerDecoderLayer: tests/parity/test_module_parity.cpp runs this with Debian's
# /usr/bin/python3 (python3-torch) and replays every case in Tandem.
#
# Each case builds the torch module in float64 with dropout 0 (Tandem's dropout bits are Philox's,
# not PyTorch's generator's), draws its inputs, runs forward and backward with a random upstream
# gradient, and writes to <out>/module_cases.safetensors:
#   <case>/param/<state dict key>   the module's parameters, loaded into Tandem by these names
#   <case>/in/<input name>          the inputs given (absent: the input is left out)
#   <case>/out, <case>/grad_out     the output and its upstream gradient
#   <case>/weights, <case>/grad_weights   with need_weights: the attention weights and theirs
#   <case>/grad/<name>              the gradient of each floating input and of each parameter
# and to <out>/module_cases.json the manifest: per case the module kind, its constructor
# arguments, the inputs given (name, slot in Tandem's forward_inputs, dtype, whether it requires
# grad, or which input it is the same tensor as) and the parameter names.
#
# Bool masks never block a query's every key: PyTorch gives NaN there, Tandem 0 (documented in
# nn/transformer.h). Mask mixes are those PyTorch 1.13 accepts (bool + bool, float attn_mask + bool
# key_padding_mask, one float mask alone).
import argparse
import json
import os
import sys

import torch

sys.dont_write_bytecode = True  # imported from the source tree: leave no __pycache__ there
from generate_cases import write_safetensors  # noqa: E402  (the hand-written safetensors writer)

# Input slots of Tandem's forward_inputs, per module kind.
SLOTS = {
    "mha": ["query", "key", "value", "key_padding_mask", "attn_mask"],
    "encoder": ["src", "src_mask", "src_key_padding_mask"],
    "decoder": ["tgt", "memory", "tgt_mask", "memory_mask", "tgt_key_padding_mask", "memory_key_padding_mask"],
}

# name, kind, constructor arguments, "unbatched" or None, inputs (name -> spec), need_weights,
# average_attn_weights. Input specs: ("seq", length) a sequence; ("same", other) the same tensor
# as another input; ("pad", keys) a bool key_padding_mask; ("fpad", keys) a float one (about -1e4
# where padded, requires grad); ("bool", L, S) a bool
# attn_mask; ("causal", L) the usual triangular one; ("float", L, S) a float attn_mask (requires
# grad); ("float3", L, S) and ("bool3", L, S) per batch element and head [N * nhead, L, S].
# N (batch) is 3 and E (embed_dim / d_model) is 8 throughout; unbatched cases have N None.
CASES = [
    ("mha_self", "mha", {"embed_dim": 8, "num_heads": 2, "bias": True, "batch_first": False}, None,
     {"query": ("seq", 5), "key": ("same", "query"), "value": ("same", "query")}, False, True),
    ("mha_cross_padding_weights", "mha", {"embed_dim": 8, "num_heads": 2, "bias": True, "batch_first": True}, None,
     {"query": ("seq", 4), "key": ("seq", 6), "value": ("same", "key"), "key_padding_mask": ("pad", 6)}, True, True),
    ("mha_kv_bool_mask", "mha", {"embed_dim": 8, "num_heads": 4, "bias": True, "batch_first": False}, None,
     {"query": ("seq", 4), "key": ("seq", 5), "value": ("seq", 5), "attn_mask": ("bool", 4, 5),
      "key_padding_mask": ("pad", 5)}, False, True),
    ("mha_float_mask_per_head_weights", "mha", {"embed_dim": 8, "num_heads": 2, "bias": True, "batch_first": True},
     None, {"query": ("seq", 5), "key": ("same", "query"), "value": ("same", "query"), "attn_mask": ("float", 5, 5),
            "key_padding_mask": ("pad", 5)}, True, False),
    ("mha_float3_mask", "mha", {"embed_dim": 8, "num_heads": 2, "bias": True, "batch_first": False}, None,
     {"query": ("seq", 3), "key": ("seq", 4), "value": ("same", "key"), "attn_mask": ("float3", 3, 4)}, False, True),
    ("mha_bool3_mask", "mha", {"embed_dim": 8, "num_heads": 2, "bias": True, "batch_first": True}, None,
     {"query": ("seq", 4), "key": ("same", "query"), "value": ("same", "query"), "attn_mask": ("bool3", 4, 4),
      "key_padding_mask": ("pad", 4)}, True, False),
    ("mha_float_padding", "mha", {"embed_dim": 8, "num_heads": 2, "bias": True, "batch_first": False}, None,
     {"query": ("seq", 4), "key": ("seq", 5), "value": ("same", "key"), "key_padding_mask": ("fpad", 5)},
     False, True),
    ("mha_unbatched", "mha", {"embed_dim": 8, "num_heads": 2, "bias": True, "batch_first": True}, "unbatched",
     {"query": ("seq", 4), "key": ("seq", 5), "value": ("same", "key"), "key_padding_mask": ("pad", 5),
      "attn_mask": ("bool3", 4, 5)}, True, True),
    ("mha_no_bias", "mha", {"embed_dim": 8, "num_heads": 2, "bias": False, "batch_first": False}, None,
     {"query": ("seq", 4), "key": ("same", "query"), "value": ("same", "query"), "attn_mask": ("causal", 4)},
     True, True),
    ("encoder_post_relu", "encoder", {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "activation": "relu",
                                      "layer_norm_eps": 1e-5, "batch_first": False, "norm_first": False}, None,
     {"src": ("seq", 5), "src_mask": ("causal", 5), "src_key_padding_mask": ("pad", 5)}, False, True),
    ("encoder_pre_gelu", "encoder", {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "activation": "gelu",
                                     "layer_norm_eps": 1e-5, "batch_first": True, "norm_first": True}, None,
     {"src": ("seq", 4), "src_mask": ("float", 4, 4), "src_key_padding_mask": ("pad", 4)}, False, True),
    ("encoder_post_gelu", "encoder", {"d_model": 8, "nhead": 4, "dim_feedforward": 12, "activation": "gelu",
                                      "layer_norm_eps": 1e-6, "batch_first": True, "norm_first": False}, None,
     {"src": ("seq", 4), "src_key_padding_mask": ("pad", 4)}, False, True),
    ("encoder_pre_relu_unbatched", "encoder", {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "activation": "relu",
                                               "layer_norm_eps": 1e-5, "batch_first": False, "norm_first": True},
     "unbatched", {"src": ("seq", 5)}, False, True),
    ("decoder_post_relu", "decoder", {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "activation": "relu",
                                      "layer_norm_eps": 1e-5, "batch_first": False, "norm_first": False}, None,
     {"tgt": ("seq", 4), "memory": ("seq", 6), "tgt_mask": ("causal", 4), "tgt_key_padding_mask": ("pad", 4),
      "memory_key_padding_mask": ("pad", 6)}, False, True),
    ("decoder_pre_gelu", "decoder", {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "activation": "gelu",
                                     "layer_norm_eps": 1e-5, "batch_first": True, "norm_first": True}, None,
     {"tgt": ("seq", 5), "memory": ("seq", 3), "tgt_mask": ("float", 5, 5), "memory_mask": ("bool", 5, 3)},
     False, True),
]

N, E = 3, 8


def build(kind, args):
    if kind == "mha":
        return torch.nn.MultiheadAttention(args["embed_dim"], args["num_heads"], dropout=0.0, bias=args["bias"],
                                           batch_first=args["batch_first"])
    layer = torch.nn.TransformerEncoderLayer if kind == "encoder" else torch.nn.TransformerDecoderLayer
    return layer(args["d_model"], args["nhead"], dim_feedforward=args["dim_feedforward"], dropout=0.0,
                 activation=args["activation"], layer_norm_eps=args["layer_norm_eps"],
                 batch_first=args["batch_first"], norm_first=args["norm_first"])


def draw_inputs(gen, kind, args, unbatched, specs):
    batch_first = args["batch_first"]
    heads = args.get("num_heads", args.get("nhead"))

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def blocked(L, S):  # true: not allowed; key 0 always allowed, so no query loses every key
        m = torch.rand(L, S, generator=gen) < 0.3
        m[:, 0] = False
        return m

    inputs = {}
    for name, spec in specs.items():
        what = spec[0]
        if what == "seq":
            shape = (spec[1], E) if unbatched else ((N, spec[1], E) if batch_first else (spec[1], N, E))
            inputs[name] = randn(*shape).requires_grad_()
        elif what == "same":
            inputs[name] = inputs[spec[1]]
        elif what in ("pad", "fpad"):
            pad = torch.rand(*(() if unbatched else (N,)), spec[1], generator=gen) < 0.3
            pad[..., 0] = False
            inputs[name] = pad if what == "pad" else (pad.double() * -1e4 + randn(*pad.shape) * 0.1).requires_grad_()
        elif what == "bool":
            inputs[name] = blocked(spec[1], spec[2])
        elif what == "causal":
            inputs[name] = torch.triu(torch.ones(spec[1], spec[1], dtype=torch.bool), 1)
        elif what == "float":
            inputs[name] = randn(spec[1], spec[2]).requires_grad_()
        elif what in ("float3", "bool3"):
            count = heads if unbatched else N * heads
            if what == "float3":
                inputs[name] = randn(count, spec[1], spec[2]).requires_grad_()
            else:
                inputs[name] = torch.stack([blocked(spec[1], spec[2]) for _ in range(count)])
        else:
            raise ValueError(f"unknown input spec {spec}")
    return inputs


def forward(module, kind, given, need_weights, average):
    if kind == "mha":
        return module(given["query"], given["key"], given["value"], key_padding_mask=given.get("key_padding_mask"),
                      attn_mask=given.get("attn_mask"), need_weights=need_weights,
                      average_attn_weights=average)
    if kind == "encoder":
        return module(given["src"], src_mask=given.get("src_mask"),
                      src_key_padding_mask=given.get("src_key_padding_mask")), None
    return module(given["tgt"], given["memory"], tgt_mask=given.get("tgt_mask"), memory_mask=given.get("memory_mask"),
                  tgt_key_padding_mask=given.get("tgt_key_padding_mask"),
                  memory_key_padding_mask=given.get("memory_key_padding_mask")), None


def run_case(seed, index, case, tensors):
    name, kind, args, unbatched, specs, need_weights, average = case
    torch.manual_seed(seed * 1000 + index)
    gen = torch.Generator().manual_seed(seed * 1000 + index)
    module = build(kind, args).double()
    # Biases away from their zero init, so their gradients and the biases' part of every output
    # are exercised.
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.1)
    inputs = draw_inputs(gen, kind, args, unbatched == "unbatched", specs)
    out, weights = forward(module, kind, inputs, need_weights, average)
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    roots, grads = [out], [grad_out]
    if weights is not None:
        grad_weights = torch.randn(weights.shape, generator=gen, dtype=torch.float64)
        roots.append(weights)
        grads.append(grad_weights)
        tensors[f"{name}/weights"] = weights.detach()
        tensors[f"{name}/grad_weights"] = grad_weights
    torch.autograd.backward(roots, grads)
    tensors[f"{name}/out"] = out.detach()
    tensors[f"{name}/grad_out"] = grad_out

    entry_inputs = []
    for input_name, t in inputs.items():
        spec = specs[input_name]
        entry = {"name": input_name, "slot": SLOTS[kind].index(input_name)}
        if spec[0] == "same":
            entry["same_as"] = spec[1]
        else:
            tensors[f"{name}/in/{input_name}"] = t.detach()
            entry["dtype"] = "bool" if t.dtype == torch.bool else "f64"
            entry["requires_grad"] = t.requires_grad
            if t.requires_grad:
                tensors[f"{name}/grad/{input_name}"] = t.grad
        entry_inputs.append(entry)
    params = []
    for key, p in module.state_dict().items():
        tensors[f"{name}/param/{key}"] = p.detach().clone()
        params.append(key)
    for key, p in module.named_parameters():
        assert p.grad is not None, f"{name}: no gradient for {key}"
        tensors[f"{name}/grad/{key}"] = p.grad
    return {"name": name, "kind": kind, "args": args, "unbatched": unbatched == "unbatched", "inputs": entry_inputs,
            "params": params, "need_weights": need_weights, "average_attn_weights": average}


def main():
    ap = argparse.ArgumentParser(description="Module parity cases (MultiheadAttention, Transformer layers)")
    ap.add_argument("--out", required=True, help="directory for module_cases.safetensors and module_cases.json")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tensors, cases = {}, []
    for i, case in enumerate(CASES):
        cases.append(run_case(args.seed, i, case, tensors))
    for key, t in tensors.items():
        assert t.dtype == torch.bool or torch.isfinite(t).all(), f"{key} is not finite"
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "module_cases.safetensors"), tensors)
    with open(os.path.join(args.out, "module_cases.json"), "w") as f:
        json.dump({"seed": args.seed, "torch": torch.__version__, "cases": cases}, f, indent=1)
    print(f"module parity: {len(cases)} cases ({len(tensors)} tensors) from seed {args.seed}", file=sys.stderr)


if __name__ == "__main__":
    main()
