"""Host time of an encoder layer's LayerNorm site (LN(residual + dropout(x)), forward and backward, as
EncoderLayer calls it under bf16 autocast), measured on any machine: torch's ops (dropout, the add, the LayerNorm)
against BERTRAIN_LAYER_NORM=triton's one Function with its kernels' launches replaced by no-ops, on [8, 64] tensors
(so that the CPU's own compute is small beside the dispatch). A host-bound GPU loop (the H200's bert_large at seq
128, 2026-11-26) pays this at each of its 2 x layers sites a step; the launches themselves are not counted.

    python benchmarks/layer_norm_host.py --config bert_large
"""

from __future__ import annotations

import argparse
import os
from unittest import mock

import torch
from model_step import time_alternating

from bertrain.config import load_config
from bertrain.model import layer_norm_triton
from bertrain.model.layers import LayerNorm
from lamb_host import NoLaunch


def site(norm: LayerNorm, kernel: str, x: torch.Tensor, residual: torch.Tensor, dy: torch.Tensor):
    """One LayerNorm site's forward and backward with BERTRAIN_LAYER_NORM=kernel."""
    def run() -> None:
        os.environ["BERTRAIN_LAYER_NORM"] = kernel
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = norm(x, residual=residual, dropout_prob=0.1)
        y.backward(dy)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="bert_large")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=500, help="Sites per timed run.")
    args = parser.parse_args()
    layers = load_config(args.config, ["model.vocab_size=30522"]).model.num_hidden_layers
    torch.set_num_threads(1)  # the training thread's dispatch, not intra-op parallelism on tiny tensors
    norm = LayerNorm(64, 1e-12).train()
    x, residual = (torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    dy = torch.randn(8, 64, dtype=torch.bfloat16)
    kernels = ("torch", "triton") if layer_norm_triton.triton else ("torch",)
    with mock.patch.object(layer_norm_triton, "runs", lambda x: os.environ["BERTRAIN_LAYER_NORM"] == "triton"), \
            mock.patch.object(layer_norm_triton, "_layer_norm_forward", NoLaunch()), \
            mock.patch.object(layer_norm_triton, "_layer_norm_backward", NoLaunch()), \
            mock.patch.dict(os.environ, BERTRAIN_LAYER_NORM="torch"):
        medians = time_alternating({k: site(norm, k, x, residual, dy) for k in kernels}, args.rounds, args.repeats)
    print(f"{args.config}: {2 * layers} LayerNorm sites a step; host time of one site, forward and backward "
          f"(Triton's launches not counted)")
    for kernel, seconds in medians.items():
        print(f"  {kernel:<7} {1e6 * seconds:.1f} us a site, {1e3 * seconds * 2 * layers:.2f} ms a step, "
              f"{seconds / medians['torch']:.2f}x torch's")
    if "triton" not in medians:
        print("  triton  not timed (Triton is not installed)")


if __name__ == "__main__":
    main()
