"""Host time of the training step's gradient norm: bertrain's (train/step.py: the parameters listed once by
gradient_groups, then global_norm) against what it replaced, torch's get_total_norm over the gradients of
model.parameters() listed at every step, with the same kernels and the same norm. The model is a shipped config's
(its module tree and tensor count) at a width where the kernels cost little, so the rest is the host time a
host-bound GPU loop pays a step. Also the kernels alone on a ready list, the floor. Medians of alternated rounds.

    python benchmarks/grad_norm_host.py --config bert_large
    python benchmarks/grad_norm_host.py --config bert_large --device cuda
"""

from __future__ import annotations

import argparse

import torch
from model_step import time_alternating

from bertrain.config import load_config
from bertrain.model import build_model
from bertrain.train.step import global_norm, gradient_groups

NARROW = ["model.hidden_size=16", "model.num_attention_heads=1", "model.intermediate_size=16", "model.vocab_size=64",
          "model.embedding_size=null"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="bert_large")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200, help="Norms per round.")
    args = parser.parse_args()
    device = torch.device(args.device)
    model = build_model(load_config(args.config, NARROW).model).to(device)
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    groups = gradient_groups(model)
    grads = [p.grad for p in model.parameters()]
    functions = {
        "get_total_norm, model.parameters() (before)":
            lambda: torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]),
        "global_norm, listed once (now)": lambda: global_norm(groups),
        "the kernels alone": lambda: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))),
    }
    norms = [fn() for fn in functions.values()]
    assert all(torch.equal(norm, norms[0]) for norm in norms), norms  # one group: the same kernels, the same bits
    medians = time_alternating(functions, args.rounds, args.steps, device)
    print(f"{args.config}: {len(grads)} tensors, {len(groups)} group(s), {device}, torch {torch.__version__}; "
          f"host ms per norm, medians of {args.rounds} alternated rounds of {args.steps}")
    reference = medians["get_total_norm, model.parameters() (before)"]
    for name, seconds in medians.items():
        print(f"  {name:<44} {1e3 * seconds:.3f} ms  {seconds / reference:.2f}x before")


if __name__ == "__main__":
    main()
