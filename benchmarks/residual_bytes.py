"""Bytes one encoder layer's forward + backward moves under bf16 autocast, with the residual stream in bf16 (our
default) against float32 (model.float32_residual: true, as transformers): every aten op's tensors read and written,
counted once each (views excluded), split into matrix multiplies + attention and everything else. A device-neutral
model of the memory traffic that the GPU's element-wise kernels spend their time on (bert-large's H200 profile: 40%
of the step outside GEMMs and attention); also the bytes the forward keeps for the backward. On a CPU with native
bf16 it also times the layer's step (medians of alternated rounds). Not part of the suite (a tiny shape runs in the
tests).

    python benchmarks/residual_bytes.py                         # bert-large's layer at 32 x 128
    python benchmarks/residual_bytes.py --config tiny_bert --batch 2 --seq 16 --rounds 0
"""

from __future__ import annotations

import argparse
import collections
import dataclasses

import torch
from gpu_profile import group_of
from model_step import cpu_has_native_bf16, time_alternating
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from bertrain.config import load_config
from bertrain.model.layers import EncoderLayer

class ByteCount(TorchDispatchMode):
    """Bytes read and written by each kind of op run inside it (an in-place op's tensor counts as read and written)."""

    def __init__(self):
        super().__init__()
        self.bytes = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            name = func.__name__.split(".")[0]
            for tensors in ((args, kwargs), out):  # inputs once each, then outputs once each
                unique = {id(t): t for t in tree_leaves(tensors) if isinstance(t, torch.Tensor)}
                self.bytes[name] += sum(t.numel() * t.element_size() for t in unique.values())
        return out


def kind(op: str) -> str:
    """GEMM or attention as gpu_profile.py groups the GPU profile's ops, else other."""
    group = group_of(f"aten::{op}")
    return group if group in ("GEMM", "attention") else "other"


def layer_step(layer: EncoderLayer, x: torch.Tensor, upstream: torch.Tensor, saved: dict | None = None):
    """One forward + backward of the layer under bf16 autocast; `saved` gets the storages its forward keeps for the
    backward (data pointer -> bytes; parameters and the input left out)."""
    skip = {t.untyped_storage().data_ptr() for t in (x, *layer.parameters())}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        if saved is not None and tensor.untyped_storage().data_ptr() not in skip:
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    def step():
        layer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            y = layer(x, None)
        y.backward(upstream)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="bert_large", help="A shipped config: its layer shape and dropout.")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5, help="Timed rounds (0: bytes only; skipped without "
                        "native bf16).")
    args = parser.parse_args()
    # attention dropout 0: the CPU then runs the fused SDPA kernel, as the GPU does (its kernel fuses the dropout)
    config = load_config(args.config, ["model.vocab_size=1000", "model.attention_probs_dropout_prob=0"]).model
    B, T, H = args.batch, args.seq, config.hidden_size
    torch.manual_seed(0)
    steps, counts, saved = {}, {}, {}
    weights = EncoderLayer(config).state_dict()
    for name, float32_residual, dtype in (("float32 residual", True, torch.float32), ("bf16 residual", False,
                                                                                      torch.bfloat16)):
        layer = EncoderLayer(dataclasses.replace(config, float32_residual=float32_residual)).train()
        layer.load_state_dict(weights)
        x = torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)).to(dtype)  # as the layer before gives
        upstream = torch.randn(B, T, H, generator=torch.Generator().manual_seed(2)).to(dtype)
        steps[name], counts[name], saved[name] = layer_step(layer, x, upstream), ByteCount(), {}
        with counts[name]:
            layer_step(layer, x, upstream, saved[name])()
    timed = args.rounds > 0 and cpu_has_native_bf16()
    ms = {k: 1e3 * v for k, v in time_alternating(steps, args.rounds, 1).items()} if timed else {}
    print(f"one {args.config} layer (H {H}, I {config.intermediate_size}), forward + backward, bf16 autocast, "
          f"[{B}, {T}]; MB read + written by aten ops")
    print(f"{'residual':<17} {'matmul MB':>10} {'attention MB':>12} {'other MB':>9} {'casts MB':>9} {'ms (CPU)':>9} "
          f"{'saved for backward MB':>21}")
    other = []
    for name, count in counts.items():
        by_kind = collections.Counter()
        for op, n in count.bytes.items():
            by_kind[kind(op)] += n
        other.append(by_kind["other"])
        time = f"{ms[name]:.2f}" if ms else "-"
        print(f"{name.split()[0]:<17} {by_kind['GEMM'] / 1e6:>10.1f} {by_kind['attention'] / 1e6:>12.1f} "
              f"{by_kind['other'] / 1e6:>9.1f} {count.bytes['_to_copy'] / 1e6:>9.1f} {time:>9} "
              f"{sum(saved[name].values()) / 1e6:>21.1f}")
    print(f"bytes outside matmuls and attention, bf16 / float32 residual: {other[1] / other[0]:.2f}x"
          + (f"; the layer step's CPU time: {ms['bf16 residual'] / ms['float32 residual']:.2f}x" if ms else
             " (not timed: no native bf16 on this CPU, or --rounds 0)"))


if __name__ == "__main__":
    main()
